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

struct xm_tc_pkt {
	struct xm_flow_key key;
	__u32 l4_off;
	__u32 ihl;
	__u8 tos;
	__u8 roce;   /* UDP to 4791 with a whole BTH */
	__u8 opcode; /* BTH opcode when roce */
	__u8 pad;
	__u32 psn;   /* BTH PSN when roce */
};

/* Parse Ethernet/IPv4/TCP|UDP(/BTH) with bounded loads. Returns 0 when the packet belongs to
 * an IPv4 TCP or UDP flow (key filled in), -1 otherwise (counted by reason). */
static __always_inline int xm_tc_parse(struct __sk_buff *skb, struct xm_tc_pkt *p)
{
	struct ethhdr eth;
	struct iphdr ip;
	__u16 ports[2];

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0) {
		xm_count(XM_CNT_TC_MALFORMED);
		return -1;
	}
	if (eth.h_proto != bpf_htons(ETH_P_IP)) {
		xm_count(XM_CNT_TC_NOT_IPV4);
		return -1;
	}
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0 || ip.version != 4 ||
	    ip.ihl < 5) {
		xm_count(XM_CNT_TC_MALFORMED);
		return -1;
	}
	__u32 ihl = ip.ihl * 4;
	__u32 tot_len = bpf_ntohs(ip.tot_len);
	if (tot_len < ihl || ETH_HLEN + tot_len > skb->len) {
		xm_count(XM_CNT_TC_MALFORMED);
		return -1;
	}
	/* Non-first fragments carry no ports. */
	if ((ip.protocol != IPPROTO_UDP && ip.protocol != IPPROTO_TCP) ||
	    (bpf_ntohs(ip.frag_off) & 0x1fff)) {
		xm_count(XM_CNT_TC_OTHER_PROTO);
		return -1;
	}
	__u32 l4 = ETH_HLEN + ihl;
	if (l4 + 8 > ETH_HLEN + tot_len || bpf_skb_load_bytes(skb, l4, ports, sizeof(ports)) < 0) {
		xm_count(XM_CNT_TC_MALFORMED);
		return -1;
	}
	p->key.saddr = ip.saddr;
	p->key.daddr = ip.daddr;
	p->key.sport = ports[0];
	p->key.dport = ports[1];
	p->key.proto = ip.protocol;
	p->l4_off = l4;
	p->ihl = ihl;
	p->tos = ip.tos;
	if (ip.protocol == IPPROTO_UDP && ports[1] == bpf_htons(XM_ROCE_PORT)) {
		__u8 bth[XM_BTH_LEN];
		__u16 udp_len;
		if (bpf_skb_load_bytes(skb, l4 + 4, &udp_len, sizeof(udp_len)) == 0 &&
		    bpf_ntohs(udp_len) >= 8 + XM_BTH_LEN &&
		    l4 + 8 + XM_BTH_LEN <= ETH_HLEN + tot_len &&
		    bpf_skb_load_bytes(skb, l4 + 8, bth, sizeof(bth)) == 0) {
			p->roce = 1;
			p->opcode = bth[0];
			p->psn = ((__u32)bth[9] << 16) | ((__u32)bth[10] << 8) | bth[11];
		}
	}
	return 0;
}

