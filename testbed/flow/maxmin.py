"""Max-min fair rates by progressive filling, and flows' completions driven by events.

Progressive filling: every flow not yet frozen grows at the same pace; a link is full when
the coefficients of its flows times their rates reach its capacity, and the flows crossing a
full link freeze. Vectorized over the links x flows incidence (COO arrays from
`routing.Routes`): each round is a few `bincount`s over the incidence, and there are as many
rounds as distinct bottleneck levels (a collective's flows have one or a few).

`reference_rates` is the same definition written plainly, link by link and flow by flow, to
check the vectorized one against.

`complete` runs flows of given sizes and start times to their completions: at every start
and every completion the rates are allocated again among the flows then active (a fluid
model: no queues, no packets, no congestion control; a flow gets its max-min rate at once).
"""

from __future__ import annotations

import numpy as np

from testbed.flow.routing import Routes

REL_EPS = 1e-9  # a link within this fraction of its capacity is full


def rates(routes: Routes, cap: np.ndarray, active: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rate (b/s) of every flow; 0 for flows not `active`."""
    n = routes.n_flows
    rate = np.zeros(n)
    growing = np.ones(n, dtype=bool) if active is None else active.copy()
    flow = routes.flow_of_entry()
    link, coeff = routes.links, routes.coeff
    # keep only the entries of active flows
    keep = growing[flow]
    flow, link, coeff = flow[keep], link[keep], coeff[keep]
    # links that carry nothing cannot limit anyone: work on the used ones only
    used, link = np.unique(link, return_inverse=True)
    rem = cap[used].astype(np.float64).copy()
    full_at = REL_EPS * cap[used]
    while True:
        on = growing[flow]
        if not on.any():
            break
        load = np.bincount(link[on], weights=coeff[on], minlength=len(used))
        busy = load > 0
        room = np.full(len(used), np.inf)
        room[busy] = rem[busy] / load[busy]
        inc = float(room.min())
        rate[growing] += inc
        rem -= inc * load
        # the links that set the increment are full (whatever the rounding left in them)
        full = busy & ((room <= inc * (1 + REL_EPS)) | (rem <= full_at))
        frozen = np.unique(flow[on & full[link]])
        growing[frozen] = False
    return rate


def reference_rates(paths: list[list[tuple[int, float]]], cap: list[float]) -> list[float]:
    """The definition, plainly: paths[f] lists (link, coefficient) of flow f."""
    rate = [0.0] * len(paths)
    frozen = [False] * len(paths)
    rem = list(cap)
    while not all(frozen):
        # per link, the coefficients of the flows still growing
        weight: dict[int, float] = {}
        for f, path in enumerate(paths):
            if not frozen[f]:
                for lk, c in path:
                    weight[lk] = weight.get(lk, 0.0) + c
        if not weight:
            break
        # the smallest fair increment any link allows
        inc = min(rem[lk] / w for lk, w in weight.items())
        for f in range(len(paths)):
            if not frozen[f]:
                rate[f] += inc
        for lk, w in weight.items():
            rem[lk] -= inc * w
        for f, path in enumerate(paths):
            if not frozen[f] and any(rem[lk] <= REL_EPS * cap[lk] for lk, _ in path):
                frozen[f] = True
    return rate


def complete(
    routes: Routes, cap: np.ndarray, sizes_bytes: np.ndarray, starts_s: np.ndarray | None = None
) -> tuple[np.ndarray, int]:
    """Each flow's completion time (s), and the number of rate allocations it took.
    Flows finishing within a relative 1e-9 of each other complete together."""
    n = routes.n_flows
    left = np.asarray(sizes_bytes, dtype=np.float64) * 8  # bits
    start = np.zeros(n) if starts_s is None else np.asarray(starts_s, dtype=np.float64)
    end = np.full(n, np.nan)
    now = float(start.min()) if n else 0.0
    allocations = 0
    started = start <= now
    done = np.zeros(n, dtype=bool)
    while not done.all():
        active = started & ~done
        if not active.any():
            now = float(start[~started].min())
            started = start <= now
            continue
        r = rates(routes, cap, active)
        allocations += 1
        with np.errstate(divide="ignore"):
            t_fin = np.where(active, left / np.where(r > 0, r, np.nan), np.inf)
        if np.isnan(t_fin[active]).any():
            raise ValueError("a flow got no rate (a link of zero capacity on its path)")
        dt = float(np.min(t_fin[active]))
        pending = start[~started]
        if len(pending) and pending.min() < now + dt:
            dt = float(pending.min()) - now
        left[active] -= r[active] * dt
        now += dt
        finished = active & (left <= REL_EPS * np.asarray(sizes_bytes) * 8 + 1e-6)
        end[finished] = now
        done |= finished
        started = start <= now
    return end, allocations
