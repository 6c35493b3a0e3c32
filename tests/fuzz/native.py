"""Differential fuzzing: the native pipeline against the reference, packet by packet.

Two switches load one program, one on each pipeline, get the same random table entries,
action profile members and groups and default actions, and receive the same random and
mutated packets at the same virtual times; every packet's output (port and bytes, in order),
and at the end every counter, register, direct counter and drop count, must be identical.

    python -m tests.fuzz.native --packets 100000 [--program PATH.json ...] [--seed N]

(`make fuzz` runs it on the xingmai program and the conformance programs it names below.)
The test suite runs the same code with fewer packets (tests/test_native_pipeline.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from testbed.p4files import BMV2_JSON
from testbed.switch.program import Program
from testbed.switch.tables import ActionCall, Entry, MatchTable, TableError
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import V1Switch

REPO = Path(__file__).resolve().parents[2]
# p4c's conformance corpus: not part of a user's checkout (XINGMAI_CONFORMANCE points at it)
CORPUS = Path(os.environ.get("XINGMAI_CONFORMANCE", REPO.parent / "shared" / "conformance"))
# conformance programs with tables of every supported match kind, checksums, registers,
# counters, clones, parser branches, header stacks: the fuzzer's default set beside the
# xingmai program
CONFORMANCE_PROGRAMS = (
    "v1model-special-ops-bmv2",
    "table-entries-exact-ternary-bmv2",
    "table-entries-ser-enum-bmv2",
    "issue1814-1-bmv2",
    "stack_complex-bmv2",
    "gauntlet_mux_hdr-bmv2",
)
# and the project's own P4 test programs (tests/p4/)
OWN_PROGRAMS = ("switch_features", "primitives", "bench_two_tables", "bench_l3")


class NotNative(Exception):
    """The native pipeline did not load this program (the reason is the message)."""


@dataclass
class Report:
    program: str
    packets: int = 0
    outputs: int = 0
    writes: int = 0
    divergences: list[str] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


class PipelinePair:
    """One program on both pipelines, driven identically."""

    def __init__(self, json_bytes: bytes, seed: int = 0):
        self.ref = V1Switch(clock=Clock(virtual=True), pipeline="reference")
        self.nat = V1Switch(clock=Clock(virtual=True), pipeline="native")
        self.ref.load(json_bytes)
        self.nat.load(json_bytes)
        if self.nat.pipeline_in_use != "native":
            raise NotNative(self.nat.native_reason)
        self.out_ref: list[tuple[int, bytes]] = []
        self.out_nat: list[tuple[int, bytes]] = []
        self.ref.transmit = lambda port, data: self.out_ref.append((port, data))
        self.nat.transmit = lambda port, data: self.out_nat.append((port, data))
        assert self.ref.compiled is not None and self.nat.compiled is not None
        self.rc, self.nc = self.ref.compiled, self.nat.compiled
        # the same random stream for modify_field_rng_uniform on both sides
        self.rc.random.seed(seed)
        self.nc.random.seed(seed)

    @property
    def program(self) -> Program:
        return self.rc.program

    def packet(self, port: int, data: bytes, advance_ns: int) -> str | None:
        """Run one packet on both; a description of how their outputs differ, or None."""
        self.out_ref.clear()
        self.out_nat.clear()
        for sw in (self.ref, self.nat):
            sw.clock.advance(advance_ns)
            sw.receive(port, data)
            while sw.service():
                pass
        if self.out_ref != self.out_nat:
            return (
                f"packet {data.hex()} on port {port}: reference sent "
                f"{[(p, d.hex()) for p, d in self.out_ref]}, native "
                f"{[(p, d.hex()) for p, d in self.out_nat]}"
            )
        if self.ref.stats.dropped != self.nat.stats.dropped:
            return (
                f"packet {data.hex()} on port {port}: drops {self.ref.stats.dropped} "
                f"vs {self.nat.stats.dropped}"
            )
        return None

    def state_diff(self) -> list[str]:
        """How the two switches' counters, registers and direct counters differ."""
        out = []
        for name, c in self.rc.counters.items():
            n = self.nc.counters[name]
            if list(c.packets) != list(n.packets) or list(c.bytes) != list(n.bytes):
                out.append(f"counter {name} differs")
        for name, r in self.rc.registers.items():
            if list(r.values) != list(self.nc.registers[name].values):
                out.append(f"register {name} differs")
        for name, t in self.rc.tables.items():
            if not t.with_counters:
                continue
            a = sorted((repr(k), e.packet_count, e.byte_count) for k, e in t.entries.items())
            b = sorted(
                (repr(k), e.packet_count, e.byte_count)
                for k, e in self.nc.tables[name].entries.items()
            )
            if a != b:
                out.append(f"direct counters of {name} differ")
        return out

    def both(self, op: Any) -> str | None:
        """Apply a control-plane operation to both sides (op(compiled, which)); they must
        both succeed or both fail with the same error."""
        res = []
        for c in (self.rc, self.nc):
            try:
                op(c)
                res.append("ok")
            except TableError as exc:
                res.append(f"{exc.code}")
        return None if res[0] == res[1] else f"control plane: reference {res[0]}, native {res[1]}"


