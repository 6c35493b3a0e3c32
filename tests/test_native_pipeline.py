"""The native switch pipeline (testbed/switch/native/) against the Python reference.

- every conformance STF case and every tests/p4 case the generator supports runs on both
  pipelines: identical output packets and ports, counters, registers, direct counters, drops
  and verdict; the cases it does not support are skipped naming the construct, and their
  count is held to a floor;
- a differential fuzzer (tests/fuzz/native.py): random table state and random and mutated
  packets through both pipelines on the xingmai program and several others, byte-identical;
- the generated C compiles with -Wall -Wextra -Werror (every build does) and prints nothing;
- where the native pipeline cannot run (no compiler, an unsupported construct) the switch says
  why in one line and runs the reference.
"""

from __future__ import annotations

import collections
import json
import logging
import random
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from testbed.p4files import BMV2_JSON
from testbed.switch import hashes
from testbed.switch.native.build import CFLAGS, compiler
from testbed.switch.native.cgen import C_HASHES, Unsupported, generate
from testbed.switch.program import Program
from testbed.switch.stf import StfRunner
from testbed.switch.tables import ActionCall, Entry, TableError
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import StdMeta, V1Switch
from tests.fuzz.native import (
    CONFORMANCE_PROGRAMS,
    CORPUS,
    OWN_PROGRAMS,
    fuzz_program,
    stf_packets,
    xingmai_packets,
)

REPO = Path(__file__).resolve().parents[1]
OWN = REPO / "tests" / "p4"
# How many of the corpus's programs the native pipeline runs (of 146): raise it as the
# generator learns constructs; a drop below it is a regression.
MIN_SUPPORTED_CORPUS = 122


def _corpus_cases() -> list[tuple[str, Path, Path]]:
    if not (CORPUS / "index.json").exists():
        return []
    names = [c["name"] for c in json.loads((CORPUS / "index.json").read_text())["cases"]]
    return [(n, CORPUS / f"{n}.json", CORPUS / f"{n}.stf") for n in sorted(names)]


def _own_cases() -> list[tuple[str, Path, Path]]:
    return [(p.stem, OWN / "build" / f"{p.stem}.json", p) for p in sorted(OWN.glob("*.stf"))]


CASES = {f"corpus/{n}": (j, s) for n, j, s in _corpus_cases()} | {
    f"own/{n}": (j, s) for n, j, s in _own_cases()
}


@cache
def blocker(json_path: Path) -> str | None:
    """Why the generator cannot run a program (None: it can)."""
    prog = Program(json.loads(json_path.read_bytes()))
    StdMeta(prog)
    try:
        generate(prog)
    except Unsupported as exc:
        return str(exc)
    return None


