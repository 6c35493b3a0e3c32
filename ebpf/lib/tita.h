/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TiTa (HPCC-like): the rate from the INT echoed in every ACK.
 * controller/nic/ratelaw/tita.py is its Python twin, operation for operation.
 */
#ifndef XINGMAI_LIB_TITA_H
#define XINGMAI_LIB_TITA_H

#include "xingmai.h"
#include "lib/maps.h"
#include "lib/helpers.h"
#include "lib/int_echo.h"
#include "lib/cc_state.h"

static __always_inline __u64 xm_hop_speed_of(const struct xm_host_config *cfg, __u32 node,
					     __u32 port)
{
	struct xm_hop_key hk = {.node_id = node, .port = port};
	__u64 *b = xm_hop_speed.lookup(&hk);
	if (!b) {
		hk.port = XM_ALL_ONES32;
		b = xm_hop_speed.lookup(&hk);
	}
	if (b && *b)
		return *b;
	return cfg->line_rate_bps;
}

/*
 * TiTa, per ACK with an INT echo (HPCC's algorithm on rates):
 *   per hop  u = min(qlen, qlen_prev)/(B*T) + txRate/B
 *   U' = ((T - tau) * U + tau * max u) / T      tau = that hop's timestamp delta, <= T
 *   U' >= eta or stage >= max_stage:  R = R_ref * eta / U' + W_AI   (stage 0)
 *   else                              R = R_ref + W_AI              (stage + 1)
 * U, R_ref and the stage are committed once per RTT (when the ACK covers a PSN sent after the
 * previous commit); R is recomputed on every ACK from the committed values.
 */
/* With hpcc: HPCC as published, its own parameters (prm->hpcc) and U committed on every ACK
 * (Algorithm 1's MeasureInflight); R_ref and the stage once per RTT as for TiTa. */