# ---- random table state ------------------------------------------------------------------


def observed_values(pair: PipelinePair, templates: list[bytes]) -> dict[tuple[int, int], set[int]]:
    """Field values the templates carry after parsing (table keys drawn from these hit)."""
    c = pair.rc
    seen: dict[tuple[int, int], set[int]] = {}
    for data in templates:
        p = c.new_packet()
        try:
            c.parse(p, data)
        except Exception:  # noqa: BLE001 - a template the parser rejects still fuzzes
            continue
        for hidx, fields in enumerate(p.h):
            if not p.v[hidx]:
                continue
            for fidx, v in enumerate(fields):
                if isinstance(v, int) and v >= 0:
                    seen.setdefault((hidx, fidx), set()).add(v)
    return seen


def _key_value(rnd: random.Random, pool: set[int] | None, width: int) -> int:
    """A value seen in the templates, a small one (what random action parameters mostly
    write into metadata), or any."""
    x = rnd.random()
    if pool and x < 0.6:
        return rnd.choice(sorted(pool)) & ((1 << width) - 1)
    if x < 0.9:
        return rnd.randrange(16) & ((1 << width) - 1)
    return rnd.getrandbits(width) if width else 0


def _action(rnd: random.Random, prog: Program, aids: list[int]) -> int:
    """An action of the table, one with parameters (forwarding, setting) more often than not:
    random tables full of drops would test little."""
    with_params = [a for a in aids if prog.actions[a].params]
    if with_params and rnd.random() < 0.8:
        return rnd.choice(with_params)
    return rnd.choice(aids)


def _params(rnd: random.Random, prog: Program, aid: int) -> tuple[int, ...]:
    out = []
    for _, w in prog.actions[aid].params:
        out.append(rnd.randrange(16) & ((1 << w) - 1) if rnd.random() < 0.6 else rnd.getrandbits(w))
    return tuple(out)


def _add_member(prof: str, mid: int, aid: int, params: tuple[int, ...], c: Any) -> None:
    c.profiles[prof].add_member(mid, ActionCall(aid, c.actions[aid], params))


def _set_group(prof: str, gid: int, members: list[tuple[int, int]], c: Any) -> None:
    c.profiles[prof].set_group(gid, members, create=True)


def _add_entry(
    table: str,
    spec: tuple[Any, ...],
    prio: int,
    aid: int,
    params: tuple[int, ...],
    member: int | None,
    group: int | None,
    c: Any,
) -> None:
    t: MatchTable = c.tables[table]
    if t.profile is not None:
        t.add(Entry(spec, prio, member=member, group=group))
    else:
        t.add(Entry(spec, prio, call=ActionCall(aid, c.actions[aid], params)))


def _delete_entry(table: str, spec: tuple[Any, ...], prio: int, c: Any) -> None:
    c.tables[table].delete(spec, prio)


def _modify_entry(
    table: str, spec: tuple[Any, ...], prio: int, aid: int, params: tuple[int, ...], c: Any
) -> None:
    t: MatchTable = c.tables[table]
    t.modify(spec, prio, Entry(spec, prio, call=ActionCall(aid, c.actions[aid], params)))


def churn(pair: PipelinePair, rnd: random.Random) -> tuple[int, list[str]]:
    """One random delete or modify of an entry, on both sides, between packets:
    (writes, errors)."""
    prog = pair.program
    names = [n for n, t in pair.rc.tables.items() if t.entries and not t.immutable]
    if not names:
        return 0, []
    name = rnd.choice(names)
    t = pair.rc.tables[name]
    e = rnd.choice(list(t.entries.values()))
    if t.profile is None and rnd.random() < 0.5:
        aid = _action(rnd, prog, list(prog.tables[name]["action_ids"]))
        op = partial(_modify_entry, name, e.spec, e.priority, aid, _params(rnd, prog, aid))
    else:
        op = partial(_delete_entry, name, e.spec, e.priority)
    return 1, list(filter(None, [pair.both(op)]))


