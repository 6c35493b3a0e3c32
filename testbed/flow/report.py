"""What `flow-iteration` prints and writes: the collectives as nccl-tests rows, the iteration's
time and communication share, and how the network's links were loaded (the distribution of
their utilisation, by kind, and the hottest links), from the flow engine's `CollResult`s.

A link's utilisation during a collective is the bits it carried over its capacity times the
collective's time. The distribution is over every network link of the fabric (NIC, leaf and
aggregation links both ways; the scale-up domain's are not routed by the hierarchical
all-reduce's steps and are left out), idle ones included: where a collective computed one
group for `replicas` alike ones (the all-to-all's shortcut), its links stand for that many.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed.collective.metrics import fmt_size
from testbed.flow.collectives import CollResult
from testbed.flow.fabric import KIND_NAMES, SCALEUP, Fabric

HOTTEST = 10
PERCENTILES = (50, 90, 99)


@dataclass
class LinkLoad:
    collective: str
    links: int  # network links of the fabric
    idle: int  # of them, carrying nothing in this collective
    percentiles: dict[str, float]  # utilisation at p50, p90, p99 and the max (idle included)
    by_kind: dict[str, dict[str, float]]  # per link kind: links, mean and max utilisation
    hottest: list[dict[str, Any]]  # the most loaded links: name, kind, utilisation
    values: np.ndarray  # every loaded link's utilisation (each `weight` links)
    weight: int

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("values", "weight")}


def link_load(fab: Fabric, res: CollResult, time_s: float) -> LinkLoad:
    """The utilisation of the fabric's network links during `res`, which took `time_s`."""
    if res.link_bits is None:
        raise ValueError(f"{res.collective}: no per-link bits recorded")
    net = fab.link_kind != SCALEUP
    util = np.zeros(fab.n_links)
    util[net] = res.link_bits[net] / (fab.link_cap[net] * time_s)
    loaded = net & (res.link_bits > 0)
    n_net = int(net.sum())
    idle = max(0, n_net - int(loaded.sum()) * res.replicas)
    vals = util[loaded]
    pct = {f"p{p}": _weighted_percentile(vals, res.replicas, idle, p) for p in PERCENTILES}
    pct["max"] = float(vals.max(initial=0.0))
    by_kind = {}
    for kind in np.unique(fab.link_kind[net]):
        of_kind = fab.link_kind == kind
        total = int(of_kind.sum())
        on = loaded & of_kind
        by_kind[KIND_NAMES[kind]] = {
            "links": total,
            "mean": float(util[on].sum() * res.replicas / total),
            "max": float(util[on].max(initial=0.0)),
        }
    top = np.flatnonzero(loaded)[np.argsort(-vals, kind="stable")[:HOTTEST]]
    hottest = [
        {
            "link": fab.link_name(int(i)),
            "kind": KIND_NAMES[fab.link_kind[i]],
            "util": float(util[i]),
        }
        for i in top
    ]
    return LinkLoad(res.collective, n_net, idle, pct, by_kind, hottest, vals, res.replicas)


def _weighted_percentile(vals: np.ndarray, weight: int, zeros: int, p: float) -> float:
    """The p-th percentile of `vals` each counted `weight` times and `zeros` zeros."""
    total = len(vals) * weight + zeros
    if total == 0:
        return 0.0
    rank = p / 100 * (total - 1)
    if rank < zeros:
        return 0.0
    srt = np.sort(vals)
    return float(srt[min(len(srt) - 1, int((rank - zeros) // weight))])


def collective_rows(
    results: list[tuple[CollResult, float]], groups: list[str] | None = None
) -> str:
    """nccl-tests' columns for each (collective, its time under the scheme); `groups`: a
    first column naming each one's group."""
    first = f"{'group':>6} " if groups else ""
    head = (
        f"#{first}{'collective':>13} {'size/rank':>10} {'ranks':>7} {'time(ms)':>10} "
        f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'latency(ms)':>12} {'flows':>9}"
    )
    lines = [head]
    for i, (res, t) in enumerate(results):
        algbw = res.bytes_per_rank / t / 1e9
        busbw = res.busbw_at(t) / 8e9
        label = f"{groups[i]:>6} " if groups else ""
        lines.append(
            f" {label}{res.collective:>13} {fmt_size(int(res.bytes_per_rank)):>10} {res.ranks:>7} "
            f"{t * 1e3:>10.2f} {algbw:>12.2f} {busbw:>12.2f} {res.latency_s * 1e3:>12.3f} "
            f"{res.flows_computed:>9}"
        )
    return "\n".join(lines)


def load_lines(load: LinkLoad) -> list[str]:
    p = load.percentiles
    lines = [
        f"  {load.collective}: network links {load.links:,}, idle {load.idle:,} "
        f"({load.idle / max(1, load.links):.0%}); utilisation p50 {p['p50']:.0%}, "
        f"p90 {p['p90']:.0%}, p99 {p['p99']:.0%}, max {p['max']:.0%}"
    ]
    for kind, k in load.by_kind.items():
        lines.append(
            f"    {kind:<10} {k['links']:>10,} links: mean {k['mean']:.1%}, max {k['max']:.0%}"
        )
    hot = ", ".join(f"{h['link']} {h['util']:.0%}" for h in load.hottest[:5])
    lines.append(f"    hottest: {hot}")
    return lines
