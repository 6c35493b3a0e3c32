"""Match-action tables, action profiles and action selectors of the built-in switch.

Entries follow P4Runtime conventions: a larger priority wins; an entry is identified by its
match key (and priority, for ternary / range / optional tables). Lookups are dictionaries for
exact and LPM tables and a priority-ordered scan with a result cache for the others.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from testbed.switch.externs import Meter, MeterArray

ActionFn = Callable[[Any, tuple[int, ...]], None]
NodeFn = Callable[[Any], Any]

# A program that gives a table or an action profile no size (max_size 0) still gets a bound:
# every entry a controller writes costs memory, and no request may grow the switch unbounded.
UNSIZED_LIMIT = 1 << 16


class TableError(Exception):
    """A control-plane request the table cannot honour; `code` is a gRPC status name."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class ActionCall:
    action_id: int
    fn: ActionFn
    params: tuple[int, ...]


@dataclass
class Entry:
    spec: tuple[Any, ...]  # per key field: exact value | (value, plen) | (value, mask) | (lo, hi)
    priority: int
    call: ActionCall | None = None  # direct tables
    member: int | None = None  # indirect tables: action profile member id ...
    group: int | None = None  # ... or group id
    packet_count: int = 0
    byte_count: int = 0
    meter: Meter | None = None
    handle: int = 0
    idle_timeout_ns: int = 0
    metadata: bytes = b""


@dataclass
class Group:
    members: list[int] = field(default_factory=list)  # member ids, each once
    weights: dict[int, int] = field(default_factory=dict)
    max_size: int = 0
    # running sums of the members' weights: a hash h picks the member whose range holds
    # h % total (the same member repetition by weight would pick, without the repetition)
    cumulative: list[int] = field(default_factory=list)

    @property
    def total_weight(self) -> int:
        return self.cumulative[-1] if self.cumulative else 0


class ActionProfile:
    """Members (action + parameters) and groups of members; with a selector, one member of a
    group is picked per packet by hashing the selector's input fields."""

    def __init__(
        self,
        name: str,
        max_size: int,
        selector: Callable[[Any], int] | None,
        max_group_size: int = 0,
    ):
        self.name = name
        self.max_size = max_size
        self.max_group_size = max_group_size  # P4Info's bound on one group's sum of weights
        self.selector = selector
        self.members: dict[int, ActionCall] = {}
        self.groups: dict[int, Group] = {}

    def add_member(self, mid: int, call: ActionCall) -> None:
        if mid in self.members:
            raise TableError("ALREADY_EXISTS", f"{self.name}: member {mid} exists")
        limit = self.max_size or UNSIZED_LIMIT
        if len(self.members) >= limit:
            raise TableError("RESOURCE_EXHAUSTED", f"{self.name}: full ({limit} members)")
        self.members[mid] = call

    def modify_member(self, mid: int, call: ActionCall) -> None:
        if mid not in self.members:
            raise TableError("NOT_FOUND", f"{self.name}: no member {mid}")
        self.members[mid] = call

    def delete_member(self, mid: int) -> None:
        if mid not in self.members:
            raise TableError("NOT_FOUND", f"{self.name}: no member {mid}")
        if any(mid in g.members for g in self.groups.values()):
            raise TableError("FAILED_PRECONDITION", f"{self.name}: member {mid} is in a group")
        del self.members[mid]

    def set_group(
        self, gid: int, members: list[tuple[int, int]], max_size: int = 0, create: bool = False
    ) -> None:
        if self.selector is None:
            raise TableError("INVALID_ARGUMENT", f"{self.name} has no selector: no groups")
        if create and gid in self.groups:
            raise TableError("ALREADY_EXISTS", f"{self.name}: group {gid} exists")
        if not create and gid not in self.groups:
            raise TableError("NOT_FOUND", f"{self.name}: no group {gid}")
        # Everything is checked before anything is built: a weight is a count, not a size to
        # allocate (P4Runtime's sum-of-weights semantics bound it by the group's max_size, the
        # profile's max_group_size and the profile's size over all its groups).
        seen: set[int] = set()
        total = 0
        for mid, w in members:
            if mid not in self.members:
                raise TableError("NOT_FOUND", f"{self.name}: group {gid}: no member {mid}")
            if mid in seen:
                raise TableError(
                    "INVALID_ARGUMENT", f"{self.name}: group {gid}: member {mid} given twice"
                )
            if w < 1:
                raise TableError("INVALID_ARGUMENT", f"{self.name}: weight must be >= 1")
            seen.add(mid)
            total += w
        if max_size and total > max_size:
            raise TableError(
                "RESOURCE_EXHAUSTED",
                f"{self.name}: group {gid}: weights sum to {total}, over its max_size {max_size}",
            )
        if self.max_group_size and (total > self.max_group_size or max_size > self.max_group_size):
            raise TableError(
                "RESOURCE_EXHAUSTED",
                f"{self.name}: group {gid}: over the "
                f"profile's max_group_size {self.max_group_size}",
            )
        limit = self.max_size or UNSIZED_LIMIT
        others = sum(g.total_weight for i, g in self.groups.items() if i != gid)
        if others + total > limit:
            raise TableError(
                "RESOURCE_EXHAUSTED",
                f"{self.name}: the groups' weights would sum "
                f"to {others + total}, over the profile's size {limit}",
            )
        g = Group(max_size=max_size)
        run = 0
        for mid, w in members:
            g.weights[mid] = w
            g.members.append(mid)
            run += w
            g.cumulative.append(run)
        self.groups[gid] = g

    def delete_group(self, gid: int) -> None:
        if gid not in self.groups:
            raise TableError("NOT_FOUND", f"{self.name}: no group {gid}")
        del self.groups[gid]

    def resolve(self, p: Any, member: int | None, group: int | None) -> ActionCall | None:
        if member is not None:
            return self.members.get(member)
        g = self.groups.get(group) if group is not None else None
        if g is None or not g.members:
            return None
        assert self.selector is not None
        h = self.selector(p) % g.cumulative[-1]
        return self.members.get(g.members[bisect.bisect_right(g.cumulative, h)])


