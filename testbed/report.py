"""The comparison: one plain-text table, a results JSON, and the verdict the README quotes.

Columns (per scenario and scheme; emulated units, bytes are not scaled):
- `p50 queue`, `p99 queue`: percentiles of the queue the packets left behind at the
  bottleneck egress port (KB), from INT (the maximum is in the results JSON);
- `drops`: packets the switches received but did not send (all switches);
- `util`: bytes the bottleneck port sent / (its rate x the scenario's completion time);
- `FCT p50/p99`: FCT slowdown percentiles (incast and WebSearch flows);
- `busbw`: all-reduce bus bandwidth (Mb/s; x scale for the model's figure);
- `time`: completion (last flow, or the collective).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from testbed.bench import machine_description
from testbed.scenarios import RunRecord


def _f(v: float | None, fmt: str, dash: str = "-") -> str:
    return dash if v is None else format(v, fmt)


def table(records: list[RunRecord]) -> str:
    head = (f"{'scenario':<10} {'scheme':<6} {'bottleneck':<10} {'p50 queue':>9} "
            f"{'p99 queue':>9} {'drops':>6} {'util':>5} {'FCT p50':>8} {'FCT p99':>8} "
            f"{'busbw':>7} {'time':>6}")
    unit = (f"{'':<10} {'':<6} {'':<10} {'KB':>9} {'KB':>9} {'pkts':>6} {'%':>5} "
            f"{'slowdown':>8} {'slowdown':>8} {'Mb/s':>7} {'s':>6}")
    lines = [head, unit, "-" * len(head)]
    last = ""
    for r in sorted(records, key=lambda r: (_order(r.scenario), _order(r.scheme))):
        if last and r.scenario != last:
            lines.append("")
        last = r.scenario
        util = None if r.utilization is None else 100 * r.utilization
        busbw = None if r.busbw_bps is None else r.busbw_bps / 1e6
        note = "" if r.flows_completed == r.flows else f"  ({r.flows - r.flows_completed} " \
                                                       "unfinished)"
        if r.correct is False:
            note += "  (WRONG RESULT)"
        lines.append(
            f"{r.scenario:<10} {r.scheme:<6} {r.bottleneck:<10} "
            f"{r.queue_p50_bytes / 1e3:>9.1f} {r.queue_p99_bytes / 1e3:>9.1f} {r.drops:>6} "
            f"{_f(util, '.0f'):>5} {_f(r.fct_slowdown_p50, '.2f'):>8} "
            f"{_f(r.fct_slowdown_p99, '.2f'):>8} {_f(busbw, '.2f'):>7} "
            f"{r.completion_s:>6.2f}{note}")
    return "\n".join(lines)


_ORDER = {"incast": 0, "allreduce": 1, "websearch": 2, "none": 0, "dcqcn": 1, "tita": 2}


def _order(name: str) -> int:
    return _ORDER.get(name, 9)


def verdict(records: list[RunRecord]) -> list[str]:
    """TiTa against DCQCN on every scenario: lower p99 queue, no loss, no worse completion
    time? One line per scenario, saying which held and which did not."""
    out = []
    by = {(r.scenario, r.scheme): r for r in records}
    for scenario in sorted({r.scenario for r in records}, key=_order):
        t, d = by.get((scenario, "tita")), by.get((scenario, "dcqcn"))
        if t is None or d is None:
            continue
        checks = {
            # within 10 %: the same queue (e.g. both at the buffer's limit)
            "lower p99 queue": t.queue_p99_bytes < 0.9 * d.queue_p99_bytes,
            "no loss": t.drops == 0,
            "no worse completion time": t.completion_s <= d.completion_s * 1.05,
        }
        held = [k for k, v in checks.items() if v]
        failed = [k for k, v in checks.items() if not v]
        line = (f"{scenario}: TiTa vs DCQCN p99 queue {t.queue_p99_bytes / 1e3:.1f} vs "
                f"{d.queue_p99_bytes / 1e3:.1f} KB, drops {t.drops} vs {d.drops}, time "
                f"{t.completion_s:.2f} vs {d.completion_s:.2f} s: ")
        line += "all hold" if not failed else (
            f"{', '.join(held) or 'none'} hold; NOT {', '.join(failed)}")
        out.append(line)
    return out


def results_doc(records: list[RunRecord], setup: dict[str, Any]) -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_description(),
        "setup": setup,
        "table": table(records),
        "verdict": verdict(records),
        "runs": [r.summary() for r in records],
        "series": [{"scheme": r.scheme, "scenario": r.scenario, "bottleneck": r.bottleneck,
                    "queue_bytes": r.queue_series, "rate_bps": r.rate_series,
                    "fct_slowdowns": r.slowdowns} for r in records],
    }


def records_from_results(doc: dict[str, Any]) -> list[RunRecord]:
    """The records of a results file (summary and series), e.g. to plot them again."""
    series = {(s["scheme"], s["scenario"]): s for s in doc["series"]}
    out = []
    for run in doc["runs"]:
        s = series[(run["scheme"], run["scenario"])]
        out.append(RunRecord(**run, slowdowns=s["fct_slowdowns"], queue_series=s["queue_bytes"],
                             rate_series=s["rate_bps"]))
    return out


def write_results(path: Path, records: list[RunRecord], setup: dict[str, Any]) -> None:
    path.write_text(json.dumps(results_doc(records, setup), indent=1) + "\n")
