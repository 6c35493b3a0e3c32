/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The NIC's maps, declared once (bcc style, all pinned in the agent's bpffs folder), and the
 * accessors every program uses.
 */
#ifndef XINGMAI_LIB_MAPS_H
#define XINGMAI_LIB_MAPS_H

#include "xingmai.h"

#ifndef XM_PIN_DIR
#error "XM_PIN_DIR (the bpffs folder of this agent's pinned maps) must be defined by the loader"
#endif

#define XM_PIN(name) XM_PIN_DIR "/" name

#define XM_MAX_FLOWS 65536
BPF_TABLE_PINNED("array", __u32, struct xm_host_config, xm_config, 1, XM_PIN("xm_config"));
BPF_TABLE_PINNED("lru_hash", struct xm_flow_key, struct xm_flow_stats, xm_flows, XM_MAX_FLOWS,
		 XM_PIN("xm_flows"));
BPF_TABLE_PINNED("hash", struct xm_flow_key, struct xm_rate, xm_rates, XM_MAX_FLOWS,
		 XM_PIN("xm_rates"));
BPF_TABLE_PINNED("hash", struct xm_flow_key, struct xm_cc_state, xm_cc, XM_MAX_FLOWS,
		 XM_PIN("xm_cc"));
BPF_TABLE_PINNED("hash", struct xm_flow_key, struct xm_flow_ctl, xm_ctl, XM_MAX_FLOWS,
		 XM_PIN("xm_ctl"));
/* HTB class (major:minor) of each flow that has one; written by the agent. */
BPF_TABLE_PINNED("hash", struct xm_flow_key, __u32, xm_class, XM_MAX_FLOWS,
		 XM_PIN("xm_class"));
BPF_TABLE_PINNED("hash", struct xm_hop_key, __u64, xm_hop_speed, 4096, XM_PIN("xm_hop_speed"));
/* XDP's scratch space for a new xm_cc entry (too large for the stack). */
BPF_TABLE_PINNED("percpu_array", __u32, struct xm_cc_state, xm_cc_scratch, 1,
		 XM_PIN("xm_cc_scratch"));
BPF_TABLE_PINNED("percpu_array", __u32, struct xm_hop_scratch, xm_xdp_scratch, 1,
		 XM_PIN("xm_xdp_scratch"));
/* The pause the switch sent, per PFC priority (written by XDP, read by the sender). */
BPF_TABLE_PINNED("array", __u32, struct xm_pfc_state, xm_pfc, XM_PFC_PRIORITIES,
		 XM_PIN("xm_pfc"));
BPF_TABLE_PINNED("percpu_array", __u32, __u64, xm_counters, XM_CNT_MAX, XM_PIN("xm_counters"));

/*
 * A pinned ring buffer: bcc's BPF_RINGBUF_OUTPUT with a pin (every program's module shares
 * it, as they share the tables). Its `leaf` member names the record type, which gives
 * Python the record's layout (the table's .Leaf) from this header. Size: bytes, a power of
 * two multiple of the page size. (The twin's native build of the program defines its own:
 * testbed/sim/nic_native.c.)
 */
#ifndef XM_RINGBUF_PINNED
#define XM_RINGBUF_PINNED(_name, _record, _bytes, _pin)                                     \
	struct _name##_table_t {                                                           \
		int key;                                                                   \
		_record leaf;                                                              \
		int (*ringbuf_output)(void *, u64, u64);                                   \
		void *(*ringbuf_reserve)(u64);                                             \
		void (*ringbuf_discard)(void *, u64);                                      \
		void (*ringbuf_submit)(void *, u64);                                       \
		u32 max_entries;                                                           \
	};                                                                                 \
	__attribute__((section("maps/ringbuf:" _pin))) struct _name##_table_t _name = {    \
		.max_entries = (_bytes)}
#endif

/* 256 KiB: about 4,600 events, a few seconds of every flow's rate changes at the emulation's
 * scale; when it is full an event is counted as lost and the agent re-reads xm_rates. */
XM_RINGBUF_PINNED(xm_events, struct xm_event, 1 << 18, XM_PIN("xm_events"));

static __always_inline void xm_count(__u32 reason)
{
	__u64 *c = xm_counters.lookup(&reason);
	if (c)
		*c += 1; /* per-CPU slot: no atomic needed */
}

/* Tell the agent (xm_events); `rate` may be 0 (a new flow). */
static __always_inline void xm_event_emit(const struct xm_flow_key *key,
					  const struct xm_rate *rate, __u32 kind)
{
	struct xm_event ev = {};
	ev.key = *key;
	if (rate)
		ev.rate = *rate;
	ev.kind = kind;
	if (xm_events.ringbuf_output(&ev, sizeof(ev), 0) < 0)
		xm_count(XM_CNT_EVENT_LOST);
}

/* A rate law's write: the rate map, and the event that tells the agent. */
static __always_inline void xm_rate_write(struct xm_flow_key *key, struct xm_rate *r)
{
	xm_rates.update(key, r);
	xm_event_emit(key, r, XM_EV_RATE);
}

static __always_inline struct xm_host_config *xm_config_get(void)
{
	__u32 zero = 0;
	return xm_config.lookup(&zero);
}

#endif /* XINGMAI_LIB_MAPS_H */
