/* The transport core's per-packet work in C: testbed/traffic/transport_core.py is the
 * reference, this is its port, function for function (each C function names the Python method
 * it follows), held equal to it by tests/test_transport_native.py on generated event
 * sequences and by the twin's suite run on both.
 *
 * What it covers: go-back-N (TransportConfig.retransmit "gbn"), segmentation, reassembly,
 * coalesced ACKs, NAKs, CNPs, the INT echo, the gaps' reordered/lost counts, the RTO and its
 * back-off, every drop by reason. What stays in Python (testbed/traffic/transport_native.py):
 * queue-pair set-up, the application's API over the queues this code fills (completions,
 * received messages, feedback packets), and everything a run does not do per packet. Selective
 * repeat is not ported: a core configured with it runs the reference (the loader says so in
 * one line). The NIC as INT sink (controller/nic/int_sink.py) observes here; the reports it
 * makes, and the loss reports, are queued for Python to encode, in the reference's order. The
 * emulation's loop between a job's polls (Transport.step, step after step) is at the end.
 *
 * The wire constants (opcodes, lengths, the ICRC's pseudo LRH) are not declared here: the
 * loader prepends them as #defines from controller/wire/roce.py and int_md.py.
 */
#define _GNU_SOURCE /* recvmmsg */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <linux/bpf.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define HALF (1 << 23)

/* drop reasons, in the order of DROP_NAMES in transport_native.py */
enum {
	D_SHORT,
	D_BAD_UDP_LENGTH,
	D_BAD_INT,
	D_BAD_ICRC,
	D_UNKNOWN_QP,
	D_WRONG_PEER,
	D_BAD_SACK,
	D_BAD_INT_ECHO,
	D_UNKNOWN_OPCODE,
	D_NAK_UNSUPPORTED,
	D_ACK_OUT_OF_WINDOW,
	D_SACK_OUT_OF_WINDOW,
	D_PSN_OUT_OF_WINDOW,
	D_OUT_OF_ORDER,
	D_DUPLICATE,
	D_BAD_OPCODE_SEQUENCE,
	D_BAD_LENGTH,
	D_MESSAGE_TOO_LONG,
	D_N
};

#include "transport_native.h"

_Static_assert(D_N == DROPS_N, "the drop reasons are DROP_NAMES in transport_native.py");

#define DROP(tp, why) ((tp)->drops[why]++, (tp)->drops_total++)

static int grow(void **p, uint32_t *cap, uint32_t need, size_t size)
{
	if (need <= *cap)
		return 0;
	uint32_t n = *cap ? *cap : 16;
	while (n < need)
		n *= 2;
	void *q = realloc(*p, (size_t)n * size);
	if (!q)
		return -1;
	*p = q;
	*cap = n;
	return 0;
}

/* the queue pair may have something to send now (what made it so: a post, an ACK, a NAK, a
 * timeout); the twin's host, when it tracks them, is told */
static void activate(struct xm_tp *tp, struct xm_tp_qp *qp)
{
	qp->active = 1;
	if (!tp->track_woken || qp->woken)
		return;
	if (grow((void **)&tp->woken, &tp->cap_woken, tp->nwoken + 1, sizeof(*tp->woken))) {
		tp->woken_lost = 1;
		return;
	}
	tp->woken[tp->nwoken++] = qp->index;
	qp->woken = 1;
}

/* ---- CRC-32 as zlib.crc32 computes it, eight bytes a step (slicing-by-8) ---- */

static uint32_t crc_table[8][256];

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
		crc_table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32_update(uint32_t crc, const uint8_t *p, uint64_t n)
{
	crc = ~crc;
	for (; n >= 8; p += 8, n -= 8) {
		/* the bytes in order, whatever the machine's byte order */
		uint32_t one = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
				      (uint32_t)p[3] << 24);
		crc = crc_table[7][one & 0xFF] ^ crc_table[6][(one >> 8) & 0xFF] ^
		      crc_table[5][(one >> 16) & 0xFF] ^ crc_table[4][one >> 24] ^
		      crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^
		      crc_table[0][p[7]];
	}
	while (n--)
		crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
	return ~crc;
}

/* controller.wire.roce.icrc: `ip` the IPv4 header (ihl bytes), `t` BTH + payload */
static uint32_t icrc(const uint8_t *ip, uint32_t ihl, uint16_t sport, const uint8_t *t,
		     uint64_t tlen)
{
	uint8_t head[60 + 8 + BTH_LEN];
	uint32_t udp_len = (uint32_t)(8 + tlen + ICRC_LEN);
	memcpy(head, ip, ihl);
	head[1] = 0xFF;
	head[2] = (uint8_t)((ihl + udp_len) >> 8);
	head[3] = (uint8_t)(ihl + udp_len);
	head[8] = 0xFF;
	head[10] = head[11] = 0xFF;
	uint8_t *u = head + ihl;
	u[0] = (uint8_t)(sport >> 8);
	u[1] = (uint8_t)sport;
	u[2] = (uint8_t)(ROCE_UDP_PORT >> 8);
	u[3] = (uint8_t)ROCE_UDP_PORT;
	u[4] = (uint8_t)(udp_len >> 8);
	u[5] = (uint8_t)udp_len;
	u[6] = u[7] = 0xFF;
	memcpy(u + 8, t, BTH_LEN);
	u[8 + 4] = 0xFF;
	uint32_t crc = crc32_update(ICRC_LRH, head, ihl + 8 + BTH_LEN);
	return crc32_update(crc, t + BTH_LEN, tlen - BTH_LEN);
}

