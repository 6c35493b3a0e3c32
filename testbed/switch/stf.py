"""Run a p4c STF packet test against the built-in switch, in process, on virtual ports.

    python -m testbed.switch.stf PROGRAM.json TEST.stf [--json] [-v]

Semantics follow p4c's `backends/bmv2/bmv2stf.py` (the reference runner for bmv2): `packet`
injects, `expect` checks per port in order (`*` any nibble, trailing `$` exact length), only
ports named in `packet`/`expect` are observed, table names and key names may be suffixes, a
ternary entry's STF priority p becomes bmv2 priority 10000 - p (larger p wins). Beyond
bmv2stf, `check_counter` and register commands are executed and checked. Exit status 0 means
every expectation held.
"""

from __future__ import annotations

import argparse
import json
import operator
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.switch.program import LoadError
from testbed.switch.tables import ActionCall, Entry, MatchTable, TableError
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import DEFAULT_PIPELINE, PIPELINES, CloneSession, V1Switch


class StfError(Exception):
    """The STF file cannot be run as written (bad syntax, unknown table, ...)."""


@dataclass
class Result:
    passed: bool
    messages: list[str] = field(default_factory=list)
    packets_in: int = 0
    packets_out: int = 0
    elapsed_s: float = 0.0


def _int(tok: str) -> int:
    try:
        return int(tok, 0)
    except ValueError:
        raise StfError(f"bad number {tok!r}") from None


def _strip_comment(line: str) -> str:
    return line.split("#", 1)[0].strip()


