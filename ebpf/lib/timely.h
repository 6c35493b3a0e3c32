/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TIMELY (Mittal et al., SIGCOMM 2015), Algorithm 1, on one RTT sample per RTT (tc's probe):
 *   new_diff = rtt - prev_rtt;  rtt_diff = (1 - alpha) rtt_diff + alpha new_diff
 *   rtt < T_low:               R += delta
 *   rtt > T_high:              R *= 1 - beta (1 - T_high / rtt)
 *   rtt_diff <= 0:             R += N delta   (N = hai_steps after hai_steps such updates)
 *   else:                      R *= 1 - beta rtt_diff / min_rtt
 * controller/nic/ratelaw/timely.py is the reference, operation for operation. No map
 * access here (bcc rewrites those only in the file it compiles): it returns the counter.
 */
#ifndef XINGMAI_LIB_TIMELY_H
#define XINGMAI_LIB_TIMELY_H

#include "xingmai.h"
#include "lib/helpers.h"

static __always_inline __u32 xm_timely_on_rtt(const struct xm_cc_params *prm,
					      struct xm_cc_state *cc, __u64 rtt, __u64 ceil,
					      __u32 weight)
{
	const struct xm_timely_params *t = &prm->timely;

	if (cc->rtt_ns == 0) {
		cc->rtt_ns = rtt;
		return XM_CNT_XDP_TIMELY_FIRST_RTT;
	}
	__s64 new_diff = (__s64)rtt - (__s64)cc->rtt_ns;
	cc->rtt_ns = rtt;
	/* samples are at most 2^32 ns: the products stay below 2^53 */
	cc->rtt_diff_ns = ((__s64)(XM_UNIT - t->alpha) * cc->rtt_diff_ns +
			   (__s64)t->alpha * new_diff) >> XM_UNIT_SHIFT;
	__u64 delta = t->delta_bps * weight;
	__u64 rate;
	__u32 counter;
	if (rtt < t->t_low_ns) {
		rate = cc->rate_bps + delta;
		counter = XM_CNT_XDP_TIMELY_INCREASE;
	} else if (rtt > t->t_high_ns) {
		__u64 frac = ((__u64)t->t_high_ns << XM_UNIT_SHIFT) / rtt;
		__u64 dec = ((__u64)t->beta * (XM_UNIT - frac)) >> XM_UNIT_SHIFT;
		rate = (cc->rate_bps * (XM_UNIT - dec)) >> XM_UNIT_SHIFT;
		cc->inc_stage = 0;
		counter = XM_CNT_XDP_TIMELY_DECREASE;
	} else if (cc->rtt_diff_ns <= 0) {
		cc->inc_stage += 1;
		__u64 n = cc->inc_stage >= t->hai_steps ? t->hai_steps : 1;
		rate = cc->rate_bps + n * delta;
		counter = XM_CNT_XDP_TIMELY_INCREASE;
	} else {
		__u64 min_rtt = t->min_rtt_ns ? t->min_rtt_ns : 1;
		__u64 g = ((__u64)cc->rtt_diff_ns << XM_UNIT_SHIFT) / min_rtt;
		if (g > 2 * XM_UNIT) /* any g >= 1 / beta already means the minimum rate */
			g = 2 * XM_UNIT;
		__u64 dec = ((__u64)t->beta * g) >> XM_UNIT_SHIFT;
		rate = dec < XM_UNIT ? (cc->rate_bps * (XM_UNIT - dec)) >> XM_UNIT_SHIFT : 0;
		cc->inc_stage = 0;
		counter = XM_CNT_XDP_TIMELY_DECREASE;
	}
	cc->rate_bps = xm_bound_rate(rate, prm->min_rate_bps, ceil);
	cc->ref_rate_bps = cc->rate_bps;
	cc->updates += 1;
	return counter;
}

#endif /* XINGMAI_LIB_TIMELY_H */
