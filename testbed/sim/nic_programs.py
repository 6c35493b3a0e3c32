"""The NIC's two eBPF programs in Python, as the twin drives them: tc egress (the INT source,
the flow's accounting and RTT probe: ebpf/tc_egress.c) and XDP ingress (the rate laws:
ebpf/xdp_ingress.c, through controller.nic.ratelaw.ReferenceNic).

`ReferencePrograms` is the reference; testbed/sim/nic_native.py's `NativeNic` runs the C
programs themselves with the same interface, and tests/test_nic_native.py holds the two equal
(the frames tc sends, the flows' counters and the laws' states). What the agent writes to the
maps for them (the host's config, a flow's start rate: SetRate) is a method call here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.nic.ratelaw import (
    RTT_LAWS,
    CcParams,
    CcState,
    ReferenceNic,
    RttProbe,
    tc_rtt_probe,
)
from controller.nic.ratelaw.base import ALL_ONES32
from controller.wire.int_md import MD_LEN, SHIM_LEN, hop_ml_words
from controller.wire.ipv4 import ETHERTYPE_IPV4, checksum
from controller.wire.roce import BTH_LEN, OP_RC_DATA_MAX, ROCE_UDP_PORT

FlowKey = tuple[int, int, int, int, int]  # saddr, daddr (network-order ints), sport, dport, proto
ALL_PORTS = ALL_ONES32  # xm_hop_key.port of a node's default speed


@dataclass(frozen=True)
class IntSource:
    """The host's INT source settings (SetInt): on, DSCP, instruction bitmap, hop budget."""

    enabled: bool
    dscp: int
    bitmap: int
    hop_budget: int
    max_frame: int  # the NIC's link MTU + Ethernet


def insert_int(pkt: bytes, src: IntSource) -> bytes | None:
    """`xm_int_insert()` on an IPv4 data packet; None when the program leaves it alone."""
    ihl = (pkt[0] & 0x0F) * 4
    tos = pkt[1]
    grow = SHIM_LEN + MD_LEN
    if ihl != 20 or tos >> 2 == src.dscp or 14 + len(pkt) + grow > src.max_frame:
        return None
    bitmap = src.bitmap & 0xFFFF
    hdr = bytearray(grow)
    hdr[0] = 1 << 4  # shim: type 1 (INT-MD), NPT 0
    hdr[1] = MD_LEN // 4  # shim length: MD header, empty stack
    hdr[3] = tos & 0xFC  # original DSCP, restored by the sink
    hdr[4] = 2 << 4  # version 2, D/E/M clear
    hdr[6] = hop_ml_words(bitmap) & 0x1F  # HopML
    hdr[7] = src.hop_budget & 0xFF  # RemainingHopCnt
    hdr[8] = bitmap >> 8
    hdr[9] = bitmap & 0xFF
    udp = bytearray(pkt[20:28])
    udp[4:6] = (int.from_bytes(udp[4:6], "big") + grow).to_bytes(2, "big")
    udp[6:8] = b"\x00\x00"  # INT packets carry no UDP checksum: the stack grows per hop
    ip = bytearray(pkt[:20])
    ip[1] = (src.dscp << 2) | (tos & 3)
    ip[2:4] = (int.from_bytes(ip[2:4], "big") + grow).to_bytes(2, "big")
    ip[10:12] = b"\x00\x00"
    ip[10:12] = checksum(ip).to_bytes(2, "big")
    return bytes(ip) + bytes(udp) + bytes(hdr) + pkt[28:]