static __always_inline void xm_tita_on_ack(struct xdp_md *ctx, const struct xm_host_config *cfg,
					   const struct xm_cc_params *prm, struct xm_cc_state *cc,
					   const struct xm_flow_stats *st,
					   const struct xm_feedback *fb, __u64 ceil, __u32 weight,
					   __u64 now, int hpcc)
{
	const struct xm_tita_params *tp = hpcc ? &prm->hpcc : &prm->tita;
	__u8 shim[XM_INT_SHIM_LEN];
	__u8 md[XM_INT_MD_LEN];

	if (fb->echo_len < XM_INT_SHIM_LEN + XM_INT_MD_LEN ||
	    bpf_xdp_load_bytes(ctx, fb->echo_off, shim, sizeof(shim)) < 0 ||
	    (shim[0] >> 4) != 1 || 4 * ((__u32)shim[1] + 1) != fb->echo_len) {
		xm_count(XM_CNT_XDP_ACK_NO_INT);
		return;
	}
	if (bpf_xdp_load_bytes(ctx, fb->echo_off + XM_INT_SHIM_LEN, md, sizeof(md)) < 0 ||
	    (md[0] >> 4) != 2) {
		xm_count(XM_CNT_XDP_INT_BAD_HEADER);
		return;
	}
	struct xm_int_layout lay;
	__u32 hop_ml = md[2] & 0x1f;
	xm_int_layout_of(((__u32)md[4] << 8) | md[5], &lay);
	if (hop_ml == 0 || lay.hop_words != hop_ml) {
		xm_count(XM_CNT_XDP_INT_BAD_HEADER);
		return;
	}
	__u32 stack_words = (__u32)shim[1] - XM_INT_MD_LEN / 4;
	if (stack_words % hop_ml) {
		xm_count(XM_CNT_XDP_INT_BAD_LENGTH);
		return;
	}
	__u32 nh = stack_words / hop_ml;
	if (nh == 0) {
		xm_count(XM_CNT_XDP_ACK_NO_INT);
		return;
	}
	if (nh > XM_MAX_HOPS) {
		xm_count(XM_CNT_XDP_INT_TOO_MANY_HOPS);
		return;
	}

	__u64 T = tp->base_rtt_ns ? tp->base_rtt_ns : 1;
	__u64 local_dt = now > cc->last_fb_ns ? now - cc->last_fb_ns : 0;
	__u64 sent = st->tx_bytes - cc->prev_tx_bytes;
	if (sent > (1ULL << 30))
		sent = 1ULL << 30;
	/* Loop-carried values live in per-CPU scratch memory, not in registers: the verifier
	 * then sees the same register state after every hop and prunes the paths. */
	__u32 zero = 0;
	struct xm_hop_scratch *sc = xm_xdp_scratch.lookup(&zero);
	if (!sc)
		return;
	sc->u_max = 0;
	sc->tau = 0;
	sc->comparable = (cc->flags & XM_CC_HAVE_RECORDS) && cc->nhops == nh;

	/* a hop is at most 31 words: the all-ones words from 32 on stay as set here */
	__u32 *w = sc->w;
	__builtin_memset(w, 0xff, sizeof(sc->w));
	for (int i = 0; i < XM_MAX_HOPS; i++) {
		if (i >= nh)
			break;
		__u32 base = fb->echo_off + XM_INT_SHIM_LEN + XM_INT_MD_LEN + i * hop_ml * 4;
		if (bpf_xdp_load_bytes(ctx, base, w, (hop_ml & 0x1f) * 4) < 0) {
			sc->comparable = 0;
			break;
		}
		__u32 node = xm_hop_word(w, lay.off_node);
		__u32 port = xm_hop_word(w, lay.off_ports) & 0xffff;
		__u32 q = xm_hop_word(w, lay.off_qocc);
		__u64 ts = ((__u64)xm_hop_word(w, lay.off_egress_ts) << 32) |
			   xm_hop_word(w, lay.off_egress_ts + 1);
		__u32 txu = xm_hop_word(w, lay.off_tx_util);
		__u32 qlen = q == XM_ALL_ONES32 ? 0 : (q & 0xffffff);

		/* u of every hop is computed; it only counts when the whole path compares */
		struct xm_hop_rec *prev = &cc->hops[i];
		if (prev->node_id != node)
			sc->comparable = 0;
		__u64 B = xm_hop_speed_of(cfg, node, port);
		__u64 dt = local_dt;
		if (ts != XM_NO_TS && prev->egress_ts_ns != XM_NO_TS && ts > prev->egress_ts_ns)
			dt = ts - prev->egress_ts_ns;
		__u64 qmin = qlen < prev->qlen ? qlen : prev->qlen;
		__u64 bdp = (B / 8) * T / XM_NSEC;
		if (bdp == 0)
			bdp = 1;
		__u64 u = (qmin << XM_UNIT_SHIFT) / bdp;
		if (txu != XM_ALL_ONES32) {
			u += ((__u64)txu << XM_UNIT_SHIFT) / 1000000;
		} else if (qmin > 0) {
			u += XM_UNIT; /* a standing queue: the port sent at line rate */
		} else if (dt > 0) {
			/* no tx utilisation in INT: this flow's own rate is the bound we know */
			__u64 own = sent * 8 * XM_NSEC / dt;
			if (own > B)
				own = B;
			u += (own << XM_UNIT_SHIFT) / B;
		}
		if (u > XM_U_MAX)
			u = XM_U_MAX;
		if (i == 0 || u > sc->u_max) {
			sc->u_max = u;
			sc->tau = dt;
		}
		prev->node_id = node;
		prev->qlen = qlen;
		prev->egress_ts_ns = ts;
		prev->tx_util_ppm = txu;
	}
	int comparable = sc->comparable;
	__u64 u_max = sc->u_max, tau = sc->tau;
	cc->prev_tx_bytes = st->tx_bytes;
	__u32 snd_nxt = (st->flags & XM_FLOW_PSN_VALID) ? st->snd_nxt_psn : fb->psn;

	if (!comparable) {
		xm_count((cc->flags & XM_CC_HAVE_RECORDS) ? XM_CNT_XDP_TITA_PATH_CHANGE
							  : XM_CNT_XDP_TITA_FIRST_RECORD);
		cc->flags |= XM_CC_HAVE_RECORDS | XM_CC_PSN_VALID;
		cc->nhops = nh;
		cc->last_update_psn = snd_nxt;
		return;
	}

	if (tau > T)
		tau = T;
	__u64 U = ((T - tau) * cc->util + tau * u_max) / T;
	if (hpcc)
		cc->util = U;
	__u64 eta = tp->eta;
	__u64 wai = tp->wai_bps * weight;
	__u64 R;
	__u32 stage;
	if (U >= eta || cc->inc_stage >= tp->max_stage) {
		__u64 Ud = U ? U : 1;
		R = cc->ref_rate_bps * eta / Ud + wai;
		stage = 0;
	} else {
		R = cc->ref_rate_bps + wai;
		stage = cc->inc_stage + 1;
	}
	R = xm_bound_rate(R, prm->min_rate_bps, ceil);
	cc->rate_bps = R;
	cc->updates += 1;
	xm_count(XM_CNT_XDP_TITA_UPDATE);
	if (xm_psn_ge(fb->psn, cc->last_update_psn)) {
		cc->util = U;
		cc->ref_rate_bps = R;
		cc->inc_stage = stage;
		cc->last_update_psn = snd_nxt;
		xm_count(XM_CNT_XDP_TITA_REF_UPDATE);
	}
}

#endif /* XINGMAI_LIB_TITA_H */