static inline uint16_t be16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static inline uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void put16(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static inline void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static inline int32_t psn_diff(uint32_t a, uint32_t b)
{
	return (int32_t)((a - b + HALF) & PSN_MASK) - HALF;
}

/* ---- set-up ---- */

struct xm_tp *xm_tp_new(const struct xm_tp_cfg *cfg)
{
	static int crc_ready;
	if (!crc_ready) {
		crc_init();
		crc_ready = 1;
	}
	struct xm_tp *tp = calloc(1, sizeof(*tp));
	if (tp)
		tp->cfg = *cfg;
	return tp;
}

/* the memory the taken queues point to: the messages' buffers, the sink's packets */
static void free_queued(struct xm_tp *tp)
{
	for (uint32_t i = 0; i < tp->nmsgs; i++)
		free(tp->msgs[i].data);
	tp->nmsgs = 0;
	for (uint32_t i = 0; i < tp->nsink; i++)
		free(tp->sink_ev[i].pkt);
	tp->nsink = 0;
}

/* a copy of `pkt` for the sink (Python calls it after this call returns, in this order) */
static void sink_event(struct xm_tp *tp, uint32_t kind, const uint8_t *pkt, uint32_t len,
		       uint32_t int_off, double t)
{
	if (grow((void **)&tp->sink_ev, &tp->cap_sink, tp->nsink + 1, sizeof(*tp->sink_ev)))
		return; /* out of memory: no report, as a sink short of memory would send none */
	uint8_t *copy = malloc(len ? len : 1);
	if (!copy)
		return;
	memcpy(copy, pkt, len);
	tp->sink_ev[tp->nsink++] = (struct xm_tp_sink_ev){ kind, len, int_off, SINK_WHY_LOSS, 0,
							    copy, t };
}


/* ---- the NIC as INT sink: controller/nic/int_sink.py IntSink.observe ---- */

#define SINK_HOPS_MAX 256 /* a shim's length (8 bits of words) bounds a stack's hops */

enum { A_NODE, A_IN, A_OUT, A_LATENCY, A_QOCC }; /* SINK_FIELDS' order */

static const uint8_t hop_unit_size[16] = HOP_UNIT_SIZES;
static const struct {
	uint32_t bit, shift;
	uint64_t mask;
	uint32_t attr;
} sink_attrs[SINK_ATTRS_N] = SINK_ATTRS;

struct sink_hop { /* a hop's fields the sink reads; -1 for None */
	int64_t v[SINK_ATTRS_N];
};

struct sink_flow { /* IntSink._FlowState, and its place in the flows' order */
	uint8_t src[4];
	uint16_t sport, dport;
	uint32_t nhops;
	int64_t *path; /* per hop: node id, ingress port, egress port (-1: None) */
	double last_report, last_event;
	uint8_t has_last_event, in_event;
	int32_t older, newer; /* -1 at the ends; `newer` links the free slots */
};

struct sink_state {
	struct sink_flow *flows;
	uint32_t nslots, cap;
	int32_t free, oldest, newest;
	uint32_t count;
	uint32_t *map; /* open addressing: a slot + 1, or 0 */
	uint32_t map_cap;
	struct sink_hop hops[SINK_HOPS_MAX];
};

static uint32_t sink_hash(const uint8_t *src, uint16_t sport, uint16_t dport)
{
	uint32_t x = 2166136261u;
	for (int i = 0; i < 4; i++)
		x = (x ^ src[i]) * 16777619u;
	x = (x ^ sport) * 16777619u;
	return (x ^ dport) * 16777619u;
}

static void sink_free(struct sink_state *st)
{
	if (!st)
		return;
	for (uint32_t i = 0; i < st->nslots; i++)
		free(st->flows[i].path);
	free(st->flows);
	free(st->map);
	free(st);
}

static int sink_map_rebuild(struct sink_state *st, uint32_t cap)
{
	uint32_t *m = calloc(cap, sizeof(*m));
	if (!m)
		return -1;
	for (int32_t i = st->oldest; i >= 0; i = st->flows[i].newer) {
		const struct sink_flow *f = &st->flows[i];
		uint32_t j = sink_hash(f->src, f->sport, f->dport) & (cap - 1);
		while (m[j])
			j = (j + 1) & (cap - 1);
		m[j] = (uint32_t)i + 1;
	}
	free(st->map);
	st->map = m;
	st->map_cap = cap;
	return 0;
}

/* the map's slot holding flow `slot`, emptied with backward-shift deletion */
static void sink_map_remove(struct sink_state *st, int32_t slot)
{
	uint32_t mask = st->map_cap - 1;
	const struct sink_flow *f = &st->flows[slot];
	uint32_t i = sink_hash(f->src, f->sport, f->dport) & mask;
	while (st->map[i] != (uint32_t)slot + 1)
		i = (i + 1) & mask;
	for (uint32_t j = i;;) {
		j = (j + 1) & mask;
		if (!st->map[j])
			break;
		const struct sink_flow *g = &st->flows[st->map[j] - 1];
		uint32_t k = sink_hash(g->src, g->sport, g->dport) & mask;
		/* move it back when its home is not cyclically in (i, j] */
		if (i <= j ? (k <= i || k > j) : (k <= i && k > j)) {
			st->map[i] = st->map[j];
			i = j;
		}
	}
	st->map[i] = 0;
}

static void lru_unlink(struct sink_state *st, int32_t i)
{
	struct sink_flow *f = &st->flows[i];
	if (f->older >= 0)
		st->flows[f->older].newer = f->newer;
	else
		st->oldest = f->newer;
	if (f->newer >= 0)
		st->flows[f->newer].older = f->older;
	else
		st->newest = f->older;
}

static void lru_push(struct sink_state *st, int32_t i)
{
	struct sink_flow *f = &st->flows[i];
	f->older = st->newest;
	f->newer = -1;
	if (st->newest >= 0)
		st->flows[st->newest].newer = i;
	else
		st->oldest = i;
	st->newest = i;
}

static int32_t sink_find(struct sink_state *st, const uint8_t *src, uint16_t sport, uint16_t dport)
{
	if (!st->map_cap)
		return -1;
	uint32_t mask = st->map_cap - 1, j = sink_hash(src, sport, dport) & mask;
	for (; st->map[j]; j = (j + 1) & mask) {
		const struct sink_flow *f = &st->flows[st->map[j] - 1];
		if (f->sport == sport && f->dport == dport && !memcmp(f->src, src, 4))
			return (int32_t)st->map[j] - 1;
	}
	return -1;
}

/* a new flow, the newest (-1: no memory) */
static int32_t sink_add(struct sink_state *st, const uint8_t *src, uint16_t sport, uint16_t dport)
{
	if (2 * (st->count + 1) > st->map_cap &&
	    sink_map_rebuild(st, st->map_cap ? 2 * st->map_cap : 16))
		return -1;
	int32_t i = st->free;
	if (i >= 0) {
		st->free = st->flows[i].newer;
	} else {
		if (grow((void **)&st->flows, &st->cap, st->nslots + 1, sizeof(*st->flows)))
			return -1;
		i = (int32_t)st->nslots++;
	}
	struct sink_flow *f = &st->flows[i];
	memset(f, 0, sizeof(*f));
	memcpy(f->src, src, 4);
	f->sport = sport;
	f->dport = dport;
	uint32_t mask = st->map_cap - 1, j = sink_hash(src, sport, dport) & mask;
	while (st->map[j])
		j = (j + 1) & mask;
	st->map[j] = (uint32_t)i + 1;
	st->count++;
	lru_push(st, i);
	return i;
}

static void sink_evict_oldest(struct sink_state *st)
{
	int32_t i = st->oldest;
	sink_map_remove(st, i);
	lru_unlink(st, i);
	free(st->flows[i].path);
	st->flows[i].path = NULL;
	st->flows[i].newer = st->free;
	st->free = i;
	st->count--;
}

static int sink_error(struct xm_tp *tp, int why)
{
	tp->sink_errors[why]++;
	tp->sink_errors_total++;
	return -1;
}

/* telemetry_report.decode_inner on the `n` bytes of `p` (the inner packet): the flow's ports,
 * whether it has hops, and the hops into st->hops (*nhops); -1 counted in the sink's errors */
static int sink_decode(struct xm_tp *tp, struct sink_state *st, const uint8_t *p, uint32_t n,
		       uint16_t *sport, uint16_t *dport, uint32_t *nhops)
{
	*sport = *dport = 0;
	*nhops = 0;
	if (n < 20 || p[0] >> 4 != 4)
		return sink_error(tp, SINK_ERR_INNER_NOT_IPV4);
	uint32_t ihl = (p[0] & 0x0F) * 4u, l4 = ihl, l4_len;
	if (ihl < 20 || n < ihl)
		return sink_error(tp, SINK_ERR_INNER_TRUNCATED);
	if (p[9] == 17) {
		l4_len = 8;
	} else if (p[9] == 6) {
		if (n < l4 + 13)
			return sink_error(tp, SINK_ERR_INNER_TRUNCATED);
		l4_len = (p[l4 + 12] >> 4) * 4u;
	} else {
		return 0; /* no ports */
	}
	if (n < l4 + 4)
		return sink_error(tp, SINK_ERR_INNER_TRUNCATED);
	*sport = be16(p + l4);
	*dport = be16(p + l4 + 2);
	if (tp->cfg.int_dscp < 0 || p[1] >> 2 != (uint32_t)tp->cfg.int_dscp)
		return 0;
	uint32_t shim = l4 + l4_len;
	if (n < shim + SHIM_LEN + MD_LEN)
		return sink_error(tp, SINK_ERR_INT_TRUNCATED);
	if (p[shim] >> 4 != INT_TYPE_MD)
		return sink_error(tp, SINK_ERR_INT_BAD_TYPE);
	uint32_t md = shim + SHIM_LEN;
	if (p[md] >> 4 != INT_VERSION)
		return sink_error(tp, SINK_ERR_INT_BAD_VERSION);
	uint32_t hop_ml = p[md + 2] & HOP_ML_MAX;
	uint32_t bitmap = (uint32_t)p[md + 4] << 8 | p[md + 5];
	int32_t stack_len = ((int32_t)p[shim + 1] - MD_WORDS) * 4;
	if (stack_len < 0)
		return sink_error(tp, SINK_ERR_INT_BAD_LENGTH);
	uint32_t stack = md + MD_LEN;
	if (n < stack + (uint32_t)stack_len)
		return sink_error(tp, SINK_ERR_INT_TRUNCATED);
	if (!stack_len)
		return 0;
	uint32_t hop_len = hop_ml * 4, base = 0, at[16];
	for (uint32_t bit = 0; bit < 16; bit++) { /* hop_plan: each unit's offset in a hop */
		at[bit] = base;
		if (bitmap & (0x8000u >> bit))
			base += hop_unit_size[bit];
	}
	if (!hop_len || hop_len < base || (uint32_t)stack_len % hop_len)
		return sink_error(tp, SINK_ERR_INT_BAD_HOP_ML);
	for (uint32_t off = stack; off < stack + (uint32_t)stack_len; off += hop_len) {
		struct sink_hop *h = &st->hops[(*nhops)++];
		for (int a = 0; a < SINK_ATTRS_N; a++) {
			uint32_t bit = sink_attrs[a].bit, size = hop_unit_size[bit];
			int64_t v = -1;
			if (bitmap & (0x8000u >> bit)) {
				uint64_t u = 0;
				for (uint32_t k = 0; k < size; k++)
					u = u << 8 | p[off + at[bit] + k];
				uint64_t ones = size == 8 ? ~0ull : (1ull << (8 * size)) - 1;
				if (u != ones) /* all-ones: not available */
					v = (int64_t)((u >> sink_attrs[a].shift) & sink_attrs[a].mask);
			}
			h->v[sink_attrs[a].attr] = v;
		}
	}
	return 0;
}

static int same_path(const struct sink_flow *f, const struct sink_hop *hops, uint32_t n)
{
	if (f->nhops != n)
		return 0;
	for (uint32_t i = 0; i < n; i++)
		for (int a = A_NODE; a <= A_OUT; a++)
			if (f->path[3 * i + (uint32_t)a] != hops[i].v[a])
				return 0;
	return 1;
}

static void set_path(struct sink_flow *f, const struct sink_hop *hops, uint32_t n)
{
	int64_t *p = realloc(f->path, (size_t)(n ? n : 1) * 3 * sizeof(*p));
	if (!p)
		return; /* out of memory: the old path kept, as a sink short of memory might */
	for (uint32_t i = 0; i < n; i++)
		for (int a = A_NODE; a <= A_OUT; a++)
			p[3 * i + (uint32_t)a] = hops[i].v[a];
	f->path = p;
	f->nhops = n;
}

/* IntSink.observe: the IPv4 packet `pkt` with INT at `int_off` arrived at `now`; a report to
 * make goes to Python (kind 0, its trigger), which encodes it */
static void sink_observe(struct xm_tp *tp, const uint8_t *pkt, uint32_t len, uint32_t int_off,
			 double now)
{
	const struct xm_tp_cfg *cfg = &tp->cfg;
	struct sink_state *st = tp->sink_state;
	if (!st) {
		st = tp->sink_state = calloc(1, sizeof(*st));
		if (!st)
			return;
		st->free = st->oldest = st->newest = -1;
	}
	if (len < int_off + 2) {
		sink_error(tp, SINK_ERR_SHORT);
		return;
	}
	uint32_t end = int_off + SHIM_LEN + 4u * pkt[int_off + 1] + INNER_PAYLOAD_BYTES;
	uint32_t n = (end < len ? end : len) & ~3u;
	uint16_t sport, dport;
	uint32_t nhops;
	if (sink_decode(tp, st, pkt, n, &sport, &dport, &nhops))
		return;
	int64_t qmax = 0, latency = 0;
	for (uint32_t i = 0; i < nhops; i++) {
		if (st->hops[i].v[A_QOCC] >= 0 && st->hops[i].v[A_QOCC] > qmax)
			qmax = st->hops[i].v[A_QOCC];
		if (st->hops[i].v[A_LATENCY] >= 0)
			latency += st->hops[i].v[A_LATENCY];
	}
	int queue = cfg->sink_queue_bytes > 0 && (uint64_t)qmax > cfg->sink_queue_bytes;
	int slow = cfg->sink_latency_ns > 0 && (uint64_t)latency > cfg->sink_latency_ns;
	int event = queue || slow;
	int32_t i = sink_find(st, pkt + 12, sport, dport);
	int why = -1;
	struct sink_flow *f;
	if (i < 0) {
		why = SINK_WHY_NEW;
		i = sink_add(st, pkt + 12, sport, dport);
		if (i < 0)
			return;
		f = &st->flows[i];
		set_path(f, st->hops, nhops);
		f->last_report = now;
		if (st->count > cfg->sink_max_flows) {
			sink_evict_oldest(st);
			tp->sink_flows_evicted++;
		}
		f = &st->flows[i];
	} else {
		lru_unlink(st, i);
		lru_push(st, i);
		f = &st->flows[i];
		if (!same_path(f, st->hops, nhops))
			why = SINK_WHY_PATH;
		else if (event && (!f->in_event || !f->has_last_event ||
				   now - f->last_event >= cfg->sink_event_gap_s))
			why = queue ? SINK_WHY_QUEUE : SINK_WHY_LATENCY;
		else if (now - f->last_report >= cfg->sink_sample_s)
			why = SINK_WHY_SAMPLE;
	}
	f->in_event = (uint8_t)event;
	if (why < 0)
		return;
	set_path(f, st->hops, nhops);
	f->last_report = now;
	if (event) {
		f->last_event = now;
		f->has_last_event = 1;
	}
	uint32_t before = tp->nsink;
	sink_event(tp, 0, pkt, n, int_off, now);
	if (tp->nsink > before) {
		tp->sink_ev[before].why = (uint32_t)why;
		tp->sink_ev[before].congested = (uint8_t)event;
	}
}

void xm_tp_free(struct xm_tp *tp)
{
	if (!tp)
		return;
	for (uint32_t i = 0; i < tp->nqps; i++) {
		free(tp->qps[i]->ops);
		free(tp->qps[i]->rx_buf);
		free(tp->qps[i]->gap_pkt);
		free(tp->qps[i]->pending_int);
		free(tp->qps[i]);
	}
	free_queued(tp);
	sink_free(tp->sink_state);
	free(tp->qps);
	free(tp->dl_heap);
	free(tp->woken);
	free(tp->map_key);
	free(tp->map_val);
	free(tp->done);
	free(tp->msgs);
	free(tp->fb);
	free(tp->sink_ev);
	free(tp->rx_bufs);
	free(tp);
}

static struct xm_tp_qp *find_qp(struct xm_tp *tp, uint32_t qpn)
{
	if (!tp->map_cap)
		return NULL;
	for (uint32_t h = (qpn * 2654435761u) & (tp->map_cap - 1);; h = (h + 1) & (tp->map_cap - 1)) {
		if (!tp->map_val[h])
			return NULL;
		if (tp->map_key[h] == qpn)
			return tp->qps[tp->map_val[h] - 1];
	}
}

static int map_put(struct xm_tp *tp, uint32_t qpn, uint32_t val)
{
	if ((tp->nqps + 1) * 2 > tp->map_cap) {
		uint32_t cap = tp->map_cap ? tp->map_cap * 2 : 64;
		uint32_t *k = calloc(cap, sizeof(*k)), *v = calloc(cap, sizeof(*v));
		if (!k || !v) {
			free(k);
			free(v);
			return -1;
		}
		uint32_t *ok = tp->map_key, *ov = tp->map_val, ocap = tp->map_cap;
		tp->map_key = k;
		tp->map_val = v;
		tp->map_cap = cap;
		for (uint32_t i = 0; i < ocap; i++)
			if (ov[i])
				map_put(tp, ok[i], ov[i]);
		free(ok);
		free(ov);
	}
	uint32_t h = (qpn * 2654435761u) & (tp->map_cap - 1);
	while (tp->map_val[h])
		h = (h + 1) & (tp->map_cap - 1);
	tp->map_key[h] = qpn;
	tp->map_val[h] = val;
	return 0;
}

/* ---- the deadline heap (xm_tp.dl_heap) ---- */

static inline double dl_key(const struct xm_tp *tp, uint32_t k)
{
	const struct xm_tp_qp *qp = tp->qps[tp->dl_heap[k]];
	return qp->last_progress + qp->rto;
}

static void dl_swap(struct xm_tp *tp, uint32_t a, uint32_t b)
{
	uint32_t x = tp->dl_heap[a];
	tp->dl_heap[a] = tp->dl_heap[b];
	tp->dl_heap[b] = x;
	tp->qps[tp->dl_heap[a]]->dl_pos = (int32_t)a;
	tp->qps[tp->dl_heap[b]]->dl_pos = (int32_t)b;
}

static void dl_sift(struct xm_tp *tp, uint32_t k)
{
	while (k > 0 && dl_key(tp, k) < dl_key(tp, (k - 1) / 2)) {
		dl_swap(tp, k, (k - 1) / 2);
		k = (k - 1) / 2;
	}
	for (;;) {
		uint32_t l = 2 * k + 1, r = l + 1, m = k;
		if (l < tp->dl_n && dl_key(tp, l) < dl_key(tp, m))
			m = l;
		if (r < tp->dl_n && dl_key(tp, r) < dl_key(tp, m))
			m = r;
		if (m == k)
			return;
		dl_swap(tp, k, m);
		k = m;
	}
}

/* after a queue pair's una, high, last_progress or rto changed: its place in the heap (the
 * heap holds a place for every queue pair, made with it: this never allocates) */
static void dl_update(struct xm_tp *tp, struct xm_tp_qp *qp)
{
	if (qp->una < qp->high) {
		if (qp->dl_pos < 0) {
			qp->dl_pos = (int32_t)tp->dl_n;
			tp->dl_heap[tp->dl_n++] = qp->index;
		}
		dl_sift(tp, (uint32_t)qp->dl_pos);
	} else if (qp->dl_pos >= 0) {
		uint32_t k = (uint32_t)qp->dl_pos;
		qp->dl_pos = -1;
		if (k == --tp->dl_n)
			return;
		tp->dl_heap[k] = tp->dl_heap[tp->dl_n];
		tp->qps[tp->dl_heap[k]]->dl_pos = (int32_t)k;
		dl_sift(tp, k);
	}
}

/* QueuePair.__init__; returns the queue pair's index, -1 out of memory */
int32_t xm_tp_create_qp(struct xm_tp *tp, uint32_t qpn, uint32_t remote_qpn, uint16_t sport,
			const uint8_t *local_addr, const uint8_t *peer_addr, uint32_t sq_psn,
			uint32_t rq_psn)
{
	if (grow((void **)&tp->qps, &tp->cap_qps, tp->nqps + 1, sizeof(*tp->qps)) ||
	    grow((void **)&tp->dl_heap, &tp->dl_cap, tp->nqps + 1, sizeof(*tp->dl_heap)))
		return -1;
	struct xm_tp_qp *qp = calloc(1, sizeof(*qp));
	if (!qp || map_put(tp, qpn, tp->nqps + 1)) {
		free(qp);
		return -1;
	}
	qp->index = tp->nqps;
	qp->qpn = qpn;
	qp->remote_qpn = remote_qpn;
	qp->sport = sport;
	memcpy(qp->local_addr, local_addr, 4);
	memcpy(qp->peer_addr, peer_addr, 4);
	qp->sq_psn = sq_psn & PSN_MASK;
	qp->epsn = rq_psn & PSN_MASK;
	qp->rto = tp->cfg.rto;
	qp->last_cnp = -1e18;
	qp->store = UINT64_MAX;
	qp->dl_pos = -1;
	tp->qps[tp->nqps++] = qp;
	return (int32_t)qp->index;
}

struct xm_tp_qp *xm_tp_qp(struct xm_tp *tp, uint32_t index)
{
	return index < tp->nqps ? tp->qps[index] : NULL;
}

/* QueuePair.post_send (the Python side checked the size and keeps `data` alive until the
 * completion); 0, or -1 out of memory */
int xm_tp_post(struct xm_tp *tp, uint32_t index, const uint8_t *data, uint64_t len,
	       uint64_t size)
{
	struct xm_tp_qp *qp = tp->qps[index];
	if (qp->ops_len == qp->ops_cap) {
		uint32_t cap = qp->ops_cap ? qp->ops_cap * 2 : 8;
		struct xm_tp_op *ops = malloc(cap * sizeof(*ops));
		if (!ops)
			return -1;
		for (uint32_t i = 0; i < qp->ops_len; i++)
			ops[i] = qp->ops[(qp->ops_head + i) % qp->ops_cap];
		free(qp->ops);
		qp->ops = ops;
		qp->ops_cap = cap;
		qp->ops_head = 0;
	}
	int64_t npkts = size ? (int64_t)((size + tp->cfg.mtu - 1) / tp->cfg.mtu) : 1;
	struct xm_tp_op *op = &qp->ops[(qp->ops_head + qp->ops_len++) % qp->ops_cap];
	op->data = data;
	op->len = len;
	op->size = size;
	op->first_seq = qp->tail;
	op->npkts = npkts;
	qp->tail += npkts;
	activate(tp, qp);
	return 0;
}

static inline struct xm_tp_op *op_at(struct xm_tp_qp *qp, uint32_t i)
{
	return &qp->ops[(qp->ops_head + i) % qp->ops_cap];
}

/* ---- packets out ---- */

/* TransportCore.build: IPv4 + UDP + BTH + payload + ICRC into `out`; its length */
static uint32_t build(struct xm_tp *tp, struct xm_tp_qp *qp, uint8_t *out, uint8_t opcode,
		      uint32_t dqpn, uint32_t psn, int ackreq, uint16_t sport, const uint8_t *p1,
		      uint32_t n1, const uint8_t *p2, uint32_t n2, uint32_t zeros)
{
	uint32_t plen = n1 + n2 + zeros;
	uint32_t udp_len = 8 + BTH_LEN + plen + ICRC_LEN;
	qp->ident = (uint16_t)(qp->ident + 1);
	out[0] = 0x45;
	out[1] = tp->cfg.tos;
	put16(out + 2, 20 + udp_len);
	put16(out + 4, qp->ident);
	put16(out + 6, 0x4000);
	out[8] = tp->cfg.ttl;
	out[9] = 17;
	out[10] = out[11] = 0;
	memcpy(out + 12, qp->local_addr, 4);
	memcpy(out + 16, qp->peer_addr, 4);
	put16(out + 20, sport);
	put16(out + 22, ROCE_UDP_PORT);
	put16(out + 24, udp_len);
	put16(out + 26, 0);
	uint8_t *b = out + 28;
	b[0] = opcode;
	b[1] = 0;
	put16(b + 2, DEFAULT_PKEY);
	put32(b + 4, dqpn);
	put32(b + 8, (uint32_t)(ackreq ? 1u << 31 : 0) | psn);
	uint8_t *p = b + BTH_LEN;
	if (n1)
		memcpy(p, p1, n1);
	if (n2)
		memcpy(p + n1, p2, n2);
	if (zeros)
		memset(p + n1 + n2, 0, zeros);
	uint32_t crc = icrc(out, 20, sport, b, BTH_LEN + plen);
	uint8_t *c = p + plen;
	c[0] = (uint8_t)crc;
	c[1] = (uint8_t)(crc >> 8);
	c[2] = (uint8_t)(crc >> 16);
	c[3] = (uint8_t)(crc >> 24);
	return 28 + BTH_LEN + plen + ICRC_LEN;
}

/* TransportCore._feedback */
static void feedback(struct xm_tp *tp, struct xm_tp_qp *qp, uint8_t opcode, uint32_t psn,
		     uint16_t sport, const uint8_t *p1, uint32_t n1, const uint8_t *p2, uint32_t n2,
		     uint32_t zeros)
{
	if (grow((void **)&tp->fb, &tp->cap_fb, tp->nfb + 1, sizeof(*tp->fb)))
		return; /* out of memory: the feedback is lost, as a full queue would lose it */
	struct xm_tp_fb *f = &tp->fb[tp->nfb++];
	f->qp = qp->index;
	f->len = build(tp, qp, f->pkt, opcode, qp->remote_qpn, psn, 0, sport, p1, n1, p2, n2, zeros);
}

/* QueuePair._send_ack */
static void send_ack(struct xm_tp *tp, struct xm_tp_qp *qp, uint8_t syndrome, uint32_t psn,
		     uint16_t sport)
{
	uint8_t aeth[AETH_LEN];
	put32(aeth, (uint32_t)syndrome << 24 | (qp->msn & 0xFFFFFF));
	uint32_t echo = qp->pending_int_len;
	qp->pending_int_len = 0;
	feedback(tp, qp, OP_ACK, psn, sport, aeth, AETH_LEN, qp->pending_int, echo, 0);
	qp->unacked = 0;
	if (syndrome == AETH_ACK)
		qp->c.acks_sent++;
	else
		qp->c.naks_sent++;
	if (echo)
		qp->c.int_echoes_sent++;
}

static inline uint32_t psn_of(struct xm_tp_qp *qp, int64_t seq)
{
	return (uint32_t)((qp->sq_psn + (uint64_t)seq) & PSN_MASK);
}

/* QueuePair._seq_of */
static inline int64_t seq_of(struct xm_tp_qp *qp, uint32_t psn, int64_t ref)
{
	return ref + psn_diff(psn, psn_of(qp, ref));
}

/* QueuePair._op_for: the op holding `seq` (`cur` is a hint) */
static struct xm_tp_op *op_for(struct xm_tp_qp *qp, int64_t seq)
{
	uint32_t i = qp->cur < qp->ops_len ? qp->cur : 0;
	if (op_at(qp, i)->first_seq > seq)
		i = 0;
	while (op_at(qp, i)->first_seq + op_at(qp, i)->npkts <= seq)
		i++;
	qp->cur = i;
	return op_at(qp, i);
}

/* QueuePair.wants_to_send */
static inline int wants_to_send(struct xm_tp *tp, struct xm_tp_qp *qp)
{
	return qp->nxt < qp->tail && qp->nxt - qp->una < (int64_t)tp->cfg.window;
}

int xm_tp_wants_to_send(struct xm_tp *tp, uint32_t index)
{
	return wants_to_send(tp, tp->qps[index]);
}

/* QueuePair.peek: the next data packet into tp->out; its length, 0 for none */
uint32_t xm_tp_peek(struct xm_tp *tp, uint32_t index)
{
	struct xm_tp_qp *qp = tp->qps[index];
	if (!wants_to_send(tp, qp))
		return 0;
	uint32_t mtu = tp->cfg.mtu;
	int64_t seq = qp->nxt;
	struct xm_tp_op *op = op_for(qp, seq);
	int64_t i = seq - op->first_seq;
	uint8_t opcode;
	if (op->npkts == 1)
		opcode = OP_SEND_ONLY;
	else if (i == 0)
		opcode = OP_SEND_FIRST;
	else if (i == op->npkts - 1)
		opcode = OP_SEND_LAST;
	else
		opcode = OP_SEND_MIDDLE;
	uint64_t lo = (uint64_t)i * mtu;
	uint64_t n = op->size > lo ? op->size - lo : 0;
	if (n > mtu)
		n = mtu;
	uint64_t have = op->len > lo ? op->len - lo : 0;
	if (have > n)
		have = n;
	int ackreq = i == op->npkts - 1 || seq - qp->una + 1 >= (int64_t)tp->cfg.window;
	return build(tp, qp, tp->out, opcode, qp->remote_qpn, psn_of(qp, seq), ackreq, qp->sport,
		     op->data + (have ? lo : 0), (uint32_t)have, NULL, 0, (uint32_t)(n - have));
}

/* QueuePair.commit */
void xm_tp_commit(struct xm_tp *tp, uint32_t index, double now)
{
	struct xm_tp_qp *qp = tp->qps[index];
	uint32_t mtu = tp->cfg.mtu;
	int64_t seq = qp->nxt;
	struct xm_tp_op *op = op_for(qp, seq);
	uint64_t lo = (uint64_t)(seq - op->first_seq) * mtu;
	uint64_t n = op->size ? op->size - lo : 0;
	if (n > mtu)
		n = mtu;
	if (qp->una == qp->high)
		qp->last_progress = now;
	qp->c.tx_packets++;
	qp->c.tx_bytes += (int64_t)n;
	if (seq < qp->high)
		qp->c.retransmits++;
	qp->nxt = seq + 1;
	if (qp->nxt > qp->high)
		qp->high = qp->nxt;
	dl_update(tp, qp);
}

/* QueuePair._advance */
static void advance(struct xm_tp *tp, struct xm_tp_qp *qp, int64_t una, double now)
{
	if (una <= qp->una)
		return;
	qp->una = una;
	if (qp->nxt < una)
		qp->nxt = una;
	qp->rto = tp->cfg.rto;
	qp->last_progress = now;
	dl_update(tp, qp);
	while (qp->ops_len && op_at(qp, 0)->first_seq + op_at(qp, 0)->npkts <= una) {
		qp->ops_head = (qp->ops_head + 1) % qp->ops_cap;
		qp->ops_len--;
		qp->c.messages_sent++;
		qp->cur = qp->cur ? qp->cur - 1 : 0;
		if (!grow((void **)&tp->done, &tp->cap_done, tp->ndone + 1, sizeof(*tp->done)))
			tp->done[tp->ndone++] = (struct xm_tp_done){ qp->index, now };
	}
	if (qp->ops_len || qp->nxt < qp->tail)
		activate(tp, qp);
}

/* QueuePair._on_ack (go-back-N: a SACK header is checked, then named by its hole alone) */
static void on_ack(struct xm_tp *tp, struct xm_tp_qp *qp, uint32_t psn, uint8_t syndrome,
		   double now, int has_sack, uint32_t sack_psn)
{
	if (syndrome >> 5 == AETH_NAK_PSN_SEQ_ERR >> 5) {
		if (syndrome != AETH_NAK_PSN_SEQ_ERR && syndrome != AETH_NAK_PSN_SEQ_ERR_SACK) {
			DROP(tp, D_NAK_UNSUPPORTED);
			return;
		}
		int64_t expected = seq_of(qp, psn, qp->una);
		if (!(qp->una <= expected && expected <= qp->high)) {
			DROP(tp, D_ACK_OUT_OF_WINDOW);
			return;
		}
		if (has_sack) {
			int64_t sacked = seq_of(qp, sack_psn, qp->una);
			if (!(expected < sacked && sacked < qp->high)) {
				DROP(tp, D_SACK_OUT_OF_WINDOW);
				return;
			}
		}
		qp->c.naks_received++;
		advance(tp, qp, expected, now);
		if (expected < qp->high) {
			qp->nxt = expected; /* go back N */
			activate(tp, qp);
		}
		return;
	}
	int64_t acked = seq_of(qp, psn, qp->una);
	if (acked >= qp->high) {
		DROP(tp, D_ACK_OUT_OF_WINDOW);
		return;
	}
	qp->c.acks_received++;
	if (acked >= qp->una)
		advance(tp, qp, acked + 1, now);
}

/* ---- timers ---- */

/* TransportCore.next_deadline: 0 and *at unset for none */
int xm_tp_next_deadline(struct xm_tp *tp, double *at)
{
	*at = tp->dl_n ? dl_key(tp, 0) : 0;
	return tp->dl_n > 0;
}

/* TransportCore.restart_timer: the queue pair's packets have not left the NIC yet: its timer
 * runs from now */
void xm_tp_restart_timer(struct xm_tp *tp, uint32_t index, double now)
{
	struct xm_tp_qp *qp = tp->qps[index];
	if (qp->una < qp->high) {
		qp->last_progress = now;
		dl_update(tp, qp);
	}
}

/* TransportCore.expire: each queue pair due, from the heap's top (what a timeout changes is
 * the queue pair's own: the order they are taken in changes nothing) */
void xm_tp_expire(struct xm_tp *tp, double now)
{
	/* (a timeout moves its queue pair's deadline past now, rto being above 0: each due one
	 * is taken once; the bound is for a configuration that would break that) */
	for (uint32_t left = tp->dl_n; left && tp->dl_n && now >= dl_key(tp, 0); left--) {
		struct xm_tp_qp *qp = tp->qps[tp->dl_heap[0]];
		qp->c.timeouts++;
		qp->nxt = qp->una;
		qp->rto = qp->rto * 2 < tp->cfg.rto_max ? qp->rto * 2 : tp->cfg.rto_max;
		qp->last_progress = now;
		activate(tp, qp);
		dl_update(tp, qp);
	}
}

/* TransportCore.senders: the indices of the queue pairs with a packet to send, in creation
 * order (the reference's set has no order its callers rely on) */
uint32_t xm_tp_senders(struct xm_tp *tp, uint32_t *out)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < tp->nqps; i++) {
		struct xm_tp_qp *qp = tp->qps[i];
		if (!qp->active)
			continue;
		if (wants_to_send(tp, qp))
			out[n++] = i;
		else if (qp->nxt >= qp->tail)
			qp->active = 0;
	}
	return n;
}