static __always_inline __u16 xm_ipv4_csum(const struct iphdr *ip)
{
	const __u16 *w = (const __u16 *)ip;
	__u32 sum = 0;
#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

/* INT source: insert the 4-byte shim and the 12-byte MD header right after the UDP header,
 * mark the INT DSCP and fix the lengths and checksums (docs/wire-format.md). Returns 1 when
 * the header was inserted. */
static __always_inline int xm_int_insert(struct __sk_buff *skb, const struct xm_host_config *cfg,
					 const struct xm_tc_pkt *p)
{
	const __u32 grow = XM_INT_SHIM_LEN + XM_INT_MD_LEN;

	if (p->ihl != 20) {
		xm_count(XM_CNT_TC_INT_IP_OPTIONS);
		return 0;
	}
	if ((p->tos >> 2) == cfg->int_dscp) {
		xm_count(XM_CNT_TC_INT_ALREADY_MARKED);
		return 0;
	}
	if (skb->gso_segs > 1) {
		/* a GSO super-packet would be segmented after us with one header for all */
		xm_count(XM_CNT_TC_INT_GSO);
		return 0;
	}
	if (skb->len + grow > cfg->int_max_frame) {
		xm_count(XM_CNT_TC_INT_NO_ROOM);
		return 0;
	}
	/* Room right after the 20-byte IPv4 header, then move the UDP header in front of it. */
	if (bpf_skb_adjust_room(skb, grow, BPF_ADJ_ROOM_NET, 0) < 0) {
		xm_count(XM_CNT_TC_INT_ERROR);
		return 0;
	}
	struct udphdr udp;
	struct iphdr ip;
	__u32 l4 = p->l4_off;
	if (bpf_skb_load_bytes(skb, l4 + grow, &udp, sizeof(udp)) < 0 ||
	    bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0) {
		xm_count(XM_CNT_TC_INT_ERROR);
		return 0;
	}
	udp.len = bpf_htons(bpf_ntohs(udp.len) + grow);
	udp.check = 0; /* INT packets carry no UDP checksum: the stack grows at every hop */

	__u32 bitmap = cfg->int_bitmap & 0xffff;
	__u32 hop_ml = xm_int_words(bitmap) & 0x1f;
	__u8 hdr[XM_INT_SHIM_LEN + XM_INT_MD_LEN] = {};
	hdr[0] = 1 << 4;                             /* shim: Type 1 (INT-MD), NPT 0 */
	hdr[1] = XM_INT_MD_LEN / 4;                  /* shim Length: MD header, empty stack */
	hdr[3] = p->tos & 0xfc;                      /* original DSCP, restored by the sink */
	hdr[4] = 2 << 4;                             /* Ver 2, D/E/M clear */
	hdr[6] = hop_ml;                             /* HopML */
	hdr[7] = cfg->int_hop_budget & 0xff;         /* RemainingHopCnt */
	hdr[8] = bitmap >> 8;
	hdr[9] = bitmap & 0xff;                      /* domain id, DS instruction/flags stay 0 */

	ip.tot_len = bpf_htons(bpf_ntohs(ip.tot_len) + grow);
	ip.tos = (cfg->int_dscp << 2) | (p->tos & 3);
	ip.check = 0;
	ip.check = xm_ipv4_csum(&ip);

	if (bpf_skb_store_bytes(skb, l4, &udp, sizeof(udp), 0) < 0 ||
	    bpf_skb_store_bytes(skb, l4 + sizeof(udp), hdr, sizeof(hdr), 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &ip, sizeof(ip), 0) < 0) {
		xm_count(XM_CNT_TC_INT_ERROR);
		return 0;
	}
	xm_count(XM_CNT_TC_INT_INSERTED);
	return 1;
}

static __always_inline struct xm_flow_stats *xm_flow_stats_get(struct xm_flow_key *key,
							       __u64 now)
{
	struct xm_flow_stats *st = xm_flows.lookup(key);
	if (st)
		return st;
	struct xm_flow_stats init = {};
	init.first_ns = now;
	xm_flows.insert(key, &init); /* BPF_NOEXIST: another CPU may have won the race */
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

/* TIMELY and Swift's RTT probe (controller/nic/ratelaw.py tc_rtt_probe()): a new one when XDP
 * has taken the last (or the flow has no CC state yet), or when this packet resends the
 * probe's PSN or an earlier one (go-back-N: its ACK would time the recovery too). */
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
	 * shares the default class. */
	int own_pacing = p.key.proto != IPPROTO_TCP;
	if (cfg->pacing_mode == XM_PACING_EDT) {
		if (own_pacing && st)
			xm_edt_pace(skb, &p.key, st, paced_len, now);
	} else {
		xm_htb_classify(skb, cfg, own_pacing ? &p.key : 0);
	}
	/* the probe's send time: its EDT departure, or now under HTB (which then counts the
	 * time the packet waits in its class in the RTT) */
	if (data && st) {
		__u64 sent = now;
		if (cfg->pacing_mode == XM_PACING_EDT && skb->tstamp > now)
			sent = skb->tstamp;
		xm_rtt_probe(cfg, &p.key, st, p.psn, sent);
	}
	return TC_ACT_OK;
}
