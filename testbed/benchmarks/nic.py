"""NIC benchmark (`make bench`): pacing accuracy and rate-change latency of the eBPF NIC, on the
NIC rig of testbed/emu/nicrig.py (two namespaces, a veth, the agent on the sender's side)."""

from __future__ import annotations

import os
import statistics
from typing import Any

from testbed.emu.nicrig import (
    UDP_PAYLOAD,
    AgentProcess,
    NetnsPair,
    RateMapWriter,
    measure_rate_change,
    measure_tcp_pacing,
    measure_udp_pacing,
)


def run(quick: bool) -> dict[str, Any]:
    """Pacing accuracy (UDP, TCP) at three rates across a decade and rate-change latency."""
    if os.geteuid() != 0:
        return {"skipped": "needs root (network namespaces, eBPF)"}
    rates = [10_000_000, 30_000_000, 100_000_000]
    duration = 2.0 if quick else 4.0
    out: dict[str, Any] = {
        "conditions": {
            "link": "veth between two network namespaces",
            "line_rate_bps": 1_000_000_000,
            "udp_payload_bytes": UDP_PAYLOAD,
            "rate_unit": "frame bits/s (Ethernet header included)",
            "run_s": duration,
            "steady_window": "from 0.5 s after the first packet to 0.2 s before the last",
        }
    }
    with NetnsPair.create() as pair:
        # the test flows are not the transport: no INT, frames are what the receiver counts
        agent = AgentProcess(pair.a, pair.dev_a, 1_000_000_000, extra=("--no-int",))
        with agent:
            status = agent.stub().GetStatus(agent.pb().GetStatusRequest(), timeout=10)
            out["pacing_mode"] = status.pacing_mode
            out["udp"] = [
                measure_udp_pacing(pair, agent, r, duration, sport=5000 + i)
                for i, r in enumerate(rates)
            ]
            out["tcp"] = [
                measure_tcp_pacing(pair, agent, r, duration + 1, cport=40000 + i)
                for i, r in enumerate(rates)
            ]
            writer = RateMapWriter(agent.pin_dir)
            try:
                changes = []
                reps = 1 if quick else 3
                for i in range(reps):
                    changes.append(
                        measure_rate_change(
                            pair, agent, 20_000_000, 80_000_000, "grpc", sport=5100 + 4 * i
                        )
                    )
                    changes.append(
                        measure_rate_change(
                            pair, agent, 80_000_000, 20_000_000, "grpc", sport=5101 + 4 * i
                        )
                    )
                    changes.append(
                        measure_rate_change(
                            pair,
                            agent,
                            20_000_000,
                            80_000_000,
                            "map",
                            sport=5102 + 4 * i,
                            map_writer=writer,
                        )
                    )
                    changes.append(
                        measure_rate_change(
                            pair,
                            agent,
                            80_000_000,
                            20_000_000,
                            "map",
                            sport=5103 + 4 * i,
                            map_writer=writer,
                        )
                    )
            finally:
                writer.close()
            out["rate_change"] = changes
            lats = [c["latency_ms"] for c in changes if c["latency_ms"] is not None]
            out["rate_change_latency_ms"] = {
                "median": statistics.median(lats) if lats else None,
                "max": max(lats) if lats else None,
                "unresolved": sum(c["latency_ms"] is None for c in changes),
                "median_from_request": statistics.median(
                    [
                        c["latency_from_request_ms"]
                        for c in changes
                        if c["latency_from_request_ms"] is not None
                    ]
                    or [float("nan")]
                ),
                "definition": "first 1 ms bin after the update was made (RPC returned, map "
                "written) from which every 10-bin mean holds the new rate "
                "within 10 % for 60 ms",
            }
    out["max_abs_error"] = {
        "udp": max(abs(m["error"]) for m in out["udp"]),
        "tcp": max(abs(m["error"]) for m in out["tcp"]),
    }
    return out
