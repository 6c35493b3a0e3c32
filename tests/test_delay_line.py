"""The emulation's links in time (testbed/switch/dataplane.py's Wire and DelayLine, the
reference of the native loop's xm_line): a frame is due after its length at the link's rate
and the link's delay, going on the wire after the one ahead of it; what a line holds is
bounded; and the testbed gives every built-in switch's linked port its link's rate and delay
(the model's 80 ns or the topology's own), dilated, holding frames from hosts coming in too,
and refuses a link's own delay where the switches cannot hold frames (bmv2). The switch's loop
wakes when a frame leaves a line and takes what arrives within its slack, the same in C and
in Python."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from controller.wire.stamp import STAMP, stamp, unstamp
from testbed.emu.network import Testbed, TestbedOptions
from testbed.model import LINK_DELAY_MODEL_NS, Scaling
from testbed.p4files import BMV2_JSON
from testbed.switch.dataplane import (
    LOOP_SLACK_MAX_NS,
    DelayLine,
    Wire,
    loop_slack_ns,
    parse_wire,
    wait_plan,
)
from testbed.switch.native.hop import LINE_MAX_BYTES
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import V1Switch
from testbed.topo import End, FabricSpec, leafspine


def test_a_frame_is_due_after_its_serialization_and_the_delay() -> None:
    line = DelayLine(Wire(8e6, 1_000_000))  # 1 us a byte
    assert line.put(5_000, b"x" * 1000)
    assert line.next_due() == 5_000 + 1_000_000 + 1_000_000
    assert line.take_due(2_004_999) == []
    assert line.take_due(2_005_000) == [(2_005_000, 0, b"x" * 1000)]
    assert line.next_due() is None and line.bytes == 0


def test_a_frame_goes_on_the_wire_after_the_one_ahead_of_it() -> None:
    line = DelayLine(Wire(8e6, 500))
    line.put(0, b"a" * 1000)  # on the wire 0-1 ms
    line.put(10, b"b" * 10)  # handed over at 10 ns: on it after the first, 1 ms-1.01 ms
    line.put(2_000_000, b"c")  # the wire idle again: at once
    assert [d for d, _, _ in line.take_due(10**9)] == [1_000_500, 1_010_500, 2_001_500]


def test_what_a_line_holds_is_bounded() -> None:
    line = DelayLine(Wire(1e9, 10**9))
    frame = b"z" * 65_000
    held = sum(line.put(0, frame) for _ in range(LINE_MAX_BYTES // len(frame) + 5))
    assert held == LINE_MAX_BYTES // len(frame)
    assert line.bytes <= LINE_MAX_BYTES
    assert len(line.take_due(2 * 10**9)) == held and line.put(0, frame)


def test_the_wire_argument() -> None:
    assert parse_wire("3:20000000.0:1600000:in") == (3, Wire(2e7, 1_600_000, ingress=True))
    assert parse_wire("4:2e7:0") == (4, Wire(2e7, 0))
    assert parse_wire("5:2e7:7:stamped") == (5, Wire(2e7, 7, stamped=True))
    for bad in ("3:2e7", "3:0:5", "3:2e7:-1", "3:2e7:5:out", "x:2e7:5", "3:2e7:5:in:stamped"):
        with pytest.raises(ValueError, match="--wire"):
            parse_wire(bad)
    with pytest.raises(ValueError, match="one far end"):
        Wire(2e7, 5, ingress=True, stamped=True)


def test_a_stamped_frame_carries_its_due_and_is_held_until_then() -> None:
    """A stamped wire's sender keeps only when its line is free (`due_of`: the frame goes at
    once, its due after its bytes); the far end holds what it reads until that due, in the
    order the link brought them, within what a line holds."""
    line = DelayLine(Wire(8e6, 1_000_000, stamped=True))  # 1 us a byte
    assert line.due_of(5_000, 1000) == 2_005_000
    assert line.due_of(10_000, 10) == 2_015_000  # after the first is all on the wire
    frame = bytes(range(60))
    sent = stamp(frame, 123_456_789)
    assert len(sent) == len(frame) + STAMP.size and unstamp(sent) == (frame, 123_456_789)
    assert unstamp(frame) is None  # no magic
    assert unstamp(sent[: 14 + STAMP.size - 1]) is None  # too short to carry one
    far = DelayLine(Wire(8e6, 1_000_000, stamped=True))
    assert far.hold(3_000, b"a") and far.hold(2_000, b"b")  # never before the one ahead
    assert far.take_due(2_999) == [] and [d for d, _, _ in far.take_due(3_000)] == [3_000, 3_000]
    big = b"z" * 65_000
    held = sum(far.hold(0, big) for _ in range(LINE_MAX_BYTES // len(big) + 3))
    assert held == LINE_MAX_BYTES // len(big)
    assert far.holds_no_later() == 1_000_000 + LINE_MAX_BYTES * 1000


def test_the_testbed_gives_each_linked_port_its_wire(tmp_path: Path) -> None:
    spec = leafspine(2, 2, 2)
    scaling = Scaling()
    tb = Testbed(spec, TestbedOptions(switch="builtin", scaling=scaling, run_dir=tmp_path))
    delay = round(LINK_DELAY_MODEL_NS * scaling.scale)
    assert tb.link_delay_s == delay / 1e9
    wires = dict(parse_wire(w) for w in tb.wires("leaf1"))
    bps = scaling.link_bps
    # hosts on ports 1-2 (their frames held coming in), spines on 3-4 (stamped: the
    # receiving switch holds them); the collector's port (5) has no link of the model's
    assert wires == {
        1: Wire(bps, delay, ingress=True),
        2: Wire(bps, delay, ingress=True),
        3: Wire(bps, delay, stamped=True),
        4: Wire(bps, delay, stamped=True),
    }
    assert all(w.stamped for _, w in map(parse_wire, tb.wires("spine1")))


def _with_own_link(spec: FabricSpec, end: End, **own: Any) -> FabricSpec:
    links = tuple(replace(lk, **own) if end in (lk.a, lk.b) else lk for lk in spec.links)
    return FabricSpec(spec.name, spec.switches, spec.hosts, links, spec.collector)


def test_a_link_of_its_own_speed_and_delay_and_bmv2_refusing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from testbed.emu import network
    from testbed.emu.network import TestbedError
    from testbed.emu.nodes import Bmv2Switch

    spec = _with_own_link(leafspine(2, 2, 2), End("leaf1", 3), gbps=800.0, delay_ns=500)
    scaling = Scaling()
    tb = Testbed(spec, TestbedOptions(switch="builtin", scaling=scaling, run_dir=tmp_path))
    wires = dict(parse_wire(w) for w in tb.wires("leaf1"))
    assert wires[3] == Wire(800e9 / scaling.scale, round(500 * scaling.scale), stamped=True)
    assert wires[4] == Wire(
        scaling.link_bps, round(LINK_DELAY_MODEL_NS * scaling.scale), stamped=True
    )
    spine = dict(parse_wire(w) for w in tb.wires("spine1"))
    assert spine[1] == wires[3]  # the link's other end
    monkeypatch.setattr(network, "choose_switch", lambda _choice: Bmv2Switch)
    with pytest.raises(TestbedError, match="--switch builtin"):
        Testbed(spec, TestbedOptions(switch="bmv2", scaling=scaling, run_dir=tmp_path))


def test_the_links_at_once_on_request(tmp_path: Path) -> None:
    """`--link-time none`: no line (a veth's time), and a link's own delay refused."""
    from testbed.emu.network import TestbedError

    opts = TestbedOptions(switch="builtin", link_time="none", run_dir=tmp_path)
    tb = Testbed(leafspine(2, 2, 2), opts)
    assert tb.wires("leaf1") == [] and tb.link_delay_s == 0.0
    spec = _with_own_link(leafspine(2, 2, 2), End("leaf1", 3), delay_ns=500)
    with pytest.raises(TestbedError, match="--link-time model"):
        Testbed(spec, opts)
    with pytest.raises(ValueError, match="link time"):
        Testbed(spec, TestbedOptions(switch="builtin", link_time="fast", run_dir=tmp_path))


def test_the_loop_wakes_when_a_frame_leaves_and_takes_the_rest_within_its_slack() -> None:
    """`wait_plan` (the reference) and the native loop's xm_emu_plan: a frame leaving on a
    line leaves when due; what arrives or departs is taken up to the slack (half the shortest
    wire's delay) late, and a wait ending within the slack does not wake for the ports'
    frames (it reads them when it ends)."""
    assert loop_slack_ns({}) == 0
    assert loop_slack_ns({1: Wire(2e7, 1_600_000, True), 2: Wire(2e7, 800_000)}) == 400_000
    assert loop_slack_ns({1: Wire(2e7, 5 * 10**9)}) == LOOP_SLACK_MAX_NS  # the sockets' bound
    assert wait_plan(None, None, 800, 0) == (None, True)
    assert wait_plan(5_000, None, 800, 0) == (5_000, True)  # far: a frame wakes the loop
    assert wait_plan(5_000, None, 800, 4_500) == (5_000, False)  # near: read as it ends
    assert wait_plan(None, 1_000, 800, 0) == (1_800, True)  # a departure: up to 800 ns late
    assert wait_plan(10_000, 1_000, 800, 1_000) == (1_800, False)
    assert wait_plan(1_500, 1_000, 800, 1_000) == (1_500, False)  # the hard time first
    assert wait_plan(10, 5, 0, 10) == (5, True)  # no slack: every frame and time wakes it
    sw = V1Switch(clock=Clock(virtual=True), pipeline="native")
    sw.load(BMV2_JSON.read_bytes())
    assert sw.compiled is not None and sw.compiled.native is not None
    lib, ffi = sw.compiled.native.lib, sw.compiled.native.ffi
    wake = ffi.new("int64_t *")
    rng = random.Random(5)
    for _ in range(5_000):
        hard = rng.choice([None, rng.randrange(0, 10**7)])
        soft = rng.choice([None, rng.randrange(0, 10**7)])
        slack, now = rng.choice([0, 1, 400_000, 800_000]), rng.randrange(0, 10**7)
        got = lib.xm_emu_plan(
            hard is not None, hard or 0, soft is not None, soft or 0, slack, now, wake
        )
        assert (int(wake[0]) if got & 1 else None, bool(got & 2)) == wait_plan(
            hard, soft, slack, now
        ), (hard, soft, slack, now)


def test_a_stamped_ports_counters_are_the_frames_own() -> None:
    """The kernel counts a stamped wire's frames with the due each carries; the emulation's
    link counters (utilization, the twin's comparison) take it out again."""
    from testbed.emu.suite import without_stamps
    from testbed.probes import PortCounters

    # 10 frames in of 1,000 bytes each and 4 out of 100, as the veth counted them
    kernel = PortCounters(10, 4, 10 * (1000 + STAMP.size), 4 * (100 + STAMP.size))
    assert without_stamps(kernel) == PortCounters(10, 4, 10_000, 400)
