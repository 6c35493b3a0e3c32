"""Every metric of a run's record defined once (testbed.experiment.metrics), the docs showing
the same definitions, and each computed right on a small trace worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.experiment import metrics
from testbed.experiment.report import table
from testbed.experiment.suite import RunRecord, workload_counters
from testbed.traffic import metrics as m

REPO = Path(__file__).resolve().parents[1]


def record(**kw: object) -> RunRecord:
    base: dict[str, object] = dict(
        scheme="tita",
        scenario="incast",
        bottleneck="leaf1:1",
        queue_p50_bytes=1.0,
        queue_p99_bytes=2.0,
        queue_max_bytes=3.0,
        queue_samples=3,
        drops=0,
        utilization=0.5,
        fct_slowdown_p50=1.5,
        fct_slowdown_p99=2.0,
        flows=2,
        flows_completed=2,
        busbw_bps=None,
        completion_s=1.0,
        int_packets=3,
        int_max_hops=2,
        retransmits=0,
        cnps=0,
        out_of_order=0,
        window=8,
    )
    return RunRecord(**{**base, **kw})  # type: ignore[arg-type]


def test_the_docs_show_the_definitions_of_the_code() -> None:
    doc = (REPO / "docs" / "fidelity.md").read_text()
    assert metrics.markdown() in doc, (
        "docs/fidelity.md's metrics table differs from testbed/experiment/metrics.py: "
        "paste `python -m testbed.experiment.metrics` into it"
    )


def test_every_column_of_the_table_is_defined() -> None:
    header = table([record()], 20e6).splitlines()[0].split()
    defined = {w for mt in metrics.METRICS if mt.column for w in mt.column.split()}
    undefined = [w for w in header[3:] if w not in defined]  # scenario, scheme, bottleneck
    assert undefined == []
    assert all(hasattr(record(), mt.field) for mt in metrics.METRICS)


def test_queue_percentiles_on_a_hand_computed_trace() -> None:
    # 101 samples 0, 10, ..., 1000 bytes: the median is 500, the 99th percentile 990
    q = metrics.queue_stats([10 * i for i in range(101)])
    assert q == {"p50": 500.0, "p99": 990.0, "max": 1000.0, "samples": 101.0}
    assert metrics.queue_stats([]) == {"p50": 0.0, "p99": 0.0, "max": 0.0, "samples": 0.0}


def test_utilization_is_over_the_longer_of_completion_and_the_ports_span() -> None:
    # 1000 bytes at 8 kb/s take exactly 1 s
    assert metrics.utilization(1000, 8000.0, 1.0) == 1.0
    assert metrics.utilization(500, 8000.0, 1.0) == 0.5
    # the port sent for 2 s though the workload completed in 1: 1000 B over 2 s
    assert metrics.utilization(2000, 8000.0, 1.0, busy_span_s=2.0) == 1.0
    assert metrics.utilization(1000, 8000.0, 0.0) is None


def test_link_utilization_of_back_to_back_frames_is_exactly_one() -> None:
    # 10 frames of 1000 B at 8 Mb/s (1 ms each), back to back: the k-th ends at k ms. Counted
    # from t = 0.5 ms, the old count (every frame's bytes over 0.5 to 10 ms) read 1.05.
    arrivals = {"f": [(k * 1e-3, 1000) for k in range(1, 11)]}
    assert m.link_utilization(arrivals, 8e6, 0.5e-3) == pytest.approx(1.0)
    # every other frame missing: half
    half = {"f": [(k * 1e-3, 1000) for k in range(1, 11, 2)]}
    assert m.link_utilization(half, 8e6, 0.0) == pytest.approx(0.5)
    assert m.link_utilization({"f": [(1.0, 1000)]}, 8e6, 0.0) is None


def test_fct_slowdown_on_a_hand_computed_flow() -> None:
    # 1 MB at 8 Mb/s payload takes 1 s, plus a 10 ms base RTT; done in 2.02 s: slowdown 2
    ideal = m.ideal_fct(1_000_000, 8e6, 0.01)
    assert ideal == pytest.approx(1.01)
    stats = m.fct_stats([{"size": 1_000_000, "fct": 2.02}], 8e6, 0.01)
    assert stats["all"]["slowdown"]["p50"] == pytest.approx(2.0)


def test_busbw_is_nccl_tests() -> None:
    # 8 ranks all-reduce 1 MB in 1 s: algbw 1 MB/s, busbw x 2 (8-1)/8 = 1.75
    bw = m.collective_bw("allreduce", 1_000_000, 1.0, 8)
    assert bw["algbw_Bps"] == 1e6 and bw["busbw_Bps"] == pytest.approx(1.75e6)
    bw = m.collective_bw("alltoall", 1_000_000, 1.0, 8)
    assert bw["busbw_Bps"] == pytest.approx(0.875e6)


def test_jain_on_the_windows_of_a_hand_computed_trace() -> None:
    # two flows of equal rate, then one at three times the other: 1, then 16/20
    a = [(t / 10, 100) for t in range(0, 21)]
    b = [(t / 10, 100) for t in range(0, 11)] + [(1 + t / 30, 100) for t in range(1, 31)]
    assert m.window_fairness({"a": a, "b": b}, 0.0, 1.0) == [
        pytest.approx(1.0),
        pytest.approx(16 / 20, rel=0.05),
    ]


def test_out_of_range_names_the_metric() -> None:
    assert metrics.out_of_range(record().summary()) == []
    assert metrics.out_of_range(record(utilization=1.01).summary()) == [
        "utilization = 1.01 outside [0.0, 1.0]"
    ]
    assert metrics.out_of_range(record(fairness_min=-0.1).summary()) == [
        "fairness_min = -0.1 outside [0.0, 1.0]"
    ]


@pytest.mark.slow
def test_the_twins_port_never_sends_faster_than_its_rate() -> None:
    """The 400G incast whose utilisation read 101 %: back to back at the bottleneck, now at
    most 100 % (the port's time is booked for the frames it sends, to the fraction of a ns)."""
    from testbed.experiment.suite import SuiteConfig
    from testbed.model import Scaling
    from testbed.sim.fabric import SimFabric
    from testbed.sim.suite import SimSuite
    from testbed.topo import leafspine

    spec = leafspine(2, 2, 4)
    fab = SimFabric(spec, Scaling(scale=1, max_hops=spec.longest_path_switches()))
    cfg = SuiteConfig(schemes=("tita", "none"), scenarios=("incast",))
    tita, none = SimSuite(fab, cfg).run()
    assert tita.utilization is not None and 0.95 < tita.utilization <= 1.0, tita.utilization
    for rec in (tita, none):
        assert metrics.out_of_range(rec.summary()) == []


def test_a_collective_runs_counters_reach_its_record() -> None:
    # the all-to-all's result nests the collective library's summary, whose counters the
    # record read as 0 (a 16-host twin run: 37 retransmissions recorded as 0)
    nested = {"workload": "alltoall", "summary": {"counters": {"retransmits": 37}}}
    assert workload_counters(nested) == {"retransmits": 37}
    assert workload_counters({"counters": {"cnps_received": 3}, "raw": []}) == {"cnps_received": 3}
    assert workload_counters({"workload": "twojob", "summary": {"jobs": []}}) == {}


def test_link_utilization_by_departures_reads_the_link_not_the_receivers_bunching() -> None:
    # 10 frames of 1000 B at 8 Mb/s (1 ms each) started back to back at k ms by the sender,
    # but the receiver got the first late, at 4.5 ms, and the rest bunched behind it: by
    # arrivals the link reads faster than its rate, by departures exactly what it sent
    starts = [k * 1_000_000 for k in range(10)]
    arrivals = {"f": [(max(4.5e-3, (k + 1) * 1e-3), 1000) for k in range(10)]}
    assert m.link_utilization(arrivals, 8e6, 0.0) > 1.0
    by_departures = m.link_utilization_by_departures(
        arrivals, {"f": starts}, 8e6, 0.0, resolution_ns=0
    )
    assert by_departures == pytest.approx(1.0)
    # the stamps' resolution lengthens the span: truncated stamps cannot read above 1
    assert m.link_utilization_by_departures(arrivals, {"f": starts}, 8e6, 0.0) < 1.0
    # frames without a stamp, or arrived before t_from, are left out; one frame: None
    gaps = {"f": [None if k % 2 else s for k, s in enumerate(starts)]}
    half = m.link_utilization_by_departures(arrivals, gaps, 8e6, 0.0, resolution_ns=0)
    assert half == pytest.approx(0.5)
    assert m.link_utilization_by_departures(arrivals, {"f": starts}, 8e6, 1.0) is None
