"""DCQCN's reaction point: rate cuts on CNPs, timer and byte-counter increases, as
xm_dcqcn_on_feedback() computes them.

Defaults (params.DcqcnParams.scaled): the paper's values for 40 Gb/s (R_AI 40 Mb/s, R_HAI
10 x R_AI, byte counter 10 MB, timers K = T = 55 us, g = 1/256, F = 5) and the 4 us minimum
interval between two cuts of the common NIC model, under time dilation by s = line rate /
40 Gb/s: rates times s, time intervals divided by s, byte counts unchanged. Every
dimensionless ratio of the paper (events per packet, increase per event over the line rate)
stays the same, and the emulated RTTs, already long in absolute terms, are of the same dilated
order.
"""

from __future__ import annotations

from controller.nic.ratelaw.base import (
    CUT_SEEN,
    TIMER_INC,
    U64,
    UNIT,
    UNIT_SHIFT,
    CcState,
    bound_rate,
)
from controller.nic.ratelaw.params import DCQCN_CLAMP_AFTER_TIMER, DCQCN_CLAMP_ALWAYS, CcParams

# XM_DCQCN_BACKLOG of ebpf/lib/dcqcn.h: the most increase events, per source, one feedback
# packet applies (all that elapsed since the last, the older ones dropped)
DCQCN_BACKLOG = 64


def fx_pow(base: int, n: int) -> int:
    """xm_fx_pow(): (base/UNIT)**n, truncating after every product, n < 2**16."""
    r = UNIT
    for i in range(16):
        if (n >> i) & 1:
            r = (r * base) >> UNIT_SHIFT
        base = (base * base) >> UNIT_SHIFT
    return r


def _due(base: int, now: int, period: int) -> tuple[int, int]:
    """xm_dcqcn_due(): the events of one increase source due at `now` since `base`, at most
    DCQCN_BACKLOG, and the base after them (`now` when older ones are dropped)."""
    n = (now - base) // period
    if n > DCQCN_BACKLOG:
        return DCQCN_BACKLOG, now
    return n, base + n * period


def _dcqcn_increase(cc: CcState, prm: CcParams, ceil_bps: int, weight: int) -> None:
    F = prm.dcqcn.fast_recovery_steps
    mx = max(cc.timer_count, cc.byte_count)
    mn = min(cc.timer_count, cc.byte_count)
    target = cc.ref_rate_bps
    if mn > F:
        target += (mn - F) * prm.dcqcn.rhai_bps * weight
    elif mx > F:
        target += prm.dcqcn.rai_bps * weight
    target = min(target, ceil_bps)
    cc.ref_rate_bps = target
    cc.rate_bps = (cc.rate_bps + target) // 2


def dcqcn_on_feedback(
    cc: CcState,
    prm: CcParams,
    *,
    is_cnp: bool,
    tx_bytes: int,
    now_ns: int,
    ceil_bps: int,
    weight: int,
) -> list[str]:
    """xm_dcqcn_on_feedback(); returns the counters (XM_CNT_* names) it bumped."""
    d = prm.dcqcn
    counters: list[str] = []
    if d.alpha_timer_ns and now_ns > cc.alpha_ts_ns:
        n = (now_ns - cc.alpha_ts_ns) // d.alpha_timer_ns
        if n > 0xFFFF:
            n = 0xFFFF
            cc.alpha_ts_ns = now_ns
        else:
            cc.alpha_ts_ns += n * d.alpha_timer_ns
        if n:
            cc.alpha = (cc.alpha * fx_pow(UNIT - d.g, n)) >> UNIT_SHIFT

    if cc.flags & CUT_SEEN:
        nt = nb = 0
        if d.rate_timer_ns and now_ns > cc.timer_ts_ns:
            nt, cc.timer_ts_ns = _due(cc.timer_ts_ns, now_ns, d.rate_timer_ns)
        if d.byte_counter and tx_bytes > cc.bc_base_bytes:
            nb, cc.bc_base_bytes = _due(cc.bc_base_bytes, tx_bytes, d.byte_counter)
        for e in range(nt + nb):
            if e < nt:
                cc.timer_count += 1
            else:
                cc.byte_count += 1
            _dcqcn_increase(cc, prm, ceil_bps, weight)
        if nt:
            cc.flags |= TIMER_INC
        if nt + nb:
            counters.append("XDP_DCQCN_INCREASE")

    if is_cnp:
        if cc.flags & CUT_SEEN and ((now_ns - cc.last_cut_ns) & U64) < d.cut_interval_ns:
            counters.append("XDP_DCQCN_CUT_HELD")
        else:
            if d.clamp_target & DCQCN_CLAMP_ALWAYS or (
                d.clamp_target & DCQCN_CLAMP_AFTER_TIMER and cc.flags & TIMER_INC
            ):
                cc.ref_rate_bps = cc.rate_bps
            cc.rate_bps = (cc.rate_bps * (UNIT - cc.alpha // 2)) >> UNIT_SHIFT
            cc.alpha = min((((UNIT - d.g) * cc.alpha) >> UNIT_SHIFT) + d.g, UNIT)
            cc.timer_count = cc.byte_count = 0
            cc.timer_ts_ns = cc.alpha_ts_ns = now_ns
            cc.bc_base_bytes = tx_bytes
            cc.last_cut_ns = now_ns
            cc.flags |= CUT_SEEN
            cc.flags &= ~TIMER_INC  # no timer increase since this cut
            counters.append("XDP_DCQCN_CUT")
    cc.rate_bps = bound_rate(cc.rate_bps, prm.min_rate_bps, ceil_bps)
    cc.ref_rate_bps = bound_rate(cc.ref_rate_bps, prm.min_rate_bps, ceil_bps)
    cc.updates += 1
    return counters
