"""The comparison: one plain-text table, a results JSON, and the verdict the README quotes.

Columns (per scenario and scheme; emulated units, bytes are not scaled):
- `p50 queue`, `p99 queue`: percentiles of the queue the packets left behind at the
  bottleneck egress port (KB), from INT (the maximum is in the results JSON);
- `drops`: packets the switches received but did not send (all switches);
- `util`: bytes the bottleneck port sent / (its rate x the scenario's completion time);
- `FCT p50/p99`: FCT slowdown percentiles (incast and WebSearch flows);
- `busbw`: all-reduce bus bandwidth (Mb/s; x scale for the model's figure);
- `time`: completion (last flow, or the collective);
- with a lossless scheme in the table, `pauses` (PFC pause frames sent by the switches and
  NICs, XOFF) and `paused` (the time switch egress ports and NICs were held by pauses,
  summed over ports, in the table's time unit); then one line per victim / storm run: the
  victim flow's stalls, longest gap and FCT slowdown, and what the PFC watchdog did.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from testbed.bench import machine_description
from testbed.scenarios import SCHEMES, RunRecord, lossless


def _f(v: float | None, fmt: str, dash: str = "-") -> str:
    return dash if v is None else format(v, fmt)


def table(records: list[RunRecord], link_bps: float | None = None) -> str:
    """The comparison table. Bus bandwidth in Mb/s and times in s at the emulation's scale;
    with ports of 1 Gb/s and more (the twin's --scale 1: 400G) in Gb/s and ms."""
    fast = link_bps is not None and link_bps >= 1e9
    bw_div, bw_unit = (1e9, "Gb/s") if fast else (1e6, "Mb/s")
    t_mult, t_unit = (1e3, "ms") if fast else (1.0, "s")
    sw = max([6] + [len(r.scheme) for r in records])
    pfc = any(lossless(r.scheme) for r in records)
    head = (f"{'scenario':<10} {'scheme':<{sw}} {'bottleneck':<10} {'p50 queue':>9} "
            f"{'p99 queue':>9} {'drops':>6} {'util':>5} {'FCT p50':>8} {'FCT p99':>8} "
            f"{'busbw':>7} {'time':>6}")
    unit = (f"{'':<10} {'':<{sw}} {'':<10} {'KB':>9} {'KB':>9} {'pkts':>6} {'%':>5} "
            f"{'slowdown':>8} {'slowdown':>8} {bw_unit:>7} {t_unit:>6}")
    if pfc:
        head += f" {'pauses':>6} {'paused':>7}"
        unit += f" {'':>6} {t_unit:>7}"
    lines = [head, unit, "-" * len(head)]
    last = ""
    for r in sorted(records, key=lambda r: (_order(r.scenario), _order(r.scheme))):
        if last and r.scenario != last:
            lines.append("")
        last = r.scenario
        util = None if r.utilization is None else 100 * r.utilization
        busbw = None if r.busbw_bps is None else r.busbw_bps / bw_div
        note = "" if r.flows_completed == r.flows else f"  ({r.flows - r.flows_completed} " \
                                                       "unfinished)"
        if r.correct is False:
            note += "  (WRONG RESULT)"
        pfc_cols = f" {r.pauses:>6} {r.paused_s * t_mult:>7.2f}" if pfc else ""
        lines.append(
            f"{r.scenario:<10} {r.scheme:<{sw}} {r.bottleneck:<10} "
            f"{r.queue_p50_bytes / 1e3:>9.1f} {r.queue_p99_bytes / 1e3:>9.1f} {r.drops:>6} "
            f"{_f(util, '.0f'):>5} {_f(r.fct_slowdown_p50, '.2f'):>8} "
            f"{_f(r.fct_slowdown_p99, '.2f'):>8} {_f(busbw, '.2f'):>7} "
            f"{r.completion_s * t_mult:>6.2f}{pfc_cols}{note}")
    victims = [r for r in records if r.victim_stalls is not None]
    if victims:
        lines.append("")
        for r in sorted(victims, key=lambda r: (_order(r.scenario), _order(r.scheme))):
            lines.append(victim_line(r, t_mult, t_unit))
    return "\n".join(lines)


def victim_line(r: RunRecord, t_mult: float = 1.0, t_unit: str = "s") -> str:
    """A victim or storm run's victim flow and watchdog, in one line."""
    sd = "-" if r.victim_fct_slowdown is None else f"{r.victim_fct_slowdown:.2f}"
    gap = (r.victim_longest_gap_s or 0.0) * t_mult
    line = (f"{r.scenario:<10} {r.scheme:<9} victim flow: {r.victim_stalls} stalls, longest "
            f"gap {gap:.3f} {t_unit}, FCT slowdown {sd}")
    if lossless(r.scheme):
        drops = sum(d.get("watchdog_drops", 0) for d in r.pfc_by_port.values())
        line += (f"; PFC watchdog: {r.pfc_storms} storms, {r.pfc_restored} restored, "
                 f"{drops} packets dropped")
    return line


_ORDER = {"incast": 0, "allreduce": 1, "alltoall": 2, "twojob": 3, "websearch": 4,
          "victim": 5, "storm": 6,
          **{scheme: i for i, scheme in enumerate(SCHEMES)}}


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
                f"{_secs(t.completion_s, d.completion_s)}: ")
        line += "all hold" if not failed else (
            f"{', '.join(held) or 'none'} hold; NOT {', '.join(failed)}")
        out.append(line)
    out += lossless_verdict(records)
    return out


