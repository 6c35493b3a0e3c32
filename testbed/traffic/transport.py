"""RoCEv2-like reliable transport over UDP 4791, in userspace, many queue pairs per host.

One `Transport` per host (network namespace), single-threaded: the application drives it with
`run_until()`. A queue pair (`QueuePair`) is full duplex, like an RC QP: its requester half
segments posted messages into MTU-sized RC SEND packets and retransmits go-back-N on a NAK or a
timeout; its responder half reassembles in PSN order, ACKs (coalesced), NAKs a PSN gap once,
sends a CNP for ECN-CE data at most once per interval, and echoes a received INT stack in the
ACK (docs/wire-format.md). Queue pairs are set up out of band: both ends are created with
each other's QPN and the same initial PSNs (the workload runner does that).

There is no pacing here: the NIC (tc eBPF) paces. The transport sends until the window or the
queue pair's socket buffer is full and then waits; a packet the qdisc refuses (ENOBUFS) is sent
again later, never skipped. Bad input is counted per reason in `drops` and dropped.
"""

from __future__ import annotations

import ipaddress
import os
import random
import selectors
import socket
import struct
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

from controller.wire.int_md import INT_DSCP_DEFAULT, INT_TYPE_MD, looks_like_int_echo
from controller.wire.roce import (
    AETH_ACK,
    AETH_LEN,
    AETH_NAK_PSN_SEQ_ERR,
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
    icrc,
    is_nak,
    pack_aeth,
)
from testbed.traffic.sockets import is_would_block, open_rx_sockets, open_tx_socket

ECT0 = 0b10
ECN_CE = 0b11
_IP_UDP_BTH = struct.Struct("!BBHHHBBH4s4sHHHHBBHII")  # IPv4 (20) + UDP (8) + BTH (12)
_IPV4_DF = 0x4000
_HALF = 1 << 23


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
    sndbuf: int = 1 << 18  # per QP socket: bounds what waits in the NIC's pacing queue
    rcvbuf: int = 1 << 24
    nobufs_backoff: float = 200e-6  # s before re-sending a packet the qdisc refused

    def __post_init__(self) -> None:
        if not 1 <= self.mtu <= 9000 - 100:
            raise ValueError(f"mtu {self.mtu} out of range")
        if not 1 <= self.window < _HALF or not 1 <= self.ack_every:
            raise ValueError("window must be in [1, 2^23) and ack_every >= 1")
        if not 1 <= self.psn_window <= _HALF:
            raise ValueError("psn_window must be in [1, 2^23]")
        ipaddress.IPv4Address(self.local_ip)


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
    rx_bytes: int = 0  # payload bytes delivered in order
    acks_sent: int = 0
    naks_sent: int = 0
    cnps_sent: int = 0
    ecn_ce_seen: int = 0
    int_seen: int = 0
    int_echoes_sent: int = 0
    tx_blocked: int = 0  # sends that found the socket buffer full (EAGAIN)
    tx_nobufs: int = 0  # sends the qdisc refused (ENOBUFS), sent again later
    messages_sent: int = 0
    messages_received: int = 0


@dataclass
class SendOp:
    """A posted message. `t_done` is set when the last packet is acknowledged."""

    data: memoryview
    first_seq: int
    npkts: int
    t_post: float
    tag: object = None
    t_done: float | None = None

    @property
    def done(self) -> bool:
        return self.t_done is not None

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass
class ReceivedMessage:
    data: bytearray  # handed over without a copy
    t_first: float  # first packet of the message accepted
    t_done: float  # last packet accepted


