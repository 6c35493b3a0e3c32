/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where the fields XDP's rate laws read sit in an echoed INT hop, without branches.
 * controller/nic/ratelaw/echo.py is its Python twin.
 */
#ifndef XINGMAI_LIB_INT_ECHO_H
#define XINGMAI_LIB_INT_ECHO_H

#include "xingmai.h"
#include "lib/helpers.h"

/* Where one hop's fields sit in its metadata, in 4-byte words. A field the bitmap does not
 * request points at XM_HOP_ABSENT, two all-ones words after the largest hop, so that reading
 * it needs no branch (and the verifier no extra state per hop). */
#define XM_HOP_MAX_WORDS 31 /* HopML is 5 bits */
struct xm_int_layout {
	__u32 hop_words;
	__u32 off_node;
	__u32 off_ports;
	__u32 off_qocc;
	__u32 off_egress_ts;
	__u32 off_tx_util;
};

/* word offset of field bit b (bit 0 = MSB) in a hop, or XM_HOP_ABSENT when not requested */
static __always_inline __u32 xm_int_field_off(__u32 bitmap, __u32 b)
{
	__u32 before = bitmap & ((0xffffU << (16 - b)) & 0xffff);
	__u32 present = (bitmap >> (15 - b)) & 1;
	__u32 off = xm_int_words(before);
	return present * off + (1 - present) * XM_HOP_ABSENT;
}

/* Arithmetic only: a branch per bitmap bit would give the verifier 2^16 paths. */
static __always_inline void xm_int_layout_of(__u32 bitmap, struct xm_int_layout *l)
{
	l->hop_words = xm_int_words(bitmap);
	l->off_node = xm_int_field_off(bitmap, 0);
	l->off_ports = xm_int_field_off(bitmap, 1);
	l->off_qocc = xm_int_field_off(bitmap, 3);
	l->off_egress_ts = xm_int_field_off(bitmap, 5);
	l->off_tx_util = xm_int_field_off(bitmap, 7);
}

/* Word i (network order) of a hop buffer of XM_HOP_BUF_WORDS words. The mask bounds the
 * index without a branch: a clamp would split every read into two verifier states. */
static __always_inline __u32 xm_hop_word(const __u32 *w, __u32 i)
{
	return bpf_ntohl(w[i & 63]);
}

#endif /* XINGMAI_LIB_INT_ECHO_H */
