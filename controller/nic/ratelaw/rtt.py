"""RTT samples for TIMELY and Swift: tc egress keeps one probe per flow (a data packet's PSN
and departure time, `tc_rtt_probe`), XDP takes the sample from the first ACK that covers it
(`take_rtt_sample`; xm_rtt_probe() in ebpf/tc_egress.c, xm_rtt_sample() in ebpf/xdp_ingress.c).
Under HTB pacing the wire's far end stamps the probe's departure (`wire_stamp_rtt_probe`,
ebpf/tc_wire.c); the twin's NIC runs tc at the departure itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.nic.ratelaw.base import ALL_ONES32, RTT_MAX_NS, CcState, Law, psn_ge


@dataclass
class RttProbe:
    """tc's RTT probe of a flow (xm_flow_stats): one data packet per RTT, its PSN and send
    time; `seq` counts probes, so XDP knows which one it has taken (cc.rtt_done_seq)."""

    seq: int = 0
    psn: int = 0
    sent_ns: int = 0
    wire_seq: int = 0  # the probe whose departure the wire stamped


RTT_LAWS = (Law.TIMELY, Law.SWIFT)  # the laws tc probes RTTs for


def tc_rtt_probe(probe: RttProbe, cc: CcState | None, psn: int, now_ns: int) -> None:
    """What tc egress does for every data packet of a flow under an RTT law: start a new
    probe when the last one was taken (or the flow has no CC state), or when this packet
    resends the probe's PSN or an earlier one (go-back-N: the probe's ACK would time the
    recovery too). The probe's ACK must not wait for the next packet (a coalescing receiver
    adds that wait to the RTT): the suite runs these laws with an ACK per packet."""
    if cc is None or cc.rtt_done_seq == probe.seq or psn_ge(probe.psn, psn):
        probe.seq = (probe.seq + 1) & ALL_ONES32
        probe.psn = psn
        probe.sent_ns = now_ns


def wire_stamp_rtt_probe(probe: RttProbe, psn: int, now_ns: int) -> bool:
    """xm_rtt_wire_stamp(): the probe's data packet left the NIC at `now_ns`, after its wait in
    its HTB class (which tc egress, before the qdisc, does not see): its first departure
    becomes the probe's send time. True when it did."""
    if probe.wire_seq == probe.seq or probe.psn != psn:
        return False
    probe.sent_ns = now_ns
    probe.wire_seq = probe.seq
    return True


def take_rtt_sample(cc: CcState, probe: RttProbe | None, ack_psn: int, now_ns: int) -> int | None:
    """xm_rtt_sample(): the RTT of tc's pending probe when this ACK covers it, else None."""
    if probe is None or probe.seq == cc.rtt_done_seq or not psn_ge(ack_psn, probe.psn):
        return None
    cc.rtt_done_seq = probe.seq
    rtt = now_ns - probe.sent_ns if now_ns > probe.sent_ns else 0
    return min(rtt, RTT_MAX_NS)
