"""The comparison's table, verdict, results file and plots, from made-up records (no root)."""

from __future__ import annotations

import csv
import dataclasses
import json
from dataclasses import replace
from pathlib import Path

import pytest

from testbed.experiment.plots import summary_plot, write_plots
from testbed.experiment.report import (
    RESULTS_SCHEMA,
    Spread,
    below,
    comparable,
    compare,
    differences,
    load_results,
    markdown_report,
    operations_notes,
    records_from_results,
    representative,
    results_doc,
    table,
    verdict,
    write_csvs,
    write_results,
)
from testbed.experiment.suite import RunRecord, one_line


def rec(
    scheme: str,
    scenario: str,
    p99: float,
    drops: int,
    time_s: float,
    busbw: float | None = None,
    slowdowns: tuple[float, ...] = (1.5, 3.0),
) -> RunRecord:
    return RunRecord(
        scheme=scheme,
        scenario=scenario,
        bottleneck="leaf1:1",
        queue_p50_bytes=p99 / 4,
        queue_p99_bytes=p99,
        queue_max_bytes=p99 * 1.1,
        queue_samples=100,
        drops=drops,
        utilization=0.8,
        fct_slowdown_p50=None if busbw else slowdowns[0],
        fct_slowdown_p99=None if busbw else slowdowns[-1],
        flows=7,
        flows_completed=7,
        busbw_bps=busbw,
        completion_s=time_s,
        int_packets=100,
        int_max_hops=3,
        retransmits=0,
        cnps=0,
        out_of_order=0,
        window=64,
        slowdowns=[] if busbw else list(slowdowns),
        queue_series={"t": [0.0, 0.01, 0.02, 0.5], "v": [0.0, p99, p99 / 2, 0.0]},
        rate_series={"h2->h1:5000": {"t": [0.0, 0.1], "v": [19e6, 3e6], "end": [0.4]}},
    )