/* ---- packets in ---- */

/* QueuePair._accept */
static int accept_data(struct xm_tp *tp, struct xm_tp_qp *qp, uint8_t opcode, uint32_t psn,
		  int ackreq, const uint8_t *payload, uint32_t n, uint16_t sport,
		  const uint8_t *int_bytes, uint32_t int_len, double now)
{
	int first = opcode == OP_SEND_FIRST || opcode == OP_SEND_ONLY;
	int last = opcode == OP_SEND_LAST || opcode == OP_SEND_ONLY;
	if (first == qp->in_msg) {
		DROP(tp, D_BAD_OPCODE_SEQUENCE);
		return 0;
	}
	if (n > tp->cfg.mtu || (!last && n != tp->cfg.mtu)) {
		DROP(tp, D_BAD_LENGTH);
		return 0;
	}
	if (first) {
		qp->rx_len = 0;
		qp->rx_size = 0;
		qp->rx_t_first = now;
		qp->rx_overflow = 0;
	}
	if (!qp->rx_overflow && qp->rx_size + n > tp->cfg.max_message) {
		qp->rx_overflow = 1;
		qp->rx_len = 0;
		DROP(tp, D_MESSAGE_TOO_LONG);
	}
	if (!qp->rx_overflow) {
		/* the part of this payload the queue pair stores (store_bytes: its first bytes) */
		uint64_t room = qp->rx_len < qp->store ? qp->store - qp->rx_len : 0;
		uint32_t k = room < n ? (uint32_t)room : n;
		if (qp->rx_len + k > qp->rx_cap) {
			/* from a little: a queue pair that stores a few bytes of each message (the
			 * collectives' size mode) holds a few, for each of a million queue pairs */
			uint64_t cap = qp->rx_cap ? qp->rx_cap : 64;
			while (cap < qp->rx_len + k)
				cap *= 2;
			uint8_t *b = realloc(qp->rx_buf, cap);
			if (!b) { /* out of memory: the message cannot be kept, as one too long */
				qp->rx_overflow = 1;
				qp->rx_len = 0;
				DROP(tp, D_MESSAGE_TOO_LONG);
			} else {
				qp->rx_buf = b;
				qp->rx_cap = cap;
			}
		}
		if (!qp->rx_overflow) {
			if (k)
				memcpy(qp->rx_buf + qp->rx_len, payload, k);
			qp->rx_len += k;
			qp->rx_size += n;
		}
	}
	qp->in_msg = !last;
	qp->epsn = (qp->epsn + 1) & PSN_MASK;
	qp->nak_sent = 0;
	qp->c.rx_data_packets++;
	qp->c.rx_bytes += n;
	if (int_bytes) {
		/* the stack to echo, in a buffer of its size (inline, MAX_INT a queue pair would
		 * cost a million queue pairs a GB); out of memory: no echo, as with no INT */
		if (grow((void **)&qp->pending_int, &qp->pending_int_cap, int_len, 1)) {
			qp->pending_int_len = 0;
		} else {
			memcpy(qp->pending_int, int_bytes, int_len);
			qp->pending_int_len = int_len;
		}
	}
	if (last)
		qp->msn = (qp->msn + 1) & PSN_MASK;
	qp->unacked++;
	if (last || ackreq || qp->unacked >= tp->cfg.ack_every)
		send_ack(tp, qp, AETH_ACK, psn, sport);
	if (last) {
		if (!qp->rx_overflow &&
		    !grow((void **)&tp->msgs, &tp->cap_msgs, tp->nmsgs + 1, sizeof(*tp->msgs))) {
			/* the buffer goes with the message; the next starts a new one */
			tp->msgs[tp->nmsgs++] =
				(struct xm_tp_msg){ qp->index, qp->rx_buf, qp->rx_len, qp->rx_size,
						    qp->rx_t_first, now };
			qp->rx_buf = NULL;
			qp->rx_cap = 0;
			qp->c.messages_received++;
		}
		qp->rx_len = 0;
		qp->rx_size = 0;
		qp->rx_overflow = 0;
	}
	return 1;
}

