/* SPDX-License-Identifier: Apache-2.0 */
/*
 * DCQCN's reaction point: cuts on CNPs, timer and byte-counter increases.
 * controller/nic/ratelaw/dcqcn.py is its Python twin, operation for operation.
 */
#ifndef XINGMAI_LIB_DCQCN_H
#define XINGMAI_LIB_DCQCN_H

#include "xingmai.h"
#include "lib/maps.h"
#include "lib/helpers.h"

/* DCQCN increase events, per source (timer, byte counter), that the next feedback packet
 * applies: all that elapsed since the last one, up to XM_DCQCN_BACKLOG (older ones are
 * dropped: by then the rate has long reached its ceiling). A flow cut far below the line
 * rate gets ACKs many timer periods apart, and NICs run the timers in real time: a smaller
 * bound would slow its recovery (DCQCN's timer fires every 55 us in the paper's profile). */
#define XM_DCQCN_BACKLOG 64

/* (base/UNIT)^n in fixed point, truncating after every product; n < 2^16. Square and
 * multiply without branches: the factor is base when the bit is set, else 1.0. */
static __always_inline __u64 xm_fx_pow(__u64 base, __u32 n)
{
	__u64 r = XM_UNIT;
#pragma unroll
	for (int i = 0; i < 16; i++) {
		__u64 bit_mask = -(__u64)((n >> i) & 1);
		__u64 factor = XM_UNIT - ((XM_UNIT - base) & bit_mask);
		r = (r * factor) >> XM_UNIT_SHIFT;
		base = (base * base) >> XM_UNIT_SHIFT;
	}
	return r;
}

/*
 * DCQCN reaction point. Timers and the byte counter are evaluated lazily on each feedback
 * packet: the events that elapsed since the last one (time / period, bytes sent by tc /
 * byte counter) are applied first, timer events before byte events (XM_DCQCN_BACKLOG).
 * XDP is then the only writer of the CC state (no locks shared with tc or the agent), and
 * ACKs arrive for as long as the flow sends.
 */
/* All ones when a < b, else 0 (a, b < 2^63). Masks instead of branches keep the verifier's
 * state count flat across the event loop below. */
static __always_inline __u64 xm_lt_mask(__u64 a, __u64 b)
{
	return (__u64)((__s64)(a - b) >> 63);
}

/* The events of one increase source (the timer: time; the byte counter: bytes sent) due at
 * `now` since `*base`, one per `period`, at most XM_DCQCN_BACKLOG; `*base` advances past
 * those, or to `now` when older ones are dropped. Masks, not branches: every path through
 * here reaches the event loop as one, which keeps the verifier's walk of it short. */
static __always_inline __u64 xm_dcqcn_due(__u64 *base, __u64 now, __u64 period)
{
	__u64 n = (now - *base) / period;
	__u64 old = xm_lt_mask(XM_DCQCN_BACKLOG, n);
	n = (XM_DCQCN_BACKLOG & old) | (n & ~old);
	*base = (now & old) | ((*base + n * period) & ~old);
	return n;
}

/* One increase event. Stage from the timer count T and byte count BC (QCN/DCQCN):
 * max(T, BC) <= F fast recovery, min(T, BC) > F hyper increase by (min - F) * R_HAI,
 * otherwise additive increase by R_AI; then R_C = (R_T + R_C) / 2. */
static __always_inline void xm_dcqcn_increase(const struct xm_cc_params *prm,
					      struct xm_cc_state *cc, __u64 ceil, __u32 weight)
{
	__u64 F = prm->dcqcn.fast_recovery_steps;
	__u64 t = cc->timer_count, b = cc->byte_count;
	__u64 t_lt_b = xm_lt_mask(t, b);
	__u64 mx = (b & t_lt_b) | (t & ~t_lt_b);
	__u64 mn = (t & t_lt_b) | (b & ~t_lt_b);
	__u64 hyper = xm_lt_mask(F, mn);    /* F < min */
	__u64 additive = xm_lt_mask(F, mx); /* F < max */
	__u64 inc_hai = (mn - F) * prm->dcqcn.rhai_bps * weight;
	__u64 inc_ai = prm->dcqcn.rai_bps * weight;
	__u64 inc = (inc_hai & hyper) | (inc_ai & additive & ~hyper);
	__u64 target = cc->ref_rate_bps + inc;
	__u64 over = xm_lt_mask(ceil, target);
	target = (ceil & over) | (target & ~over);
	cc->ref_rate_bps = target;
	cc->rate_bps = (cc->rate_bps + target) / 2;
}

