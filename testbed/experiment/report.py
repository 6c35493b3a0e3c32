"""The comparison: one plain-text table, a results JSON, and the verdict the README quotes.

Columns (per scenario and scheme; emulated units, bytes are not scaled):
- `p50 queue`, `p99 queue`: percentiles of the queue the packets left behind at the
  bottleneck egress port (KB), from INT (the maximum is in the results JSON);
- `drops`: packets the switches received but did not send (all switches);
- `util`: bytes the bottleneck port sent / (its rate x the scenario's completion time);
- `util>2T`, `Jain min`: the incast's, at the receiver's downlink: its utilization after the
  first 2 T (from the arrivals at the receiver) and the worst window's Jain fairness index of
  the flows' received rates (windows of 10 T with >= 2 flows active);
- `FCT p50/p99`: FCT slowdown percentiles (incast and WebSearch flows);
- `busbw`: all-reduce bus bandwidth (Mb/s; x scale for the model's figure);
- `time`: completion (last flow, or the collective);
- with a lossless scheme in the table, `pauses` (PFC pause frames sent by the switches and
  NICs, XOFF) and `paused` (the time switch egress ports and NICs were held by pauses,
  summed over ports, in the table's time unit); then one line per victim / storm run: the
  victim flow's stalls, longest gap and FCT slowdown, and what the PFC watchdog did.

A suite run with `--repeat N` has N records per (scenario, scheme) (`RunRecord.repetition`);
every cell then shows the median over them with the range, `median [min-max]`, and the
verdict calls a difference only where the ranges do not overlap. One repetition is the same
with ranges of one point.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.experiment.machine import provenance
from testbed.experiment.schemes import SCHEMES, lossless
from testbed.experiment.suite import RunRecord
from testbed.faults import Fault


@dataclass(frozen=True)
class Spread:
    """A figure over repetitions: median and range."""

    lo: float
    med: float
    hi: float

    @staticmethod
    def of(values: Iterable[float | None]) -> Spread | None:
        vals = sorted(v for v in values if v is not None)
        if not vals:
            return None
        return Spread(vals[0], statistics.median(vals), vals[-1])

    def scaled(self, k: float) -> Spread:
        return Spread(self.lo * k, self.med * k, self.hi * k)

    def show(self, fmt: str) -> str:
        """`median` for one point, else `median [min-max]`."""
        med = format(self.med, fmt)
        lo, hi = format(self.lo, fmt), format(self.hi, fmt)
        return med if lo == hi else f"{med} [{lo}-{hi}]"


def below(a: Spread, b: Spread, k: float = 1.0) -> str:
    """Is `a` below `k` x `b`? "holds" where a's range lies wholly below k x b's, "NOT" where
    wholly above, else "within noise" (the ranges overlap or touch)."""
    if a.hi < k * b.lo:
        return "holds"
    if a.lo > k * b.hi:
        return "NOT"
    return "within noise"


def cells(records: list[RunRecord]) -> dict[tuple[str, str], list[RunRecord]]:
    """The records per (scenario, scheme), in table order, repetitions in their order."""
    out: dict[tuple[str, str], list[RunRecord]] = {}
    for r in sorted(records, key=lambda r: (_order(r.scenario), _order(r.scheme), r.repetition)):
        out.setdefault((r.scenario, r.scheme), []).append(r)
    return out


def representative(records: list[RunRecord]) -> list[RunRecord]:
    """One record per (scenario, scheme): the repetition with the median completion time
    (the lower of the middle two), e.g. for the plots."""
    out = []
    for reps in cells(records).values():
        ordered = sorted(reps, key=lambda r: (r.completion_s, r.repetition))
        out.append(ordered[(len(ordered) - 1) // 2])
    return out


def _spread(reps: list[RunRecord], get: Callable[[RunRecord], float | None]) -> Spread | None:
    return Spread.of(get(r) for r in reps)


def table(records: list[RunRecord], link_bps: float | None = None, markdown: bool = False) -> str:
    """The comparison table. Bus bandwidth in Mb/s and times in s at the emulation's scale;
    with ports of 1 Gb/s and more (the twin's --scale 1: 400G) in Gb/s and ms. With several
    repetitions of a cell, `median [min-max]` over them. `markdown`: as a Markdown table
    (the docs' tables), the victim lines under it."""
    fast = link_bps is not None and link_bps >= 1e9
    bw_div, bw_unit = (1e9, "Gb/s") if fast else (1e6, "Mb/s")
    t_mult, t_unit = (1e3, "ms") if fast else (1.0, "s")

    def util(r: RunRecord) -> float | None:
        return None if r.utilization is None else 100 * r.utilization

    def util2t(r: RunRecord) -> float | None:
        return None if r.util_after_2t is None else 100 * r.util_after_2t

    def busbw(r: RunRecord) -> float | None:
        return None if r.busbw_bps is None else r.busbw_bps / bw_div

    # (head, unit, value in the shown unit, format)
    columns: list[tuple[str, str, Callable[[RunRecord], float | None], str]] = [
        ("p50 queue", "KB", lambda r: r.queue_p50_bytes / 1e3, ".1f"),
        ("p99 queue", "KB", lambda r: r.queue_p99_bytes / 1e3, ".1f"),
        ("drops", "pkts", lambda r: r.drops, ".0f"),
        ("util", "%", util, ".0f"),
        ("util>2T", "%", util2t, ".0f"),
        ("Jain", "min", lambda r: r.fairness_min, ".2f"),
        ("FCT p50", "slowdown", lambda r: r.fct_slowdown_p50, ".2f"),
        ("FCT p99", "slowdown", lambda r: r.fct_slowdown_p99, ".2f"),
        ("busbw", bw_unit, busbw, ".2f"),
        ("time", t_unit, lambda r: r.completion_s * t_mult, ".2f"),
    ]
    if any(lossless(r.scheme) for r in records):
        columns += [
            ("pauses", "", lambda r: r.pauses, ".0f"),
            ("paused", t_unit, lambda r: r.paused_s * t_mult, ".2f"),
        ]
    rows: list[tuple[str, list[str], str]] = []  # (scenario, cells, note)
    for (scenario, scheme), reps in cells(records).items():
        shown = [scenario, scheme, representative(reps)[0].bottleneck]
        for _, _, get, fmt in columns:
            s = _spread(reps, get)
            shown.append("-" if s is None else s.show(fmt))
        unfinished = sum(r.flows - r.flows_completed for r in reps)
        note = f"  ({unfinished} unfinished)" if unfinished else ""
        failed = sum(1 for r in reps if r.error)
        if failed:
            note += f"  (FAILED {failed} of {len(reps)}: {reps[0].error or 'see results.json'})"
        if any(r.correct is False for r in reps):
            note += "  (WRONG RESULT)"
        rows.append((scenario, shown, note))
    head = ["scenario", "scheme", "bottleneck", *(c[0] for c in columns)]
    unit = ["", "", "", *(c[1] for c in columns)]
    victims = [(k, reps) for k, reps in cells(records).items() if reps[0].victim_stalls is not None]
    if markdown:
        titles = [f"{h} ({u})" if u else h for h, u in zip(head, unit, strict=True)]
        md = ["| " + " | ".join([*titles, "note"]) + " |"]
        md.append("| " + " | ".join(["---"] * 3 + ["---:"] * (len(head) - 3) + ["---"]) + " |")
        md += ["| " + " | ".join([*shown, note.strip()]) + " |" for _, shown, note in rows]
        if victims:
            md += ["", *(f"- {victim_line(reps, t_mult, t_unit)}" for _, reps in victims)]
        return "\n".join(md)
    widths = [max(len(x[i]) for x in [head, unit, *(r[1] for r in rows)]) for i in range(len(head))]
    widths[:3] = [max(widths[0], 10), max(widths[1], 6), max(widths[2], 10)]

    def line(vals: list[str]) -> str:
        left = [v.ljust(w) for v, w in zip(vals[:3], widths[:3], strict=True)]
        right = [v.rjust(w) for v, w in zip(vals[3:], widths[3:], strict=True)]
        return " ".join(left + right)

    out = [line(head), line(unit)]
    out.append("-" * len(out[0]))
    last = ""
    for scenario, shown, note in rows:
        if last and scenario != last:
            out.append("")
        last = scenario
        out.append(line(shown) + note)
    if victims:
        out.append("")
        out += [victim_line(reps, t_mult, t_unit) for _, reps in victims]
    return "\n".join(out)


def victim_line(reps: list[RunRecord], t_mult: float = 1.0, t_unit: str = "s") -> str:
    """A victim or storm cell's victim flow and PFC watchdog, in one line."""
    r0 = reps[0]
    stalls = _spread(reps, lambda r: r.victim_stalls)
    gap = _spread(reps, lambda r: (r.victim_longest_gap_s or 0.0) * t_mult)
    sd = _spread(reps, lambda r: r.victim_fct_slowdown)
    line = (
        f"{r0.scenario:<10} {r0.scheme:<9} victim flow: "
        f"{'-' if stalls is None else stalls.show('.0f')} stalls, longest gap "
        f"{'-' if gap is None else gap.show('.3f')} {t_unit}, FCT slowdown "
        f"{'-' if sd is None else sd.show('.2f')}"
    )
    if lossless(r0.scheme):
        storms = _spread(reps, lambda r: r.pfc_storms)
        restored = _spread(reps, lambda r: r.pfc_restored)
        drops = _spread(
            reps, lambda r: sum(d.get("watchdog_drops", 0) for d in r.pfc_by_port.values())
        )
        assert storms and restored and drops
        line += (
            f"; PFC watchdog: {storms.show('.0f')} storms, {restored.show('.0f')} restored, "
            f"{drops.show('.0f')} packets dropped"
        )
    return line


_ORDER = {
    "incast": 0,
    "allreduce": 1,
    "alltoall": 2,
    "twojob": 3,
    "websearch": 4,
    "victim": 5,
    "storm": 6,
    **{scheme: i for i, scheme in enumerate(SCHEMES)},
}


def _order(name: str) -> int:
    return _ORDER.get(name, 9)


def verdict(records: list[RunRecord]) -> list[str]:
    """TiTa against DCQCN on every scenario: lower p99 queue, no loss, no worse completion
    time? One line per scenario saying which held, which did not, and which are within the
    noise of the repetitions (their ranges overlap)."""
    out = []
    by = cells(records)
    for scenario in sorted({r.scenario for r in records}, key=_order):
        t, d = by.get((scenario, "tita")), by.get((scenario, "dcqcn"))
        if t is None or d is None:
            continue
        tq, dq = (_q99(t), _q99(d))
        tt, dt = (_time(t), _time(d))
        td = Spread.of(r.drops for r in t)
        dd = Spread.of(r.drops for r in d)
        assert tq and dq and tt and dt and td and dd  # every record has them
        zero = Spread(0.0, 0.0, 0.0)
        finished = all(not r.error and r.flows_completed == r.flows for r in t + d)
        checks = {
            # within 10 %: the same queue (e.g. both at the buffer's limit)
            "lower p99 queue": below(tq, dq, 0.9),
            # drops are never below zero: "holds" is no drop in any repetition
            "no loss": "holds" if td.hi <= 0 else below(zero, td),
            # a run that did not finish has no completion time to compare
            "no worse completion time": below(tt, dt, 1.05) if finished else "unfinished",
        }
        reps = max(len(t), len(d))
        line = (
            f"{scenario}: TiTa vs DCQCN{f' over {reps} runs' if reps > 1 else ''} p99 queue "
            f"{tq.scaled(1e-3).show('.1f')} vs {dq.scaled(1e-3).show('.1f')} KB, drops "
            f"{td.show('.0f')} vs {dd.show('.0f')}, time {_secs(tt, dt)}: "
        )
        line += _outcome(checks)
        out.append(line)
    out += lossless_verdict(records)
    return out


def lossless_verdict(records: list[RunRecord]) -> list[str]:
    """Issue 17's goals against the lossless baseline, per scenario: dcqcn+pfc loses
    nothing; TiTa (tita+pfc, else tita) has p99 queue <= 0.5x and p99 FCT slowdown <= 0.7x
    dcqcn+pfc's, and fewer victim-flow stalls."""
    out = []
    by = cells(records)
    for scenario in sorted({r.scenario for r in records}, key=_order):
        d = by.get((scenario, "dcqcn+pfc"))
        if d is None:
            continue
        dd = Spread.of(r.drops for r in d)
        assert dd
        zero = Spread(0.0, 0.0, 0.0)
        checks = {"dcqcn+pfc loses nothing": "holds" if dd.hi <= 0 else below(zero, dd)}
        desc = f"{scenario}: dcqcn+pfc drops {dd.show('.0f')}"
        t = by.get((scenario, "tita+pfc")) or by.get((scenario, "tita"))
        if t is not None:
            tq, dq = _q99(t), _q99(d)
            assert tq and dq
            desc += (
                f"; {t[0].scheme} vs dcqcn+pfc p99 queue {tq.scaled(1e-3).show('.1f')} vs "
                f"{dq.scaled(1e-3).show('.1f')} KB"
            )
            checks["p99 queue <= 0.5x"] = below(tq, dq, 0.5)
            tf = _spread(t, lambda r: r.fct_slowdown_p99)
            df = _spread(d, lambda r: r.fct_slowdown_p99)
            if tf is not None and df is not None:
                desc += f", FCT p99 {tf.show('.2f')} vs {df.show('.2f')}"
                checks["FCT p99 <= 0.7x"] = below(tf, df, 0.7)
            ts = _spread(t, lambda r: r.victim_stalls)
            ds = _spread(d, lambda r: r.victim_stalls)
            if ts is not None and ds is not None:
                desc += f", victim stalls {ts.show('.0f')} vs {ds.show('.0f')}"
                checks["fewer victim stalls"] = below(ts, ds)
        out.append(f"{desc}: {_outcome(checks)}")
    return out


def _q99(reps: list[RunRecord]) -> Spread | None:
    return Spread.of(r.queue_p99_bytes for r in reps)


def _time(reps: list[RunRecord]) -> Spread | None:
    return Spread.of(r.completion_s for r in reps)


def _outcome(checks: dict[str, str]) -> str:
    held = [k for k, v in checks.items() if v == "holds"]
    failed = [k for k, v in checks.items() if v == "NOT"]
    noise = [k for k, v in checks.items() if v == "within noise"]
    unfinished = [k for k, v in checks.items() if v == "unfinished"]
    if len(held) == len(checks):
        return "all hold"
    parts = [f"{', '.join(held) or 'none'} hold"]
    if failed:
        parts.append(f"NOT {', '.join(failed)}")
    if noise:
        parts.append(f"within noise: {', '.join(noise)}")
    if unfinished:
        parts.append(f"no verdict (a run did not finish): {', '.join(unfinished)}")
    return "; ".join(parts)


def _secs(a: Spread, b: Spread) -> str:
    """Two times in the unit the larger calls for (s at the emulation's scale, the model's
    microseconds at its own speed)."""
    m = max(a.hi, b.hi)
    k, unit = (1.0, "s") if m >= 1 else (1e3, "ms") if m >= 1e-3 else (1e6, "us")
    return f"{a.scaled(k).show('.2f')} vs {b.scaled(k).show('.2f')} {unit}"


# The results file's layout (docs/fidelity.md, "The results file"). 1: the files before the
# number was written (no `source`, no per-run `seed`); 2: `source`, `setup.command`, per-run
# `seed`. A reader takes every version up to its own.
RESULTS_SCHEMA = 2


def results_doc(
    records: list[RunRecord], setup: dict[str, Any], machine_extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The results file: one record per repetition in `runs` (and in `series`). Only `date`,
    `machine` and the runs' `load_avg_1m` depend on when and where it ran (the twin's files
    are otherwise byte-identical for the same inputs and seed)."""
    return {
        "schema": RESULTS_SCHEMA,
        **provenance(machine_extra=machine_extra),
        "setup": setup,
        "table": table(records, setup.get("link_bps")),
        "verdict": verdict(records),
        "runs": [r.summary() for r in records],
        "series": [
            {
                "scheme": r.scheme,
                "scenario": r.scenario,
                "repetition": r.repetition,
                "bottleneck": r.bottleneck,
                "queue_bytes": r.queue_series,
                "rate_bps": r.rate_series,
                "fct_slowdowns": r.slowdowns,
            }
            for r in records
        ],
    }


# What a results file records of when, where and with which code it ran (`date`, `machine`,
# `source`, the runs' `load_avg_1m`), and of the command (`setup.command`), left out when two
# runs' results are compared: the rest is what the runs computed.
_WHEN_AND_WHERE = ("date", "machine", "source")


def comparable(doc: dict[str, Any], ignore_setup: Iterable[str] = ("command",)) -> dict[str, Any]:
    """The results file `doc` without what depends on when, where and how it was started:
    two runs of the twin with the same inputs and seed give equal `comparable` documents.
    `ignore_setup`: the setup's keys left out too (the pipeline, when comparing two)."""
    out = {k: v for k, v in doc.items() if k not in _WHEN_AND_WHERE}
    skip = set(ignore_setup)
    out["setup"] = {k: v for k, v in doc.get("setup", {}).items() if k not in skip}
    out["runs"] = [
        {k: v for k, v in run.items() if k != "load_avg_1m"} for run in doc.get("runs", [])
    ]
    return out


def differences(a: Any, b: Any, limit: int = 20) -> list[str]:
    """Where `a` and `b` (JSON values) differ: up to `limit` paths (`runs[3].drops`)."""
    out: list[str] = []

    def walk(x: Any, y: Any, at: str) -> None:
        if len(out) >= limit or x == y:
            return
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(x.keys() | y.keys(), key=str):
                walk(x.get(k), y.get(k), f"{at}.{k}" if at else str(k))
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                walk(u, v, f"{at}[{i}]")
        else:
            out.append(at or "(the whole document)")

    walk(a, b, "")
    return out


def records_from_results(doc: dict[str, Any]) -> list[RunRecord]:
    """The records of a results file (summary and series), e.g. to plot them again. Files
    from before repetitions have none: theirs is repetition 0."""
    series = {(s["scheme"], s["scenario"], s.get("repetition", 0)): s for s in doc["series"]}
    out = []
    for run in doc["runs"]:
        s = series[(run["scheme"], run["scenario"], run.get("repetition", 0))]
        out.append(
            RunRecord(
                **run,
                slowdowns=s["fct_slowdowns"],
                queue_series=s["queue_bytes"],
                rate_series=s["rate_bps"],
            )
        )
    return out


def write_csvs(records: list[RunRecord], out: Path) -> list[Path]:
    """Two CSV files of a suite's runs, on every engine:

    - `flows.csv`: one line per flow of every flows run (incast, WebSearch, --flows):
      `scenario,scheme,repetition,id,src,dst,bytes,start_s,fct_s` (fct_s empty: it did not
      complete);
    - `queues.csv`: the queue at every switch egress port the traffic crossed, as the INT
      records of the arriving data packets saw it (departure-sampled; at most 2000 points per
      port and run, each bucket's maximum kept):
      `scenario,scheme,repetition,port,t_s,queue_bytes`.
    """
    flows_path, queues_path = out / "flows.csv", out / "queues.csv"
    with flows_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["scenario", "scheme", "repetition", "id", "src", "dst", "bytes", "start_s", "fct_s"]
        )
        for r in records:
            for fl in r.flow_fcts:
                w.writerow(
                    [
                        r.scenario,
                        r.scheme,
                        r.repetition,
                        fl["id"],
                        fl["src"],
                        fl["dst"],
                        fl["bytes"],
                        repr(fl["start_s"]),
                        "" if fl["fct_s"] is None else repr(fl["fct_s"]),
                    ]
                )
    with queues_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "scheme", "repetition", "port", "t_s", "queue_bytes"])
        for r in records:
            for port, series in sorted(r.port_series.items()):
                for t, v in zip(series["t"], series["v"], strict=True):
                    w.writerow([r.scenario, r.scheme, r.repetition, port, repr(t), int(v)])
    return [flows_path, queues_path]


