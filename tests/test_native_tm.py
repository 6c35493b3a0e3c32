"""The native traffic manager (testbed/switch/native/tm.py) against the reference
(testbed/switch/traffic_manager.py): random sequences of enqueues (from ingress ports, for
PFC), departures, frame resizes, rate, depth, fault, shared-buffer, pause and PFC changes
through both, every result identical (the queue found on arrival, each departure's port,
priority, packet, times and packets left, the next departure time, the PFC frames sent) and
every port's state after each step (bookings to the fraction of a nanosecond, counters, the
latency monitor's sums, PFC's per-priority states). PFC's per-packet counting runs in C, its
pause frames, timers and watchdog in the reference's code on the C state."""

from __future__ import annotations

import random
from typing import Any

import pytest

from controller.wire.pfc import PfcPause
from controller.wire.telemetry_report import DROP_REASON_TM_PORT_DOWN, DROP_REASON_TM_QUEUE_FULL
from testbed.switch.native.build import BuildError, compiler
from testbed.switch.pfc import PfcConfig, WatchdogConfig
from testbed.switch.traffic_manager import Clock, SharedBuffer, TrafficManager

try:
    compiler()
    HAVE_CC = True
except BuildError:
    HAVE_CC = False

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

FIELDS = (
    "depth_pkts",
    "depth_bytes",
    "rate_pps",
    "rate_bps",
    "next_tx_ns",
    "tx_carry_ns",
    "first_tx_ns",
    "last_tx_end_ns",
    "enqueued",
    "dequeued",
    "dropped",
    "max_depth_pkts",
    "max_depth_bytes",
    "departures",
    "wait_ns",
    "expected_wait_ns",
    "fault_drops",
    "rx_errors",
    "silent_drops",
)


def state(tm: TrafficManager) -> list[Any]:
    out: list[Any] = [tm.buffered_bytes, list(tm.ports), sorted(tm._busy), tm.last_drop]
    for pq in tm.ports.values():
        out.append([getattr(pq, f) for f in FIELDS])
        out.append([list(pq.qbytes), list(pq.dequeued_prio), list(pq.pause_until)])
        out.append([[(e[1], e[2], e[3], e[4]) for e in q] for q in pq.queues])
        out.append([pq.fault.delay_ns, pq.fault.rate_factor, pq.fault.silent, pq.fault.down])
        c = pq.pfc
        out.append([c.xoff_sent, c.xon_sent, c.watchdog_drops, c.storms, c.restored])
        out.append([c.pauses_received, c.resumes_received])
        out.append([(prio, vars_of(st)) for prio, st in c.per_prio.items()])
    out.append([sorted(tm._pausing), tm._wd_next_ns, tm._pfc_shared_used, tm.reports_held])
    return out


PFC_STATE = (
    "ingress_bytes",
    "pausing",
    "xoff_sent_ns",
    "paused_until_ns",
    "paused_since_ns",
    "paused_ns",
    "storm",
    "last_pause_rx_ns",
    "wd_seen_dequeued",
    "wd_stalled_polls",
    "wd_quiet_polls",
)


def vars_of(st: Any) -> list[Any]:
    return [getattr(st, f) for f in PFC_STATE]


def pair(nq: int) -> tuple[TrafficManager, TrafficManager, list[Any], list[Any]]:
    from testbed.switch.native.tm import NativeTrafficManager

    ref = TrafficManager(Clock(virtual=True), nq)
    nat = NativeTrafficManager(Clock(virtual=True), nq)
    sent_ref: list[Any] = []
    sent_nat: list[Any] = []
    ref.send_control = lambda port, frame: sent_ref.append((port, frame))
    nat.send_control = lambda port, frame: sent_nat.append((port, frame))
    return ref, nat, sent_ref, sent_nat


