"""TiTa (HPCC-like): the rate from the INT echoed in every ACK, as xm_tita_on_ack() computes it.

Utilisation U = max over hops of txRate/B + qlen/(B*T), an EWMA over the base RTT T; target
eta, additive step W_AI. Defaults (params.TitaParams.defaults) scale with the emulated line
rate: eta = 0.95, W_AI = line rate * (1 - eta) (HPCC's W_init(1-eta)/N for N = 1: see
params.TITA_WAI_FLOWS; HPCC's own defaults keep N = 100), max stage 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from controller.nic.ratelaw.base import (
    ALL_ONES32,
    HAVE_RECORDS,
    NO_TS,
    NSEC,
    PSN_VALID,
    U64,
    U_MAX,
    UNIT,
    UNIT_SHIFT,
    CcState,
    HopRecord,
    bound_rate,
    psn_ge,
)
from controller.nic.ratelaw.echo import IntHopValues
from controller.nic.ratelaw.params import CcParams

HopSpeed = Callable[[int, int], int]  # (node id, port) -> bit/s, 0 for unknown


@dataclass(frozen=True)
class TitaOutcome:
    counter: str  # XM_CNT_* name (without the prefix) the step counted
    ref_updated: bool = False


def tita_on_ack(
    cc: CcState,
    prm: CcParams,
    hops: list[IntHopValues],
    *,
    ack_psn: int,
    snd_nxt_psn: int | None,
    tx_bytes: int,
    now_ns: int,
    ceil_bps: int,
    weight: int,
    line_rate_bps: int,
    hop_speed: HopSpeed | None = None,
    hpcc: bool = False,
) -> TitaOutcome:
    """xm_tita_on_ack() after the echo parsed into `hops`.

    With `hpcc`, HPCC as published: its parameters (prm.hpcc) and U committed on every ACK
    (MeasureInflight), R_ref and the stage once per RTT; TiTa commits U with R_ref only."""
    tp = prm.hpcc if hpcc else prm.tita
    nh = len(hops)
    T = tp.base_rtt_ns or 1
    local_dt = now_ns - cc.last_fb_ns if now_ns > cc.last_fb_ns else 0
    sent = min((tx_bytes - cc.prev_tx_bytes) & U64, 1 << 30)
    comparable = bool(cc.flags & HAVE_RECORDS) and cc.nhops == nh
    u_max = tau = 0
    for i, h in enumerate(hops):
        prev = cc.hops[i]
        if prev.node_id != h.node_id:
            comparable = False
        B = (hop_speed(h.node_id, h.port) if hop_speed else 0) or line_rate_bps
        dt = local_dt
        ts, pts = h.egress_ts_ns, prev.egress_ts_ns
        if ts != NO_TS and pts != NO_TS and ts > pts:
            dt = h.egress_ts_ns - prev.egress_ts_ns
        qmin = min(h.qlen, prev.qlen)
        bdp = (B // 8) * T // NSEC or 1
        u = (qmin << UNIT_SHIFT) // bdp
        if h.tx_util_ppm != ALL_ONES32:
            u += (h.tx_util_ppm << UNIT_SHIFT) // 1_000_000
        elif qmin > 0:
            u += UNIT
        elif dt > 0:
            own = min(sent * 8 * NSEC // dt, B)
            u += (own << UNIT_SHIFT) // B
        u = min(u, U_MAX)
        if i == 0 or u > u_max:
            u_max, tau = u, dt
        cc.hops[i] = HopRecord(h.node_id, h.qlen, h.egress_ts_ns, h.tx_util_ppm)
    cc.prev_tx_bytes = tx_bytes
    snd_nxt = snd_nxt_psn if snd_nxt_psn is not None else ack_psn

    if not comparable:
        counter = "XDP_TITA_PATH_CHANGE" if cc.flags & HAVE_RECORDS else "XDP_TITA_FIRST_RECORD"
        cc.flags |= HAVE_RECORDS | PSN_VALID
        cc.nhops = nh
        cc.last_update_psn = snd_nxt
        return TitaOutcome(counter)

    tau = min(tau, T)
    U = ((T - tau) * cc.util + tau * u_max) // T
    if hpcc:
        cc.util = U
    eta = tp.eta
    wai = tp.wai_bps * weight
    if U >= eta or cc.inc_stage >= tp.max_stage:
        R = cc.ref_rate_bps * eta // (U or 1) + wai
        stage = 0
    else:
        R = cc.ref_rate_bps + wai
        stage = cc.inc_stage + 1
    R = bound_rate(R, prm.min_rate_bps, ceil_bps)
    cc.rate_bps = R
    cc.updates += 1
    updated = psn_ge(ack_psn, cc.last_update_psn)
    if updated:
        cc.util = U
        cc.ref_rate_bps = R
        cc.inc_stage = stage
        cc.last_update_psn = snd_nxt
    return TitaOutcome("XDP_TITA_UPDATE", ref_updated=updated)
