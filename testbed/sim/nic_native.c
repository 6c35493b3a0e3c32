/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The NIC's two programs, ebpf/xdp_ingress.c and ebpf/tc_egress.c (and the lib/ headers they
 * include, unchanged), compiled for this process: the twin's NIC runs the C the kernel runs,
 * not a copy.
 *
 * What the kernel provides, this file provides instead, and nothing more:
 *  - the maps: bcc's `map.lookup(&key)` is C once a map is a struct of function pointers;
 *    each BPF_TABLE_PINNED of lib/maps.h becomes one, over this process's tables of the NIC
 *    being run (`xm_cur`: one NIC's maps per struct xm_nic, as each host has its own);
 *  - the helpers the program calls (bpf_ktime_get_ns: the twin's clock, bpf_xdp_load_bytes:
 *    a bounded copy out of the frame) and the byte-order macros;
 *  - struct xdp_md with pointers as 64-bit integers (the kernel's are 32-bit offsets that its
 *    verifier rewrites), and the struct __sk_buff fields tc_egress.c uses, over a buffer
 *    (bpf_skb_load_bytes, _store_bytes, _adjust_room: what tc's INT source calls).
 * The ring buffer's events (the agent's wake-up) are counted, not kept: the twin reads the
 * rate from the law's state. An LRU map is a hash map that refuses inserts when full, as
 * a hash map does: the twin's hosts hold far fewer than XM_MAX_FLOWS flows.
 *
 * testbed/sim/nic_native.py builds this with the programs expanded in place of their
 * #includes below, and drives it; tests/test_nic_native.py holds it equal to the Python
 * references (testbed/sim/nic_programs.py, controller/nic/ratelaw/) on generated frames.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <linux/if_ether.h>
#include <linux/types.h>

typedef __u64 u64;
typedef __u32 u32;

struct xdp_md {
	__u64 data;
	__u64 data_end;
};
#define XDP_DROP 1
#define XDP_PASS 2

/* the fields tc_egress.c reads and writes, and (xm_*) where the shim keeps the frame */
struct __sk_buff {
	__u32 len;
	__u32 gso_segs;
	__u32 ifindex;
	__u32 priority;
	__u64 tstamp;
	__u8 *xm_data;
	__u32 xm_room; /* bytes the frame may grow to */
};
#define BPF_ADJ_ROOM_NET 0

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define bpf_htons(x) __builtin_bswap16(x)
#define bpf_htonl(x) __builtin_bswap32(x)
#else
#define bpf_htons(x) (x)
#define bpf_htonl(x) (x)
#endif
#define bpf_ntohs(x) bpf_htons(x)
#define bpf_ntohl(x) bpf_htonl(x)

/* ---- maps ---- */

#define XM_SHIM_MAX_MAPS 32
#define XM_TOMB ((struct xm_entry *)1)

enum xm_map_kind { XM_MAP_ARRAY, XM_MAP_HASH };

struct xm_map_spec {
	const char *name;
	enum xm_map_kind kind;
	__u32 key_size, value_size, max_entries;
};

/* A hash map's entry: its key, then its value at an 8-byte boundary. Entries never move
 * (the program keeps pointers to values across updates of other keys, as the kernel allows). */
struct xm_entry {
	__u64 hash;
	__u8 data[];
};

struct xm_map {
	const struct xm_map_spec *spec;
	__u8 *array;             /* ARRAY: max_entries values */
	struct xm_entry **slots; /* HASH: open addressing; NULL empty, XM_TOMB deleted */
	__u32 cap, count, used;  /* used: live entries and tombstones */
};

struct xm_nic {
	struct xm_map maps[XM_SHIM_MAX_MAPS];
	__u64 now_ns;
	__u64 events; /* ring buffer records the program emitted */
	__u8 *rx;     /* the received frame as a driver places it (xm_nic_xdp) */
	__u32 rx_room;
};

static struct xm_map_spec xm_specs[XM_SHIM_MAX_MAPS];
static __u32 xm_nspecs;
static struct xm_nic *xm_cur;

static void xm_register(__u32 id, const char *name, const char *type, __u32 ksz, __u32 vsz,
			__u32 max)
{
	if (id >= XM_SHIM_MAX_MAPS)
		abort(); /* more maps than this file holds: raise XM_SHIM_MAX_MAPS */
	int array = strcmp(type, "array") == 0 || strcmp(type, "percpu_array") == 0;
	xm_specs[id] = (struct xm_map_spec){name, array ? XM_MAP_ARRAY : XM_MAP_HASH, ksz, vsz, max};
	if (id + 1 > xm_nspecs)
		xm_nspecs = id + 1;
}

static __u32 xm_value_off(const struct xm_map_spec *s)
{
	return (s->key_size + 7) & ~7U;
}

static __u64 xm_hash(const void *key, __u32 n)
{
	const __u8 *p = key;
	__u64 h = 1469598103934665603ULL; /* FNV-1a */
	for (__u32 i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ULL;
	return h;
}

/* The slot of `key`, or of the first free one on its probe sequence (-1: none). */
static long xm_find(const struct xm_map *m, const void *key, __u64 h, int *found)
{
	long free_slot = -1;
	*found = 0;
	if (!m->cap)
		return -1;
	for (__u32 i = 0, j = h & (m->cap - 1); i < m->cap; i++, j = (j + 1) & (m->cap - 1)) {
		struct xm_entry *e = m->slots[j];
		if (e == NULL)
			return free_slot >= 0 ? free_slot : (long)j;
		if (e == XM_TOMB) {
			if (free_slot < 0)
				free_slot = j;
		} else if (e->hash == h && memcmp(e->data, key, m->spec->key_size) == 0) {
			*found = 1;
			return j;
		}
	}
	return free_slot;
}

static int xm_rehash(struct xm_map *m, __u32 cap)
{
	struct xm_entry **slots = calloc(cap, sizeof(*slots));
	if (!slots)
		return -ENOMEM;
	for (__u32 i = 0; i < m->cap; i++) {
		struct xm_entry *e = m->slots[i];
		if (e == NULL || e == XM_TOMB)
			continue;
		__u32 j = e->hash & (cap - 1);
		while (slots[j])
			j = (j + 1) & (cap - 1);
		slots[j] = e;
	}
	free(m->slots);
	m->slots = slots;
	m->cap = cap;
	m->used = m->count;
	return 0;
}

static void *xm_map_lookup(struct xm_map *m, const void *key)
{
	const struct xm_map_spec *s = m->spec;
	if (s->kind == XM_MAP_ARRAY) {
		__u32 i = *(const __u32 *)key;
		return i < s->max_entries ? m->array + (size_t)i * s->value_size : NULL;
	}
	int found;
	long j = xm_find(m, key, xm_hash(key, s->key_size), &found);
	return found ? m->slots[j]->data + xm_value_off(s) : NULL;
}

#define XM_ANY 0
#define XM_NOEXIST 1

static int xm_map_update(struct xm_map *m, const void *key, const void *value, int flags)
{
	const struct xm_map_spec *s = m->spec;
	if (s->kind == XM_MAP_ARRAY) {
		void *v = xm_map_lookup(m, key);
		if (!v)
			return -E2BIG;
		memmove(v, value, s->value_size);
		return 0;
	}
	__u64 h = xm_hash(key, s->key_size);
	int found;
	long j = xm_find(m, key, h, &found);
	if (found) {
		if (flags == XM_NOEXIST)
			return -EEXIST;
		memmove(m->slots[j]->data + xm_value_off(s), value, s->value_size);
		return 0;
	}
	if (m->count >= s->max_entries)
		return -E2BIG;
	if (2 * (m->used + 1) > m->cap) {
		__u32 cap = m->cap ? m->cap : 8;
		while (2 * (m->count + 1) > cap)
			cap *= 2;
		if (xm_rehash(m, cap) < 0)
			return -ENOMEM;
		j = xm_find(m, key, h, &found);
	}
	struct xm_entry *e = calloc(1, sizeof(*e) + xm_value_off(s) + s->value_size);
	if (!e)
		return -ENOMEM;
	e->hash = h;
	memcpy(e->data, key, s->key_size);
	memcpy(e->data + xm_value_off(s), value, s->value_size);
	if (m->slots[j] == NULL)
		m->used++;
	m->slots[j] = e;
	m->count++;
	return 0;
}

static int xm_map_delete(struct xm_map *m, const void *key)
{
	if (m->spec->kind == XM_MAP_ARRAY)
		return -EINVAL;
	int found;
	long j = xm_find(m, key, xm_hash(key, m->spec->key_size), &found);
	if (!found)
		return -ENOENT;
	free(m->slots[j]);
	m->slots[j] = XM_TOMB;
	m->count--;
	return 0;
}

static void xm_map_clear(struct xm_map *m)
{
	if (m->spec->kind == XM_MAP_ARRAY) {
		memset(m->array, 0, (size_t)m->spec->max_entries * m->spec->value_size);
		return;
	}
	for (__u32 i = 0; i < m->cap; i++)
		if (m->slots[i] != XM_TOMB)
			free(m->slots[i]);
	free(m->slots);
	m->slots = NULL;
	m->cap = m->count = m->used = 0;
}

struct xm_map_ops {
	void *(*lookup)(const void *key);
	int (*update)(const void *key, const void *value);
	int (*insert)(const void *key, const void *value);
	int (*delete)(const void *key);
};

/* bcc's declaration, as this process's map of the NIC being run */
#define BPF_TABLE_PINNED(_type, _key, _leaf, _name, _max, _pin)                              \
	enum { _name##_id = __COUNTER__ };                                                  \
	__attribute__((constructor)) static void _name##_register(void)                     \
	{                                                                                   \
		xm_register(_name##_id, #_name, _type, sizeof(_key), sizeof(_leaf), _max);  \
	}                                                                                   \
	__attribute__((unused)) static void *_name##_lookup(const void *k)                  \
	{                                                                                   \
		return xm_map_lookup(&xm_cur->maps[_name##_id], k);                         \
	}                                                                                   \
	__attribute__((unused)) static int _name##_update(const void *k, const void *v)     \
	{                                                                                   \
		return xm_map_update(&xm_cur->maps[_name##_id], k, v, XM_ANY);              \
	}                                                                                   \
	__attribute__((unused)) static int _name##_insert(const void *k, const void *v)     \
	{                                                                                   \
		return xm_map_update(&xm_cur->maps[_name##_id], k, v, XM_NOEXIST);          \
	}                                                                                   \
	__attribute__((unused)) static int _name##_delete(const void *k)                    \
	{                                                                                   \
		return xm_map_delete(&xm_cur->maps[_name##_id], k);                         \
	}                                                                                   \
	__attribute__((unused)) static const struct xm_map_ops _name = {                    \
		_name##_lookup, _name##_update, _name##_insert, _name##_delete}

struct xm_ringbuf_ops {
	int (*ringbuf_output)(void *data, u64 size, u64 flags);
};

static int xm_ringbuf_output(void *data, u64 size, u64 flags)
{
	(void)data, (void)size, (void)flags;
	xm_cur->events++;
	return 0;
}

#define XM_RINGBUF_PINNED(_name, _record, _bytes, _pin)                                     \
	__attribute__((unused)) static const struct xm_ringbuf_ops _name = {xm_ringbuf_output}

/* ---- helpers ---- */

static __u64 bpf_ktime_get_ns(void)
{
	return xm_cur->now_ns;
}

static long bpf_xdp_load_bytes(struct xdp_md *ctx, __u32 off, void *buf, __u32 len)
{
	if (off > ctx->data_end - ctx->data || len > ctx->data_end - ctx->data - off)
		return -EFAULT;
	memcpy(buf, (const void *)(uintptr_t)(ctx->data + off), len);
	return 0;
}

static long bpf_skb_load_bytes(const struct __sk_buff *skb, __u32 off, void *to, __u32 len)
{
	if (off > skb->len || len > skb->len - off)
		return -EFAULT;
	memcpy(to, skb->xm_data + off, len);
	return 0;
}

static long bpf_skb_store_bytes(struct __sk_buff *skb, __u32 off, const void *from, __u32 len,
				__u64 flags)
{
	(void)flags;
	if (off > skb->len || len > skb->len - off)
		return -EFAULT;
	memmove(skb->xm_data + off, from, len);
	return 0;
}

/* Room between the IPv4 header and what follows it (BPF_ADJ_ROOM_NET, growing only: all the
 * program asks for), zeroed. */
static long bpf_skb_adjust_room(struct __sk_buff *skb, __s32 len_diff, __u32 mode, __u64 flags)
{
	(void)flags;
	if (mode != BPF_ADJ_ROOM_NET || len_diff <= 0 || skb->len < ETH_HLEN + 20 ||
	    skb->len + (__u32)len_diff > skb->xm_room)
		return -EINVAL;
	__u32 at = ETH_HLEN + (skb->xm_data[ETH_HLEN] & 0x0f) * 4;
	if (at > skb->len)
		return -EINVAL;
	memmove(skb->xm_data + at + len_diff, skb->xm_data + at, skb->len - at);
	memset(skb->xm_data + at, 0, len_diff);
	skb->len += len_diff;
	return 0;
}

/* ---- the programs ---- */

#define XM_PIN_DIR ""
#include "xdp_ingress.c"
#include "tc_egress.c"

/* ---- what Python calls (testbed/sim/nic_native.py declares these to cffi) ---- */

struct xm_nic *xm_nic_new(void)
{
	struct xm_nic *nic = calloc(1, sizeof(*nic));
	if (!nic)
		return NULL;
	for (__u32 i = 0; i < xm_nspecs; i++) {
		struct xm_map *m = &nic->maps[i];
		m->spec = &xm_specs[i];
		if (m->spec->kind == XM_MAP_ARRAY) {
			m->array = calloc(m->spec->max_entries, m->spec->value_size);
			if (!m->array && m->spec->max_entries) {
				nic->maps[i].spec = NULL;
				for (__u32 k = 0; k < i; k++)
					free(nic->maps[k].array);
				free(nic);
				return NULL;
			}
		}
	}
	return nic;
}

void xm_nic_free(struct xm_nic *nic)
{
	if (!nic)
		return;
	for (__u32 i = 0; i < xm_nspecs; i++) {
		xm_map_clear(&nic->maps[i]);
		free(nic->maps[i].array);
	}
	free(nic->rx);
	free(nic);
}

/* The id of the map `name`, -1 if the program has none of that name. */
int xm_nic_map_id(const char *name)
{
	for (__u32 i = 0; i < xm_nspecs; i++)
		if (xm_specs[i].name && strcmp(xm_specs[i].name, name) == 0)
			return i;
	return -1;
}

/* The value of `key` in map `id` (NULL: none); `create` inserts a zeroed one first. */
void *xm_nic_map_get(struct xm_nic *nic, int id, const void *key, int create)
{
	struct xm_map *m = &nic->maps[id];
	void *v = xm_map_lookup(m, key);
	if (v || !create)
		return v;
	void *zero = calloc(1, m->spec->value_size);
	if (!zero)
		return NULL;
	int err = xm_map_update(m, key, zero, XM_NOEXIST);
	free(zero);
	return err ? NULL : xm_map_lookup(m, key);
}

int xm_nic_map_delete(struct xm_nic *nic, int id, const void *key)
{
	return xm_map_delete(&nic->maps[id], key);
}

void xm_nic_map_clear(struct xm_nic *nic, int id)
{
	xm_map_clear(&nic->maps[id]);
}

__u32 xm_nic_map_count(struct xm_nic *nic, int id)
{
	return nic->maps[id].count;
}

/* sizeof of the structs Python lays out from xingmai.h (cffi): checked when it loads */
size_t xm_nic_sizeof(int which)
{
	switch (which) {
	case 0: return sizeof(struct xm_host_config);
	case 1: return sizeof(struct xm_flow_stats);
	case 2: return sizeof(struct xm_flow_ctl);
	case 3: return sizeof(struct xm_rate);
	case 4: return sizeof(struct xm_cc_state);
	case 5: return sizeof(struct xm_flow_key);
	case 6: return sizeof(struct xm_hop_key);
	default: return 0;
	}
}

/* One received frame through the XDP program at `now_ns`: its verdict (XDP_PASS, XDP_DROP),
 * -1 when there is no memory to place it. The program reads headers in place, so the frame is
 * placed as a NIC's driver places it: 2 bytes past a 4-byte boundary (NET_IP_ALIGN), which
 * aligns the IPv4 header (UBSan reports the misaligned reads otherwise). */
int xm_nic_xdp(struct xm_nic *nic, const __u8 *frame, __u32 len, __u64 now_ns)
{
	if (len + 2 > nic->rx_room) {
		__u8 *rx = realloc(nic->rx, len + 2);
		if (!rx)
			return -1;
		nic->rx = rx, nic->rx_room = len + 2;
	}
	memcpy(nic->rx + 2, frame, len);
	__u64 data = (__u64)(uintptr_t)(nic->rx + 2);
	struct xdp_md ctx = {data, data + len};
	xm_cur = nic;
	nic->now_ns = now_ns;
	int verdict = xm_xdp_ingress(&ctx);
	xm_cur = NULL;
	return verdict;
}

/* tc egress on the frame in `buf` (`len` bytes, room for `room`) at `now_ns`: its length after
 * (INT inserted in place, or not). */
__u32 xm_nic_tc(struct xm_nic *nic, __u8 *buf, __u32 len, __u32 room, __u64 now_ns)
{
	struct __sk_buff skb = {.len = len, .gso_segs = 1, .xm_data = buf, .xm_room = room};
	xm_cur = nic;
	nic->now_ns = now_ns;
	xm_tc_egress(&skb);
	xm_cur = NULL;
	return skb.len;
}

/* XDP on a frame of the flow `key` (the caller read it from the headers) at `now_ns`, on what
 * tc counted of the flow: 1 with the flow's rate when it was feedback and the flow has a law's
 * state, else 0. */
int xm_nic_rx(struct xm_nic *nic, const __u8 *frame, __u32 len, __u64 now_ns,
	      const struct xm_flow_key *key, __u64 *rate)
{
	__u32 i = XM_CNT_XDP_ACK, c = XM_CNT_XDP_CNP;
	__u64 *acks = xm_map_lookup(&nic->maps[xm_counters_id], &i);
	__u64 *cnps = xm_map_lookup(&nic->maps[xm_counters_id], &c);
	__u64 before = *acks + *cnps;
	xm_nic_xdp(nic, frame, len, now_ns);
	if (*acks + *cnps == before)
		return 0; /* not feedback */
	struct xm_cc_state *cc = xm_map_lookup(&nic->maps[xm_cc_id], key);
	if (!cc)
		return 0;
	*rate = cc->rate_bps;
	return 1;
}

/* xm_nic_rx with the flow's key read from the frame, as the twin's host reads it (IPv4 at 14,
 * the feedback answers (daddr, saddr, UDP sport, 4791, UDP)): for C built apart that runs XDP
 * on its frames (testbed/sim/host_native.c), which has checked the headers are there. */
int xm_nic_host_rx(struct xm_nic *nic, const __u8 *frame, __u32 len, __u64 now_ns, __u64 *rate)
{
	const __u8 *ip = frame + 14;
	__u32 ihl = (ip[0] & 0x0F) * 4u;
	struct xm_flow_key key;
	memset(&key, 0, sizeof(key));
	memcpy(&key.saddr, ip + 16, 4);
	memcpy(&key.daddr, ip + 12, 4);
	memcpy(&key.sport, ip + ihl, 2);
	key.dport = bpf_htons(XM_ROCE_PORT);
	key.proto = 17;
	return xm_nic_rx(nic, frame, len, now_ns, &key, rate);
}

/*
 * The law's differential test's call per feedback frame, in one crossing: what tc keeps of the flow (its bytes,
 * next PSN and RTT probe) and its pacing rate before the frame (0: none) written to the maps
 * as tc and the agent would have, the program run, and the flow's rate after it. Returns 1
 * with *rate set when the frame was feedback and the flow has a law's state, else 0.
 */
int xm_nic_feedback(struct xm_nic *nic, const __u8 *frame, __u32 len, __u64 now_ns,
		    const struct xm_flow_key *key, __u64 tx_bytes, __u32 snd_nxt_psn,
		    __u32 psn_valid, __u32 probe_seq, __u32 probe_psn, __u64 probe_ns,
		    __u64 paced_bps, __u64 *rate)
{
	struct xm_flow_stats *st = xm_nic_map_get(nic, xm_flows_id, key, 1);
	if (!st)
		return 0;
	st->tx_bytes = tx_bytes;
	st->snd_nxt_psn = snd_nxt_psn;
	st->flags = psn_valid ? (st->flags | XM_FLOW_PSN_VALID) : (st->flags & ~XM_FLOW_PSN_VALID);
	st->rtt_probe_seq = probe_seq;
	st->rtt_probe_psn = probe_psn;
	st->rtt_probe_ns = probe_ns;
	if (paced_bps) {
		struct xm_rate *r = xm_nic_map_get(nic, xm_rates_id, key, 1);
		if (!r)
			return 0;
		r->rate_bps = paced_bps;
	} else {
		xm_map_delete(&nic->maps[xm_rates_id], key);
	}
	return xm_nic_rx(nic, frame, len, now_ns, key, rate);
}