_CACHE_LIMIT = 4096


class MatchTable:
    """One table. `kinds` gives each key field's match kind: exact, lpm, ternary, range,
    optional or valid. The table's own kind follows bmv2: range > ternary > lpm > exact."""

    def __init__(
        self,
        name: str,
        kinds: list[str],
        widths: list[int],
        max_size: int,
        profile: ActionProfile | None = None,
        with_counters: bool = False,
        direct_meter: MeterArray | None = None,
        meter_target: tuple[int, int] | None = None,
    ):
        self.name = name
        self.kinds = kinds
        self.widths = widths
        self.max_size = max_size
        self.profile = profile
        self.with_counters = with_counters
        self.direct_meter = direct_meter  # gives the unit and the clock of per-entry meters
        self.meter_target = meter_target  # (header, field) receiving a direct meter's colour
        if "range" in kinds:
            self.kind = "range"
        elif "ternary" in kinds or "optional" in kinds:
            self.kind = "ternary"
        elif "lpm" in kinds:
            self.kind = "lpm"
        else:
            self.kind = "exact"
        self.needs_priority = self.kind in ("range", "ternary")
        self.lpm_index = kinds.index("lpm") if "lpm" in kinds else -1
        self.default: ActionCall | None = None
        self.default_const = False
        self.immutable = False  # p4c `const entries`
        self.entries: dict[tuple[Any, ...], Entry] = {}  # by (spec, priority)
        self._exact: dict[tuple[int, ...], Entry] = {}
        self._lpm: dict[int, dict[tuple[int, ...], Entry]] = {}
        self._lpm_lengths: list[int] = []
        self._scan: list[Entry] = []
        self._scan_keys: list[int] = []  # -priority of each entry of _scan, in its order
        self._cache: dict[tuple[int, ...], Entry | None] = {}
        self._handles = itertools.count(1)
        self.next_hit: NodeFn | None = None
        self.next_miss: NodeFn | None = None
        self.next_by_action: dict[int, NodeFn | None] | None = None
        self.next_default: NodeFn | None = None
        self.hits = 0
        self.misses = 0

    # ---- data plane -------------------------------------------------------------------------

    def lookup(self, key: tuple[int, ...]) -> Entry | None:
        kind = self.kind
        if kind == "exact":
            return self._exact.get(key)
        if kind == "lpm":
            i = self.lpm_index
            w = self.widths[i]
            k = list(key)
            v = key[i]
            for plen in self._lpm_lengths:
                k[i] = v & (((1 << plen) - 1) << (w - plen))
                e = self._lpm[plen].get(tuple(k))
                if e is not None:
                    return e
            return None
        cache = self._cache
        if key in cache:
            return cache[key]
        found = None
        for e in self._scan:
            if self._matches(e.spec, key):
                found = e
                break
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        cache[key] = found
        return found

    def _matches(self, spec: tuple[Any, ...], key: tuple[int, ...]) -> bool:
        for kind, s, k, w in zip(self.kinds, spec, key, self.widths, strict=True):
            if kind in ("exact", "valid"):
                if s != k:
                    return False
            elif kind == "range":
                if not s[0] <= k <= s[1]:
                    return False
            elif kind == "lpm":
                value, plen = s
                if (k >> (w - plen)) != (value >> (w - plen)):
                    return False
            else:  # ternary, optional
                if (k & s[1]) != s[0]:
                    return False
        return True

    def apply(self, p: Any, key: tuple[int, ...], nbytes: int) -> NodeFn | None:
        e = self.lookup(key)
        call: ActionCall | None
        if e is None:
            self.misses += 1
            call = self.default
            hit = False
        else:
            self.hits += 1
            hit = True
            if self.with_counters:
                e.packet_count += 1
                e.byte_count += nbytes
            dm = self.direct_meter
            if dm is not None and e.meter is not None:
                color = e.meter.execute(dm.clock(), nbytes if dm.unit == "bytes" else 1)
                if self.meter_target is not None:
                    p.h[self.meter_target[0]][self.meter_target[1]] = color
            if self.profile is None:
                call = e.call
            else:
                call = self.profile.resolve(p, e.member, e.group)
                if call is None:  # empty group: behave as a miss
                    call = self.default
                    hit = False
        if call is not None:
            call.fn(p, call.params)
        if self.next_by_action is None:
            return self.next_hit if hit else self.next_miss
        if call is None:
            return self.next_default
        return self.next_by_action.get(call.action_id, self.next_default)

    # ---- control plane ----------------------------------------------------------------------

    def normalize(self, spec: tuple[Any, ...], strict: bool = False) -> tuple[Any, ...]:
        """Check a match spec against the key's widths and canonicalise it. bmv2 masks off
        value bits outside an LPM prefix or a ternary mask; P4Runtime (`strict`) rejects them."""
        if len(spec) != len(self.kinds):
            raise TableError(
                "INVALID_ARGUMENT",
                f"{self.name}: key has {len(self.kinds)} fields, got {len(spec)}",
            )
        out: list[Any] = []
        for kind, s, w in zip(self.kinds, spec, self.widths, strict=True):
            full = (1 << w) - 1
            if kind in ("exact", "valid"):
                if not isinstance(s, int) or not 0 <= s <= full:
                    raise TableError("OUT_OF_RANGE", f"{self.name}: {s!r} does not fit {w} bits")
                out.append(s)
            elif kind == "lpm":
                value, plen = s
                if not 0 <= plen <= w or not 0 <= value <= full:
                    raise TableError("OUT_OF_RANGE", f"{self.name}: bad prefix {value}/{plen}")
                mask = ((1 << plen) - 1) << (w - plen)
                if value & ~mask and strict:
                    raise TableError(
                        "INVALID_ARGUMENT",
                        f"{self.name}: prefix {value:#x}/{plen} has bits past the prefix length",
                    )
                out.append((value & mask, plen))
            elif kind == "range":
                lo, hi = s
                if not 0 <= lo <= hi <= full:
                    raise TableError("OUT_OF_RANGE", f"{self.name}: bad range {lo}..{hi}")
                out.append((lo, hi))
            else:
                value, mask = s
                if not 0 <= mask <= full or not 0 <= value <= full:
                    raise TableError("OUT_OF_RANGE", f"{self.name}: {value}&&&{mask} too wide")
                if value & ~mask and strict:
                    raise TableError(
                        "INVALID_ARGUMENT",
                        f"{self.name}: ternary value {value:#x} has bits outside mask {mask:#x}",
                    )
                value &= mask
                if kind == "optional" and mask not in (0, full):
                    raise TableError(
                        "INVALID_ARGUMENT",
                        f"{self.name}: optional needs an exact value or a wildcard",
                    )
                out.append((value, mask))
        return tuple(out)

    def _ident(self, spec: tuple[Any, ...], priority: int) -> tuple[Any, ...]:
        return (spec, priority if self.needs_priority else 0)

    def find(self, spec: tuple[Any, ...], priority: int = 0) -> Entry | None:
        return self.entries.get(self._ident(self.normalize(spec), priority))

    def add(self, entry: Entry, *, const: bool = False, strict: bool = False) -> Entry:
        if self.immutable and not const:
            raise TableError("PERMISSION_DENIED", f"{self.name} has const entries")
        entry.spec = self.normalize(entry.spec, strict)
        if self.needs_priority:
            if entry.priority <= 0 and not const:
                raise TableError("INVALID_ARGUMENT", f"{self.name}: needs a priority > 0")
        else:
            entry.priority = 0
        ident = self._ident(entry.spec, entry.priority)
        if ident in self.entries:
            raise TableError("ALREADY_EXISTS", f"{self.name}: entry exists")
        limit = self.max_size or UNSIZED_LIMIT
        if len(self.entries) >= limit:
            raise TableError("RESOURCE_EXHAUSTED", f"{self.name}: table full ({limit})")
        self._check_action(entry)
        if self.direct_meter is not None and entry.meter is None:
            entry.meter = Meter()
        entry.handle = next(self._handles)
        self.entries[ident] = entry
        self._index(entry)
        return entry

    def modify(self, spec: tuple[Any, ...], priority: int, entry: Entry) -> Entry:
        if self.immutable:
            raise TableError("PERMISSION_DENIED", f"{self.name} has const entries")
        old = self.find(spec, priority)
        if old is None:
            raise TableError("NOT_FOUND", f"{self.name}: no such entry")
        self._check_action(entry)
        old.call, old.member, old.group = entry.call, entry.member, entry.group
        old.idle_timeout_ns, old.metadata = entry.idle_timeout_ns, entry.metadata
        self._cache.clear()
        return old

    def delete(self, spec: tuple[Any, ...], priority: int = 0) -> Entry:
        if self.immutable:
            raise TableError("PERMISSION_DENIED", f"{self.name} has const entries")
        ident = self._ident(self.normalize(spec), priority)
        e = self.entries.pop(ident, None)
        if e is None:
            raise TableError("NOT_FOUND", f"{self.name}: no such entry")
        self._unindex(e)
        return e

    def clear(self) -> None:
        for e in list(self.entries.values()):
            self._unindex(e)
        self.entries.clear()

    def set_default(self, call: ActionCall | None) -> None:
        if self.default_const:
            raise TableError("PERMISSION_DENIED", f"{self.name}: default action is const")
        self.default = call

    def _check_action(self, entry: Entry) -> None:
        if self.profile is None:
            if entry.call is None:
                raise TableError("INVALID_ARGUMENT", f"{self.name}: entry needs an action")
        else:
            if entry.member is not None:
                if entry.member not in self.profile.members:
                    raise TableError("NOT_FOUND", f"{self.name}: no member {entry.member}")
            elif entry.group is not None:
                if entry.group not in self.profile.groups:
                    raise TableError("NOT_FOUND", f"{self.name}: no group {entry.group}")
            else:
                raise TableError("INVALID_ARGUMENT", f"{self.name}: needs a member or group")

    def _index(self, e: Entry) -> None:
        if self.kind == "exact":
            self._exact[e.spec] = e
        elif self.kind == "lpm":
            plen = e.spec[self.lpm_index][1]
            k = tuple(s[0] if i == self.lpm_index else s for i, s in enumerate(e.spec))
            self._lpm.setdefault(plen, {})[k] = e
            self._lpm_lengths = sorted(self._lpm, reverse=True)
        else:
            # Highest priority first; among equal priorities the earlier entry wins, as bmv2
            # does: a new entry goes after every entry of its priority or higher.
            i = bisect.bisect_right(self._scan_keys, -e.priority)
            self._scan.insert(i, e)
            self._scan_keys.insert(i, -e.priority)
            self._cache.clear()

    def _unindex(self, e: Entry) -> None:
        if self.kind == "exact":
            self._exact.pop(e.spec, None)
        elif self.kind == "lpm":
            plen = e.spec[self.lpm_index][1]
            k = tuple(s[0] if i == self.lpm_index else s for i, s in enumerate(e.spec))
            bucket = self._lpm.get(plen, {})
            bucket.pop(k, None)
            if not bucket:
                self._lpm.pop(plen, None)
                self._lpm_lengths = sorted(self._lpm, reverse=True)
        else:
            i = self._scan.index(e)
            del self._scan[i], self._scan_keys[i]
            self._cache.clear()
