/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Swift (Kumar et al., SIGCOMM 2020) on one RTT sample per RTT (tc's probe), as a rate:
 *   target = base_target + hops * per_hop          (hops = sender TTL - the ACK's TTL)
 *   rtt < target:  R += ai / rtt                    (the window's ai per RTT, as a rate)
 *   else, at most once per RTT:  R *= max(1 - beta (rtt - target) / rtt, 1 - max_mdf)
 * controller/nic/ratelaw/swift.py is the reference, operation for operation. No map
 * access here: it returns the counter.
 */
#ifndef XINGMAI_LIB_SWIFT_H
#define XINGMAI_LIB_SWIFT_H

#include "xingmai.h"
#include "lib/helpers.h"

static __always_inline __u32 xm_swift_on_rtt(const struct xm_cc_params *prm,
					     struct xm_cc_state *cc, __u64 rtt, __u32 ttl,
					     __u64 now, __u64 ceil, __u32 weight)
{
	const struct xm_swift_params *w = &prm->swift;
	__u64 hops = w->sender_ttl > ttl ? w->sender_ttl - ttl : 0;

	if (hops > XM_MAX_HOPS)
		hops = XM_MAX_HOPS;
	__u64 target = w->base_target_ns + hops * w->per_hop_ns;
	cc->rtt_ns = rtt;
	__u64 rate;
	__u32 counter;
	if (rtt < target) {
		__u64 d = rtt ? rtt : 1;
		rate = cc->rate_bps + (w->ai_bytes * 8 * XM_NSEC / d) * weight;
		counter = XM_CNT_XDP_SWIFT_INCREASE;
	} else if ((cc->flags & XM_CC_CUT_SEEN) && now - cc->last_cut_ns < rtt) {
		return XM_CNT_XDP_SWIFT_DECREASE_HELD;
	} else {
		__u64 d = rtt ? rtt : 1;
		__u64 dec = ((__u64)w->beta * (((rtt - target) << XM_UNIT_SHIFT) / d)) >> XM_UNIT_SHIFT;
		if (dec > w->max_mdf)
			dec = w->max_mdf;
		rate = (cc->rate_bps * (XM_UNIT - dec)) >> XM_UNIT_SHIFT;
		cc->last_cut_ns = now;
		cc->flags |= XM_CC_CUT_SEEN;
		counter = XM_CNT_XDP_SWIFT_DECREASE;
	}
	cc->rate_bps = xm_bound_rate(rate, prm->min_rate_bps, ceil);
	cc->ref_rate_bps = cc->rate_bps;
	cc->updates += 1;
	return counter;
}

#endif /* XINGMAI_LIB_SWIFT_H */
