"""Max-min fair rates by progressive filling, and flows' completions driven by events.

Progressive filling: every flow not yet frozen grows at the same pace; a link is full when
the coefficients of its flows times their rates reach its capacity, and the flows crossing a
full link freeze. Vectorized over the links x flows incidence (`routing.Routes`, with its
entries also in link order): the links' loads are summed once per allocation, and a round
costs the used links plus the entries of the flows that froze in it, which leave the loads.
There are as many rounds as distinct bottleneck levels: a ring's flows have one or a few; an
all-to-all whose flows collide on ECMP has about one per host (each host link's share rises
as its flows freeze elsewhere).

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
    flow_of, by_link = routes.incidence()
    # the entries of the growing flows, in link order (each link's in flow order)
    ent = by_link[growing[flow_of[by_link]]]
    if not len(ent):
        return rate
    lk = routes.links[ent]
    first = np.flatnonzero(np.r_[True, lk[1:] != lk[:-1]])  # each used link's first entry
    used = lk[first]
    ptr = np.r_[first, len(ent)]
    local = np.zeros(len(cap), dtype=np.int64)
    local[used] = np.arange(len(used))
    load = np.add.reduceat(routes.coeff[ent], first)
    flows_on = np.diff(ptr)
    rem = cap[used].astype(np.float64).copy()
    full_at = REL_EPS * cap[used]
    # Every growing flow has the same rate, `level`, the sum of the increments so far; a flow
    # freezes at the level it had, and its entries leave the links' loads. A round costs the
    # used links and the entries that froze in it: an all-to-all's flows freeze over as many
    # rounds as there are hosts, at as many levels.
    level = 0.0
    seen = np.zeros(n, dtype=np.int64)
    while True:
        busy = flows_on > 0
        if not busy.any():
            break
        room = np.divide(rem, load, out=np.full(len(used), np.inf), where=busy)
        inc = float(room.min())
        level += inc
        rem -= inc * load
        # the links that set the increment are full (whatever the rounding left in them)
        full = np.flatnonzero(busy & ((room <= inc * (1 + REL_EPS)) | (rem <= full_at)))
        on_full = flow_of[ent[_ranges(ptr[full], ptr[full + 1])]]
        on_full = on_full[growing[on_full]]
        # each once (a flow may cross two full links): its last occurrence
        seen[on_full] = np.arange(len(on_full))
        frozen = on_full[seen[on_full] == np.arange(len(on_full))]
        rate[frozen] = level
        growing[frozen] = False
        gone = _ranges(routes.indptr[frozen], routes.indptr[frozen + 1])
        at = local[routes.links[gone]]
        np.subtract.at(load, at, routes.coeff[gone])
        flows_on -= np.bincount(at, minlength=len(used))
        load[flows_on == 0] = 0.0  # what the subtractions' rounding left
    # a growing flow on no link (none in a fabric's routes) grew with the others to the end
    rate[growing] = level
    return rate


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The indices lo[0]..hi[0]-1, lo[1]..hi[1]-1, ... in one array."""
    lens = hi - lo
    total = int(lens.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    # each range's start, shifted by where it begins in the output
    shift = np.repeat(lo - np.cumsum(lens) + lens, lens)
    return shift + np.arange(total)


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