/* QueuePair._on_data (go-back-N) */
static void on_data(struct xm_tp *tp, struct xm_tp_qp *qp, uint8_t opcode, uint32_t psn,
		    int ackreq, const uint8_t *payload, uint32_t n, uint16_t sport, int ce,
		    const uint8_t *int_bytes, uint32_t int_len, double now)
{
	struct xm_tp_cfg *cfg = &tp->cfg;
	if (ce) {
		qp->c.ecn_ce_seen++;
		if (now - qp->last_cnp >= cfg->cnp_interval) {
			qp->last_cnp = now;
			feedback(tp, qp, OP_CNP, 0, sport, NULL, 0, NULL, 0, CNP_LEN);
			qp->c.cnps_sent++;
		}
	}
	if (int_bytes)
		qp->c.int_seen++;
	int32_t d = psn_diff(psn, qp->epsn);
	if (d > 0) {
		if ((uint32_t)d >= cfg->psn_window) {
			DROP(tp, D_PSN_OUT_OF_WINDOW);
			return;
		}
		DROP(tp, D_OUT_OF_ORDER);
		if (!qp->has_discarded || psn_diff(psn, qp->discarded_hi) > 0) {
			qp->discarded_hi = psn;
			qp->has_discarded = 1;
		}
		if (!qp->nak_sent || ackreq) {
			qp->nak_sent = 1;
			send_ack(tp, qp, AETH_NAK_PSN_SEQ_ERR, qp->epsn, sport);
		}
		return;
	}
	if (d < 0) {
		if (d < -(int32_t)cfg->psn_window) {
			DROP(tp, D_PSN_OUT_OF_WINDOW);
			return;
		}
		DROP(tp, D_DUPLICATE);
		/* IBA C9-105: a duplicate SEND is ACKed again (the reference says why) */
		send_ack(tp, qp, AETH_ACK, (qp->epsn - 1) & PSN_MASK, sport);
		return;
	}
	accept_data(tp, qp, opcode, psn, ackreq, payload, n, sport, int_bytes, int_len, now);
}

