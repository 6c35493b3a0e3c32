"""The twin at scale (issue 30's scale point): a 2-tier fabric of 51.2T switches with 1,024
hosts at 1:1 (16 leaves of 64 hosts and 64 uplinks each, 128 ports at 400G; 64 spines, one
link to every leaf) running a 1,024-rank ring all-reduce of 16 MiB per rank and an all-to-all
of 16 MiB per rank (16 KiB to each peer: a million queue pairs) in the size mode
(testbed.traffic.collective_jobs), against the goal of 15 minutes of one core for the
all-reduce; beside each, the flow-level engine's prediction of the same run (testbed.flow: its
ideal over the TiTa efficiency fitted at 8 hosts) and its error, a held-out check of issue 31
at a size the twin could not run before.

Opt-in (`python -m testbed.bench --only twin_scale`): it runs for tens of minutes and takes
about 12 GB for the all-to-all, so `make bench` leaves it out. `--quick` runs the same at 256
hosts (4 leaves).
"""

from __future__ import annotations

import time
from typing import Any

from testbed.benchmarks.twin import FABRICS, _in_child, collective

FABRIC = FABRICS[1024]  # leaves, spines, hosts per leaf
QUICK_FABRIC = (4, 64, 64)
SIZE = 16 << 20
# the all-reduce's goal (issue 30: CPU only); the all-to-all has none, its figures are reported
GOAL_CPU_S = {"allreduce": 15 * 60, "alltoall": None}


def flow_prediction(fabric: tuple[int, int, int], size: int, kind: str) -> dict[str, Any]:
    """The flow engine's time for the twin's run: its ideal (max-min rates, the all-to-all
    through FIFO queues, and the latency term; the all-to-all's flows on the job's own source
    ports, as the twin routes them) over
    TiTa's efficiency from testbed/flow/calibration.yaml."""
    from testbed.flow.calibration import applied
    from testbed.flow.collectives import model_link_latency, suite_collective
    from testbed.flow.fabric import from_spec
    from testbed.topo import leafspine

    c0 = time.process_time()
    spec = leafspine(*fabric)
    ideal = suite_collective(from_spec(spec), kind, size, model_link_latency(), spec=spec)
    got = applied("tita", kind, ideal)
    return {
        "ideal_s": ideal.time_s,
        "efficiency": got.efficiency,
        "regime": got.regime,
        "note": got.note,  # e.g. beyond the fitted times: the efficiency at the nearest
        "predicted_s": ideal.time_s / got.efficiency,
        "cpu_s": round(time.process_time() - c0, 2),
    }


def run(quick: bool) -> dict[str, Any]:
    fabric = QUICK_FABRIC if quick else FABRIC
    out: dict[str, Any] = {}
    for kind in ("allreduce", "alltoall"):
        try:
            twin = _in_child(collective, fabric, "size", SIZE, GOAL_CPU_S[kind], kind, None)
        except Exception as exc:  # reported in the results file, as the other sections do
            out[kind] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        # the all-to-all's prediction is a flow per pair of ranks, each on the job's ECMP
        # path, through the FIFOs in pieces: two minutes at 1,024 hosts (a million flows)
        try:
            flow = _in_child(flow_prediction, fabric, SIZE, kind)
        except Exception as exc:
            flow = {"error": f"{type(exc).__name__}: {exc}"}
        if twin.get("simulated_s") and "predicted_s" in flow:
            flow["error"] = round(flow["predicted_s"] / twin["simulated_s"] - 1, 4)
        out[kind] = {"twin": twin, "flow": flow}
    return out