def write_results(
    path: Path,
    records: list[RunRecord],
    setup: dict[str, Any],
    machine_extra: dict[str, Any] | None = None,
) -> None:
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
    if int(doc.get("schema", 1)) > RESULTS_SCHEMA:
        raise ValueError(
            f"{p}: results schema {doc['schema']}, newer than this xingmai reads "
            f"({RESULTS_SCHEMA}): update it"
        )
    return doc


def _medians(runs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """A results file's figures per (scenario, scheme): with repetitions, each figure's
    median over them."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        grouped.setdefault((r["scenario"], r["scheme"]), []).append(r)
    out = {}
    for k, reps in grouped.items():
        figures = {}
        for _, key, _ in COMPARED:
            s = Spread.of(r.get(key) for r in reps)
            figures[key] = None if s is None else s.med
        out[k] = figures
    return out


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
        lines.append(
            f"{n}: {p}  ({st.get('engine', 'emu')}, {st.get('topology')}, scale "
            f"1/{st.get('scale', 0):g}, {d.get('date', '')})"
        )
    by = [_medians(d["runs"]) for d in docs]
    shared = [k for k in by[0] if all(k in b for b in by[1:])]
    shared.sort(key=lambda k: (_order(k[0]), _order(k[1])))
    if median:
        rest = f"{names[1]}..{names[-1]}"
        head = (
            f"{'scenario':<10} {'scheme':<6} {'metric':<12} {'A':>10} "
            f"{'median ' + rest:>14} {'min-max ' + rest:>22} {'A/median':>8}"
        )
    else:
        head = (
            f"{'scenario':<10} {'scheme':<6} {'metric':<12} "
            + " ".join(f"{n:>10}" for n in names)
            + " "
            + " ".join(f"{n + '/A':>6}" for n in names[1:])
        )
    lines += ["", head, "-" * len(head)]
    for scenario, scheme in shared:
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
                lines.append(
                    f"{scenario:<10} {scheme:<6} {label:<12} "
                    f"{'-' if a is None else f'{a:.4g}':>10} "
                    f"{'-' if med is None else f'{med:.4g}':>14} {rng:>22} "
                    f"{ratio:>8}"
                )
                continue
            shown = " ".join(f"{'-':>10}" if v is None else f"{v * k:>10.4g}" for v in vals)
            ratios = " ".join(
                f"{'-':>6}" if v is None or not vals[0] else f"{v / vals[0]:>6.2f}"
                for v in vals[1:]
            )
            lines.append(f"{scenario:<10} {scheme:<6} {label:<12} {shown} {ratios}")
        lines.append("")
    return "\n".join(lines).rstrip()


def run_named(path: Path, doc: dict[str, Any], about: str, command: str | None) -> str:
    """The line that names a run above its table in the docs: where its output is, what it
    ran (`about`), its commit, date, machine and command (a results file's `source`, `date`
    and `machine`, as testbed.experiment.machine.provenance writes them)."""
    machine, source = doc.get("machine", {}), doc.get("source", {})
    commit = str(source.get("commit", ""))[:7] or f"version {source.get('version', '?')}"
    if source.get("dirty"):
        commit += " with uncommitted changes"
    where = f"{machine.get('cpu') or '?'}, {machine.get('cores', '?')} cores"
    return (
        f"Run `{path}`, outside the repository ({about}), commit {commit}, "
        f"{doc.get('date', '?')}, {where}" + (f"; `{command}`" if command else "") + ":"
    )


def telemetry_notes(setup: dict[str, Any]) -> list[str]:
    """What the run's telemetry could not resolve (setup.telemetry, testbed/ctlconfig.py): a
    note under the table, for the laws that read INT."""
    tel = setup.get("telemetry") or {}
    notes = [f"NOTE: {p}" for p in tel.get("problems", [])]
    if notes and tel.get("smallest_resolving_scale"):
        notes.append(
            f"NOTE: the telemetry resolves the base RTT from --scale "
            f"{tel['smallest_resolving_scale']:g} (docs/fidelity.md)"
        )
    return notes


def operations_notes(records: list[RunRecord], max_suspects: int = 3) -> list[str]:
    """Per run with faults, suspects or probes: the faults injected, what the controller
    named (first, with its evidence) and when, and the run's probes, as lines under the table."""
    out = []
    for r in records:
        if not (r.faults or r.suspects or r.probes):
            continue
        parts = []
        if r.faults:
            parts.append(
                "faults "
                + ", ".join(
                    f"{Fault.from_dict(f).describe()} at "
                    f"{f.get('applied_at', f.get('at', 0)):.2f} s"
                    for f in r.faults
                )
            )
        p = r.probes
        if p:
            parts.append(
                f"probes {p.get('sent', 0):,} sent, {p.get('received', 0):,} received, "
                f"{p.get('lost', 0):,} lost ({p.get('lost_congested', 0):,} behind a full queue)"
            )
        head = f"{r.scenario}/{r.scheme}: " + "; ".join(parts or ["no fault"])
        out.append(head)
        if not r.suspects:
            out.append("    nothing named")
        for s in r.suspects[:max_suspects]:
            out.append(
                f"    {s['score']:.2f} {s['element']} {s['kind']}, first named at "
                f"{s['first_named']:.2f} s: {s['evidence']}"
            )
        if len(r.suspects) > max_suspects:
            out.append(f"    and {len(r.suspects) - max_suspects} more (results.json)")
    return out


def markdown_report(path: Path) -> str:
    """A run's table as the docs show it: which run (its command, engine, topology and
    scaling), the commit, date and machine it ran on, the table in Markdown and its verdict."""
    doc = load_results(path)
    setup = doc["setup"]
    about = f"{setup.get('engine', '?')}, {setup.get('topology', '?')}; {setup.get('scaling', '')}"
    lines = [
        run_named(path, doc, about, setup.get("command")),
        "",
        table(records_from_results(doc), setup.get("link_bps"), markdown=True),
    ]
    if doc.get("verdict"):
        lines += ["", *(f"- {v}" for v in doc["verdict"])]
    if notes := telemetry_notes(setup):
        lines += ["", *(f"- {n}" for n in notes)]
    return "\n".join(lines)
