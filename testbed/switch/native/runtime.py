"""The native pipeline as a `Compiled`: what `V1Switch` drives, with the work done in C.

Packets: a `NativePacket` is a `Packet` whose header vector, validity flags and per-packet
registers live in one C struct (`xm_packet`); `p.h[header][field]` and `p.v[header]` read and
write that memory, so the architecture code (v1model.py) runs unchanged on either pipeline.

Tables (the design of this cut): the Python `MatchTable` stays the control plane's source of
truth (P4Runtime Write and Read, STF commands, const entries all go through it unchanged);
every insert, modify, delete, clear and default change marks the table dirty, and before the
next packet runs ingress or egress the runtime rewrites the table's native rows from the
Python entries (in match order: any order for exact, longest prefix first for LPM, the
reference's priority order for ternary; the first matching row wins), indexed by mask vector
for a table of INDEX_FROM rows or more (tuple space search: a hash lookup per distinct mask,
the smallest matching row kept). Action profiles are mirrored the same way. Direct
counters count in C per row and are added into the Python entries whenever the table's
entries are read (`entries` is a property that collects them first) or rewritten. Indexed
counters and registers keep their cells in C arrays that the Python objects index directly.
A rewrite is O(entries): cheap between packets, not meant for a write per packet.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any, cast

from testbed.switch.codegen import Compiled
from testbed.switch.compiler import load_const_state
from testbed.switch.externs import CounterArray, MeterArray, RegisterArray, ValueSet
from testbed.switch.native.build import SANITIZE_ENV, build, cache_dir, load
from testbed.switch.native.cgen import (
    ABORT_INDEX,
    C_HASHES,
    NO_ACTION,
    U64,
    Generated,
    TableInfo,
    generate,
)
from testbed.switch.packet import Packet, PipelineAbort
from testbed.switch.program import Json, LoadError, Program
from testbed.switch.tables import ActionCall, ActionProfile, Entry, Group, MatchTable, TableError


class NativePacket(Packet):
    """A packet whose state is a C `xm_packet` (see cgen.py)."""

    __slots__ = ("_c", "_rt", "_keep", "_h")

    def __init__(self, rt: NativeRuntime, blank: bool = False) -> None:  # noqa: D107
        # no Packet.__init__: the state is C memory, a fresh packet's copied in (blank: left
        # uninitialised, for xm_receive, which initialises it)
        self._rt = rt
        if blank:
            self._c = rt.alloc("xm_packet *")
        else:
            self._c = rt.ffi.new("xm_packet *")
            rt.ffi.memmove(self._c, rt.proto, rt.packet_size)
        self._keep: Any = None
        self._h: _Headers | None = None
        self.uid = 0
        self.reinjects = 0
        self.t_ns = 0

    # the header vector and validity, in C memory
    @property  # type: ignore[override]
    def h(self) -> Any:
        if self._h is None:
            self._h = _Headers(self._rt, self._c)
        return self._h

    @h.setter
    def h(self, value: Any) -> None:
        raise AttributeError("a native packet's header vector is C memory: assign its fields")

    @property  # type: ignore[override]
    def v(self) -> Any:
        return self._c.valid

    @v.setter
    def v(self, value: Any) -> None:
        raise AttributeError("a native packet's validity flags are C memory: assign them")

    @property  # type: ignore[override]
    def payload(self) -> bytes:
        c = self._c
        if c.payload == self._rt.ffi.NULL:
            return b""
        return self._rt.ffi.buffer(c.payload, c.payload_len)[:]

    @payload.setter
    def payload(self, data: bytes) -> None:
        cbuf = self._rt.ffi.from_buffer("uint8_t[]", data)
        self._keep = (data, cbuf)
        self._c.payload = cbuf
        self._c.payload_len = len(data)

    # v1model's per-packet registers
    @property  # type: ignore[override]
    def exit(self) -> bool:
        return bool(self._c.regs.exit)

    @exit.setter
    def exit(self, value: bool) -> None:
        self._c.regs.exit = int(value)

    def _reg(name: str) -> property:  # type: ignore[misc]  # noqa: N805
        def get(self: NativePacket) -> int:
            return int(getattr(self._c.regs, name))

        def put(self: NativePacket, value: int) -> None:
            setattr(self._c.regs, name, value)

        return property(get, put)

    plen = _reg("plen")  # type: ignore[assignment]
    ingress_len = _reg("ingress_len")  # type: ignore[assignment]
    clone_session = _reg("clone_session")  # type: ignore[assignment]
    clone_field_list = _reg("clone_field_list")  # type: ignore[assignment]
    resubmit_fl = _reg("resubmit_fl")  # type: ignore[assignment]
    recirc_fl = _reg("recirc_fl")  # type: ignore[assignment]
    learn_id = _reg("learn_id")  # type: ignore[assignment]
    truncate_len = _reg("truncate_len")  # type: ignore[assignment]
    del _reg

    def copy(self) -> NativePacket:
        rt = self._rt
        q = NativePacket.__new__(NativePacket)
        q._rt = rt
        q._c = rt.ffi.new("xm_packet *")
        rt.ffi.memmove(q._c, self._c, rt.packet_size)
        q._keep = self._keep
        q._h = None
        r = q._c.regs
        r.exit = 0
        r.clone_session, r.clone_field_list, r.resubmit_fl, r.recirc_fl, r.learn_id = -1, 0, 0, 0, 0
        q.uid, q.reinjects, q.t_ns = self.uid, self.reinjects, self.t_ns
        return q


class _Headers:
    """`p.h`: header i is a `uint64_t *` to its fields (index, assign, slice with bounds)."""

    __slots__ = ("_base", "_slots")

    def __init__(self, rt: NativeRuntime, c: Any) -> None:
        self._base = rt.ffi.cast("uint64_t *", c)
        self._slots = rt.gen.header_slots

    def __getitem__(self, i: int) -> Any:
        return self._base + self._slots[i]


class NativeCounterArray(CounterArray):
    """An indexed counter whose cells are C arrays the generated code counts into."""

    def __init__(self, ffi: Any, name: str, size: int) -> None:
        super().__init__(name, size)
        self._ffi = ffi
        self.packets = ffi.new("uint64_t[]", max(1, size))  # type: ignore[assignment]
        self.bytes = ffi.new("uint64_t[]", max(1, size))  # type: ignore[assignment]

    def write(self, index: int, packets: int, nbytes: int) -> None:
        self._check(index)
        if not (0 <= packets <= U64 and 0 <= nbytes <= U64):
            raise ValueError(f"counter {self.name}: values must fit 64 bits")
        super().write(index, packets, nbytes)

    def reset(self) -> None:
        for i in range(self.size):
            self.packets[i] = 0
            self.bytes[i] = 0


class NativeRegisterArray(RegisterArray):
    """A register array whose cells are a C array the generated code reads and writes."""

    def __init__(self, ffi: Any, name: str, size: int, bitwidth: int) -> None:
        super().__init__(name, size, bitwidth)
        self.values = ffi.new("uint64_t[]", max(1, size))  # type: ignore[assignment]

    def reset(self) -> None:
        for i in range(self.size):
            self.values[i] = 0


class NativeActionProfile(ActionProfile):
    """An action profile whose changes are mirrored into C before the next packet."""

    def __init__(self, rt: NativeRuntime, index: int, *args: Any) -> None:
        self._rt = rt
        self._index = index
        self._keep: Any = None
        self.member_index: dict[int, int] = {}
        self.group_index: dict[int, int] = {}
        super().__init__(*args)
        self._mark()

    def _mark(self) -> None:
        self._dirty = True
        self._rt.dirty = True

    def add_member(self, mid: int, call: ActionCall) -> None:
        self._rt.check_call(self.name, call)
        super().add_member(mid, call)
        self._mark()

    def modify_member(self, mid: int, call: ActionCall) -> None:
        self._rt.check_call(self.name, call)
        super().modify_member(mid, call)
        self._mark()

    def delete_member(self, mid: int) -> None:
        super().delete_member(mid)
        self._mark()

    def set_group(
        self, gid: int, members: list[tuple[int, int]], max_size: int = 0, create: bool = False
    ) -> None:
        super().set_group(gid, members, max_size, create)
        self._mark()

    def delete_group(self, gid: int) -> None:
        super().delete_group(gid)
        self._mark()

    def sync(self) -> None:
        rt, ffi = self._rt, self._rt.ffi
        stride = 1 + rt.gen.max_params
        members = list(self.members.items())
        self.member_index = {mid: i for i, (mid, _) in enumerate(members)}
        marr = ffi.new("uint64_t[]", max(1, len(members) * stride))
        for i, (_, call) in enumerate(members):
            marr[i * stride] = call.action_id
            for j, v in enumerate(call.params):
                marr[i * stride + 1 + j] = v
        groups: list[tuple[int, Group]] = list(self.groups.items())
        self.group_index = {gid: i for i, (gid, _) in enumerate(groups)}
        garr = ffi.new("uint64_t[]", max(2, 2 * len(groups)))
        nitems = sum(len(g.members) for _, g in groups)
        items = ffi.new("uint64_t[]", max(2, 2 * nitems))
        k = 0
        for i, (_, g) in enumerate(groups):
            garr[2 * i], garr[2 * i + 1] = k, len(g.members)
            for mid, cum in zip(g.members, g.cumulative, strict=True):
                items[2 * k], items[2 * k + 1] = cum, self.member_index[mid]
                k += 1
        pr = rt.state.profiles[self._index]
        pr.members, pr.mstride, pr.groups, pr.items = marr, stride, garr, items
        self._keep = (marr, garr, items)
        self._dirty = False


class NativeMatchTable(MatchTable):
    """A match table whose entries are mirrored into C rows before the next packet."""

    def __init__(self, rt: NativeRuntime, info: TableInfo, *args: Any, **kw: Any) -> None:
        self._rt = rt
        self._info = info
        self._rows_order: list[Entry] = []
        self._keep: Any = None
        self._synced = False
        self._entries_d: dict[tuple[Any, ...], Entry] = {}
        self._default_call: ActionCall | None = None
        super().__init__(*args, **kw)
        self._mark()

    def _mark(self) -> None:
        self._dirty = True
        self._rt.dirty = True

    @property  # type: ignore[override]
    def entries(self) -> dict[tuple[Any, ...], Entry]:
        self.collect_counters()
        return self._entries_d

    @entries.setter
    def entries(self, value: dict[tuple[Any, ...], Entry]) -> None:
        self._entries_d = value

    @property  # type: ignore[override]
    def default(self) -> ActionCall | None:
        return self._default_call

    @default.setter
    def default(self, call: ActionCall | None) -> None:
        if call is not None:
            self._rt.check_call(self.name, call)
        self._default_call = call
        self._mark()

    def add(self, entry: Entry, *, const: bool = False, strict: bool = False) -> Entry:
        if entry.call is not None:
            self._rt.check_call(self.name, entry.call)
        e = super().add(entry, const=const, strict=strict)
        self._mark()
        return e

    def modify(self, spec: tuple[Any, ...], priority: int, entry: Entry) -> Entry:
        if entry.call is not None:
            self._rt.check_call(self.name, entry.call)
        e = super().modify(spec, priority, entry)
        self._mark()
        return e

    def delete(self, spec: tuple[Any, ...], priority: int = 0) -> Entry:
        e = super().delete(spec, priority)
        self._mark()
        return e

    def clear(self) -> None:
        super().clear()
        self._mark()

    def native_lookup(self, key: tuple[int, ...]) -> Entry | None:
        """The entry the C finds for `key` (as `lookup` does in Python), for the tests."""
        if self._rt.dirty:
            self._rt.sync()
        ckey = self._rt.ffi.new("uint64_t[]", max(1, len(key)))
        for i, v in enumerate(key):
            ckey[i] = v
        row = self._rt.lib.xm_table_lookup(self._rt.state, self._info.index, ckey, len(key))
        return None if row < 0 else self._rows_order[row]

    def collect_counters(self) -> None:
        """Add what C counted per row into the Python entries (direct counters)."""
        if not self._synced or not self._info.direct_counters:
            return
        t = self._rt.state.tables[self._info.index]
        if not t.dc_touched:
            return
        for i, e in enumerate(self._rows_order):
            n = t.dc_packets[i]
            if n:
                e.packet_count += n
                e.byte_count += t.dc_bytes[i]
                t.dc_packets[i] = 0
                t.dc_bytes[i] = 0
        t.dc_touched = 0

    def sync(self) -> None:
        rt, ffi, info = self._rt, self._rt.ffi, self._info
        self.collect_counters()
        entries = list(self._entries_d.values())
        if self.kind == "lpm":
            li = self.lpm_index
            order = sorted(entries, key=lambda e: -e.spec[li][1])
        elif self.kind == "exact":
            order = entries
        else:
            order = list(self._scan)
        nk = len(info.kinds)
        stride = 2 * nk + (2 if info.indirect else 1 + rt.gen.max_params)
        rows = ffi.new("uint64_t[]", max(1, len(order) * stride))
        prof = cast(NativeActionProfile | None, self.profile)
        for i, e in enumerate(order):
            base = i * stride
            for j, (kind, s, w) in enumerate(zip(info.kinds, e.spec, info.widths, strict=True)):
                if kind in ("exact", "valid"):
                    value, mask = s, (1 << w) - 1
                elif kind == "lpm":
                    value, plen = s
                    mask = ((1 << plen) - 1) << (w - plen)
                else:
                    value, mask = s
                rows[base + j] = value
                rows[base + nk + j] = mask
            tail = base + 2 * nk
            if info.indirect:
                assert prof is not None
                if e.member is not None:
                    rows[tail], rows[tail + 1] = 0, prof.member_index[e.member]
                else:
                    assert e.group is not None
                    rows[tail], rows[tail + 1] = 1, prof.group_index[e.group]
            else:
                assert e.call is not None
                rows[tail] = e.call.action_id
                for j, v in enumerate(e.call.params):
                    rows[tail + 1 + j] = v
        dflt = self._default_call
        dparams = ffi.new("uint64_t[]", max(1, rt.gen.max_params))
        if dflt is not None:
            for j, v in enumerate(dflt.params):
                dparams[j] = v
        dcp = ffi.new("uint64_t[]", max(1, len(order)))
        dcb = ffi.new("uint64_t[]", max(1, len(order)))
        groups, slots, ngroups = _mask_groups(ffi, rows, len(order), nk, stride)
        t = rt.state.tables[info.index]
        t.rows, t.n, t.stride = rows, len(order), stride
        t.groups, t.ngroups, t.slots = groups, ngroups, slots
        t.default_action = NO_ACTION if dflt is None else dflt.action_id
        t.default_params = dparams
        t.dc_packets, t.dc_bytes, t.dc_touched = dcp, dcb, 0
        self._keep = (rows, dparams, dcp, dcb, groups, slots)
        self._rows_order = order
        self._synced = True
        self._dirty = False


# Tables of INDEX_FROM rows or more are looked up through their mask groups, not scanned.
INDEX_FROM = 8


def slot_hash(values: list[int]) -> int:
    """cgen.py's xm_key_hash of a masked key."""
    h = 0
    for v in values:
        h = ((h ^ v) * 0x9E3779B97F4A7C15) & U64
    return h >> 32


