"""Weighted max-min fair shares by progressive filling (water-filling).

Every flow crosses a set of links; every link has a capacity. All flows grow together (in
proportion to their weights) until a link is full or a flow reaches its demand; those flows
are frozen and the rest keep growing. The result is the unique weighted max-min fair
allocation; each frozen flow also gets the link that froze it (its bottleneck).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

F = TypeVar("F", bound=Hashable)

_EPS = 1e-9


@dataclass(frozen=True)
class Share(Generic[F]):
    flow: F
    rate: float
    bottleneck: str | None  # None: limited by its own demand


def max_min_fair(
    paths: Mapping[F, Sequence[str]],
    capacity: Mapping[str, float],
    weights: Mapping[F, float] | None = None,
    demands: Mapping[F, float] | None = None,
) -> dict[F, Share[F]]:
    """Shares of the flows in `paths` (flow -> links crossed).

    Links missing from `capacity` do not constrain. A flow that crosses no constrained link and
    has no demand gets an infinite rate (it is not in the result then). Weights default to 1;
    demands default to unlimited.
    """
    weights = weights or {}
    demands = demands or {}
    w = {f: max(float(weights.get(f, 1.0)), _EPS) for f in paths}
    links_of = {f: [lk for lk in dict.fromkeys(p) if lk in capacity] for f, p in paths.items()}
    remaining = {lk: float(c) for lk, c in capacity.items()}
    users: dict[str, set[F]] = {}
    for f, lks in links_of.items():
        for lk in lks:
            users.setdefault(lk, set()).add(f)
    rate = {f: 0.0 for f in paths}
    active = {f for f in paths if links_of[f] or f in demands}
    out: dict[F, Share[F]] = {}
    while active:
        # the smallest increase of the "water level" (rate per unit weight) that fills something
        step = float("inf")
        for lk, fs in users.items():
            live = [f for f in fs if f in active]
            if live:
                step = min(step, remaining[lk] / sum(w[f] for f in live))
        for f in active:
            if f in demands:
                step = min(step, (demands[f] - rate[f]) / w[f])
        step = max(step, 0.0)
        if step == float("inf"):
            break
        for f in active:
            rate[f] += step * w[f]
        for lk, fs in users.items():
            live_w = sum(w[f] for f in fs if f in active)
            remaining[lk] -= step * live_w
        frozen: dict[F, str | None] = {}
        for lk, fs in users.items():
            if remaining[lk] <= _EPS * max(1.0, capacity[lk]):
                for f in fs:
                    if f in active and f not in frozen:
                        frozen[f] = lk
        for f in active:
            if f in demands and rate[f] >= demands[f] - _EPS * max(1.0, demands[f]):
                frozen.setdefault(f, None)
        if not frozen:  # numerical corner: nothing moved
            break
        for f, neck in frozen.items():
            active.discard(f)
            out[f] = Share(f, rate[f], neck)
    return out
