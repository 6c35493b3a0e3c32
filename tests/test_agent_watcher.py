"""WatchRates' subscriber (controller/nic/agent/agent.py, no root): what `min_change` lets
through is measured against the rate the watcher was last told. And the histogram of the
pacer's lag behind the rate laws."""

from __future__ import annotations

from controller.nic.agent.agent import APPLY_LAG_BOUNDS_S, LagHistogram, RateEvent, Watcher
from controller.nic.bpf.loader import FlowKey

A = FlowKey("10.0.1.1", "10.0.2.2", 17, 50000, 4791)
B = FlowKey("10.0.1.1", "10.0.3.3", 17, 50001, 4791)


def _told(w: Watcher) -> list[tuple[FlowKey, int]]:
    out = []
    while not w.q.empty():
        ev = w.q.get_nowait()
        assert ev is not None
        out.append((ev.key, ev.rate_bps))
    return out


def _offer(w: Watcher, key: FlowKey, rates: list[int]) -> None:
    prev = 0
    for r in rates:
        w.offer(RateEvent(key, r, prev, "law", 0))
        prev = r


def test_small_steps_that_add_up_to_a_change_are_told() -> None:
    w = Watcher(None, 0.1)
    # 100, then steps of about 3 %: 88 is 12 % under the 100 told; 86 and 80 are within
    # 10 % of the 88 told, 79 is not
    _offer(w, A, [100, 97, 94, 91, 88, 86, 80, 79])
    assert _told(w) == [(A, 100), (A, 88), (A, 79)]


def test_the_first_rate_of_each_flow_is_told_even_unchanged() -> None:
    w = Watcher(None, 0.5)
    w.offer(RateEvent(A, 100, 100, "current", 0))  # the subscription's snapshot
    w.offer(RateEvent(B, 40, 40, "current", 0))
    w.offer(RateEvent(A, 120, 100, "law", 0))  # +20 %: under min_change
    w.offer(RateEvent(A, 160, 120, "law", 0))  # +60 % of what was told
    assert _told(w) == [(A, 100), (B, 40), (A, 160)]


def test_without_min_change_every_event_is_told() -> None:
    w = Watcher(None, 0.0)
    _offer(w, A, [100, 100, 99])
    assert _told(w) == [(A, 100), (A, 100), (A, 99)]
    assert w.told == {}


def test_a_watcher_of_some_flows_ignores_the_others() -> None:
    w = Watcher({A}, 0.0)
    _offer(w, B, [1, 2])
    _offer(w, A, [3])
    assert _told(w) == [(A, 3)]


def test_what_a_watcher_remembers_is_bounded() -> None:
    w = Watcher(None, 0.1)
    w.MAX_TOLD = 4
    for port in range(10):
        w.offer(RateEvent(A._replace(sport=port), 100, 0, "law", 0))
    assert len(w.told) <= 4
    assert len(_told(w)) == 10


def test_the_pacers_lag_is_counted_in_prometheus_buckets() -> None:
    """An observation at a bound counts in that bound's bucket (Prometheus's le), one above
    every bound only in +Inf; the buckets are cumulative and the sum is the observations'."""
    lag = LagHistogram()
    for s in (0.0, 0.0005, 0.0007, 0.03, 3.0):
        lag.observe(s)
    got = dict(lag.cumulative())
    assert list(got) == [*map(str, APPLY_LAG_BOUNDS_S), "+Inf"]
    assert (got["0.0005"], got["0.001"], got["0.02"], got["0.05"], got["1.0"]) == (2, 3, 3, 4, 4)
    assert got["+Inf"] == 5
    assert lag.sum_s == 0.0 + 0.0005 + 0.0007 + 0.03 + 3.0