static inline int is_data(uint8_t op)
{
	return op == OP_SEND_FIRST || op == OP_SEND_MIDDLE || op == OP_SEND_LAST ||
	       op == OP_SEND_ONLY;
}

/* TransportCore.receive: one IPv4 packet (UDP dport 4791) */
static void receive(struct xm_tp *tp, const uint8_t *pkt, uint32_t n, double now)
{
	struct xm_tp_cfg *cfg = &tp->cfg;
	tp->rx_packets++;
	if (n < 20) {
		DROP(tp, D_SHORT);
		return;
	}
	uint32_t ihl = (pkt[0] & 0x0F) * 4u;
	uint8_t tos = pkt[1];
	if (n < ihl + 8 || ihl < 20) {
		DROP(tp, D_SHORT);
		return;
	}
	uint16_t sport = be16(pkt + ihl);
	uint32_t udp_len = be16(pkt + ihl + 4);
	uint32_t end = ihl + udp_len;
	if (udp_len < 8 || end > n) {
		DROP(tp, D_BAD_UDP_LENGTH);
		return;
	}
	uint32_t off = ihl + 8;
	const uint8_t *int_bytes = NULL;
	uint32_t int_len = 0;
	if (cfg->int_dscp >= 0 && tos >> 2 == cfg->int_dscp) {
		if (end - off < SHIM_LEN || pkt[off] >> 4 != INT_TYPE_MD) {
			DROP(tp, D_BAD_INT);
			return;
		}
		int_len = SHIM_LEN + 4u * pkt[off + 1];
		if (off + int_len > end || int_len < HEADERS_LEN) {
			DROP(tp, D_BAD_INT);
			return;
		}
		int_bytes = pkt + off;
		off += int_len;
	}
	if (end - off < BTH_LEN + ICRC_LEN) {
		DROP(tp, D_SHORT);
		return;
	}
	const uint8_t *body = pkt + off;
	uint32_t blen = end - ICRC_LEN - off;
	uint32_t crc = icrc(pkt, ihl, sport, body, blen);
	const uint8_t *c = pkt + end - ICRC_LEN;
	if (c[0] != (uint8_t)crc || c[1] != (uint8_t)(crc >> 8) || c[2] != (uint8_t)(crc >> 16) ||
	    c[3] != (uint8_t)(crc >> 24)) {
		DROP(tp, D_BAD_ICRC);
		return;
	}
	uint8_t opcode = body[0];
	uint32_t dqpn = be32(body + 4), ap = be32(body + 8);
	struct xm_tp_qp *qp = find_qp(tp, dqpn & 0xFFFFFF);
	if (!qp) {
		if ((dqpn & 0xFFFFFF) == PROBE_QPN)
			tp->probes_ignored++;
		else
			DROP(tp, D_UNKNOWN_QP);
		return;
	}
	if (memcmp(pkt + 12, qp->peer_addr, 4)) {
		DROP(tp, D_WRONG_PEER);
		return;
	}
	uint32_t psn = ap & PSN_MASK;
	if (is_data(opcode)) {
		int32_t d = psn_diff(psn, qp->epsn);
		uint16_t ident = be16(pkt + 4);
		if (d == 0 && qp->has_gap) {
			/* TransportCore._settle_gap */
			qp->has_gap = 0;
			if ((uint16_t)(ident - qp->gap_ident) >= 0x8000) {
				qp->c.reordered++;
			} else {
				qp->c.gaps_lost++;
				if (qp->gap_len)
					sink_event(tp, 1, qp->gap_pkt, qp->gap_len, qp->gap_int_off,
						   qp->gap_t);
			}
			qp->gap_len = 0;
		} else if (0 < d && (uint32_t)d < cfg->psn_window && !qp->has_gap && !qp->nak_sent) {
			if (!qp->has_discarded || qp->discarded_hi != ((psn - 1) & PSN_MASK)) {
				qp->has_gap = 1;
				qp->gap_ident = ident;
				qp->gap_len = 0;
				if (cfg->sink && int_bytes) { /* kept for the sink's loss report */
					uint8_t *b = realloc(qp->gap_pkt, end);
					if (b) {
						qp->gap_pkt = b;
						memcpy(b, pkt, end);
						qp->gap_len = end;
						qp->gap_int_off = ihl + 8;
						qp->gap_t = now;
					}
				}
			}
		}
		if (cfg->sink && int_bytes)
			sink_observe(tp, pkt, end, ihl + 8, now);
		on_data(tp, qp, opcode, psn, (int)(ap >> 31), body + BTH_LEN, blen - BTH_LEN, sport,
			(tos & 3) == 3, int_bytes, int_len, now);
	} else if (opcode == OP_ACK) {
		if (blen < BTH_LEN + AETH_LEN) {
			DROP(tp, D_SHORT);
			return;
		}
		const uint8_t *rest = body + BTH_LEN + AETH_LEN;
		uint32_t rlen = blen - BTH_LEN - AETH_LEN;
		uint8_t syndrome = body[BTH_LEN];
		if (syndrome == AETH_NAK_PSN_SEQ_ERR_SACK) {
			if (rlen != SACK_LEN) {
				DROP(tp, D_BAD_SACK);
				return;
			}
			on_ack(tp, qp, psn, syndrome, now, 1, be32(rest) & PSN_MASK);
			return;
		}
		/* controller.wire.int_md.looks_like_int_echo */
		if (rlen && !(rlen >= HEADERS_LEN && rest[0] >> 4 == INT_TYPE_MD &&
			      SHIM_LEN + 4u * rest[1] == rlen)) {
			DROP(tp, D_BAD_INT_ECHO);
			return;
		}
		on_ack(tp, qp, psn, syndrome, now, 0, 0);
	} else if (opcode == OP_CNP) {
		qp->c.cnps_received++;
	} else {
		DROP(tp, D_UNKNOWN_OPCODE);
	}
}

