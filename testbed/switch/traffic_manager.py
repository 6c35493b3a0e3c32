"""The traffic manager between ingress and egress: per-port, per-priority FIFO queues with a
configurable depth (packets and bytes) and drain rate (bits/s and packets/s), strict priority
between a port's queues, and a clock that is either real or virtual (for deterministic tests).

Defaults match bmv2's simple_switch: 64 packets deep, no rate limit, one queue per port.

With a shared buffer (`set_buffer`), as a switch ASIC has one, the queues' static depths give
way to a dynamic threshold (Choudhury and Hahne's, as Broadcom's and NVIDIA's parts and SONiC's
`dynamic_th` configure it): a packet joins its queue while the queue holds at most `alpha`
times the buffer still free, so one congested queue may take alpha / (1 + alpha) of the
buffer alone and several share it. A packet of a lossless priority under PFC is not held to
the threshold (PFC keeps it from overflowing); no packet is admitted past the buffer's size.

With PFC on (`set_pfc`, testbed/switch/pfc.py) it also counts each packet against the port and
priority it came in on, pauses and resumes that port's upstream device with 802.1Qbb frames
(`send_control`), holds a priority of an egress port while the downstream device's pause
lasts (`receive_pause`), and runs the PFC watchdog. The PFC priorities are the queue
priorities (standard_metadata.priority). bmv2 has none of this.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from controller.wire.pfc import PfcPause, pause_ns, pfc_frame
from testbed.switch.drop_reports import REPORT_GAP_BYTES
from testbed.switch.pfc import PfcConfig, PfcPortCounters, PfcQueueState, WatchdogConfig


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
            if ns > self._virtual_ns:
                self._virtual_ns = ns


# What a queue may be set to. A rate is 0 (no limit) or within these bounds: below them one
# frame would hold the port for hours (and the loop's timers overflow), above them the model
# means nothing. Depths bound the memory a queue may hold.
MIN_RATE_BPS = 1_000.0
MAX_RATE_BPS = 1e13  # 10 Tb/s
MIN_RATE_PPS = 1.0
MAX_RATE_PPS = 1e10
MAX_DEPTH_PACKETS = 1 << 16
MAX_DEPTH_BYTES = 1 << 30
MAX_BUFFER_BYTES = 1 << 34  # 16 GiB: above any switch's buffer
MIN_ALPHA = 1 / 128  # SAI's dynamic-threshold range: alpha 1/128 to 64
MAX_ALPHA = 64.0
MAX_PORT = 511  # v1model's 9-bit port numbers
MAX_SERVICE_NS = 10**12  # 1000 s: more than a 64 KB frame takes at the lowest rate (524 s)
MAX_FAULT_DELAY_NS = 10**10  # 10 s: a fault's added delay
MIN_FAULT_RATE_FACTOR = 1e-3  # a port slowed to 0.1 % of its rate (0 would be `down`)


def check_queue_setting(
    port: int | None,
    pps: float | None = None,
    bps: float | None = None,
    depth_pkts: int | None = None,
    depth_bytes: int | None = None,
) -> None:
    """Raise ValueError naming the first setting a queue cannot take."""
    if port is not None and not 0 <= port <= MAX_PORT:
        raise ValueError(f"port {port} is not in [0, {MAX_PORT}]")
    for name, v, lo, hi in (
        ("rate_pps", pps, MIN_RATE_PPS, MAX_RATE_PPS),
        ("rate_bps", bps, MIN_RATE_BPS, MAX_RATE_BPS),
    ):
        if v is None:
            continue
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        if v != 0 and not lo <= v <= hi:
            raise ValueError(f"{name} must be 0 (no limit) or within [{lo:g}, {hi:g}], got {v:g}")
    if depth_pkts is not None and not 0 <= depth_pkts <= MAX_DEPTH_PACKETS:
        raise ValueError(f"depth_packets must be within [0, {MAX_DEPTH_PACKETS}], got {depth_pkts}")
    if depth_bytes is not None and not 0 <= depth_bytes <= MAX_DEPTH_BYTES:
        raise ValueError(
            f"depth_bytes must be within [0, {MAX_DEPTH_BYTES}] (0: no limit), got {depth_bytes}"
        )


@dataclass(frozen=True)
class SharedBuffer:
    """One packet buffer shared by every queue of the switch: `bytes` in all, a queue
    admitting a packet while it holds at most `alpha` times what is free."""

    bytes: int
    alpha: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.bytes <= MAX_BUFFER_BYTES:
            raise ValueError(f"a shared buffer must be within [1, {MAX_BUFFER_BYTES}] bytes")
        if not (math.isfinite(self.alpha) and MIN_ALPHA <= self.alpha <= MAX_ALPHA):
            raise ValueError(
                f"a buffer's alpha must be within [{MIN_ALPHA:g}, {MAX_ALPHA:g}], got {self.alpha}"
            )


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
    - silent: no counter of the switch records the fault (a bad buffer, a misbehaving optic):
      a lost frame is not counted as a receive error (only in `silent_drops`, which no API
      reports as the port's), and the port's latency monitor expects the waits of the
      degraded rate, as if the port had been set to it. End hosts' signals can find it.
    """

    down: bool = False
    loss: float = 0.0
    delay_ns: int = 0
    rate_factor: float = 1.0
    silent: bool = False

    @property
    def healthy(self) -> bool:
        return self == PortFault()


