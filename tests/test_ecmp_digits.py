"""Each tier reads its own digit of the one ECMP hash (controller.ecmp): the digit bases of
two- and three-tier fabrics, the fat-tree of HPCC's paper as a builder, and its aggregation
switches' uplinks all used by the flow engine's routes (one digit for all would use a quarter
of them). The twin's switches against the flow engine: tests/test_flow_twin.py."""

from __future__ import annotations

import numpy as np
import pytest

from controller.ecmp import digit_bases
from testbed.flow.fabric import from_spec
from testbed.flow.routing import entropy_ports, route
from testbed.topo import End, TopologyError, fattree, leafspine, parse_choice


def _adjacency(spec) -> tuple[dict[str, list[str]], set[str]]:  # type: ignore[no-untyped-def]
    adj: dict[str, list[str]] = {s.name: [] for s in spec.switches}
    edge = set()
    for lk in spec.links:
        a, b = lk.a.node, lk.b.node
        if spec.is_switch(a) and spec.is_switch(b):
            adj[a].append(b)
            adj[b].append(a)
        else:
            edge.add(a if spec.is_switch(a) else b)
    return adj, edge


def test_digit_bases_multiply_the_uplinks_of_the_tiers_below() -> None:
    adj, edge = _adjacency(fattree())  # ToRs: 4 uplinks; aggregation switches: 4
    base = digit_bases(adj, edge)
    assert {base[f"tor{i}"] for i in range(1, 21)} == {1}
    assert {base[f"agg{i}"] for i in range(1, 21)} == {4}
    assert {base[f"core{i}"] for i in range(1, 17)} == {16}
    adj, edge = _adjacency(leafspine(4, 3, 2))  # a spine reads the digit above the leaves'
    base = digit_bases(adj, edge)
    assert base["leaf1"] == 1 and base["spine3"] == 3
    # parallel links count (two cables from each leaf to the one spine); a switch no leaf
    # reaches reads the lowest digit
    base = digit_bases(
        {"l1": ["s", "s"], "l2": ["s", "s"], "s": ["l1", "l1", "l2", "l2"], "x": []}, ["l1", "l2"]
    )
    assert base == {"l1": 1, "l2": 1, "s": 2, "x": 1}


def test_fattree_is_hpccs() -> None:
    """The defaults are HPCC's simulation/mix/fat.txt: 320 hosts at 100G under 20 ToRs, 20
    aggregation and 16 core switches, 480 links; aggregation switch j of each pod on the
    cores of group j."""
    spec = parse_choice("fattree")
    assert spec.name == "fattree-5x4x16x4x4-100g"
    assert (len(spec.hosts), len(spec.switches), len(spec.links)) == (320, 56, 480)
    assert spec.link_gbps(End("h1", 0), 400.0) == 100.0
    assert spec.peer(End("tor5", 17)) == End("agg5", 1)  # pod 2's first ToR, first agg
    assert spec.peer(End("agg6", 5)) == End("core5", 2)  # pod 2's second agg: group 2
    assert spec.longest_path_switches() == 5
    assert parse_choice("fattree:2,2,2,2,2,400").links[0].gbps == 400.0
    with pytest.raises(TopologyError, match="ToRs in all"):
        fattree(pods=64, tors_per_pod=4)


def test_the_fat_trees_core_links_all_carry_flows() -> None:
    spec = fattree()
    fab = from_spec(spec)
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, 320, 20000), rng.integers(0, 320, 20000)
    other_pod = src // 64 != dst // 64
    src, dst = src[other_pod], dst[other_pod]
    r = route(fab, src, dst, entropy_ports(src, dst))
    on = np.bincount(r.links, minlength=fab.n_links)
    up = [
        k
        for k in range(fab.n_links)
        if fab.link_name(k).startswith("agg") and int(fab.link_name(k).split(":")[1]) > 4
    ]
    assert len(up) == 80
    # every aggregation-to-core link within 25 % of the mean (one digit for all: 20 links)
    mean = on[up].mean()
    assert all(0.75 * mean < on[k] < 1.25 * mean for k in up), sorted(on[up])
