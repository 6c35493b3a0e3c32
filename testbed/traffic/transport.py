"""The transport's socket runner: one host's `TransportCore` over raw IPv4 sockets.

One `Transport` per host (network namespace), single-threaded: the application drives it with
`run_until()`, or, between its polls, `run_steps()` (the native core's steps in C). The
protocol (queue pairs, go-back-N, ACK/NAK/CNP, INT echo) is testbed.traffic.transport_core,
shared with the simulated twin; this module only moves its packets through sockets and its
timers through `time.monotonic()` and `select`.

There is no pacing here: the NIC (tc eBPF) paces. Each queue pair has its own sending socket
for its data; the runner sends until the window or that socket's buffer is full and then waits
for it to become writable; a packet the qdisc refuses (ENOBUFS) is sent again after a backoff,
never skipped. Feedback (ACK, NAK, CNP) has one socket of its own, which no queue pair's data
fills: a responder whose own data towards its peer waits in the NIC still ACKs at once (on a
queue pair's socket, full of that data paced at its rate, the ACKs were refused and lost, and
the peer's timer resent what had arrived). Any other send error (e.g. ENETUNREACH while a
route is being changed) is counted (`tx_errors`, `send_error_<errno>`) and the packet treated
as lost on the wire: the retransmission timer recovers it, and the runner keeps going.

PFC: tc cannot hold a packet on this kernel (without `sch_fq` it can only drop it), so the
hold of a paused NIC is here. With `hold` (the NIC's `xm_pfc` as XDP records the switch's
pauses: controller.nic.pfc.PinnedPfc) the runner sends nothing (data, feedback, reports: the
fabric runs one priority) until the pause ends, looking again every `PAUSE_POLL_S` since a
resume can end it early. What already waits below the socket (its few frames of send buffer)
still leaves: the switch's PFC headroom covers it.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

from controller.wire.roce import ROCE_UDP_PORT
from testbed.switch.native import DEFAULT_PIPELINE
from testbed.traffic.sockets import (
    is_would_block,
    open_rx_sockets,
    open_tx_socket,
    unsent_bytes,
)
from testbed.traffic.transport_core import (
    QpCounters,
    QueuePair,
    ReceivedMessage,
    SendOp,
    TransportConfig,
)
from testbed.traffic.transport_native import (
    IO_SINK,
    IO_UNTIL,
    SEND_ERRNO_N,
    NativeQueuePair,
    NativeTransportCore,
    make_core,
)

# A paused NIC's hold: CLOCK_MONOTONIC ns -> until when it must not send (0: it may).
HoldFn = Callable[[int], int]
# The NIC's start rate of a flow: (src ip, dst ip, sport, rate b/s) -> the rate it took.
StartRateFn = Callable[[str, str, int, int], int]
# The NIC told of flows about to send: [(src ip, dst ip, sport)] -> how many it took.
DeclareFn = Callable[[list[tuple[str, str, int]]], int]
PAUSE_POLL_S = 0.001  # while paused, how often the hold is read again (a resume ends it)
SEND_BURST = 32  # data packets a queue pair sends in a row before the others get a turn
# Frames a step reads before it sends and runs the timers: the socket's fill is left to the
# next step (each step sends its round, so neither direction starves the other).
RX_BUDGET = 256
# A due timer waits while a step's read met RX_BUDGET (frames may still be unread:
# a NIC would have taken their ACKs before its timer fired; a transport held off the CPU
# wakes to a socket full of them), but for at most this many such steps in a row: a socket
# that stays that full is fed faster than it is read, and its timers fire all the same.
RX_DEFER_STEPS = 64
# The feedback socket's buffer: some 256 ACKs (about 1 KB of kernel memory each) waiting in the
# NIC's default class at once, far more than a host's queue pairs answer in one step
FEEDBACK_SNDBUF = 1 << 18


class _Outcome:
    SENT, BLOCKED, LOST = range(3)


class Transport:
    """All queue pairs of one host (a `TransportCore`), their sockets and one receive loop."""

    def __init__(
        self,
        cfg: TransportConfig,
        hold: HoldFn | None = None,
        start_rate: StartRateFn | None = None,
        declare: DeclareFn | None = None,
        seed: int | None = None,
        pipeline: str = DEFAULT_PIPELINE,
        hold_map: tuple[int, int, int, int] | None = None,
    ) -> None:
        """`seed`: the entropy source ports' (`port_seed`; None: drawn from the process,
        for a transport outside a run); `pipeline`: the core's per-packet work in C
        (testbed/traffic/transport_native.py) or the Python reference; where the native one
        cannot run this configuration, the reference, and `native_reason` says why;
        `hold_map`: where `hold` reads the NIC's pauses (PinnedPfc.native_view), for the
        native loop to read them itself (without it, a hold keeps the steps in Python)."""
        self.cfg = cfg
        self._hold = hold
        self._start_rate = start_rate
        self._declare = declare
        self._held_until = 0.0  # time.monotonic() until which the NIC is paused
        self._last_look = 0.0
        self.held_s = 0.0  # time spent paused (between steps that found the NIC held)
        self.holds = 0  # pauses found (steps that found it held after one that did not)
        self.full_reads = 0  # steps in a row whose read met RX_BUDGET (frames left unread)
        self.timers_deferred = 0  # steps in which a due timer waited for those frames
        self.core, self.native_reason = make_core(
            cfg, os.getpid() ^ time.time_ns() if seed is None else seed, pipeline
        )
        self.rx, self._rx_udp = open_rx_sockets(ROCE_UDP_PORT, cfg.rcvbuf)
        self._fb_sock = open_tx_socket(FEEDBACK_SNDBUF)
        self.rx.setblocking(False)
        self._socks: dict[QueuePair, socket.socket] = {}
        self._blocked: set[QueuePair] = set()  # socket buffer full: waiting for writability
        self._retry_at: dict[QueuePair, float] = {}  # qdisc refused: resend after this time
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.rx, selectors.EVENT_READ)
        self._buf = bytearray(65536)
        # the NIC sink's Telemetry Reports go to the collector over the fabric (UDP)
        self._report_sock: socket.socket | None = None
        self._report_addr: tuple[str, int] | None = None
        if self.core.sink is not None and cfg.report_to is not None:
            host, _, port = cfg.report_to.rpartition(":")
            self._report_addr = (host, int(port))
            self._report_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._report_sock.setblocking(False)
        # the native core's loop (run_steps): its view of the sockets, grown with the QPs
        self._io: Any = None
        self._io_arrays: tuple[Any, ...] = ()
        self._io_errors = [0] * SEND_ERRNO_N
        self._io_errors_total = 0
        self._io_not_sent = 0
        if isinstance(self.core, NativeTransportCore):
            self._io = self.core._ffi.new("struct xm_tp_io *")
            self._io.rx_fd = self.rx.fileno()
            self._io.fb_fd = self._fb_sock.fileno()
            self._io.send_burst = SEND_BURST
            self._io.rx_budget = RX_BUDGET
            self._io.rx_defer_steps = RX_DEFER_STEPS
            self._io.nobufs_backoff = cfg.nobufs_backoff
            self._io.pause_poll_s = PAUSE_POLL_S
            self._io.pfc_fd = -1
            if hold is not None and hold_map is not None:
                io = self._io
                io.pfc_fd, io.pfc_value_size, io.pfc_until_off, io.pfc_active_off = hold_map

    @property
    def qps(self) -> dict[int, QueuePair]:
        return self.core.qps

    @property
    def drops(self) -> Counter[str]:
        return self.core.drops

    # ---- setup ----

    def create_qp(
        self,
        qpn: int,
        peer_ip: str,
        remote_qpn: int,
        *,
        sport: int | None = None,
        sq_psn: int = 0,
        rq_psn: int = 0,
        local_ip: str | None = None,
    ) -> QueuePair:
        """A queue pair with its own sending socket (see TransportCore.create_qp). With
        `local_ip` (one of the host's NICs) the kernel routes it out of the NIC whose subnet
        the peer is on, as the rail topology's per-NIC routes say."""
        qp = self.core.create_qp(
            qpn, peer_ip, remote_qpn, sport=sport, sq_psn=sq_psn, rq_psn=rq_psn, local_ip=local_ip
        )
        self._socks[qp] = open_tx_socket(self.cfg.sndbuf)
        if self._io is not None:
            self._io_grow()
        return qp

    def _io_grow(self) -> None:
        """The native loop's arrays, one entry per queue pair (by its index in the C)."""
        io, ffi = self._io, cast(NativeTransportCore, self.core)._ffi
        n = len(self._socks)
        if n > io.cap:
            cap = max(16, 2 * n)
            arrays = (
                ffi.new("int32_t[]", cap),
                ffi.new("uint8_t[]", cap),
                ffi.new("double[]", cap),
                ffi.new("uint32_t[]", cap),
            )
            io.fd, io.blocked, io.retry_at, io.senders = arrays
            io.cap = cap
            self._io_arrays = arrays  # alive while the C holds them
        for qp, sock in self._socks.items():
            io.fd[cast(NativeQueuePair, qp)._index] = sock.fileno()

    def hint_rate(self, qp: QueuePair, rate_bps: int) -> None:
        self.core.hint_rate(qp, rate_bps)

    def nic_payload_rate(self, qp: QueuePair) -> float:
        return self.core.nic_payload_rate(qp)

    def close(self) -> None:
        for s in self._socks.values():
            s.close()
        self._fb_sock.close()
        if self._report_sock is not None:
            self._report_sock.close()
        self._sel.close()
        self.rx.close()
        self._rx_udp.close()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- running ----

    def run_until(self, cond: Callable[[], bool], timeout: float | None = None) -> bool:
        """Run the transport until `cond()` holds (True) or `timeout` seconds pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not cond():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            self.step(now, 0.01 if deadline is None else min(0.01, deadline - now))
        return True

    def step(self, now: float, max_wait: float) -> None:
        got = self._receive(now, RX_BUDGET)
        self._rest_of_step(now, got > 0, max_wait, got >= RX_BUDGET)

    def native_loop(self) -> bool:
        """Whether `run_steps` runs the steps in C: the native core, and a PFC hold (if any)
        the C can read (its map)."""
        return self._io is not None and (self._hold is None or self._io.pfc_fd >= 0)

    def run_steps(self, until: float) -> None:
        """Steps, as `step` with at most 10 ms of wait each, until one completes a send or a
        message (the job must look) or `until` (time.monotonic()) comes: in C (native_loop()),
        each step the reference's in its order, but for what it leaves to Python (the INT
        sink's part of a step, whose rest runs here)."""
        if not self.native_loop():
            now = time.monotonic()
            self.step(now, max(0.0, min(0.01, until - now)))
            return
        core = cast(NativeTransportCore, self.core)
        io = self._io
        for qp in self.core.qps.values():  # Python's view of the sockets, to the C's
            i = cast(NativeQueuePair, qp)._index
            io.blocked[i] = qp in self._blocked
            io.retry_at[i] = self._retry_at.get(qp, 0.0)
        io.held_until, io.last_look, io.held_s, io.holds = (
            self._held_until,
            self._last_look,
            self.held_s,
            self.holds,
        )
        io.full_reads, io.timers_deferred = self.full_reads, self.timers_deferred
        rc = core._lib.xm_tp_run(core._tp, io, until)
        self._held_until, self._last_look = float(io.held_until), float(io.last_look)
        self.held_s, self.holds = float(io.held_s), int(io.holds)
        self.full_reads, self.timers_deferred = int(io.full_reads), int(io.timers_deferred)
        for qp in self.core.qps.values():  # and back
            i = cast(NativeQueuePair, qp)._index
            if io.blocked[i] and qp not in self._blocked:
                self._blocked.add(qp)
                self._sel.register(self._socks[qp], selectors.EVENT_WRITE, qp)
            elif not io.blocked[i] and qp in self._blocked:
                self._blocked.discard(qp)
                self._sel.unregister(self._socks[qp])
        self._retry_at = {
            qp: float(io.retry_at[cast(NativeQueuePair, qp)._index])
            for qp in self.core.qps.values()
            if io.retry_at[cast(NativeQueuePair, qp)._index] > 0
        }
        core._take()
        self._io_drops()
        if rc < 0:
            raise OSError(-rc, os.strerror(-rc))
        if rc == IO_SINK:
            self._rest_of_step(
                io.step_now, bool(io.step_busy), io.step_max_wait, bool(io.step_full)
            )
        else:
            assert rc >= IO_UNTIL

    def _io_drops(self) -> None:
        """The native loop's lost sends into the core's drops, by the reference's names."""
        io, drops = self._io, self.core.drops
        if io.feedback_not_sent != self._io_not_sent:
            drops["feedback_not_sent"] += io.feedback_not_sent - self._io_not_sent
            self._io_not_sent = io.feedback_not_sent
        if io.send_errors_total == self._io_errors_total:
            return
        self._io_errors_total = io.send_errors_total
        seen = self._io_errors
        for err in range(SEND_ERRNO_N):
            n = io.send_errors[err]
            if n != seen[err]:
                drops[f"send_error_{errno.errorcode.get(err, err)}"] += n - seen[err]
                seen[err] = n

    def _rest_of_step(self, now: float, busy: bool, max_wait: float, full: bool) -> None:
        """`step` after its reads (`full`: they met RX_BUDGET, frames may be left unread)."""
        core = self.core
        held = self._paused(now)
        if not held:
            self._send_feedback()
            self._send_reports()
        if self._timers_wait(now, full):
            self.timers_deferred += 1
        else:
            self._restart_waiting_timers(now)
            core.expire(now)
        if not held:
            busy |= self._send_round(now)
        if not busy:
            self._wait(now, max_wait)

    def _timers_wait(self, now: float, full: bool) -> bool:
        """Whether a due timer waits this step for the frames its read left unread (their
        ACKs came before it fired: RX_BUDGET, RX_DEFER_STEPS)."""
        self.full_reads = self.full_reads + 1 if full else 0
        if self.full_reads > RX_DEFER_STEPS:
            self.full_reads = 0
        if not self.full_reads:
            return False
        d = self.core.next_deadline()
        return d is not None and d <= now

    def _restart_waiting_timers(self, now: float) -> None:
        """Each due timer whose queue pair's packets still wait in the NIC (unsent bytes in
        its socket: paced in its class) runs from now: a NIC's timer runs from a packet's
        transmission, and go-back-N would resend what has not left. A flow paced at R_min
        sends a packet every few seconds at the emulation's scale, and its socket's frames
        waited longer than the RTO without a loss."""
        d = self.core.next_deadline()
        if d is None or d > now:
            return
        for qp, sock in self._socks.items():
            due = qp.deadline
            if due is not None and due <= now and unsent_bytes(sock) > 0:
                self.core.restart_timer(qp, now)

    def apply_hints(self) -> None:
        """The application's start rates, to the NIC before the flows' first packets (the
        agent paces them from then on; the worker calls it once the job has made its queue
        pairs), and the other queue pairs' flows declared to it; without an agent the start
        rates are counted and left."""
        hints = self.core.rate_hints
        hinted = set()
        while hints:
            qp, bps = hints.popleft()
            hinted.add(qp)
            if self._start_rate is None:
                self.core.drops["rate_hint_no_nic"] += 1
                continue
            self._start_rate(socket.inet_ntoa(qp.local_addr), qp.peer_ip, qp.sport, bps)
        # the others are declared: the NIC paces each in a queue of its own from its first
        # packet, as a NIC's per-QP rate limiter does (a queue changed later reorders it)
        rest = [
            (socket.inet_ntoa(qp.local_addr), qp.peer_ip, qp.sport)
            for qp in self.core.qps.values()
            if qp not in hinted
        ]
        if self._declare is not None and rest:
            taken = self._declare(rest)
            if taken < len(rest):
                self.core.drops["flows_not_declared"] += len(rest) - taken

    def _paused(self, now: float) -> bool:
        """Whether the NIC is paused now (a PFC pause from its switch)."""
        if self._hold is None:
            return False
        was = self._held_until
        until = self._hold(int(now * 1e9)) / 1e9
        if was > 0.0:  # the time since the last look was held (up to the pause's end)
            self.held_s += max(0.0, min(now, was) - self._last_look)
        elif until > 0.0:
            self.holds += 1
        self._held_until, self._last_look = until, now
        return until > now

    def _send_feedback(self) -> None:
        """Each ACK/NAK/CNP once, in order, on the feedback's socket: one that cannot be sent
        is counted, never retried (the requester's timer or a later ACK covers it)."""
        fb = self.core.feedback
        while fb:
            qp, pkt = fb.popleft()
            try:
                self._fb_sock.sendto(pkt, (qp.peer_ip, 0))
            except OSError:
                self.core.drops["feedback_not_sent"] += 1

    def _send_reports(self) -> None:
        """Telemetry Reports, never retried: one the socket refuses is counted, and the
        collector counts it lost from the sequence numbers."""
        reports = self.core.reports
        sock, addr = self._report_sock, self._report_addr
        while reports:
            rep = reports.popleft()
            if sock is None or addr is None:
                continue
            try:
                sock.sendto(rep, addr)
            except OSError:
                self.core.drops["report_not_sent"] += 1

    def _send_round(self, now: float) -> bool:
        sent = 0
        native = self.core if isinstance(self.core, NativeTransportCore) else None
        for qp in self.core.senders():
            if qp in self._blocked or self._retry_at.get(qp, 0.0) > now:
                continue
            if native is not None:
                sent += self._send_native(native, qp, now)
            else:
                for _ in range(SEND_BURST):
                    pkt = qp.peek(now)
                    if pkt is None:
                        break
                    if self._sendto(qp, pkt) == _Outcome.BLOCKED:
                        break
                    qp.commit(now)  # sent, or lost on the way out (the RTO recovers it)
                    sent += 1
            self._send_feedback()  # feedback made meanwhile goes out promptly
        return sent > 0

    def _send_native(self, core: NativeTransportCore, qp: QueuePair, now: float) -> int:
        """The reference's burst for `qp` with its sends in C: the C stops at a failed send
        and this does with it what `_sendto` does."""
        fd = self._socks[qp].fileno()
        left = SEND_BURST
        while left:
            n, err = core.send_burst(qp, fd, left, now)
            left -= n
            if not err:
                break
            if self._send_failed(qp, OSError(err, os.strerror(err))) == _Outcome.BLOCKED:
                break
            qp.commit(now)  # lost on the way out: the RTO recovers it
            left -= 1
        return SEND_BURST - left

    def _wait(self, now: float, max_wait: float) -> None:
        timeout = max_wait
        d = self.core.next_deadline()
        if d is not None:
            timeout = min(timeout, d - now)
        for t in self._retry_at.values():
            timeout = min(timeout, t - now)
        if self._held_until > now:
            timeout = min(timeout, self._held_until - now, PAUSE_POLL_S)
        for key, _ in self._sel.select(max(0.0, timeout)):
            obj = key.data
            if isinstance(obj, QueuePair):
                self._blocked.discard(obj)
                self._sel.unregister(self._socks[obj])
        self._retry_at = {qp: t for qp, t in self._retry_at.items() if t > time.monotonic()}

    # ---- packets out ----

    def _sendto(self, qp: QueuePair, pkt: bytes) -> int:
        try:
            self._socks[qp].sendto(pkt, (qp.peer_ip, 0))
            return _Outcome.SENT
        except OSError as exc:
            return self._send_failed(qp, exc)

    def _send_failed(self, qp: QueuePair, exc: OSError) -> int:
        """A send of `qp`'s failed: BLOCKED (the socket or the qdisc full: sent again later)
        or LOST (counted)."""
        c = qp.counters
        if is_would_block(exc):
            c.tx_blocked += 1
            if qp not in self._blocked:
                self._blocked.add(qp)
                self._sel.register(self._socks[qp], selectors.EVENT_WRITE, qp)
            return _Outcome.BLOCKED
        if exc.errno == errno.ENOBUFS:  # the qdisc (NIC pacing queue) is full
            c.tx_nobufs += 1
            self._retry_at[qp] = time.monotonic() + self.cfg.nobufs_backoff
            return _Outcome.BLOCKED
        c.tx_errors += 1
        self.core.drops[f"send_error_{errno.errorcode.get(exc.errno or 0, exc.errno)}"] += 1
        return _Outcome.LOST

    # ---- packets in ----

    def _receive(self, now: float, budget: int) -> int:
        """Frames read (at most `budget`)."""
        if isinstance(self.core, NativeTransportCore):  # the same loop in C, batched
            return self.core.receive_from(self.rx.fileno(), budget, now)
        got = 0
        buf = self._buf
        mv = memoryview(buf)
        while got < budget:
            try:
                n = self.rx.recv_into(buf)
            except (BlockingIOError, InterruptedError):
                break
            got += 1
            self.core.receive(mv[:n], now)
        return got

    # ---- reporting ----

    def counters(self) -> dict[str, object]:
        out = self.core.counters()
        if self._hold is not None:
            out["pfc_holds"], out["pfc_held_us"] = self.holds, round(self.held_s * 1e6)
        out["timers_deferred"] = self.timers_deferred
        return out


__all__ = ["QpCounters", "QueuePair", "ReceivedMessage", "SendOp", "Transport", "TransportConfig"]
