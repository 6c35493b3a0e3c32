/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Small arithmetic helpers the programs share (no maps).
 */
#ifndef XINGMAI_LIB_HELPERS_H
#define XINGMAI_LIB_HELPERS_H

#include "xingmai.h"

static __always_inline __u64 xm_min64(__u64 a, __u64 b)
{
	return a < b ? a : b;
}

static __always_inline __u64 xm_max64(__u64 a, __u64 b)
{
	return a > b ? a : b;
}

static __always_inline __u32 xm_popcount16(__u32 x)
{
	x = x - ((x >> 1) & 0x5555);
	x = (x & 0x3333) + ((x >> 2) & 0x3333);
	x = (x + (x >> 4)) & 0x0f0f;
	return (x + (x >> 8)) & 0x1f;
}

/* 4-byte words of the hop metadata an instruction bitmap asks for (bit 0 = MSB): one per
 * bit, two for bits 4-6 (timestamps, L2 ports). Reserved bits 8-14 count one word each, as
 * INT v2.1 asks of nodes that do not understand them. No branches (verifier state). */
static __always_inline __u32 xm_int_words(__u32 bitmap)
{
	bitmap &= 0xffff;
	return xm_popcount16(bitmap) + xm_popcount16(bitmap & 0x0e00);
}

/* Upper bound of a flow's rate: the line rate and the controller's cap. */
static __always_inline __u64 xm_rate_ceiling(const struct xm_host_config *cfg,
					     const struct xm_flow_ctl *ctl)
{
	__u64 ceil = cfg->line_rate_bps;
	if (ctl && (ctl->flags & XM_CTL_HAS_CAP))
		ceil = xm_min64(ceil, ctl->cap_bps);
	return ceil;
}

/* [min_rate, ceiling]; the ceiling wins when a cap is below min_rate. */
static __always_inline __u64 xm_bound_rate(__u64 rate, __u64 min_rate, __u64 ceil)
{
	if (rate < min_rate)
		rate = min_rate;
	if (rate > ceil)
		rate = ceil;
	return rate;
}

#endif /* XINGMAI_LIB_HELPERS_H */
