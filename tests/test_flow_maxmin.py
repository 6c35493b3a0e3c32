"""Max-min by progressive filling: a hand-checked case, and the vectorized allocation
equal to the plain reference on random cases; completions on events."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.flow import maxmin
from testbed.flow.routing import Routes


def routes_of(paths: list[list[tuple[int, float]]]) -> Routes:
    indptr = np.cumsum([0] + [len(p) for p in paths])
    links = np.array([lk for p in paths for lk, _ in p], dtype=np.int64)
    coeff = np.array([c for p in paths for _, c in p], dtype=np.float64)
    empty = np.zeros(0, dtype=np.int64)
    return Routes(indptr, links, coeff, empty, empty, empty)


def test_hand_checked() -> None:
    # link 0: 10, link 1: 4, link 2: 10. f0 on 0,1; f1 on 1; f2 on 0,2; f3 on 2.
    # link 1 fills first: f0 = f1 = 2. Then link 0 has 8 left for f2, link 2 has 10 for
    # f2 and f3: link 2 fills at 5 each. f2 = f3 = 5.
    paths = [[(0, 1.0), (1, 1.0)], [(1, 1.0)], [(0, 1.0), (2, 1.0)], [(2, 1.0)]]
    cap = np.array([10.0, 4.0, 10.0])
    assert maxmin.rates(routes_of(paths), cap).tolist() == pytest.approx([2, 2, 5, 5])
    assert maxmin.reference_rates(paths, cap.tolist()) == pytest.approx([2, 2, 5, 5])


@pytest.mark.parametrize("seed", range(30))
def test_vectorized_equals_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_links, n_flows = int(rng.integers(2, 12)), int(rng.integers(1, 25))
    cap = rng.uniform(1, 100, n_links)
    paths = []
    for _ in range(n_flows):
        hops = rng.choice(n_links, size=int(rng.integers(1, min(5, n_links) + 1)), replace=False)
        weights = rng.choice([1.0, 0.5, 0.25], size=len(hops))
        paths.append([(int(h), float(w)) for h, w in zip(hops, weights, strict=True)])
    fast = maxmin.rates(routes_of(paths), cap)
    ref = maxmin.reference_rates(paths, cap.tolist())
    assert fast.tolist() == pytest.approx(ref, rel=1e-9)
    # feasible, and every flow meets a full link (it cannot grow)
    load = np.zeros(n_links)
    for f, p in enumerate(paths):
        for lk, c in p:
            load[lk] += c * fast[f]
    assert np.all(load <= cap * (1 + 1e-9))
    full = load >= cap * (1 - 1e-9)
    assert all(any(full[lk] for lk, _ in p) for p in paths)


def test_completions_reallocate() -> None:
    # two flows on one link of 8 b/s: 2 bytes and 4 bytes. Together at 4 b/s each: the
    # first (16 bits) ends at 4 s, the second then has 16 bits left at 8 b/s: 6 s.
    r = routes_of([[(0, 1.0)], [(0, 1.0)]])
    end, allocs = maxmin.complete(r, np.array([8.0]), np.array([2.0, 4.0]))
    assert end.tolist() == pytest.approx([4.0, 6.0]) and allocs == 2


def test_late_start() -> None:
    r = routes_of([[(0, 1.0)], [(0, 1.0)]])
    end, _ = maxmin.complete(r, np.array([8.0]), np.array([4.0, 1.0]), np.array([0.0, 1.0]))
    # f0 alone for 1 s (8 bits), then both at 4 b/s: f1 (8 bits) ends at 3 s, f0 has
    # 32 - 8 - 8 = 16 bits left at 8 b/s: 5 s
    assert end.tolist() == pytest.approx([5.0, 3.0])


@pytest.mark.parametrize("seed", range(5))
def test_many_levels_equal_the_reference(seed: int) -> None:
    # hundreds of flows at dozens of bottleneck levels: the rounds that take frozen flows'
    # entries out of the links' loads, against the definition
    rng = np.random.default_rng(100 + seed)
    n_links, n_flows = 40, 300
    cap = rng.integers(1, 50, n_links).astype(np.float64) * 10
    paths = [
        [(int(h), 1.0) for h in rng.choice(n_links, size=int(rng.integers(1, 5)), replace=False)]
        for _ in range(n_flows)
    ]
    fast = maxmin.rates(routes_of(paths), cap)
    assert len(np.unique(fast.round(9))) > 10
    assert fast.tolist() == pytest.approx(maxmin.reference_rates(paths, cap.tolist()), rel=1e-9)


def test_completions_equal_allocating_from_scratch() -> None:
    # the events of `complete` against a plain loop: at each completion, the reference's
    # rates among the flows left
    rng = np.random.default_rng(7)
    n_links, n_flows = 12, 60
    cap = rng.integers(1, 20, n_links).astype(np.float64)
    paths = [
        [(int(h), 1.0) for h in rng.choice(n_links, size=int(rng.integers(1, 4)), replace=False)]
        for _ in range(n_flows)
    ]
    sizes = rng.integers(1, 100, n_flows).astype(np.float64)
    end, _ = maxmin.complete(routes_of(paths), cap, sizes)
    left = {f: sizes[f] * 8 for f in range(n_flows)}
    now, want = 0.0, [0.0] * n_flows
    while left:
        alive = sorted(left)
        rate = maxmin.reference_rates([paths[f] for f in alive], cap.tolist())
        dt = min(left[f] / r for f, r in zip(alive, rate, strict=True))
        now += dt
        for f, r in zip(alive, rate, strict=True):
            left[f] -= r * dt
            if left[f] <= 1e-9 * sizes[f] * 8 + 1e-6:
                want[f] = now
                del left[f]
    assert end.tolist() == pytest.approx(want, rel=1e-9)
