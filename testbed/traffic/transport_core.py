"""The RoCEv2-like reliable transport's protocol logic, without I/O (sans-I/O).

`TransportCore` holds one host's queue pairs. It is fed IPv4 packets (`receive`) and timer
expiries (`expire`), and it returns what to send and when it next needs a timer
(`next_deadline`); it never opens a socket or reads a clock: every call takes `now` (seconds,
any monotonic origin). Two engines drive it: the socket runner (testbed.traffic.transport,
the emulation) and the simulated twin (testbed.sim), so both run this one protocol.

A queue pair (`QueuePair`) is full duplex, like an RC QP: its requester half segments posted
messages into MTU-sized RC SEND packets and retransmits on a NAK or a timeout; its responder
half reassembles in PSN order, ACKs (coalesced), sends a CNP for ECN-CE data at most once per
interval, and echoes a received INT stack in the ACK (docs/wire-format.md).

Retransmission is one of two schemes (`TransportConfig.retransmit`, the same on every host):
- `gbn`, go-back-N as RC does it: the responder drops a packet past a PSN gap and NAKs the gap
  once; the requester resends everything from the PSN the NAK names (or, on a timeout, from
  the oldest unacknowledged).
- `sr`, selective repeat as IRN and the RoCE NICs with selective repeat do it: the responder
  keeps out-of-order packets within the requester's window (at most `window` packets of at
  most `mtu` bytes per QP; one further ahead is a counted drop) and answers each with a NAK
  naming the first missing PSN and, in a SACK header, the PSN it kept; the requester resends
  only the PSNs below a SACKed one that were neither SACKed nor resent already, a resent PSN
  again when a packet first sent after its resend is SACKed (the resend was lost: the path
  keeps order, as RACK reasons), and on a timeout every unSACKed PSN in flight (or, all
  SACKed, the oldest: the ACK past them was lost); a resend asks for an ACK. With at most
  SR_FEW_IN_FLIGHT packets in flight the timer runs at IRN's RTO_low (a tail loss has nothing
  after it to be SACKed). Delivery stays in
  PSN order: the kept packets are handed on once the gap is filled.

Queue pairs are set up out of band: both ends are created with each other's QPN and the same
initial PSNs (the workload runner does that).

Sending data is peek/commit, because the I/O below may push back (a full socket buffer or NIC
pacing queue): `QueuePair.peek(now)` builds the next data packet the window allows without
changing any state, and `QueuePair.commit(now)` records it as sent once the I/O took it (or
lost it, as a wire would). Feedback (ACK, NAK, CNP) is queued in `TransportCore.feedback` as
it is made and is never retried: I/O that cannot send one counts it (`feedback_not_sent`).

Bad input is counted per reason in `drops` and dropped. A message longer than
`max_message` is not buffered: its packets are acknowledged (so the sender is not stuck) and
its data discarded, counted once as `message_too_long`.

A queue pair stores at most `store_bytes` of each message it receives (None: all of it): the
rest is counted in the message's `size` and not kept. A sender whose messages are data then
padding (the collectives' size mode, flows nobody verifies) costs its receiver no memory for
the padding; the wire carries the same bytes.
"""

from __future__ import annotations

import bisect
import ipaddress
import socket
import struct
from collections import Counter, deque
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from controller.nic.int_sink import IntSink, SinkConfig
from controller.wire.int_md import (
    HEADERS_LEN,
    INT_DSCP_DEFAULT,
    INT_TYPE_MD,
    SHIM_LEN,
    looks_like_int_echo,
    shim_total_len,
)
from controller.wire.ipv4 import ECT0
from controller.wire.probe import PROBE_QPN
from controller.wire.roce import (
    AETH_ACK,
    AETH_LEN,
    AETH_NAK_PSN_SEQ_ERR,
    AETH_NAK_PSN_SEQ_ERR_SACK,
    BTH_LEN,
    CNP_LEN,
    DEFAULT_PKEY,
    ICRC_LEN,
    OP_ACK,
    OP_CNP,
    OP_SEND_FIRST,
    OP_SEND_LAST,
    OP_SEND_MIDDLE,
    OP_SEND_ONLY,
    PSN_MASK,
    ROCE_UDP_PORT,
    SACK_LEN,
    icrc,
    is_nak,
    next_entropy_port,
    pack_aeth,
    pack_sack,
    unpack_sack,
)
from testbed.model import TRANSPORT_OVERHEAD

ECN_CE = 0b11
_IP_UDP_BTH = struct.Struct("!BBHHHBBH4s4sHHHHBBHII")  # IPv4 (20) + UDP (8) + BTH (12)
_IPV4_DF = 0x4000
_HALF = 1 << 23
_DATA_OPCODES = (OP_SEND_FIRST, OP_SEND_MIDDLE, OP_SEND_LAST, OP_SEND_ONLY)
RETRANSMIT_SCHEMES = ("gbn", "sr")  # go-back-N, selective repeat
# Selective repeat's RTO_low (IRN): with at most this many packets in flight a loss cannot be
# SACKed (nothing follows it), so the timer is the RTO times 100/320, IRN's RTO_low/RTO_high.
SR_FEW_IN_FLIGHT = 3
SR_RTO_LOW_FACTOR = 100 / 320
MTU_MAX = 9000 - 100  # payload bytes: a jumbo frame with room for the headers and INT


