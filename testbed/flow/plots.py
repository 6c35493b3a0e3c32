"""The flow engine's plots (matplotlib, no display): `flow-iteration`'s (where the iteration's
time goes, and the distribution of the network links' utilisation in each collective, idle
links included) and `make bench`'s cost of one iteration against the GPUs
(testbed/benchmarks/flow_scale.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from testbed.experiment.plots import save_figure  # noqa: E402
from testbed.flow.report import LinkLoad  # noqa: E402


def iteration_plot(
    parts: dict[str, float], loads: list[LinkLoad], path: Path, title: str = ""
) -> Path:
    """`parts`: seconds of the iteration by what (compute, each collective), in order."""
    fig, (bar, cdf) = plt.subplots(1, 2, figsize=(10, 3.8), width_ratios=(1, 1.6))
    left = 0.0
    for name, s in parts.items():
        bar.barh(0, s * 1e3, left=left, label=f"{name} {s * 1e3:.2f} ms")
        left += s * 1e3
    bar.set_yticks([])
    bar.set_xlabel("iteration time (ms)")
    bar.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=1)
    for load in loads:
        vals = np.sort(load.values)
        total = load.idle + len(vals) * load.weight
        x = np.concatenate([[0.0], vals]) * 100
        y = (load.idle + np.arange(len(vals) + 1) * load.weight) / total
        cdf.step(x, y, where="post", label=f"{load.collective} (idle {load.idle / load.links:.0%})")
    cdf.set_xlabel("link utilisation during the collective (%)")
    cdf.set_ylabel("share of network links")
    cdf.set_xlim(0, 105)
    cdf.set_ylim(0, 1.01)
    cdf.grid(alpha=0.3)
    cdf.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)


def cost_plot(points: list[dict[str, Any]], path: Path) -> Path:
    """Wall time and peak RSS of one iteration against the GPUs, per fabric (min-max bars)."""
    fig, (wall, rss) = plt.subplots(1, 2, figsize=(10, 3.8))
    for fabric in dict.fromkeys(p["fabric"] for p in points):
        own = [p for p in points if p["fabric"] == fabric]
        x = [p["gpus"] for p in own]
        for ax, key in ((wall, "wall_s"), (rss, "peak_rss_mib")):
            lo = np.array([p[key][0] for p in own])
            hi = np.array([p[key][1] for p in own])
            ax.errorbar(x, (lo + hi) / 2, yerr=(hi - lo) / 2, marker="o", capsize=3, label=fabric)
    for ax, label in ((wall, "wall time of the computation (s)"), (rss, "peak RSS (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(
        "flow engine: one iteration (DP ring all-reduce 1 GiB, EP all-to-all 256 MiB)", fontsize=9
    )
    return save_figure(fig, path)
