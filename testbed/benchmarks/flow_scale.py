"""The flow engine's cost from 1,024 to 131,072 GPUs (issue 31's "cost measured at 1k, 8k, 32k
and 131k GPUs: wall time, memory, their growth"): one iteration of its goal (a DP ring
all-reduce of 1 GiB per GPU, one ring per rail, then an EP all-to-all of 256 MiB per GPU in
groups of 64) on 3-tier Clos fabrics of 51.2T switches, rail-optimized and plain, each in a
process of its own (`xingmai-testbed flow-iteration --json`), `REPEATS` times; and the
step-by-step computation without the symmetry shortcuts (`--full`) where it is affordable.
Figures: per point the computation's wall and CPU time (in the process, after Python's
start), the process's peak RSS and its whole wall time, min-max over the repeats; the growth
from the smallest to the largest fabric; and a plot, `flow-scale.png`, beside the results
file when matplotlib is installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GPUS = (1024, 8192, 32768, 131072)
FULL_GPUS = (1024, 8192)  # --full grows faster than the ranks (x29 for x8): not beyond
REPEATS = 3
PLOT = Path("results/flow-scale.png")


def _one(gpus: int, extra: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "testbed", "flow-iteration", "--json", "--gpus", str(gpus)]
    cmd += ["--tiers", "3", *extra]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.monotonic() - t0
    out = json.loads(done.stdout)
    return {
        "wall_s": out["wall_s"],
        "cpu_s": out["cpu_s"],
        "peak_rss_mib": out["peak_rss_mib"],
        "process_wall_s": round(wall, 2),
        "allreduce_s": out["allreduce_s"],
        "alltoall_s": out["alltoall_s"],
    }


def _point(fabric: str, gpus: int, extra: list[str], repeats: int) -> dict[str, Any]:
    runs = [_one(gpus, extra) for _ in range(repeats)]
    if len({(r["allreduce_s"], r["alltoall_s"]) for r in runs}) != 1:
        raise RuntimeError(f"{fabric} {gpus}: the repeats disagree: {runs}")
    point: dict[str, Any] = {"fabric": fabric, "gpus": gpus, "repeats": repeats}
    for key in ("wall_s", "cpu_s", "peak_rss_mib", "process_wall_s"):
        vals = [r[key] for r in runs]
        point[key] = [min(vals), max(vals)]
    point["allreduce_s"] = runs[0]["allreduce_s"]
    point["alltoall_s"] = runs[0]["alltoall_s"]
    return point


def run(quick: bool) -> dict[str, Any]:
    gpus = GPUS[:2] if quick else GPUS
    repeats = 1 if quick else REPEATS
    points = []
    for n in gpus:
        points.append(_point("rail", n, [], repeats))
        points.append(_point("plain", n, ["--clos"], repeats))
    for n in FULL_GPUS[:1] if quick else FULL_GPUS:
        points.append(_point("rail --full", n, ["--full"], repeats))
    growth = {}
    for fabric in ("rail", "plain"):
        own = [p for p in points if p["fabric"] == fabric]
        lo, hi = own[0], own[-1]
        growth[fabric] = {
            "gpus": hi["gpus"] / lo["gpus"],
            "wall": hi["wall_s"][1] / max(lo["wall_s"][0], 1e-3),
            "rss": hi["peak_rss_mib"][1] / lo["peak_rss_mib"][0],
        }
    out: dict[str, Any] = {"points": points, "growth": growth}
    try:
        from testbed.flow.plots import cost_plot

        out["plot"] = str(cost_plot(points, PLOT))
    except ImportError as exc:  # matplotlib is the `plots` extra
        out["plot"] = f"not drawn: {exc}"
    return out
