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
BPF_TABLE_PINNED("percpu_array", __u32, __u64, xm_counters, XM_CNT_MAX, XM_PIN("xm_counters"));

static __always_inline void xm_count(__u32 reason)
{
	__u64 *c = xm_counters.lookup(&reason);
	if (c)
		*c += 1; /* per-CPU slot: no atomic needed */
}

static __always_inline struct xm_host_config *xm_config_get(void)
{
	__u32 zero = 0;
	return xm_config.lookup(&zero);
}

#endif /* XINGMAI_LIB_MAPS_H */