def lossless_verdict(records: list[RunRecord]) -> list[str]:
    """Issue 17's goals against the lossless baseline, per scenario: dcqcn+pfc loses
    nothing; TiTa (tita+pfc, else tita) has p99 queue <= 0.5x and p99 FCT slowdown <= 0.7x
    dcqcn+pfc's, and fewer victim-flow stalls."""
    out = []
    by = {(r.scenario, r.scheme): r for r in records}
    for scenario in sorted({r.scenario for r in records}, key=_order):
        d = by.get((scenario, "dcqcn+pfc"))
        if d is None:
            continue
        checks = {"dcqcn+pfc loses nothing": d.drops == 0}
        t = by.get((scenario, "tita+pfc")) or by.get((scenario, "tita"))
        desc = f"{scenario}: dcqcn+pfc drops {d.drops}"
        if t is not None:
            desc += (f"; {t.scheme} vs dcqcn+pfc p99 queue {t.queue_p99_bytes / 1e3:.1f} vs "
                     f"{d.queue_p99_bytes / 1e3:.1f} KB")
            checks["p99 queue <= 0.5x"] = t.queue_p99_bytes <= 0.5 * d.queue_p99_bytes
            if t.fct_slowdown_p99 is not None and d.fct_slowdown_p99 is not None:
                desc += f", FCT p99 {t.fct_slowdown_p99:.2f} vs {d.fct_slowdown_p99:.2f}"
                checks["FCT p99 <= 0.7x"] = t.fct_slowdown_p99 <= 0.7 * d.fct_slowdown_p99
            if t.victim_stalls is not None and d.victim_stalls is not None:
                desc += f", victim stalls {t.victim_stalls} vs {d.victim_stalls}"
                checks["fewer victim stalls"] = t.victim_stalls < d.victim_stalls
        held = [k for k, v in checks.items() if v]
        failed = [k for k, v in checks.items() if not v]
        out.append(desc + ": " + ("all hold" if not failed else
                                  f"{', '.join(held) or 'none'} hold; NOT {', '.join(failed)}"))
    return out


def _secs(a: float, b: float) -> str:
    """Two times in the unit the larger calls for (s at the emulation's scale, the model's
    microseconds at its own speed)."""
    m = max(a, b)
    k, unit = (1.0, "s") if m >= 1 else (1e3, "ms") if m >= 1e-3 else (1e6, "us")
    return f"{a * k:.2f} vs {b * k:.2f} {unit}"