/* receive, and whether it left anything for the Python side to take (xm_tp_taken) */
int xm_tp_receive(struct xm_tp *tp, const uint8_t *pkt, uint32_t n, double now)
{
	int64_t drops = tp->drops_total, errors = tp->sink_errors_total;
	receive(tp, pkt, n, now);
	return tp->ndone || tp->nmsgs || tp->nfb || tp->nsink || tp->drops_total != drops ||
	       tp->sink_errors_total != errors;
}

/* ---- the twin's NIC: a data frame in one call ---- */

/* RFC 1071 over the IPv4 header, as controller.wire.ipv4.with_checksum fills it in (the
 * kernel's job for IP_HDRINCL) */
void xm_tp_ipv4_checksum(uint8_t *ip)
{
	uint32_t ihl = (ip[0] & 0x0F) * 4u, sum = 0;
	ip[10] = ip[11] = 0;
	for (uint32_t i = 0; i < ihl; i += 2)
		sum += (uint32_t)ip[i] << 8 | ip[i + 1];
	while (sum >> 16)
		sum = (sum & 0xFFFF) + (sum >> 16);
	sum = ~sum & 0xFFFF;
	ip[10] = (uint8_t)(sum >> 8);
	ip[11] = (uint8_t)sum;
}

/* tc egress of the twin's NIC (testbed/sim/nic_native.c xm_nic_tc), called through a pointer:
 * the two are built apart */