def run_sequence(seed: int, steps: int) -> int:
    """One random sequence through both traffic managers; the departures it compared."""
    rnd = random.Random(seed)
    nq = rnd.choice([1, 2, 3, 8])
    ref, nat, sent_ref, sent_nat = pair(nq)
    both = (ref, nat)
    ports = rnd.sample(range(0, 512), rnd.choice([1, 2, 4, 9, 20]))
    rates = [0.0, 1e9, 1e10, 25e9, 1e11, 4e11, 123456789.0, 1000.0]
    if rnd.random() < 0.5:
        buf = SharedBuffer(rnd.choice([20_000, 300_000, 4_000_000]), rnd.choice([1 / 8, 0.5, 1, 4]))
        for tm in both:
            tm.set_buffer(buf)
    # sizes of every kind, or a few whose sums land exactly on PFC's thresholds
    sizes = rnd.choice([[64, 100, 1000, 1500, 4096, 9000, 0], [1000], [500, 1000, 1500]])
    now = 0
    departures = 0
    packets: dict[int, int] = {}
    handle = 0
    for _ in range(steps):
        now += rnd.choice([0, 0, 1, 7, 100, 1000, 12_345, 100_000])
        for tm in both:
            tm.clock.advance_to(now)
        r = rnd.random()
        if r < 0.5:
            port, prio = rnd.choice(ports), rnd.randrange(nq)
            nbytes = rnd.choice(sizes) or rnd.randrange(1, 10_000)
            in_port = rnd.choice([-1, *ports])
            handle += 1
            got = [tm.enqueue(port, prio, handle, nbytes, now, in_port) for tm in both]
            assert got[0] == got[1], (seed, "enqueue", got)
            packets[handle] = nbytes
        elif r < 0.8:
            for tm in both:
                tm.pfc_tick(now)
            got = [tm.dequeue_ready(now) for tm in both]
            assert got[0] == got[1], (seed, "dequeue", got)
            departures += len(got[0])
            for port, _prio, h, _enq, _left, _start in got[0]:
                if rnd.random() < 0.3:  # egress added or removed bytes (INT)
                    booked = packets[h]
                    sent = max(1, booked + rnd.choice([-48, -12, 8, 12, 36, 200]))
                    for tm in both:
                        tm.ports[port].resize(booked, sent)
        elif r < 0.85:
            port = rnd.choice([*ports, None])
            bps = rnd.choice(rates) if rnd.random() < 0.8 else None
            pps = rnd.choice([0.0, 0.0, 1.0, 1e5, 3e6]) if rnd.random() < 0.3 else None
            for tm in both:
                tm.set_rate(port, pps, bps)
        elif r < 0.88:
            port = rnd.choice([*ports, None])
            pkts = rnd.choice([None, 0, 1, 4, 64, 1000])
            nbytes = rnd.choice([None, 0, 3000, 100_000])
            for tm in both:
                tm.set_depth(port, pkts, nbytes)
        elif r < 0.91:
            port = rnd.choice(ports)
            down = rnd.choice([None, False, False, False, True])
            delay = rnd.choice([None, 0, 0, 500, 20_000])
            factor = rnd.choice([None, 1.0, 1.0, 0.5, 0.1, 1 / 3])
            silent = rnd.choice([None, False, True])
            loss = rnd.choice([None, None, 0.0, 0.3, 1.0])
            for tm in both:
                tm.set_fault(port, down, loss, delay, factor, silent)
            frames = rnd.choice([1, 70])  # past the 64 draws the native one holds
            got = [[tm.corrupted(port) for _ in range(frames)] for tm in both]
            assert got[0] == got[1], (seed, "corrupted")
        elif r < 0.92:  # a drop's report: held back within the gap after the last, or sent
            port = rnd.choice(ports)
            reason = rnd.choice([DROP_REASON_TM_QUEUE_FULL, DROP_REASON_TM_PORT_DOWN])
            got = [tm.report_held(port, reason, now) for tm in both]
            assert got[0] == got[1], (seed, "report held")
            if not got[0] and rnd.random() < 0.7:
                for tm in both:
                    tm.drop_reported(port, reason, now)
        elif r < 0.93:  # a downstream pause held or released
            port, prio = rnd.choice(ports), rnd.randrange(nq)
            until = now + rnd.choice([0, 1000, 50_000])
            for tm in both:
                tm.port(port).pause_until[prio] = until
        elif r < 0.94:
            buf = rnd.choice([None, SharedBuffer(rnd.choice([5_000, 200_000]), 2.0)])
            for tm in both:
                tm.set_buffer(buf)
        elif r < 0.98:  # a pause frame from the downstream device (or its resume)
            port = rnd.choice(ports)
            enable = rnd.randrange(1, 256)
            quanta = tuple(rnd.choice([0, 1, 100, 0xFFFF]) for _ in range(8))
            got = [tm.receive_pause(port, PfcPause(enable, quanta), now) for tm in both]
            assert got[0] == got[1], (seed, "pause")
        else:  # PFC on, static or dynamic, with or without its watchdog, or off
            pfc, wd = random_pfc(rnd, nq)
            for tm in both:
                tm.set_pfc(pfc, wd)
        assert ref.next_departure_ns() == nat.next_departure_ns(), (seed, "next departure")
        assert sent_ref == sent_nat, (seed, "PFC frames")
        a, b = state(ref), state(nat)
        assert a == b, (seed, a, b)
    return departures