@dataclass(frozen=True)
class TransportConfig:
    """Per-host transport parameters (the same on every host of a run)."""

    local_ip: str
    mtu: int = 1024  # payload bytes per packet; leaves room for INT within a 1500-byte link MTU
    window: int = 256  # packets in flight per QP
    ack_every: int = 4  # ACK coalescing: one ACK per this many in-order packets (and per message)
    rto: float = 0.025  # s; must exceed the NIC queue's drain time (sndbuf / paced rate)
    # and the scheduling hiccups of a shared machine
    rto_max: float = 0.200
    cnp_interval: float = 50e-6  # s; DCQCN's 50 µs, scaled by the testbed with the link rates
    int_dscp: int | None = INT_DSCP_DEFAULT
    dscp: int = 0  # DSCP of everything this transport sends (ECN bits are always ECT(0))
    ttl: int = 64
    psn_window: int = 1 << 16  # PSNs further ahead or behind than this are out of window
    sndbuf: int = 1 << 18  # per QP: bounds what waits in the NIC's pacing queue
    rcvbuf: int = 1 << 24
    nobufs_backoff: float = 200e-6  # s before re-sending a packet the qdisc refused
    max_message: int = 1 << 28  # bytes a responder buffers for one message
    retransmit: str = "gbn"  # gbn (go-back-N) or sr (selective repeat): RETRANSMIT_SCHEMES
    # The NIC as INT sink (controller.nic.int_sink): "ip:port" of the collector, or None for
    # no Telemetry Reports; when to report (seconds; 0 turns a trigger off).
    report_to: str | None = None
    report_sample_s: float = 0.1
    report_queue_bytes: int = 0
    report_latency_ns: int = 0
    report_event_gap_s: float = 0.01
    report_max_flows: int = 4096  # flows the sink keeps a state of (the least recent go)
    report_budget_bps: float = 0.0  # the NIC's report path's rate limit (SinkConfig; 0: none)

    def __post_init__(self) -> None:
        if not 1 <= self.mtu <= MTU_MAX:
            raise ValueError(f"mtu {self.mtu} out of range")
        if not 1 <= self.window < _HALF or not 1 <= self.ack_every:
            raise ValueError("window must be in [1, 2^23) and ack_every >= 1")
        if not 1 <= self.psn_window <= _HALF:
            raise ValueError("psn_window must be in [1, 2^23]")
        if self.max_message < self.mtu:
            raise ValueError("max_message must hold at least one packet")
        if not 0 < self.rto <= self.rto_max:
            raise ValueError(f"rto {self.rto} s must be above 0 and at most rto_max {self.rto_max}")
        if self.retransmit not in RETRANSMIT_SCHEMES:
            raise ValueError(
                f"retransmit {self.retransmit!r}: one of {', '.join(RETRANSMIT_SCHEMES)}"
            )
        ipaddress.IPv4Address(self.local_ip)

    @property
    def tos(self) -> int:
        """The IPv4 TOS of everything this transport sends: its DSCP, ECT(0)."""
        return (self.dscp << 2) | ECT0


@dataclass
class QpCounters:
    tx_packets: int = 0
    tx_bytes: int = 0  # payload bytes, retransmissions included
    retransmits: int = 0  # data packets sent again
    timeouts: int = 0
    naks_received: int = 0
    acks_received: int = 0
    cnps_received: int = 0
    rx_data_packets: int = 0  # in-order, accepted
    rx_kept: int = 0  # out-of-order, kept until the gap is filled (selective repeat)
    rx_bytes: int = 0  # payload bytes delivered in order
    acks_sent: int = 0  # ACKs made (the I/O counts those it could not send)
    naks_sent: int = 0
    # gaps in the PSNs whose missing packet came after all, sent before the packet that showed
    # the gap (IPv4 ID): reordered on the way, not lost (go-back-N resends them all the same)
    reordered: int = 0
    gaps_lost: int = 0  # gaps whose missing packet came only when resent: lost on the way
    cnps_sent: int = 0
    ecn_ce_seen: int = 0
    int_seen: int = 0
    int_echoes_sent: int = 0
    tx_blocked: int = 0  # sends that found the socket buffer full (EAGAIN)
    tx_nobufs: int = 0  # sends the qdisc refused (ENOBUFS), sent again later
    tx_errors: int = 0  # sends the I/O lost with another error (e.g. ENETUNREACH)
    messages_sent: int = 0
    messages_received: int = 0


