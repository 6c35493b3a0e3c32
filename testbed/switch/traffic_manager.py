"""The traffic manager between ingress and egress: per-port, per-priority FIFO queues with a
configurable depth (packets and bytes) and drain rate (bits/s and packets/s), strict priority
between a port's queues, and a clock that is either real or virtual (for deterministic tests).

Defaults match bmv2's simple_switch: 64 packets deep, no rate limit, one queue per port.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any


class Clock:
    """Microseconds since the switch started; real time, or virtual when `virtual` is set
    (then time only moves through `advance`)."""

    def __init__(self, virtual: bool = False):
        self.virtual = virtual
        self._start = time.monotonic_ns()
        self.start_ns = self._start  # CLOCK_MONOTONIC at time zero
        self._virtual_ns = 0
        self._lock = threading.Lock()

    def now_ns(self) -> int:
        if self.virtual:
            return self._virtual_ns
        return time.monotonic_ns() - self._start

    def now_us(self) -> int:
        if self.virtual:
            return self._virtual_ns // 1000
        return (time.monotonic_ns() - self._start) // 1000

    def advance(self, ns: int) -> None:
        if not self.virtual:
            raise RuntimeError("advance() needs a virtual clock")
        with self._lock:
            self._virtual_ns += ns

    def advance_to(self, ns: int) -> None:
        if not self.virtual:
            raise RuntimeError("advance_to() needs a virtual clock")
        with self._lock:
            self._virtual_ns = max(self._virtual_ns, ns)


# What a queue may be set to. A rate is 0 (no limit) or within these bounds: below them one
# frame would hold the port for hours (and the loop's timers overflow), above them the model
# means nothing. Depths bound the memory a queue may hold.
MIN_RATE_BPS = 1_000.0
MAX_RATE_BPS = 1e13  # 10 Tb/s
MIN_RATE_PPS = 1.0
MAX_RATE_PPS = 1e10
MAX_DEPTH_PACKETS = 1 << 16
MAX_DEPTH_BYTES = 1 << 30
MAX_PORT = 511  # v1model's 9-bit port numbers
MAX_SERVICE_NS = 10**12  # 1000 s: more than a 64 KB frame takes at the lowest rate (524 s)
MAX_FAULT_DELAY_NS = 10**10  # 10 s: a fault's added delay
MIN_FAULT_RATE_FACTOR = 1e-3  # a port slowed to 0.1 % of its rate (0 would be `down`)


def check_queue_setting(port: int | None, pps: float | None = None, bps: float | None = None,
                        depth_pkts: int | None = None, depth_bytes: int | None = None) -> None:
    """Raise ValueError naming the first setting a queue cannot take."""
    if port is not None and not 0 <= port <= MAX_PORT:
        raise ValueError(f"port {port} is not in [0, {MAX_PORT}]")
    for name, v, lo, hi in (("rate_pps", pps, MIN_RATE_PPS, MAX_RATE_PPS),
                            ("rate_bps", bps, MIN_RATE_BPS, MAX_RATE_BPS)):
        if v is None:
            continue
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        if v != 0 and not lo <= v <= hi:
            raise ValueError(f"{name} must be 0 (no limit) or within [{lo:g}, {hi:g}], got {v:g}")
    if depth_pkts is not None and not 0 <= depth_pkts <= MAX_DEPTH_PACKETS:
        raise ValueError(f"depth_packets must be within [0, {MAX_DEPTH_PACKETS}], "
                         f"got {depth_pkts}")
    if depth_bytes is not None and not 0 <= depth_bytes <= MAX_DEPTH_BYTES:
        raise ValueError(f"depth_bytes must be within [0, {MAX_DEPTH_BYTES}] (0: no limit), "
                         f"got {depth_bytes}")


@dataclass
class PortFault:
    """An injected fault on a port (testbed/faults.py declares what each fault kind sets).
    The defaults are a healthy port.

    - down: the link is down: nothing is received on the port or queued for it, and what
      was queued is dropped (a real port loses its carrier; GetStatus reports it down).
    - loss: the probability that a frame arriving on the port was corrupted on the wire:
      the port counts it as a receive error (a MAC's FCS error) and drops it before ingress;
      the sender's egress counted it sent. A link fault sets both ends: both directions.
    - delay_ns: a frame may not leave before it has waited this long in the port's queue
      (it shows in the queue's latency, as a slow port or a slow switch would).
    - rate_factor: the port drains at this fraction of its configured rate.
    """

    down: bool = False
    loss: float = 0.0
    delay_ns: int = 0
    rate_factor: float = 1.0

    @property
    def healthy(self) -> bool:
        return self == PortFault()


def check_fault_setting(port: int | None, loss: float | None = None,
                        delay_ns: int | None = None,
                        rate_factor: float | None = None) -> None:
    """Raise ValueError naming the first fault setting a port cannot take."""
    if port is not None and not 0 <= port <= MAX_PORT:
        raise ValueError(f"port {port} is not in [0, {MAX_PORT}]")
    if loss is not None and not (math.isfinite(loss) and 0.0 <= loss <= 1.0):
        raise ValueError(f"loss must be a probability within [0, 1], got {loss}")
    if delay_ns is not None and not 0 <= delay_ns <= MAX_FAULT_DELAY_NS:
        raise ValueError(f"delay_ns must be within [0, {MAX_FAULT_DELAY_NS}], got {delay_ns}")
    if rate_factor is not None and not (math.isfinite(rate_factor)
                                        and MIN_FAULT_RATE_FACTOR <= rate_factor <= 1.0):
        raise ValueError(f"rate_factor must be within [{MIN_FAULT_RATE_FACTOR:g}, 1], "
                         f"got {rate_factor}")


@dataclass
class PortQueues:
    port: int
    nb_queues: int = 1
    depth_pkts: int = 64
    depth_bytes: int = 0  # 0: no byte limit
    rate_pps: float = 0.0  # 0: no limit
    rate_bps: float = 0.0  # 0: no limit
    # (packet, bytes, enqueue time, expected wait: what the bytes ahead take at the set rate)
    queues: list[deque[tuple[Any, int, int, int]]] = field(default_factory=list)
    qbytes: list[int] = field(default_factory=list)
    next_tx_ns: int = 0  # earliest time the port may start sending its next packet
    enqueued: int = 0
    dequeued: int = 0
    dropped: int = 0
    max_depth_pkts: int = 0
    max_depth_bytes: int = 0
    fault: PortFault = field(default_factory=PortFault)
    fault_drops: int = 0  # dropped because the port was down
    rx_errors: int = 0  # frames that arrived corrupted (a `loss` fault), dropped
    # The port's latency monitor, what INT's hop latency and queue occupancy say per packet,
    # summed: departures, their waits (enqueue to start of transmission) and the waits the
    # bytes ahead of them explain at the port's set rate. A healthy port waits what its queue
    # explains; a slow or delaying one waits longer.
    departures: int = 0
    wait_ns: int = 0
    expected_wait_ns: int = 0

    def __post_init__(self) -> None:
        self.queues = [deque() for _ in range(self.nb_queues)]
        self.qbytes = [0] * self.nb_queues

    def depth(self, prio: int) -> tuple[int, int]:
        return len(self.queues[prio]), self.qbytes[prio]

    def total(self) -> tuple[int, int]:
        return sum(len(q) for q in self.queues), sum(self.qbytes)

    def service_ns(self, nbytes: int) -> int:
        """How long the port is busy sending `nbytes` at its configured rate."""
        t = 0.0
        if self.rate_bps > 0:
            t = max(t, nbytes * 8e9 / self.rate_bps)
        if self.rate_pps > 0:
            t = max(t, 1e9 / self.rate_pps)
        return int(min(t / self.fault.rate_factor, MAX_SERVICE_NS))

    def head_ready_ns(self) -> int:
        """When the packet next in line may leave: its port is free and it has waited out a
        `delay` fault."""
        t = self.next_tx_ns
        if self.fault.delay_ns:
            for prio in range(self.nb_queues - 1, -1, -1):
                q = self.queues[prio]
                if q:
                    return max(t, q[0][2] + self.fault.delay_ns)
        return t


class TrafficManager:
    def __init__(self, clock: Clock, nb_queues: int = 1, depth_pkts: int = 64):
        self.clock = clock
        self.nb_queues = nb_queues
        self.default_depth_pkts = depth_pkts
        self.default_depth_bytes = 0
        self.default_rate_pps = 0.0
        self.default_rate_bps = 0.0
        self.ports: dict[int, PortQueues] = {}
        self._busy: set[int] = set()  # ports with at least one queued packet
        # draws of `loss` faults; seeded so that a run on a virtual clock repeats (the twin
        # reseeds it per switch)
        self.rng = random.Random(0)

    def port(self, port: int) -> PortQueues:
        pq = self.ports.get(port)
        if pq is None:
            pq = PortQueues(port, self.nb_queues, self.default_depth_pkts, self.default_depth_bytes,
                            self.default_rate_pps, self.default_rate_bps)
            self.ports[port] = pq
        return pq

    # ---- configuration (bmv2: set_queue_depth / set_queue_rate; here also bytes and bits) ----

    def set_depth(self, port: int | None, pkts: int | None = None,
                  nbytes: int | None = None) -> None:
        check_queue_setting(port, depth_pkts=pkts, depth_bytes=nbytes)
        for pq in self._targets(port):
            if pkts is not None:
                pq.depth_pkts = pkts
            if nbytes is not None:
                pq.depth_bytes = nbytes
        if port is None:
            if pkts is not None:
                self.default_depth_pkts = pkts
            if nbytes is not None:
                self.default_depth_bytes = nbytes

    def set_rate(self, port: int | None, pps: float | None = None,
                 bps: float | None = None) -> None:
        check_queue_setting(port, pps=pps, bps=bps)
        now = self.clock.now_ns()
        for pq in self._targets(port):
            if pps is not None:
                pq.rate_pps = pps
            if bps is not None:
                pq.rate_bps = bps
            # the port was booked at the old rate: a new rate applies from now on (a port
            # slowed to a crawl and restored must not wait out the crawl's booking)
            pq.next_tx_ns = min(pq.next_tx_ns, now)
        if port is None:
            if pps is not None:
                self.default_rate_pps = pps
            if bps is not None:
                self.default_rate_bps = bps

    def set_fault(self, port: int | None, down: bool | None = None, loss: float | None = None,
                  delay_ns: int | None = None, rate_factor: float | None = None) -> None:
        """Inject (or, with the healthy values, remove) a fault on one port or on every port
        the traffic manager has seen; settings left None keep their value."""
        check_fault_setting(port, loss, delay_ns, rate_factor)
        now = self.clock.now_ns()
        for pq in self._targets(port):
            f = pq.fault
            if down is not None:
                f.down = down
            if loss is not None:
                f.loss = loss
            if delay_ns is not None:
                f.delay_ns = delay_ns
            if rate_factor is not None:
                f.rate_factor = rate_factor
                pq.next_tx_ns = min(pq.next_tx_ns, now)  # as set_rate: from now on
            if f.down:  # what waited for a dead link is lost
                for prio, q in enumerate(pq.queues):
                    pq.fault_drops += len(q)
                    q.clear()
                    pq.qbytes[prio] = 0
                self._busy.discard(pq.port)

    def port_down(self, port: int) -> bool:
        pq = self.ports.get(port)
        return pq is not None and pq.fault.down

    def corrupted(self, port: int) -> bool:
        """Whether a frame arriving on the port now was corrupted by a `loss` fault (counted
        as a receive error)."""
        pq = self.ports.get(port)
        if pq is None or not pq.fault.loss or self.rng.random() >= pq.fault.loss:
            return False
        pq.rx_errors += 1
        return True

    def _targets(self, port: int | None) -> list[PortQueues]:
        return list(self.ports.values()) if port is None else [self.port(port)]

    # ---- data path ------------------------------------------------------------------------

    def occupancy(self, port: int, prio: int) -> tuple[int, int]:
        pq = self.ports.get(port)
        return (0, 0) if pq is None else pq.depth(prio)

    def enqueue(self, port: int, prio: int, pkt: Any, nbytes: int,
                now_ns: int) -> tuple[int, int] | None:
        """Queue a packet; returns the queue's (packets, bytes) found on arrival, or None when
        the queue is full (a counted tail drop)."""
        pq = self.ports.get(port) or self.port(port)
        q = pq.queues[prio]
        n, b = len(q), pq.qbytes[prio]
        if n >= pq.depth_pkts or (pq.depth_bytes and b + nbytes > pq.depth_bytes):
            pq.dropped += 1
            return None
        expected = max(0, pq.next_tx_ns - now_ns) if port in self._busy else 0
        if pq.rate_bps > 0:
            expected += int(b * 8e9 / pq.rate_bps)
        q.append((pkt, nbytes, now_ns, expected))
        pq.qbytes[prio] = b + nbytes
        pq.enqueued += 1
        if n >= pq.max_depth_pkts:
            pq.max_depth_pkts = n + 1
        if b + nbytes > pq.max_depth_bytes:
            pq.max_depth_bytes = b + nbytes
        self._busy.add(port)
        return n, b

    def next_departure_ns(self) -> int | None:
        """When the next packet may leave (None: nothing queued)."""
        best = None
        for port in self._busy:
            t = self.ports[port].head_ready_ns()
            if best is None or t < best:
                best = t
        return best

    def dequeue_ready(self, now_ns: int) -> list[tuple[int, int, Any, int, int, int]]:
        """Every packet whose port is free at `now_ns`, one per port per round, in time order;
        each departure books the port for the packet's transmission time. Items are
        (port, priority, packet, enqueue time, packets left in its queue, departure time)."""
        out: list[tuple[int, int, Any, int, int, int]] = []
        busy = self._busy
        while busy:
            progressed = False
            ports = sorted(busy, key=lambda p: self.ports[p].next_tx_ns) if len(busy) > 1 \
                else list(busy)
            for port in ports:
                pq = self.ports[port]
                if pq.next_tx_ns > now_ns:
                    continue
                queues = pq.queues
                delay = pq.fault.delay_ns
                for prio in range(pq.nb_queues - 1, -1, -1):  # strict priority: high first
                    q = queues[prio]
                    if q:
                        if delay and q[0][2] + delay > now_ns:
                            break  # the head still serves its delay: the port waits
                        pkt, nbytes, enq_ns, expected = q.popleft()
                        pq.qbytes[prio] -= nbytes
                        pq.dequeued += 1
                        # the port is busy from when it became free (or the packet came) for
                        # one packet time at its rate
                        ready = enq_ns + delay
                        start = pq.next_tx_ns if pq.next_tx_ns > ready else ready
                        done = start
                        if pq.rate_bps or pq.rate_pps:
                            done += pq.service_ns(nbytes)
                        pq.next_tx_ns = done
                        pq.departures += 1
                        pq.wait_ns += start - enq_ns
                        pq.expected_wait_ns += expected
                        out.append((port, prio, pkt, enq_ns, len(q), start))
                        progressed = True
                        break
                if not any(queues):
                    busy.discard(port)
            if not progressed:
                break
        return out