def random_pfc(rnd: random.Random, nq: int) -> tuple[PfcConfig | None, WatchdogConfig | None]:
    """PFC off, or on with static or dynamic thresholds over some of the priorities, and
    maybe the watchdog (either action)."""
    if rnd.random() < 0.25:
        return None, None
    prios = frozenset(rnd.sample(range(nq), rnd.randint(1, nq)))
    quanta = rnd.choice([1, 100, 0xFFFF])
    link = rnd.choice([0.0, 1e10, 4e11])
    if rnd.random() < 0.5:
        xoff = rnd.choice([1500, 6000, 40_000])
        pfc = PfcConfig(xoff, xoff - 1000, 3000, quanta, prios, link)
    else:
        pfc = PfcConfig(
            6000,
            3000,
            3000,
            quanta,
            prios,
            link or 1e10,
            alpha=rnd.choice([1 / 8, 1.0, 2.0]),
            pool_bytes=rnd.choice([20_000, 500_000]),
            reserve_bytes=rnd.choice([0, 1500]),
            resume_offset_bytes=rnd.choice([0, 3000]),
        )
    wd = None
    if rnd.random() < 0.6:
        wd = WatchdogConfig(rnd.choice([500, 5000, 50_000]), 2, 2, rnd.choice(["drop", "forward"]))
    return pfc, wd


@pytest.mark.parametrize("seed", range(12))
def test_random_sequences_identical_on_both_traffic_managers(seed: int) -> None:
    assert run_sequence(seed, 500) > 0


def test_a_long_sequence_at_400g() -> None:
    """Many bookings at one rate: the carried fractions stay identical."""
    ref, nat, _, _ = pair(1)
    for tm in (ref, nat):
        tm.set_rate(None, None, 4e11)
    now = 0
    for i in range(5000):
        now += 13
        for port in (1, 2):
            assert ref.enqueue(port, 0, i, 1000 + i % 57, now) == nat.enqueue(
                port, 0, i, 1000 + i % 57, now
            )
        assert ref.dequeue_ready(now) == nat.dequeue_ready(now)
    assert ref.ports[1].tx_carry_ns == nat.ports[1].tx_carry_ns
    assert ref.ports[2].next_tx_ns == nat.ports[2].next_tx_ns


