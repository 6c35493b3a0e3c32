"""The flow engine's fabrics: shapes and counts, bad input named, export to the packet
engines' topology format."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from testbed.flow.fabric import (
    AGG_UP,
    LEAF_UP,
    NIC_UP,
    ClosParams,
    FabricError,
    build_clos,
    from_spec,
    summary,
    to_spec,
)
from testbed.topo import from_doc, leafspine, to_doc

SMALL: dict[str, Any] = {
    "radix": 8,
    "switch_tbps": 3.2,
}  # 8 x 400G switches: small fabrics, same shapes


def test_131k_rail_three_tier_counts() -> None:
    fab = build_clos(ClosParams(131072, tiers=3))
    s = summary(fab)
    # 8 planes x (256 leaves + 4 pods x 64 aggs + 64 groups x 2 cores)
    assert s["switches"] == 8 * (256 + 256 + 128) == 5120
    assert s["nic_cables"] == s["leaf_up_cables"] == s["agg_up_cables"] == 131072
    assert s["bisection_bps"] == 131072 * 400e9 / 2  # non-blocking
    # every switch uses at most its 128 ports
    ports = np.bincount(fab.link_src[fab.link_kind != 0], minlength=fab.n_nodes)
    assert ports[fab.n_gpus : fab.shape["su_node"]].max() <= 128


def test_two_tier_plain_clos_oversubscribed() -> None:
    fab = build_clos(ClosParams(1024, tiers=2, rail=False, oversub=3.0))
    s = summary(fab)
    assert fab.shape["down"] == 96 and fab.shape["up"] == 32
    assert s["nic_cables"] == 1024 and s["leaf_up_cables"] == 11 * 32
    assert s["bisection_bps"] == 11 * 32 * 400e9 / 2


def test_every_nic_on_its_rail() -> None:
    fab = build_clos(ClosParams(64, **SMALL))
    nic = fab.link_kind == NIC_UP
    leaf = fab.link_dst[nic] - fab.n_gpus
    plane = leaf // fab.shape["leaves"]
    assert np.array_equal(plane, np.arange(64) % 8)  # NIC g of every server on plane g


@pytest.mark.parametrize(
    ("params", "names"),
    [
        (ClosParams(100), "--gpus 100"),
        (ClosParams(64, radix=130), "--radix 130"),
        (ClosParams(64, oversub=0), "--oversub"),
        (ClosParams(131072, tiers=2), "--tiers 3"),
        (ClosParams(131072, tiers=3, memory_limit=1 << 20), "--gpus 131072"),
    ],
)
def test_bad_input_names_the_parameter(params: ClosParams, names: str) -> None:
    with pytest.raises(FabricError, match=names):
        build_clos(params)


@pytest.mark.parametrize("tiers", [2, 3])
def test_export_loads_back_with_the_same_links(tiers: int) -> None:
    fab = build_clos(ClosParams(128, tiers=tiers, **SMALL))
    spec = from_doc(to_doc(to_spec(fab)))  # through the YAML format's validation
    assert len(spec.hosts) == 16 and all(len(h.nics) == 8 for h in spec.hosts)
    back = from_spec(spec)
    # the same cables (scale-up aside), switch to switch and NIC to leaf
    kinds = summary(fab)
    again = summary(back)
    assert again["nic_cables"] == kinds["nic_cables"]
    assert again["leaf_up_cables"] == kinds["leaf_up_cables"] + kinds["agg_up_cables"]
    assert again["switches"] == kinds["switches"]


def test_export_refuses_a_large_fabric() -> None:
    with pytest.raises(FabricError, match="at most"):
        to_spec(build_clos(ClosParams(4096)))


def test_from_spec_leafspine() -> None:
    fab = from_spec(leafspine(2, 2, 4))
    assert fab.n_gpus == 8 and not fab.structured
    assert int(np.sum(fab.link_kind == LEAF_UP)) == 4 and not np.any(fab.link_kind == AGG_UP)
