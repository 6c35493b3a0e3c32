/* The twin's host with its per-packet loop in C: the structs and functions. The C
 * (host_native.c) includes this file, and host_native.py gives it to cffi, so each layout is
 * declared once. No #include or macro here (cffi parses it); the transport core's header
 * (testbed/traffic/transport_native.h) comes before it. */

/* what a call hands back to Python: 0 nothing, XM_HOST_WHOLE (the frame is Python's: its
 * receive runs on it), else these bits (the C did the rest of the event), or < 0 an error */
enum {
	XM_HOST_WHOLE = 1,
	XM_HOST_CAPTURE = 2, /* record the INT frame (probes.record_int_frame) */
	XM_HOST_RATE = 4, /* the law changed a flow's rate (rate_flow, rate_new): record it */
	XM_HOST_TAKE = 8, /* the core queued completions, messages, the sink's packets or drops:
			   * take them */
	XM_HOST_ACTIVITY = 16, /* the job looks (SimHost._activity): the C did not */
	XM_HOST_REPORT = 32, /* the NIC's turn to send a Telemetry Report (the kick's first
			      * step): Python sends it and kicks again */
	XM_HOST_NO_MEMORY = -1,
	XM_HOST_NOTHING_SENT = -2, /* a queue pair the core named a sender had no packet */
};

/* a flow the pacer knows (SimHost.flows' FlowTx), by its key (local, peer, UDP source port;
 * addresses as on the wire) */
struct xm_host_flow {
	uint8_t saddr[4], daddr[4];
	uint16_t sport;
	int64_t next_ns, rate_bps, gap_bps;
};

/* an entry of the senders' heap: a queue pair (its index), its key and its qpn (the tie) */
struct xm_host_sender {
	int64_t key;
	uint32_t qpn, index;
};

struct xm_host {
	/* the event loop's (testbed/switch/native/hop.py), as addresses: the C is built apart */
	void *loop;
	int64_t index; /* the loop's number for this host */
	int64_t wire; /* the loop's wire from the NIC to its switch */
	int (*push)(void *loop, int64_t t, int64_t kind, int64_t host, int64_t a);
	int (*wire_send)(void *loop, int64_t wire, const uint8_t *data, int64_t len, int64_t t);
	/* the NIC's programs (testbed/sim/nic_native.c) */
	void *nic;
	uint32_t (*tc)(void *nic, uint8_t *buf, uint32_t len, uint32_t room, uint64_t now_ns);
	int (*xdp)(void *nic, const uint8_t *frame, uint32_t len, uint64_t now_ns,
		   uint64_t *rate);
	uint32_t growth; /* the room tc needs past a frame */
	/* the job's transport core (testbed/traffic/transport_native.c); NULL: the job is over
	 * (SimHost.core None) */
	struct xm_tp *tp;
	int (*tp_wants_to_send)(struct xm_tp *tp, uint32_t index);
	uint32_t (*tp_send_frame)(struct xm_tp *tp, uint32_t index, double now, const uint8_t *eth,
				  uint32_t (*tc)(void *nic, uint8_t *buf, uint32_t len,
						 uint32_t room, uint64_t now_ns),
				  void *nic, uint64_t now_ns, uint32_t growth, uint32_t *ip_len);
	int (*tp_receive)(struct xm_tp *tp, const uint8_t *pkt, uint32_t n, double now);
	int (*tp_next_deadline)(struct xm_tp *tp, double *at);
	void (*tp_expire)(struct xm_tp *tp, double now);
	void (*tp_ipv4_checksum)(uint8_t *ip);
	/* SimHost's */
	uint8_t addr[4], eth[14];
	double ns_per_byte;
	int64_t line_rate_bps;
	int32_t int_dscp;
	uint8_t active; /* the job's per-packet loop is this C's (until the next job's start) */
	uint8_t done; /* the job's part is done */
	uint8_t law; /* a rate law runs (not Law.NONE) */
	uint8_t capture; /* INT frames are recorded (SimHost.capture) */
	uint8_t rate_events; /* rate changes are recorded (SimHost.rate_events) */
	uint8_t rate_polls; /* the job is polled after a rate change (Job.reads_nic_rates) */
	double job_wake; /* the job's next_wake, as of its last poll */
	uint32_t reports; /* Telemetry Reports the sink made, waiting (Python's core.reports) */
	int64_t busy_until, kick_at, timer_at; /* kick_at, timer_at: -1 for none */
	int64_t tx_bytes, rx_dropped, tx_too_big;
	/* the pacer's flows, in the order they were made, found by key through `map` (open
	 * addressing, map_cap a power of 2, each slot a flow's index + 1 or 0) */
	struct xm_host_flow *flows;
	uint32_t nflows, cap_flows;
	uint32_t *map;
	uint32_t map_cap;
	int32_t *qp_flow; /* queue pair index -> its flow's index + 1 (0: not looked up) */
	uint32_t cap_qp_flow;
	/* the queue pairs that can send, a binary heap by (their flow's next departure, qpn):
	 * a key is the flow's or below it (departures only move it later; a key is checked at
	 * the top), so the top checked is the kick's pick (SimHost._kick's, which looks at every
	 * sender). Filled from the core's woken queue pairs (tp->woken) */
	struct xm_host_sender *sq;
	uint32_t sq_n, cap_sq;
	int32_t *sq_pos; /* queue pair index -> its place in the heap, -1 none */
	uint32_t cap_sq_pos;
	struct xm_tp *sq_tp; /* the core the heap is of (NULL: none yet) */
	/* the core's feedback waiting for the NIC, oldest first (a ring) */
	struct xm_tp_fb *fb;
	uint32_t fb_head, fb_len, fb_cap;
	/* XM_HOST_RATE: the flow whose rate the law changed, and the rate */
	int64_t rate_flow, rate_new;
	uint8_t frame[14 + FB_MAX + MAX_INT]; /* a feedback frame on its way through tc */
};

struct xm_host *xm_host_new(void);
void xm_host_free(struct xm_host *h);
void xm_host_reset(struct xm_host *h);
int64_t xm_host_flow(struct xm_host *h, const uint8_t *saddr, const uint8_t *daddr,
		     uint16_t sport, int create);
int64_t xm_host_activity(struct xm_host *h, int64_t now);
int64_t xm_host_request_kick(struct xm_host *h, int64_t t);
int64_t xm_host_event(struct xm_host *h, int64_t kind, int64_t a, int64_t now);
int64_t xm_host_rx(struct xm_host *h, const uint8_t *frame, int64_t len, int64_t now);
