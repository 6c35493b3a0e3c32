/* The twin's host (testbed/sim/nic.py SimHost) with its per-packet loop in C: the NIC's kick
 * (feedback first, then the paced queue pair whose next departure is earliest), the frames that
 * arrive (the checks, XDP's rate law, the transport core), the retransmission timer, and what
 * the host does after each of them, in the reference's order, step for step. The job stays
 * Python: an event after which the job must look (a completion, a message, a rate changed,
 * its wake-up time come) hands back to Python, as does whatever this file does not do (a MAC
 * Control frame, recording INT frames, the drops' names). host_native.py says when a host
 * runs here; tests/test_native_twin.py holds the records equal to the reference's.
 *
 * Built apart from the loop, the NIC and the transport core: it calls them through the
 * addresses it is given. The transport core's header comes first (host_native.py puts it
 * there with the wire constants). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport_native.h"
#include "host_native.h"

#define KICK 0 /* the loop's host events (hop.py's XM_EV_HOST_KICK + kind) */
#define TIMER 1

struct xm_host *xm_host_new(void)
{
	struct xm_host *h = calloc(1, sizeof(*h));
	if (h) {
		h->kick_at = -1;
		h->timer_at = -1;
		h->rate_flow = -1;
	}
	return h;
}

void xm_host_free(struct xm_host *h)
{
	if (!h)
		return;
	free(h->flows);
	free(h->map);
	free(h->qp_flow);
	free(h->sq);
	free(h->sq_pos);
	free(h->fb);
	free(h);
}

/* a new job: no flow, no feedback (SimHost.start_job's flows.clear()) */
void xm_host_reset(struct xm_host *h)
{
	h->nflows = 0;
	if (h->map)
		memset(h->map, 0, (size_t)h->map_cap * sizeof(*h->map));
	if (h->qp_flow)
		memset(h->qp_flow, 0, (size_t)h->cap_qp_flow * sizeof(*h->qp_flow));
	h->fb_head = h->fb_len = 0;
	h->rate_flow = -1;
	/* the senders' heap is the last core's: made again at the next kick */
	if (h->sq_pos)
		memset(h->sq_pos, 0xff, (size_t)h->cap_sq_pos * sizeof(*h->sq_pos));
	h->sq_n = 0;
	h->sq_tp = NULL;
}

static int grow(void **p, uint32_t *cap, uint32_t need, size_t size)
{
	if (need <= *cap)
		return 0;
	uint32_t c = *cap ? *cap : 8;
	while (c < need)
		c *= 2;
	void *q = realloc(*p, (size_t)c * size);
	if (!q)
		return -1;
	memset((uint8_t *)q + (size_t)*cap * size, 0, (size_t)(c - *cap) * size);
	*p = q;
	*cap = c;
	return 0;
}

static uint32_t flow_hash(const uint8_t *saddr, const uint8_t *daddr, uint16_t sport)
{
	uint32_t x = 2166136261u;
	for (int i = 0; i < 4; i++)
		x = (x ^ saddr[i]) * 16777619u;
	for (int i = 0; i < 4; i++)
		x = (x ^ daddr[i]) * 16777619u;
	x = (x ^ (sport & 0xFF)) * 16777619u;
	return (x ^ (uint32_t)(sport >> 8)) * 16777619u;
}

static int same(const struct xm_host_flow *f, const uint8_t *saddr, const uint8_t *daddr,
		uint16_t sport)
{
	return f->sport == sport && !memcmp(f->saddr, saddr, 4) && !memcmp(f->daddr, daddr, 4);
}

static int map_rebuild(struct xm_host *h, uint32_t cap)
{
	uint32_t *m = calloc(cap, sizeof(*m));
	if (!m)
		return -1;
	for (uint32_t i = 0; i < h->nflows; i++) {
		const struct xm_host_flow *f = &h->flows[i];
		uint32_t j = flow_hash(f->saddr, f->daddr, f->sport) & (cap - 1);
		while (m[j])
			j = (j + 1) & (cap - 1);
		m[j] = i + 1;
	}
	free(h->map);
	h->map = m;
	h->map_cap = cap;
	return 0;
}

/* SimHost._flow: the flow's index (made, at rate 0 and next departure 0, with `create`), -1
 * when there is none (or no memory for it) */
