"""Per-run metrics: FCT and slowdown by size bucket, collective bandwidths, goodput, counters.

Definitions:
- FCT: from a flow's start to the sender seeing its last packet acknowledged.
- ideal FCT: size * 8 / line rate + base RTT (the flow alone on an idle path);
  slowdown = FCT / ideal FCT (>= 1 up to measurement noise).
- algbw = bytes per rank / time; busbw as nccl-tests: all-reduce algbw * 2(n-1)/n,
  all-to-all algbw * (n-1)/n (time = slowest rank).
- goodput: bytes delivered intact / time from the run's start to the last delivery.
- Jain's fairness index of rates x_1..x_n: (sum x)^2 / (n sum x^2), 1 when all are equal,
  1/n when one takes everything; `window_fairness` takes it per window over the flows active
  for the whole window (the rate of a flow: bytes received in the window / its length).
- utilization of a link from arrivals: bytes received over it after the first arrival /
  (rate x time from the first arrival to the last).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from testbed.traffic.collective_plans import bus_factor

# Upper edges of the FCT size buckets, bytes (the last bucket is open).
SIZE_BUCKETS = (10_000, 100_000, 1_000_000, 10_000_000)
PERCENTILES = (50, 95, 99)
T = TypeVar("T")
COUNTER_KEYS = (
    "retransmits",
    "timeouts",
    "naks_sent",
    "cnps_sent",
    "cnps_received",
    "ecn_ce_seen",
    "int_echoes_sent",
    "tx_packets",
    "rx_data_packets",
    "tx_nobufs",
    "rx_kept",
    "reordered",  # PSN gaps whose missing packet came late: reordered, not lost
    "gaps_lost",
    "rate_hints",  # start rates the application handed its NIC (the proactive start)
    "pfc_holds",  # the emulation's transports: pauses of their NIC they held for
    "pfc_held_us",  # ... and for how long, microseconds
    "timers_deferred",  # the emulation's transports: steps a due timer waited for unread frames
)


def ideal_fct(size: int, line_rate_bps: float, base_rtt: float) -> float:
    return size * 8 / line_rate_bps + base_rtt


def bucket_label(lo: float, hi: float) -> str:
    def fmt(v: float) -> str:
        for unit, div in (("M", 1e6), ("K", 1e3)):
            if v >= div:
                return f"{v / div:g}{unit}"
        return f"{v:g}"

    return (
        f"<{fmt(hi)}" if lo == 0 else (f">={fmt(lo)}" if math.isinf(hi) else f"{fmt(lo)}-{fmt(hi)}")
    )


def _pcts(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=float)
    return {f"p{q}": float(np.percentile(arr, q)) for q in PERCENTILES}


def _bounds(edges: tuple[int, ...]) -> list[tuple[float, float]]:
    bounds = [0.0, *map(float, edges), math.inf]
    return list(zip(bounds, bounds[1:], strict=False))


def bucket_labels(edges: tuple[int, ...] = SIZE_BUCKETS) -> list[str]:
    """The size buckets' labels, smallest first."""
    return [bucket_label(lo, hi) for lo, hi in _bounds(edges)]


def by_size(
    items: Sequence[T], size: Callable[[T], int], edges: tuple[int, ...] = SIZE_BUCKETS
) -> list[tuple[str, list[T]]]:
    """`items` in the size buckets `edges` bound (`[lo, hi)` bytes), labelled, smallest
    first; empty buckets left out."""
    out = []
    for lo, hi in _bounds(edges):
        sel = [it for it in items if lo <= size(it) < hi]
        if sel:
            out.append((bucket_label(lo, hi), sel))
    return out


def fct_stats(
    flows: Iterable[Mapping[str, Any]],
    line_rate_bps: float,
    base_rtt: float,
    edges: tuple[int, ...] = SIZE_BUCKETS,
) -> dict[str, Any]:
    """FCT and slowdown percentiles per size bucket and overall, for completed flows."""
    done = [(int(f["size"]), float(f["fct"])) for f in flows if f.get("fct") is not None]
    buckets = [
        {
            "bucket": label,
            "flows": len(sel),
            "fct_s": _pcts([t for _, t in sel]),
            "slowdown": _pcts([t / ideal_fct(s, line_rate_bps, base_rtt) for s, t in sel]),
        }
        for label, sel in by_size(done, lambda f: f[0], edges)
    ]
    overall: dict[str, Any] = {"flows": len(done)}
    if done:
        overall["fct_s"] = _pcts([t for _, t in done])
        overall["slowdown"] = _pcts([t / ideal_fct(s, line_rate_bps, base_rtt) for s, t in done])
    return {
        "line_rate_bps": line_rate_bps,
        "base_rtt_s": base_rtt,
        "buckets": buckets,
        "all": overall,
    }