RECORDS = [
    rec("none", "incast", 495e3, 900, 9.0),
    rec("dcqcn", "incast", 495e3, 300, 8.0),
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
    assert [(r[0], r[1]) for r in rows] == [
        (s, m) for s in ("incast", "allreduce") for m in ("none", "dcqcn", "tita")
    ]
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
    assert [p.name for p in made] == ["queue.png", "rates.png", "fct_cdf.png", "summary.png"]
    assert all(p.stat().st_size > 10_000 for p in made)
    (tmp_path / "x").mkdir()
    only = write_plots(
        [r for r in RECORDS if r.scenario == "allreduce"], tmp_path / "x", 20e6, 19.5e6
    )
    assert [p.name for p in only] == ["queue.png", "rates.png", "summary.png"]  # no FCT
    # a failed run is left out of the summary, and said in its panel's title
    failed = [
        replace(r, error="stuck", completion_s=0.0) if r.scheme == "dcqcn" else r for r in RECORDS
    ]
    (tmp_path / "y").mkdir()
    assert summary_plot(failed, tmp_path / "y" / "summary.png") is not None
    assert summary_plot([replace(r, error="stuck") for r in RECORDS], tmp_path / "z.png") is None
    # lossless schemes alone are plotted too (a run of dcqcn+pfc,tita+pfc once had no column)
    (tmp_path / "pfc").mkdir()
    lossless = [
        dataclasses.replace(r, scheme=r.scheme + "+pfc")
        for r in RECORDS
        if r.scheme in ("dcqcn", "tita")
    ]
    made = write_plots(lossless, tmp_path / "pfc", 20e6, 19.5e6)
    assert [p.name for p in made] == ["queue.png", "rates.png", "fct_cdf.png", "summary.png"]


# ---- repetitions (--repeat N) -----------------------------------------------------------


def reps(
    scheme: str, scenario: str, p99s: list[float], drops: list[int], times: list[float]
) -> list[RunRecord]:
    out = []
    for i, (q, d, t) in enumerate(zip(p99s, drops, times, strict=True)):
        r = rec(scheme, scenario, q, d, t)
        r.repetition = i
        out.append(r)
    return out


def test_ranges_hold_only_where_they_do_not_overlap() -> None:
    a, b = Spread(1.0, 2.0, 3.0), Spread(4.0, 5.0, 6.0)
    assert below(a, b) == "holds" and below(b, a) == "NOT"
    assert below(Spread(1.0, 2.0, 4.5), b) == "within noise"  # 4.5 is inside 4..6
    assert below(Spread(4.0, 4.0, 4.0), Spread(4.0, 4.0, 4.0)) == "within noise"
    assert below(a, b, 0.15) == "NOT"  # 1..3 against 0.6..0.9: wholly above
    assert below(Spread(3.0, 3.0, 3.0), Spread(3.0, 3.0, 3.0), 1.05) == "holds"
    assert Spread.of([3.0, None, 1.0, 2.0]) == Spread(1.0, 2.0, 3.0)
    assert Spread.of([None]) is None
    assert Spread(1.0, 2.0, 3.0).show(".1f") == "2.0 [1.0-3.0]"
    assert Spread(2.0, 2.0, 2.0).show(".1f") == "2.0"


def test_verdict_over_repetitions_separates_noise_from_differences() -> None:
    dcqcn = reps("dcqcn", "incast", [490e3, 495e3, 480e3], [200, 250, 300], [8.0, 9.0, 10.0])
    # queue clearly lower and never a drop; times overlap DCQCN's (7..9.5 vs 8..10)
    tita = reps("tita", "incast", [300e3, 320e3, 310e3], [0, 0, 0], [7.0, 9.5, 8.0])
    (line,) = verdict(dcqcn + tita)
    assert line.startswith("incast: TiTa vs DCQCN over 3 runs p99 queue 310.0 [300.0-320.0]")
    assert line.endswith("lower p99 queue, no loss hold; within noise: no worse completion time")
    # one repetition of three dropped packets: loss is within noise, not held
    tita[1].drops = 4
    assert "within noise: no loss, no worse completion time" in verdict(dcqcn + tita)[0]
    # every repetition slower than every DCQCN one by more than 5 %
    slow = reps("tita", "incast", [300e3] * 3, [0] * 3, [11.0, 12.0, 11.5])
    assert verdict(dcqcn + slow)[0].endswith("NOT no worse completion time")


def test_table_shows_median_and_range_and_results_keep_every_repetition(
    tmp_path: Path,
) -> None:
    records = reps("tita", "incast", [300e3, 320e3, 310e3], [0, 2, 0], [4.0, 4.4, 4.2]) + [
        rec("dcqcn", "incast", 495e3, 300, 8.0)
    ]
    lines = table(records).splitlines()
    dcqcn_row = next(ln for ln in lines if ln.startswith("incast     dcqcn"))
    tita_row = next(ln for ln in lines if ln.startswith("incast     tita"))
    assert "310.0 [300.0-320.0]" in tita_row and "0 [0-2]" in tita_row
    assert tita_row.endswith("4.20 [4.00-4.40]") and dcqcn_row.endswith("8.00")
    assert len({len(ln) for ln in (lines[0], dcqcn_row, tita_row)}) == 1  # aligned columns
    doc = json.loads(json.dumps(results_doc(records, {"scale": 20000})))
    assert [(r["scheme"], r["repetition"]) for r in doc["runs"]] == [
        ("tita", 0),
        ("tita", 1),
        ("tita", 2),
        ("dcqcn", 0),
    ]
    assert records_from_results(doc) == records
    # the plots show the repetition with the median time (4.2 s: repetition 2)
    assert [r.repetition for r in representative(records) if r.scheme == "tita"] == [2]
    made = write_plots(records, tmp_path, 20e6, 19.5e6)
    assert [p.name for p in made] == ["queue.png", "rates.png", "fct_cdf.png", "summary.png"]


def test_compare_takes_a_repeated_files_median(tmp_path: Path) -> None:
    one = [rec("tita", "incast", 300e3, 0, 4.0)]
    three = reps("tita", "incast", [300e3, 600e3, 450e3], [0, 0, 0], [4.0, 9.0, 8.0])
    for name, records in (("a", one), ("b", three)):
        write_results(tmp_path / f"{name}.json", records, {"scale": 20000})
    text = compare([tmp_path / "a.json", tmp_path / "b.json"])
    line = next(ln for ln in text.splitlines() if "time s" in ln)
    assert line.split()[-3:] == ["4", "8", "2.00"]


def test_markdown_report_names_the_run_commit_date_and_machine(tmp_path: Path) -> None:
    setup = {
        "engine": "sim",
        "topology": "leafspine-2x2x4",
        "scaling": "scale 1/20000",
        "command": "xingmai-testbed run --engine sim",
        "link_bps": 20e6,
    }
    write_results(tmp_path / "results.json", RECORDS, setup)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["source"]["commit"]  # the tests run in a checkout
    out = markdown_report(tmp_path).splitlines()
    assert out[0].startswith(
        f"Run `{tmp_path}`, outside the repository (sim, leafspine-2x2x4; scale 1/20000), commit "
    )
    assert doc["source"]["commit"][:7] in out[0] and doc["date"] in out[0]
    assert out[0].endswith("; `xingmai-testbed run --engine sim`:")
    assert out[2].startswith("| scenario | scheme | bottleneck | p50 queue (KB) | p99 queue (KB)")
    rows = [ln for ln in out if ln.startswith("| incast") or ln.startswith("| allreduce")]
    assert len(rows) == 6 and rows[2].startswith("| incast | tita | leaf1:1 | 75.0 | 300.0 | 0 |")
    assert out[-1].startswith("- allreduce: TiTa vs DCQCN")


def test_results_files_carry_their_schema_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    write_results(tmp_path / "results.json", RECORDS, {"scale": 20000})
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["schema"] == RESULTS_SCHEMA
    doc["schema"] = RESULTS_SCHEMA + 1
    (tmp_path / "results.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=f"results schema {RESULTS_SCHEMA + 1}, newer"):
        load_results(tmp_path)
    del doc["schema"]  # a file from before the number: version 1, read
    (tmp_path / "results.json").write_text(json.dumps(doc))
    assert load_results(tmp_path)["runs"]


def test_the_csvs_name_each_repetition_s_flows_and_queues(tmp_path: Path) -> None:
    # what both engines write beside results.json (testbed.experiment.report.write_csvs)
    first = dataclasses.replace(
        rec("tita", "incast", 300e3, 0, 4.0),
        flow_fcts=[
            {"id": 0, "src": "h2", "dst": "h1", "bytes": 1000, "start_s": 0.0, "fct_s": 0.5},
            {"id": 1, "src": "h3", "dst": "h1", "bytes": 1000, "start_s": 0.0, "fct_s": None},
        ],
        port_series={"leaf1:1": {"t": [0.0, 0.1], "v": [0.0, 4200.0]}},
    )
    second = dataclasses.replace(first, repetition=1, flow_fcts=first.flow_fcts[:1])
    flows_path, queues_path = write_csvs([first, second], tmp_path)
    flows = list(csv.DictReader(flows_path.open()))
    assert [(r["repetition"], r["id"], r["fct_s"]) for r in flows] == [
        ("0", "0", "0.5"),
        ("0", "1", ""),  # not completed
        ("1", "0", "0.5"),
    ]
    queues = list(csv.DictReader(queues_path.open()))
    assert [(r["repetition"], r["port"], r["queue_bytes"]) for r in queues] == [
        ("0", "leaf1:1", "0"),
        ("0", "leaf1:1", "4200"),
        ("1", "leaf1:1", "0"),
        ("1", "leaf1:1", "4200"),
    ]


def test_two_runs_compare_on_what_they_computed_alone() -> None:
    """`comparable` drops when, where and with which code a run ran (and the setup keys asked
    for); `differences` names the paths where two results files still differ."""
    a = json.loads(
        json.dumps(results_doc(RECORDS, {"engine": "sim", "command": "a", "pipeline": "native"}))
    )
    b = json.loads(json.dumps(a))
    b["date"], b["machine"], b["source"] = "another day", {"cpu": "another"}, {"commit": "f00"}
    b["setup"]["command"] = "b"
    for run in b["runs"]:
        run["load_avg_1m"] = 3.5
    assert comparable(a) == comparable(b) and differences(comparable(a), comparable(b)) == []
    b["setup"]["pipeline"] = "reference"
    assert differences(comparable(a), comparable(b)) == ["setup.pipeline"]
    assert comparable(a, ("command", "pipeline")) == comparable(b, ("command", "pipeline"))
    b["runs"][2]["drops"] += 1
    b["series"][0]["queue_bytes"]["v"][1] = 0.0
    assert differences(
        comparable(a, ("command", "pipeline")), comparable(b, ("command", "pipeline"))
    ) == [
        "runs[2].drops",
        "series[0].queue_bytes.v[1]",
    ]
    assert len(differences(list(range(50)), list(range(1, 51)), limit=5)) == 5


def test_operations_notes_say_the_faults_what_was_named_and_the_probes() -> None:
    healthy = rec("tita", "websearch", 1e3, 0, 1.0)
    faulty = dataclasses.replace(
        healthy,
        faults=[{"target": "leaf1:3", "kind": "silent-loss", "value": 0.01, "at": 0.5,
                 "count": 0, "applied_at": 0.5}],
        suspects=[
            {"element": f"link l{i}", "kind": "lossy-link", "score": 0.45 - i / 100,
             "first_named": 1.1, "evidence": f"probes: {i}"}
            for i in range(5)
        ],
        probes={"sent": 15292, "received": 15252, "lost": 40, "lost_congested": 0},
    )  # fmt: skip
    probed = dataclasses.replace(healthy, probes={"sent": 10, "received": 10, "lost": 0})
    assert operations_notes([healthy]) == []
    lines = operations_notes([faulty, probed])
    assert lines[0] == (
        "websearch/tita: faults leaf1:3 silent-loss 1% at 0.50 s; probes 15,292 sent, "
        "15,252 received, 40 lost (0 behind a full queue)"
    )
    assert lines[1] == "    0.45 link l0 lossy-link, first named at 1.10 s: probes: 0"
    assert lines[4] == "    and 2 more (results.json)"
    assert lines[5].startswith("websearch/tita: probes 10 sent") and lines[6] == "    nothing named"


def test_the_run_line_names_feedback_the_hosts_refused() -> None:
    """A loss before the wire (an ACK a host's socket refused) shows in the run's line."""
    r = rec("tita", "alltoall", 100e3, 0, 0.6, busbw=10e6)
    assert "refused" not in one_line(r)
    assert "3 ACKs/NAKs/CNPs refused by the hosts' sockets" in one_line(
        replace(r, feedback_not_sent=3)
    )
