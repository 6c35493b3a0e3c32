/* SPDX-License-Identifier: Apache-2.0 */
/*
 * XDP ingress of the xingmai NIC: reads the transport's feedback (ACKs with an echoed INT
 * stack, CNPs), runs the flow's rate law in fixed point and writes the new rate to xm_rates.
 * Every packet passes (XDP_PASS): the transport needs its ACKs, and anything unknown or
 * malformed is only counted. PFC pause frames are the exception: the NIC's MAC consumes MAC
 * Control frames, so XDP records the pause (lib/pfc.h) and drops them.
 *
 * The laws live in lib/tita.h (TiTa and HPCC), lib/dcqcn.h, lib/timely.h and lib/swift.h
 * (on RTT samples, lib/rtt.h); controller/nic/ratelaw/ is their Python
 * reference, operation for operation: change one, change the other (tests compare them
 * packet by packet).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/udp.h>

#include "xingmai.h"
#include "lib/maps.h"
#include "lib/helpers.h"
#include "lib/feedback.h"
#include "lib/cc_state.h"
#include "lib/tita.h"
#include "lib/dcqcn.h"
#include "lib/rtt.h"
#include "lib/swift.h"
#include "lib/timely.h"
#include "lib/pfc.h"

int xm_xdp_ingress(struct xdp_md *ctx)
{
	struct xm_feedback fb = {};

	xm_count(XM_CNT_XDP_PACKETS);
	if (xm_pfc_frame(ctx, bpf_ktime_get_ns()))
		return XDP_DROP;
	if (xm_parse_feedback(ctx, &fb) < 0)
		return XDP_PASS;

	struct xm_host_config *cfg = xm_config_get();
	if (!cfg) {
		xm_count(XM_CNT_XDP_NO_CONFIG);
		return XDP_PASS;
	}
	/* feedback for a flow this host never sent is not ours to act on */
	struct xm_flow_stats *st = xm_flows.lookup(&fb.key);
	if (!st) {
		xm_count(XM_CNT_XDP_UNKNOWN_FLOW);
		return XDP_PASS;
	}
	struct xm_flow_ctl *ctl = xm_ctl.lookup(&fb.key);
	const struct xm_cc_params *prm = &cfg->cc;
	if (ctl && (ctl->flags & XM_CTL_HAS_PARAMS))
		prm = &ctl->params;
	__u32 law = prm->law;
	if (law == XM_LAW_NONE || law > XM_LAW_SWIFT) {
		xm_count(XM_CNT_XDP_LAW_NONE);
		return XDP_PASS;
	}
	if (law != XM_LAW_DCQCN && fb.is_cnp) { /* only DCQCN acts on CNPs */
		xm_count(XM_CNT_XDP_CNP_IGNORED);
		return XDP_PASS;
	}
	__u32 weight = ctl && ctl->weight ? ctl->weight : 1;
	__u64 ceil = xm_rate_ceiling(cfg, ctl);
	__u64 now = bpf_ktime_get_ns();

	struct xm_cc_state *cc = xm_cc.lookup(&fb.key);
	if (!cc) {
		/* the state is too large for the BPF stack: insert a zeroed scratch copy */
		__u32 zero = 0;
		struct xm_cc_state *blank = xm_cc_scratch.lookup(&zero);
		if (!blank)
			return XDP_PASS;
		__builtin_memset(blank, 0, sizeof(*blank));
		xm_cc.insert(&fb.key, blank);
		cc = xm_cc.lookup(&fb.key);
		if (!cc) {
			xm_count(XM_CNT_XDP_CC_TABLE_FULL);
			return XDP_PASS;
		}
		/* A flow already paced below the ceiling before its first feedback (its start
		 * rate, set through the agent: the application's hint) starts its law there. */
		struct xm_rate *paced = xm_rates.lookup(&fb.key);
		__u64 start = ceil;
		if (paced && paced->rate_bps && paced->rate_bps < ceil)
			start = paced->rate_bps;
		xm_cc_init(cc, law, start, st, now);
	} else if (cc->law != law) {
		xm_cc_init(cc, law, ceil, st, now);
	}

	__u64 before = cc->rate_bps;
	if (law == XM_LAW_TITA || law == XM_LAW_HPCC) {
		if (fb.echo_len == 0) {
			xm_count(XM_CNT_XDP_ACK_NO_INT);
		} else {
			xm_tita_on_ack(ctx, cfg, prm, cc, st, &fb, ceil, weight, now,
				       law == XM_LAW_HPCC);
		}
	} else if (law == XM_LAW_DCQCN) {
		xm_dcqcn_on_feedback(prm, cc, st, fb.is_cnp, ceil, weight, now);
	} else {
		__u64 rtt;
		if (xm_rtt_sample(cc, st, fb.psn, now, &rtt)) {
			xm_count(XM_CNT_XDP_RTT_SAMPLE);
			if (law == XM_LAW_TIMELY)
				xm_count(xm_timely_on_rtt(prm, cc, rtt, ceil, weight));
			else
				xm_count(xm_swift_on_rtt(prm, cc, rtt, fb.ttl, now, ceil, weight));
		}
	}
	cc->last_fb_ns = now;
	cc->feedback += 1;

	struct xm_rate *cur = xm_rates.lookup(&fb.key);
	if (!cur || cur->rate_bps != cc->rate_bps || before != cc->rate_bps) {
		struct xm_rate nr = {};
		nr.rate_bps = cc->rate_bps;
		nr.stamp_ns = now;
		nr.origin = law; /* XM_ORIGIN_<law> is the law's value */
		xm_rate_write(&fb.key, &nr);
	}
	return XDP_PASS;
}
