/* SPDX-License-Identifier: Apache-2.0 */
/*
 * XDP ingress of the xingmai NIC: reads the transport's feedback (ACKs with an echoed INT
 * stack, CNPs), runs the flow's rate law in fixed point and writes the new rate to xm_rates.
 * Every packet passes (XDP_PASS): the transport needs its ACKs, and anything unknown or
 * malformed is only counted.
 *
 * controller/nic/ratelaw.py is the Python reference of the laws below and in lib/ (TiTa and
 * HPCC, DCQCN here; TIMELY and Swift in lib/timely.h and lib/swift.h), operation for
 * operation: change one, change the other (tests compare them packet by packet).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/udp.h>

#include "xingmai.h"
#include "lib/swift.h"
#include "lib/timely.h"

/* DCQCN increase events applied per feedback packet, per source (timer, byte counter); more
 * elapsed periods wait for the next packets, up to XM_DCQCN_BACKLOG (older ones are dropped:
 * by then the rate has long reached its ceiling). The verifier's work grows with the square
 * of the per-packet bound, hence a small one: ACKs come far more often than timer periods. */
#define XM_DCQCN_MAX_EVENTS 4
#define XM_DCQCN_BACKLOG 64

struct xm_feedback {
	struct xm_flow_key key; /* the data flow this feedback answers */
	__u32 echo_off;         /* ACK: offset of the bytes after the AETH */
	__u32 echo_len;         /* ACK: those bytes, ICRC excluded */
	__u32 psn;
	__u8 is_cnp;
	__u8 ttl; /* Swift counts the hops from it */
};

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
	__u32 before = bitmap & ((0xffff << (16 - b)) & 0xffff);
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
	cc->rtt_done_seq = st->rtt_probe_seq; /* a pending probe may predate the law */
}

/* The RTT of tc's pending probe when this ACK covers it (ratelaw.py take_rtt_sample()). */
static __always_inline int xm_rtt_sample(struct xm_cc_state *cc, const struct xm_flow_stats *st,
					 __u32 ack_psn, __u64 now, __u64 *rtt)
{
	__u32 seq = st->rtt_probe_seq;
	if (seq == cc->rtt_done_seq || !xm_psn_ge(ack_psn, st->rtt_probe_psn))
		return 0;
	cc->rtt_done_seq = seq;
	__u64 sent = st->rtt_probe_ns;
	__u64 r = now > sent ? now - sent : 0;
	*rtt = r > XM_ALL_ONES32 ? XM_ALL_ONES32 : r;
	return 1;
}

/*
 * TiTa, per ACK with an INT echo (HPCC's algorithm on rates):
 *   per hop  u = min(qlen, qlen_prev)/(B*T) + txRate/B
 *   U' = ((T - tau) * U + tau * max u) / T      tau = that hop's timestamp delta, <= T
 *   U' >= eta or stage >= max_stage:  R = R_ref * eta / U' + W_AI   (stage 0)
 *   else                              R = R_ref + W_AI              (stage + 1)
 * U, R_ref and the stage are committed once per RTT (when the ACK covers a PSN sent after the
 * previous commit); R is recomputed on every ACK from the committed values.
 * HPCC as published (hpcc != 0): its own parameters (prm->hpcc) and U committed on every ACK
 * (Algorithm 1's MeasureInflight); R_ref and the stage once per RTT as above.
 */
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

/* (base/UNIT)^n in fixed point, truncating after every product; n < 2^16. Square and
 * multiply without branches: the factor is base when the bit is set, else 1.0. */
static __always_inline __u64 xm_fx_pow(__u64 base, __u32 n)
{
	__u64 r = XM_UNIT;
#pragma unroll
	for (int i = 0; i < 16; i++) {
		__u64 bit_mask = -(__u64)((n >> i) & 1);
		__u64 factor = XM_UNIT - ((XM_UNIT - base) & bit_mask);
		r = (r * factor) >> XM_UNIT_SHIFT;
		base = (base * base) >> XM_UNIT_SHIFT;
	}
	return r;
}

/*
 * DCQCN reaction point. Timers and the byte counter are evaluated lazily on each feedback
 * packet: the events that elapsed since the last one (time / period, bytes sent by tc /
 * byte counter) are applied first, timer events before byte events (XM_DCQCN_MAX_EVENTS).
 * XDP is then the only writer of the CC state (no locks shared with tc or the agent), and
 * ACKs arrive for as long as the flow sends.
 */
/* All ones when a < b, else 0 (a, b < 2^63). Masks instead of branches keep the verifier's
 * state count flat across the event loop below. */
static __always_inline __u64 xm_lt_mask(__u64 a, __u64 b)
{
	return (__u64)((__s64)(a - b) >> 63);
}

