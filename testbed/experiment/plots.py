"""PNG plots of a suite run (matplotlib, no display needed):

- `queue.png`: queue occupancy at each scenario's bottleneck over time, one panel per
  (scenario, scheme), same scale along a row;
- `rates.png`: every flow's NIC rate over time (the agents' WatchRates), for the incast and
  the all-reduce, one panel per scheme;
- `fct_cdf.png`: the CDF of FCT slowdown per scheme (incast and WebSearch flows);
- `summary.png`: each scenario's completion time per scheme, the median of its repetitions
  with their range: every engine has it (the flow engine no other).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from testbed.experiment.suite import RunRecord

# (in the plots' column order: a lossless scheme beside its lossy one)
COLORS = {
    "none": "tab:red",
    "dcqcn": "tab:blue",
    "dcqcn+pfc": "tab:cyan",
    "tita": "tab:green",
    "tita-reactive": "tab:gray",
    "tita+pfc": "tab:brown",
    "hpcc": "tab:olive",
    "timely": "tab:purple",
    "swift": "tab:orange",
}
TITLES = {
    "none": "no CC",
    "dcqcn": "DCQCN",
    "tita": "TiTa",
    "tita-reactive": "TiTa, reactive",
    "hpcc": "HPCC",
    "timely": "TIMELY",
    "swift": "Swift",
    "dcqcn+pfc": "DCQCN+PFC",
    "tita+pfc": "TiTa+PFC",
}


def _pyplot() -> Any:
    """matplotlib's pyplot without a display (the `plots` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> Path:
    """Lay a figure out, write it (110 dpi, its folder made) and close it: every plot's end."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _gaps(t: list[float], v: list[float], gap_s: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """The samples with a break wherever no packet left for `gap_s`: the queue between two
    departures is not known, so no line is drawn across."""
    ts, vs = np.asarray(t, dtype=float), np.asarray(v, dtype=float)
    if len(ts) < 2:
        return ts, vs
    cut = np.nonzero(np.diff(ts) > gap_s)[0] + 1
    return np.insert(ts, cut, np.nan), np.insert(vs, cut, np.nan)


def _grid(records: list[RunRecord], scenarios: list[str]) -> tuple[list[str], list[str]]:
    schemes = [s for s in COLORS if any(r.scheme == s for r in records)]
    scen = [s for s in scenarios if any(r.scenario == s for r in records)]
    return schemes, scen


def queue_plot(records: list[RunRecord], path: Path, line_rate_bps: float) -> Path | None:
    plt = _pyplot()
    schemes, scen = _grid(records, ["incast", "allreduce", "websearch"])
    if not scen:
        return None
    by = {(r.scenario, r.scheme): r for r in records}
    fig, axes = plt.subplots(
        len(scen),
        len(schemes),
        figsize=(4.2 * len(schemes), 2.6 * len(scen)),
        squeeze=False,
        sharey="row",
    )
    for i, sc in enumerate(scen):
        for j, sch in enumerate(schemes):
            ax = axes[i][j]
            r = by.get((sc, sch))
            if r is None:
                ax.set_visible(False)
                continue
            t, v = _gaps(r.queue_series.get("t", []), r.queue_series.get("v", []))
            ax.plot(t, v / 1e3, lw=0.8, marker=".", ms=1.5, color=COLORS[sch])
            ax.axhline(r.queue_p99_bytes / 1e3, ls="--", lw=0.7, color="k")
            ax.set_title(
                f"{sc}, {TITLES[sch]} at {r.bottleneck}: p99 "
                f"{r.queue_p99_bytes / 1e3:.0f} KB, drops {r.drops}",
                fontsize=9,
            )
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel("queue (KB)", fontsize=8)
            if i == len(scen) - 1:
                ax.set_xlabel("time (s)")
    fig.suptitle(
        f"Queue occupancy at the bottleneck (INT, per departing packet); links "
        f"{line_rate_bps / 1e6:g} Mb/s",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def rates_plot(records: list[RunRecord], path: Path, nic_bps: float) -> Path | None:
    plt = _pyplot()
    schemes, scen = _grid(records, ["incast", "allreduce"])
    if not scen:
        return None
    by = {(r.scenario, r.scheme): r for r in records}
    fig, axes = plt.subplots(
        len(scen),
        len(schemes),
        figsize=(4.2 * len(schemes), 2.6 * len(scen)),
        squeeze=False,
        sharey=True,
    )
    for i, sc in enumerate(scen):
        for j, sch in enumerate(schemes):
            ax = axes[i][j]
            r = by.get((sc, sch))
            if r is None:
                ax.set_visible(False)
                continue
            end = max(
                r.completion_s,
                max((max(s["t"]) for s in r.rate_series.values() if s["t"]), default=0.0),
            )
            if not r.rate_series:
                # no rate law acts: every flow runs at the line rate
                ax.plot([0, end], [nic_bps / 1e6] * 2, color="0.4", lw=1)
                ax.text(
                    0.02,
                    0.5,
                    "no rate changes:\nflows at line rate",
                    transform=ax.transAxes,
                    fontsize=8,
                )
            for name, s in sorted(r.rate_series.items()):
                stop = s["end"][0] if s.get("end") else end
                t = [*s["t"], stop]
                v = [*s["v"], s["v"][-1]]
                ax.step(t, np.asarray(v) / 1e6, where="post", lw=0.8, label=name)
            title = f"{sc}, {TITLES[sch]}"
            if r.fairness_min is not None:
                title += f": Jain min {r.fairness_min:.2f} (p50 {r.fairness_p50:.2f})"
            if r.util_after_2t is not None:
                title += f", util>2T {r.util_after_2t:.0%}"
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel("NIC rate per flow (Mb/s)", fontsize=8)
            if i == len(scen) - 1:
                ax.set_xlabel("time (s)")
    fig.suptitle("Per-flow sending rate set by the NIC (agents' WatchRates)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fct_cdf_plot(records: list[RunRecord], path: Path) -> Path | None:
    plt = _pyplot()
    schemes, scen = _grid(records, ["incast", "websearch"])
    if not scen:
        return None
    fig, axes = plt.subplots(1, len(scen), figsize=(5 * len(scen), 3.4), squeeze=False)
    for i, sc in enumerate(scen):
        ax = axes[0][i]
        for sch in schemes:
            r = next((r for r in records if r.scenario == sc and r.scheme == sch), None)
            if r is None or not r.slowdowns:
                continue
            x = np.sort(np.asarray(r.slowdowns))
            y = np.arange(1, len(x) + 1) / len(x)
            ax.step(
                x,
                y,
                where="post",
                color=COLORS[sch],
                label=f"{TITLES[sch]} (p99 {r.fct_slowdown_p99:.1f})",
            )
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_xlabel("FCT slowdown")
        ax.set_ylabel("CDF")
        ax.set_title(sc, fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def summary_plot(records: list[RunRecord], path: Path) -> Path | None:
    """One panel per scenario: each scheme's completion time, a bar at the median of its
    repetitions and a line over their range (runs that failed are left out, and said)."""
    from testbed.experiment.report import cells

    done = [r for r in records if not r.error and r.completion_s > 0]
    if not done:
        return None
    plt = _pyplot()
    by = cells(done)
    scen = list(dict.fromkeys(sc for sc, _ in by))
    fig, axes = plt.subplots(1, len(scen), figsize=(3.4 * len(scen), 3.2), squeeze=False)
    for ax, sc in zip(axes[0], scen, strict=True):
        schemes = [s for s in COLORS if (sc, s) in by]
        times = [[r.completion_s for r in by[(sc, s)]] for s in schemes]
        x = np.arange(len(schemes))
        med = np.array([np.median(t) for t in times])
        lo = med - np.array([min(t) for t in times])
        hi = np.array([max(t) for t in times]) - med
        top = float(med.max())
        unit, k = ("us", 1e6) if top < 1e-3 else ("ms", 1e3) if top < 1 else ("s", 1.0)
        ax.bar(x, med * k, color=[COLORS[s] for s in schemes], yerr=[lo * k, hi * k], capsize=3)
        ax.set_xticks(x, [TITLES[s] for s in schemes], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"completion ({unit})", fontsize=8)
        failed = sum(1 for r in records if r.scenario == sc and (r.error or r.completion_s <= 0))
        ax.set_title(sc + (f" ({failed} failed, left out)" if failed else ""), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Completion time per scheme (median, min-max over repetitions)", fontsize=10)
    return save_figure(fig, path)


def replot(results: Path) -> list[Path]:
    """The plots again, from a run's results.json (next to it)."""
    import json

    from testbed.experiment.report import records_from_results

    doc = json.loads(results.read_text())
    setup = doc["setup"]
    return write_plots(
        records_from_results(doc), results.parent, setup["link_bps"], setup["nic_bps"]
    )


