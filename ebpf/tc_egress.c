/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tc egress (clsact, direct action) of the xingmai NIC: per-flow accounting, INT source for
 * the RoCEv2-like transport, and pacing (HTB class selection or EDT timestamps).
 * It never drops: every path returns TC_ACT_OK, pacing only delays.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/udp.h>

#include "xingmai.h"
#include "lib/maps.h"
#include "lib/helpers.h"
#include "lib/tc_parse.h"
#include "lib/int_source.h"
#include "lib/pacing.h"
#include "lib/rtt.h"

int xm_tc_egress(struct __sk_buff *skb)
{
	struct xm_host_config *cfg = xm_config_get();
	struct xm_tc_pkt p = {};

	xm_count(XM_CNT_TC_PACKETS);
	if (!cfg)
		return TC_ACT_OK;
	if (xm_tc_parse(skb, &p) < 0) {
		if (cfg->pacing_mode == XM_PACING_HTB)
			xm_htb_classify(skb, cfg, 0);
		return TC_ACT_OK;
	}

	int data = p.roce && p.opcode <= XM_OP_DATA_MAX;
	int with_int = 0;
	__u32 paced_len = skb->len; /* before INT: the length the qdisc layer accounts */
	if (data && cfg->int_enabled)
		with_int = xm_int_insert(skb, cfg, &p);

	__u64 now = bpf_ktime_get_ns();
	struct xm_flow_stats *st = xm_flow_stats_get(&p.key, now);
	if (st) {
		__sync_fetch_and_add(&st->tx_bytes, skb->len);
		__sync_fetch_and_add(&st->tx_packets, 1);
		if (with_int)
			__sync_fetch_and_add(&st->int_packets, 1);
		st->last_ns = now;
		st->ifindex = skb->ifindex;
		if (data) {
			st->snd_nxt_psn = (p.psn + 1) & 0xffffff;
			st->flags |= XM_FLOW_PSN_VALID;
		}
	}

	/* TCP is paced by its own socket (sockops.c sets SO_MAX_PACING_RATE): here it only
	 * shares the default class. Feedback (ACK, NAK, CNP) is not paced either: a NIC's rate
	 * limiter holds its queue pairs' data, and a responder's ACKs carry the 5-tuple of its
	 * own data the other way, whose class would hold them behind that data at its rate
	 * (the twin's NIC sends feedback in the default class too: testbed/sim/nic.py). */
	int feedback = p.roce && !data;
	int own_pacing = p.key.proto != IPPROTO_TCP && !feedback;
	if (cfg->pacing_mode == XM_PACING_EDT) {
		if (own_pacing && st)
			xm_edt_pace(skb, &p.key, st, paced_len, now);
	} else {
		xm_htb_classify(skb, cfg, own_pacing ? &p.key : 0);
	}
	/* TIMELY and Swift's RTT probe; its send time is the EDT departure, or now under HTB
	 * (which then counts the packet's wait in its class in the RTT) */
	if (data && st) {
		__u64 sent = now;
		if (cfg->pacing_mode == XM_PACING_EDT && skb->tstamp > now)
			sent = skb->tstamp;
		xm_rtt_probe(cfg, &p.key, st, p.psn, sent);
	}
	return TC_ACT_OK;
}
