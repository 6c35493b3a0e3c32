"""Collectives as flows: the symmetry shortcuts equal the step-by-step full computation;
the ideal times worked out by hand on small cases."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from testbed.flow.collectives import (
    alltoall,
    ep_groups,
    rail_rings,
    ring_allreduce,
    suite_collective,
)
from testbed.flow.fabric import ClosParams, build_clos, from_spec
from testbed.topo import leafspine, rail

SMALL: dict[str, Any] = {"radix": 8, "switch_tbps": 3.2}


@pytest.mark.parametrize(
    "params",
    [
        ClosParams(64, **SMALL),
        ClosParams(128, tiers=3, **SMALL),
        ClosParams(128, tiers=3, rail=False, oversub=3.0, **SMALL),
    ],
)
def test_ring_shortcut_equals_every_step(params: ClosParams) -> None:
    fab = build_clos(params)
    fast = ring_allreduce(fab, rail_rings(fab), 1 << 20, symmetric=True)
    full = ring_allreduce(fab, rail_rings(fab), 1 << 20, symmetric=False)
    assert fast.time_s == pytest.approx(full.time_s, rel=1e-12)
    assert fast.flows_computed < full.flows_computed
    assert full.shortcut == "none"


def test_one_ring_per_rail_is_computed_on_a_rail_fabric() -> None:
    fab = build_clos(ClosParams(64, **SMALL))
    r = ring_allreduce(fab, rail_rings(fab), 1 << 20)
    assert r.shortcut == "steps, one ring" and r.flows_computed == 8
    # every hop at the NIC's 400G: 2(n-1) steps of size/n bytes
    n = 8
    assert r.time_s == pytest.approx(2 * (n - 1) * (1 << 20) / n * 8 / 400e9)
    assert r.busbw_bps == pytest.approx(400e9)


@pytest.mark.parametrize(
    ("params", "group"),
    [(ClosParams(64, **SMALL), 16), (ClosParams(128, tiers=3, **SMALL), 32)],
)
def test_alltoall_one_group_equals_all_groups(params: ClosParams, group: int) -> None:
    fab = build_clos(params)
    fast = alltoall(fab, ep_groups(fab, group), 1 << 20, symmetric=True)
    full = alltoall(fab, ep_groups(fab, group), 1 << 20, symmetric=False)
    assert fast.shortcut == "one group" and full.shortcut == "none"
    assert fast.time_s == pytest.approx(full.time_s, rel=1e-12)


def test_alltoall_crossing_leaves_is_not_shortcut() -> None:
    fab = build_clos(ClosParams(64, **SMALL))  # 4 servers per leaf
    r = alltoall(fab, ep_groups(fab, 64), 1 << 20)
    assert r.shortcut == "none"


def test_suite_alltoall_on_an_oversubscribed_leafspine() -> None:
    # 2 leaves of 4 hosts, 2 spines: each host sends 1/8 of its bytes to each of 7 others;
    # 4 of them across the spine. Leaf 1's 2 uplinks carry 4 hosts x 4 blocks: 16 blocks
    # of size/8 at 800G; each NIC sends 7 blocks at 400G. The uplinks take longer:
    # 16 x size/8 x 8 / 800e9 = size x 16 / 800e9 (if ECMP spreads them evenly; less even
    # is slower)
    fab = from_spec(leafspine(2, 2, 4))
    size = 1 << 20
    r = suite_collective(fab, "alltoall", size)
    assert r.time_s >= size * 16 / 800e9 * (1 - 1e-12)
    assert r.time_s >= 7 * size / 8 * 8 / 400e9


def test_suite_allreduce_on_rails_uses_every_channel() -> None:
    fab = from_spec(rail(2, 4, 1))
    r = suite_collective(fab, "allreduce", 1 << 20)
    # two rings of 4, each half the buffer at 400G: 2 x 3 steps of (size/2)/4
    assert r.time_s == pytest.approx(6 * (1 << 20) / 2 / 4 * 8 / 400e9)
    assert r.busbw_bps == pytest.approx(800e9)
    assert np.isfinite(r.bottleneck_util)
