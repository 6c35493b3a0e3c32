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
