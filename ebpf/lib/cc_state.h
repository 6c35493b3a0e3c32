/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The per-flow congestion-control state (struct xm_cc_state) both laws share: its initial
 * value and PSN serial arithmetic. controller/nic/ratelaw/base.py is its Python twin.
 */
#ifndef XINGMAI_LIB_CC_STATE_H
#define XINGMAI_LIB_CC_STATE_H

#include "xingmai.h"

static __always_inline void xm_cc_init(struct xm_cc_state *cc, __u32 law, __u64 ceil,
				       const struct xm_flow_stats *st, __u64 now)
{
	__builtin_memset(cc, 0, sizeof(*cc));
	cc->law = law;
	cc->rate_bps = ceil;
	cc->ref_rate_bps = ceil;
	cc->util = XM_UNIT;
	cc->alpha = XM_UNIT;
	cc->alpha_ts_ns = now;
	cc->timer_ts_ns = now;
	cc->bc_base_bytes = st->tx_bytes;
	cc->prev_tx_bytes = st->tx_bytes;
	cc->rtt_done_seq = st->rtt_probe_seq; /* a pending RTT probe may predate the law */
}

/* a >= b in 24-bit PSN serial arithmetic */
static __always_inline int xm_psn_ge(__u32 a, __u32 b)
{
	return ((a - b) & 0xffffff) < 0x800000;
}

#endif /* XINGMAI_LIB_CC_STATE_H */
