"""Per-run metrics: definitions checked on hand-made numbers."""

from __future__ import annotations

import pytest

from testbed.traffic import metrics as m


def test_ideal_fct_and_slowdown_by_bucket() -> None:
    rate, rtt = 100e6, 100e-6
    flows = [{"size": 5_000, "fct": m.ideal_fct(5_000, rate, rtt) * k} for k in (1, 2, 3, 4)]
    flows += [{"size": 2_000_000, "fct": 0.5}, {"size": 2_000_000, "fct": None}]
    st = m.fct_stats(flows, rate, rtt)
    small, big = st["buckets"]
    assert small["bucket"] == "<10K" and small["flows"] == 4
    assert small["slowdown"]["p50"] == pytest.approx(2.5)
    assert small["slowdown"]["p99"] == pytest.approx(3.97)
    assert big["bucket"] == "1M-10M" and big["flows"] == 1
    assert big["slowdown"]["p50"] == pytest.approx(0.5 / (2_000_000 * 8 / rate + rtt))
    assert st["all"]["flows"] == 5  # the unfinished flow is not in the percentiles


def test_busbw_definitions_follow_nccl_tests() -> None:
    ar = m.collective_bw("allreduce", 8_000_000, 0.5, 8)
    assert ar["algbw_Bps"] == pytest.approx(16e6)
    assert ar["busbw_Bps"] == pytest.approx(16e6 * 2 * 7 / 8)
    a2a = m.collective_bw("alltoall", 8_000_000, 0.5, 8)
    assert a2a["busbw_Bps"] == pytest.approx(16e6 * 7 / 8)


def test_goodput_counters_and_table() -> None:
    rec = [
        {"ok": True, "bytes": 1_000_000, "t_done": 0.1},
        {"ok": True, "bytes": 1_000_000, "t_done": 0.2},
        {"ok": False, "bytes": 5, "t_done": 0.3},
    ]
    assert m.goodput(rec)["goodput_bps"] == pytest.approx(2_000_000 * 8 / 0.2)
    tot = m.counter_totals(
        [
            {"retransmits": 3, "drops": {"bad_icrc": 1}},
            {"retransmits": 2, "cnps_sent": 4, "drops": {"bad_icrc": 2}},
        ]
    )
    assert tot["retransmits"] == 5 and tot["cnps_sent"] == 4 and tot["drops"] == {"bad_icrc": 3}
    text = m.table(
        {
            "workload": "x",
            "hosts": ["a"],
            "counters": tot,
            "fct": m.fct_stats([{"size": 10, "fct": 0.001}], 1e9, 1e-5),
        }
    )
    assert "retransmits=5" in text and "bad_icrc=3" in text and "<10K" in text


# ---- fairness and utilization at a bottleneck ------------------------------------------------


def test_jain_index_is_one_for_equal_rates_and_one_over_n_for_a_hog() -> None:
    assert m.jain([5.0, 5.0, 5.0, 5.0]) == pytest.approx(1.0)
    assert m.jain([9.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert m.jain([1.0, 3.0]) == pytest.approx(16 / 20)  # (1+3)^2 / (2 (1+9))
    assert m.jain([7.0]) == 1.0
    for bad in ([], [0.0, 0.0], [1.0, -1.0]):
        with pytest.raises(ValueError):
            m.jain(bad)


def _steady(rate_bytes_per_s: float, start: float, stop: float, step: float = 0.01):  # type: ignore[no-untyped-def]
    n = round((stop - start) / step)
    return [(start + i * step, round(rate_bytes_per_s * step)) for i in range(n + 1)]


def test_window_fairness_takes_the_flows_active_for_the_whole_window() -> None:
    arrivals = {
        "a": _steady(1000, 0.0, 3.0),
        "b": _steady(1000, 0.0, 3.0),
        "c": _steady(3000, 1.05, 3.0),  # joins within the second window
    }
    wins = m.window_fairness(arrivals, 0.0, 1.0)
    # [0, 1): a and b alone, equal; [1, 2): c not active from its start: a and b again;
    # [2, 3): all three, c at 3x: (1 + 1 + 3)^2 / (3 (1 + 1 + 9)) = 25/33
    assert wins == [pytest.approx(1.0), pytest.approx(1.0), pytest.approx(25 / 33, rel=0.02)]
    wins = m.window_fairness(arrivals, 0.0, 0.5)
    # from 1.5 on c is active too
    assert wins[:3] == [pytest.approx(1.0)] * 3 and wins[3] == pytest.approx(25 / 33, rel=0.02)
    assert m.window_fairness({"a": _steady(1000, 0.0, 3.0)}, 0.0, 1.0) == []  # one flow only
    with pytest.raises(ValueError):
        m.window_fairness(arrivals, 0.0, 0.0)


def test_link_utilization_counts_what_arrived_after_startup() -> None:
    # two flows of 500 B per 10 ms from 0 to 2 s over a 1 Mb/s link: 800 kb/s, 80 %
    arrivals = {"a": _steady(50_000, 0.0, 2.0), "b": _steady(50_000, 0.0, 2.0)}
    assert m.link_utilization(arrivals, 1e6, 1.0) == pytest.approx(0.8, rel=0.02)
    assert m.link_utilization(arrivals, 1e6, 5.0) is None