def _mask_groups(ffi: Any, rows: Any, n: int, nk: int, stride: int) -> tuple[Any, Any, int]:
    """The tuple-space index of a table's rows (see cgen.py's struct xm_table): (groups,
    slots, group count); no groups for a small or keyless table."""
    if n < INDEX_FROM or nk == 0:
        return ffi.new("uint64_t[]", 1), ffi.new("uint64_t[]", 1), 0
    by_mask: dict[tuple[int, ...], list[int]] = {}
    for i in range(n):
        base = i * stride
        by_mask.setdefault(tuple(rows[base + nk : base + 2 * nk]), []).append(i)
    groups = ffi.new("uint64_t[]", 3 * len(by_mask))
    size = sum(1 << (2 * len(members) - 1).bit_length() for members in by_mask.values())
    slots = ffi.new("uint64_t[]", size)
    off = 0
    for g, members in enumerate(by_mask.values()):  # in the order of their first rows
        nslots = 1 << (2 * len(members) - 1).bit_length()  # a power of two over twice the rows
        groups[3 * g], groups[3 * g + 1], groups[3 * g + 2] = members[0], nslots, off
        seen: set[tuple[int, ...]] = set()
        for row in members:  # in row order: the first row of each value takes the slot
            value = tuple(rows[row * stride : row * stride + nk])
            if value in seen:
                continue
            seen.add(value)
            i = slot_hash(list(value)) & (nslots - 1)
            while slots[off + i]:
                i = (i + 1) & (nslots - 1)
            slots[off + i] = row + 1
        off += nslots
    return groups, slots, len(by_mask)


