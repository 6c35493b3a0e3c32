/* SPDX-License-Identifier: Apache-2.0 */
/*
 * XDP's view of the transport's feedback: an ACK (with its INT echo) or a CNP, parsed from
 * Ethernet/IPv4/UDP 4791/BTH, with the key of the data flow it answers (docs/wire-format.md).
 * controller/nic/ratelaw/reference.py's parse_feedback() is its Python twin.
 */
#ifndef XINGMAI_LIB_FEEDBACK_H
#define XINGMAI_LIB_FEEDBACK_H

#include "xingmai.h"
#include "lib/maps.h"

struct xm_feedback {
	struct xm_flow_key key; /* the data flow this feedback answers */
	__u32 echo_off;         /* ACK: offset of the bytes after the AETH */
	__u32 echo_len;         /* ACK: those bytes, ICRC excluded */
	__u32 psn;
	__u8 is_cnp;
	__u8 ttl; /* Swift counts the hops from it */
};

/* Parse Ethernet/IPv4/UDP 4791/BTH and keep ACKs (AETH syndrome ACK) and CNPs. */
static __always_inline int xm_parse_feedback(struct xdp_md *ctx, struct xm_feedback *fb)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end) {
		xm_count(XM_CNT_XDP_MALFORMED);
		return -1;
	}
	if (eth->h_proto != bpf_htons(ETH_P_IP)) {
		xm_count(XM_CNT_XDP_NOT_IPV4);
		return -1;
	}
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->version != 4 || ip->ihl < 5) {
		xm_count(XM_CNT_XDP_MALFORMED);
		return -1;
	}
	__u32 ihl = ip->ihl * 4;
	__u32 tot_len = bpf_ntohs(ip->tot_len);
	if (tot_len < ihl || data + ETH_HLEN + tot_len > data_end) {
		xm_count(XM_CNT_XDP_MALFORMED);
		return -1;
	}
	if (ip->protocol != IPPROTO_UDP || (bpf_ntohs(ip->frag_off) & 0x3fff)) {
		xm_count(XM_CNT_XDP_NOT_ROCE);
		return -1;
	}
	struct udphdr *udp = (void *)ip + (ihl & 0x3c);
	if ((void *)(udp + 1) > data_end) {
		xm_count(XM_CNT_XDP_MALFORMED);
		return -1;
	}
	if (udp->dest != bpf_htons(XM_ROCE_PORT)) {
		xm_count(XM_CNT_XDP_NOT_ROCE);
		return -1;
	}
	__u32 udp_len = bpf_ntohs(udp->len);
	__u8 *bth = (void *)(udp + 1);
	if (udp_len < 8 + XM_BTH_LEN || udp_len > tot_len - ihl ||
	    (void *)(bth + XM_BTH_LEN) > data_end) {
		xm_count(XM_CNT_XDP_MALFORMED);
		return -1;
	}
	__u8 opcode = bth[0];
	fb->psn = ((__u32)bth[9] << 16) | ((__u32)bth[10] << 8) | bth[11];
	if (opcode == XM_OP_ACK) {
		__u8 *aeth = bth + XM_BTH_LEN;
		if (udp_len < 8 + XM_BTH_LEN + XM_AETH_LEN + XM_ICRC_LEN ||
		    (void *)(aeth + XM_AETH_LEN) > data_end) {
			xm_count(XM_CNT_XDP_MALFORMED);
			return -1;
		}
		if (aeth[0] > 0x1f) { /* NAKs (and RNR NAKs) do not move the rate */
			xm_count(XM_CNT_XDP_NAK);
			return -1;
		}
		xm_count(XM_CNT_XDP_ACK);
		fb->echo_off = ETH_HLEN + ihl + 8 + XM_BTH_LEN + XM_AETH_LEN;
		fb->echo_len = udp_len - (8 + XM_BTH_LEN + XM_AETH_LEN + XM_ICRC_LEN);
	} else if (opcode == XM_OP_CNP) {
		xm_count(XM_CNT_XDP_CNP);
		fb->is_cnp = 1;
	} else if (opcode <= XM_OP_DATA_MAX) {
		xm_count(XM_CNT_XDP_DATA);
		return -1;
	} else {
		xm_count(XM_CNT_XDP_OTHER_OPCODE);
		return -1;
	}
	/* feedback carries the data flow's UDP source port (docs/wire-format.md) */
	fb->key.saddr = ip->daddr;
	fb->key.daddr = ip->saddr;
	fb->key.sport = udp->source;
	fb->key.dport = bpf_htons(XM_ROCE_PORT);
	fb->key.proto = IPPROTO_UDP;
	fb->ttl = ip->ttl;
	return 0;
}

#endif /* XINGMAI_LIB_FEEDBACK_H */
