"""Bring a switch's P4Runtime state to a desired state with the fewest writes.

The controller never resets a switch: at start, on reconnect and on SIGHUP it reads back what
the switch holds (table entries, default actions, action profile members and groups, clone
sessions, multicast groups), compares it with what the configuration asks for, and writes only
the difference. A controller restarted while traffic flows therefore writes nothing when
nothing changed, and no flow is disturbed.

Entities are compared in a normal form of their P4Runtime protobufs: byte strings without
leading zeros (P4Runtime's canonical form), members and replicas as sorted sets, and only the
fields the controller sets (not counters, meters or idle timeouts).

Action profile member and group IDs are allocated by content (`IdAllocator`): a member with the
same action and parameters, or a group with the same members, keeps the ID it has on the
switch, so a restarted controller adopts the existing ones instead of rewriting them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import finsy as fy
from finsy.proto import p4r

log = logging.getLogger("xingmai.controller.reconcile")

Key = tuple[Any, ...]
BATCH = 200  # updates per WriteRequest


def _b(v: bytes) -> bytes:
    return v.lstrip(b"\x00")


def _action_norm(a: p4r.Action) -> Key:
    return (a.action_id, tuple(sorted((p.param_id, _b(p.value)) for p in a.params)))


def _match_norm(fm: p4r.FieldMatch) -> Key:
    kind = fm.WhichOneof("field_match_type") or ""
    m = getattr(fm, kind) if kind else fm
    if kind == "exact" or kind == "optional":
        val: Key = (_b(m.value),)
    elif kind == "lpm":
        val = (_b(m.value), m.prefix_len)
    elif kind == "ternary":
        val = (_b(m.value), _b(m.mask))
    elif kind == "range":
        val = (_b(m.low), _b(m.high))
    else:
        val = (m.SerializeToString(deterministic=True),)
    return (fm.field_id, kind, *val)


def _port(r: p4r.Replica) -> int:
    if r.HasField("port"):
        return int.from_bytes(r.port, "big")
    return int(r.egress_port)


def normal(ent: p4r.Entity) -> tuple[str, Key, Key]:
    """(kind, key, value) of an entity: equal keys name the same object, equal values mean
    nothing to write."""
    kind = ent.WhichOneof("entity")
    if kind == "table_entry":
        te = ent.table_entry
        key: Key = (
            te.table_id,
            te.priority,
            te.is_default_action,
            tuple(sorted(_match_norm(fm) for fm in te.match)),
        )
        which = te.action.WhichOneof("type") if te.HasField("action") else None
        if which == "action":
            value: Key = ("action", _action_norm(te.action.action))
        elif which == "action_profile_member_id":
            value = ("member", te.action.action_profile_member_id)
        elif which == "action_profile_group_id":
            value = ("group", te.action.action_profile_group_id)
        elif which is None:
            value = ("none",)
        else:
            value = (which, te.action.SerializeToString(deterministic=True))
        return "table_entry", key, value
    if kind == "action_profile_member":
        m = ent.action_profile_member
        return "member", (m.action_profile_id, m.member_id), _action_norm(m.action)
    if kind == "action_profile_group":
        g = ent.action_profile_group
        return (
            "group",
            (g.action_profile_id, g.group_id),
            tuple(sorted((x.member_id, x.weight or 1) for x in g.members)),
        )
    if kind == "packet_replication_engine_entry":
        pre = ent.packet_replication_engine_entry
        if pre.WhichOneof("type") == "clone_session_entry":
            c = pre.clone_session_entry
            return (
                "clone",
                (c.session_id,),
                (
                    tuple(sorted((_port(r), r.instance) for r in c.replicas)),
                    c.class_of_service,
                    c.packet_length_bytes,
                ),
            )
        g2 = pre.multicast_group_entry
        return (
            "mcast",
            (g2.multicast_group_id,),
            tuple(sorted((_port(r), r.instance) for r in g2.replicas)),
        )
    raise ValueError(f"entity kind {kind!r} is not reconciled")


# Write order: what others refer to is written first and deleted last.
_INSERT_ORDER = ("member", "group", "table_entry", "clone", "mcast")
_DELETE_ORDER = ("table_entry", "group", "member", "clone", "mcast")


@dataclass
class Plan:
    inserts: list[p4r.Entity] = field(default_factory=list)
    modifies: list[p4r.Entity] = field(default_factory=list)
    deletes: list[p4r.Entity] = field(default_factory=list)
    unchanged: int = 0

    @property
    def empty(self) -> bool:
        return not (self.inserts or self.modifies or self.deletes)

    def summary(self) -> dict[str, int]:
        return {
            "insert": len(self.inserts),
            "modify": len(self.modifies),
            "delete": len(self.deletes),
            "unchanged": self.unchanged,
        }


def diff(
    desired: Iterable[p4r.Entity], current: Iterable[p4r.Entity], keep: Iterable[p4r.Entity] = ()
) -> Plan:
    """What to write so that `current` becomes `desired`.

    Default table entries (is_default_action) can only be modified: a desired default differing
    from the current one is a modify, and one that is not desired is left alone. Entities in
    `keep` (e.g. const tables) are never deleted.
    """
    cur: dict[tuple[str, Key], tuple[Key, p4r.Entity]] = {}
    for ent in current:
        kind, key, value = normal(ent)
        cur[(kind, key)] = (value, ent)
    kept = {normal(e)[:2] for e in keep}
    plan = Plan()
    want_keys = set()
    by_kind: dict[str, list[tuple[str, p4r.Entity]]] = {k: [] for k in _INSERT_ORDER}
    for ent in desired:
        kind, key, value = normal(ent)
        if (kind, key) in want_keys:
            raise ValueError(f"desired state names {kind} {key} twice")
        want_keys.add((kind, key))
        have = cur.get((kind, key))
        is_default = kind == "table_entry" and ent.table_entry.is_default_action
        if have is None:
            by_kind[kind].append(("modify" if is_default else "insert", ent))
        elif have[0] != value:
            by_kind[kind].append(("modify", ent))
        else:
            plan.unchanged += 1
    for kind in _INSERT_ORDER:
        for op, ent in by_kind[kind]:
            (plan.inserts if op == "insert" else plan.modifies).append(ent)
    stale: dict[str, list[p4r.Entity]] = {k: [] for k in _DELETE_ORDER}
    for (kind, key), (_, ent) in cur.items():
        if (kind, key) in want_keys or (kind, key) in kept:
            continue
        if kind == "table_entry" and ent.table_entry.is_default_action:
            continue
        stale[kind].append(ent)
    for kind in _DELETE_ORDER:
        plan.deletes.extend(stale[kind])
    return plan


class IdAllocator:
    """IDs by content: the same content keeps its ID; new content gets the lowest free ID."""

    def __init__(self, existing: dict[Key, int] | None = None, first: int = 1):
        self._by_content: dict[Key, int] = {}
        self._used: set[int] = set()
        self._existing = dict(existing or {})
        self._next = first
        self.first = first

    def get(self, content: Key) -> int:
        got = self._by_content.get(content)
        if got is not None:
            return got
        old = self._existing.get(content)
        if old is not None and old not in self._used:
            ident = old
        else:
            taken = self._used | set(self._existing.values())
            while self._next in taken:
                self._next += 1
            ident = self._next
        self._used.add(ident)
        self._by_content[content] = ident
        return ident


@dataclass
class SwitchState:
    """What a switch holds, as P4Runtime entities."""

    entities: list[p4r.Entity]

    def members(self) -> dict[Key, int]:
        """Member content (profile id, normal action) -> member id."""
        out = {}
        for e in self.entities:
            if e.WhichOneof("entity") == "action_profile_member":
                m = e.action_profile_member
                out[(m.action_profile_id, _action_norm(m.action))] = m.member_id
        return out

    def groups(self) -> dict[Key, int]:
        """Group content (profile id, sorted (member id, weight)) -> group id."""
        out = {}
        for e in self.entities:
            if e.WhichOneof("entity") == "action_profile_group":
                g = e.action_profile_group
                out[
                    (
                        g.action_profile_id,
                        tuple(sorted((x.member_id, x.weight or 1) for x in g.members)),
                    )
                ] = g.group_id
        return out


async def read_state(switch: fy.Switch, default_tables: Sequence[str] = ()) -> SwitchState:
    """Read every reconciled entity back from the switch (wildcard reads)."""
    schema = switch.p4info
    ents: list[p4r.Entity] = []
    wildcard: list[Any] = [fy.P4TableEntry(), fy.P4CloneSessionEntry(), fy.P4MulticastGroupEntry()]
    for prof in schema.action_profiles:
        wildcard.append(fy.P4ActionProfileMember(prof.alias))
        wildcard.append(fy.P4ActionProfileGroup(prof.alias))
    reader: Any = switch  # finsy's read() overloads confuse mypy with async generators
    wildcard += [fy.P4TableEntry(table, is_default_action=True) for table in default_tables]
    for w in wildcard:
        async for got in reader.read(w):
            if isinstance(got, fy.P4TableEntry) and got.is_const:
                continue  # part of the program, not ours to reconcile
            ents.append(got.encode(schema))
    return SwitchState(ents)


def member_key(schema: Any, member: fy.P4ActionProfileMember) -> Key:
    """The content key of a member as the allocator and `SwitchState.members` see it."""
    ent = member.encode(schema).action_profile_member
    return (ent.action_profile_id, _action_norm(ent.action))


def group_key(schema: Any, profile: str, members: Sequence[tuple[int, int]]) -> Key:
    return (schema.action_profiles[profile].id, tuple(sorted(members)))


@dataclass
class ApplyResult:
    written: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


def ordered_updates(plan: Plan) -> list[tuple[int, p4r.Entity]]:
    """The plan's updates in the order they must be written: inserts and modifies, then
    deletes. Modifies of members/groups must land before table entries that use them: the
    dependency order interleaves per kind rather than per operation."""
    steps = [(p4r.Update.INSERT, plan.inserts), (p4r.Update.MODIFY, plan.modifies)]
    ordered: list[tuple[int, p4r.Entity]] = []
    for kind in _INSERT_ORDER:
        for utype, ents in steps:
            ordered += [(utype, e) for e in ents if normal(e)[0] == kind]
    ordered += [(p4r.Update.DELETE, e) for e in plan.deletes]
    return ordered


async def apply(switch: fy.Switch, plan: Plan) -> ApplyResult:
    """Write a plan in order (inserts/modifies, then deletes), batch by batch. A failed update is
    logged and counted; the others of its batch still apply and the next reconcile retries."""
    res = ApplyResult()
    ordered = ordered_updates(plan)
    for start in range(0, len(ordered), BATCH):
        batch = ordered[start : start + BATCH]
        updates = [p4r.Update(type=t, entity=e) for t, e in batch]  # type: ignore[arg-type]
        try:
            await switch.write(updates)
            res.written += len(updates)
        except fy.P4ClientError as exc:
            details = getattr(exc, "details", {}) or {}
            bad = {i: d for i, d in details.items() if d.canonical_code != fy.GRPCStatusCode.OK}
            if not details:
                res.failed += len(updates)
                res.errors.append(str(exc))
                continue
            res.failed += len(bad)
            res.written += len(updates) - len(bad)
            for i, d in sorted(bad.items()):
                msg = f"{p4r.Update.Type.Name(batch[i][0])} {normal(batch[i][1])[0]}: {d.message}"
                res.errors.append(msg)
                log.warning("write failed on %s: %s", switch.name, msg)
    return res
