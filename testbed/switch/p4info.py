"""Join a P4Info with the compiled bmv2 program: P4Runtime ids -> the switch's objects.

p4c's bmv2 backend gives P4Info objects and bmv2 JSON objects the same fully qualified names
(tables, actions, action profiles, counters, meters, registers, value sets); digests map to
learn lists by name; match fields and action parameters map by name, then position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from finsy.proto import p4i

from testbed.switch.codegen import Compiled
from testbed.switch.externs import CounterArray, MeterArray, RegisterArray, ValueSet
from testbed.switch.tables import ActionProfile, MatchTable


class P4InfoError(Exception):
    """The P4Info does not describe the bmv2 JSON it came with."""


@dataclass
class MatchFieldInfo:
    id: int
    name: str
    bitwidth: int
    match_type: int  # p4i.MatchField.MatchType
    position: int  # index in the table's key


@dataclass
class ParamInfo:
    id: int
    name: str
    bitwidth: int


@dataclass
class ActionInfo:
    id: int
    name: str
    json_id: int
    params: list[ParamInfo]
    params_by_id: dict[int, ParamInfo] = field(default_factory=dict)


@dataclass
class TableInfo:
    id: int
    name: str
    table: MatchTable
    fields: list[MatchFieldInfo]
    fields_by_id: dict[int, MatchFieldInfo]
    action_ids: set[int]
    default_only: set[int]
    table_only: set[int]
    profile_id: int = 0
    direct_counter_id: int = 0
    direct_meter_id: int = 0
    is_const: bool = False
    # P4Info action id -> the JSON action this table runs for it: p4c gives some tables their
    # own copy of an action (a per-table NoAction), with its own JSON id and the same name
    json_actions: dict[int, int] = field(default_factory=dict)


@dataclass
class CpuHeader:
    """packet_in / packet_out controller header: (id, name, bitwidth) in wire order."""

    fields: list[tuple[int, str, int]]

    @property
    def nbytes(self) -> int:
        return (sum(w for _, _, w in self.fields) + 7) // 8


def _key_name(k: dict[str, Any]) -> str:
    if "name" in k:
        return str(k["name"])
    target = k["target"]
    return ".".join(target) if isinstance(target, list) else str(target)


class P4InfoIndex:
    def __init__(self, info: p4i.P4Info, compiled: Compiled):
        self.info = info
        self.compiled = compiled
        prog = compiled.program
        self.actions: dict[int, ActionInfo] = {}
        for a in info.actions:
            ja = prog.action_by_name.get(a.preamble.name)
            if ja is None:
                raise P4InfoError(f"P4Info action {a.preamble.name!r} is not in the JSON")
            params = [ParamInfo(pp.id, pp.name, pp.bitwidth) for pp in a.params]
            json_names = [n for n, _ in ja.params]
            if [pp.name for pp in params] != json_names and len(params) != len(json_names):
                raise P4InfoError(f"action {a.preamble.name!r}: parameters differ from the JSON")
            ai = ActionInfo(a.preamble.id, a.preamble.name, ja.id, params)
            ai.params_by_id = {pp.id: pp for pp in params}
            self.actions[ai.id] = ai
        # every JSON action, copies included, to the P4Info action of its name
        action_named = {ai.name: ai for ai in self.actions.values()}
        self.action_of_json: dict[int, ActionInfo] = {
            ja.id: action_named[ja.name] for ja in prog.actions.values() if ja.name in action_named
        }

        self.profiles: dict[int, ActionProfile] = {}
        self.profile_info: dict[int, Any] = {}
        for ap in info.action_profiles:
            obj = compiled.profiles.get(ap.preamble.name)
            if obj is None:
                raise P4InfoError(f"P4Info action profile {ap.preamble.name!r} not in the JSON")
            obj.max_group_size = ap.max_group_size
            self.profiles[ap.preamble.id] = obj
            self.profile_info[ap.preamble.id] = ap

        self.tables: dict[int, TableInfo] = {}
        for t in info.tables:
            mt = compiled.tables.get(t.preamble.name)
            if mt is None:
                raise P4InfoError(f"P4Info table {t.preamble.name!r} is not in the JSON")
            tj = prog.tables[t.preamble.name]
            key_names = [_key_name(k) for k in tj["key"]]
            fields = []
            for pos, mf in enumerate(t.match_fields):
                position = key_names.index(mf.name) if mf.name in key_names else pos
                fields.append(MatchFieldInfo(mf.id, mf.name, mf.bitwidth, mf.match_type, position))
            if len(fields) != len(mt.kinds):
                raise P4InfoError(
                    f"table {t.preamble.name!r}: {len(fields)} match fields in "
                    f"P4Info, {len(mt.kinds)} in the JSON"
                )
            refs = {ar.id for ar in t.action_refs}
            ti = TableInfo(
                t.preamble.id,
                t.preamble.name,
                mt,
                fields,
                {f.id: f for f in fields},
                refs,
                {ar.id for ar in t.action_refs if ar.scope == p4i.ActionRef.DEFAULT_ONLY},
                {ar.id for ar in t.action_refs if ar.scope == p4i.ActionRef.TABLE_ONLY},
                t.implementation_id,
                is_const=t.is_const_table,
            )
            for aname, json_id in zip(
                tj.get("actions", []), tj.get("action_ids", []), strict=False
            ):
                if aname in action_named:
                    ti.json_actions[action_named[aname].id] = json_id
            for rid in t.direct_resource_ids:
                if any(c.preamble.id == rid for c in info.direct_counters):
                    ti.direct_counter_id = rid
                if any(m.preamble.id == rid for m in info.direct_meters):
                    ti.direct_meter_id = rid
            self.tables[ti.id] = ti

        def by_name(objs: dict[str, Any], name: str, what: str) -> Any:
            if name not in objs:
                raise P4InfoError(f"P4Info {what} {name!r} is not in the JSON")
            return objs[name]

        self.counters: dict[int, CounterArray] = {
            c.preamble.id: by_name(compiled.counters, c.preamble.name, "counter")
            for c in info.counters
        }
        self.counter_info = {c.preamble.id: c for c in info.counters}
        self.direct_counters: dict[int, int] = {  # direct counter id -> table id
            c.preamble.id: c.direct_table_id for c in info.direct_counters
        }
        self.meters: dict[int, MeterArray] = {
            m.preamble.id: by_name(compiled.meters, m.preamble.name, "meter") for m in info.meters
        }
        self.direct_meters: dict[int, int] = {
            m.preamble.id: m.direct_table_id for m in info.direct_meters
        }
        self.registers: dict[int, RegisterArray] = {
            r.preamble.id: by_name(compiled.registers, r.preamble.name, "register")
            for r in info.registers
        }
        self.value_sets: dict[int, ValueSet] = {
            v.preamble.id: by_name(compiled.value_sets, v.preamble.name, "value set")
            for v in info.value_sets
        }
        self.value_set_info = {v.preamble.id: v for v in info.value_sets}

        learn_by_name = {name: lid for lid, (name, _) in prog.learn_lists.items()}
        self.digests: dict[int, int] = {}  # digest id -> learn list id
        self.digest_by_learn: dict[int, int] = {}
        for i, d in enumerate(info.digests):
            lid = learn_by_name.get(d.preamble.name)
            if lid is None:  # p4c may name the learn list after the struct type instead
                lids = sorted(prog.learn_lists)
                lid = lids[i] if i < len(lids) else None
            if lid is None:
                raise P4InfoError(f"P4Info digest {d.preamble.name!r} has no learn list")
            self.digests[d.preamble.id] = lid
            self.digest_by_learn[lid] = d.preamble.id

        self.packet_in: CpuHeader | None = None
        self.packet_out: CpuHeader | None = None
        for cpm in info.controller_packet_metadata:
            hdr = CpuHeader([(m.id, m.name, m.bitwidth) for m in cpm.metadata])
            if cpm.preamble.name == "packet_in":
                self.packet_in = hdr
            elif cpm.preamble.name == "packet_out":
                self.packet_out = hdr

    def table_of_direct(self, resource_id: int) -> TableInfo:
        tid = self.direct_counters.get(resource_id) or self.direct_meters.get(resource_id)
        if tid is None or tid not in self.tables:
            raise KeyError(resource_id)
        return self.tables[tid]
