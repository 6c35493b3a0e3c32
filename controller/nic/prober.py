"""The active prober of a host's NIC (Pingmesh, R-Pingmesh): probes to peers over every ECMP
path, the receiver counting each probe flow's losses from sequence numbers (sans-I/O: the
twin's hosts and the emulation's agents run it).

Each host probes every other host, up to 32 spread over the leaves (controller/topology.py
`probe_peers`: the controller tells each agent whom to probe), from `ports_per_peer` source
ports: ECMP hashes the source port, so the ports spread a pair's probes over the paths
between their leaves, and each probe flow (peer, port) keeps one path.
A probe is a SEND_ONLY to the peer's probe queue pair (controller/wire/probe.py): the NIC's
INT source gives it an INT stack, so the receiver learns the path each probe flow takes. No
probe is resent and each carries a sequence number: a gap is that many probes lost, exactly,
and a probe that comes late (reordered) is taken back off the count. A gap revealed by a
probe whose path held a queue of at least `congested_bytes` at some hop is also counted
`lost_congested` (a tail drop of congestion, not a fault), and one revealed while the
receiver's own socket was dropping packets (the agent read them too late) `lost_local`.

The engine sends what `next_probe` returns, one probe every `gap_s`, gives every packet the
host receives to `receive_packet` first (it takes the probes), and gives the localizer the
receivers' `flows` with each path mapped to links (controller/health.py `ProbeTally`).
"""

from __future__ import annotations

import socket
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from controller.wire import probe as wire
from controller.wire.int_md import (
    BIT_L1_PORTS,
    BIT_NODE_ID,
    BIT_QUEUE,
    decode_stack,
    int_stack_at,
    shim_total_len,
)
from controller.wire.ipv4 import ECT0, with_checksum
from controller.wire.roce import (
    BTH_LEN,
    ICRC_LEN,
    OP_SEND_ONLY,
    PSN_MASK,
    ROCE_UDP_PORT,
    icrc,
    next_entropy_port,
    pack_bth,
)
from controller.wire.telemetry_report import Hop

REORDER_WINDOW = 64  # missing probes per flow remembered, to take back one that comes late
MAX_FLOWS = 4096  # probe flows a receiver tracks; beyond it the oldest is forgotten (counted)
_PORT_LCG_SALT = 0x5EED  # the ports' LCG is not the transport's: probing moves no job's path
_IPV4_UDP = struct.Struct("!BBHHHBBH4s4sHHHH")
_ROCE_PORT = ROCE_UDP_PORT.to_bytes(2, "big")


def probe_packet(tg: ProbeTarget, seq: int, sent_ns: int, tos: int = ECT0, ttl: int = 64) -> bytes:
    """The IPv4 packet of probe `seq` of the probe flow `tg` (its IP ID counts the flow's
    probes): IPv4, UDP to 4791 from the flow's port, BTH, the probe, ICRC; ECN-capable like
    the data (a switch marks a probe as it marks data)."""
    body = pack_bth(OP_SEND_ONLY, wire.PROBE_QPN, seq & PSN_MASK) + wire.encode(seq, sent_ns)
    udp_len = 8 + len(body) + ICRC_LEN
    tg.ident = (tg.ident + 1) & 0xFFFF
    hdr = _IPV4_UDP.pack(
        0x45, tos, 20 + udp_len, tg.ident, 0x4000, ttl, socket.IPPROTO_UDP, 0,
        tg.local_addr, tg.peer_addr, tg.sport, ROCE_UDP_PORT, udp_len, 0,
    )  # fmt: skip
    return with_checksum(hdr + body + icrc(hdr[:20], tg.sport, ROCE_UDP_PORT, body))


@dataclass(frozen=True)
class ProbeConfig:
    interval_s: float  # between two probes of one probe flow (peer, source port)
    ports_per_peer: int = 8
    congested_bytes: int = 0  # a gap revealed by a probe that saw this queue: congestion

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.ports_per_peer < 1 or self.congested_bytes < 0:
            raise ValueError("interval_s must be > 0, ports_per_peer >= 1, congested_bytes >= 0")