class NativeRandom(random.Random):
    """The program's random extern on the native pipeline: a `random.Random` whose Mersenne
    Twister state is the C pipeline's (`xm_state.mt`), so the C draws the program's random
    values without calling back into Python and every draw, from C or from here, is the one
    a `random.Random` in the same state makes. Seeding, and a draw made from Python, go
    through CPython's own generator, so a seed gives the reference's sequence."""

    def __init__(self, state: Any, memory: Any) -> None:  # noqa: D107
        self._state = state
        self._memory = memory  # the state's memory: kept while this generator is
        super().__init__()

    def seed(self, a: Any = None, version: int = 2) -> None:
        ref = random.Random()
        ref.seed(a, version)
        self.setstate(ref.getstate())

    def getstate(self) -> tuple[Any, ...]:
        st = self._state
        return (3, (*st.mt, int(st.mti)), self.gauss_next)

    def setstate(self, state: tuple[Any, ...]) -> None:
        version, internal, gauss_next = state
        if version != 3 or len(internal) != 625:
            raise ValueError(f"state of version {version} with {len(internal)} words: not MT19937")
        st = self._state
        st.mt = list(internal[:624])
        st.mti = internal[624]
        self.gauss_next = gauss_next

    # a draw made from Python (rare: the program's draws are the C's) is CPython's own, from
    # the C's state, which it then advances
    def _draw(self, draw: Callable[[random.Random], Any]) -> Any:
        ref = random.Random()
        ref.setstate(self.getstate())
        out = draw(ref)
        self.setstate(ref.getstate())
        return out

    def getrandbits(self, k: int) -> int:
        return int(self._draw(lambda ref: ref.getrandbits(k)))

    def random(self) -> float:
        return float(self._draw(lambda ref: ref.random()))


