"""The native traffic manager (testbed/switch/native/tm.py) against the reference
(testbed/switch/traffic_manager.py): random sequences of enqueues, departures, frame resizes,
rate, depth, fault, shared-buffer and pause changes through both, every result identical (the
queue found on arrival, each departure's port, priority, packet, times and packets left, the
next departure time) and every port's state after each step (bookings to the fraction of a
nanosecond, counters, the latency monitor's sums)."""

from __future__ import annotations

import random

import pytest

from testbed.switch.native.build import BuildError, compiler
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
)


def _state(ref: TrafficManager, nat: object, ports: list[int]) -> tuple[list[object], list[object]]:
    from testbed.switch.native.tm import NativeTrafficManager

    assert isinstance(nat, NativeTrafficManager)
    a: list[object] = [ref.buffered_bytes, list(ref.ports)]
    b: list[object] = [nat.tm.buffered_bytes, list(nat.ports_seen)]
    for port in ports:
        pq = ref.ports.get(port)
        if pq is None:
            a.append(None)
            b.append(None if not nat.tm.ports[port].exists else port)
            continue
        npq = nat.tm.ports[port]
        a.append([getattr(pq, f) for f in FIELDS])
        b.append([getattr(npq, f) for f in FIELDS])
        a.append(
            [list(pq.qbytes), list(pq.dequeued_prio), [len(q) for q in pq.queues], pq.pause_until]
        )
        n = ref.nb_queues
        b.append(
            [
                list(npq.qbytes[0:n]),
                list(npq.dequeued_prio[0:n]),
                [npq.queues[i].len for i in range(n)],
                list(npq.pause_until[0:n]),
            ]
        )
        a.append([pq.fault.delay_ns, pq.fault.rate_factor, pq.fault.silent])
        b.append([npq.fault_delay_ns, npq.fault_rate_factor, bool(npq.fault_silent)])
    return a, b


def run_sequence(seed: int, steps: int) -> int:
    """One random sequence through both traffic managers; the departures it compared."""
    from testbed.switch.native.tm import NativeTrafficManager

    rnd = random.Random(seed)
    nq = rnd.choice([1, 2, 3, 8])
    ref = TrafficManager(Clock(virtual=True), nq)
    nat = NativeTrafficManager(nq)
    ports = rnd.sample(range(0, 512), rnd.choice([1, 2, 4, 9, 20]))
    rates = [0.0, 1e9, 1e10, 25e9, 1e11, 4e11, 123456789.0, 1000.0]
    if rnd.random() < 0.5:
        buf = SharedBuffer(rnd.choice([20_000, 300_000, 4_000_000]), rnd.choice([1 / 8, 0.5, 1, 4]))
        ref.set_buffer(buf)
        nat.set_buffer(buf)
    now = 0
    departures = 0
    packets: dict[int, int] = {}
    handle = 0
    for _ in range(steps):
        now += rnd.choice([0, 0, 1, 7, 100, 1000, 12_345, 100_000])
        ref.clock.advance_to(now)
        r = rnd.random()
        if r < 0.5:
            port, prio = rnd.choice(ports), rnd.randrange(nq)
            nbytes = rnd.choice([64, 100, 1000, 1500, 4096, 9000, rnd.randrange(1, 10_000)])
            handle += 1
            got_ref = ref.enqueue(port, prio, handle, nbytes, now)
            got_nat = nat.enqueue(port, prio, handle, nbytes, now)
            assert got_ref == got_nat, (seed, "enqueue", got_ref, got_nat)
            packets[handle] = nbytes
        elif r < 0.8:
            got_ref = ref.dequeue_ready(now)
            got_nat = nat.dequeue_ready(now)
            assert got_ref == got_nat, (seed, "dequeue", got_ref, got_nat)
            departures += len(got_ref)
            for port, _prio, h, _enq, _left, _start in got_ref:
                if rnd.random() < 0.3:  # egress added or removed bytes (INT)
                    booked = packets[h]
                    sent = max(1, booked + rnd.choice([-48, -12, 8, 12, 36, 200]))
                    ref.ports[port].resize(booked, sent)
                    nat.resize(port, booked, sent)
        elif r < 0.85:
            port = rnd.choice([*ports, None])
            bps = rnd.choice(rates) if rnd.random() < 0.8 else None
            pps = rnd.choice([0.0, 0.0, 1.0, 1e5, 3e6]) if rnd.random() < 0.3 else None
            ref.set_rate(port, pps, bps)
            nat.set_rate(port, now, pps, bps)
        elif r < 0.9:
            port = rnd.choice([*ports, None])
            pkts = rnd.choice([None, 0, 1, 4, 64, 1000])
            nbytes = rnd.choice([None, 0, 3000, 100_000])
            ref.set_depth(port, pkts, nbytes)
            nat.set_depth(port, pkts, nbytes)
        elif r < 0.95:
            port = rnd.choice(ports)
            delay = rnd.choice([None, 0, 0, 500, 20_000])
            factor = rnd.choice([None, 1.0, 1.0, 0.5, 0.1, 1 / 3])
            silent = rnd.choice([None, False, True])
            ref.set_fault(port, delay_ns=delay, rate_factor=factor, silent=silent)
            nat.set_fault(port, now, delay, factor, silent)
        elif r < 0.98:  # a downstream pause held or released (the reference's field)
            port, prio = rnd.choice(ports), rnd.randrange(nq)
            until = now + rnd.choice([0, 1000, 50_000])
            ref.port(port).pause_until[prio] = until
            nat.hold(port, prio, until)
        else:
            buf = rnd.choice([None, SharedBuffer(rnd.choice([5_000, 200_000]), 2.0)])
            ref.set_buffer(buf)
            nat.set_buffer(buf)
        assert ref.next_departure_ns() == nat.next_departure_ns(), (seed, "next departure")
        a, b = _state(ref, nat, ports)
        assert a == b, (seed, a, b)
    return departures


@pytest.mark.parametrize("seed", range(12))
def test_random_sequences_identical_on_both_traffic_managers(seed: int) -> None:
    assert run_sequence(seed, 600) > 0


def test_a_long_sequence_at_400g() -> None:
    """Many bookings at one rate: the carried fractions stay identical."""
    from testbed.switch.native.tm import NativeTrafficManager

    ref = TrafficManager(Clock(virtual=True), 1)
    nat = NativeTrafficManager(1)
    for tm in (ref,):
        tm.set_rate(None, None, 4e11)
    nat.set_rate(None, 0, None, 4e11)
    now = 0
    for i in range(5000):
        now += 13
        for port in (1, 2):
            assert ref.enqueue(port, 0, i, 1000 + i % 57, now) == nat.enqueue(
                port, 0, i, 1000 + i % 57, now
            )
        assert ref.dequeue_ready(now) == nat.dequeue_ready(now)
    assert ref.ports[1].tx_carry_ns == nat.tm.ports[1].tx_carry_ns
    assert ref.ports[2].next_tx_ns == nat.tm.ports[2].next_tx_ns