typedef uint32_t (*xm_tc_fn)(void *nic, uint8_t *buf, uint32_t len, uint32_t room,
			     uint64_t now_ns);

/* The twin's SimHost._kick for a data packet, in one call: QueuePair.peek and commit, the
 * IPv4 header checksum, the Ethernet header `eth` and tc egress (`tc` on `nic`, with `growth`
 * bytes of room for what it inserts). The frame is in tp->frame; its length, 0 when the
 * queue pair has nothing to send; *ip_len the IPv4 packet's before tc (what the pacer counts) */
uint32_t xm_tp_send_frame(struct xm_tp *tp, uint32_t index, double now, const uint8_t *eth,
			  xm_tc_fn tc, void *nic, uint64_t now_ns, uint32_t growth, uint32_t *ip_len)
{
	*ip_len = 0;
	if (growth > MAX_INT) /* tc would write past the frame */
		return 0;
	uint32_t n = xm_tp_peek(tp, index);
	if (!n)
		return 0;
	*ip_len = n;
	xm_tp_commit(tp, index, now);
	xm_tp_ipv4_checksum(tp->out);
	memcpy(tp->frame, eth, 14);
	memcpy(tp->frame + 14, tp->out, n);
	return tc(nic, tp->frame, 14 + n, 14 + n + growth, now_ns);
}

/* ---- the emulation's sockets, batched (testbed/traffic/transport.py's loops, in C) ---- */

#define RX_BATCH 32
#define RX_BUF 65536 /* per datagram: Transport's receive buffer */

/* Transport._receive: up to `budget` datagrams from the raw socket `fd`, each received at
 * `now`, read RX_BATCH a call (recvmmsg); how many, or -errno on an error the reference would
 * raise (it stops at EAGAIN and EINTR) */
int32_t xm_tp_recv_batch(struct xm_tp *tp, int fd, uint32_t budget, double now)
{
	if (!tp->rx_bufs) {
		tp->rx_bufs = malloc((size_t)RX_BATCH * RX_BUF);
		if (!tp->rx_bufs)
			return -ENOMEM;
	}
	struct mmsghdr msgs[RX_BATCH];
	struct iovec iov[RX_BATCH];
	uint32_t got = 0;
	while (got < budget) {
		uint32_t want = budget - got < RX_BATCH ? budget - got : RX_BATCH;
		memset(msgs, 0, sizeof(msgs[0]) * want);
		for (uint32_t i = 0; i < want; i++) {
			iov[i].iov_base = tp->rx_bufs + (size_t)i * RX_BUF;
			iov[i].iov_len = RX_BUF;
			msgs[i].msg_hdr.msg_iov = &iov[i];
			msgs[i].msg_hdr.msg_iovlen = 1;
		}
		int n = recvmmsg(fd, msgs, want, MSG_DONTWAIT, NULL);
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
				break;
			return got ? (int32_t)got : -errno;
		}
		for (int i = 0; i < n; i++)
			receive(tp, tp->rx_bufs + (size_t)i * RX_BUF, msgs[i].msg_len, now);
		got += (uint32_t)n;
		if ((uint32_t)n < want)
			break; /* the socket is empty */
	}
	return (int32_t)got;
}

/* Transport._send_round for one queue pair: up to `max` data packets to `peer` on its raw
 * socket `fd` (peek, sendto, commit); *sent counts them. Returns 0 when it sent `max` or had
 * no more, else the errno of the send that failed (the packet not committed: the Python side
 * does what the reference does with it) */
int xm_tp_send_burst(struct xm_tp *tp, uint32_t index, int fd, uint32_t max, double now,
		     uint32_t *sent)
{
	struct xm_tp_qp *qp = tp->qps[index];
	struct sockaddr_in to = { 0 };
	to.sin_family = AF_INET;
	memcpy(&to.sin_addr, qp->peer_addr, 4);
	*sent = 0;
	while (*sent < max) {
		uint32_t n = xm_tp_peek(tp, index);
		if (!n)
			return 0;
		if (sendto(fd, tp->out, n, 0, (struct sockaddr *)&to, sizeof(to)) < 0)
			return errno ? errno : EIO;
		xm_tp_commit(tp, index, now);
		++*sent;
	}
	return 0;
}

/* ---- what the Python side takes (it reads the queues' fields of struct xm_tp) ---- */

/* everything taken: the queues restart empty (what they held was copied by the caller) */
void xm_tp_taken(struct xm_tp *tp)
{
	tp->ndone = 0;
	free_queued(tp);
	tp->nfb = 0;
}

/* ---- the emulation's loop: Transport.step, one step after another (transport.py) ---- */

#define XM_IO_UNTIL 0 /* `until` came */
#define XM_IO_PROGRESS 1 /* a step completed a send or a message: the job looks */
#define XM_IO_SINK 2 /* a step's reads queued packets for the INT sink: Python takes them and
		      * does the rest of the step (Transport._rest_of_step) */
#define SENT 0
#define BLOCKED 1
#define LOST 2

/* time.monotonic() */
static double monotonic(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec) / 1e9;
}

/* Transport._send_failed: SENT never; BLOCKED (the socket or the qdisc full: sent again
 * later) or LOST (counted) */
static int send_failed(struct xm_tp *tp, struct xm_tp_io *io, uint32_t index, int err)
{
	struct xm_tp_counters *c = &tp->qps[index]->c;
	if (err == EAGAIN || err == EWOULDBLOCK) {
		c->tx_blocked++;
		io->blocked[index] = 1;
		return BLOCKED;
	}
	if (err == ENOBUFS) { /* the qdisc (NIC pacing queue) is full */
		c->tx_nobufs++;
		io->retry_at[index] = monotonic() + io->nobufs_backoff;
		return BLOCKED;
	}
	c->tx_errors++;
	io->send_errors[err > 0 && err < SEND_ERRNO_N ? err : 0]++;
	io->send_errors_total++;
	return LOST;
}

