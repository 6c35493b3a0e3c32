"""Max-min fair shares: the textbook cases, weights, demands, and the fairness property checked
on random instances (no flow can grow without taking from a flow that has no more)."""

from __future__ import annotations

import random

import pytest

from controller.maxmin import max_min_fair


def test_equal_split_of_one_bottleneck() -> None:
    paths = {f"f{i}": ["up", "core"] for i in range(4)}
    shares = max_min_fair(paths, {"up": 100.0, "core": 40.0})
    assert {f: round(s.rate, 9) for f, s in shares.items()} == {f: 10.0 for f in paths}
    assert {s.bottleneck for s in shares.values()} == {"core"}


def test_classic_parking_lot() -> None:
    # f0 crosses both links; f1 only the first, f2 and f3 only the second
    paths = {"f0": ["a", "b"], "f1": ["a"], "f2": ["b"], "f3": ["b"]}
    shares = max_min_fair(paths, {"a": 10.0, "b": 9.0})
    assert shares["f0"].rate == pytest.approx(3.0)
    assert shares["f2"].rate == pytest.approx(3.0) and shares["f3"].rate == pytest.approx(3.0)
    assert shares["f1"].rate == pytest.approx(7.0) and shares["f1"].bottleneck == "a"


def test_weights_and_demands() -> None:
    paths = {"a": ["l"], "b": ["l"], "c": ["l"]}
    shares = max_min_fair(paths, {"l": 12.0}, weights={"a": 2.0})
    assert [round(shares[f].rate, 6) for f in "abc"] == [6.0, 3.0, 3.0]
    shares = max_min_fair(paths, {"l": 12.0}, demands={"a": 1.0})
    assert shares["a"].rate == pytest.approx(1.0) and shares["a"].bottleneck is None
    assert shares["b"].rate == pytest.approx(5.5)


def test_unconstrained_flows_are_left_out() -> None:
    shares = max_min_fair({"x": ["unknown-link"], "y": ["l"]}, {"l": 5.0})
    assert set(shares) == {"y"}


def test_random_instances_are_feasible_and_max_min_fair() -> None:
    rng = random.Random(11)
    for _ in range(200):
        links = [f"l{i}" for i in range(rng.randint(1, 6))]
        cap = {lk: rng.uniform(1, 100) for lk in links}
        paths = {
            f"f{i}": rng.sample(links, rng.randint(1, len(links)))
            for i in range(rng.randint(1, 10))
        }
        shares = max_min_fair(paths, cap)
        assert set(shares) == set(paths)
        load = {lk: sum(shares[f].rate for f, p in paths.items() if lk in p) for lk in links}
        for lk in links:
            assert load[lk] <= cap[lk] * (1 + 1e-6)
        for f, s in shares.items():
            # its bottleneck is full and no flow on it has a larger rate
            b = s.bottleneck
            assert b is not None and b in paths[f]
            assert load[b] == pytest.approx(cap[b], rel=1e-6)
            assert all(shares[g].rate <= s.rate * (1 + 1e-6) for g, p in paths.items() if b in p)