def check_fault_setting(
    port: int | None,
    loss: float | None = None,
    delay_ns: int | None = None,
    rate_factor: float | None = None,
) -> None:
    """Raise ValueError naming the first fault setting a port cannot take."""
    if port is not None and not 0 <= port <= MAX_PORT:
        raise ValueError(f"port {port} is not in [0, {MAX_PORT}]")
    if loss is not None and not (math.isfinite(loss) and 0.0 <= loss <= 1.0):
        raise ValueError(f"loss must be a probability within [0, 1], got {loss}")
    if delay_ns is not None and not 0 <= delay_ns <= MAX_FAULT_DELAY_NS:
        raise ValueError(f"delay_ns must be within [0, {MAX_FAULT_DELAY_NS}], got {delay_ns}")
    if rate_factor is not None and not (
        math.isfinite(rate_factor) and MIN_FAULT_RATE_FACTOR <= rate_factor <= 1.0
    ):
        raise ValueError(
            f"rate_factor must be within [{MIN_FAULT_RATE_FACTOR:g}, 1], got {rate_factor}"
        )


@dataclass
class PortQueues:
    port: int
    nb_queues: int = 1
    depth_pkts: int = 64
    depth_bytes: int = 0  # 0: no byte limit
    rate_pps: float = 0.0  # 0: no limit
    rate_bps: float = 0.0  # 0: no limit
    # (packet, bytes, enqueue time, expected wait: what the bytes ahead take at the set rate,
    # the ingress port PFC counts it against or -1)
    queues: list[deque[tuple[Any, int, int, int, int]]] = field(default_factory=list)
    qbytes: list[int] = field(default_factory=list)
    next_tx_ns: int = 0  # earliest time the port may start sending its next packet
    # the fraction of a nanosecond the bookings so far left over: carried into the next, so
    # the port sends at exactly its rate over time (rounding each frame's time down would
    # send up to 1 ns per frame faster: 1.2 % at 400G)
    tx_carry_ns: float = 0.0
    # the span of the port's transmissions since it was set up: the first departure's start
    # and the end of the last one (-1: none yet). Bytes sent / rate never exceeds it.
    first_tx_ns: int = -1
    last_tx_end_ns: int = -1
    enqueued: int = 0
    dequeued: int = 0
    dropped: int = 0
    max_depth_pkts: int = 0
    max_depth_bytes: int = 0
    fault: PortFault = field(default_factory=PortFault)
    fault_drops: int = 0  # dropped because the port was down
    rx_errors: int = 0  # frames that arrived corrupted (a `loss` fault), dropped
    silent_drops: int = 0  # frames a silent `loss` fault dropped (the fault's ground truth)
    # The port's latency monitor, what INT's hop latency and queue occupancy say per packet,
    # summed: departures, their waits (enqueue to start of transmission) and the waits the
    # bytes ahead of them explain at the port's set rate. A healthy port waits what its queue
    # explains; a slow or delaying one waits longer.
    departures: int = 0
    wait_ns: int = 0
    expected_wait_ns: int = 0
    # PFC: until when each priority's egress is held by the downstream's pause, departures
    # per priority (the watchdog's), and the port's pause counters and per-priority state
    pause_until: list[int] = field(default_factory=list)
    dequeued_prio: list[int] = field(default_factory=list)
    pfc: PfcPortCounters = field(default_factory=PfcPortCounters)

    def __post_init__(self) -> None:
        self.queues = [deque() for _ in range(self.nb_queues)]
        self.qbytes = [0] * self.nb_queues
        self.pause_until = [0] * self.nb_queues
        self.dequeued_prio = [0] * self.nb_queues

    def depth(self, prio: int) -> tuple[int, int]:
        return len(self.queues[prio]), self.qbytes[prio]

    def total(self) -> tuple[int, int]:
        return sum(len(q) for q in self.queues), sum(self.qbytes)

    def service_ns(self, nbytes: int) -> float:
        """How long the port is busy sending `nbytes` at its configured rate (ns, exact)."""
        t = 0.0
        if self.rate_bps > 0:
            t = max(t, nbytes * 8e9 / self.rate_bps)
        if self.rate_pps > 0:
            t = max(t, 1e9 / self.rate_pps)
        return min(t / self.fault.rate_factor, MAX_SERVICE_NS)

    def book_ns(self, t: float) -> int:
        """Whole nanoseconds of the port's time for `t` ns more (may be negative: a
        correction), the fraction carried to the next booking."""
        acc = self.tx_carry_ns + t
        whole = math.floor(acc)
        self.tx_carry_ns = acc - whole
        return whole

    def resize(self, booked_bytes: int, sent_bytes: int) -> None:
        """The frame booked at `booked_bytes` left the egress pipeline as `sent_bytes` (INT
        metadata added, or taken off by a sink): the port is busy for what it really sends."""
        if self.rate_pps or not self.rate_bps:
            if not self.rate_pps:
                return  # no rate: nothing was booked
            extra = self.service_ns(sent_bytes) - self.service_ns(booked_bytes)
        else:  # the common case, per packet: a byte rate alone, the difference directly
            extra = (sent_bytes - booked_bytes) * 8e9 / (self.rate_bps * self.fault.rate_factor)
        acc = self.tx_carry_ns + extra
        whole = math.floor(acc)
        self.tx_carry_ns = acc - whole
        self.next_tx_ns += whole
        self.last_tx_end_ns = self.next_tx_ns

    def head_ready_ns(self) -> int:
        """When the packet next in line may leave: its port is free, it has waited out a
        `delay` fault and its priority is not paused."""
        t = self.next_tx_ns
        delay = self.fault.delay_ns
        if not delay and max(self.pause_until) <= t:
            return t
        best: int | None = None
        for prio in range(self.nb_queues - 1, -1, -1):
            q = self.queues[prio]
            if q:
                r = max(t, self.pause_until[prio], q[0][2] + delay if delay else 0)
                if best is None or r < best:
                    best = r
                if not delay:
                    continue
                break  # a delayed head holds the port (dequeue_ready waits for it)
        return t if best is None else best


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
        self.rx_faults: set[int] = set()  # ports whose arriving frames a fault stops (down, loss)
        # draws of `loss` faults; seeded so that a run on a virtual clock repeats (the twin
        # reseeds it per switch)
        self.rng = random.Random(0)
        # PFC (off: None) and its watchdog; the driver sets how MAC Control frames leave a
        # port (ahead of the port's queues, as a MAC sends them) and each port's MAC address
        self.pfc: PfcConfig | None = None
        self.watchdog: WatchdogConfig | None = None
        self.send_control: Callable[[int, bytes], None] = lambda port, frame: None
        self.port_mac: Callable[[int], bytes] = lambda port: bytes(6)
        self.last_drop = ""  # why the last enqueue returned None: queue_full / pfc_watchdog
        self._pausing: set[tuple[int, int]] = set()  # (ingress port, prio) held paused
        self._wd_next_ns: int | None = None
        self._wd_last_ns = 0
        # the shared buffer (None: each queue's static depth) and what every queue holds
        self.buffer: SharedBuffer | None = None
        self.buffered_bytes = 0
        # PFC's dynamic threshold: the ingress bytes above each (port, priority)'s reserve
        self._pfc_shared_used = 0
        # drop reports' pacing (testbed/switch/drop_reports.py): when a drop of each (port,
        # reason) was last reported, and the drops held back within the gap after one
        self._report_ns: dict[tuple[int, int], int] = {}
        self.reports_held = 0

    def set_buffer(self, buffer: SharedBuffer | None) -> None:
        """Share one buffer among every queue with a dynamic threshold, or (None) hold each
        queue to its static depth. What is queued stays; the rule applies to new arrivals."""
        self.buffer = buffer

    def port(self, port: int) -> PortQueues:
        pq = self.ports.get(port)
        if pq is None:
            pq = PortQueues(
                port,
                self.nb_queues,
                self.default_depth_pkts,
                self.default_depth_bytes,
                self.default_rate_pps,
                self.default_rate_bps,
            )
            self.ports[port] = pq
        return pq

    # ---- configuration (bmv2: set_queue_depth / set_queue_rate; here also bytes and bits) ----

    def set_depth(
        self, port: int | None, pkts: int | None = None, nbytes: int | None = None
    ) -> None:
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

    def set_rate(
        self, port: int | None, pps: float | None = None, bps: float | None = None
    ) -> None:
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

    def set_fault(
        self,
        port: int | None,
        down: bool | None = None,
        loss: float | None = None,
        delay_ns: int | None = None,
        rate_factor: float | None = None,
        silent: bool | None = None,
    ) -> None:
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
            if silent is not None:
                f.silent = silent
            if rate_factor is not None:
                f.rate_factor = rate_factor
                pq.next_tx_ns = min(pq.next_tx_ns, now)  # as set_rate: from now on
            if f.down or f.loss:
                self.rx_faults.add(pq.port)
            else:
                self.rx_faults.discard(pq.port)
            if f.down:  # what waited for a dead link is lost
                pq.fault_drops += sum(len(q) for q in pq.queues)
                for prio in range(pq.nb_queues):
                    self._flush(pq, prio, now)
                self._busy.discard(pq.port)

    def port_down(self, port: int) -> bool:
        pq = self.ports.get(port)
        return pq is not None and pq.fault.down

    def corrupted(self, port: int) -> bool:
        """Whether a frame arriving on the port now was corrupted by a `loss` fault (counted
        as a receive error)."""
        pq = self.ports.get(port)
        if pq is None or not pq.fault.loss or self._draw() >= pq.fault.loss:
            return False
        if pq.fault.silent:
            pq.silent_drops += 1
        else:
            pq.rx_errors += 1
        return True

    def report_held(self, port: int, reason: int, now_ns: int) -> bool:
        """Whether a drop on `port` for `reason` (a Telemetry Report drop reason) falls within
        the gap after the last one reported there (REPORT_GAP_BYTES at the port's rate, 1 ms
        with none): held back, and counted."""
        last = self._report_ns.get((port, reason))
        if last is None:
            return False
        pq = self.ports.get(port)
        rate = pq.rate_bps if pq is not None and pq.rate_bps > 0 else 0.0
        gap = int(REPORT_GAP_BYTES * 8e9 / rate) if rate else 1_000_000
        if now_ns - last >= gap:
            return False
        self.reports_held += 1
        return True

    def drop_reported(self, port: int, reason: int, now_ns: int) -> None:
        """A drop on `port` for `reason` was reported at `now_ns`: the gap starts again."""
        self._report_ns[(port, reason)] = now_ns

    def _draw(self) -> float:
        """The next draw of the `loss` faults' generator."""
        return self.rng.random()

    def _targets(self, port: int | None) -> list[PortQueues]:
        return list(self.ports.values()) if port is None else [self.port(port)]

    # ---- data path ------------------------------------------------------------------------

    def occupancy(self, port: int, prio: int) -> tuple[int, int]:
        pq = self.ports.get(port)
        return (0, 0) if pq is None else pq.depth(prio)

    def enqueue(
        self, port: int, prio: int, pkt: Any, nbytes: int, now_ns: int, ingress_port: int = -1
    ) -> tuple[int, int] | None:
        """Queue a packet; returns the queue's (packets, bytes) found on arrival, or None when
        the queue is full (a counted tail drop) or the PFC watchdog drops the queue's
        packets (`last_drop` says which). With PFC on, a packet of a lossless priority counts
        against `ingress_port` (-1: none, as for clones) until it leaves."""
        pq = self.ports.get(port) or self.port(port)
        q = pq.queues[prio]
        n, b = len(q), pq.qbytes[prio]
        pfc = self.pfc
        if pfc is not None and pq.pfc.per_prio:
            st = pq.pfc.per_prio.get(prio)
            if (
                st is not None
                and st.storm
                and self.watchdog is not None
                and self.watchdog.action == "drop"
            ):
                pq.pfc.watchdog_drops += 1
                self.last_drop = "pfc_watchdog"
                return None
        buf = self.buffer
        if buf is None:
            full = n >= pq.depth_pkts or (pq.depth_bytes and b + nbytes > pq.depth_bytes)
        else:
            used = self.buffered_bytes + nbytes
            full = used > buf.bytes or n >= MAX_DEPTH_PACKETS
            if not full and (pfc is None or prio not in pfc.priorities):
                full = b + nbytes > buf.alpha * (buf.bytes - self.buffered_bytes)
        if full:
            pq.dropped += 1
            self.last_drop = "queue_full"
            return None
        expected = max(0, pq.next_tx_ns - now_ns) if port in self._busy else 0
        if pq.rate_bps > 0:
            # what the queue ahead explains at the port's rate (a silent fault's port believes
            # its degraded rate is its rate)
            rate = pq.rate_bps * pq.fault.rate_factor if pq.fault.silent else pq.rate_bps
            expected += int(b * 8e9 / rate)
        if pfc is not None:
            # the latency monitor: time this priority is paused while the packet waits is
            # explained (by the downstream), counted from here to its departure
            expected -= self._paused_cum(pq, prio, now_ns)
        if pfc is None or ingress_port < 0 or prio not in pfc.priorities:
            ingress_port = -1
        q.append((pkt, nbytes, now_ns, expected, ingress_port))
        if ingress_port >= 0:
            self._count_in(ingress_port, prio, nbytes, now_ns)
        pq.qbytes[prio] = b + nbytes
        self.buffered_bytes += nbytes
        pq.enqueued += 1
        if n >= pq.max_depth_pkts:
            pq.max_depth_pkts = n + 1
        if b + nbytes > pq.max_depth_bytes:
            pq.max_depth_bytes = b + nbytes
        self._busy.add(port)
        return n, b

    def next_departure_ns(self) -> int | None:
        """When the traffic manager next needs service: a packet may leave, a pause must be
        refreshed or the PFC watchdog polls (None: nothing to do)."""
        best = None
        for port in self._busy:
            t = self.ports[port].head_ready_ns()
            if best is None or t < best:
                best = t
        if self.pfc is not None:
            for t in self._pfc_timers():
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
            # ports free at the same time go in port order: a tie order defined by the
            # state, not by how a Python set happens to iterate (the native code's too)
            ports = (
                sorted(busy, key=lambda p: (self.ports[p].next_tx_ns, p))
                if len(busy) > 1
                else list(busy)
            )
            for port in ports:
                pq = self.ports[port]
                if pq.next_tx_ns > now_ns:
                    continue
                queues = pq.queues
                delay = pq.fault.delay_ns
                paused = pq.pause_until
                for prio in range(pq.nb_queues - 1, -1, -1):  # strict priority: high first
                    q = queues[prio]
                    if q:
                        if paused[prio] > now_ns:
                            continue  # the downstream paused this priority: the next one
                        if delay and q[0][2] + delay > now_ns:
                            break  # the head still serves its delay: the port waits
                        pkt, nbytes, enq_ns, expected, in_port = q.popleft()
                        pq.qbytes[prio] -= nbytes
                        self.buffered_bytes -= nbytes
                        pq.dequeued += 1
                        pq.dequeued_prio[prio] += 1
                        if in_port >= 0:
                            self._count_out(in_port, prio, nbytes, now_ns)
                        # the port is busy from when it became free (or the packet came, or
                        # its pause ended) for one packet time at its rate
                        ready = enq_ns + delay
                        if paused[prio] > ready:
                            ready = paused[prio]
                        start = pq.next_tx_ns if pq.next_tx_ns > ready else ready
                        done = start
                        if pq.rate_bps and not pq.rate_pps:  # per packet: inlined
                            t = nbytes * 8e9 / (pq.rate_bps * pq.fault.rate_factor)
                            acc = pq.tx_carry_ns + (t if t < MAX_SERVICE_NS else MAX_SERVICE_NS)
                            whole = int(acc)  # acc >= 0: its floor
                            pq.tx_carry_ns = acc - whole
                            done += whole
                        elif pq.rate_pps:
                            done += pq.book_ns(pq.service_ns(nbytes))
                        pq.next_tx_ns = done
                        if pq.first_tx_ns < 0:
                            pq.first_tx_ns = start
                        pq.last_tx_end_ns = done
                        pq.departures += 1
                        pq.wait_ns += start - enq_ns
                        if self.pfc is not None:
                            expected = max(0, expected + self._paused_cum(pq, prio, start))
                        pq.expected_wait_ns += expected
                        out.append((port, prio, pkt, enq_ns, len(q), start))
                        progressed = True
                        break
                if not any(queues):
                    busy.discard(port)
            if not progressed:
                break
        return out

    # ---- PFC ------------------------------------------------------------------------------

    def set_pfc(self, pfc: PfcConfig | None, watchdog: WatchdogConfig | None = None) -> None:
        """Turn PFC on with these thresholds (and the watchdog, if given), or off (None): off,
        every pause this switch holds is released (a resume sent) and received pauses are
        forgotten."""
        now = self.clock.now_ns()
        if pfc is None:
            for port, prio in sorted(self._pausing):
                self._send_pause(port, prio, 0)
                self.ports[port].pfc.state(prio).pausing = False
            for pq in self.ports.values():
                for prio, st in pq.pfc.per_prio.items():
                    self._set_pause(pq, prio, st, now, now)
                    st.ingress_bytes = 0
                    st.storm = False
            self._pausing.clear()
            self._wd_next_ns = None
        self.pfc = pfc
        reserve = pfc.reserve_bytes if pfc is not None else 0
        self._pfc_shared_used = sum(
            max(0, st.ingress_bytes - reserve)
            for pq in self.ports.values()
            for st in pq.pfc.per_prio.values()
        )
        self.watchdog = watchdog if pfc is not None else None
        if self.watchdog is None:
            self._wd_next_ns = None  # no watchdog: no poll due (a new one starts at a pause)

    def receive_pause(self, port: int, pause: PfcPause, now_ns: int) -> bool:
        """A PFC frame arrived on `port`: hold (or, with time 0, release) its egress on each
        lossless priority it names. False when PFC is off: the frame is not honoured."""
        pfc = self.pfc
        if pfc is None:
            return False
        pq = self.port(port)
        rate = pq.rate_bps * pq.fault.rate_factor or pfc.link_bps
        counted = False
        for prio in pause.priorities():
            if prio not in pfc.priorities or prio >= pq.nb_queues:
                continue
            st = pq.pfc.state(prio)
            st.last_pause_rx_ns = now_ns
            q = pause.quanta[prio]
            if not counted:
                if q:
                    pq.pfc.pauses_received += 1
                else:
                    pq.pfc.resumes_received += 1
                counted = True
            if st.storm:
                continue  # the watchdog ignores pauses on a storming queue
            until = now_ns + pause_ns(q, rate) if q and rate > 0 else now_ns
            self._set_pause(pq, prio, st, now_ns, until)
        if counted and self.watchdog is not None and self._wd_next_ns is None:
            self._wd_next_ns = now_ns + self.watchdog.poll_ns
            self._wd_last_ns = now_ns
        return True

    def pfc_tick(self, now_ns: int) -> None:
        """Refresh the pauses this switch holds before they expire; poll the watchdog."""
        pfc = self.pfc
        if pfc is None:
            return
        for port, prio in sorted(self._pausing):
            st = self.ports[port].pfc.state(prio)
            if now_ns >= st.xoff_sent_ns + self._refresh_ns(port):
                self._send_pause(port, prio, pfc.quanta)
                st.xoff_sent_ns = now_ns
        if self._wd_next_ns is not None and now_ns >= self._wd_next_ns:
            self._watchdog_poll(now_ns)

    def pfc_drops(self) -> int:
        return sum(pq.pfc.watchdog_drops for pq in self.ports.values())

    @staticmethod
    def _paused_cum(pq: PortQueues, prio: int, now_ns: int) -> int:
        """The time a port's priority has been paused so far."""
        st = pq.pfc.per_prio.get(prio)
        if st is None:
            return 0
        if st.paused_since_ns is None:
            return st.paused_ns
        return st.paused_ns + max(0, min(now_ns, st.paused_until_ns) - st.paused_since_ns)

    def _refresh_ns(self, port: int) -> int:
        assert self.pfc is not None
        pq = self.ports[port]
        rate = pq.rate_bps * pq.fault.rate_factor or self.pfc.link_bps
        return max(1, pause_ns(self.pfc.quanta, rate) // 2) if rate > 0 else 1 << 62

    def _pfc_timers(self) -> list[int]:
        out = [
            self.ports[port].pfc.state(prio).xoff_sent_ns + self._refresh_ns(port)
            for port, prio in self._pausing
        ]
        if self._wd_next_ns is not None:
            out.append(self._wd_next_ns)
        return out

    def _pfc_threshold(self) -> float:
        """The bytes above its reserve a (port, priority) may hold before it pauses: static,
        or the dynamic share of the shared pool still free (as HPCC's simulator computes
        it, `(buffer - headroom - reserve - shared used) >> shift`)."""
        pfc = self.pfc
        assert pfc is not None
        if not pfc.alpha:
            return pfc.xoff_bytes
        return pfc.alpha * max(0, pfc.pool_bytes - self._pfc_shared_used)

    def _count_in(self, port: int, prio: int, nbytes: int, now_ns: int) -> None:
        pfc = self.pfc
        assert pfc is not None
        st = self.port(port).pfc.state(prio)
        before = max(0, st.ingress_bytes - pfc.reserve_bytes)
        st.ingress_bytes += nbytes
        shared = max(0, st.ingress_bytes - pfc.reserve_bytes)
        self._pfc_shared_used += shared - before
        if not st.pausing and shared >= self._pfc_threshold():
            st.pausing = True
            st.xoff_sent_ns = now_ns
            self._pausing.add((port, prio))
            self._send_pause(port, prio, pfc.quanta)

    def _count_out(self, port: int, prio: int, nbytes: int, now_ns: int) -> None:
        st = self.ports[port].pfc.state(prio)
        pfc = self.pfc
        reserve = pfc.reserve_bytes if pfc is not None else 0
        before = max(0, st.ingress_bytes - reserve)
        st.ingress_bytes -= nbytes
        shared = max(0, st.ingress_bytes - reserve)
        self._pfc_shared_used += shared - before
        if not st.pausing or pfc is None:
            return
        if (
            st.ingress_bytes <= pfc.xon_bytes
            if not pfc.alpha
            else shared == 0 or shared + pfc.resume_offset_bytes <= self._pfc_threshold()
        ):
            st.pausing = False
            self._pausing.discard((port, prio))
            self._send_pause(port, prio, 0)

    def _send_pause(self, port: int, prio: int, quanta: int) -> None:
        c = self.port(port).pfc
        if quanta:
            c.xoff_sent += 1
        else:
            c.xon_sent += 1
        self.send_control(port, pfc_frame(self.port_mac(port), {prio: quanta}))

    @staticmethod
    def _set_pause(
        pq: PortQueues, prio: int, st: PfcQueueState, now_ns: int, until_ns: int
    ) -> None:
        """Hold the priority until `until_ns` (now: release it), closing the paused time
        counted so far."""
        if st.paused_since_ns is not None:
            st.paused_ns += max(0, min(now_ns, st.paused_until_ns) - st.paused_since_ns)
            st.paused_since_ns = None
        st.paused_until_ns = until_ns
        if until_ns > now_ns:
            st.paused_since_ns = now_ns
        if prio < pq.nb_queues:
            pq.pause_until[prio] = until_ns

    def _flush(self, pq: PortQueues, prio: int, now_ns: int) -> int:
        """Drop every packet of one queue (releasing what PFC counted of them)."""
        q = pq.queues[prio]
        n = len(q)
        for _pkt, nbytes, _enq, _exp, in_port in q:
            if in_port >= 0:
                self._count_out(in_port, prio, nbytes, now_ns)
        q.clear()
        self.buffered_bytes -= pq.qbytes[prio]
        pq.qbytes[prio] = 0
        if not any(pq.queues):
            self._busy.discard(pq.port)
        return n

    def _watchdog_poll(self, now_ns: int) -> None:
        wd = self.watchdog
        assert wd is not None
        active = False
        since = self._wd_last_ns
        for pq in self.ports.values():
            for prio, st in pq.pfc.per_prio.items():
                if st.storm:
                    quiet = st.last_pause_rx_ns is None or st.last_pause_rx_ns < since
                    st.wd_quiet_polls = st.wd_quiet_polls + 1 if quiet else 0
                    if st.wd_quiet_polls >= wd.restore_polls:
                        st.storm = False
                        st.wd_stalled_polls = 0
                        pq.pfc.restored += 1
                    else:
                        active = True
                else:
                    sent = pq.dequeued_prio[prio]
                    # paused, packets waiting, the port idle (not sending a long frame) and
                    # nothing sent since the last poll
                    stalled = (
                        pq.pause_until[prio] > now_ns
                        and bool(pq.queues[prio])
                        and pq.next_tx_ns <= now_ns
                        and sent == st.wd_seen_dequeued
                    )
                    st.wd_stalled_polls = st.wd_stalled_polls + 1 if stalled else 0
                    if st.wd_stalled_polls >= wd.detect_polls:
                        st.storm = True
                        st.wd_quiet_polls = 0
                        pq.pfc.storms += 1
                        self._set_pause(pq, prio, st, now_ns, now_ns)  # pauses ignored
                        if wd.action == "drop":
                            pq.pfc.watchdog_drops += self._flush(pq, prio, now_ns)
                        active = True
                    elif pq.pause_until[prio] > now_ns:
                        active = True
                st.wd_seen_dequeued = pq.dequeued_prio[prio]
        self._wd_last_ns = now_ns
        self._wd_next_ns = now_ns + wd.poll_ns if active else None