def results_doc(records: list[RunRecord], setup: dict[str, Any],
                machine_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The results file. Only `date` and `machine` depend on when and where it ran (the
    twin's files are otherwise byte-identical for the same inputs and seed)."""
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {**machine_description(), **(machine_extra or {})},
        "setup": setup,
        "table": table(records, setup.get("link_bps")),
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


def write_results(path: Path, records: list[RunRecord], setup: dict[str, Any],
                  machine_extra: dict[str, Any] | None = None) -> None:
    path.write_text(json.dumps(results_doc(records, setup, machine_extra), indent=1) + "\n")


# ---- comparing runs -------------------------------------------------------------------------

COMPARED = (  # (label, results field, scale to the shown unit)
    ("p99 queue KB", "queue_p99_bytes", 1e-3),
    ("drops", "drops", 1.0),
    ("util %", "utilization", 100.0),
    ("FCT p50", "fct_slowdown_p50", 1.0),
    ("FCT p99", "fct_slowdown_p99", 1.0),
    ("busbw Mb/s", "busbw_bps", 1e-6),
    ("time s", "completion_s", 1.0),
)


def load_results(path: Path) -> dict[str, Any]:
    """A run's results.json (a run dir or the file itself)."""
    p = path / "results.json" if path.is_dir() else path
    try:
        doc: dict[str, Any] = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{p}: not a results file ({exc})") from None
    if "runs" not in doc or "setup" not in doc:
        raise ValueError(f"{p}: not a results file (no runs/setup)")
    return doc


def compare(paths: list[Path], median: bool = False) -> str:
    """Two or more runs side by side: every (scenario, scheme) they share and every metric,
    with each run's ratio to the first. With `median`, the runs after the first are repeats
    of one experiment: the first is compared with their median, and their min-max is shown."""
    if len(paths) < 2:
        raise ValueError("compare needs at least two runs")
    docs = [load_results(p) for p in paths]
    names = [chr(ord("A") + i) for i in range(len(docs))]
    lines = []
    for n, p, d in zip(names, paths, docs, strict=True):
        st = d["setup"]
        lines.append(f"{n}: {p}  ({st.get('engine', 'emu')}, {st.get('topology')}, scale "
                     f"1/{st.get('scale', 0):g}, {d.get('date', '')})")
    by = [{(r["scenario"], r["scheme"]): r for r in d["runs"]} for d in docs]
    cells = [k for k in by[0] if all(k in b for b in by[1:])]
    cells.sort(key=lambda k: (_order(k[0]), _order(k[1])))
    if median:
        rest = f"{names[1]}..{names[-1]}"
        head = (f"{'scenario':<10} {'scheme':<6} {'metric':<12} {'A':>10} "
                f"{'median ' + rest:>14} {'min-max ' + rest:>22} {'A/median':>8}")
    else:
        head = f"{'scenario':<10} {'scheme':<6} {'metric':<12} " + " ".join(
            f"{n:>10}" for n in names) + " " + " ".join(f"{n + '/A':>6}" for n in names[1:])
    lines += ["", head, "-" * len(head)]
    for scenario, scheme in cells:
        for label, key, k in COMPARED:
            vals = [b[(scenario, scheme)].get(key) for b in by]
            if all(v is None for v in vals):
                continue
            if median:
                reps = sorted(v * k for v in vals[1:] if v is not None)
                a = None if vals[0] is None else vals[0] * k
                med = statistics.median(reps) if reps else None
                rng = f"{reps[0]:.4g}-{reps[-1]:.4g}" if reps else "-"
                ratio = f"{a / med:.2f}" if a is not None and med else "-"
                lines.append(f"{scenario:<10} {scheme:<6} {label:<12} "
                             f"{'-' if a is None else f'{a:.4g}':>10} "
                             f"{'-' if med is None else f'{med:.4g}':>14} {rng:>22} "
                             f"{ratio:>8}")
                continue
            shown = " ".join(f"{'-':>10}" if v is None else f"{v * k:>10.4g}" for v in vals)
            ratios = " ".join(
                f"{'-':>6}" if v is None or not vals[0] else f"{v / vals[0]:>6.2f}"
                for v in vals[1:])
            lines.append(f"{scenario:<10} {scheme:<6} {label:<12} {shown} {ratios}")
        lines.append("")
    return "\n".join(lines).rstrip()