/* One increase event. Stage from the timer count T and byte count BC (QCN/DCQCN):
 * max(T, BC) <= F fast recovery, min(T, BC) > F hyper increase by (min - F) * R_HAI,
 * otherwise additive increase by R_AI; then R_C = (R_T + R_C) / 2. */
static __always_inline void xm_dcqcn_increase(const struct xm_cc_params *prm,
					      struct xm_cc_state *cc, __u64 ceil, __u32 weight)
{
	__u64 F = prm->dcqcn.fast_recovery_steps;
	__u64 t = cc->timer_count, b = cc->byte_count;
	__u64 t_lt_b = xm_lt_mask(t, b);
	__u64 mx = (b & t_lt_b) | (t & ~t_lt_b);
	__u64 mn = (t & t_lt_b) | (b & ~t_lt_b);
	__u64 hyper = xm_lt_mask(F, mn);    /* F < min */
	__u64 additive = xm_lt_mask(F, mx); /* F < max */
	__u64 inc_hai = (mn - F) * prm->dcqcn.rhai_bps * weight;
	__u64 inc_ai = prm->dcqcn.rai_bps * weight;
	__u64 inc = (inc_hai & hyper) | (inc_ai & additive & ~hyper);
	__u64 target = cc->ref_rate_bps + inc;
	__u64 over = xm_lt_mask(ceil, target);
	target = (ceil & over) | (target & ~over);
	cc->ref_rate_bps = target;
	cc->rate_bps = (cc->rate_bps + target) / 2;
}

static __always_inline void xm_dcqcn_on_feedback(const struct xm_cc_params *prm,
						 struct xm_cc_state *cc,
						 const struct xm_flow_stats *st, int is_cnp,
						 __u64 ceil, __u32 weight, __u64 now)
{
	const struct xm_dcqcn_params *d = &prm->dcqcn;

	/* alpha decays by (1 - g) per elapsed period K */
	if (d->alpha_timer_ns && now > cc->alpha_ts_ns) {
		__u64 n = (now - cc->alpha_ts_ns) / d->alpha_timer_ns;
		if (n > 0xffff) {
			n = 0xffff;
			cc->alpha_ts_ns = now;
		} else {
			cc->alpha_ts_ns += n * d->alpha_timer_ns;
		}
		if (n)
			cc->alpha = (cc->alpha * xm_fx_pow(XM_UNIT - d->g, n)) >> XM_UNIT_SHIFT;
	}

	/* rate increase events, only after a cut */
	if (cc->flags & XM_CC_CUT_SEEN) {
		__u64 nt = 0, nb = 0;
		if (d->rate_timer_ns && now > cc->timer_ts_ns) {
			nt = (now - cc->timer_ts_ns) / d->rate_timer_ns;
			if (nt > XM_DCQCN_BACKLOG) {
				cc->timer_ts_ns = now - XM_DCQCN_BACKLOG * d->rate_timer_ns;
				nt = XM_DCQCN_BACKLOG;
			}
			if (nt > XM_DCQCN_MAX_EVENTS)
				nt = XM_DCQCN_MAX_EVENTS;
			cc->timer_ts_ns += nt * d->rate_timer_ns;
		}
		if (d->byte_counter && st->tx_bytes > cc->bc_base_bytes) {
			nb = (st->tx_bytes - cc->bc_base_bytes) / d->byte_counter;
			if (nb > XM_DCQCN_BACKLOG) {
				cc->bc_base_bytes = st->tx_bytes - XM_DCQCN_BACKLOG * d->byte_counter;
				nb = XM_DCQCN_BACKLOG;
			}
			if (nb > XM_DCQCN_MAX_EVENTS)
				nb = XM_DCQCN_MAX_EVENTS;
			cc->bc_base_bytes += nb * d->byte_counter;
		}
		for (int e = 0; e < 2 * XM_DCQCN_MAX_EVENTS; e++) {
			if (e >= nt + nb)
				break;
			__u64 is_timer = xm_lt_mask(e, nt) & 1; /* timer events first */
			cc->timer_count += is_timer;
			cc->byte_count += 1 - is_timer;
			xm_dcqcn_increase(prm, cc, ceil, weight);
		}
		if (nt + nb)
			xm_count(XM_CNT_XDP_DCQCN_INCREASE);
	}

	if (is_cnp) {
		if ((cc->flags & XM_CC_CUT_SEEN) && now - cc->last_cut_ns < d->cut_interval_ns) {
			xm_count(XM_CNT_XDP_DCQCN_CUT_HELD);
		} else {
			cc->ref_rate_bps = cc->rate_bps;
			cc->rate_bps = (cc->rate_bps * (XM_UNIT - cc->alpha / 2)) >> XM_UNIT_SHIFT;
			cc->alpha = (((XM_UNIT - d->g) * cc->alpha) >> XM_UNIT_SHIFT) + d->g;
			if (cc->alpha > XM_UNIT)
				cc->alpha = XM_UNIT;
			cc->timer_count = 0;
			cc->byte_count = 0;
			cc->timer_ts_ns = now;
			cc->alpha_ts_ns = now;
			cc->bc_base_bytes = st->tx_bytes;
			cc->last_cut_ns = now;
			cc->flags |= XM_CC_CUT_SEEN;
			xm_count(XM_CNT_XDP_DCQCN_CUT);
		}
	}
	cc->rate_bps = xm_bound_rate(cc->rate_bps, prm->min_rate_bps, ceil);
	cc->ref_rate_bps = xm_bound_rate(cc->ref_rate_bps, prm->min_rate_bps, ceil);
	cc->updates += 1;
}