class StfRunner:
    def __init__(
        self, program_json: dict[str, Any] | bytes | str, pipeline: str = DEFAULT_PIPELINE
    ):
        self.switch = V1Switch(clock=Clock(virtual=True), pipeline=pipeline)
        self.switch.load(program_json)
        assert self.switch.compiled is not None
        self.compiled = self.switch.compiled
        self.prog = self.compiled.program
        self.outputs: dict[int, list[bytes]] = {}
        self.switch.transmit = lambda port, data: self.outputs.setdefault(port, []).append(data)
        self.expected: dict[int, list[str]] = {}
        self.expect_any: set[int] = set()
        self.interfaces: set[int] = set()
        self.mc_nodes: list[tuple[int, list[int]]] = []
        self.messages: list[str] = []
        self.failed = False
        self.packets_in = 0

    # ---- commands -------------------------------------------------------------------------

    def run(self, text: str) -> Result:
        t0 = time.monotonic()
        lines = [_strip_comment(ln) for ln in text.splitlines()]
        # Ports are observed when they appear in any packet/expect line (bmv2stf opens them
        # all before the switch starts).
        for ln in lines:
            toks = ln.split()
            if len(toks) >= 2 and toks[0].lower() in ("packet", "expect") and toks[1].isdigit():
                self.interfaces.add(int(toks[1]))
        for n, ln in enumerate(lines, 1):
            if not ln:
                continue
            try:
                self.command(ln)
            except (StfError, TableError, LoadError, IndexError, KeyError, ValueError) as exc:
                self.fail(f"line {n}: {ln!r}: {exc}")
        self.drain()
        self.check_outputs()
        return Result(
            not self.failed,
            self.messages,
            self.packets_in,
            sum(len(v) for v in self.outputs.values()),
            time.monotonic() - t0,
        )

    def fail(self, msg: str) -> None:
        self.failed = True
        self.messages.append(msg)

    def drain(self) -> None:
        while self.switch.service():
            pass

    def command(self, ln: str) -> None:
        toks = ln.split()
        cmd = toks[0].lower()
        if cmd == "packet":
            port = _int(toks[1])
            data = bytes.fromhex("".join(toks[2:]))
            self.packets_in += 1
            self.switch.receive(port, data)
            self.drain()
        elif cmd == "expect":
            port = _int(toks[1])
            pattern = "".join(toks[2:])
            if pattern:
                self.expected.setdefault(port, []).append(pattern)
            else:
                self.expect_any.add(port)
        elif cmd == "no_packet":
            pass
        elif cmd == "wait":
            self.drain()
        elif cmd == "add":
            self.add(ln)
        elif cmd == "setdefault":
            self.setdefault(ln)
        elif cmd == "remove":
            for t in self.compiled.tables.values():
                if not t.immutable:
                    t.clear()
        elif cmd in ("mirroring_add", "mirroring_add_mc"):
            sid, target = _int(toks[1]), _int(toks[2])
            session = self.switch.clone_sessions.setdefault(sid, CloneSession())
            if cmd == "mirroring_add":
                session.port = target
            else:
                session.mgid = target
        elif cmd == "mirroring_delete":
            self.switch.clone_sessions.pop(_int(toks[1]), None)
        elif cmd == "mc_mgrp_create":
            self.switch.mcast_groups.setdefault(_int(toks[1]), [])
        elif cmd == "mc_node_create":
            self.mc_nodes.append((_int(toks[1]), [_int(t) for t in toks[2:]]))
        elif cmd == "mc_node_update":
            h = _int(toks[1])
            self.mc_nodes[h] = (self.mc_nodes[h][0], [_int(t) for t in toks[2:]])
        elif cmd == "mc_node_associate":
            grp, handle = _int(toks[1]), _int(toks[2])
            rid, ports = self.mc_nodes[handle]
            self.switch.mcast_groups.setdefault(grp, []).extend((p, rid) for p in ports)
        elif cmd == "register_write":
            self.register(toks[1]).write(_int(toks[2]), _int(toks[3]))
        elif cmd == "register_reset":
            self.register(toks[1]).reset()
        elif cmd == "counter_write":
            self.counter(toks[1]).write(_int(toks[2]), _int(toks[3]), _int(toks[4]))
        elif cmd in ("register_read", "counter_read", "mirroring_get", "meter_get_rates"):
            pass  # reads print in simple_switch_CLI and change nothing
        elif cmd in ("meter_set_rates", "meter_array_set_rates"):
            self.meter_rates(cmd, toks)
        elif cmd == "check_counter":
            self.check_counter(ln)
        else:
            raise StfError(f"unknown STF command {cmd!r}")

    def _find(self, objs: dict[str, Any], name: str, what: str) -> Any:
        if name in objs:
            return objs[name]
        hits = [o for n, o in objs.items() if n.endswith("." + name) or n.endswith(name)]
        if len(hits) != 1:
            raise StfError(f"{'ambiguous' if hits else 'unknown'} {what} {name!r}")
        return hits[0]

    def register(self, name: str) -> Any:
        return self._find(self.compiled.registers, name, "register")

    def counter(self, name: str) -> Any:
        return self._find(self.compiled.counters, name, "counter")

    def table(self, name: str) -> tuple[MatchTable, dict[str, Any]]:
        tj = self.prog.find_table(name)
        return self.compiled.tables[tj["name"]], tj

    def action_call(self, tj: dict[str, Any], text: str) -> ActionCall:
        m = re.fullmatch(r"\s*([\w.$\[\]]+)\s*\((.*)\)\s*", text)
        if not m:
            raise StfError(f"bad action call {text!r}")
        aname, argtext = m.group(1), m.group(2)
        candidates = [self.prog.actions[i] for i in tj["action_ids"]]
        action = next((a for a in candidates if a.name == aname), None)
        if action is None:
            hits = [a for a in candidates if a.name.endswith(aname)]
            if len(hits) != 1:
                raise StfError(f"table {tj['name']}: no unique action {aname!r}")
            action = hits[0]
        args: dict[str, int] = {}
        for part in filter(None, (x.strip() for x in argtext.split(","))):
            k, _, v = part.partition(":")
            args[k.strip()] = _int(v.strip())
        params = []
        for pname, _w in action.params:
            if pname not in args:
                raise StfError(f"action {action.name}: missing argument {pname!r}")
            params.append(args.pop(pname))
        if args:
            raise StfError(f"action {action.name}: unexpected arguments {sorted(args)}")
        return ActionCall(action.id, self.compiled.actions[action.id], tuple(params))

    def _key_names(self, tj: dict[str, Any]) -> list[str]:
        names = []
        for k in tj["key"]:
            if "name" in k:
                names.append(k["name"])
            elif isinstance(k["target"], list):
                names.append(".".join(k["target"]))
            else:
                names.append(k["target"])
        return names

    def _resolve_key(self, names: list[str], key: str) -> int:
        m = re.fullmatch(r"(.*)\$([0-9]+)(.*)", key)
        if m:
            key = f"{m.group(1)}[{m.group(2)}]{m.group(3)}"
        candidates = [key, key + "$", key + ".$valid$"]
        if key.endswith(".valid"):
            candidates.append(key[:-5] + "$valid$")
        for c in candidates:
            if c in names:
                return names.index(c)
        for i, n in enumerate(names):
            if n.endswith("." + key) or n.endswith("." + key + "$"):
                return i
            if key == "valid" and n.endswith(".$valid$"):
                return i
        if key == "valid" and "$valid$" in names:
            return names.index("$valid$")
        raise StfError(f"unknown key field {key!r} (table keys: {names})")

    @staticmethod
    def _ternary(value: str) -> tuple[int, int]:
        digit_bits = {"0x": 4, "0b": 1, "0o": 3}.get(value[:2].lower())
        if digit_bits is None:
            raise StfError(f"decimal value {value} not supported for a ternary key")
        digits = value[2:]
        full = (1 << digit_bits) - 1
        v = m = 0
        for d in digits:
            v <<= digit_bits
            m <<= digit_bits
            if d != "*":
                v |= int(d, 16 if digit_bits == 4 else 2 if digit_bits == 1 else 8)
                m |= full
        return v & m, m

    @staticmethod
    def _lpm(value: str, width: int) -> tuple[int, int]:
        if "/" in value:
            addr, length = value.split("/")
            return _int(addr), _int(length)
        prefix = value[:2].lower()
        bits = {"0x": 4, "0b": 1, "0o": 3}.get(prefix)
        if bits is None:  # decimal: as many bits as its hex digits (bmv2stf's rule)
            return int(value), len(format(int(value), "x")) * 4
        digits = value[2:]
        return _int(prefix + digits.replace("*", "0")), (len(digits) - digits.count("*")) * bits

    def add(self, ln: str) -> None:
        m = re.fullmatch(
            r"add\s+(\S+)\s+(.*?)\s*([\w.$\[\]]+\s*\(.*\))\s*(=\s*\S+)?", ln, flags=re.IGNORECASE
        )
        if not m:
            raise StfError("bad add command")
        table, tj = self.table(m.group(1))
        toks = m.group(2).split()
        priority = None
        if toks and ":" not in toks[0]:
            priority = _int(toks.pop(0))
        names = self._key_names(tj)
        spec: list[Any] = [None] * len(names)
        for tok in toks:
            kname, _, value = tok.partition(":")
            i = self._resolve_key(names, kname)
            kind, width = table.kinds[i], table.widths[i]
            if kind in ("ternary", "optional"):
                spec[i] = (
                    self._ternary(value)
                    if "*" in value or kind == "ternary"
                    else (_int(value), (1 << width) - 1)
                )
                if kind == "optional" and spec[i][1] not in (0, (1 << width) - 1):
                    spec[i] = (spec[i][0], (1 << width) - 1)
            elif kind == "lpm":
                spec[i] = self._lpm(value, width)
            elif kind == "range":
                lo, _, hi = value.partition("->")
                spec[i] = (_int(lo), _int(hi or lo))
            else:
                spec[i] = _int(value)
        # Fields not given default as in bmv2stf: ternary 0&&&0, lpm 0/0, exact 0.
        for i, s in enumerate(spec):
            if s is None:
                kind = table.kinds[i]
                if kind == "range":
                    spec[i] = (0, (1 << table.widths[i]) - 1)
                elif kind in ("ternary", "optional", "lpm"):
                    spec[i] = (0, 0)
                else:
                    spec[i] = 0
        call = self.action_call(tj, m.group(3))
        prio = 0
        if table.needs_priority:
            # bmv2 priority 10000 - p, smaller bmv2 value wins; here larger wins.
            prio = 10000 + (priority if priority is not None else 1)
        table.add(Entry(tuple(spec), prio, call=call))

    def setdefault(self, ln: str) -> None:
        m = re.fullmatch(r"setdefault\s+(\S+)\s+(.*)", ln, flags=re.IGNORECASE)
        if not m:
            raise StfError("bad setdefault command")
        table, tj = self.table(m.group(1))
        table.set_default(self.action_call(tj, m.group(2)))

    def meter_rates(self, cmd: str, toks: list[str]) -> None:
        marray = self._find(self.compiled.meters, toks[1], "meter")
        rate_toks = toks[3:] if cmd == "meter_set_rates" else toks[2:]
        rates = []
        for rt in rate_toks:
            r, _, b = rt.partition(":")
            rates.append((float(r), _int(b)))
        targets = [marray.meter(_int(toks[2]))] if cmd == "meter_set_rates" else marray.meters
        for mt in targets:
            mt.set_rates(rates)

    def check_counter(self, ln: str) -> None:
        m = re.fullmatch(
            r"check_counter\s+([\w.$]+)\s*\(\s*(\S+?)\s*\)\s*"
            r"(?:(packets|bytes)\s*(==|!=|<=|<|>=|>)\s*(\S+))?",
            ln,
            flags=re.IGNORECASE,
        )
        if not m:
            raise StfError("bad check_counter command")
        counter = self.counter(m.group(1))
        pkts, nbytes = counter.read(_int(m.group(2)))
        kind, op, value = m.group(3) or "packets", m.group(4) or "==", m.group(5)
        actual = pkts if kind.lower() == "packets" else nbytes
        ops = {
            "==": operator.eq,
            "!=": operator.ne,
            "<=": operator.le,
            "<": operator.lt,
            ">=": operator.ge,
            ">": operator.gt,
        }
        expected = _int(value) if value is not None else 0
        if not ops[op](actual, expected):
            self.fail(
                f"check_counter {m.group(1)}({m.group(2)}): {kind} {actual} not {op} {expected}"
            )

    # ---- output comparison (as bmv2stf.checkOutputs / testutils.compare_pkt) ---------------

    def check_outputs(self) -> None:
        for port in sorted(self.interfaces):
            got = self.outputs.get(port, [])
            if port in self.expect_any:
                continue
            want = self.expected.get(port, [])
            if len(want) != len(got):
                self.fail(f"port {port}: expected {len(want)} packets, got {len(got)}")
                for i, pkt in enumerate(got):
                    self.messages.append(f"  got[{i}] {pkt.hex()}")
                continue
            for i, (w, g) in enumerate(zip(want, got, strict=True)):
                err = compare_packet(w, g)
                if err:
                    self.fail(f"port {port} packet {i}: {err}")


