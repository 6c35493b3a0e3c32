"""The twin at scale (issue 30's scale point): a 2-tier fabric of 51.2T switches with 1,024
hosts at 1:1 (16 leaves of 64 hosts and 64 uplinks each, 128 ports at 400G; 64 spines, one
link to every leaf) running a 1,024-rank ring all-reduce of 16 MiB per rank in the size mode
(testbed.traffic.collective_jobs), against the goal of 15 minutes of one core.

Opt-in (`python -m testbed.bench --only twin_scale`): it runs for tens of minutes, so `make
bench` leaves it out. `--quick` runs the same at 256 hosts (4 leaves).
"""

from __future__ import annotations

from typing import Any

from testbed.benchmarks.twin import _in_child, allreduce

FABRIC = (16, 64, 64)  # leaves, spines, hosts per leaf
QUICK_FABRIC = (4, 64, 64)
GOAL_CPU_S = 15 * 60


def run(quick: bool) -> dict[str, Any]:
    fabric = QUICK_FABRIC if quick else FABRIC
    try:
        return {"allreduce": _in_child(allreduce, fabric, "size", 16 << 20, GOAL_CPU_S)}
    except Exception as exc:  # reported in the results file, as the other sections do
        return {"allreduce": {"error": f"{type(exc).__name__}: {exc}"}}