int xm_xdp_ingress(struct xdp_md *ctx)
{
	struct xm_feedback fb = {};

	xm_count(XM_CNT_XDP_PACKETS);
	if (xm_parse_feedback(ctx, &fb) < 0)
		return XDP_PASS;

	struct xm_host_config *cfg = xm_config_get();
	if (!cfg) {
		xm_count(XM_CNT_XDP_NO_CONFIG);
		return XDP_PASS;
	}
	/* feedback for a flow this host never sent is not ours to act on */
	struct xm_flow_stats *st = xm_flows.lookup(&fb.key);
	if (!st) {
		xm_count(XM_CNT_XDP_UNKNOWN_FLOW);
		return XDP_PASS;
	}
	struct xm_flow_ctl *ctl = xm_ctl.lookup(&fb.key);
	const struct xm_cc_params *prm = &cfg->cc;
	if (ctl && (ctl->flags & XM_CTL_HAS_PARAMS))
		prm = &ctl->params;
	__u32 law = prm->law;
	if (law == XM_LAW_NONE || law > XM_LAW_SWIFT) {
		xm_count(XM_CNT_XDP_LAW_NONE);
		return XDP_PASS;
	}
	if (law != XM_LAW_DCQCN && fb.is_cnp) { /* only DCQCN acts on CNPs */
		xm_count(XM_CNT_XDP_CNP_IGNORED);
		return XDP_PASS;
	}
	__u32 weight = ctl && ctl->weight ? ctl->weight : 1;
	__u64 ceil = xm_rate_ceiling(cfg, ctl);
	__u64 now = bpf_ktime_get_ns();

	struct xm_cc_state *cc = xm_cc.lookup(&fb.key);
	if (!cc) {
		/* the state is too large for the BPF stack: insert a zeroed scratch copy */
		__u32 zero = 0;
		struct xm_cc_state *blank = xm_cc_scratch.lookup(&zero);
		if (!blank)
			return XDP_PASS;
		__builtin_memset(blank, 0, sizeof(*blank));
		xm_cc.insert(&fb.key, blank);
		cc = xm_cc.lookup(&fb.key);
		if (!cc) {
			xm_count(XM_CNT_XDP_CC_TABLE_FULL);
			return XDP_PASS;
		}
		xm_cc_init(cc, law, ceil, st, now);
	} else if (cc->law != law) {
		xm_cc_init(cc, law, ceil, st, now);
	}

	__u64 before = cc->rate_bps;
	if (law == XM_LAW_TITA || law == XM_LAW_HPCC) {
		if (fb.echo_len == 0) {
			xm_count(XM_CNT_XDP_ACK_NO_INT);
		} else {
			xm_tita_on_ack(ctx, cfg, prm, cc, st, &fb, ceil, weight, now,
				       law == XM_LAW_HPCC);
		}
	} else if (law == XM_LAW_DCQCN) {
		xm_dcqcn_on_feedback(prm, cc, st, fb.is_cnp, ceil, weight, now);
	} else {
		__u64 rtt;
		if (xm_rtt_sample(cc, st, fb.psn, now, &rtt)) {
			xm_count(XM_CNT_XDP_RTT_SAMPLE);
			if (law == XM_LAW_TIMELY)
				xm_count(xm_timely_on_rtt(prm, cc, rtt, ceil, weight));
			else
				xm_count(xm_swift_on_rtt(prm, cc, rtt, fb.ttl, now, ceil, weight));
		}
	}
	cc->last_fb_ns = now;
	cc->feedback += 1;

	struct xm_rate *cur = xm_rates.lookup(&fb.key);
	if (!cur || cur->rate_bps != cc->rate_bps || before != cc->rate_bps) {
		struct xm_rate nr = {};
		nr.rate_bps = cc->rate_bps;
		nr.stamp_ns = now;
		nr.origin = law; /* XM_ORIGIN_<law> is the law's value */
		xm_rates.update(&fb.key, &nr);
	}
	return XDP_PASS;
}
