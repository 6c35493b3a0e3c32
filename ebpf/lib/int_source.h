/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The INT source (tc egress): the INT shim and MD header inserted after the UDP header
 * (docs/wire-format.md).
 */
#ifndef XINGMAI_LIB_INT_SOURCE_H
#define XINGMAI_LIB_INT_SOURCE_H

#include "xingmai.h"
#include "lib/maps.h"
#include "lib/helpers.h"
#include "lib/tc_parse.h"

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

#endif /* XINGMAI_LIB_INT_SOURCE_H */
