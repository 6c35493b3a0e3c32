/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tc egress's per-flow accounting and pacing: EDT departure times or the flow's HTB class.
 */
#ifndef XINGMAI_LIB_PACING_H
#define XINGMAI_LIB_PACING_H

#include "xingmai.h"
#include "lib/maps.h"

static __always_inline struct xm_flow_stats *xm_flow_stats_get(struct xm_flow_key *key,
							       __u64 now)
{
	struct xm_flow_stats *st = xm_flows.lookup(key);
	if (st)
		return st;
	struct xm_flow_stats init = {};
	init.first_ns = now;
	/* BPF_NOEXIST: another CPU may have won the race (and told the agent) */
	if (xm_flows.insert(key, &init) == 0)
		xm_event_emit(key, 0, XM_EV_FLOW);
	st = xm_flows.lookup(key);
	if (!st)
		xm_count(XM_CNT_TC_FLOW_TABLE_FULL);
	return st;
}

/* EDT: departure time from the flow's rate, never earlier than now. */
static __always_inline void xm_edt_pace(struct __sk_buff *skb, struct xm_flow_key *key,
					struct xm_flow_stats *st, __u32 len, __u64 now)
{
	struct xm_rate *r = xm_rates.lookup(key);
	if (!r || !r->rate_bps)
		return;
	__u64 next = st->edt_next_ns;
	if (next < now)
		next = now;
	if (skb->tstamp < next)
		skb->tstamp = next;
	st->edt_next_ns = next + (__u64)len * 8 * XM_NSEC / r->rate_bps;
	xm_count(XM_CNT_TC_EDT_PACED);
}

static __always_inline void xm_htb_classify(struct __sk_buff *skb,
					    const struct xm_host_config *cfg,
					    struct xm_flow_key *key)
{
	__u32 *classid = key ? xm_class.lookup(key) : 0;
	if (classid) {
		skb->priority = *classid;
		xm_count(XM_CNT_TC_HTB_CLASSIFIED);
	} else {
		skb->priority = cfg->default_classid;
		xm_count(XM_CNT_TC_HTB_DEFAULT);
	}
}

#endif /* XINGMAI_LIB_PACING_H */