def compare_packet(expected: str, received: bytes) -> str | None:
    """None when `received` matches the STF expectation, else why not."""
    strict = expected.endswith("$")
    if strict:
        expected = expected[:-1]
    exp = "".join(expected.split()).upper()
    got = received.hex().upper()
    if strict and len(got) > len(exp):
        return f"too long: {len(got)} vs {len(exp)} nibbles\n  got  {got}\n  want {exp}"
    if len(got) < len(exp):
        return f"too short: {len(got)} vs {len(exp)} nibbles\n  got  {got}\n  want {exp}"
    for i, ch in enumerate(exp):
        if ch != "*" and ch != got[i]:
            return f"differs at nibble {i}\n  got  {got}\n  want {exp}"
    return None


def run_stf(json_path: Path, stf_path: Path, pipeline: str = DEFAULT_PIPELINE) -> Result:
    try:
        runner = StfRunner(json_path.read_bytes(), pipeline)
    except LoadError as exc:
        return Result(False, [f"cannot load {json_path}: {exc}"])
    return runner.run(stf_path.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run a p4c STF test on the built-in switch.")
    ap.add_argument("program", type=Path, help="bmv2 JSON (p4c-bm2-ss output)")
    ap.add_argument("stf", type=Path, help="STF packet test")
    ap.add_argument("--json", action="store_true", help="print one JSON result line")
    ap.add_argument("-v", "--verbose", action="store_true", help="print details of failures")
    ap.add_argument(
        "--pipeline", choices=PIPELINES, default=DEFAULT_PIPELINE, help="which pipeline"
    )
    args = ap.parse_args(argv)
    res = run_stf(args.program, args.stf, args.pipeline)
    if args.json:
        print(
            json.dumps(
                {
                    "program": str(args.program),
                    "stf": str(args.stf),
                    "passed": res.passed,
                    "packets_in": res.packets_in,
                    "packets_out": res.packets_out,
                    "elapsed_s": round(res.elapsed_s, 4),
                    "messages": res.messages,
                }
            )
        )
    else:
        print(
            ("PASS" if res.passed else "FAIL") + f" {args.stf.name} "
            f"({res.packets_in} in, {res.packets_out} out, {res.elapsed_s * 1000:.1f} ms)"
        )
        if not res.passed or args.verbose:
            for m in res.messages:
                print("  " + m)
    return 0 if res.passed else 1


if __name__ == "__main__":
    sys.exit(main())
