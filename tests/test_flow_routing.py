"""ECMP as the P4 program does it, the arithmetic router against the search, collisions,
rail alignment and spraying."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from testbed.flow.fabric import LEAF_UP, NIC_UP, ClosParams, build_clos, from_spec
from testbed.flow.routing import (
    ECMP_ALGO,
    _route_search,
    collisions,
    ecmp_hash,
    entropy_ports,
    route,
)
from testbed.switch.hashes import get_hash
from testbed.topo import leafspine

REPO = Path(__file__).resolve().parents[1]
SMALL: dict[str, Any] = {"radix": 8, "switch_tbps": 3.2}


def test_the_selector_is_crc16_over_the_five_tuple() -> None:
    prog = json.loads((REPO / "p4src/build/xingmai.json").read_text())
    sel = next(
        ap["selector"]
        for pl in prog["pipelines"]
        for ap in pl.get("action_profiles", [])
        if ap["name"].endswith("routing.ecmp_selector")
    )
    assert sel["algo"] == ECMP_ALGO
    fields = [i["value"][1] for i in sel["input"]]
    assert fields[:3] == ["src_addr", "dst_addr", "protocol"]
    assert "l4_sport" in fields[3] and "l4_dport" in fields[4] and len(fields) == 5


def test_vectorized_hash_is_the_switch_hash() -> None:
    rng = np.random.default_rng(3)
    src = rng.integers(0, 2**32, 200, dtype=np.uint64).astype(np.uint32)
    dst = rng.integers(0, 2**32, 200, dtype=np.uint64).astype(np.uint32)
    sport = rng.integers(49152, 65536, 200).astype(np.uint32)
    crc = get_hash("crc16")
    want = [
        crc(
            int(a).to_bytes(4, "big")
            + int(b).to_bytes(4, "big")
            + bytes([17])
            + int(s).to_bytes(2, "big")
            + (4791).to_bytes(2, "big")
        )
        for a, b, s in zip(src, dst, sport, strict=True)
    ]
    assert ecmp_hash(src, dst, sport).tolist() == want


def _random_flows(n_gpus: int, n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n_gpus, n), rng.integers(0, n_gpus, n)
    keep = src != dst
    return src[keep], dst[keep]


@pytest.mark.parametrize(
    "params",
    [
        ClosParams(64, **SMALL),
        ClosParams(128, tiers=3, **SMALL),
        ClosParams(128, tiers=3, rail=False, oversub=3.0, **SMALL),
        # parallel links: 4 leaves of 6 up over 2 spines, 3 links each
        ClosParams(24, gpus_per_server=4, rail=False, radix=12, switch_tbps=4.8),
    ],
)
def test_arithmetic_routes_equal_the_search(params: ClosParams) -> None:
    fab = build_clos(params)
    src, dst = _random_flows(params.gpus, 400)
    sport = entropy_ports(src, dst)
    fast = route(fab, src, dst, sport)
    h = ecmp_hash(fab.gpu_ip[src], fab.gpu_ip[dst], sport)
    slow = _route_search(fab, src, dst, h, spray=False)
    assert all(fast.path(f) == slow.path(f) for f in range(len(src)))
    assert collisions(fast) == collisions(slow)


def test_same_rail_traffic_stays_in_its_plane() -> None:
    fab = build_clos(ClosParams(128, tiers=3, **SMALL))
    src = np.arange(0, 64, 8) + 3  # GPU 3 of servers 0..7
    dst = np.arange(64, 128, 8) + 3  # GPU 3 of servers 8..15
    r = route(fab, src, dst, entropy_ports(src, dst))
    ends = np.concatenate([fab.link_src[r.links], fab.link_dst[r.links]])
    switches = ends[(ends >= fab.n_gpus) & (ends < fab.shape["su_node"])] - fab.n_gpus
    names = {fab.switch_names[s] for s in switches}
    assert names and all(n.startswith("p4") for n in names)  # plane 4 = rail 3
    assert not np.any(fab.link_kind[r.links] == 0)  # no scale-up hop


def test_cross_rail_goes_over_scale_up_then_the_destination_rail() -> None:
    fab = build_clos(ClosParams(64, **SMALL))
    r = route(fab, np.array([1]), np.array([8 * 5 + 6]), np.array([50000]))
    path = r.path(0)
    assert fab.link_kind[path[0]] == 0 and fab.link_dst[path[1]] == 6  # to GPU 6, server 0
    assert fab.link_src[path[2]] == 6 and fab.link_kind[path[2]] == NIC_UP


def test_collisions_counted_against_a_perfect_spread() -> None:
    # 2 leaves of 4 hosts, 2 spines: 4 flows from leaf 1 to leaf 2 over 2 uplinks
    fab = from_spec(leafspine(2, 2, 4))
    src, dst = np.arange(4), np.arange(4, 8)
    rng = np.random.default_rng(5)
    for _ in range(200):
        r = route(fab, src, dst, rng.integers(49152, 65536, 4))
        ups = [lk for f in range(4) for lk in r.path(f) if fab.link_kind[lk] == LEAF_UP]
        per_link = np.bincount(ups)
        per_link = per_link[per_link > 0]
        c = collisions(r)
        # leaf uplinks: 4 flows over 2 links, perfect is 2 each
        excess_up = int(np.sum(np.maximum(per_link - 2, 0)))
        assert c["excess"] >= excess_up
        if per_link.max() == 4:
            assert c["worst"] == 4 and c["worst_perfect"] == 2
            return
    pytest.fail("no sport gave a 4-way collision")


def test_spraying_splits_evenly() -> None:
    fab = from_spec(leafspine(2, 2, 4))
    r = route(fab, np.array([0]), np.array([5]), np.array([50000]), spray=True)
    ups = [(lk, c) for lk, c in zip(r.links, r.coeff, strict=True) if fab.link_kind[lk] == LEAF_UP]
    assert len(ups) == 2 and all(c == 0.5 for _, c in ups)
    # every hop's coefficients sum to 1 (2 NIC links + 2 x 1/2 up + 2 x 1/2 down)
    assert r.coeff.sum() == pytest.approx(4.0)
