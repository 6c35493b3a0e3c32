"""The reference NIC: XDP's per-flow behaviour for one host, driven frame by frame.

`parse_feedback` finds an ACK or a CNP the way xm_parse_feedback() does; `ReferenceNic` keeps
each flow's state and runs its law on every feedback frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.nic.ratelaw.base import CcState, Law
from controller.nic.ratelaw.dcqcn import dcqcn_on_feedback
from controller.nic.ratelaw.echo import EchoError, parse_echo
from controller.nic.ratelaw.params import CcParams
from controller.nic.ratelaw.rtt import RttProbe, take_rtt_sample
from controller.nic.ratelaw.swift import swift_on_rtt
from controller.nic.ratelaw.timely import timely_on_rtt
from controller.nic.ratelaw.tita import HopSpeed, tita_on_ack
from controller.wire.roce import (
    AETH_ACK_MAX,
    AETH_LEN,
    BTH_LEN,
    BTH_PSN_OFFSET,
    ICRC_LEN,
    OP_ACK,
    OP_CNP,
    ROCE_UDP_PORT,
)


@dataclass(frozen=True)
class Feedback:
    """A parsed ACK or CNP (xm_parse_feedback()): the key is the data flow's."""

    key: tuple[int, int, int, int, int]  # saddr, daddr (network-order ints), sport, dport, proto
    psn: int
    is_cnp: bool
    echo: bytes
    ttl: int = 64  # the IPv4 TTL it arrived with (Swift counts hops from it)


def parse_feedback(frame: bytes) -> Feedback | None:
    """Ethernet/IPv4/UDP 4791/BTH ACK (ACK syndrome) or CNP; None for anything else."""
    if len(frame) < 14 + 20 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    if ip[0] >> 4 != 4 or ip[0] & 0xF < 5:
        return None
    ihl = (ip[0] & 0xF) * 4
    tot_len = int.from_bytes(ip[2:4], "big")
    if tot_len < ihl or 14 + tot_len > len(frame) or len(ip) < ihl:
        return None
    if ip[9] != 17 or int.from_bytes(ip[6:8], "big") & 0x3FFF:
        return None
    udp = ip[ihl:]
    if len(udp) < 8 or int.from_bytes(udp[2:4], "big") != ROCE_UDP_PORT:
        return None
    udp_len = int.from_bytes(udp[4:6], "big")
    if udp_len < 8 + BTH_LEN or udp_len > tot_len - ihl or len(udp) < 8 + BTH_LEN:
        return None
    bth = udp[8 : 8 + BTH_LEN]
    opcode = bth[0]
    psn = int.from_bytes(bth[BTH_PSN_OFFSET:BTH_LEN], "big")
    saddr = int.from_bytes(ip[12:16], "big")
    daddr = int.from_bytes(ip[16:20], "big")
    sport = int.from_bytes(udp[0:2], "big")
    key = (daddr, saddr, sport, ROCE_UDP_PORT, 17)
    aeth = 8 + BTH_LEN
    if opcode == OP_ACK:
        if udp_len < aeth + AETH_LEN + ICRC_LEN or len(udp) < aeth + AETH_LEN:
            return None
        if udp[aeth] > AETH_ACK_MAX:
            return None
        echo = bytes(udp[aeth + AETH_LEN : udp_len - ICRC_LEN])
        return Feedback(key, psn, False, echo, ip[8])
    if opcode == OP_CNP:
        return Feedback(key, psn, True, b"", ip[8])
    return None


@dataclass
class ReferenceNic:
    """The XDP program's per-flow behaviour for one host, driven packet by packet.

    The caller provides what XDP reads from other maps: the flow's tx bytes and next PSN
    (tc's xm_flows), its control entry (cap, weight, per-flow params) and the packet's
    arrival time (XDP's bpf_ktime_get_ns()).
    """

    line_rate_bps: int
    params: CcParams
    hop_speed: HopSpeed | None = None
    flows: dict[tuple[int, int, int, int, int], CcState] = field(default_factory=dict)

    def state(self, key: tuple[int, int, int, int, int]) -> CcState | None:
        """The flow's law state (XDP's xm_cc entry), None before its first feedback."""
        return self.flows.get(key)

    def reset(self) -> None:
        """Every flow forgotten (a new job)."""
        self.flows.clear()

    def on_frame(
        self,
        frame: bytes,
        *,
        now_ns: int,
        tx_bytes: int,
        snd_nxt_psn: int | None,
        cap_bps: int | None = None,
        weight: int = 1,
        params: CcParams | None = None,
        rtt_probe: RttProbe | None = None,
        paced_bps: int | None = None,
    ) -> int | None:
        """Process one received frame; returns the flow's rate after it (None: not feedback).
        `rtt_probe` is tc's probe of the flow (TIMELY and Swift take their samples from it);
        `paced_bps` its rate in the rate map before this frame (a flow paced below the
        ceiling before its first feedback, at a start rate the agent set, starts its law
        there)."""
        fb = parse_feedback(frame)
        if fb is None:
            return None
        prm = params or self.params
        if prm.law == Law.NONE or (prm.law != Law.DCQCN and fb.is_cnp):
            return self.flows[fb.key].rate_bps if fb.key in self.flows else None
        ceil = self.line_rate_bps if cap_bps is None else min(self.line_rate_bps, cap_bps)
        weight = weight or 1
        cc = self.flows.get(fb.key)
        if cc is None or cc.law != prm.law:
            start = ceil
            if cc is None and paced_bps and paced_bps < ceil:
                start = paced_bps
            probe = rtt_probe.seq if rtt_probe else 0
            cc = CcState.initial(prm.law, start, tx_bytes, now_ns, probe)
            self.flows[fb.key] = cc
        if prm.law in (Law.TITA, Law.HPCC):
            if fb.echo:
                hops = parse_echo(fb.echo)
                if not isinstance(hops, EchoError):
                    tita_on_ack(
                        cc,
                        prm,
                        hops,
                        ack_psn=fb.psn,
                        snd_nxt_psn=snd_nxt_psn,
                        tx_bytes=tx_bytes,
                        now_ns=now_ns,
                        ceil_bps=ceil,
                        weight=weight,
                        line_rate_bps=self.line_rate_bps,
                        hop_speed=self.hop_speed,
                        hpcc=prm.law == Law.HPCC,
                    )
        elif prm.law == Law.DCQCN:
            dcqcn_on_feedback(
                cc,
                prm,
                is_cnp=fb.is_cnp,
                tx_bytes=tx_bytes,
                now_ns=now_ns,
                ceil_bps=ceil,
                weight=weight,
            )
        else:
            rtt = take_rtt_sample(cc, rtt_probe, fb.psn, now_ns)
            if rtt is not None:
                if prm.law == Law.TIMELY:
                    timely_on_rtt(cc, prm, rtt, ceil, weight)
                else:
                    swift_on_rtt(cc, prm, rtt, fb.ttl, now_ns, ceil, weight)
        cc.last_fb_ns = now_ns
        cc.feedback += 1
        return cc.rate_bps
