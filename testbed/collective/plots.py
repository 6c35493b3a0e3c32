"""The busbw-vs-size plot of a sweep (matplotlib, no display): one line per (algorithm,
schedule), log-2 sizes, busbw in GB/s of the model, with the K x NIC line for reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from testbed.collective.metrics import fmt_size  # noqa: E402


def busbw_plot(rows: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    lines: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        lines.setdefault((r["collective"], r["algorithm"], r["schedule"]), []).append(r)
    peak = None
    for (coll, alg, sched), rs in lines.items():
        rs = sorted(rs, key=lambda r: r["size"])
        ax.plot(
            [r["size"] for r in rs],
            [r["busbw_Bps"] / 1e9 for r in rs],
            marker="o",
            label=f"{coll} {alg} ({sched})",
        )
        r0 = rs[0]
        if r0["efficiency"] > 0:
            peak = r0["busbw_Bps"] / r0["efficiency"] / 1e9
    if peak:
        ax.axhline(peak, color="grey", linestyle="--", linewidth=1, label="K x NIC rate")
    ax.set_xscale("log", base=2)
    sizes = sorted({r["size"] for r in rows})
    ax.set_xticks(sizes, [fmt_size(s) for s in sizes])
    ax.set_xlabel("message size per rank")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