int64_t xm_host_flow(struct xm_host *h, const uint8_t *saddr, const uint8_t *daddr,
		     uint16_t sport, int create)
{
	if (h->map_cap) {
		uint32_t j = flow_hash(saddr, daddr, sport) & (h->map_cap - 1);
		while (h->map[j]) {
			if (same(&h->flows[h->map[j] - 1], saddr, daddr, sport))
				return h->map[j] - 1;
			j = (j + 1) & (h->map_cap - 1);
		}
	}
	if (!create)
		return -1;
	if (2 * (h->nflows + 1) > h->map_cap &&
	    map_rebuild(h, h->map_cap ? 2 * h->map_cap : 16))
		return -1;
	if (grow((void **)&h->flows, &h->cap_flows, h->nflows + 1, sizeof(*h->flows)))
		return -1;
	struct xm_host_flow *f = &h->flows[h->nflows];
	memset(f, 0, sizeof(*f));
	memcpy(f->saddr, saddr, 4);
	memcpy(f->daddr, daddr, 4);
	f->sport = sport;
	uint32_t j = flow_hash(saddr, daddr, sport) & (h->map_cap - 1);
	while (h->map[j])
		j = (j + 1) & (h->map_cap - 1);
	h->map[j] = ++h->nflows;
	return h->nflows - 1;
}

/* SimHost._request_kick */
static int request_kick(struct xm_host *h, int64_t t)
{
	if (t < h->busy_until)
		t = h->busy_until;
	if (h->kick_at >= 0 && h->kick_at <= t)
		return 0;
	h->kick_at = t;
	return h->push(h->loop, t, KICK, h->index, t);
}

int64_t xm_host_request_kick(struct xm_host *h, int64_t t)
{
	return request_kick(h, t) ? XM_HOST_NO_MEMORY : 0;
}

/* SimHost._arm: a timer at `wake` (s), unless an earlier one is set */
static int arm(struct xm_host *h, int have, double wake, int64_t now)
{
	if (!have || isinf(wake))
		return 0;
	/* 1 ns past the deadline: the core and the job compare in float seconds */
	int64_t t = (int64_t)(wake * 1e9) + 1;
	if (t < now + 1)
		t = now + 1;
	if (h->timer_at >= 0 && t >= h->timer_at)
		return 0;
	h->timer_at = t;
	return h->push(h->loop, t, TIMER, h->index, t);
}

/* SimHost._activity after the job's poll: the NIC kicked, the timer armed for the earlier of
 * the core's deadline and the job's wake-up */
int64_t xm_host_activity(struct xm_host *h, int64_t now)
{
	if (!h->tp)
		return 0; /* the job is over */
	if (request_kick(h, now))
		return XM_HOST_NO_MEMORY;
	double wake = 0;
	int have = h->tp_next_deadline(h->tp, &wake);
	if (!h->done && h->job_wake < (have ? wake : INFINITY)) {
		wake = h->job_wake;
		have = 1;
	}
	return arm(h, have, wake, now) ? XM_HOST_NO_MEMORY : 0;
}

/* the job must look now: its wake-up time has come */
static int job_due(const struct xm_host *h, int64_t now)
{
	return !h->done && (double)now / 1e9 >= h->job_wake;
}

/* SimHost._depart: the data packet's flow paced (paced_len: its bytes before INT), the port
 * busy while the frame serializes, the link */
static int depart(struct xm_host *h, const uint8_t *frame, uint32_t len, uint32_t paced_len,
		  int64_t now, struct xm_host_flow *f)
{
	if (f) {
		int64_t rate = f->rate_bps ? f->rate_bps : h->line_rate_bps;
		int64_t from = f->next_ns > now ? f->next_ns : now;
		f->next_ns = from + (int64_t)((double)paced_len * 8e9 / (double)rate);
		f->gap_bps = rate;
	}
	h->busy_until = now + (int64_t)((double)paced_len * h->ns_per_byte);
	h->tx_bytes += len;
	int rc = h->wire_send(h->loop, h->wire, frame, len, now);
	if (rc < 0)
		return -1;
	if (!rc)
		h->tx_too_big++; /* over the link's MTU: lost, as the kernel would refuse it */
	return 0;
}

/* the index of queue pair `index`'s flow (SimHost._qp_flows), looked up once; -1 out of
 * memory. An index, not a pointer: a new flow may move `flows` */
static int64_t qp_flow(struct xm_host *h, uint32_t index)
{
	if (grow((void **)&h->qp_flow, &h->cap_qp_flow, index + 1, sizeof(*h->qp_flow)))
		return -1;
	if (!h->qp_flow[index]) {
		const struct xm_tp_qp *qp = h->tp->qps[index];
		int64_t i = xm_host_flow(h, h->addr, qp->peer_addr, qp->sport, 1);
		if (i < 0)
			return -1;
		h->qp_flow[index] = (int32_t)i + 1;
	}
	return h->qp_flow[index] - 1;
}