def _state(r: StfRunner) -> dict[str, Any]:
    c = r.compiled
    return {
        "outputs": {p: list(v) for p, v in sorted(r.outputs.items())},
        "counters": {n: (list(a.packets), list(a.bytes)) for n, a in c.counters.items()},
        "registers": {n: list(a.values) for n, a in c.registers.items()},
        "direct": {
            n: sorted((repr(k), e.packet_count, e.byte_count) for k, e in t.entries.items())
            for n, t in c.tables.items()
            if t.with_counters
        },
        "drops": r.switch.drop_counts(),
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_stf_case_identical_on_both_pipelines(case: str) -> None:
    json_path, stf_path = CASES[case]
    if not json_path.exists():
        pytest.skip(f"{json_path.name} is not in the corpus")
    why = blocker(json_path)
    if why:
        pytest.skip(f"not native: {why}")
    logging.disable(logging.WARNING)
    try:
        runs = {}
        for pipeline in ("reference", "native"):
            r = StfRunner(json_path.read_bytes(), pipeline)
            assert r.switch.pipeline_in_use == pipeline, r.switch.native_reason
            res = r.run(stf_path.read_text())
            runs[pipeline] = (res.passed, _state(r))
    finally:
        logging.disable(logging.NOTSET)
    ref, nat = runs["reference"], runs["native"]
    for key in ref[1]:
        assert ref[1][key] == nat[1][key], f"{key} differ"
    assert ref[0] == nat[0], "the STF verdicts differ"


def _construct(why: str) -> str:
    """The kind of construct an Unsupported message names (its objects' names left out)."""
    for pattern, kind in (
        (r"wider than 64", "fields wider than 64 bits"),
        (r"^signed field", "signed fields"),
        (r"^header stacks", "header stacks"),
        (r"^header unions", "header unions"),
        (r"^variable-length field .* in an expression", "variable-length fields in expressions"),
        (r"^variable-length field beside", "variable-length fields beside other fields"),
        (r"^range match", "range matches"),
        (r"^meter", "meters"),
        (r"may lie outside", "a value the C cannot bound (a right shift, an index)"),
    ):
        if re.search(pattern, why):
            return kind
    return why.split(",")[0]


@pytest.mark.skipif(not (CORPUS / "index.json").exists(), reason="no conformance corpus")
def test_native_support_over_the_corpus(capsys: pytest.CaptureFixture[str]) -> None:
    """How many corpus programs run natively, and what blocks the others (printed)."""
    blocked: collections.Counter[str] = collections.Counter()
    supported = 0
    for _, json_path, _ in _corpus_cases():
        if not json_path.exists():
            blocked["(program missing from the corpus)"] += 1
            continue
        why = blocker(json_path)
        if why is None:
            supported += 1
        else:
            blocked[_construct(why)] += 1
    with capsys.disabled():
        print(
            f"\nnative pipeline: {supported} of {len(_corpus_cases())} corpus programs; blocked by:"
        )
        for what, n in blocked.most_common():
            print(f"  {n:3d}  {what}")
    assert supported >= MIN_SUPPORTED_CORPUS


def _fuzz_targets() -> list[tuple[str, Path, list[bytes], int]]:
    generic = xingmai_packets()
    out = [("xingmai", BMV2_JSON, generic, 1000)]
    for name in CONFORMANCE_PROGRAMS:
        stf = CORPUS / f"{name}.stf"  # the corpus is outside a user's checkout: skipped then
        out.append((name, CORPUS / f"{name}.json", stf_packets(stf) if stf.exists() else [], 300))
    for name in OWN_PROGRAMS[2:]:
        out.append((name, OWN / "build" / f"{name}.json", [], 300))
    return out


@pytest.mark.parametrize("target", _fuzz_targets(), ids=lambda t: t[0])
def test_fuzzed_packets_identical_on_both_pipelines(
    target: tuple[str, Path, list[bytes], int],
) -> None:
    name, json_path, templates, packets = target
    if not json_path.exists():
        pytest.skip(f"{json_path} not found")
    logging.disable(logging.WARNING)
    try:
        rep = fuzz_program(json_path, templates + xingmai_packets(), packets, seed=29)
    finally:
        logging.disable(logging.NOTSET)
    assert rep.packets == packets
    assert not rep.divergences, "\n".join(rep.divergences)
    if name == "xingmai":
        # the test means something only if packets go through both pipelines' egress
        assert rep.outputs > packets // 10, rep.drops


def test_generated_c_compiles_without_a_warning(tmp_path: Path) -> None:
    prog = Program(json.loads(BMV2_JSON.read_bytes()))
    StdMeta(prog)
    src = tmp_path / "xingmai.c"
    src.write_text(generate(prog).source)
    res = subprocess.run(
        [compiler(), *CFLAGS, "-o", str(tmp_path / "x.so"), str(src)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0 and not res.stderr, res.stderr


def test_the_xingmai_program_runs_native() -> None:
    sw = V1Switch(clock=Clock(virtual=True), pipeline="native")
    sw.load(BMV2_JSON.read_bytes())
    assert sw.pipeline_in_use == "native", sw.native_reason


def test_a_forwarded_packet_crosses_into_c_once_each_way() -> None:
    """On the native pipeline, v1model's common path and the native traffic manager are one
    C call at arrival (ingress and enqueue: xm_receive_enqueue) and one per round of
    departures (egress and deparser: xm_depart_batch, after the dequeue's call): the
    program's stages are not called one by one, the Python traffic manager not at all."""
    from testbed.benchmarks.switch import xingmai_frames, xingmai_switch
    from testbed.switch.native.tm import NativeTrafficManager

    sw = xingmai_switch("native")
    c = sw.compiled
    assert c is not None and c.native is not None
    assert isinstance(sw.tm, NativeTrafficManager)
    calls = {"receive": 0, "depart": 0, "stage": 0, "python_tm": 0}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kw: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kw)

        return wrapper

    rt = c.native
    rt.receive_enqueue = counted("receive", rt.receive_enqueue)
    rt.depart_batch = counted("depart", rt.depart_batch)
    for stage in ("parse", "verify_checksums", "ingress", "egress", "update_checksums"):
        setattr(c, stage, counted("stage", getattr(c, stage)))
    for method in ("enqueue", "dequeue_ready"):
        setattr(sw.tm, method, counted("python_tm", getattr(sw.tm, method)))
    sent: list[bytes] = []
    sw.transmit = lambda port, data: sent.append(data)
    frames = xingmai_frames(8)
    for f in frames:
        sw.clock.advance(1000)
        sw.receive(1, f)
        sw.service()
    assert len(sent) == len(frames)
    assert calls == {"receive": len(frames), "depart": len(frames), "stage": 0, "python_tm": 0}


def test_no_compiler_falls_back_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing cached: it must build
    monkeypatch.setenv("CC", "no-such-cc")
    sw = V1Switch(clock=Clock(virtual=True), pipeline="native")
    with caplog.at_level(logging.WARNING, logger="xingmai.switch"):
        sw.load(BMV2_JSON.read_bytes())
    assert sw.pipeline_in_use == "reference"
    assert "no C compiler" in sw.native_reason and "\n" not in sw.native_reason
    assert any("running the reference" in r.getMessage() for r in caplog.records)


def test_unsupported_construct_falls_back_naming_it() -> None:
    sw = V1Switch(clock=Clock(virtual=True), pipeline="native")
    sw.load((OWN / "build" / "switch_features.json").read_bytes())  # has a meter
    assert sw.pipeline_in_use == "reference"
    assert sw.native_reason == "meter SwitchIngress.port_meter"


def test_cache_key_follows_the_program(tmp_path: Path) -> None:
    """The build is cached by the C's hash: the same program reuses it, another does not."""
    progs = []
    for path in (BMV2_JSON, OWN / "build" / "bench_l3.json"):
        prog = Program(json.loads(path.read_bytes()))
        StdMeta(prog)
        progs.append(generate(prog))
    assert progs[0].digest != progs[1].digest
    prog = Program(json.loads(BMV2_JSON.read_bytes()))
    StdMeta(prog)
    assert generate(prog).digest == progs[0].digest


def test_hash_algorithms_match_the_reference() -> None:
    """The C of every hash the generator implements, against testbed/switch/hashes.py, on
    random and edge-case byte strings (all zeros, all ones: a checksum's fold)."""
    sw = V1Switch(clock=Clock(virtual=True), pipeline="native")
    sw.load(BMV2_JSON.read_bytes())
    assert sw.compiled is not None
    rt = sw.compiled.ingress.__self__  # type: ignore[attr-defined]
    rnd = random.Random(29)
    # (three 0xffff words and a 2: the ones' complement sum needs a second fold)
    inputs = [b"", b"\x00", b"\xff", b"\xff" * 20, b"\x00" * 20, b"\xff\xff" * 3 + b"\x00\x02"]
    inputs += [rnd.randbytes(rnd.randint(0, 600)) for _ in range(600)]
    for algo in C_HASHES:
        ref = hashes.get_hash(algo)
        for data in inputs:
            assert rt.hash(algo, data) == ref(data), (algo, data.hex())


def test_random_extern_draws_as_python_random() -> None:
    """The program's random extern draws in C from the pipeline's own Mersenne Twister
    (NativeRandom): for string, bytes and int seeds, each draw of the C (`xm_random_int`,
    what the generated code calls) and each of the Python methods on it (randint,
    getrandbits, random, the state's round trip) is random.Random's, over ranges from one
    value to the whole 64 bits, where a 65-bit draw is needed."""
    sw = V1Switch(clock=Clock(virtual=True), pipeline="native")
    sw.load(BMV2_JSON.read_bytes())
    assert sw.compiled is not None
    rng = sw.compiled.random
    rt = sw.compiled.ingress.__self__  # type: ignore[attr-defined]
    ref = random.Random()
    ranges = [(0, 0), (0, 1), (3, 9), (0, 1023), (0, 2**32 - 1), (0, 2**32), (5, 2**33 + 17)]
    ranges += [(0, 2**63), (0, 2**64 - 1), (2**64 - 2, 2**64 - 1)]
    for seed in (0, 7, 2**70 + 3, "a seed", b"bytes"):
        rng.seed(seed)
        ref.seed(seed)
        for lo, hi in ranges:
            for _ in range(200):
                assert rt.lib.xm_random_int(rt.state, lo, hi) == ref.randint(lo, hi)
                assert rng.randint(lo, hi) == ref.randint(lo, hi)
        assert [rng.getrandbits(k) for k in range(100)] == [ref.getrandbits(k) for k in range(100)]
        assert rng.random() == ref.random()
        assert rng.getstate() == ref.getstate()
        ref.setstate(rng.getstate())
        assert [rng.random() for _ in range(700)] == [ref.random() for _ in range(700)]
    with pytest.raises(ValueError):
        rng.setstate((2, (0,) * 625, None))


def test_the_switch_command_takes_the_pipeline() -> None:
    from testbed.switch.main import parse_args

    assert parse_args(["x.json"]).pipeline == "native"  # the default
    assert parse_args(["x.json", "--pipeline", "reference"]).pipeline == "reference"
    with pytest.raises(SystemExit):
        parse_args(["x.json", "--pipeline", "fast"])


def _field(h: str, f: str) -> dict[str, Any]:
    return {"type": "field", "value": [h, f]}


def _op(op: str, left: Any, right: Any) -> dict[str, Any]:
    return {"type": "expression", "value": {"op": op, "left": left, "right": right}}


def _hex(n: int) -> dict[str, Any]:
    return {"type": "hexstr", "value": hex(n), "bitwidth": 8}


def _l3_with(value: dict[str, Any]) -> bytes:
    """bench_l3 whose set_nexthop also sets ipv4.diffserv = value."""
    doc = json.loads((OWN / "build" / "bench_l3.json").read_bytes())
    action = next(a for a in doc["actions"] if a["name"].endswith("set_nexthop"))
    action["primitives"].append({"op": "assign", "parameters": [_field("ipv4", "diffserv"), value]})
    return json.dumps(doc).encode()


TTL, PROTO, DST = _field("ipv4", "ttl"), _field("ipv4", "protocol"), _field("ipv4", "dst_addr")
# Expressions whose true value the C could not know: the generator must refuse them.
UNSAFE = {
    "a comparison of a value past 64 bits": _op(
        "b2d", None, _op(">", _op("<<", DST, _hex(40)), _hex(5))
    ),
    "a shift of a product past 64 bits": _op(
        ">>", _op("*", DST, _op("<<", DST, _hex(40))), _hex(60)
    ),
    "a division of a complement": _op("/", _op("~", None, DST), _hex(3)),
}
# Their masked (or provably small) counterparts, which it must compile to the same result.
SAFE = {
    "a masked difference compared": _op(
        "b2d", None, _op(">", _op("&", _op("-", TTL, PROTO), _hex(0xFF)), _hex(5))
    ),
    "a saturating difference": _op("usat_cast", _op("-", PROTO, TTL), _hex(8)),
    "a signed comparison": _op("b2d", None, _op("<", _op("-", PROTO, TTL), _hex(3))),
    "a masked product shifted": _op(">>", _op("&", _op("*", DST, DST), _hex(0xFFFF)), _hex(3)),
    # int<8> arithmetic: the reference's values are negative, the C's bits sign-extended
    "a two's complement value compared": _op(
        "b2d", None, _op("<", _op("two_comp_mod", TTL, _hex(8)), _hex(0))
    ),
    "a signed saturating cast": _op("sat_cast", _op("-", PROTO, TTL), _hex(8)),
}


@pytest.mark.parametrize("name", sorted(UNSAFE))
def test_an_expression_whose_value_may_not_fit_is_refused(name: str) -> None:
    prog = Program(json.loads(_l3_with(UNSAFE[name])))
    StdMeta(prog)
    with pytest.raises(Unsupported, match="action BenchIngress.set_nexthop"):
        generate(prog)


@pytest.mark.parametrize("name", sorted(SAFE))
def test_a_bounded_expression_runs_as_the_reference(name: str) -> None:
    frame_of = [
        bytes.fromhex("0000000000010200000000010800")
        + bytes([0x45, 0, 0, 46, 0, 0, 0, 0, ttl, proto, 0, 0, 10, 0, 1, 1, 10, 0, 2, 1])
        + bytes(26)
        for ttl, proto in ((64, 17), (3, 200), (17, 17), (0, 255), (255, 0), (6, 1))
    ]
    outs = []
    for pipeline in ("reference", "native"):
        r = StfRunner(_l3_with(SAFE[name]), pipeline)
        assert r.switch.pipeline_in_use == pipeline, r.switch.native_reason
        r.command("add routes dst_addr:0x0a000200/24 set_nexthop(dmac:0x020000000002, port:2)")
        for f in frame_of:
            r.command("packet 1 " + f.hex())
        outs.append(r.outputs)
    assert outs[0] == outs[1]
    assert len(outs[0].get(2, [])) == len(frame_of)


@pytest.mark.parametrize("entries", [3, 40, 400])
@pytest.mark.parametrize(
    "table",
    [
        "XingmaiIngress.acl.acl",
        "XingmaiIngress.routing.ipv4_routes",
        "XingmaiIngress.int_source.int_watchlist",
        "XingmaiEgress.config.port_config",
    ],
)
def test_table_lookups_find_the_reference_entry(table: str, entries: int) -> None:
    """Every lookup, scanned (few entries) or through the mask groups (many), finds the entry
    the reference finds: values and masks drawn from a few low bits so that entries overlap,
    priorities that tie, every key of that small space tried."""
    rnd = random.Random(entries)
    switches = []
    for pipeline in ("reference", "native"):
        sw = V1Switch(clock=Clock(virtual=True), pipeline=pipeline)
        sw.load(BMV2_JSON.read_bytes())
        assert sw.compiled is not None
        switches.append(sw.compiled)
    ref, nat = (c.tables[table] for c in switches)
    aid = next(iter(switches[0].program.tables[table]["action_ids"]))
    nparams = len(switches[0].program.actions[aid].params)

    def small(w: int) -> int:
        return rnd.randrange(4) & ((1 << w) - 1)

    for _ in range(entries):
        spec: list[Any] = []
        for kind, w in zip(ref.kinds, ref.widths, strict=True):
            if kind == "exact":
                spec.append(small(w))
            elif kind == "lpm":
                plen = rnd.choice([0, w - 2, w - 1, w])
                spec.append((small(w) & (((1 << plen) - 1) << (w - plen)), plen))
            else:
                mask = rnd.choice([0, 1, 2, 3, (1 << w) - 1]) & ((1 << w) - 1)
                spec.append((small(w) & mask, mask))
        prio = rnd.randint(1, 5) if ref.needs_priority else 0
        for c in switches:
            call = ActionCall(aid, c.actions[aid], (0,) * nparams)
            try:
                c.tables[table].add(Entry(tuple(spec), prio, call=call))
            except TableError:
                pass  # the same entry twice: both refuse it
    assert len(ref.entries) == len(nat.entries)
    keys = [()]
    for w in ref.widths:
        keys = [(*k, v) for k in keys for v in range(min(4, 1 << w))]
    for key in keys:
        want, got = ref.lookup(key), nat.native_lookup(key)  # type: ignore[attr-defined]
        assert (want and (want.spec, want.priority)) == (got and (got.spec, got.priority)), key
