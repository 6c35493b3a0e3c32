/* SPDX-License-Identifier: Apache-2.0 */
/*
 * PFC (IEEE 802.1Qbb) pauses arriving at the NIC: XDP decodes the MAC Control frame
 * (controller/wire/pfc.py) and records, per priority, until when the switch asked this NIC
 * to hold it (xm_pfc), with the time held so far. controller/nic/pfc.py is the Python
 * reference, operation for operation (the twin's NICs run it; tests compare the two).
 */
#ifndef XINGMAI_LIB_PFC_H
#define XINGMAI_LIB_PFC_H

#include "xingmai.h"
#include "lib/maps.h"
#include "lib/helpers.h"

/* Hold the priority until `until` (now: release it), closing the time held so far. */
static __always_inline void xm_pfc_set(struct xm_pfc_state *st, __u64 now, __u64 until)
{
	if (st->active && now > st->since_ns)
		st->paused_ns += xm_min64(now, st->pause_until_ns) - st->since_ns;
	st->active = 0;
	st->pause_until_ns = until;
	if (until > now) {
		st->since_ns = now;
		st->active = 1;
	}
}

/* 1 when the frame is a MAC Control frame (consumed: the caller drops it), else 0. */
static __always_inline int xm_pfc_frame(struct xdp_md *ctx, __u64 now)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(XM_ETH_P_MAC_CONTROL))
		return 0;
	__u8 *p = (__u8 *)(eth + 1);
	if ((void *)(p + XM_PFC_LEN) > end ||
	    ((__u32)p[0] << 8 | p[1]) != XM_PFC_OPCODE || p[2] != 0) {
		xm_count(XM_CNT_XDP_PFC_MALFORMED); /* 802.3x PAUSE, short, reserved bits */
		return 1;
	}
	struct xm_host_config *cfg = xm_config_get();
	if (!cfg || !cfg->line_rate_bps) {
		xm_count(XM_CNT_XDP_NO_CONFIG);
		return 1;
	}
	__u32 vec = p[3];
#pragma unroll
	for (__u32 prio = 0; prio < XM_PFC_PRIORITIES; prio++) {
		if (!((vec >> prio) & 1))
			continue;
		__u64 quanta = (__u64)p[4 + 2 * prio] << 8 | p[5 + 2 * prio];
		__u32 key = prio;
		struct xm_pfc_state *st = xm_pfc.lookup(&key);
		if (!st)
			continue;
		if (quanta) {
			st->pauses += 1;
			xm_count(XM_CNT_XDP_PFC_PAUSE);
			xm_pfc_set(st, now,
				   now + quanta * XM_PFC_QUANTUM_BITS * XM_NSEC / cfg->line_rate_bps);
		} else {
			st->resumes += 1;
			xm_count(XM_CNT_XDP_PFC_RESUME);
			xm_pfc_set(st, now, now);
		}
	}
	return 1;
}

#endif /* XINGMAI_LIB_PFC_H */
