"""The built-in switch's traffic manager seen from the P4 program (tests/p4/queue_probe.p4):
queue depths and timestamps in standard_metadata, rate-limited ports, and packets that the
switch process reads late (a busy machine) keeping the metadata of their real arrival."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import V1Switch

JSON = Path(__file__).parent / "p4" / "build" / "queue_probe.json"
FRAME = bytes(12) + b"\x88\xb5" + bytes(28) + bytes(958)  # 1000 bytes: Ethernet, probe, pad
MS = 1_000_000


def switch(unit: str = "packets") -> tuple[V1Switch, list[dict[str, int]]]:
    if not JSON.exists():
        pytest.skip(f"{JSON} not built")
    sw = V1Switch(Clock(virtual=True), qdepth_unit=unit)
    sw.load(JSON.read_bytes())
    sw.tm.set_rate(2, bps=8e6)  # a 1000-byte frame every millisecond
    probes: list[dict[str, int]] = []

    def transmit(port: int, data: bytes) -> None:
        enq, deq, enq_ts, delta = struct.unpack("!IIII", data[14:30])
        ing = int.from_bytes(data[30:36], "big")
        egr = int.from_bytes(data[36:42], "big")
        probes.append(
            {
                "enq_qdepth": enq,
                "deq_qdepth": deq,
                "enq_ts": enq_ts,
                "deq_timedelta": delta,
                "ingress_ts": ing,
                "egress_ts": egr,
            }
        )

    sw.transmit = transmit
    return sw, probes


def test_queue_builds_behind_a_rate_limited_port() -> None:
    sw, probes = switch()
    for _ in range(5):  # a burst of 5 at t = 0
        sw.receive(1, FRAME)
    sw.service()
    sw.clock.advance(10 * MS)
    sw.service()
    assert [p["enq_qdepth"] for p in probes] == [0, 1, 2, 3, 4]
    assert [p["deq_qdepth"] for p in probes] == [4, 3, 2, 1, 0]
    assert [p["egress_ts"] for p in probes] == [0, 1000, 2000, 3000, 4000]  # µs
    assert [p["deq_timedelta"] for p in probes] == [0, 1000, 2000, 3000, 4000]


def test_depth_in_bytes() -> None:
    sw, probes = switch("bytes")
    for _ in range(3):
        sw.receive(1, FRAME)
    sw.clock.advance(10 * MS)
    sw.service()
    assert [p["enq_qdepth"] for p in probes] == [0, 1000, 2000]


def test_late_processing_with_arrival_times_matches_on_time_processing() -> None:
    arrivals = [k * MS // 2 for k in range(10)]  # 2 frames per ms into a 1-frame-per-ms port

    on_time, want = switch()
    for t in arrivals:
        on_time.clock.advance_to(t)
        on_time.service()
        on_time.receive(1, FRAME)
    on_time.clock.advance_to(50 * MS)
    on_time.service()

    late, got = switch()
    late.clock.advance_to(20 * MS)  # the process wakes up well after the burst
    for t in arrivals:
        late.service(until_ns=t)
        late.receive(1, FRAME, t)
    late.clock.advance_to(50 * MS)
    late.service()

    assert got == want
    assert max(p["enq_qdepth"] for p in want) == 4  # the queue the arrivals really built
