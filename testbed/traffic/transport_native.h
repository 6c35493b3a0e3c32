/* The native transport core's structs and functions: the C (transport_native.c) includes
 * this file, and transport_native.py gives it to cffi, so each layout is declared once. No
 * #include or macro here (cffi parses it): the constants are #defines transport_native.py
 * prepends, from controller/wire. */
struct xm_tp_cfg {
	uint32_t mtu, window, ack_every, psn_window;
	int32_t int_dscp; /* -1: no INT */
	uint8_t tos, ttl;
	uint8_t sink; /* the NIC is an INT sink (controller/nic/int_sink.py) */
	uint64_t max_message;
	double rto, rto_max, cnp_interval;
	/* the sink's SinkConfig */
	double sink_sample_s, sink_event_gap_s;
	uint64_t sink_queue_bytes, sink_latency_ns;
	uint32_t sink_max_flows;
};

/* QpCounters, field for field */
struct xm_tp_counters {
	int64_t tx_packets, tx_bytes, retransmits, timeouts, naks_received, acks_received,
		cnps_received, rx_data_packets, rx_kept, rx_bytes, acks_sent, naks_sent, reordered,
		gaps_lost, cnps_sent, ecn_ce_seen, int_seen, int_echoes_sent, tx_blocked, tx_nobufs,
		tx_errors, messages_sent, messages_received;
};

struct xm_tp_op {
	const uint8_t *data;
	uint64_t len, size;
	int64_t first_seq, npkts;
};

struct xm_tp_qp {
	struct xm_tp_counters c;
	uint32_t index, qpn, remote_qpn, sq_psn;
	uint16_t sport, ident;
	uint8_t local_addr[4], peer_addr[4];
	/* requester: unbounded sequence numbers, PSN = (sq_psn + seq) mod 2^24 */
	struct xm_tp_op *ops; /* a ring of the posted, not fully acknowledged */
	uint32_t ops_head, ops_len, ops_cap, cur;
	int64_t una, nxt, high, tail;
	double rto, last_progress;
	uint8_t active;
	uint8_t woken; /* in tp->woken */
	/* responder */
	uint32_t epsn, msn, unacked;
	uint8_t in_msg, rx_overflow, nak_sent, has_gap, has_discarded;
	uint16_t gap_ident;
	uint32_t discarded_hi;
	/* with a sink: the packet that showed the gap, for the loss report */
	uint8_t *gap_pkt;
	uint32_t gap_len, gap_int_off;
	double gap_t;
	double rx_t_first, last_cnp;
	uint8_t *rx_buf;
	uint64_t rx_len, rx_cap;
	/* the message's bytes so far, stored or not; how many of each message to store
	 * (QueuePair.store_bytes; UINT64_MAX: all) */
	uint64_t rx_size, store;
	int32_t dl_pos; /* its place in xm_tp's deadline heap (-1: nothing in flight) */
	uint8_t *pending_int; /* the INT stack the next ACK echoes (malloc'd as it grows) */
	uint32_t pending_int_len, pending_int_cap;
};

/* what the Python side takes after each call: completions, messages, feedback */
struct xm_tp_done {
	uint32_t qp;
	double t;
};
struct xm_tp_msg {
	uint32_t qp;
	uint8_t *data; /* malloc'd; xm_tp_taken frees it (Python copies it first) */
	uint64_t len, size; /* stored, and the message's */
	double t_first, t_done;
};
/* the INT sink's reports to make (Python's IntSink encodes them), in the reference's order:
 * kind 0 a report the sink's C decided (`why`: SINK_WHY_*, `congested` its Q flag, `pkt` the
 * packet as the report carries it), 1 loss (a gap's packet, its loss now known: IntSink.loss) */
struct xm_tp_sink_ev {
	uint32_t kind, len, int_off, why;
	uint8_t congested;
	uint8_t *pkt; /* malloc'd; xm_tp_taken frees it */
	double t;
};
struct xm_tp_fb {
	uint32_t qp, len;
	uint8_t pkt[FB_MAX];
};

