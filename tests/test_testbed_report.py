"""The comparison's table, verdict, results file and plots, from made-up records (no root)."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.plots import write_plots
from testbed.report import records_from_results, results_doc, table, verdict
from testbed.scenarios import RunRecord


def rec(scheme: str, scenario: str, p99: float, drops: int, time_s: float,
        busbw: float | None = None, slowdowns: tuple[float, ...] = (1.5, 3.0)) -> RunRecord:
    return RunRecord(
        scheme=scheme, scenario=scenario, bottleneck="leaf1:1", queue_p50_bytes=p99 / 4,
        queue_p99_bytes=p99, queue_max_bytes=p99 * 1.1, queue_samples=100, drops=drops,
        utilization=0.8, fct_slowdown_p50=None if busbw else slowdowns[0],
        fct_slowdown_p99=None if busbw else slowdowns[-1], flows=7, flows_completed=7,
        busbw_bps=busbw, completion_s=time_s, int_packets=100, int_max_hops=3,
        retransmits=0, cnps=0, out_of_order=0, window=64,
        slowdowns=[] if busbw else list(slowdowns),
        queue_series={"t": [0.0, 0.01, 0.02, 0.5], "v": [0.0, p99, p99 / 2, 0.0]},
        rate_series={"h2->h1:5000": {"t": [0.0, 0.1], "v": [19e6, 3e6], "end": [0.4]}})


RECORDS = [
    rec("none", "incast", 495e3, 900, 9.0), rec("dcqcn", "incast", 495e3, 300, 8.0),
    rec("tita", "incast", 300e3, 0, 4.0),
    rec("none", "allreduce", 80e3, 0, 3.6, busbw=16e6),
    rec("dcqcn", "allreduce", 100e3, 0, 3.8, busbw=15e6),
    rec("tita", "allreduce", 17e3, 0, 4.2, busbw=14e6),
]


def test_table_rows_units_and_order() -> None:
    text = table(list(reversed(RECORDS)))
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["scenario", "scheme", "bottleneck", "p50"]
    rows = [ln.split() for ln in lines[3:] if ln.strip()]
    assert [(r[0], r[1]) for r in rows] == [(s, m) for s in ("incast", "allreduce")
                                            for m in ("none", "dcqcn", "tita")]
    tita_incast = rows[2]
    assert tita_incast[3:6] == ["75.0", "300.0", "0"]  # p50, p99 in KB, drops
    assert rows[5][-2:] == ["14.00", "4.20"]  # busbw Mb/s, seconds


def test_verdict_holds_or_names_what_does_not() -> None:
    lines = verdict(RECORDS)
    assert lines[0].startswith("incast:") and lines[0].endswith("all hold")
    # all-reduce: lower queue and no loss, but 4.2 s is more than 5 % above 3.8 s
    assert "NOT no worse completion time" in lines[1]
    same = verdict([rec("dcqcn", "incast", 495e3, 0, 5.0), rec("tita", "incast", 470e3, 0, 5.0)])
    assert "NOT lower p99 queue" in same[0]  # within 10 %: the same queue


def test_results_file_and_plots(tmp_path: Path) -> None:
    doc = results_doc(RECORDS, {"scale": 20000})
    assert records_from_results(json.loads(json.dumps(doc))) == RECORDS
    assert len(doc["runs"]) == 6 and "queue_series" not in doc["runs"][0]
    assert doc["series"][0]["queue_bytes"]["v"][1] == 495e3
    made = write_plots(RECORDS, tmp_path, 20e6, 19.5e6)
    assert [p.name for p in made] == ["queue.png", "rates.png", "fct_cdf.png"]
    assert all(p.stat().st_size > 10_000 for p in made)
    (tmp_path / "x").mkdir()
    only = write_plots([r for r in RECORDS if r.scenario == "allreduce"], tmp_path / "x", 20e6,
                       19.5e6)
    assert [p.name for p in only] == ["queue.png", "rates.png"]  # no FCT without flows