def _set_default(table: str, aid: int, params: tuple[int, ...], c: Any) -> None:
    c.tables[table].set_default(ActionCall(aid, c.actions[aid], params))


def random_tables(
    pair: PipelinePair, rnd: random.Random, seen: dict[tuple[int, int], set[int]], per_table: int
) -> tuple[int, list[str]]:
    """Random entries, members, groups and defaults written to both sides; (writes, errors)."""
    prog = pair.program
    writes, errs = 0, []
    for name, tj in prog.tables.items():
        t_ref = pair.rc.tables[name]
        if t_ref.immutable or (not tj["key"] and tj.get("default_entry", {}).get("action_const")):
            continue
        aids = list(tj["action_ids"])
        prof_name = tj.get("action_profile") if tj.get("type", "simple") != "simple" else None
        members: list[int] = []
        groups: list[int] = []
        if prof_name:
            prof = prog.action_profiles[prof_name]
            for mid in range(1, rnd.randint(1, 5) + 1):
                aid = _action(rnd, prog, aids)
                op = partial(_add_member, prof_name, mid, aid, _params(rnd, prog, aid))
                errs += filter(None, [pair.both(op)])
                writes += 1
                members.append(mid)
            if prof.get("selector"):
                for gid in range(1, rnd.randint(1, 3) + 1):
                    chosen = rnd.sample(members, rnd.randint(0, len(members)))
                    spec = [(m, rnd.randint(1, 4)) for m in chosen]
                    op = partial(_set_group, prof_name, gid, spec)
                    errs += filter(None, [pair.both(op)])
                    writes += 1
                    groups.append(gid)
        for _ in range(rnd.randint(per_table // 2, per_table)):
            spec_l: list[Any] = []
            for k, kind, w in zip(tj["key"], t_ref.kinds, t_ref.widths, strict=True):
                pool = None
                if kind != "valid":
                    pool = seen.get(prog.field_ref(k["target"][0], k["target"][1]))
                v = _key_value(rnd, pool, w)
                if kind in ("exact", "valid"):
                    spec_l.append(v if kind == "exact" else rnd.randint(0, 1))
                elif kind == "lpm":
                    plen = rnd.randint(0, w)
                    spec_l.append((v & (((1 << plen) - 1) << (w - plen)), plen))
                else:
                    mask = rnd.choice([0, (1 << w) - 1, rnd.getrandbits(w)])
                    if kind == "optional":
                        mask = rnd.choice([0, (1 << w) - 1])
                    spec_l.append((v & mask, mask))
            prio = rnd.randint(1, 20) if t_ref.needs_priority else 0
            aid = _action(rnd, prog, aids)
            params = _params(rnd, prog, aid)
            use_group = bool(groups) and rnd.random() < 0.5
            ref_id = (
                rnd.choice(groups if use_group else members)
                if prof_name and (groups or members)
                else None
            )

            member, group = (None, ref_id) if use_group else (ref_id, None)
            op = partial(_add_entry, name, tuple(spec_l), prio, aid, params, member, group)
            errs += filter(None, [pair.both(op)])
            writes += 1
        if not t_ref.default_const and not prof_name and rnd.random() < 0.5:
            aid = _action(rnd, prog, aids)
            op = partial(_set_default, name, aid, _params(rnd, prog, aid))
            errs += filter(None, [pair.both(op)])
            writes += 1
    return writes, errs


# ---- packets -----------------------------------------------------------------------------


def mutate(rnd: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rnd.randint(0, 3)):
        what = rnd.random()
        if what < 0.4 and b:
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
        elif what < 0.7 and b:
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        elif what < 0.85:
            del b[rnd.randint(0, len(b)) :]
        else:
            b += rnd.randbytes(rnd.randint(1, 40))
    return bytes(b)


def stf_packets(stf: Path) -> list[bytes]:
    out = []
    for ln in stf.read_text().splitlines():
        toks = ln.split("#", 1)[0].split()
        if len(toks) > 2 and toks[0].lower() == "packet":
            try:
                out.append(bytes.fromhex("".join(toks[2:])))
            except ValueError:
                continue
    return out


def xingmai_packets() -> list[bytes]:
    """Frames the xingmai program handles: IPv4 UDP/TCP, RoCEv2 with and without INT (a few
    hops), IPv4 options, ARP, and a non-IP frame."""
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.layers.l2 import ARP, Ether

    from testbed.packets.int_md import int_packet

    out = [
        bytes(
            Ether() / IP(src="10.0.0.1", dst="10.0.1.2") / UDP(sport=1234, dport=5000) / (b"x" * 40)
        ),
        bytes(Ether() / IP(src="10.0.1.2", dst="10.0.0.1", tos=0x02) / TCP(sport=80, dport=4000)),
        bytes(Ether() / IP(src="10.0.0.3", dst="10.0.2.9", options=b"\x01\x01\x01\x00") / UDP()),
        bytes(Ether() / ARP()),
        bytes(Ether(type=0x88B5) / (b"\x00" * 50)),
    ]
    for hops in (0, 1, 3):
        pkt = int_packet(
            src_ip="10.0.0.1",
            dst_ip="10.0.1.2",
            sport=49152 + hops,
            bitmap=0x8000,  # node id only
            hops=[{"node_id": i + 1} for i in range(hops)],
            payload=b"\x00" * 12 + b"y" * 32,
        )
        out.append(bytes(pkt))
    return out


def fuzz_program(json_path: Path, templates: list[bytes], packets: int, seed: int) -> Report:
    """Random table state, then `packets` random and mutated packets; every divergence."""
    rnd = random.Random(seed)
    rep = Report(json_path.stem)
    t0 = time.monotonic()
    pair = PipelinePair(json_path.read_bytes(), seed)
    seen = observed_values(pair, templates)
    writes, errs = random_tables(pair, rnd, seen, per_table=24)
    rep.writes = writes
    rep.divergences += errs
    for i in range(packets):
        if i % 50 == 49:  # the control plane writes while packets flow
            w, errs = churn(pair, rnd)
            rep.writes += w
            rep.divergences += errs
            if i % 500 == 499:
                w, errs = random_tables(pair, rnd, seen, per_table=2)
                rep.writes += w
                rep.divergences += errs
        if templates and rnd.random() < 0.85:
            data = mutate(rnd, rnd.choice(templates))
        else:
            data = rnd.randbytes(rnd.randint(0, 120))
        diff = pair.packet(rnd.randrange(8), data, rnd.randint(0, 50_000))
        rep.packets += 1
        rep.outputs += len(pair.out_ref)
        if diff:
            rep.divergences.append(diff)
            if len(rep.divergences) >= 10:
                break
    rep.divergences += pair.state_diff()
    rep.drops = dict(pair.ref.drop_counts())
    rep.seconds = time.monotonic() - t0
    return rep


def default_programs() -> list[tuple[Path, list[bytes]]]:
    progs = [(BMV2_JSON, xingmai_packets())]
    for name in CONFORMANCE_PROGRAMS:
        j, stf = CORPUS / f"{name}.json", CORPUS / f"{name}.stf"
        if j.exists() and stf.exists():
            progs.append((j, stf_packets(stf)))
    for name in OWN_PROGRAMS:
        j, stf = (
            REPO / "tests" / "p4" / "build" / f"{name}.json",
            REPO / "tests" / "p4" / f"{name}.stf",
        )
        progs.append((j, stf_packets(stf) if stf.exists() else []))
    generic = xingmai_packets()
    return [(j, t + generic) for j, t in progs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.native", description=__doc__)
    ap.add_argument("--packets", type=int, default=100_000, help="packets per program")
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--program", type=Path, action="append", help="bmv2 JSON (default: a set)")
    ap.add_argument("--out", type=Path, help="write the reports as JSON here")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)  # aborted packets are logged per packet
    if args.program:
        generic = xingmai_packets()
        progs = [
            (
                p,
                (stf_packets(p.with_suffix(".stf")) if p.with_suffix(".stf").exists() else [])
                + generic,
            )
            for p in args.program
        ]
    else:
        progs = default_programs()
    clean = True
    reports = []
    for path, templates in progs:
        try:
            rep = fuzz_program(path, templates, args.packets, args.seed)
        except NotNative as exc:
            print(f"{path.stem}: not native ({exc})", flush=True)
            continue
        reports.append(rep)
        clean &= not rep.divergences
        print(
            f"{rep.program}: {rep.packets} packets, {rep.outputs} out, {rep.writes} writes, "
            f"{len(rep.divergences)} divergences, {rep.seconds:.0f} s; drops {rep.drops}",
            flush=True,
        )
        for d in rep.divergences:
            print("  " + d[:400])
    if args.out:
        args.out.write_text(json.dumps([r.__dict__ for r in reports], indent=1) + "\n")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