class NativeRuntime:
    """One loaded native pipeline and its state (one per switch)."""

    def __init__(self, prog: Program, gen: Generated, ffi: Any, lib: Any) -> None:
        self.prog = prog
        self.gen = gen
        self.ffi = ffi
        self.lib = lib
        # where a native loop's switch hop reads `dirty` (testbed/switch/native/hop.py)
        self.dirty_flag: Any = None
        self.dirty = True
        self.packet_size = int(lib.xm_layout(0))
        checks = {
            "packet size": (ffi.sizeof("xm_packet"), self.packet_size),
            "valid": (ffi.offsetof("xm_packet", "valid"), lib.xm_layout(1)),
            "regs": (ffi.offsetof("xm_packet", "regs"), lib.xm_layout(2)),
            "payload": (ffi.offsetof("xm_packet", "payload"), lib.xm_layout(4)),
        }
        for what, (py, c) in checks.items():
            if py != c:
                raise LoadError(f"native pipeline: layout mismatch ({what}: {py} != {c})")
        if ffi.sizeof("xm_state") > lib.xm_layout(3):
            raise LoadError("native pipeline: layout mismatch (state)")
        self._state_mem = ffi.new("char[]", int(lib.xm_layout(3)))
        self.state = ffi.cast("xm_state *", self._state_mem)
        # deparser output: the headers, and the payload after them when it fits
        self.out_size = gen.max_out + 16384
        self.out = ffi.new("uint8_t[]", self.out_size)
        # a fresh packet's state, copied into each new packet
        self.proto = ffi.new("xm_packet *")
        lib.xm_new_packet(self.proto)
        self.alloc = ffi.new_allocator(should_clear_after_alloc=False)
        # xm_depart_batch's frames (several packets' worth) and per-departure results
        self.batch_size = 1 << 20
        self.batch_out: Any = ffi.new("uint8_t[]", self.batch_size) if gen.arch else None
        self._departed_cap = 64
        self.departed: Any = ffi.new("xm_departed[]", self._departed_cap) if gen.arch else None
        # the architecture's common path in C (cgen.py's _architecture), when generated
        self.arch = gen.arch
        self.rng = NativeRandom(self.state, self._state_mem)
        self.tables: dict[str, NativeMatchTable] = {}
        self.profiles: dict[str, NativeActionProfile] = {}

    @property
    def dirty(self) -> bool:
        """Whether a table changed in Python since the C last took them (`sync`)."""
        return self._dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self._dirty = value
        if self.dirty_flag is not None:
            self.dirty_flag[0] = int(value)

    def adopt(self, block: int) -> tuple[NativePacket, bytes]:
        """The packet a native loop's switch hop made of a frame (`block`, the address of its
        xm_block: the packet, then the frame it was parsed from), owned by Python from now
        on, and that frame's bytes."""
        ffi = self.ffi
        b = ffi.cast("xm_block *", block)
        buf = ffi.buffer(b.data, b.len)[:]
        p = NativePacket.__new__(NativePacket)
        p._rt = self
        p._c = ffi.gc(ffi.cast("xm_packet *", block), self.lib.xm_hop_free_packet)
        p._keep = p._c  # the payload points into the block: copies keep it alive
        p._h = None
        p.uid, p.reinjects, p.t_ns = 0, 0, 0
        return p, buf

    def check_call(self, where: str, call: ActionCall) -> None:
        """An action call the native tables can hold: a known action, its parameters each
        given and each within 64 bits."""
        a = self.prog.actions.get(call.action_id)
        if a is None:
            raise TableError("INVALID_ARGUMENT", f"{where}: unknown action id {call.action_id}")
        if len(call.params) != len(a.params) or any(not 0 <= v <= U64 for v in call.params):
            raise TableError(
                "INVALID_ARGUMENT",
                f"{where}: {a.name} takes {len(a.params)} parameters of at most 64 bits",
            )

    def sync(self) -> None:
        for prof in self.profiles.values():
            if prof._dirty:
                prof.sync()
                for t in self.tables.values():
                    if t.profile is prof:
                        t._dirty = True
        for t in self.tables.values():
            if t._dirty:
                t.sync()
        self.dirty = False

    def hash(self, algo: str, data: bytes) -> int:
        """One of the generated C's hash algorithms (cgen.C_HASHES) over `data`."""
        return int(self.lib.xm_hash(C_HASHES.index(algo), data, len(data)))

    def abort_error(self, stage: str) -> Exception:
        """The exception the reference raises for the last abort."""
        st = self.state
        msg = self.ffi.string(st.abort_msg).decode() if st.abort_msg != self.ffi.NULL else stage
        if st.abort_kind == ABORT_INDEX:
            return IndexError(msg)
        return PipelineAbort(msg)

    def raise_abort(self, stage: str) -> None:
        raise self.abort_error(stage)

    def blank_packet(self) -> NativePacket:
        """A packet for `receive`, which initialises it."""
        return NativePacket(self, blank=True)

    # ---- the Compiled entry points ----------------------------------------------------------

    def new_packet(self) -> Packet:
        return NativePacket(self)

    def parse(self, p: Packet, buf: bytes) -> int:
        np_ = cast(NativePacket, p)
        cbuf = self.ffi.from_buffer("uint8_t[]", buf)
        np_._keep = (buf, cbuf)
        rc = int(self.lib.xm_parse(self.state, np_._c, cbuf, len(buf)))
        if rc < 0:
            self.raise_abort("parser")
        return rc

    def verify_checksums(self, p: Packet) -> bool:
        rc = self.lib.xm_verify_checksums(self.state, cast(NativePacket, p)._c)
        if rc < 0:
            self.raise_abort("checksum")
        return bool(rc)

    def update_checksums(self, p: Packet) -> None:
        if self.lib.xm_update_checksums(self.state, cast(NativePacket, p)._c) < 0:
            self.raise_abort("checksum")

    def deparse(self, p: Packet) -> bytes:
        np_ = cast(NativePacket, p)
        n = self.lib.xm_deparse(self.state, np_._c, self.out, self.out_size)
        if n < 0:
            self.raise_abort("deparser")
        if n <= self.out_size:  # headers and payload, written by the C
            return self.ffi.buffer(self.out, n)[:]
        return self.ffi.buffer(self.out, n - np_._c.payload_len)[:] + np_.payload

    def ingress(self, p: Packet) -> None:
        if self.dirty:
            self.sync()
        if self.lib.xm_ingress(self.state, cast(NativePacket, p)._c) < 0:
            self.raise_abort("ingress")

    def egress(self, p: Packet) -> None:
        if self.dirty:
            self.sync()
        if self.lib.xm_egress(self.state, cast(NativePacket, p)._c) < 0:
            self.raise_abort("egress")

    # ---- the architecture's common path (v1model.py drives these when `arch`) -------------

    def receive(self, p: NativePacket, buf: bytes, port: int, t_us: int, drop_port: int) -> int:
        """xm_receive: a blank packet initialised, parsed and through ingress; 0 (enqueue it
        for its egress_spec), ARCH_DROP, ARCH_PYTHON or an abort's kind negated."""
        if self.dirty:
            self.sync()
        cbuf = self.ffi.from_buffer("uint8_t[]", buf)
        p._keep = (buf, cbuf)
        return int(self.lib.xm_receive(self.state, p._c, cbuf, len(buf), port, t_us, drop_port))

    def depart(
        self, p: NativePacket, port: int, prio: int, now_us: int, enq_us: int, left: int, drop: int
    ) -> int:
        """xm_depart: the dequeue's metadata, egress, checksums and the deparser into `out`;
        the frame's length (its payload not copied when past out_size), ARCH_DROP,
        ARCH_PYTHON, ARCH_DEPARSE_ERROR or an egress abort's kind negated."""
        if self.dirty:
            self.sync()
        return int(
            self.lib.xm_depart(
                self.state, p._c, port, prio, now_us, enq_us, left, drop, self.out, self.out_size
            )
        )

    def receive_enqueue(
        self,
        p: NativePacket,
        buf: bytes,
        port: int,
        t_ns: int,
        drop_port: int,
        tm: int,
        handle: int,
        unit: int,
        cell: int,
    ) -> int:
        """xm_receive_enqueue: `receive`, then into the native traffic manager at `tm` (its
        address) when it returns 0; the port it was queued for (>= 0), or `receive`'s codes,
        ARCH_ENQUEUE_PYTHON, ARCH_QUEUE_FULL, ARCH_NO_MEMORY."""
        if self.dirty:
            self.sync()
        cbuf = self.ffi.from_buffer("uint8_t[]", buf)
        p._keep = (buf, cbuf)
        return int(
            self.lib.xm_receive_enqueue(
                self.state, p._c, cbuf, len(buf), port, t_ns, drop_port, tm, handle, unit, cell
            )
        )

    def depart_batch(
        self, tm: int, deps: int, i: int, n: int, drop_port: int, unit: int, cell: int
    ) -> int:
        """xm_depart_batch over departures i..n of the traffic manager at `tm` (`deps`: its
        departures' address); the results in `departed`, the frames in `batch_out`."""
        if self.dirty:
            self.sync()
        if n > self._departed_cap:
            self._departed_cap = max(n, 2 * self._departed_cap)
            self.departed = self.ffi.new("xm_departed[]", self._departed_cap)
        return int(
            self.lib.xm_depart_batch(
                self.state,
                tm,
                deps,
                i,
                n,
                drop_port,
                unit,
                cell,
                self.batch_out,
                self.batch_size,
                self.departed,
            )
        )

    def batch_frame(self, p: NativePacket, off: int, n: int) -> bytes:
        """The frame xm_depart_batch wrote at `off`, `n` bytes."""
        if n <= self.batch_size - off:
            return self.ffi.buffer(self.batch_out + off, n)[:]
        head = n - int(p._c.payload_len)
        return self.ffi.buffer(self.batch_out + off, head)[:] + p.payload

    def frame(self, p: NativePacket, n: int) -> bytes:
        """The frame xm_depart wrote, `n` bytes (as `deparse` returns it)."""
        if n <= self.out_size:
            return self.ffi.buffer(self.out, n)[:]
        return self.ffi.buffer(self.out, n - p._c.payload_len)[:] + p.payload

    def action_fn(self, aid: int) -> Callable[[Packet, tuple[int, ...]], None]:
        def run(p: Packet, params: tuple[int, ...]) -> None:
            ad = self.ffi.new("uint64_t[]", max(1, len(params)))
            for i, v in enumerate(params):
                ad[i] = v
            if self.lib.xm_run_action(self.state, cast(NativePacket, p)._c, aid, ad) < 0:
                self.raise_abort("action")

        return run


