/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The wire's far end of the xingmai NIC (clsact ingress, direct action), under HTB pacing
 * only: attached where the NIC's frames arrive (on the emulation the host link's veth peer,
 * in the switch's namespace), it stamps a TIMELY or Swift RTT probe's departure as a NIC's
 * transmit timestamp would, after the packet's wait in its flow's HTB class. tc egress runs
 * before the qdisc and cannot see that wait; under EDT it knows the departure (skb->tstamp)
 * and this program is not attached. It only reads the frame: every path returns TC_ACT_OK.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/udp.h>

#include "xingmai.h"
#include "lib/maps.h"
#include "lib/helpers.h"
#include "lib/tc_parse.h"
#include "lib/rtt.h"

int xm_tc_wire(struct __sk_buff *skb)
{
	struct xm_host_config *cfg = xm_config_get();
	struct xm_tc_pkt p = {};

	xm_count(XM_CNT_WIRE_PACKETS);
	if (!cfg)
		return TC_ACT_OK;
	/* what tc egress sent: its parse (tc egress counted what it is not), past the INT it
	 * inserted */
	if (xm_tc_parse_frame(skb, &p, cfg->int_enabled ? (int)cfg->int_dscp : -1) ||
	    !p.roce || p.opcode > XM_OP_DATA_MAX)
		return TC_ACT_OK;
	struct xm_flow_stats *st = xm_flows.lookup(&p.key);
	if (st)
		xm_rtt_wire_stamp(st, p.psn, bpf_ktime_get_ns());
	return TC_ACT_OK;
}
