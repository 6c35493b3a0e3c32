/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sock_ops of the xingmai NIC: paces TCP flows of this host's network namespace at their rate
 * from the rate map by setting SO_MAX_PACING_RATE (the kernel's TCP internal pacing needs no
 * sch_fq). Runs when a connection is established and on every RTT sample after that, so a
 * new rate takes effect within one ACK. Flows without an entry are paced at the line rate.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/in.h>
#include <uapi/asm-generic/socket.h>

#include "xingmai.h"
#include "lib/maps.h"

#define XM_AF_INET 2
#define XM_SOL_SOCKET 1

static __always_inline void xm_sockops_apply(struct bpf_sock_ops *skops,
					     const struct xm_host_config *cfg)
{
	struct xm_flow_key key = {};
	key.saddr = skops->local_ip4;
	key.daddr = skops->remote_ip4;
	key.sport = bpf_htons((__u16)skops->local_port); /* host order in the context */
	key.dport = (__u16)(skops->remote_port >> 16);   /* network order, upper half */
	key.proto = IPPROTO_TCP;

	struct xm_rate *r = xm_rates.lookup(&key);
	__u64 bps = r ? r->rate_bps : cfg->line_rate_bps;
	__u64 bytes = bps / 8;
	/* the option is 32 bits; ~0U would mean unlimited */
	int val = bytes >= 0xfffffffeULL ? (int)0xfffffffe : (int)bytes;
	if (val == 0)
		val = 1;
	if (bpf_setsockopt(skops, XM_SOL_SOCKET, SO_MAX_PACING_RATE, &val, sizeof(val)) < 0)
		xm_count(XM_CNT_SOCKOPS_SETSOCKOPT_ERROR);
	else
		xm_count(XM_CNT_SOCKOPS_RATE_SET);
}

int xm_sockops(struct bpf_sock_ops *skops)
{
	struct xm_host_config *cfg = xm_config_get();
	if (!cfg || skops->family != XM_AF_INET)
		return 1;
	/* attached to a cgroup that spans namespaces: act only on this host's sockets */
	if (cfg->netns_cookie && bpf_get_netns_cookie(skops) != cfg->netns_cookie)
		return 1;

	switch (skops->op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		xm_count(XM_CNT_SOCKOPS_ESTABLISHED);
		bpf_sock_ops_cb_flags_set(skops,
					  skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTT_CB_FLAG);
		xm_sockops_apply(skops, cfg);
		break;
	case BPF_SOCK_OPS_RTT_CB:
		xm_sockops_apply(skops, cfg);
		break;
	default:
		break;
	}
	return 1;
}
