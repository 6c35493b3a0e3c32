"""Fault injection (testbed/faults.py, the traffic manager's port faults, SwitchAdmin.SetFault):
each kind's effect on the queues and its removal, the CLI and file syntax, and the errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from controller.proto import switch_pb2
from testbed import faults
from testbed.faults import FaultError, PortSetting
from testbed.switch.admin import SwitchAdminService
from testbed.switch.traffic_manager import Clock, TrafficManager
from testbed.switch.v1model import V1Switch
from testbed.topo import leafspine

SPEC = leafspine(2, 2, 2)  # leaf ports 1-2 hosts, 3-4 spines


def _drain(tm: TrafficManager, clock: Clock, until_ns: int) -> list[tuple[Any, int]]:
    out = []
    while True:
        t = tm.next_departure_ns()
        if t is None or t > until_ns:
            return out
        clock.advance_to(t)
        out += [(pkt, start) for _, _, pkt, _, _, start in tm.dequeue_ready(clock.now_ns())]


def test_values_and_targets_parse() -> None:
    assert faults.parse_command(SPEC, "link leaf1:3 loss 1%") == faults.Fault(
        "leaf1:3", "loss", 0.01
    )
    assert faults.parse_command(SPEC, "link leaf1:3 delay 2ms").value == pytest.approx(0.002)
    assert faults.parse_command(SPEC, "link leaf1:3 rate 25%").value == 0.25
    assert faults.parse_command(SPEC, "switch spine1 slow").value == faults.DEFAULT_SLOW_S
    assert faults.parse_command(SPEC, "switch spine1 kill").value is None
    assert faults.parse_command(SPEC, "nic h3 rate 50%").value == 0.5
    assert faults.parse_command(SPEC, "nic h3 silent-loss 0.1%").value == pytest.approx(0.001)
    for bad, msg in (
        ("link leaf1:3 loss 1", "percentage"),
        ("link leaf1:3 down 5%", "no value"),
        ("link leaf1:9 down", "no link"),
        ("link spine1 down", "not a link"),
        ("switch spine1 loss 1%", "one of kill, slow, up"),
        ("link leaf1:3 rate 0%", "within 0.1 and 100"),
        ("link leaf1:3 delay 20s", "within 0 and 10 s"),
        ("lnk x y", "usage"),
    ):
        with pytest.raises(FaultError, match=msg):
            faults.parse_command(SPEC, bad)


def test_faults_file(tmp_path: Path) -> None:
    p = tmp_path / "faults.yaml"
    p.write_text(
        "- {at: 2, target: leaf1:3, kind: up}\n"
        "- {at: 0.5, target: leaf1:3, kind: loss, value: 1%}\n"
        "- {at: 1, target: spine1, kind: slow, value: 5ms}\n"
    )
    fs = faults.load(SPEC, p)
    assert [(f.at, f.target, f.kind) for f in fs] == [
        (0.5, "leaf1:3", "loss"),
        (1.0, "spine1", "slow"),
        (2.0, "leaf1:3", "up"),
    ]
    p.write_text("- {at: 1, target: leaf1:3, kind: lose, value: 1%}\n")
    with pytest.raises(FaultError, match=r"faults\[0\]: leaf1:3: a link fault is one of"):
        faults.load(SPEC, p)
    p.write_text("- {at: x, target: leaf1:3, kind: down}\n")
    with pytest.raises(FaultError, match=r"faults\[0\].at: expected seconds"):
        faults.load(SPEC, p)
    p.write_text("{target: leaf1:3}\n")
    with pytest.raises(FaultError, match="a YAML list"):
        faults.load(SPEC, p)


def test_link_faults_set_both_ends_and_up_heals_them() -> None:
    peer = SPEC.peer(faults.End("leaf1", 3))
    assert peer is not None
    f = faults.parse_command(SPEC, "link leaf1:3 loss 2%")
    assert faults.port_settings(SPEC, f) == [
        PortSetting("leaf1", 3, loss=0.02, silent=False),  # counted: a silent loss's flag off
        PortSetting(peer.node, peer.index, loss=0.02, silent=False),
    ]
    up = faults.port_settings(SPEC, faults.parse_command(SPEC, "link leaf1:3 up"))
    assert [ps.port for ps in up] == [3, peer.index]
    assert all((ps.down, ps.loss, ps.delay_ns, ps.rate_factor) == (False, 0.0, 0, 1.0) for ps in up)
    # a host link: only the switch's side has a traffic manager
    h1 = faults.port_settings(SPEC, faults.parse_command(SPEC, "link h1:0 down"))
    assert h1 == [PortSetting("leaf1", 1, down=True)]
    slow = faults.port_settings(SPEC, faults.parse_command(SPEC, "switch spine1 slow 3ms"))
    assert slow == [PortSetting("spine1", None, delay_ns=3_000_000)]


def test_down_drops_what_waits_and_what_comes_then_up_forwards() -> None:
    clock = Clock(virtual=True)
    tm = TrafficManager(clock)
    tm.set_rate(1, bps=8e6)  # a 1000-byte packet per ms
    for i in range(3):
        tm.enqueue(1, 0, i, 1000, 0)
    tm.set_fault(1, down=True)
    assert tm.port_down(1) and tm.next_departure_ns() is None
    assert tm.port(1).fault_drops == 3 and tm.occupancy(1, 0) == (0, 0)
    sw = V1Switch(clock, device_id=1)
    sw.tm = tm
    sw.compiled = sw.std = object()  # type: ignore[assignment]  # past the no-pipeline check
    sw.receive(1, b"\x00" * 64)
    assert sw.stats.dropped["port_down"] == 1  # nothing is received on a down port
    tm.set_fault(2, loss=1.0)
    sw.receive(2, b"\x00" * 64)  # a lossy link's frame fails its check at the port
    assert sw.stats.dropped["rx_error"] == 1 and tm.port(2).rx_errors == 1
    tm.set_fault(1, down=False)
    tm.enqueue(1, 0, "after", 1000, clock.now_ns())
    assert [p for p, _ in _drain(tm, clock, 10**9)] == ["after"]


def test_loss_corrupts_the_fraction_asked_and_is_seeded() -> None:
    tm = TrafficManager(Clock(virtual=True))
    tm.set_fault(2, loss=0.01)
    lost = sum(tm.corrupted(2) for _ in range(100_000))
    assert 850 <= lost <= 1150 and tm.port(2).rx_errors == lost
    tm2 = TrafficManager(Clock(virtual=True))
    tm2.set_fault(2, loss=0.01)
    assert sum(tm2.corrupted(2) for _ in range(100_000)) == lost  # same seed, same draws
    tm.set_fault(2, loss=0.0)
    assert not any(tm.corrupted(2) for _ in range(1000))
    assert not tm.corrupted(7)  # a port without a fault


def test_delay_holds_each_packet_and_rate_factor_slows_the_port() -> None:
    clock = Clock(virtual=True)
    tm = TrafficManager(clock)
    tm.set_rate(1, bps=8e6)
    tm.set_fault(1, delay_ns=2_000_000)
    tm.enqueue(1, 0, "a", 1000, 0)
    tm.enqueue(1, 0, "b", 1000, 0)
    assert tm.next_departure_ns() == 2_000_000
    assert tm.dequeue_ready(1_999_999) == []
    # a leaves after its 2 ms, b one packet time (1 ms) later
    assert _drain(tm, clock, 10**9) == [("a", 2_000_000), ("b", 3_000_000)]
    tm.set_fault(1, delay_ns=0, rate_factor=0.25)
    t0 = clock.now_ns()
    for i in range(4):
        tm.enqueue(1, 0, i, 1000, t0)
    starts = [s for _, s in _drain(tm, clock, 10**10)]
    assert [s - starts[0] for s in starts] == [0, 4_000_000, 8_000_000, 12_000_000]
    tm.set_fault(1, rate_factor=1.0)
    t1 = clock.now_ns()
    for i in range(2):
        tm.enqueue(1, 0, i, 1000, t1)
    starts = [s for _, s in _drain(tm, clock, 10**10)]
    assert starts[1] - starts[0] == 1_000_000


class _Abort(Exception):
    pass


class _Context:
    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Abort(code, details)


def test_switch_admin_set_fault_checks_then_applies() -> None:
    sw = V1Switch(Clock(virtual=True), device_id=1)
    admin = SwitchAdminService(sw, None, None)
    admin.SetFault(switch_pb2.SetFaultRequest(port=3, loss=0.05, delay_ns=1000), _Context())
    q = {s.port: s for s in admin.GetQueues(switch_pb2.GetQueuesRequest(), None).queues}[3]
    assert (q.loss, q.delay_ns, q.rate_factor, q.down) == (0.05, 1000, 1.0, False)
    with pytest.raises(_Abort, match="loss must be a probability"):
        admin.SetFault(switch_pb2.SetFaultRequest(port=3, loss=1.5, down=True), _Context())
    assert not sw.tm.port_down(3)  # nothing of a refused request applies
    with pytest.raises(_Abort, match="rate_factor"):
        admin.SetFault(switch_pb2.SetFaultRequest(port=3, rate_factor=0.0), _Context())
    admin.SetFault(switch_pb2.SetFaultRequest(all_ports=True, down=True), _Context())
    assert sw.tm.port_down(3)


def test_the_example_file_loads_for_the_default_fabric() -> None:
    from testbed.topo import parse_choice

    path = Path(__file__).resolve().parents[1] / "testbed/data/faults/four-faults.yaml"
    fs = faults.load(parse_choice("leafspine"), path)
    assert [f.kind for f in fs] == ["down", "up", "loss", "up", "rate", "up", "slow", "up"]


def test_gray_failures_parse_and_a_flap_expands_to_its_downs_and_ups(tmp_path: Path) -> None:
    silent = faults.parse_command(SPEC, "link leaf1:3 silent-loss 0.1%")
    assert (silent.kind, silent.value) == ("silent-loss", pytest.approx(0.001))
    assert faults.parse_command(SPEC, "link leaf1:3 silent-rate 90%").value == 0.9
    flap = faults.parse_command(SPEC, "link leaf1:3 flap 50ms 3")
    assert (flap.value, flap.count) == (pytest.approx(0.05), 3)
    assert flap.describe() == "leaf1:3 flap 50ms 3"
    flap = faults.Fault(flap.target, flap.kind, flap.value, 1.0, flap.count)
    ev = [(f.kind, round(f.at, 3)) for f in faults.expand([flap, faults.Fault("spine1", "kill")])]
    assert ev == [("kill", 0.0), ("down", 1.0), ("up", 1.025), ("down", 1.05), ("up", 1.075)] + [
        ("down", 1.1),
        ("up", 1.125),
    ]
    for bad, msg in (
        ("link leaf1:3 flap 50ms", "count of downs"),
        ("link leaf1:3 flap 50ms 0", "within 1 and"),
        ("link leaf1:3 loss 1% 3", "only a flap"),
        ("link leaf1:3 flap 0ms 3", "period"),
    ):
        with pytest.raises(FaultError, match=msg):
            faults.parse_command(SPEC, bad)
    (tmp_path / "f.yaml").write_text(
        "- {at: 1.0, target: leaf1:3, kind: flap, value: 20ms, count: 2}\n"
        "- {at: 2.0, target: leaf1:3, kind: silent-loss, value: 0.5%}\n"
    )
    fs = faults.load(SPEC, tmp_path / "f.yaml")
    assert [f.kind for f in fs] == ["flap", "silent-loss"] and fs[0].count == 2
    # a silent fault is the fault with its `silent` flag, on both ends of the link
    ps = faults.port_settings(SPEC, fs[1])
    assert {(p.switch, p.port, p.loss, p.silent) for p in ps} == {
        ("leaf1", 3, 0.005, True),
        ("spine1", 1, 0.005, True),
    }
    assert faults.request_fields(ps[0])["silent"] is True
    assert faults.healthy("leaf1", 3).silent is False


def test_a_silent_fault_leaves_no_trace_in_the_switchs_counters() -> None:
    """Silent loss: the frames are lost but no receive error is counted (only the fault's own
    ground truth); silent rate: the port drains slower and its latency monitor expects it
    (no wait beyond what its queue explains), where a counted rate cut shows as excess."""
    tm = TrafficManager(Clock(virtual=True))
    tm.set_fault(2, loss=0.01, silent=True)
    lost = sum(tm.corrupted(2) for _ in range(100_000))
    assert 850 <= lost <= 1150 and tm.port(2).rx_errors == 0 and tm.port(2).silent_drops == lost

    def excess(silent: bool) -> tuple[int, int, int]:
        clock = Clock(virtual=True)
        t = TrafficManager(clock)
        t.set_rate(1, bps=8e6)
        t.set_fault(1, rate_factor=0.5, silent=silent)
        for i in range(5):
            t.enqueue(1, 0, i, 1000, 0)
        starts = [s for _, s in _drain(t, clock, 10**10)]
        pq = t.ports[1]
        return starts[1] - starts[0], pq.wait_ns, pq.expected_wait_ns

    gap, wait, expected = excess(silent=True)
    assert gap == 2_000_000 and wait == expected  # half the rate, and nothing unexplained
    gap, wait, expected = excess(silent=False)
    assert gap == 2_000_000 and wait == 2 * expected  # the counted cut waits twice as long


def test_nic_faults_set_the_switch_ports_its_links_reach() -> None:
    """A NIC down takes its link down at the switch's end; its losses are the frames that
    port receives, counted or silent; its rate is its own port's (nothing on the switch)."""
    h3 = SPEC.attachment("h3", 0)  # leaf2:1
    at = (h3.node, h3.index)

    def settings(line: str) -> list[PortSetting]:
        return faults.port_settings(SPEC, faults.parse_command(SPEC, line))

    assert settings("nic h3 down") == [PortSetting(*at, down=True)]
    assert settings("nic h3 loss 1%") == [PortSetting(*at, loss=0.01, silent=False)]
    assert settings("nic h3 silent-loss 1%") == [PortSetting(*at, loss=0.01, silent=True)]
    assert settings("nic h3 up") == [faults.healthy(*at)]
    assert settings("nic h3 rate 50%") == []
    with pytest.raises(FaultError, match="a nic fault is one of rate, down, loss"):
        faults.parse_command(SPEC, "nic h3 delay 2ms")


def test_get_health_answers_get_status_and_get_queues_in_one_call() -> None:
    """The controller's poll reads both in one RPC (each call costs the switch's gRPC server
    the same whatever it asks): the same answers as the two calls."""
    sw = V1Switch(Clock(virtual=True), device_id=1)
    admin = SwitchAdminService(sw, None, None)
    admin.SetFault(switch_pb2.SetFaultRequest(port=3, loss=0.05, delay_ns=1000), _Context())
    admin.SetFault(switch_pb2.SetFaultRequest(port=4, down=True), _Context())
    got = admin.GetHealth(switch_pb2.GetHealthRequest(), None)
    status = admin.GetStatus(switch_pb2.GetStatusRequest(), None)
    got.status.uptime_us = status.uptime_us = 0  # the wall clock's, between the calls
    assert got.status == status
    assert got.queues == admin.GetQueues(switch_pb2.GetQueuesRequest(), None)
    assert {q.port for q in got.queues.queues} >= {3, 4}
