/* SPDX-License-Identifier: Apache-2.0 */
/*
 * xingmai NIC: the one header of what the three eBPF programs (tc_egress.c, xdp_ingress.c,
 * sockops.c) share with Python: constants, the flow key, every map value, the host
 * configuration and the per-reason counters. The maps are declared once, in lib/maps.h; the
 * programs' logic is in lib/*.h (static __always_inline helpers), one program per hook.
 *
 * bcc rewrites map accesses (map.lookup(...)) only in the file it compiles, so the loader
 * (controller/nic/bpf/loader.py) expands the programs' #include "..." of this folder into one
 * text rather than letting the preprocessor include them.
 *
 * Python never re-declares these structs: it takes the ctypes layouts bcc derives from this
 * header (BPF(...)["map"].Key / .Leaf), and reads the XM_* constants, the enums (XM_CNT_* and
 * the others) and the map list from the headers (controller/nic/bpf/header.py); the wire
 * constants are checked against controller/wire by tests/test_wire_sources.py.
 *
 * Byte order: addresses and ports in struct xm_flow_key are kept as on the wire (network
 * order); everything else is host order. Rates are bits per second of the frame as the
 * transport hands it to the NIC (Ethernet header included, not the INT header this NIC adds):
 * the kernel sizes a packet for its qdisc before tc runs, so that is what HTB paces, and EDT
 * uses the same length. Byte counters (xm_flow_stats) count the frame as sent, INT included.
 *
 * Fixed point: utilisation, eta, alpha and g are fractions scaled by XM_UNIT (2^20).
 */
#ifndef XINGMAI_H
#define XINGMAI_H

#define XM_UNIT_SHIFT 20
#define XM_UNIT (1ULL << XM_UNIT_SHIFT)
#define XM_U_MAX (64ULL << XM_UNIT_SHIFT) /* a per-hop utilisation above 64x is clamped */
#define XM_MAX_HOPS 8
#define XM_NSEC 1000000000ULL
#define XM_ROCE_PORT 4791
#define XM_ALL_ONES32 0xffffffffU

/* Transport (docs/wire-format.md). */
#define XM_BTH_LEN 12
#define XM_AETH_LEN 4
#define XM_ICRC_LEN 4
#define XM_INT_SHIM_LEN 4
#define XM_INT_MD_LEN 12
#define XM_OP_ACK 0x11
#define XM_OP_CNP 0x81
/* Data-carrying RC requests (SEND and RDMA WRITE families) get INT; feedback never does. */
#define XM_OP_DATA_MAX 0x0b
#define XM_AETH_NAK_MIN 0x60
/* IEEE 802.1Qbb PFC (controller/wire/pfc.py): a MAC Control frame the NIC consumes. */
#define XM_ETH_P_MAC_CONTROL 0x8808
#define XM_PFC_OPCODE 0x0101
#define XM_PFC_LEN 20 /* opcode, class-enable vector, eight 16-bit pause times */
#define XM_PFC_PRIORITIES 8
#define XM_PFC_QUANTUM_BITS 512

enum xm_law {
	XM_LAW_NONE = 0,
	XM_LAW_TITA = 1,
	XM_LAW_DCQCN = 2,
	XM_LAW_HPCC = 3,   /* HPCC as published: TiTa's measurement, U per ACK, maxStage */
	XM_LAW_TIMELY = 4, /* RTT gradient (tc's RTT probe) */
	XM_LAW_SWIFT = 5,  /* delay target, AIMD (tc's RTT probe, hops from the ACK's TTL) */
};

enum xm_pacing_mode {
	XM_PACING_HTB = 0, /* tc sets skb->priority to the flow's HTB class */
	XM_PACING_EDT = 1, /* tc sets skb->tstamp; needs sch_fq as root qdisc */
};

/* Where a rate in xm_rates came from. */
enum xm_rate_origin {
	XM_ORIGIN_AGENT = 0, /* the agent: line rate, cap, or an explicit rate */
	XM_ORIGIN_TITA = 1,
	XM_ORIGIN_DCQCN = 2,
	XM_ORIGIN_HPCC = 3,
	XM_ORIGIN_TIMELY = 4,
	XM_ORIGIN_SWIFT = 5,
};

/*
 * Per-reason packet counters (percpu array xm_counters). Python parses the names from this
 * enum (one "XM_CNT_NAME," per line), so keep one entry per line and XM_CNT_MAX last.
 */
