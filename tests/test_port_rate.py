"""A port never sends faster than its rate: the traffic manager books each frame's time to the
fraction of a nanosecond (carried, not rounded away), and for the frame as it leaves the egress
pipeline (INT metadata added, or taken off by a sink), not as it was queued."""

from __future__ import annotations

from testbed.switch.traffic_manager import Clock, PortQueues, TrafficManager


def departures(tm: TrafficManager, port: int, frames: int, nbytes: int) -> list[int]:
    for i in range(frames):
        assert tm.enqueue(port, 0, i, nbytes, 0) is not None
    starts: list[int] = []
    t = 0
    while len(starts) < frames:
        for _port, _prio, _pkt, _enq, _left, start in tm.dequeue_ready(t):
            starts.append(start)
        t = tm.ports[port].next_tx_ns
    return starts


def test_fractional_frame_times_add_up_exactly() -> None:
    # 4096 bytes at 400 Gb/s: 81.92 ns a frame; 100 frames take 8192 ns, not 8100
    tm = TrafficManager(Clock(virtual=True))
    tm.set_rate(1, bps=400e9)
    tm.set_depth(1, 1000)
    starts = departures(tm, 1, 100, 4096)
    assert starts[1] == 81 and starts[50] == 4096
    assert tm.ports[1].next_tx_ns == 8192


def test_port_is_busy_for_the_frame_it_sends() -> None:
    pq = PortQueues(port=1, rate_bps=8e9)  # one byte a nanosecond
    pq.next_tx_ns = 1000  # booked for a 1000-byte frame from 0
    pq.resize(1000, 1048)  # egress added 48 bytes of INT
    assert pq.next_tx_ns == 1048
    pq.resize(1048, 1000)  # a sink took them off again
    assert pq.next_tx_ns == 1000
    unlimited = PortQueues(port=2)
    unlimited.resize(1000, 2000)  # no rate: nothing to book
    assert unlimited.next_tx_ns == 0