def counter_values(counters: QpCounters) -> dict[str, int]:
    """A queue pair's counters by name: a QpCounters' or the native core's C struct's (the
    same fields)."""
    return {k: int(getattr(counters, k)) for k in QpCounters.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class _Gap:
    """A gap in a QP's received PSNs: the IPv4 ID and arrival time of the packet that showed
    it, and that packet up to its UDP payload's end when the sink will report it."""

    ident: int
    pkt: bytes
    int_off: int
    t: float


@dataclass
class SendOp:
    """A posted message of `size` bytes: `data`, then zeros up to `size` (a message whose
    content is its size alone need not exist in memory). `t_done` is set when the last
    packet is acknowledged."""

    data: memoryview
    size: int
    first_seq: int
    npkts: int
    t_post: float
    tag: object = None
    t_done: float | None = None

    @property
    def done(self) -> bool:
        return self.t_done is not None


def checked_store(n: int | None) -> int | None:
    if n is not None and (not isinstance(n, int) or n < 0):
        raise ValueError(f"store_bytes {n!r}: a count of bytes, or None for all")
    return n


@dataclass
class ReceivedMessage:
    data: bytearray  # handed over without a copy: the first `store_bytes` of the message
    size: int  # the message's bytes, stored or not
    t_first: float  # first packet of the message accepted
    t_done: float  # last packet accepted


class Outgoing(NamedTuple):
    """One IPv4 packet to send on `qp`'s behalf."""

    qp: QueuePair
    packet: bytes


class QueuePair:
    """One end of a reliable connection. Create with `TransportCore.create_qp`."""

    # The set the core adds this queue pair to when one of its sends completes or a message
    # arrives on it (None: no one watches): its job reads which of its many queue pairs
    # changed without looking at each after every event.
    watch: set[QueuePair] | None = None

    def __init__(
        self,
        core: TransportCore,
        qpn: int,
        peer_ip: str,
        remote_qpn: int,
        sport: int,
        sq_psn: int,
        rq_psn: int,
    ) -> None:
        self.core = core
        self.qpn = qpn
        self.peer_ip = peer_ip
        self.peer_addr = socket.inet_aton(peer_ip)
        self.local_addr = core.local_addr
        self.remote_qpn = remote_qpn
        self.sport = sport
        self.counters = QpCounters()
        # requester: sequence numbers are unbounded ints, PSN = (sq_psn + seq) mod 2^24
        self.sq_psn = sq_psn & PSN_MASK
        # posted, not yet fully acknowledged; a completed SendOp is marked done and forgotten
        # (its poster holds it if it wants it: a queue of completions nobody reads would grow
        # with every message of a run)
        self.send_q: deque[SendOp] = deque()
        self.una = 0  # oldest unacknowledged
        self.nxt = 0  # next to send
        self.high = 0  # one past the highest ever sent
        self.tail = 0  # one past the last queued
        self.rto = core.cfg.rto
        self.last_progress = 0.0
        self._cur = 0  # index in send_q of the op holding `nxt` (a hint)
        # selective repeat: what the responder SACKed, what to resend (ascending, each >= una),
        # and the sequence number below which every hole has been queued once
        self.sacked: set[int] = set()
        self.rtx_q: deque[int] = deque()
        self.rtx_upto = 0
        self.rtx_mark: dict[int, int] = {}  # resent seq -> `high` when it was resent
        # responder
        self.epsn = rq_psn & PSN_MASK  # expected PSN
        self.msn = 0
        self.rx_buf = bytearray()
        self.rx_size = 0  # the message in progress: its bytes so far, stored or not
        self._store: int | None = None  # store_bytes
        self.rx_t_first = 0.0
        self.in_msg = False
        self.rx_overflow = False  # the message in progress exceeded max_message: discarded
        self.unacked = 0
        self.nak_sent = False
        self.last_cnp = -1e18
        self.pending_int: bytes | None = None
        # the gap in the PSNs not yet settled (loss or reordering), and the highest PSN this
        # responder received and dropped itself (go-back-N drops what comes after a gap)
        self.gap: _Gap | None = None
        self.discarded_hi: int | None = None
        self.ident = 0  # the IPv4 ID of the packet this QP sent last
        self.recv_q: deque[ReceivedMessage] = deque()
        # selective repeat: out-of-order packets kept, by PSN: (opcode, ackreq, payload)
        self.kept: dict[int, tuple[int, bool, bytes]] = {}

    # ---- application API ----

    @property
    def store_bytes(self) -> int | None:
        """Bytes this queue pair stores of each message it receives (None: all); the rest
        is counted in the message's `size`. Set before the messages it is meant for arrive."""
        return self._store

    @store_bytes.setter
    def store_bytes(self, n: int | None) -> None:
        self._store = checked_store(n)

    def post_send(
        self,
        data: bytes | bytearray | memoryview,
        now: float,
        tag: object = None,
        size: int | None = None,
    ) -> SendOp:
        """Queue a message of `data`, followed by zeros up to `size` bytes if given; returns
        its SendOp (done when fully acknowledged)."""
        mv = memoryview(data).cast("B")
        total = len(mv) if size is None else size
        if total < len(mv):
            raise ValueError(f"message size {total} below its {len(mv)} bytes of data")
        npkts = max(1, -(-total // self.core.cfg.mtu))
        op = SendOp(mv, total, self.tail, npkts, now, tag)
        self.tail += npkts
        self.send_q.append(op)
        self.core.active.add(self)
        return op

    def poll_recv(self) -> ReceivedMessage | None:
        return self.recv_q.popleft() if self.recv_q else None

    @property
    def idle(self) -> bool:
        """Everything posted has been acknowledged."""
        return not self.send_q

    # ---- requester ----

    def _psn(self, seq: int) -> int:
        return (self.sq_psn + seq) & PSN_MASK

    def _seq_of(self, psn: int, ref: int) -> int:
        """The unbounded sequence number nearest `ref` whose PSN is `psn`."""
        d = ((psn - self._psn(ref) + _HALF) & PSN_MASK) - _HALF
        return ref + d

    def _op_for(self, seq: int) -> SendOp:
        q = self.send_q
        i = self._cur if self._cur < len(q) else 0
        if q[i].first_seq > seq:
            i = 0
        while q[i].first_seq + q[i].npkts <= seq:
            i += 1
        self._cur = i
        return q[i]

    @property
    def wants_to_send(self) -> bool:
        return bool(self.rtx_q) or (
            self.nxt < self.tail and self.nxt - self.una < self.core.cfg.window
        )

    def _send_seq(self) -> int:
        """The sequence number the next data packet carries (when `wants_to_send`): a
        selective resend first, else the next new one."""
        return self.rtx_q[0] if self.rtx_q else self.nxt

    @property
    def deadline(self) -> float | None:
        """When the retransmission timer fires (None: nothing in flight)."""
        return self.last_progress + self._rto() if self.una < self.high else None

    def _rto(self) -> float:
        if self.core.cfg.retransmit == "sr" and self.high - self.una <= SR_FEW_IN_FLIGHT:
            return self.rto * SR_RTO_LOW_FACTOR
        return self.rto

    def peek(self, now: float) -> bytes | None:
        """The next data packet the window allows (None: nothing to send now); no state
        changes until `commit`."""
        if not self.wants_to_send:
            return None
        cfg = self.core.cfg
        seq = self._send_seq()
        op = self._op_for(seq)
        i = seq - op.first_seq
        if op.npkts == 1:
            opcode = OP_SEND_ONLY
        elif i == 0:
            opcode = OP_SEND_FIRST
        elif i == op.npkts - 1:
            opcode = OP_SEND_LAST
        else:
            opcode = OP_SEND_MIDDLE
        lo = i * cfg.mtu
        payload: memoryview | bytes = op.data[lo : lo + cfg.mtu]
        if len(payload) < cfg.mtu and lo + len(payload) < op.size:  # past the data: zeros
            payload = bytes(payload) + bytes(min(cfg.mtu, op.size - lo) - len(payload))
        ackreq = i == op.npkts - 1 or seq - self.una + 1 >= cfg.window
        if cfg.retransmit == "sr" and seq < self.high:
            ackreq = True  # a resend asks for an ACK: it may be all that is left in flight
        return self.core.build(
            self, opcode, self.remote_qpn, self._psn(seq), ackreq, self.sport, payload
        )

    def commit(self, now: float) -> None:
        """The packet `peek` returned left (or was lost on the way out)."""
        seq = self._send_seq()
        op = self._op_for(seq)
        i = seq - op.first_seq
        mtu = self.core.cfg.mtu
        n = min(mtu, op.size - i * mtu) if op.size else 0
        if self.una == self.high:
            self.last_progress = now  # the RTO runs from the first packet in flight
        c = self.counters
        c.tx_packets += 1
        c.tx_bytes += n
        if seq < self.high:
            c.retransmits += 1
        if self.rtx_q:
            self.rtx_q.popleft()
            self.rtx_mark[seq] = self.high
            return
        self.nxt = seq + 1
        self.high = max(self.high, self.nxt)

    def _on_ack(self, psn: int, syndrome: int, now: float, sack_psn: int | None = None) -> None:
        """An ACK or NAK (`sack_psn`: the SACK header's PSN of a selective NAK)."""
        c = self.counters
        drops = self.core.drops
        if is_nak(syndrome):
            if syndrome not in (AETH_NAK_PSN_SEQ_ERR, AETH_NAK_PSN_SEQ_ERR_SACK):
                drops["nak_unsupported"] += 1
                return
            expected = self._seq_of(psn, self.una)
            if not self.una <= expected <= self.high:
                drops["ack_out_of_window"] += 1
                return
            sacked = None
            if sack_psn is not None:
                sacked = self._seq_of(sack_psn, self.una)
                if not expected < sacked < self.high:
                    drops["sack_out_of_window"] += 1
                    return
            c.naks_received += 1
            self._advance(expected, now)
            if self.core.cfg.retransmit == "sr":
                self._resend_holes(expected, sacked)
            elif expected < self.high:
                self.nxt = expected  # go back N
                self.core.active.add(self)
            return
        acked = self._seq_of(psn, self.una)
        if acked >= self.high:
            drops["ack_out_of_window"] += 1
            return
        c.acks_received += 1
        if acked >= self.una:
            self._advance(acked + 1, now)

    def _resend_holes(self, expected: int, sacked: int | None) -> None:
        """Selective repeat on a NAK: `sacked` arrived (kept by the responder), so every PSN
        from `expected` up to it that is neither SACKed nor queued already is a hole to resend
        once. A NAK without a SACK (a go-back-N responder's) names one hole: `expected`."""
        if sacked is None:
            end = min(expected + 1, self.high)
        else:
            end = sacked
            if sacked not in self.sacked:
                self.sacked.add(sacked)
                if sacked < self.rtx_upto and sacked in self.rtx_q:
                    self.rtx_q.remove(sacked)  # a late SACK: it arrived after all
        if sacked is not None and self.rtx_mark:
            # a resend older than the packet SACKed now would have arrived before it: lost
            lost = [s for s, mark in self.rtx_mark.items() if s < sacked and mark <= sacked]
            for seq in lost:
                del self.rtx_mark[seq]
                if seq not in self.sacked:
                    self._queue_resend(seq)
        for seq in range(max(self.rtx_upto, expected), end):
            if seq not in self.sacked:
                self.rtx_q.append(seq)
        self.rtx_upto = max(self.rtx_upto, end)
        if self.rtx_q:
            self.core.active.add(self)

    def _queue_resend(self, seq: int) -> None:
        """Put `seq` in the resend queue, which stays ascending and without repeats."""
        q = self.rtx_q
        i = bisect.bisect_left(q, seq)
        if i == len(q) or q[i] != seq:
            q.insert(i, seq)

    def _advance(self, una: int, now: float) -> None:
        if una <= self.una:
            return
        self.una = una
        self.nxt = max(self.nxt, una)
        if self.sacked:
            self.sacked = {s for s in self.sacked if s >= una}
        while self.rtx_q and self.rtx_q[0] < una:
            self.rtx_q.popleft()
        if self.rtx_mark:
            self.rtx_mark = {s: m for s, m in self.rtx_mark.items() if s >= una}
        self.rtx_upto = max(self.rtx_upto, una)
        self.rto = self.core.cfg.rto
        self.last_progress = now
        q = self.send_q
        while q and q[0].first_seq + q[0].npkts <= una:
            op = q.popleft()
            op.t_done = now
            self.counters.messages_sent += 1
            self._cur = max(0, self._cur - 1)
            if self.watch is not None:
                self.watch.add(self)
        if q or self.nxt < self.tail:
            self.core.active.add(self)

    def _expire(self, now: float) -> None:
        if self.una < self.high and now >= self.last_progress + self._rto():
            self.counters.timeouts += 1
            if self.core.cfg.retransmit == "sr":  # every PSN in flight not known to be kept
                self.rtx_q = deque(s for s in range(self.una, self.high) if s not in self.sacked)
                if not self.rtx_q:  # all SACKed: the ACK past them was lost, ask again
                    self.rtx_q.append(self.una)
                self.rtx_upto = self.high
                self.rtx_mark.clear()
            else:
                self.nxt = self.una
            self.rto = min(self.rto * 2, self.core.cfg.rto_max)
            self.last_progress = now
            self.core.active.add(self)

    # ---- responder ----

    def _on_data(
        self,
        opcode: int,
        psn: int,
        ackreq: bool,
        payload: memoryview,
        sport: int,
        ce: bool,
        int_bytes: bytes | None,
        now: float,
    ) -> None:
        core = self.core
        cfg = core.cfg
        c = self.counters
        if ce:
            c.ecn_ce_seen += 1
            if now - self.last_cnp >= cfg.cnp_interval:
                self.last_cnp = now
                core._feedback(self, OP_CNP, 0, sport, bytes(CNP_LEN))
                c.cnps_sent += 1
        if int_bytes is not None:
            c.int_seen += 1
        d = ((psn - self.epsn + _HALF) & PSN_MASK) - _HALF
        if d > 0:
            if d >= cfg.psn_window:
                core.drops["psn_out_of_window"] += 1
                return
            if cfg.retransmit == "sr":
                self._keep(opcode, psn, ackreq, payload, d, sport)
                return
            core.drops["out_of_order"] += 1
            hi = self.discarded_hi
            if hi is None or ((psn - hi + _HALF) & PSN_MASK) - _HALF > 0:
                self.discarded_hi = psn
            if not self.nak_sent or ackreq:
                self.nak_sent = True
                self._send_ack(AETH_NAK_PSN_SEQ_ERR, self.epsn, sport)
            return
        if d < 0:
            if d < -cfg.psn_window:
                core.drops["psn_out_of_window"] += 1
                return
            core.drops["duplicate"] += 1
            # IBA C9-105: a duplicate SEND is ACKed again, AckReq or not: the requester
            # resent it after a timeout, and the ACK it waits for may have been coalesced
            # away (every `ack_every`); unanswered, a sender paced below a packet per
            # timeout resends the same packet for ever
            self._send_ack(AETH_ACK, (self.epsn - 1) & PSN_MASK, sport)
            return
        if not self._accept(opcode, psn, ackreq, payload, sport, int_bytes, now):
            return
        if self.kept:  # selective repeat: the gap is filled, hand on what was kept behind it
            while (k := self.kept.pop(self.epsn, None)) is not None:
                if not self._accept(k[0], self.epsn, k[1], memoryview(k[2]), sport, None, now):
                    break
            if self.unacked:  # the requester may have nothing more in flight to make an ACK
                self._send_ack(AETH_ACK, (self.epsn - 1) & PSN_MASK, sport)

    def _keep(
        self, opcode: int, psn: int, ackreq: bool, payload: memoryview, d: int, sport: int
    ) -> None:
        """Selective repeat: keep a packet `d` PSNs past the expected one and NAK the gap with
        a SACK for it. The requester never has more than `window` packets in flight, so one
        further ahead is bad input: dropped, counted. A kept PSN seen again (resent after
        its SACK was lost) is counted and SACKed again."""
        core = self.core
        cfg = core.cfg
        if d >= cfg.window:
            core.drops["sr_out_of_window"] += 1
            return
        if psn in self.kept:  # resent after a lost SACK: SACK it again
            core.drops["duplicate"] += 1
        elif len(payload) > cfg.mtu:
            core.drops["bad_length"] += 1
            return
        else:
            self.kept[psn] = (opcode, ackreq, bytes(payload))
            self.counters.rx_kept += 1
        core._feedback(
            self,
            OP_ACK,
            self.epsn,
            sport,
            pack_aeth(AETH_NAK_PSN_SEQ_ERR_SACK, self.msn) + pack_sack(psn),
        )
        self.counters.naks_sent += 1
        self.nak_sent = True  # this gap is NAKed (the INT sink reports the first packet past it)

    def _accept(
        self,
        opcode: int,
        psn: int,
        ackreq: bool,
        payload: memoryview,
        sport: int,
        int_bytes: bytes | None,
        now: float,
    ) -> bool:
        """The packet with the expected PSN; False when it is dropped (counted)."""
        core = self.core
        cfg = core.cfg
        c = self.counters
        # in order: check it continues the message the way the opcodes say
        first = opcode in (OP_SEND_FIRST, OP_SEND_ONLY)
        last = opcode in (OP_SEND_LAST, OP_SEND_ONLY)
        if first == self.in_msg:
            core.drops["bad_opcode_sequence"] += 1
            return False
        n = len(payload)
        if n > cfg.mtu or (not last and n != cfg.mtu):
            core.drops["bad_length"] += 1
            return False
        if first:
            self.rx_buf = bytearray()
            self.rx_size = 0
            self.rx_t_first = now
            self.rx_overflow = False
        if not self.rx_overflow and self.rx_size + n > cfg.max_message:
            # a message with no end in sight: stop buffering it, keep the connection going
            self.rx_overflow = True
            self.rx_buf = bytearray()
            core.drops["message_too_long"] += 1
        if not self.rx_overflow:
            store = self._store
            if store is None:
                self.rx_buf += payload
            elif len(self.rx_buf) < store:
                self.rx_buf += payload[: store - len(self.rx_buf)]
            self.rx_size += n
        self.in_msg = not last
        self.epsn = (self.epsn + 1) & PSN_MASK
        self.nak_sent = False
        c.rx_data_packets += 1
        c.rx_bytes += n
        if int_bytes is not None:
            self.pending_int = int_bytes
        if last:
            self.msn = (self.msn + 1) & PSN_MASK
        self.unacked += 1
        if last or ackreq or self.unacked >= cfg.ack_every:
            self._send_ack(AETH_ACK, psn, sport)
        if last:  # after the ACK: handing over the buffer is the application's time, not the wire's
            if not self.rx_overflow:
                msg = ReceivedMessage(self.rx_buf, self.rx_size, self.rx_t_first, now)
                self.recv_q.append(msg)
                if self.watch is not None:
                    self.watch.add(self)
                c.messages_received += 1
            self.rx_buf = bytearray()
            self.rx_size = 0
            self.rx_overflow = False
        return True

    def _send_ack(self, syndrome: int, psn: int, sport: int) -> None:
        echo = self.pending_int or b""
        self.pending_int = None
        self.core._feedback(self, OP_ACK, psn, sport, pack_aeth(syndrome, self.msn) + echo)
        self.unacked = 0
        if syndrome == AETH_ACK:
            self.counters.acks_sent += 1
        else:
            self.counters.naks_sent += 1
        if echo:
            self.counters.int_echoes_sent += 1


class NicRates(Protocol):
    """The host's NIC as its transport's application may read it."""

    def rate_bps(self, qp: QueuePair) -> int:
        """The rate, in b/s on the wire, at which the NIC sends `qp`'s flow now: its rate
        law's, or the NIC's line rate where none is set."""
        ...


def port_seed(seed: int, host: int) -> int:
    """The seed of the entropy source ports of the job's host number `host` in a run seeded
    `seed`: the same ports, hence the same ECMP paths, in every run with that seed, on either
    engine (both run the same pipeline's hash)."""
    return seed * 7919 + host


class TransportCore:
    """All queue pairs of one host: packets and timer expiries in, packets and deadlines out.

    `seed` draws the queue pairs' entropy source ports (`port_seed`: a run's ports follow
    from its seed, whatever ran before it).
    """

    pipeline = "reference"  # this Python core; transport_native.py's is "native"

    def __init__(self, cfg: TransportConfig, seed: int) -> None:
        self.cfg = cfg
        self.local_addr = socket.inet_aton(cfg.local_ip)
        self.qps: dict[int, QueuePair] = {}
        self.drops: Counter[str] = Counter()
        self.rx_packets = 0
        self.active: set[QueuePair] = set()  # QPs that may have something to send
        self.feedback: deque[Outgoing] = deque()  # ACK/NAK/CNP made, not yet handed to I/O
        self._hdr = bytearray(_IP_UDP_BTH.size)
        self._used_ports: set[int] = set()
        self._sport_state = seed & 0xFFFFFFFF
        # Telemetry Reports made (UDP payloads for cfg.report_to), not yet handed to I/O
        self.reports: deque[bytes] = deque()
        # start rates the application declared for its QPs' flows, not yet handed to the NIC
        self.rate_hints: deque[tuple[QueuePair, int]] = deque()
        self.rate_hints_made = 0
        # the NIC's side, where the engine can read it (the twin's NIC, the emulation's agent)
        self.nic_rates: NicRates | None = None
        self.sink: IntSink | None = None
        # probes to the NIC's prober (controller/nic/prober.py) that reached the transport
        self.probes_ignored = 0
        if cfg.report_to is not None and cfg.int_dscp is not None:
            sink_cfg = SinkConfig(
                sample_s=cfg.report_sample_s,
                queue_bytes=cfg.report_queue_bytes,
                latency_ns=cfg.report_latency_ns,
                event_gap_s=cfg.report_event_gap_s,
                max_flows=cfg.report_max_flows,
                budget_bps=cfg.report_budget_bps,
            )
            self.sink = IntSink(cfg.local_ip, sink_cfg, cfg.int_dscp)

    # ---- setup ----

    def hint_rate(self, qp: QueuePair, rate_bps: int) -> None:
        """The application's start rate for `qp`'s flow (its share of a transfer pattern it
        knows, e.g. an incast's fan-in): the runner hands it to the NIC, which paces the flow
        at it from its first packet and starts the rate law there."""
        self.rate_hints.append((qp, int(rate_bps)))
        self.rate_hints_made += 1

    def nic_payload_rate(self, qp: QueuePair) -> float:
        """Payload bytes/s the NIC lets `qp`'s flow send now: the rate its rate law set (its
        line rate where none is), over the wire bytes of a full packet; 0 where the engine
        gives no NIC to read."""
        bps = self.nic_rates.rate_bps(qp) if self.nic_rates is not None else 0
        mtu = self.cfg.mtu
        return bps / 8 * mtu / (mtu + TRANSPORT_OVERHEAD) if bps > 0 else 0.0

    def _draw_sport(self) -> int:
        # deterministic per seed, no global RNG state
        self._sport_state, sport = next_entropy_port(self._sport_state)
        return sport

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
        """A queue pair; the peer must create the mirror one (its qpn = our remote_qpn, its
        rq_psn = our sq_psn). `sport` is this QP's entropy source port (drawn if None)."""
        if not 0 < qpn <= 0xFFFFFF or not 0 < remote_qpn <= 0xFFFFFF:
            raise ValueError("QPNs must be in 1..2^24-1")
        if PROBE_QPN in (qpn, remote_qpn):
            raise ValueError(f"QPN {PROBE_QPN:#x} is the prober's")
        if qpn in self.qps:
            raise ValueError(f"QPN {qpn:#x} exists")
        if sport is None:
            sport = self._draw_sport()
            while sport in self._used_ports:
                sport = self._draw_sport()
        self._used_ports.add(sport)
        qp = self._queue_pair(qpn, peer_ip, remote_qpn, sport, sq_psn, rq_psn)
        if local_ip is not None:  # a host with several NICs: this QP's source address
            qp.local_addr = socket.inet_aton(local_ip)
        self.qps[qpn] = qp
        return qp

    def _queue_pair(
        self, qpn: int, peer_ip: str, remote_qpn: int, sport: int, sq_psn: int, rq_psn: int
    ) -> QueuePair:
        return QueuePair(self, qpn, peer_ip, remote_qpn, sport, sq_psn, rq_psn)

    # ---- timers ----

    def next_deadline(self) -> float | None:
        """The earliest retransmission timer of any queue pair (None: none running)."""
        best: float | None = None
        for qp in self.qps.values():
            d = qp.deadline
            if d is not None and (best is None or d < best):
                best = d
        return best

    def restart_timer(self, qp: QueuePair, now: float) -> None:
        """`qp`'s packets have not left the NIC yet (the emulation's I/O sees them still in
        its socket, paced): its retransmission timer runs from `now`, as a NIC's runs from a
        packet's transmission. Nothing in flight: nothing to restart."""
        if qp.una < qp.high:
            qp.last_progress = now

    def expire(self, now: float) -> None:
        """Fire the retransmission timers due at `now`."""
        for qp in self.qps.values():
            if qp.una < qp.high:
                qp._expire(now)

    def senders(self) -> list[QueuePair]:
        """Queue pairs with a data packet to send now (and forget those that have none)."""
        out = []
        for qp in list(self.active):
            if qp.wants_to_send:
                out.append(qp)
            elif qp.nxt >= qp.tail and not qp.rtx_q:
                self.active.discard(qp)
        return out

    # ---- packets out ----

    def build(
        self,
        qp: QueuePair,
        opcode: int,
        dqpn: int,
        psn: int,
        ackreq: bool,
        sport: int,
        payload: bytes | memoryview,
    ) -> bytes:
        """One IPv4 packet of this transport: IPv4 + UDP + BTH + payload + ICRC."""
        udp_len = 8 + BTH_LEN + len(payload) + ICRC_LEN
        hdr = self._hdr
        # the IPv4 ID counts the QP's packets: a receiver tells a late packet from a resent one
        qp.ident = ident = (qp.ident + 1) & 0xFFFF
        _IP_UDP_BTH.pack_into(
            hdr,
            0,
            0x45,
            self.cfg.tos,
            20 + udp_len,
            ident,
            _IPV4_DF,
            self.cfg.ttl,
            socket.IPPROTO_UDP,
            0,
            qp.local_addr,
            qp.peer_addr,
            sport,
            ROCE_UDP_PORT,
            udp_len,
            0,
            opcode,
            0,
            DEFAULT_PKEY,
            dqpn,
            (int(ackreq) << 31) | psn,
        )
        body = bytes(hdr[28:]) + bytes(payload)
        crc = icrc(hdr[:20], sport, ROCE_UDP_PORT, body)
        return bytes(hdr[:28]) + body + crc

    def _feedback(self, qp: QueuePair, opcode: int, psn: int, sport: int, payload: bytes) -> None:
        self.feedback.append(
            Outgoing(qp, self.build(qp, opcode, qp.remote_qpn, psn, False, sport, payload))
        )

    # ---- packets in ----

    def receive(self, pkt: memoryview | bytes, now: float) -> None:
        """One IPv4 packet arrived (UDP dport 4791)."""
        self.rx_packets += 1
        pkt = memoryview(pkt)
        drops = self.drops
        n = len(pkt)
        if n < 20:
            drops["short"] += 1
            return
        ihl = (pkt[0] & 0x0F) * 4
        tos = pkt[1]
        if n < ihl + 8 or ihl < 20:
            drops["short"] += 1
            return
        sport, _dport, udp_len = struct.unpack_from("!HHH", pkt, ihl)
        end = ihl + udp_len
        if udp_len < 8 or end > n:
            drops["bad_udp_length"] += 1
            return
        off = ihl + 8
        int_bytes = None
        if self.cfg.int_dscp is not None and tos >> 2 == self.cfg.int_dscp:
            if end - off < SHIM_LEN or pkt[off] >> 4 != INT_TYPE_MD:
                drops["bad_int"] += 1
                return
            int_len = shim_total_len(pkt[off + 1])
            if off + int_len > end or int_len < HEADERS_LEN:
                drops["bad_int"] += 1
                return
            int_bytes = bytes(pkt[off : off + int_len])
            off += int_len
        if end - off < BTH_LEN + ICRC_LEN:
            drops["short"] += 1
            return
        body = pkt[off : end - ICRC_LEN]
        if icrc(bytes(pkt[:ihl]), sport, ROCE_UDP_PORT, body) != pkt[end - ICRC_LEN : end]:
            drops["bad_icrc"] += 1
            return
        opcode = body[0]
        dqpn, ap = struct.unpack_from("!II", body, 4)
        qp = self.qps.get(dqpn & 0xFFFFFF)
        if qp is None:
            if dqpn & 0xFFFFFF == PROBE_QPN:  # the NIC's prober's, not a lost queue pair's
                self.probes_ignored += 1
                return
            drops["unknown_qp"] += 1
            return
        if pkt[12:16] != qp.peer_addr:
            drops["wrong_peer"] += 1
            return
        psn = ap & PSN_MASK
        if opcode in _DATA_OPCODES:
            d = ((psn - qp.epsn + _HALF) & PSN_MASK) - _HALF
            if d == 0 and qp.gap is not None:
                self._settle_gap(qp, (pkt[4] << 8) | pkt[5])
            elif 0 < d < self.cfg.psn_window and qp.gap is None and not qp.nak_sent:
                # a gap up to a PSN that arrived and that this responder dropped itself
                # (it came after an earlier gap) is not the network's
                if qp.discarded_hi != (psn - 1) & PSN_MASK:
                    keep = self.sink is not None and int_bytes is not None
                    pkt_kept = bytes(pkt[:end]) if keep else b""
                    qp.gap = _Gap((pkt[4] << 8) | pkt[5], pkt_kept, ihl + 8, now)
            if self.sink is not None and int_bytes is not None:
                rep = self.sink.observe(pkt[:end], ihl + 8, now)
                if rep is not None:
                    self.reports.append(rep)
            qp._on_data(
                opcode,
                psn,
                bool(ap >> 31),
                body[BTH_LEN:],
                sport,
                tos & 0b11 == ECN_CE,
                int_bytes,
                now,
            )
        elif opcode == OP_ACK:
            if len(body) < BTH_LEN + AETH_LEN:
                drops["short"] += 1
                return
            rest = body[BTH_LEN + AETH_LEN :]
            syndrome = body[BTH_LEN]
            if syndrome == AETH_NAK_PSN_SEQ_ERR_SACK:  # a SACK header and nothing else
                if len(rest) != SACK_LEN:
                    drops["bad_sack"] += 1
                    return
                qp._on_ack(psn, syndrome, now, unpack_sack(rest))
                return
            if rest and not looks_like_int_echo(bytes(rest)):
                drops["bad_int_echo"] += 1
                return
            qp._on_ack(psn, syndrome, now)
        elif opcode == OP_CNP:
            qp.counters.cnps_received += 1
        else:
            drops["unknown_opcode"] += 1

    def _settle_gap(self, qp: QueuePair, ident: int) -> None:
        """The packet a gap was missing has come: sent before the packet that showed the gap,
        it was reordered; sent after, it is a resend and the first was lost on the way (the
        sink reports the loss, on the path the packet after the gap took)."""
        gap, qp.gap = qp.gap, None
        assert gap is not None
        if (ident - gap.ident) & 0xFFFF >= 0x8000:
            qp.counters.reordered += 1
            return
        qp.counters.gaps_lost += 1
        if self.sink is not None and gap.pkt:
            rep = self.sink.loss(gap.pkt, gap.int_off, gap.t)
            if rep is not None:
                self.reports.append(rep)

    # ---- reporting ----

    def counters(self) -> dict[str, object]:
        total = Counter[str]()
        for qp in self.qps.values():
            total.update(counter_values(qp.counters))
        sink = self.sink
        return {
            "rx_packets": self.rx_packets,
            "reports": dict(sink.reports) if sink is not None else {},
            "reports_suppressed": dict(sink.suppressed) if sink is not None else {},
            "report_errors": dict(sink.errors) if sink is not None else {},
            "drops": dict(self.drops),
            "qps": len(self.qps),
            "rate_hints": self.rate_hints_made,
            "transport": self.pipeline,
            **{k: total.get(k, 0) for k in QpCounters.__dataclass_fields__},
        }


__all__ = [
    "RETRANSMIT_SCHEMES",
    "Outgoing",
    "QpCounters",
    "QueuePair",
    "ReceivedMessage",
    "SendOp",
    "TransportConfig",
    "TransportCore",
    "counter_values",
]
