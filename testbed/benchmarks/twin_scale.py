"""The twin at scale (issue 30's scale point): a 2-tier fabric of 51.2T switches with 1,024
hosts at 1:1 (16 leaves of 64 hosts and 64 uplinks each, 128 ports at 400G; 64 spines, one
link to every leaf) running a 1,024-rank ring all-reduce of 16 MiB per rank in the size mode
(testbed.traffic.collective_jobs), against the goal of 15 minutes of one core; beside it, the
flow-level engine's prediction of the same run (testbed.flow: its ideal over the TiTa
all-reduce efficiency fitted at 8 hosts) and its error, a held-out check of issue 31 at a size
the twin could not run before.

Opt-in (`python -m testbed.bench --only twin_scale`): it runs for tens of minutes, so `make
bench` leaves it out. `--quick` runs the same at 256 hosts (4 leaves).
"""

from __future__ import annotations

import time
from typing import Any

from testbed.benchmarks.twin import FABRICS, _in_child, allreduce

FABRIC = FABRICS[1024]  # leaves, spines, hosts per leaf
QUICK_FABRIC = (4, 64, 64)
GOAL_CPU_S = 15 * 60


def flow_prediction(fabric: tuple[int, int, int], size: int) -> dict[str, Any]:
    """The flow engine's time for the twin's run: its ideal (max-min rates and the latency
    term) over TiTa's all-reduce efficiency from testbed/flow/calibration.yaml (the free
    fit's: on this 1:1 fabric the NICs set the ring's rates)."""
    from testbed.flow.calibration import applied
    from testbed.flow.collectives import model_link_latency, suite_collective
    from testbed.flow.fabric import from_spec
    from testbed.topo import leafspine

    c0 = time.process_time()
    ideal = suite_collective(from_spec(leafspine(*fabric)), "allreduce", size, model_link_latency())
    eff = applied("tita", "allreduce", ideal).efficiency
    return {
        "ideal_s": ideal.time_s,
        "efficiency": eff,
        "predicted_s": ideal.time_s / eff,
        "cpu_s": round(time.process_time() - c0, 2),
    }


def run(quick: bool) -> dict[str, Any]:
    fabric = QUICK_FABRIC if quick else FABRIC
    size = 16 << 20
    try:
        twin = _in_child(allreduce, fabric, "size", size, GOAL_CPU_S)
    except Exception as exc:  # reported in the results file, as the other sections do
        return {"allreduce": {"error": f"{type(exc).__name__}: {exc}"}}
    flow = flow_prediction(fabric, size)
    if twin.get("simulated_s"):
        flow["error"] = round(flow["predicted_s"] / twin["simulated_s"] - 1, 4)
    return {"allreduce": twin, "flow": flow}