enum xm_counter {
	XM_CNT_TC_PACKETS,
	XM_CNT_TC_NOT_IPV4,
	XM_CNT_TC_MALFORMED,
	XM_CNT_TC_OTHER_PROTO,
	XM_CNT_TC_FLOW_TABLE_FULL,
	XM_CNT_TC_INT_INSERTED,
	XM_CNT_TC_INT_NO_ROOM,
	XM_CNT_TC_INT_GSO,
	XM_CNT_TC_INT_ALREADY_MARKED,
	XM_CNT_TC_INT_IP_OPTIONS,
	XM_CNT_TC_INT_ERROR,
	XM_CNT_TC_HTB_CLASSIFIED,
	XM_CNT_TC_HTB_DEFAULT,
	XM_CNT_TC_EDT_PACED,
	XM_CNT_TC_RTT_PROBE,
	XM_CNT_WIRE_PACKETS,
	XM_CNT_WIRE_RTT_STAMP,
	XM_CNT_XDP_PACKETS,
	XM_CNT_XDP_NOT_IPV4,
	XM_CNT_XDP_MALFORMED,
	XM_CNT_XDP_NOT_ROCE,
	XM_CNT_XDP_DATA,
	XM_CNT_XDP_OTHER_OPCODE,
	XM_CNT_XDP_ACK,
	XM_CNT_XDP_NAK,
	XM_CNT_XDP_CNP,
	XM_CNT_XDP_UNKNOWN_FLOW,
	XM_CNT_XDP_NO_CONFIG,
	XM_CNT_XDP_CC_TABLE_FULL,
	XM_CNT_XDP_LAW_NONE,
	XM_CNT_XDP_ACK_NO_INT,
	XM_CNT_XDP_INT_BAD_HEADER,
	XM_CNT_XDP_INT_BAD_LENGTH,
	XM_CNT_XDP_INT_TOO_MANY_HOPS,
	XM_CNT_XDP_TITA_FIRST_RECORD,
	XM_CNT_XDP_TITA_PATH_CHANGE,
	XM_CNT_XDP_TITA_UPDATE,
	XM_CNT_XDP_TITA_REF_UPDATE,
	XM_CNT_XDP_CNP_IGNORED,
	XM_CNT_XDP_DCQCN_CUT,
	XM_CNT_XDP_DCQCN_CUT_HELD,
	XM_CNT_XDP_DCQCN_INCREASE,
	XM_CNT_XDP_RTT_SAMPLE,
	XM_CNT_XDP_TIMELY_FIRST_RTT,
	XM_CNT_XDP_TIMELY_INCREASE,
	XM_CNT_XDP_TIMELY_DECREASE,
	XM_CNT_XDP_SWIFT_INCREASE,
	XM_CNT_XDP_SWIFT_DECREASE,
	XM_CNT_XDP_SWIFT_DECREASE_HELD,
	XM_CNT_XDP_PFC_PAUSE,
	XM_CNT_XDP_PFC_RESUME,
	XM_CNT_XDP_PFC_MALFORMED,
	XM_CNT_SOCKOPS_ESTABLISHED,
	XM_CNT_SOCKOPS_RATE_SET,
	XM_CNT_SOCKOPS_SETSOCKOPT_ERROR,
	XM_CNT_EVENT_LOST, /* xm_events was full: the agent re-reads the rate map */
	XM_CNT_MAX
};

/* A flow: IPv4 5-tuple as on the wire. For feedback packets XDP builds the key of the data
 * flow they answer (docs/wire-format.md): (daddr, saddr, sport, 4791, UDP). */