@dataclass
class ProbeTarget:
    """A probe flow this host sends."""

    peer_ip: str
    sport: int
    local_addr: bytes
    peer_addr: bytes
    ident: int = 0
    seq: int = 0


@dataclass
class ProbeFlowRx:
    """A probe flow as its receiver sees it."""

    src: str
    sport: int
    next_seq: int | None = None
    received: int = 0
    lost: int = 0
    lost_congested: int = 0  # of `lost`
    # of `lost`, gaps revealed while the receiver's own socket dropped packets (it read them
    # too late: the probes may have been lost at home, not in the network)
    lost_local: int = 0
    duplicates: int = 0
    hops: tuple[Hop, ...] = ()  # the latest probe's path, sender's first hop first
    # probes found missing and not (yet) come: seq -> why they are excused ("", "congested",
    # "local")
    missing: OrderedDict[int, str] = field(default_factory=OrderedDict)
    overflow_seen: int | None = None  # the receiver's socket drops at this flow's last probe


class Prober:
    """One host's prober: the probes it sends (round robin over its probe flows) and the
    probe flows it receives."""

    def __init__(self, local_ip: str, peers: Sequence[str], cfg: ProbeConfig, seed: int) -> None:
        self.cfg = cfg
        self.local_ip = local_ip
        local = socket.inet_aton(local_ip)
        state = (seed ^ _PORT_LCG_SALT) & 0xFFFFFFFF
        self.targets: list[ProbeTarget] = []
        for peer in peers:
            used: set[int] = set()
            while len(used) < cfg.ports_per_peer:
                state, sport = next_entropy_port(state)
                if sport not in used:
                    used.add(sport)
                    self.targets.append(ProbeTarget(peer, sport, local, socket.inet_aton(peer)))
        self._next = 0
        self.sent = 0
        self.flows: OrderedDict[tuple[bytes, int], ProbeFlowRx] = OrderedDict()
        self.flows_evicted = 0
        self.malformed = 0  # probes the receiver could not read

    @property
    def gap_s(self) -> float:
        """Time between two probes this host sends (its flows take turns)."""
        return self.cfg.interval_s / max(1, len(self.targets))

    def next_probe(self, now_ns: int) -> tuple[ProbeTarget, bytes] | None:
        """The next probe flow's probe (an IPv4 packet)."""
        if not self.targets:
            return None
        tg = self.targets[self._next]
        self._next = (self._next + 1) % len(self.targets)
        pkt = probe_packet(tg, tg.seq, now_ns)
        tg.seq = (tg.seq + 1) % wire.SEQ_MOD
        self.sent += 1
        return tg, pkt

    def receive_packet(
        self, pkt: bytes | memoryview, int_dscp: int | None, rx_overflow: int | None = None
    ) -> bool:
        """An IPv4 packet the host received: False when it is no probe (for the transport),
        True when it was one (counted here; one this prober cannot read is `malformed`).
        Its INT headers are read when its DSCP is `int_dscp`; `rx_overflow`: the packets the
        receiving socket had dropped when this one was queued (SO_RXQ_OVFL; None: no socket)."""
        n = len(pkt)
        if n < 28 or pkt[9] != socket.IPPROTO_UDP:
            return False
        ihl = (pkt[0] & 0x0F) * 4
        if ihl < 20 or n < ihl + 8 + BTH_LEN or pkt[ihl + 2 : ihl + 4] != _ROCE_PORT:
            return False
        off = ihl + 8
        int_bytes = None
        if int_dscp is not None and pkt[1] >> 2 == int_dscp:
            int_len = shim_total_len(pkt[off + 1])
            int_bytes = bytes(pkt[off : off + int_len])
            off += int_len
        if n < off + BTH_LEN or int.from_bytes(pkt[off + 5 : off + 8], "big") != wire.PROBE_QPN:
            return False
        end = ihl + int.from_bytes(pkt[ihl + 4 : ihl + 6], "big")
        body = memoryview(pkt)[off : end - ICRC_LEN]
        sport = int.from_bytes(pkt[ihl : ihl + 2], "big")
        if (
            end > n
            or len(body) < BTH_LEN
            or pkt[off] != OP_SEND_ONLY
            or icrc(bytes(pkt[:ihl]), sport, ROCE_UDP_PORT, body) != pkt[end - ICRC_LEN : end]
        ):
            self.malformed += 1
            return True
        self.receive(bytes(pkt[12:16]), sport, body[BTH_LEN:], int_bytes, rx_overflow)
        return True

    def receive(
        self,
        src: bytes | memoryview,
        sport: int,
        payload: memoryview,
        int_bytes: bytes | None,
        rx_overflow: int | None = None,
    ) -> None:
        """A probe arrived from `src` (its source port `sport`, its INT headers if any;
        `rx_overflow` as `receive_packet` says)."""
        p = wire.decode(payload)
        if p is None or p.kind != wire.KIND_PROBE:
            self.malformed += 1
            return
        hops: tuple[Hop, ...] = ()
        if int_bytes is not None:
            try:
                bitmap, hop_ml, stack = int_stack_at(int_bytes, 0)
                hops = tuple(
                    Hop(
                        node_id=h.get("node_id"),
                        in_port=h.get("l1_ingress_port"),
                        out_port=h.get("l1_egress_port"),
                        qocc=h.get("queue_occupancy"),
                    )
                    for h in reversed(decode_stack(stack, bitmap, hop_ml))
                )
            except ValueError:
                self.malformed += 1
                return
            need = (BIT_NODE_ID, BIT_L1_PORTS, BIT_QUEUE)
            if not all(bitmap & (0x8000 >> b) for b in need):
                hops = tuple(Hop(node_id=h.node_id) for h in hops)
        key = (bytes(src), sport)
        f = self.flows.get(key)
        if f is None:
            f = self.flows[key] = ProbeFlowRx(socket.inet_ntoa(src), sport)
            if len(self.flows) > MAX_FLOWS:
                self.flows.popitem(last=False)
                self.flows_evicted += 1
        else:
            self.flows.move_to_end(key)
        f.hops = hops
        # the socket dropped packets since this flow's last probe: a gap may be the host's
        local = rx_overflow is not None and rx_overflow != (f.overflow_seen or 0)
        f.overflow_seen = rx_overflow
        seq = p.seq
        if f.next_seq is None or seq == f.next_seq:
            f.received += 1
            f.next_seq = (seq + 1) % wire.SEQ_MOD
            return
        ahead = (seq - f.next_seq) % wire.SEQ_MOD
        if ahead < wire.SEQ_MOD // 2:  # probes next_seq .. seq-1 did not come
            why = "local" if local else "congested" if self._congested(hops) else ""
            f.lost += ahead
            if why == "local":
                f.lost_local += ahead
            elif why == "congested":
                f.lost_congested += ahead
            for s in range(max(0, ahead - REORDER_WINDOW), ahead):
                f.missing[(f.next_seq + s) % wire.SEQ_MOD] = why
            while len(f.missing) > REORDER_WINDOW:
                f.missing.popitem(last=False)
            f.received += 1
            f.next_seq = (seq + 1) % wire.SEQ_MOD
        elif seq in f.missing:  # late, not lost
            why = f.missing.pop(seq)
            if why == "local":
                f.lost_local -= 1
            elif why == "congested":
                f.lost_congested -= 1
            f.lost -= 1
            f.received += 1
        else:
            f.duplicates += 1

    def _congested(self, hops: tuple[Hop, ...]) -> bool:
        limit = self.cfg.congested_bytes
        return limit > 0 and any(h.qocc is not None and h.qocc >= limit for h in hops)
