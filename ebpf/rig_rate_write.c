/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The NIC rig's stand-in for a rate law (testbed/emu/nicrig.py, RateMapWriter): run through
 * BPF_PROG_TEST_RUN with a struct xm_event as its packet, it writes that rate as XDP's laws
 * do (xm_rate_write: the rate map and the agent's event), so that tests and benchmarks see
 * the agent react to a datapath rate change without building feedback for a law. It is
 * never attached to an interface.
 */
#include <uapi/linux/bpf.h>

#include "xingmai.h"
#include "lib/maps.h"

int xm_rig_rate_write(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct xm_event *ev = data;
	if ((void *)(ev + 1) > end)
		return XDP_ABORTED;
	struct xm_flow_key key = ev->key;
	struct xm_rate r = ev->rate;
	r.stamp_ns = bpf_ktime_get_ns();
	xm_rate_write(&key, &r);
	return XDP_PASS;
}