struct xm_tp {
	struct xm_tp_cfg cfg;
	int64_t drops[DROPS_N];
	int64_t drops_total, rx_packets, probes_ignored;
	struct xm_tp_qp **qps;
	uint32_t nqps, cap_qps;
	/* the queue pairs with packets in flight, a binary heap by their retransmission
	 * deadline (last_progress + rto): the earliest at the top, found without looking at
	 * each of a thousand queue pairs after every packet */
	uint32_t *dl_heap;
	uint32_t dl_n, dl_cap;
	/* the queue pairs made active since the twin's host last took them (track_woken set:
	 * the host keeps its senders in a heap and adds these), each once; woken_lost: one could
	 * not be recorded (out of memory), so the host looks at all */
	uint32_t *woken;
	uint32_t nwoken, cap_woken;
	uint8_t track_woken, woken_lost;
	/* qpn -> index + 1, open addressing */
	uint32_t *map_key, *map_val, map_cap;
	struct xm_tp_done *done;
	uint32_t ndone, cap_done;
	struct xm_tp_msg *msgs;
	uint32_t nmsgs, cap_msgs;
	struct xm_tp_fb *fb;
	uint32_t nfb, cap_fb;
	struct xm_tp_sink_ev *sink_ev;
	uint32_t nsink, cap_sink;
	/* the sink's flows (IntSink.flows), and what IntSink.observe counts */
	void *sink_state;
	int64_t sink_errors[SINK_ERRORS_N]; /* by int_sink.ERRORS */
	int64_t sink_errors_total, sink_flows_evicted;
	uint8_t *rx_bufs; /* xm_tp_recv_batch's datagrams */
	uint8_t out[OUT_MAX]; /* the packet xm_tp_peek built */
	uint8_t frame[14 + OUT_MAX + MAX_INT]; /* the frame xm_tp_send_frame made of it */
};

/* the emulation's loop (Transport.step, step after step: xm_tp_run): its sockets, and the
 * state Transport keeps of them while it runs */
struct xm_tp_io {
	int32_t rx_fd;
	uint32_t cap; /* the arrays' length: at least the queue pairs */
	int32_t *fd; /* each queue pair's sending socket: its data */
	int32_t fb_fd; /* the feedback's (ACK, NAK, CNP): never refused for a queue pair's data */
	uint8_t *blocked; /* its socket buffer full: waiting for writability */
	double *retry_at; /* the qdisc refused its packet: resent after this time (0: none) */
	uint32_t *senders; /* xm_tp_senders' */
	uint32_t send_burst; /* data packets a queue pair sends in a row (SEND_BURST) */
	double nobufs_backoff;
	int64_t feedback_not_sent;
	int64_t send_errors[SEND_ERRNO_N]; /* packets lost on a failed send, by errno */
	int64_t send_errors_total;
	/* PFC: the NIC's pinned xm_pfc map (-1: no hold), where priority 0's fields are in its
	 * value; Transport._paused's state; how often a paused NIC looks again */
	int32_t pfc_fd;
	uint32_t pfc_value_size, pfc_until_off, pfc_active_off;
	double held_until, last_look, held_s, pause_poll_s;
	int64_t holds;
	/* Transport.step's read: frames it reads (RX_BUDGET); how many steps in a row a due
	 * timer may wait while a read meets it (RX_DEFER_STEPS); the steps in a row it met it
	 * and those in which a due timer waited (Transport.full_reads, .timers_deferred) */
	uint32_t rx_budget, rx_defer_steps;
	int64_t full_reads, timers_deferred;
	/* where a step stopped for Python (XM_IO_SINK): its time, whether it was busy, its wait,
	 * whether its read met the budget */
	double step_now, step_max_wait;
	int32_t step_busy, step_full;
};

struct xm_tp *xm_tp_new(const struct xm_tp_cfg *cfg);
void xm_tp_free(struct xm_tp *tp);
int32_t xm_tp_create_qp(struct xm_tp *tp, uint32_t qpn, uint32_t remote_qpn, uint16_t sport,
			const uint8_t *local_addr, const uint8_t *peer_addr, uint32_t sq_psn,
			uint32_t rq_psn);
struct xm_tp_qp *xm_tp_qp(struct xm_tp *tp, uint32_t index);
int xm_tp_post(struct xm_tp *tp, uint32_t index, const uint8_t *data, uint64_t len,
	       uint64_t size);
int xm_tp_wants_to_send(struct xm_tp *tp, uint32_t index);
uint32_t xm_tp_peek(struct xm_tp *tp, uint32_t index);
void xm_tp_commit(struct xm_tp *tp, uint32_t index, double now);
int xm_tp_next_deadline(struct xm_tp *tp, double *at);
void xm_tp_restart_timer(struct xm_tp *tp, uint32_t index, double now);
void xm_tp_expire(struct xm_tp *tp, double now);
uint32_t xm_tp_senders(struct xm_tp *tp, uint32_t *out);
int xm_tp_receive(struct xm_tp *tp, const uint8_t *pkt, uint32_t n, double now);
uint32_t xm_tp_send_frame(struct xm_tp *tp, uint32_t index, double now, const uint8_t *eth,
			  uint32_t (*tc)(void *nic, uint8_t *buf, uint32_t len, uint32_t room,
					 uint64_t now_ns),
			  void *nic, uint64_t now_ns, uint32_t growth, uint32_t *ip_len);
void xm_tp_ipv4_checksum(uint8_t *ip);
int32_t xm_tp_recv_batch(struct xm_tp *tp, int fd, uint32_t budget, double now);
int xm_tp_send_burst(struct xm_tp *tp, uint32_t index, int fd, uint32_t max, double now,
		     uint32_t *sent);
void xm_tp_taken(struct xm_tp *tp);
int64_t xm_tp_run(struct xm_tp *tp, struct xm_tp_io *io, double until);