/* SimHost._transmit of a feedback packet: the IPv4 checksum, tc egress, the wire (not paced:
 * the default class) */
static int send_feedback(struct xm_host *h, const struct xm_tp_fb *out, int64_t now)
{
	uint8_t *frame = h->frame;
	memcpy(frame, h->eth, 14);
	memcpy(frame + 14, out->pkt, out->len);
	h->tp_ipv4_checksum(frame + 14);
	struct xm_host_flow *f = NULL;
	if (frame[14 + 28] <= OP_RC_DATA_MAX) { /* a data packet: its flow is paced */
		const uint8_t *ip = frame + 14;
		int64_t i = xm_host_flow(h, ip + 12, ip + 16, (uint16_t)(ip[20] << 8 | ip[21]), 1);
		if (i < 0)
			return -1;
		f = &h->flows[i];
	}
	uint32_t n = h->tc(h->nic, frame, 14 + out->len, 14 + out->len + h->growth, (uint64_t)now);
	return depart(h, frame, n, 14 + out->len, now, f);
}

/* ---- the senders' heap, by (key, qpn) ---- */

static int sq_before(const struct xm_host *h, uint32_t a, uint32_t b)
{
	const struct xm_host_sender *x = &h->sq[a], *y = &h->sq[b];
	return x->key != y->key ? x->key < y->key : x->qpn < y->qpn;
}

static void sq_swap(struct xm_host *h, uint32_t a, uint32_t b)
{
	struct xm_host_sender t = h->sq[a];
	h->sq[a] = h->sq[b];
	h->sq[b] = t;
	h->sq_pos[h->sq[a].index] = (int32_t)a;
	h->sq_pos[h->sq[b].index] = (int32_t)b;
}

