"""Swift (Kumar et al., SIGCOMM 2020) as a rate law, on one RTT sample per RTT; ebpf/lib/swift.h
is the same, operation for operation.

Target = base + per-hop x hops (hops from the ACK's TTL); below it the rate grows by one
window increment per RTT (ai / RTT), above it x max(1 - beta (d - t)/d, 1 - max_mdf), at most
once per RTT; beta 0.8, max_mdf 0.5. The target's base is T (the model's base RTT), T/4 per
hop: the paper's values are for Google's fabric and do not scale by rate alone.
"""

from __future__ import annotations

from controller.nic.ratelaw.base import (
    CUT_SEEN,
    MAX_HOPS,
    NSEC,
    U64,
    UNIT,
    UNIT_SHIFT,
    CcState,
    bound_rate,
    scale_rate,
)
from controller.nic.ratelaw.params import CcParams


def swift_on_rtt(
    cc: CcState, prm: CcParams, rtt: int, ttl: int, now_ns: int, ceil_bps: int, weight: int
) -> str:
    """xm_swift_on_rtt(): Swift's AIMD on one RTT sample against its scaled target."""
    w = prm.swift
    hops = min(w.sender_ttl - ttl if w.sender_ttl > ttl else 0, MAX_HOPS)
    target = w.base_target_ns + hops * w.per_hop_ns
    cc.rtt_ns = rtt
    if rtt < target:
        # the window grows by ai per RTT: as a rate, ai over this RTT
        rate = cc.rate_bps + (w.ai_bytes * 8 * NSEC // (rtt or 1)) * weight
        counter = "XDP_SWIFT_INCREASE"
    elif cc.flags & CUT_SEEN and ((now_ns - cc.last_cut_ns) & U64) < rtt:
        return "XDP_SWIFT_DECREASE_HELD"  # at most one decrease per RTT
    else:
        dec = min(
            (w.beta * (((rtt - target) << UNIT_SHIFT) // (rtt or 1))) >> UNIT_SHIFT, w.max_mdf
        )
        rate = scale_rate(cc.rate_bps, UNIT - dec)
        cc.last_cut_ns = now_ns
        cc.flags |= CUT_SEEN
        counter = "XDP_SWIFT_DECREASE"
    cc.rate_bps = bound_rate(rate, prm.min_rate_bps, ceil_bps)
    cc.ref_rate_bps = cc.rate_bps
    cc.updates += 1
    return counter
