"""TIMELY (Mittal et al., SIGCOMM 2015), Algorithm 1, on one RTT sample per RTT; ebpf/lib/timely.h
is the same, operation for operation.

Parameters: the paper's 10 Gb/s values (EWMA alpha 0.875, beta 0.8, delta 10 Mb/s, T_low 50 us,
T_high 500 us, min RTT 20 us, HAI after 5 gradient <= 0 steps), dilated by s = line rate /
10 Gb/s (controller/nic/ratelaw/params.py TimelyParams.scaled).
"""

from __future__ import annotations

from controller.nic.ratelaw.base import UNIT, UNIT_SHIFT, CcState, bound_rate, scale_rate
from controller.nic.ratelaw.params import CcParams


def timely_on_rtt(cc: CcState, prm: CcParams, rtt: int, ceil_bps: int, weight: int) -> str:
    """xm_timely_on_rtt(): TIMELY's Algorithm 1 on one RTT sample; returns the counter."""
    t = prm.timely
    if cc.rtt_ns == 0:
        cc.rtt_ns = rtt
        return "XDP_TIMELY_FIRST_RTT"
    new_diff = rtt - cc.rtt_ns
    cc.rtt_ns = rtt
    cc.rtt_diff_ns = ((UNIT - t.alpha) * cc.rtt_diff_ns + t.alpha * new_diff) >> UNIT_SHIFT
    delta = t.delta_bps * weight
    if rtt < t.t_low_ns:
        rate = cc.rate_bps + delta
        counter = "XDP_TIMELY_INCREASE"
    elif rtt > t.t_high_ns:
        dec = (t.beta * (UNIT - (t.t_high_ns << UNIT_SHIFT) // rtt)) >> UNIT_SHIFT
        rate = scale_rate(cc.rate_bps, UNIT - dec)
        cc.inc_stage = 0
        counter = "XDP_TIMELY_DECREASE"
    elif cc.rtt_diff_ns <= 0:
        cc.inc_stage += 1
        n = t.hai_steps if cc.inc_stage >= t.hai_steps else 1
        rate = cc.rate_bps + n * delta
        counter = "XDP_TIMELY_INCREASE"
    else:
        g = min((cc.rtt_diff_ns << UNIT_SHIFT) // (t.min_rtt_ns or 1), 2 * UNIT)
        dec = (t.beta * g) >> UNIT_SHIFT
        rate = scale_rate(cc.rate_bps, UNIT - dec) if dec < UNIT else 0
        cc.inc_stage = 0
        counter = "XDP_TIMELY_DECREASE"
    cc.rate_bps = bound_rate(rate, prm.min_rate_bps, ceil_bps)
    cc.ref_rate_bps = cc.rate_bps
    cc.updates += 1
    return counter