def write_plots(
    records: list[RunRecord], out: Path, line_rate_bps: float, nic_bps: float
) -> list[Path]:
    """The plots the records have data for: of a suite run with repetitions, each
    (scenario, scheme)'s repetition with the median completion time. None, said on stderr,
    where matplotlib (the `plots` extra) is not installed: the figures are in results.json
    all the same."""
    from testbed.experiment.report import representative

    try:
        _pyplot()
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] != "matplotlib":
            raise
        print(
            "plots: none (matplotlib is not installed: pip install 'xingmai[plots]')",
            file=sys.stderr,
        )
        return []

    every = records
    # the packet engines' records carry queues, rates and FCTs; a fluid model's do not
    # (the flow engine's: no INT, no queue samples), and has the summary only
    records = representative([r for r in records if r.int_packets or r.queue_samples])
    made = [
        queue_plot(records, out / "queue.png", line_rate_bps) if records else None,
        rates_plot(records, out / "rates.png", nic_bps) if records else None,
        fct_cdf_plot(records, out / "fct_cdf.png") if records else None,
        summary_plot(every, out / "summary.png"),
    ]
    return [p for p in made if p is not None]


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["--help"]:
        if arg.startswith("-"):
            print("usage: python -m testbed.experiment.plots RUN_DIR/results.json ...")
            break
        for made in replot(Path(arg)):
            print(made)
