/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TIMELY and Swift's RTT samples: tc egress keeps one probe per flow in xm_flow_stats (a data
 * packet's PSN and departure time), XDP takes the sample from the first ACK that covers it.
 * controller/nic/ratelaw/rtt.py is the Python twin (tc_rtt_probe, take_rtt_sample).
 */
#ifndef XINGMAI_LIB_RTT_H
#define XINGMAI_LIB_RTT_H

#include "xingmai.h"
#include "lib/maps.h"
#include "lib/cc_state.h"

/* tc: a new probe when XDP has taken the last (or the flow has no CC state yet), or when
 * this packet resends the probe's PSN or an earlier one (go-back-N: its ACK would time the
 * recovery too); only for flows under TIMELY or Swift. */
static __always_inline void xm_rtt_probe(const struct xm_host_config *cfg,
					 struct xm_flow_key *key, struct xm_flow_stats *st,
					 __u32 psn, __u64 sent)
{
	struct xm_flow_ctl *ctl = xm_ctl.lookup(key);
	__u32 law = ctl && (ctl->flags & XM_CTL_HAS_PARAMS) ? ctl->params.law : cfg->cc.law;
	if (law != XM_LAW_TIMELY && law != XM_LAW_SWIFT)
		return;
	struct xm_cc_state *cc = xm_cc.lookup(key);
	if (cc && cc->rtt_done_seq != st->rtt_probe_seq && !xm_psn_ge(st->rtt_probe_psn, psn))
		return;
	st->rtt_probe_psn = psn;
	st->rtt_probe_ns = sent;
	st->rtt_probe_seq += 1; /* last: XDP decides on the sequence number */
	xm_count(XM_CNT_TC_RTT_PROBE);
}

/* The wire's far end (tc_wire.c, HTB pacing only): the probe's packet left the NIC now, after
 * its wait in its flow's HTB class, which tc egress (before the qdisc) does not see. A NIC's
 * transmit timestamp is this time; under EDT tc egress already knows it (skb->tstamp). Only
 * the probe's first departure is stamped (wire_stamp_rtt_probe()). */
static __always_inline void xm_rtt_wire_stamp(struct xm_flow_stats *st, __u32 psn, __u64 now)
{
	__u32 seq = st->rtt_probe_seq;
	if (st->rtt_probe_wire_seq == seq || st->rtt_probe_psn != psn)
		return;
	st->rtt_probe_ns = now;
	st->rtt_probe_wire_seq = seq;
	xm_count(XM_CNT_WIRE_RTT_STAMP);
}

/* XDP: the RTT of tc's pending probe when this ACK covers it (take_rtt_sample()). */
static __always_inline int xm_rtt_sample(struct xm_cc_state *cc, const struct xm_flow_stats *st,
					 __u32 ack_psn, __u64 now, __u64 *rtt)
{
	__u32 seq = st->rtt_probe_seq;
	if (seq == cc->rtt_done_seq || !xm_psn_ge(ack_psn, st->rtt_probe_psn))
		return 0;
	cc->rtt_done_seq = seq;
	__u64 sent = st->rtt_probe_ns;
	__u64 r = now > sent ? now - sent : 0;
	*rtt = r > XM_ALL_ONES32 ? XM_ALL_ONES32 : r;
	return 1;
}

#endif /* XINGMAI_LIB_RTT_H */