def load_native(
    prog: Program, clock_us: Callable[[], int], log_fn: Callable[[str], None] | None = None
) -> Compiled:
    """The native pipeline of `prog` as a `Compiled`; raises `Unsupported` (a construct the
    generator lacks) or `BuildError` (no compiler, a failed build) with a one-line reason."""
    gen, ffi, lib = _built(prog)
    rt = NativeRuntime(prog, gen, ffi, lib)
    st = rt.state

    counters: dict[str, CounterArray] = {}
    for name, cj in prog.counter_arrays.items():
        if cj.get("is_direct"):
            counters[name] = CounterArray(name, 0, True, cj.get("binding", ""))
            continue
        nc = NativeCounterArray(ffi, name, int(cj.get("size", 0)))
        i = gen.counters[name]
        st.counter_packets[i], st.counter_bytes[i], st.counter_size[i] = (
            nc.packets,
            nc.bytes,
            nc.size,
        )
        counters[name] = nc
    registers: dict[str, RegisterArray] = {}
    for name, rj in prog.register_arrays.items():
        nr = NativeRegisterArray(ffi, name, int(rj["size"]), int(rj["bitwidth"]))
        i = gen.registers[name]
        st.registers[i], st.register_size[i] = nr.values, nr.size
        registers[name] = nr
    meters: dict[str, MeterArray] = {}  # a program with meters is Unsupported (cgen.py)
    value_sets: dict[str, ValueSet] = {}  # so is one with parser value sets

    for name, apj in prog.action_profiles.items():
        rt.profiles[name] = NativeActionProfile(
            rt, gen.profiles[name], name, int(apj.get("max_size", 0)), _selector_marker(apj)
        )
    for name, info in gen.tables.items():
        rt.tables[name] = _table(rt, prog, prog.tables[name], info)
    actions = {aid: rt.action_fn(aid) for aid in prog.actions}
    rt.sync()
    return Compiled(
        program=prog,
        source=gen.source,
        parse=rt.parse,
        verify_checksums=rt.verify_checksums,
        update_checksums=rt.update_checksums,
        deparse=rt.deparse,
        ingress=rt.ingress,
        egress=rt.egress,
        new_packet=rt.new_packet,
        tables=dict(rt.tables),
        profiles=dict(rt.profiles),
        counters=counters,
        meters=meters,
        registers=registers,
        value_sets=value_sets,
        actions=actions,
        random=rt.rng,
        native=rt if gen.arch else None,
    )


