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


def loss_plot(cells: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """The loss sweep (testbed.collective.loss.summary): busbw of the all-reduce and the
    training iteration's time against the loss per link, one line per retransmission
    scheme, median over the seeds with min-max bars."""
    panels = [
        ("allreduce", "busbw_Bps", 1e-9, "all-reduce busbw (GB/s)"),
        ("training", "iter_s", 1e6, "training iteration (us)"),
    ]
    panels = [p for p in panels if any(c["workload"] == p[0] for c in cells)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    losses = sorted({c["loss"] for c in cells})
    names = {"gbn": "go-back-N", "sr": "selective repeat"}
    for ax, (workload, key, unit, label) in zip(axes[0], panels, strict=True):
        for rt in ("gbn", "sr"):
            cs = sorted(
                (c for c in cells if c["workload"] == workload and c["retransmit"] == rt),
                key=lambda c: c["loss"],
            )
            cs = [c for c in cs if key in c]
            if not cs:
                continue
            x = [losses.index(c["loss"]) for c in cs]
            y = [c[key]["median"] * unit for c in cs]
            lo = [y_ - c[key]["min"] * unit for y_, c in zip(y, cs, strict=True)]
            hi = [c[key]["max"] * unit - y_ for y_, c in zip(y, cs, strict=True)]
            ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, label=names[rt])
        ax.set_xticks(range(len(losses)), [f"{v * 100:g}%" for v in losses])
        ax.set_xlabel("random loss per link")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
