"""The transport's own ceiling: goodput of 1 QP and of 8 QPs host to host over one veth.

Long-lived flows (back-to-back 1 MB messages) between two namespaces with no pacing and no
impairment, so the figure is what the userspace transport itself can carry on this machine:
link rates emulated above it would measure the transport, not the network.
"""

from __future__ import annotations

import os
from typing import Any

from testbed.traffic import workloads
from testbed.traffic.netns import NetnsLan
from testbed.traffic.transport import TransportConfig


def run(quick: bool) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise PermissionError("the transport benchmark needs root (network namespaces)")
    duration = 1.5 if quick else 5.0
    cfg = TransportConfig(local_ip="0.0.0.0")
    out: dict[str, Any] = {
        "conditions": {
            "duration_s": duration,
            "message_bytes": 1 << 20,
            "mtu_payload": cfg.mtu,
            "window_pkts": cfg.window,
            "ack_every": cfg.ack_every,
            "link": "veth, MTU 1500",
            "load_avg_before": os.getloadavg()[0],
        }
    }
    with NetnsLan(2) as lan:
        for qps in (1, 8):
            res = workloads.longlived(lan.hosts, [(0, 1)], duration, qps_per_pair=qps)
            c = res["counters"]
            out[f"{qps}qp"] = {
                "goodput_mbps": round(res["goodput"]["goodput_bps"] / 1e6, 1),
                "per_qp_mbps": [round(f["goodput_bps"] / 1e6, 1) for f in res["flows"]],
                "retransmits": c["retransmits"],
                "timeouts": c["timeouts"],
                "bad_messages": res["bad_messages"],
            }
    out["ratio_8qp_over_1qp"] = round(
        out["8qp"]["goodput_mbps"] / max(out["1qp"]["goodput_mbps"], 1e-9), 2
    )
    return out