struct xm_flow_key {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* TiTa (HPCC-like) parameters. */
struct xm_tita_params {
	__u64 wai_bps;       /* additive increase W_AI, as a rate */
	__u32 eta;           /* target utilisation, XM_UNIT scale */
	__u32 max_stage;     /* additive-increase stages before a multiplicative step */
	__u32 base_rtt_ns;   /* T: EWMA horizon and the queue term's B*T */
	__u32 pad;
};

/* DCQCN reaction point parameters. */
struct xm_dcqcn_params {
	__u64 rai_bps;             /* additive increase step */
	__u64 rhai_bps;            /* hyper increase step */
	__u64 byte_counter;        /* bytes sent per byte-counter increase event */
	__u32 g;                   /* alpha gain, XM_UNIT scale */
	__u32 alpha_timer_ns;      /* K: alpha decays once per K without CNP */
	__u32 rate_timer_ns;       /* T: timer increase event period */
	__u32 cut_interval_ns;     /* at most one cut per interval */
	__u32 fast_recovery_steps; /* F */
	__u32 clamp_target;        /* XM_DCQCN_CLAMP_*: when a cut sets R_T to the current rate */
};

/* When a DCQCN cut sets the target rate R_T to the current rate (ConnectX firmware's
 * clamp_tgt_rate and clamp_tgt_rate_after_time_inc): on every cut (the paper's), or only
 * when the timer has raised the rate since the previous cut (as HPCC's ns-3 simulator has
 * it with EcnClampTgtRate 0: rpTimeStage != 0); else R_T stays. */
#define XM_DCQCN_CLAMP_ALWAYS 1
#define XM_DCQCN_CLAMP_AFTER_TIMER 2

/* TIMELY parameters (the gradient is normalised by min_rtt_ns). */
struct xm_timely_params {
	__u64 delta_bps;   /* additive increase step */
	__u32 alpha;       /* EWMA weight of a new RTT difference, XM_UNIT scale */
	__u32 beta;        /* multiplicative decrease factor, XM_UNIT scale */
	__u32 t_low_ns;
	__u32 t_high_ns;
	__u32 min_rtt_ns;
	__u32 hai_steps;   /* gradient <= 0 this many times in a row: hai_steps x delta */
};

/* Swift parameters: target = base_target_ns + hops * per_hop_ns. */
struct xm_swift_params {
	__u64 ai_bytes;       /* window increase per RTT below the target (ai / RTT as a rate) */
	__u32 beta;           /* XM_UNIT scale */
	__u32 max_mdf;        /* largest decrease in one step, XM_UNIT scale */
	__u32 base_target_ns;
	__u32 per_hop_ns;
	__u32 sender_ttl;     /* TTL the feedback leaves its sender with: hops = sender_ttl - TTL */
	__u32 pad;
};

/* Rate law selection and parameters (per host in xm_config, per flow in xm_ctl). */
struct xm_cc_params {
	__u64 min_rate_bps;
	__u32 law; /* enum xm_law */
	__u32 pad;
	struct xm_tita_params tita;
	struct xm_dcqcn_params dcqcn;
	struct xm_tita_params hpcc; /* HPCC's own eta, W_AI, maxStage and T */
	struct xm_timely_params timely;
	struct xm_swift_params swift;
};

/* Host configuration: xm_config[0], written by the agent at load time and on changes. */
struct xm_host_config {
	__u64 line_rate_bps;
	__u64 netns_cookie;    /* sock_ops acts only on sockets of this network namespace */
	__u32 pacing_mode;     /* enum xm_pacing_mode */
	__u32 default_classid; /* HTB class of flows without their own class (major:minor) */
	__u32 int_enabled;
	__u32 int_dscp;
	__u32 int_bitmap;      /* instruction bitmap, bit 0 = MSB of the 16-bit field */
	__u32 int_hop_budget;  /* RemainingHopCnt written by the source */
	__u32 int_max_frame;   /* largest frame after INT insertion (MTU + Ethernet header) */
	__u32 pad;
	struct xm_cc_params cc;
};

/* Per-flow control set by the agent for the controller: xm_ctl. */
#define XM_CTL_HAS_CAP 1
#define XM_CTL_HAS_PARAMS 2
struct xm_flow_ctl {
	__u64 cap_bps;
	__u32 flags;  /* XM_CTL_* */
	__u32 weight; /* scales the additive increase of both laws; HTB share weight; 1 = neutral */
	struct xm_cc_params params;
};

/* The rate map value: the pacing rate of a flow. Writers: XDP (rate laws) and the agent. */
struct xm_rate {
	__u64 rate_bps;
	__u64 stamp_ns; /* bpf_ktime_get_ns() of the last write */
	__u32 origin;   /* enum xm_rate_origin */
	__u32 pad;
};

/*
 * What the datapath tells the agent, through the ring buffer xm_events (the agent blocks on
 * it instead of scanning the rate map): XDP wrote a flow's rate, or tc saw a new flow.
 */
enum xm_event_kind {
	XM_EV_RATE = 0, /* rate: the value XDP wrote to xm_rates */
	XM_EV_FLOW = 1, /* tc made the flow's xm_flows entry; rate is zero */
};

struct xm_event {
	struct xm_flow_key key;
	struct xm_rate rate;
	__u32 kind; /* enum xm_event_kind */
	__u32 pad;
};

/* Per-flow transmit statistics, written by tc only: xm_flows (LRU). */
#define XM_FLOW_PSN_VALID 1
struct xm_flow_stats {
	__u64 tx_bytes;
	__u64 tx_packets;
	__u64 int_packets;
	__u64 first_ns;
	__u64 last_ns;
	__u64 edt_next_ns; /* EDT mode: departure time of the next packet */
	__u32 snd_nxt_psn; /* next PSN after the newest data packet sent (24 bits) */
	__u32 flags;       /* XM_FLOW_* */
	__u32 ifindex;     /* interface the flow leaves on (the agent puts its class there) */
	/* RTT probe (TIMELY, Swift): one data packet per RTT. tc starts a new probe when XDP
	 * has taken the last one (xm_cc_state.rtt_done_seq == rtt_probe_seq) */
	__u32 rtt_probe_seq;
	__u64 rtt_probe_ns; /* its departure: the EDT timestamp, or tc's time with HTB until the
			     * wire's far end stamps it (tc_wire.c) */
	__u32 rtt_probe_psn;
	__u32 rtt_probe_wire_seq; /* the probe whose departure the wire stamped */
};

/* One hop's INT record as remembered between feedback packets. */
struct xm_hop_rec {
	__u64 egress_ts_ns; /* XM_NO_TS when the hop did not report it */
	__u32 node_id;
	__u32 qlen;         /* queue occupancy in bytes (0 when not reported) */
	__u32 tx_util_ppm;  /* XM_ALL_ONES32 when not reported */
	__u32 pad;
};
#define XM_NO_TS 0xffffffffffffffffULL

/* A PFC priority's pause as the switch asked it, written by XDP: xm_pfc[priority]. The time
 * held so far is paused_ns plus, while active, min(now, pause_until_ns) - since_ns. */
struct xm_pfc_state {
	__u64 pause_until_ns; /* the NIC holds the priority until then (CLOCK_MONOTONIC) */
	__u64 since_ns;       /* start of the pause in force (when active) */
	__u64 paused_ns;      /* closed pause intervals */
	__u64 pauses;         /* frames with a non-zero time for this priority */
	__u64 resumes;        /* frames with time 0 (XON) */
	__u32 active;
	__u32 pad;
};

/* Per-flow congestion-control state, written by XDP only: xm_cc. */
#define XM_CC_HAVE_RECORDS 1
#define XM_CC_PSN_VALID 2
#define XM_CC_CUT_SEEN 4
#define XM_CC_TIMER_INC 8 /* DCQCN: a timer increase event since the last cut */
struct xm_cc_state {
	__u64 rate_bps;       /* current rate of the law (before the pacer) */
	__u64 ref_rate_bps;   /* TiTa: R_ref (committed once per RTT); DCQCN: target rate R_T */
	__u64 last_fb_ns;     /* local time of the last feedback packet handled */
	__u64 feedback;       /* feedback packets handled */
	__u64 updates;        /* rate computations */
	__u64 prev_tx_bytes;  /* flow tx bytes at the previous feedback */
	/* TiTa, HPCC */
	__u32 util;           /* committed EWMA utilisation U, XM_UNIT scale */
	__u32 inc_stage;      /* TiTa, HPCC: additive stages; TIMELY: gradient <= 0 in a row */
	__u32 last_update_psn;
	__u32 nhops;
	/* DCQCN */
	__u32 alpha;          /* XM_UNIT scale */
	__u32 timer_count;    /* T */
	__u32 byte_count;     /* BC */
	__u32 law;            /* law this state was initialised for */
	__u64 alpha_ts_ns;    /* start of the current alpha-decay period */
	__u64 timer_ts_ns;    /* start of the current rate-increase timer period */
	__u64 bc_base_bytes;  /* tx bytes at the start of the current byte-counter period */
	__u64 last_cut_ns;    /* DCQCN: last cut; Swift: last decrease */
	__u32 flags;          /* XM_CC_* */
	/* TIMELY, Swift */
	__u32 rtt_done_seq;   /* the tc probe whose RTT sample has been taken */
	__u64 rtt_ns;         /* last RTT sample (TIMELY's prev_rtt) */
	__s64 rtt_diff_ns;    /* TIMELY: EWMA of the RTT difference */
	struct xm_hop_rec hops[XM_MAX_HOPS];
};

/* XDP's per-CPU working memory while it walks an INT stack: the current hop's words (a hop
 * is at most 31 words; words 32 on stay all-ones and stand for fields not requested). */
#define XM_HOP_ABSENT 32
#define XM_HOP_BUF_WORDS 65
struct xm_hop_scratch {
	__u64 u_max;
	__u64 tau;
	__u32 comparable;
	__u32 pad;
	__u32 w[XM_HOP_BUF_WORDS];
	__u32 pad2;
};

/* Speed of one hop's egress port; port XM_ALL_ONES32 is the node's default. */
struct xm_hop_key {
	__u32 node_id;
	__u32 port;
};

#endif /* XINGMAI_H */