class QueuePair:
    """One end of a reliable connection. Create with `Transport.create_qp`."""

    def __init__(
        self,
        transport: Transport,
        qpn: int,
        peer_ip: str,
        remote_qpn: int,
        sport: int,
        sq_psn: int,
        rq_psn: int,
    ) -> None:
        self.t = transport
        self.qpn = qpn
        self.peer_ip = peer_ip
        self.peer_addr = socket.inet_aton(peer_ip)
        self.remote_qpn = remote_qpn
        self.sport = sport
        self.counters = QpCounters()
        self.sock = open_tx_socket(transport.cfg.sndbuf)
        # requester: sequence numbers are unbounded ints, PSN = (sq_psn + seq) mod 2^24
        self.sq_psn = sq_psn & PSN_MASK
        self.send_q: deque[SendOp] = deque()  # posted, not yet fully acknowledged
        self.completions: deque[SendOp] = deque()
        self.una = 0  # oldest unacknowledged
        self.nxt = 0  # next to send
        self.high = 0  # one past the highest ever sent
        self.tail = 0  # one past the last queued
        self.rto = transport.cfg.rto
        self.last_progress = 0.0
        self.blocked = False  # socket buffer full: waiting for writability
        self.retry_at = 0.0  # qdisc refused a packet: resend after this time
        self._cur = 0  # index in send_q of the op holding `nxt` (a hint)
        # responder
        self.epsn = rq_psn & PSN_MASK  # expected PSN
        self.msn = 0
        self.rx_buf = bytearray()
        self.rx_t_first = 0.0
        self.in_msg = False
        self.unacked = 0
        self.nak_sent = False
        self.last_cnp = -1e9
        self.pending_int: bytes | None = None
        self.feedback_sport: int | None = None  # the data sender's UDP sport, for ACKs/CNPs
        self.recv_q: deque[ReceivedMessage] = deque()

    # ---- application API ----

    def post_send(self, data: bytes | bytearray | memoryview, tag: object = None) -> SendOp:
        """Queue a message; returns its SendOp (done when fully acknowledged)."""
        mv = memoryview(data).cast("B")
        npkts = max(1, -(-len(mv) // self.t.cfg.mtu))
        op = SendOp(mv, self.tail, npkts, time.monotonic(), tag)
        self.tail += npkts
        self.send_q.append(op)
        self.t._active.add(self)
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

    def _on_ack(self, psn: int, syndrome: int, now: float) -> None:
        c = self.counters
        if is_nak(syndrome):
            if syndrome != AETH_NAK_PSN_SEQ_ERR:
                self.t.drops["nak_unsupported"] += 1
                return
            expected = self._seq_of(psn, self.una)
            if not self.una <= expected <= self.high:
                self.t.drops["ack_out_of_window"] += 1
                return
            c.naks_received += 1
            self._advance(expected, now)
            if expected < self.high:
                self.nxt = expected  # go back N
            return
        acked = self._seq_of(psn, self.una)
        if acked >= self.high:
            self.t.drops["ack_out_of_window"] += 1
            return
        c.acks_received += 1
        if acked >= self.una:
            self._advance(acked + 1, now)

    def _advance(self, una: int, now: float) -> None:
        if una <= self.una:
            return
        self.una = una
        self.nxt = max(self.nxt, una)
        self.rto = self.t.cfg.rto
        self.last_progress = now
        q = self.send_q
        while q and q[0].first_seq + q[0].npkts <= una:
            op = q.popleft()
            op.t_done = now
            self.completions.append(op)
            self.counters.messages_sent += 1
            self._cur = max(0, self._cur - 1)
        if q or self.nxt < self.tail:
            self.t._active.add(self)

    def _check_timeout(self, now: float) -> None:
        if self.una < self.high and now - self.last_progress > self.rto:
            self.counters.timeouts += 1
            self.nxt = self.una
            self.rto = min(self.rto * 2, self.t.cfg.rto_max)
            self.last_progress = now
            self.t._active.add(self)

    def _pump(self, budget: int, now: float) -> int:
        """Send up to `budget` packets; returns how many were sent."""
        cfg = self.t.cfg
        sent = 0
        while sent < budget and self.nxt < self.tail and self.nxt - self.una < cfg.window:
            seq = self.nxt
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
            payload = op.data[i * cfg.mtu : (i + 1) * cfg.mtu]
            ackreq = i == op.npkts - 1 or seq - self.una + 1 >= cfg.window
            if self.una == self.high:
                self.last_progress = now  # the RTO runs from the first packet in flight
            if not self.t._send(
                self, opcode, self.remote_qpn, self._psn(seq), ackreq, self.sport, payload
            ):
                break
            c = self.counters
            c.tx_packets += 1
            c.tx_bytes += len(payload)
            if seq < self.high:
                c.retransmits += 1
            self.nxt = seq + 1
            self.high = max(self.high, self.nxt)
            sent += 1
        return sent

    @property
    def wants_to_send(self) -> bool:
        return self.nxt < self.tail and self.nxt - self.una < self.t.cfg.window

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
        cfg = self.t.cfg
        c = self.counters
        self.feedback_sport = sport
        if ce:
            c.ecn_ce_seen += 1
            if now - self.last_cnp >= cfg.cnp_interval:
                self.last_cnp = now
                self.t._send(self, OP_CNP, self.remote_qpn, 0, False, sport, bytes(CNP_LEN))
                c.cnps_sent += 1
        if int_bytes is not None:
            c.int_seen += 1
        d = ((psn - self.epsn + _HALF) & PSN_MASK) - _HALF
        if d > 0:
            if d >= cfg.psn_window:
                self.t.drops["psn_out_of_window"] += 1
                return
            self.t.drops["out_of_order"] += 1
            if not self.nak_sent or ackreq:
                self.nak_sent = True
                self._send_ack(AETH_NAK_PSN_SEQ_ERR, self.epsn, sport)
            return
        if d < 0:
            if d < -cfg.psn_window:
                self.t.drops["psn_out_of_window"] += 1
                return
            self.t.drops["duplicate"] += 1
            if ackreq:
                self._send_ack(AETH_ACK, (self.epsn - 1) & PSN_MASK, sport)
            return
        # in order: check it continues the message the way the opcodes say
        first = opcode in (OP_SEND_FIRST, OP_SEND_ONLY)
        last = opcode in (OP_SEND_LAST, OP_SEND_ONLY)
        if first == self.in_msg:
            self.t.drops["bad_opcode_sequence"] += 1
            return
        n = len(payload)
        if n > cfg.mtu or (not last and n != cfg.mtu):
            self.t.drops["bad_length"] += 1
            return
        if first:
            self.rx_buf = bytearray()
            self.rx_t_first = now
        self.rx_buf += payload
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
            self.recv_q.append(ReceivedMessage(self.rx_buf, self.rx_t_first, now))
            self.rx_buf = bytearray()
            c.messages_received += 1

    def _send_ack(self, syndrome: int, psn: int, sport: int) -> None:
        echo = self.pending_int or b""
        self.pending_int = None
        if self.t._send(
            self,
            OP_ACK,
            self.remote_qpn,
            psn,
            False,
            sport,
            pack_aeth(syndrome, self.msn) + echo,
            force=True,
        ):
            self.unacked = 0
            if syndrome == AETH_ACK:
                self.counters.acks_sent += 1
            else:
                self.counters.naks_sent += 1
            if echo:
                self.counters.int_echoes_sent += 1


class Transport:
    """All queue pairs of one host, their sockets and one receive loop."""

    def __init__(self, cfg: TransportConfig) -> None:
        self.cfg = cfg
        self.local_addr = socket.inet_aton(cfg.local_ip)
        self.rx, self._rx_udp = open_rx_sockets(ROCE_UDP_PORT, cfg.rcvbuf)
        self.rx.setblocking(False)
        self.qps: dict[int, QueuePair] = {}
        self.drops: Counter[str] = Counter()
        self.rx_packets = 0
        self._active: set[QueuePair] = set()  # QPs that may have something to send
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.rx, selectors.EVENT_READ)
        self._buf = bytearray(65536)
        self._hdr = bytearray(_IP_UDP_BTH.size)
        self._tos = (cfg.dscp << 2) | ECT0
        self._used_ports: set[int] = set()
        self._rng = random.Random(os.getpid() ^ int(time.time_ns()))

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
    ) -> QueuePair:
        """A queue pair; the peer must create the mirror one (its qpn = our remote_qpn, its
        rq_psn = our sq_psn). `sport` is this QP's entropy source port (random if None)."""
        if not 0 < qpn <= 0xFFFFFF or not 0 < remote_qpn <= 0xFFFFFF:
            raise ValueError("QPNs must be in 1..2^24-1")
        if qpn in self.qps:
            raise ValueError(f"QPN {qpn:#x} exists")
        if sport is None:
            sport = self._rng.randrange(49152, 65536)
            while sport in self._used_ports:
                sport = self._rng.randrange(49152, 65536)
        self._used_ports.add(sport)
        qp = QueuePair(self, qpn, peer_ip, remote_qpn, sport, sq_psn, rq_psn)
        self.qps[qpn] = qp
        return qp

    def close(self) -> None:
        for qp in self.qps.values():
            qp.sock.close()
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
        busy = self._receive(now, 256)
        for qp in list(self.qps.values()):
            if qp.una < qp.high:
                qp._check_timeout(now)
        busy |= self._send_round(now)
        if not busy:
            self._wait(now, max_wait)

    def _send_round(self, now: float) -> bool:
        sent = 0
        for qp in list(self._active):
            if qp.blocked or qp.retry_at > now:
                continue
            if not qp.wants_to_send:
                if qp.nxt >= qp.tail:
                    self._active.discard(qp)
                continue
            sent += qp._pump(32, now)
        return sent > 0

    def _wait(self, now: float, max_wait: float) -> None:
        timeout = max_wait
        for qp in self.qps.values():
            if qp.una < qp.high:
                timeout = min(timeout, qp.last_progress + qp.rto - now)
            if qp.retry_at > now:
                timeout = min(timeout, qp.retry_at - now)
        for key, _ in self._sel.select(max(0.0, timeout)):
            obj = key.data
            if isinstance(obj, QueuePair):
                obj.blocked = False
                self._sel.unregister(obj.sock)

    # ---- packets out ----

    def _send(
        self,
        qp: QueuePair,
        opcode: int,
        dqpn: int,
        psn: int,
        ackreq: bool,
        sport: int,
        payload: bytes | memoryview,
        force: bool = False,
    ) -> bool:
        """Build and send one packet on `qp`'s socket. False if it could not go now.

        Feedback (ACK/NAK/CNP) is sent with `force`: it is not retried later, so a full socket
        buffer costs that one feedback packet (counted), as a lossy wire would.
        """
        udp_len = 8 + BTH_LEN + len(payload) + ICRC_LEN
        hdr = self._hdr
        _IP_UDP_BTH.pack_into(
            hdr,
            0,
            0x45,
            self._tos,
            20 + udp_len,
            0,
            _IPV4_DF,
            self.cfg.ttl,
            socket.IPPROTO_UDP,
            0,
            self.local_addr,
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
        crc = icrc(hdr[:20], sport, ROCE_UDP_PORT, bytes(hdr[28:]) + bytes(payload))
        try:
            qp.sock.sendmsg([hdr, payload, crc], [], 0, (qp.peer_ip, 0))
            return True
        except OSError as exc:
            if is_would_block(exc):
                qp.counters.tx_blocked += 1
                if not force and not qp.blocked:
                    qp.blocked = True
                    self._sel.register(qp.sock, selectors.EVENT_WRITE, qp)
            elif exc.errno == 105:  # ENOBUFS: the qdisc (NIC pacing queue) is full
                qp.counters.tx_nobufs += 1
                if not force:
                    qp.retry_at = time.monotonic() + self.cfg.nobufs_backoff
            else:
                raise
            if force:
                self.drops["feedback_not_sent"] += 1
            return False

    # ---- packets in ----

    def _receive(self, now: float, budget: int) -> bool:
        got = 0
        buf = self._buf
        mv = memoryview(buf)
        while got < budget:
            try:
                n = self.rx.recv_into(buf)
            except (BlockingIOError, InterruptedError):
                break
            got += 1
            self.rx_packets += 1
            self._dispatch(mv[:n], now)
        return got > 0

    def _dispatch(self, pkt: memoryview, now: float) -> None:
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
            if end - off < 4 or pkt[off] >> 4 != INT_TYPE_MD:
                drops["bad_int"] += 1
                return
            int_len = 4 + 4 * pkt[off + 1]
            if off + int_len > end or int_len < 16:
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
            drops["unknown_qp"] += 1
            return
        if pkt[12:16] != qp.peer_addr:
            drops["wrong_peer"] += 1
            return
        psn = ap & PSN_MASK
        if opcode in (OP_SEND_FIRST, OP_SEND_MIDDLE, OP_SEND_LAST, OP_SEND_ONLY):
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
            if rest and not looks_like_int_echo(bytes(rest)):
                drops["bad_int_echo"] += 1
                return
            syndrome = body[BTH_LEN]
            qp._on_ack(psn, syndrome, now)
        elif opcode == OP_CNP:
            qp.counters.cnps_received += 1
        else:
            drops["unknown_opcode"] += 1

    # ---- reporting ----

    def counters(self) -> dict[str, object]:
        total = Counter[str]()
        for qp in self.qps.values():
            total.update(asdict(qp.counters))
        return {
            "rx_packets": self.rx_packets,
            "drops": dict(self.drops),
            "qps": len(self.qps),
            **{k: total.get(k, 0) for k in QpCounters.__dataclass_fields__},
        }


__all__ = ["QueuePair", "ReceivedMessage", "SendOp", "Transport", "TransportConfig"]