/* Transport._send_feedback: each ACK/NAK/CNP once, in order, on the feedback's socket */
static void send_feedback(struct xm_tp *tp, struct xm_tp_io *io)
{
	for (uint32_t i = 0; i < tp->nfb; i++) {
		const struct xm_tp_fb *f = &tp->fb[i];
		struct sockaddr_in to = { 0 };
		to.sin_family = AF_INET;
		memcpy(&to.sin_addr, tp->qps[f->qp]->peer_addr, 4);
		if (sendto(io->fb_fd, f->pkt, f->len, 0, (struct sockaddr *)&to, sizeof(to)) < 0)
			io->feedback_not_sent++;
	}
	tp->nfb = 0;
}

/* Transport._restart_waiting_timers: each due timer whose queue pair's packets still wait in
 * the NIC (unsent bytes in its socket, SIOCOUTQ: paced in its class) runs from now */
static void restart_waiting(struct xm_tp *tp, struct xm_tp_io *io, double now)
{
	if (!tp->dl_n || now < dl_key(tp, 0))
		return;
	uint32_t n = 0; /* io->senders as scratch: send_round fills it afresh */
	for (uint32_t k = 0; k < tp->dl_n; k++) {
		int unsent = 0;
		uint32_t index = tp->dl_heap[k];
		if (now >= dl_key(tp, k) && ioctl(io->fd[index], SIOCOUTQ, &unsent) == 0 && unsent > 0)
			io->senders[n++] = index;
	}
	for (uint32_t i = 0; i < n; i++)
		xm_tp_restart_timer(tp, io->senders[i], now);
}

/* Transport._send_native: a queue pair's burst, a failed send handled as _send_failed does */
static uint32_t send_native(struct xm_tp *tp, struct xm_tp_io *io, uint32_t index, double now)
{
	uint32_t left = io->send_burst;
	while (left) {
		uint32_t n = 0;
		int err = xm_tp_send_burst(tp, index, io->fd[index], left, now, &n);
		left -= n;
		if (!err)
			break;
		if (send_failed(tp, io, index, err) == BLOCKED)
			break;
		xm_tp_commit(tp, index, now); /* lost on the way out: the RTO recovers it */
		left--;
	}
	return io->send_burst - left;
}

/* Transport._send_round */
static int send_round(struct xm_tp *tp, struct xm_tp_io *io, double now)
{
	uint32_t sent = 0, n = xm_tp_senders(tp, io->senders);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t index = io->senders[i];
		if (io->blocked[index] || io->retry_at[index] > now)
			continue;
		sent += send_native(tp, io, index, now);
		send_feedback(tp, io); /* feedback made meanwhile goes out promptly */
	}
	return sent > 0;
}

/* Transport._wait: until a packet comes, a blocked socket can take more, the next deadline or
 * retry, or max_wait; to the nanosecond (Python's selector rounds up to milliseconds) */
static int wait(struct xm_tp *tp, struct xm_tp_io *io, double now, double max_wait)
{
	double timeout = max_wait, d;
	if (xm_tp_next_deadline(tp, &d) && d - now < timeout)
		timeout = d - now;
	struct pollfd fds[tp->nqps + 1];
	nfds_t n = 1;
	uint32_t which[tp->nqps + 1];
	fds[0].fd = io->rx_fd;
	fds[0].events = POLLIN;
	if (io->held_until > now) { /* paused: look again soon (a resume can end it early) */
		if (io->held_until - now < timeout)
			timeout = io->held_until - now;
		if (io->pause_poll_s < timeout)
			timeout = io->pause_poll_s;
	}
	for (uint32_t i = 0; i < tp->nqps; i++) {
		if (io->retry_at[i] > 0 && io->retry_at[i] - now < timeout)
			timeout = io->retry_at[i] - now;
		if (io->blocked[i]) {
			fds[n].fd = io->fd[i];
			fds[n].events = POLLOUT;
			which[n - 1] = i;
			n++;
		}
	}
	if (timeout < 0)
		timeout = 0;
	struct timespec ts = { (time_t)timeout, (long)((timeout - (double)(time_t)timeout) * 1e9) };
	if (ppoll(fds, n, &ts, NULL) < 0 && errno != EINTR)
		return -errno;
	for (nfds_t k = 1; k < n; k++) /* writable, or an error: selectors' EVENT_WRITE */
		if (fds[k].revents & ~POLLIN)
			io->blocked[which[k - 1]] = 0;
	double later = monotonic();
	for (uint32_t i = 0; i < tp->nqps; i++)
		if (io->retry_at[i] > 0 && io->retry_at[i] <= later)
			io->retry_at[i] = 0;
	return 0;
}

/* PinnedPfc.hold_until_ns for priority 0: until when the switch holds the NIC (0: it does
 * not), read from the pinned map with bpf(2); -errno when the read fails */
static int64_t pfc_hold_until(const struct xm_tp_io *io, int64_t now_ns)
{
	uint8_t value[256];
	uint32_t key = 0;
	if (io->pfc_value_size > sizeof(value))
		return -EINVAL;
	union bpf_attr attr;
	memset(&attr, 0, sizeof(attr));
	attr.map_fd = (uint32_t)io->pfc_fd;
	attr.key = (uint64_t)(uintptr_t)&key;
	attr.value = (uint64_t)(uintptr_t)value;
	if (syscall(__NR_bpf, BPF_MAP_LOOKUP_ELEM, &attr, sizeof(attr)) < 0)
		return -errno;
	uint64_t until;
	uint32_t active;
	memcpy(&until, value + io->pfc_until_off, sizeof(until));
	memcpy(&active, value + io->pfc_active_off, sizeof(active));
	return active && (uint64_t)now_ns < until ? (int64_t)until : 0; /* PfcState.holds */
}

/* Transport._paused: whether the NIC is paused now (a PFC pause from its switch): 1, 0, or
 * -errno */
static int paused(struct xm_tp_io *io, double now)
{
	if (io->pfc_fd < 0)
		return 0;
	double was = io->held_until;
	int64_t until_ns = pfc_hold_until(io, (int64_t)(now * 1e9));
	if (until_ns < 0)
		return (int)until_ns;
	double until = (double)until_ns / 1e9;
	if (was > 0.0) { /* the time since the last look was held (up to the pause's end) */
		double held = (now < was ? now : was) - io->last_look;
		io->held_s += held > 0.0 ? held : 0.0;
	} else if (until > 0.0) {
		io->holds++;
	}
	io->held_until = until;
	io->last_look = now;
	return until > now;
}

/* Transport._timers_wait: whether a due timer waits this step for the frames a full read
 * left unread */
static int timers_wait(struct xm_tp *tp, struct xm_tp_io *io, double now, int full)
{
	io->full_reads = full ? io->full_reads + 1 : 0;
	if (io->full_reads > io->rx_defer_steps)
		io->full_reads = 0;
	if (!io->full_reads)
		return 0;
	double d;
	return xm_tp_next_deadline(tp, &d) && d <= now;
}

/* Transport.step, with the INT sink's part left to Python */
static int64_t step(struct xm_tp *tp, struct xm_tp_io *io, double now, double max_wait)
{
	int32_t got = xm_tp_recv_batch(tp, io->rx_fd, io->rx_budget, now);
	if (got < 0)
		return got;
	int busy = got > 0, full = (uint32_t)got >= io->rx_budget;
	if (tp->nsink) {
		io->step_now = now;
		io->step_busy = busy;
		io->step_max_wait = max_wait;
		io->step_full = full;
		return XM_IO_SINK;
	}
	int held = paused(io, now);
	if (held < 0)
		return held;
	if (!held)
		send_feedback(tp, io); /* reports: only after the sink's part, Python's */
	if (timers_wait(tp, io, now, full)) {
		io->timers_deferred++;
	} else {
		restart_waiting(tp, io, now);
		xm_tp_expire(tp, now);
	}
	if (!held)
		busy |= send_round(tp, io, now);
	if (!busy)
		return wait(tp, io, now, max_wait);
	return 0;
}

/* The worker's run_job between its job's polls: steps (each waiting at most 10 ms, as the
 * reference's) until one completes a send or a message (XM_IO_PROGRESS), `until` (the job's
 * next wake-up or deadline, time.monotonic()) comes, or a step stops for Python
 * (XM_IO_SINK); -errno for a read or a wait that failed */
int64_t xm_tp_run(struct xm_tp *tp, struct xm_tp_io *io, double until)
{
	if (io->cap < tp->nqps)
		return -EINVAL;
	for (;;) {
		double now = monotonic();
		if (now >= until)
			return XM_IO_UNTIL;
		double max_wait = until - now < 0.01 ? until - now : 0.01;
		int64_t rc = step(tp, io, now, max_wait);
		if (rc)
			return rc;
		if (tp->ndone || tp->nmsgs)
			return XM_IO_PROGRESS;
	}
}