def tc_parse(frame: bytes) -> tuple[FlowKey, int | None, int] | None:
    """xm_tc_parse(): the frame's flow, its BTH opcode (None: not RoCE) and PSN; None for a
    frame tc does not account (not IPv4 UDP or TCP, malformed, a later fragment)."""
    if len(frame) < 14 + 20 or frame[12:14] != ETHERTYPE_IPV4:
        return None
    ip = frame[14:]
    if ip[0] >> 4 != 4 or ip[0] & 0x0F < 5:
        return None
    ihl = (ip[0] & 0x0F) * 4
    tot_len = int.from_bytes(ip[2:4], "big")
    if tot_len < ihl or 14 + tot_len > len(frame):
        return None
    proto = ip[9]
    if proto not in (6, 17) or int.from_bytes(ip[6:8], "big") & 0x1FFF:
        return None
    if ihl + 8 > tot_len:
        return None
    sport = int.from_bytes(ip[ihl : ihl + 2], "big")
    dport = int.from_bytes(ip[ihl + 2 : ihl + 4], "big")
    key = (int.from_bytes(ip[12:16], "big"), int.from_bytes(ip[16:20], "big"), sport, dport, proto)
    bth = ihl + 8
    if (
        proto == 17
        and dport == ROCE_UDP_PORT
        and int.from_bytes(ip[ihl + 4 : ihl + 6], "big") >= 8 + BTH_LEN
        and bth + BTH_LEN <= tot_len
    ):
        return key, ip[bth], int.from_bytes(ip[bth + 9 : bth + 12], "big")
    return key, None, 0


@dataclass
class FlowStats:
    """tc's per-flow counters (struct xm_flow_stats, the fields the laws read)."""

    tx_bytes: int = 0
    snd_nxt_psn: int | None = None
    probe: RttProbe = field(default_factory=RttProbe)


class ReferencePrograms:
    """tc egress and XDP ingress of one host, in Python."""

    def __init__(
        self,
        line_rate_bps: int,
        params: CcParams,
        hop_speeds: dict[tuple[int, int], int],
        int_source: IntSource,
    ):
        self.int_source = int_source

        def hop_speed(node: int, port: int) -> int:
            """xm_hop_speed_of(): the port's speed, else its node's (port ALL_PORTS)."""
            return hop_speeds.get((node, port)) or hop_speeds.get((node, ALL_PORTS), 0)

        self.laws = ReferenceNic(line_rate_bps, params, hop_speed)
        self.stats: dict[FlowKey, FlowStats] = {}
        self.rates: dict[FlowKey, int] = {}  # xm_rates: the start rates, then the laws'

    @property
    def params(self) -> CcParams:
        return self.laws.params

    @params.setter
    def params(self, params: CcParams) -> None:
        self.laws.params = params

    def egress(self, frame: bytes, now_ns: int) -> bytes:
        """tc egress on a frame the host sends (Ethernet header first): a data packet gets
        INT; its flow's bytes (as sent), next PSN and RTT probe are counted."""
        parsed = tc_parse(frame)
        if parsed is None:
            return frame
        key, opcode, psn = parsed
        data = opcode is not None and opcode <= OP_RC_DATA_MAX
        if data and self.int_source.enabled:
            with_int = insert_int(frame[14:], self.int_source)
            if with_int is not None:
                frame = frame[:14] + with_int
        st = self.stats.get(key)
        if st is None:
            st = self.stats[key] = FlowStats()
        st.tx_bytes += len(frame)
        if data:
            st.snd_nxt_psn = (psn + 1) & 0xFFFFFF
            if self.laws.params.law in RTT_LAWS:
                tc_rtt_probe(st.probe, self.laws.state(key), psn, now_ns)
        return frame

    def ingress(self, frame: bytes, now_ns: int, key: FlowKey) -> int | None:
        """XDP on a feedback frame of the flow `key` (the caller read it from the headers):
        the flow's rate after it, None when it was no feedback the law acted on."""
        st = self.stats.get(key)
        if st is None:
            return None  # feedback for a flow this host never sent is not its to act on
        rate = self.laws.on_frame(
            frame,
            now_ns=now_ns,
            tx_bytes=st.tx_bytes,
            snd_nxt_psn=st.snd_nxt_psn,
            rtt_probe=st.probe,
            paced_bps=self.rates.get(key),
        )
        if rate is not None:
            self.rates[key] = rate
        return rate

    def set_rate(self, key: FlowKey, rate_bps: int) -> None:
        """The agent's SetRate: the flow's rate in xm_rates (0: none)."""
        if rate_bps:
            self.rates[key] = rate_bps
        else:
            self.rates.pop(key, None)

    def state(self, key: FlowKey) -> CcState | None:
        return self.laws.state(key)

    def flow_stats(self, key: FlowKey) -> FlowStats | None:
        return self.stats.get(key)

    def reset(self) -> None:
        """Every flow forgotten (a new job)."""
        self.laws.reset()
        self.stats.clear()
        self.rates.clear()