def collective_bw(kind: str, size: int, seconds: float, n: int) -> dict[str, float]:
    """algbw/busbw in bytes per second, nccl-tests definitions."""
    factor = bus_factor(kind, n)
    algbw = size / seconds
    return {
        "time_s": seconds,
        "algbw_Bps": algbw,
        "busbw_Bps": algbw * factor,
        "algbw_Gbps": algbw * 8e-9,
        "busbw_Gbps": algbw * factor * 8e-9,
    }


def counter_totals(counters: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {k: 0 for k in COUNTER_KEYS}
    drops: dict[str, int] = {}
    reports: dict[str, int] = {}  # Telemetry Reports the NIC sinks sent, by trigger
    suppressed: dict[str, int] = {}  # and made beyond their report budget, not sent
    transports: set[str] = set()  # the hosts' transport cores: native, reference
    for c in counters:
        if c.get("transport"):
            transports.add(str(c["transport"]))
        for k in COUNTER_KEYS:
            total[k] += int(c.get(k, 0))
        for reason, n in dict(c.get("drops", {})).items():
            drops[reason] = drops.get(reason, 0) + int(n)
        for why, n in dict(c.get("reports", {})).items():
            reports[why] = reports.get(why, 0) + int(n)
        for why, n in dict(c.get("reports_suppressed", {})).items():
            suppressed[why] = suppressed.get(why, 0) + int(n)
    total["drops"] = drops
    total["reports"] = reports
    total["reports_suppressed"] = suppressed
    total["transport"] = sorted(transports)
    return total


def goodput(received: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    ok = [r for r in received if r["ok"]]
    if not ok:
        return {"bytes": 0, "seconds": 0.0, "goodput_bps": 0.0}
    last = max(float(r["t_done"]) for r in ok)
    total = sum(int(r["bytes"]) for r in ok)
    return {"bytes": total, "seconds": last, "goodput_bps": total * 8 / last if last > 0 else 0.0}


def table(metrics: Mapping[str, Any]) -> str:
    """A plain-text rendering of a run's metrics."""
    lines = [f"workload: {metrics.get('workload')}  hosts: {metrics.get('hosts')}"]
    fct = metrics.get("fct")
    if fct and fct["buckets"]:
        lines.append(
            f"{'size':>12} {'flows':>6} {'fct p50':>10} {'p95':>10} {'p99':>10} "
            f"{'slow p50':>9} {'p95':>7} {'p99':>7}"
        )
        for b in [*fct["buckets"], {"bucket": "all", **fct["all"]}]:
            f, s = b["fct_s"], b["slowdown"]
            lines.append(
                f"{b['bucket']:>12} {b['flows']:>6} {f['p50'] * 1e3:>8.2f}ms "
                f"{f['p95'] * 1e3:>8.2f}ms {f['p99'] * 1e3:>8.2f}ms {s['p50']:>9.2f} "
                f"{s['p95']:>7.2f} {s['p99']:>7.2f}"
            )
    if "correct" in metrics:
        lines.append(
            f"result correct: {metrics['correct']} (max abs error {metrics['max_abs_err']})"
        )
    coll = metrics.get("collective")
    if coll:
        lines.append(
            f"time {coll['time_s'] * 1e3:.2f} ms  algbw {coll['algbw_Gbps']:.3f} Gb/s  "
            f"busbw {coll['busbw_Gbps']:.3f} Gb/s"
        )
    gp = metrics.get("goodput")
    if gp:
        lines.append(f"goodput {gp['goodput_bps'] / 1e6:.1f} Mb/s ({gp['bytes']} B)")
    c = metrics.get("counters")
    if c:
        lines.append("  ".join(f"{k}={c[k]}" for k in COUNTER_KEYS if k in c))
        if c.get("drops"):
            lines.append("drops: " + ", ".join(f"{k}={v}" for k, v in sorted(c["drops"].items())))
    return "\n".join(lines)


Arrivals = Mapping[Any, list[tuple[float, int]]]  # flow -> [(time s, frame bytes)], in order


def jain(rates: Iterable[float]) -> float:
    """Jain's fairness index; ValueError for no rates, or rates all zero or negative."""
    xs = [float(x) for x in rates]
    if not xs or any(x < 0 for x in xs) or not any(xs):
        raise ValueError(f"Jain's index needs non-negative rates, not all zero: {xs}")
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def window_fairness(arrivals: Arrivals, t0: float, window_s: float) -> list[float]:
    """Jain's index of the flows' received rates in each window [t0 + k w, t0 + (k+1) w) in
    which at least two flows are active (their first arrival at or before the window's start,
    their last at or after its end)."""
    if window_s <= 0:
        raise ValueError("the window must be positive")
    spans = {f: (a[0][0], a[-1][0]) for f, a in arrivals.items() if a}
    if not spans:
        return []
    end = max(last for _, last in spans.values())
    out = []
    k = 0
    while t0 + (k + 1) * window_s <= end:
        lo, hi = t0 + k * window_s, t0 + (k + 1) * window_s
        k += 1
        active = [f for f, (first, last) in spans.items() if first <= lo and last >= hi]
        if len(active) < 2:
            continue
        rates = [sum(b for t, b in arrivals[f] if lo <= t < hi) for f in active]
        if any(rates):
            out.append(jain(rates))
    return out


def link_utilization(arrivals: Arrivals, link_bps: float, t_from: float) -> float | None:
    """Utilization of the link every arrival crossed, from the first arrival at or after
    `t_from` to the last: the bytes that arrived after that first one / (its rate x the time
    between them). The first arrival's own bytes crossed the link before it, so they are not
    counted: a link that delivers back to back at its rate reads exactly 1, never more. None
    when fewer than two frames arrived after `t_from`."""
    after = sorted((t, b) for a in arrivals.values() for t, b in a if t >= t_from)
    if len(after) < 2 or after[-1][0] <= after[0][0]:
        return None
    sent = sum(b for _, b in after[1:])
    return sent * 8 / (link_bps * (after[-1][0] - after[0][0]))


def link_utilization_by_departures(
    arrivals: Arrivals,
    departures_ns: Mapping[Any, list[int | None]],
    link_bps: float,
    t_from: float,
    resolution_ns: int = 1000,
) -> float | None:
    """`link_utilization` timed by when the link's sender started each frame (the last hop's
    INT egress timestamps, `departures_ns`, in the order of `arrivals`) rather than when it
    arrived: the frames that arrived at or after `t_from`, the bytes of all but the last
    departure / (the rate x the time from the first departure to the last, plus the stamps'
    `resolution_ns`, by which truncation may shorten it). Where the sender is a process that
    wakes late and delivers overdue frames back to back (the emulation's switches), the
    arrivals bunch and read faster than the link, while the departures its traffic manager
    booked at the port's rate cannot: this never exceeds 1. None when fewer than two frames
    with a timestamp arrived after `t_from`."""
    sent = sorted(
        (d, b)
        for f, pts in arrivals.items()
        for (t, b), d in zip(pts, departures_ns.get(f, []), strict=False)
        if t >= t_from and d is not None
    )
    if len(sent) < 2 or sent[-1][0] <= sent[0][0]:
        return None
    span_s = (sent[-1][0] - sent[0][0] + resolution_ns) / 1e9
    return sum(b for _, b in sent[:-1]) * 8 / (link_bps * span_s)


def collective_times(results: list[dict[str, Any]]) -> list[float]:
    """A collective job's time per iteration as nccl-tests takes it: each rank's own time
    in the collective (its `coll` start to end), averaged over the ranks. nccl-tests times
    each rank's loop of back-to-back collectives and averages the ranks' times; the span from
    the first rank's start to the last rank's end (`iteration_times`) would count the ranks'
    skew again in every iteration when iterations run back to back."""
    iters = min(len(r["coll"]) for r in results)
    return [
        sum(r["coll"][i][1] - r["coll"][i][0] for r in results) / len(results) for i in range(iters)
    ]


def iteration_times(results: list[dict[str, Any]]) -> list[float]:
    """A collective job's iterations (every rank's `coll` (start, end) pairs): from the first
    rank's start to the last rank's end of each, in the job's seconds."""
    iters = min(len(r["coll"]) for r in results)
    return [
        max(r["coll"][i][1] for r in results) - min(r["coll"][i][0] for r in results)
        for i in range(iters)
    ]