@pytest.mark.parametrize("unit", ["packets", "bytes", "cells"])
def test_a_switch_on_both_traffic_managers_sends_the_same_queue_metadata(unit: str) -> None:
    """tests/p4/queue_probe writes each packet's queueing metadata (enq/deq depth, enqueue
    time, time in queue, both timestamps) into the packet: bursts through a rate-limited,
    sometimes shared, sometimes delayed port give the same frames at the same times on the
    reference switch and on the native one (architecture path and traffic manager in C),
    with the same drops and port state."""
    from pathlib import Path

    from testbed.switch.native.tm import NativeTrafficManager
    from testbed.switch.v1model import V1Switch

    program = (Path(__file__).parent / "p4" / "build" / "queue_probe.json").read_bytes()
    rnd = random.Random(unit)
    sws = [V1Switch(Clock(virtual=True), qdepth_unit=unit, pipeline=pl) for pl in PIPELINES]
    sent: list[list[tuple[int, int, bytes]]] = [[], []]
    for k, sw in enumerate(sws):
        sw.load(program)
        sw.transmit = lambda port, data, k=k, sw=sw: sent[k].append(  # type: ignore[misc]
            (sw.clock.now_ns(), port, data)
        )
    assert sws[1].pipeline_in_use == "native" and isinstance(sws[1].tm, NativeTrafficManager)
    for sw in sws:
        sw.tm.set_rate(None, None, 1e9)
        sw.tm.set_depth(None, 40, 60_000)
    for step in range(400):
        dt = rnd.choice([0, 100, 1_000, 10_000, 200_000])
        if step == 150:
            for sw in sws:
                sw.tm.set_buffer(SharedBuffer(80_000, 1.0))
        if step == 250:
            for sw in sws:
                sw.tm.set_fault(2, delay_ns=5_000, rate_factor=0.5)
        burst = [
            bytes(12) + b"\x88\xb5" + bytes(28) + bytes(rnd.choice([0, 50, 1400, 8000]))
            for _ in range(rnd.choice([0, 1, 3, 20]))
        ]
        for sw in sws:
            sw.clock.advance(dt)
            for frame in burst:
                sw.receive(1, frame)
            sw.service()
        assert sent[0] == sent[1], (unit, step)
    for sw in sws:
        sw.clock.advance(10**10)
        sw.service()
    assert sent[0] == sent[1]
    assert sws[0].drop_counts() == sws[1].drop_counts()
    assert state(sws[0].tm) == state(sws[1].tm)
    assert len(sent[0]) > 100 and sws[0].drop_counts().get("queue_full")


PIPELINES = ("reference", "native")


def test_ports_free_at_the_same_time_leave_in_port_order() -> None:
    """A defined tie order (the native twin's loop depends on it): ports whose next departure
    is the same nanosecond leave in port order, whatever order their packets came in. Ports
    8 and 1 (and 40 and 9) are the pairs a small Python set iterates the other way."""
    for tm in pair(1)[:2]:
        for port in (40, 8, 1, 9):
            tm.port(port).rate_bps = 1e9
        for port in (40, 8, 9, 1):
            assert tm.enqueue(port, 0, f"p{port}", 1000, 0) is not None
        assert sorted(tm._busy) == [1, 8, 9, 40]
        assert [d[0] for d in tm.dequeue_ready(0)] == [1, 8, 9, 40], type(tm).__name__
        assert not tm._busy


def test_pfc_runs_in_c_on_and_off() -> None:
    """PFC on keeps the switch's traffic manager native (its counting is in C); a packet
    counted against an ingress port releases its bytes whether PFC is still on or not."""
    from testbed.switch.native.tm import NativeTrafficManager
    from testbed.switch.v1model import V1Switch

    sw = V1Switch(Clock(virtual=True), pipeline="native")
    tm = sw.tm
    assert isinstance(tm, NativeTrafficManager)
    sent: list[tuple[int, bytes]] = []
    tm.send_control = lambda port, frame: sent.append((port, frame))
    tm.port(7).rate_bps = 1e9
    sw.set_pfc(PfcConfig(1500, 500, 3000, link_bps=1e10))
    assert sw.tm is tm
    assert tm.enqueue(7, 0, "q", 1000, 0, ingress_port=3) is not None
    assert tm.enqueue(7, 0, "r", 1000, 0, ingress_port=3) is not None
    assert [p for p, _ in sent] == [3] and tm.ports[3].pfc.xoff_sent == 1  # XOFF upstream
    assert sorted(tm._pausing) == [(3, 0)] and tm.ports[3].pfc.state(0).ingress_bytes == 2000
    assert tm.next_departure_ns() == 0
    sw.set_pfc(None)
    assert tm.ports[3].pfc.xon_sent == 1 and not tm._pausing  # released as PFC went off
    assert [d[2] for d in tm.dequeue_ready(10**6)] == ["q", "r"]
    assert tm.ports[3].pfc.state(0).ingress_bytes == -2000  # as the reference counts it