# (the program's JSON, the build's environment and what the program's header types hold, the
# C generated, built and loaded) of the last few programs: a fabric's switches load one
# program, from one parsed JSON (v1model.parsed_config), and each run of a suite loads it into
# every switch again
_BUILT: list[tuple[Json, tuple[Any, ...], Generated, Any, Any]] = []
_BUILT_KEEP = 4


def _built(prog: Program) -> tuple[Generated, Any, Any]:
    """The C of `prog`, built and loaded (ffi, lib), once per process for the same JSON
    document and header types (v1model's StdMeta adds hidden fields to them before compiling):
    the generated C keeps no state of its own (each switch's is the `xm_state` it passes), and
    one shared object is loaded once by the process whoever opens it."""
    # the build's key besides the C: where the cache is and the sanitizers (build.build)
    shape = (
        str(cache_dir()),
        os.environ.get(SANITIZE_ENV, ""),
        tuple((t.name, tuple(t.fields)) for t in prog.header_types.values()),
    )
    for doc, seen, gen, ffi, lib in _BUILT:
        if doc is prog.doc and seen == shape:
            return gen, ffi, lib
    gen = generate(prog)
    ffi, lib = load(gen.cdef, build(gen.source, gen.digest))
    _BUILT.insert(0, (prog.doc, shape, gen, ffi, lib))
    del _BUILT[_BUILT_KEEP:]
    return gen, ffi, lib


def _selector_marker(apj: Json) -> Callable[[Any], int] | None:
    """ActionProfile wants a selector function to allow groups; the native pipeline hashes in
    C, so the Python one is never called."""
    if not apj.get("selector"):
        return None

    def in_c(p: Any) -> int:
        raise RuntimeError("the native pipeline selects group members in C")

    return in_c


def _table(rt: NativeRuntime, prog: Program, t: Json, info: TableInfo) -> NativeMatchTable:
    """The table as testbed/switch/compiler.py's _build_table makes it (default action, const
    entries), as a NativeMatchTable."""
    profile = rt.profiles.get(info.profile) if info.profile else None
    table = NativeMatchTable(
        rt,
        info,
        t["name"],
        info.kinds,
        info.widths,
        int(t.get("max_size", 0)),
        profile,
        info.direct_counters,
        None,
        None,
    )
    load_const_state(
        table,
        t,
        info.kinds,
        info.widths,
        lambda aid: rt.action_fn(aid) if aid in prog.actions else None,
    )
    return table