static __always_inline void xm_dcqcn_on_feedback(const struct xm_cc_params *prm,
						 struct xm_cc_state *cc,
						 const struct xm_flow_stats *st, int is_cnp,
						 __u64 ceil, __u32 weight, __u64 now)
{
	const struct xm_dcqcn_params *d = &prm->dcqcn;

	/* alpha decays by (1 - g) per elapsed period K */
	if (d->alpha_timer_ns && now > cc->alpha_ts_ns) {
		__u64 n = (now - cc->alpha_ts_ns) / d->alpha_timer_ns;
		if (n > 0xffff) {
			n = 0xffff;
			cc->alpha_ts_ns = now;
		} else {
			cc->alpha_ts_ns += n * d->alpha_timer_ns;
		}
		if (n)
			cc->alpha = (cc->alpha * xm_fx_pow(XM_UNIT - d->g, n)) >> XM_UNIT_SHIFT;
	}

	/* rate increase events, only after a cut */
	if (cc->flags & XM_CC_CUT_SEEN) {
		__u64 nt = 0, nb = 0;
		if (d->rate_timer_ns && now > cc->timer_ts_ns)
			nt = xm_dcqcn_due(&cc->timer_ts_ns, now, d->rate_timer_ns);
		if (d->byte_counter && st->tx_bytes > cc->bc_base_bytes)
			nb = xm_dcqcn_due(&cc->bc_base_bytes, st->tx_bytes, d->byte_counter);
		/* Not unrolled: the verifier walks it once per iteration, for each path that
		 * reaches it (xm_dcqcn_due keeps those few). */
#pragma clang loop unroll(disable)
		for (int e = 0; e < 2 * XM_DCQCN_BACKLOG; e++) {
			if (e >= nt + nb)
				break;
			__u64 is_timer = xm_lt_mask(e, nt) & 1; /* timer events first */
			cc->timer_count += is_timer;
			cc->byte_count += 1 - is_timer;
			xm_dcqcn_increase(prm, cc, ceil, weight);
		}
		if (nt)
			cc->flags |= XM_CC_TIMER_INC;
		if (nt + nb)
			xm_count(XM_CNT_XDP_DCQCN_INCREASE);
	}

	if (is_cnp) {
		if ((cc->flags & XM_CC_CUT_SEEN) && now - cc->last_cut_ns < d->cut_interval_ns) {
			xm_count(XM_CNT_XDP_DCQCN_CUT_HELD);
		} else {
			if ((d->clamp_target & XM_DCQCN_CLAMP_ALWAYS) ||
			    ((d->clamp_target & XM_DCQCN_CLAMP_AFTER_TIMER) &&
			     (cc->flags & XM_CC_TIMER_INC)))
				cc->ref_rate_bps = cc->rate_bps;
			cc->rate_bps = (cc->rate_bps * (XM_UNIT - cc->alpha / 2)) >> XM_UNIT_SHIFT;
			cc->alpha = (((XM_UNIT - d->g) * cc->alpha) >> XM_UNIT_SHIFT) + d->g;
			if (cc->alpha > XM_UNIT)
				cc->alpha = XM_UNIT;
			cc->timer_count = 0;
			cc->byte_count = 0;
			cc->timer_ts_ns = now;
			cc->alpha_ts_ns = now;
			cc->bc_base_bytes = st->tx_bytes;
			cc->last_cut_ns = now;
			cc->flags |= XM_CC_CUT_SEEN;
			cc->flags &= ~XM_CC_TIMER_INC; /* no timer increase since this cut */
			xm_count(XM_CNT_XDP_DCQCN_CUT);
		}
	}
	cc->rate_bps = xm_bound_rate(cc->rate_bps, prm->min_rate_bps, ceil);
	cc->ref_rate_bps = xm_bound_rate(cc->ref_rate_bps, prm->min_rate_bps, ceil);
	cc->updates += 1;
}

#endif /* XINGMAI_LIB_DCQCN_H */
