/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tc egress's parse of an outgoing frame: the flow key, and the BTH of the transport's
 * packets.
 */
#ifndef XINGMAI_LIB_TC_PARSE_H
#define XINGMAI_LIB_TC_PARSE_H

#include "xingmai.h"
#include "lib/maps.h"

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
 * an IPv4 TCP or UDP flow (key filled in), else the counter of why not (XM_CNT_TC_*).
 * `int_dscp` >= 0: a packet marked with it carries the INT source's shim and MD header after
 * the UDP header (what tc egress inserted; the wire's far end sees it), the BTH after them. */
static __always_inline int xm_tc_parse_frame(struct __sk_buff *skb, struct xm_tc_pkt *p,
					     int int_dscp)
{
	struct ethhdr eth;
	struct iphdr ip;
	__u16 ports[2];

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return XM_CNT_TC_MALFORMED;
	if (eth.h_proto != bpf_htons(ETH_P_IP))
		return XM_CNT_TC_NOT_IPV4;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0 || ip.version != 4 ||
	    ip.ihl < 5)
		return XM_CNT_TC_MALFORMED;
	__u32 ihl = ip.ihl * 4;
	__u32 tot_len = bpf_ntohs(ip.tot_len);
	if (tot_len < ihl || ETH_HLEN + tot_len > skb->len)
		return XM_CNT_TC_MALFORMED;
	/* Non-first fragments carry no ports. */
	if ((ip.protocol != IPPROTO_UDP && ip.protocol != IPPROTO_TCP) ||
	    (bpf_ntohs(ip.frag_off) & 0x1fff))
		return XM_CNT_TC_OTHER_PROTO;
	__u32 l4 = ETH_HLEN + ihl;
	if (l4 + 8 > ETH_HLEN + tot_len || bpf_skb_load_bytes(skb, l4, ports, sizeof(ports)) < 0)
		return XM_CNT_TC_MALFORMED;
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
		__u8 shim[XM_INT_SHIM_LEN];
		__u16 udp_len;
		__u32 bth_off = 8; /* from the UDP header */
		if (int_dscp >= 0 && (ip.tos >> 2) == (__u32)int_dscp) {
			if (bpf_skb_load_bytes(skb, l4 + 8, shim, sizeof(shim)) < 0)
				return 0;
			bth_off += XM_INT_SHIM_LEN + (__u32)shim[1] * 4;
		}
		if (bpf_skb_load_bytes(skb, l4 + 4, &udp_len, sizeof(udp_len)) == 0 &&
		    bpf_ntohs(udp_len) >= bth_off + XM_BTH_LEN &&
		    l4 + bth_off + XM_BTH_LEN <= ETH_HLEN + tot_len &&
		    bpf_skb_load_bytes(skb, l4 + bth_off, bth, sizeof(bth)) == 0) {
			p->roce = 1;
			p->opcode = bth[0];
			p->psn = ((__u32)bth[9] << 16) | ((__u32)bth[10] << 8) | bth[11];
		}
	}
	return 0;
}

/* tc egress's parse, before any INT: 0, or -1 with the reason counted. */
static __always_inline int xm_tc_parse(struct __sk_buff *skb, struct xm_tc_pkt *p)
{
	int why = xm_tc_parse_frame(skb, p, -1);
	if (why) {
		xm_count(why);
		return -1;
	}
	return 0;
}

#endif /* XINGMAI_LIB_TC_PARSE_H */