/* the entry at `i` moved up or down to its place */
static void sq_fix(struct xm_host *h, uint32_t i)
{
	while (i && sq_before(h, i, (i - 1) / 2)) {
		sq_swap(h, i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
	for (;;) {
		uint32_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < h->sq_n && sq_before(h, l, m))
			m = l;
		if (r < h->sq_n && sq_before(h, r, m))
			m = r;
		if (m == i)
			return;
		sq_swap(h, i, m);
		i = m;
	}
}

static void sq_pop(struct xm_host *h)
{
	h->sq_pos[h->sq[0].index] = -1;
	if (--h->sq_n) {
		h->sq[0] = h->sq[h->sq_n];
		h->sq_pos[h->sq[0].index] = 0;
		sq_fix(h, 0);
	}
}

/* queue pair `index` in the heap with its flow's next departure as its key (its flow looked
 * up now, as SimHost._kick looks up a sender's); -1 out of memory */
static int sq_put(struct xm_host *h, uint32_t index)
{
	int64_t fi = qp_flow(h, index);
	if (fi < 0)
		return -1;
	int64_t key = h->flows[fi].next_ns;
	int32_t at = h->sq_pos[index];
	if (at >= 0) {
		h->sq[at].key = key;
		sq_fix(h, (uint32_t)at);
		return 0;
	}
	if (grow((void **)&h->sq, &h->cap_sq, h->sq_n + 1, sizeof(*h->sq)))
		return -1;
	h->sq[h->sq_n] = (struct xm_host_sender){ key, h->sq_tp->qps[index]->qpn, index };
	h->sq_pos[index] = (int32_t)h->sq_n;
	sq_fix(h, h->sq_n++);
	return 0;
}

static int by_index(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

/* the queue pairs the core made active since the last kick that looked, into the heap if
 * they can send, in index order (SimHost._kick looks at the core's senders in that order, and
 * makes their flows as it meets them). A queue pair can start to send only by what makes it
 * active (a post, an ACK, a NAK, a timeout), so every sender is in the heap after this; a
 * heap of another core (a new job) is made from all its queue pairs. -1 out of memory */
static int sq_take_woken(struct xm_host *h, struct xm_tp *tp)
{
	uint32_t old_cap = h->cap_sq_pos;
	if (grow((void **)&h->sq_pos, &h->cap_sq_pos, tp->nqps, sizeof(*h->sq_pos)))
		return -1;
	if (h->cap_sq_pos > old_cap)
		memset(h->sq_pos + old_cap, 0xff,
		       (size_t)(h->cap_sq_pos - old_cap) * sizeof(*h->sq_pos));
	int all = h->sq_tp != tp || tp->woken_lost;
	if (all) {
		for (uint32_t i = 0; i < h->sq_n; i++)
			h->sq_pos[h->sq[i].index] = -1;
		h->sq_n = 0;
		h->sq_tp = tp;
		tp->track_woken = 1;
		tp->woken_lost = 0;
		for (uint32_t i = 0; i < tp->nwoken; i++)
			tp->qps[tp->woken[i]]->woken = 0;
		tp->nwoken = 0;
		for (uint32_t i = 0; i < tp->nqps; i++)
			if (h->tp_wants_to_send(tp, i) && sq_put(h, i))
				return -1;
		return 0;
	}
	if (tp->nwoken > 1)
		qsort(tp->woken, tp->nwoken, sizeof(*tp->woken), by_index);
	for (uint32_t i = 0; i < tp->nwoken; i++) {
		uint32_t index = tp->woken[i];
		tp->qps[index]->woken = 0;
		if (h->tp_wants_to_send(tp, index) && sq_put(h, index))
			return -1;
	}
	tp->nwoken = 0;
	return 0;
}

/* SimHost._kick */
static int64_t kick(struct xm_host *h, int64_t t, int64_t now)
{
	if (t != h->kick_at)
		return 0;
	h->kick_at = -1;
	if (!h->tp)
		return 0;
	if (now < h->busy_until)
		return request_kick(h, h->busy_until) ? XM_HOST_NO_MEMORY : 0;
	if (h->reports) /* the NIC sink's Telemetry Reports: Python's (the sink is) */
		return XM_HOST_REPORT;
	if (h->fb_len) { /* ACK/NAK/CNP: the default class, not paced per flow */
		const struct xm_tp_fb *out = &h->fb[h->fb_head];
		h->fb_head = (h->fb_head + 1) % h->fb_cap;
		h->fb_len--;
		if (send_feedback(h, out, now))
			return XM_HOST_NO_MEMORY;
		return request_kick(h, h->busy_until) ? XM_HOST_NO_MEMORY : 0;
	}
	struct xm_tp *tp = h->tp;
	if (sq_take_woken(h, tp))
		return XM_HOST_NO_MEMORY;
	/* the sender whose flow departs first (the earlier qpn on a tie): the top, once it still
	 * sends and its key is its flow's (a key below it moves down, its entry looked at again) */
	int64_t best = -1, best_t = 0, best_fi = -1;
	while (h->sq_n) {
		uint32_t index = h->sq[0].index;
		if (!h->tp_wants_to_send(tp, index)) {
			sq_pop(h); /* back when the core makes it active again */
			continue;
		}
		int64_t fi = h->qp_flow[index] - 1;
		if (h->flows[fi].next_ns != h->sq[0].key) {
			h->sq[0].key = h->flows[fi].next_ns;
			sq_fix(h, 0);
			continue;
		}
		best = index;
		best_t = h->sq[0].key;
		best_fi = fi;
		break;
	}
	if (best < 0)
		return 0;
	struct xm_host_flow *best_f = &h->flows[best_fi]; /* after the last lookup */
	if (best_t > now)
		return request_kick(h, best_t) ? XM_HOST_NO_MEMORY : 0;
	uint32_t ip_len = 0;
	uint32_t len = h->tp_send_frame(tp, (uint32_t)best, (double)now / 1e9, h->eth, h->tc, h->nic,
					(uint64_t)now, h->growth, &ip_len);
	if (!len)
		return XM_HOST_NOTHING_SENT;
	if (depart(h, tp->frame, len, 14 + ip_len, now, best_f))
		return XM_HOST_NO_MEMORY;
	/* a packet in flight runs the retransmission timer, even if nothing ever comes back */
	double wake = 0;
	int have = h->tp_next_deadline(tp, &wake);
	if (arm(h, have, wake, now) || request_kick(h, h->busy_until))
		return XM_HOST_NO_MEMORY;
	return 0;
}

/* SimHost._timer */
static int64_t timer(struct xm_host *h, int64_t t, int64_t now)
{
	if (t != h->timer_at)
		return 0; /* superseded by an earlier timer */
	h->timer_at = -1;
	if (!h->tp)
		return 0;
	h->tp_expire(h->tp, (double)now / 1e9);
	if (job_due(h, now))
		return XM_HOST_ACTIVITY;
	return xm_host_activity(h, now);
}

/* the loop's host events: kind KICK or TIMER, `a` the time it was asked for */
int64_t xm_host_event(struct xm_host *h, int64_t kind, int64_t a, int64_t now)
{
	return kind == KICK ? kick(h, a, now) : timer(h, a, now);
}

/* the feedback the core queued, into the ring the kick sends from (the core's queue emptied:
 * Python takes the rest) */
static int keep_feedback(struct xm_host *h)
{
	struct xm_tp *tp = h->tp;
	if (!tp->nfb)
		return 0;
	uint32_t need = h->fb_len + tp->nfb;
	if (need > h->fb_cap) {
		uint32_t cap = h->fb_cap ? h->fb_cap : 8;
		while (cap < need)
			cap *= 2;
		struct xm_tp_fb *ring = malloc((size_t)cap * sizeof(*ring));
		if (!ring)
			return -1;
		for (uint32_t i = 0; i < h->fb_len; i++)
			ring[i] = h->fb[(h->fb_head + i) % h->fb_cap];
		free(h->fb);
		h->fb = ring;
		h->fb_cap = cap;
		h->fb_head = 0;
	}
	for (uint32_t i = 0; i < tp->nfb; i++)
		h->fb[(h->fb_head + h->fb_len++) % h->fb_cap] = tp->fb[i];
	tp->nfb = 0;
	return 0;
}

/* the bytes at off..off+2 of ip as Python's int.from_bytes(ip[off:off + 2]) reads them (fewer
 * past the end) */
static uint32_t be16_clipped(const uint8_t *ip, int64_t n, int64_t off)
{
	if (off + 2 <= n)
		return (uint32_t)ip[off] << 8 | ip[off + 1];
	return off < n ? ip[off] : 0;
}

/* SimHost.receive: a frame from the switch */
int64_t xm_host_rx(struct xm_host *h, const uint8_t *frame, int64_t len, int64_t now)
{
	if (!h->active || (len >= 14 && frame[12] == 0x88 && frame[13] == 0x08))
		return XM_HOST_WHOLE; /* between jobs, and PFC's MAC Control: Python's */
	if (len < 14 + 28 || frame[12] != 0x08 || frame[13] != 0x00 ||
	    memcmp(frame + 30, h->addr, 4)) {
		h->rx_dropped++;
		return 0;
	}
	const uint8_t *ip = frame + 14;
	int64_t n = len - 14, ihl = (ip[0] & 0x0F) * 4;
	if (ip[9] != 17 || be16_clipped(ip, n, ihl + 2) != ROCE_UDP_PORT) {
		h->rx_dropped++;
		return 0;
	}
	int dscp = ip[1] >> 2;
	if (dscp != h->int_dscp && ihl + 8 >= n)
		return XM_HOST_WHOLE; /* no opcode to read: the reference fails there */
	uint8_t opcode = dscp != h->int_dscp ? ip[ihl + 8] : OP_RC_DATA_MAX;
	int64_t code = 0;
	int changed = 0; /* a rate the job reads */
	if ((opcode == OP_ACK || opcode == OP_CNP) && h->law) {
		int64_t i = xm_host_flow(h, ip + 16, ip + 12, (uint16_t)be16_clipped(ip, n, ihl), 1);
		if (i < 0)
			return XM_HOST_NO_MEMORY;
		uint64_t rate = 0;
		if (h->xdp(h->nic, frame, (uint32_t)len, (uint64_t)now, &rate) &&
		    (int64_t)rate != h->flows[i].rate_bps) {
			h->flows[i].rate_bps = (int64_t)rate;
			h->rate_flow = i;
			h->rate_new = (int64_t)rate;
			if (h->rate_events)
				code |= XM_HOST_RATE;
			if (h->rate_polls)
				changed = 1;
		}
	} else if (dscp == h->int_dscp && h->capture) {
		code |= XM_HOST_CAPTURE;
	}
	struct xm_tp *tp = h->tp;
	if (!tp)
		return code; /* the job is over: nothing for its transport */
	int64_t drops = tp->drops_total, errors = tp->sink_errors_total;
	if (h->tp_receive(tp, ip, (uint32_t)n, (double)now / 1e9)) {
		if (keep_feedback(h))
			return XM_HOST_NO_MEMORY;
		if (tp->ndone || tp->nmsgs || tp->nsink || tp->drops_total != drops ||
		    tp->sink_errors_total != errors)
			code |= XM_HOST_TAKE;
		/* the job looks after what it may see: a completion, a message, */
		if (tp->ndone || tp->nmsgs)
			code |= XM_HOST_ACTIVITY;
	}
	/* a rate it reads (a collective's adaptive schedule), its wake-up time */
	if (code & XM_HOST_ACTIVITY || changed || job_due(h, now))
		return code | XM_HOST_ACTIVITY;
	int64_t rc = xm_host_activity(h, now);
	return rc < 0 ? rc : code;
}
