"""ECMP as the P4 program does it, the arithmetic router against the search, collisions,
rail alignment and spraying."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from testbed.flow.fabric import (
    LEAF_UP,
    NIC_DOWN,
    NIC_UP,
    ClosParams,
    FabricError,
    build_clos,
    fail,
    from_spec,
)
from testbed.flow.routing import (
    ECMP_ALGO,
    NoPathError,
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
# rail 2-tier, rail 3-tier, plain 3-tier 3:1 oversubscribed, and parallel links (4 leaves of
# 6 up over 2 spines, 3 links each)
SHAPES = [
    ClosParams(64, **SMALL),
    ClosParams(128, tiers=3, **SMALL),
    ClosParams(128, tiers=3, rail=False, oversub=3.0, **SMALL),
    ClosParams(24, gpus_per_server=4, rail=False, radix=12, switch_tbps=4.8),
]


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


@pytest.mark.parametrize("params", SHAPES)
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


def _assert_no_shortest_path(
    fab0: Any, fab: Any, src: np.ndarray, dst: np.ndarray, h: np.ndarray, err: Exception
) -> None:
    """The flow the arithmetic router refused has no path on the failed fabric as short as
    on the whole one: the search finds none, a longer one, or one that detours over the
    server's scale-up domain first (which the search tries whenever the network has no
    path; the arithmetic router relays only on rail-optimized fabrics, to the
    destination's rail)."""
    a, b = (int(x) for x in re.findall(r"GPU (\d+)", str(err)))
    f = int(np.flatnonzero((src == a) & (dst == b))[0])
    one = slice(f, f + 1)
    whole = _route_search(fab0, src[one], dst[one], h[one], False)
    try:
        longer = _route_search(fab, src[one], dst[one], h[one], False)
    except ValueError as no_path:
        assert "no path" in str(no_path)
        return
    assert longer.indptr[1] > whole.indptr[1] or fab.link_kind[longer.links[0]] == 0


@pytest.mark.parametrize(
    "params",
    [
        ClosParams(32, rail=False, **SMALL),
        ClosParams(128, tiers=3, **SMALL),
        ClosParams(128, tiers=3, rail=False, oversub=3.0, **SMALL),
        ClosParams(24, gpus_per_server=4, rail=False, radix=12, switch_tbps=4.8),
    ],
)
def test_failures_route_as_the_controller_fails_over(params: ClosParams) -> None:
    """A switch and a cable down: the arithmetic router's paths are the search's over the
    live links (shortest paths, ECMP over the live next hops in port order: the
    controller's fail-over), and none crosses a link down; where it refuses a flow, the
    search finds no path as short as the fabric's own."""
    fab0 = build_clos(params)
    rng = np.random.default_rng(11)
    spines = [n for n in fab0.switch_names if "l" not in n[2:]]
    inner = np.flatnonzero(
        (fab0.link_kind != NIC_UP) & (fab0.link_kind != NIC_DOWN) & (fab0.link_kind != 0)
    )
    routed = refused = 0
    for _ in range(8):
        lk = int(rng.choice(inner))
        cable = f"{fab0.node_name(int(fab0.link_src[lk]))}-{fab0.node_name(int(fab0.link_dst[lk]))}"
        fab = fail(fab0, [str(rng.choice(spines)), cable])
        src, dst = _random_flows(params.gpus, 200, int(rng.integers(1 << 30)))
        sport = entropy_ports(src, dst)
        h = ecmp_hash(fab.gpu_ip[src], fab.gpu_ip[dst], sport)
        try:
            fast = route(fab, src, dst, sport)
        except NoPathError as e:
            _assert_no_shortest_path(fab0, fab, src, dst, h, e)
            refused += 1
            continue
        slow = _route_search(fab, src, dst, h, spray=False)
        assert all(fast.path(f) == slow.path(f) for f in range(len(src)))
        assert collisions(fast) == collisions(slow)
        assert fab.down is not None and not fab.down[fast.links].any()
        routed += 1
    assert routed >= 4


def test_what_cannot_fail_is_named() -> None:
    fab = build_clos(ClosParams(128, tiers=3, **SMALL))
    for bad, why in [
        ("p1l1", "a leaf"),
        ("p9s1", "no switch of that name"),
        ("p1d1a1-p2d1a1", "no cable between"),
        ("p1d1a1-nowhere", "SWITCH-SWITCH"),
    ]:
        with pytest.raises(FabricError, match=why):
            fail(fab, [bad])
    # every spine of a plane down: that plane's cross-leaf flows have no path left
    plane1 = [n for n in fab.switch_names if n.startswith("p1d1a")]
    with pytest.raises(NoPathError, match="no up-down path left"):
        route(fail(fab, plane1), np.array([0]), np.array([8 * 15]), np.array([50000]))


def _per_flow(r: Any, f: int) -> list[tuple[int, float]]:
    lo, hi = r.indptr[f], r.indptr[f + 1]
    return sorted(
        (int(lk), round(float(c), 12)) for lk, c in zip(r.links[lo:hi], r.coeff[lo:hi], strict=True)
    )


@pytest.mark.parametrize("params", SHAPES)
@pytest.mark.parametrize("down", [False, True])
def test_arithmetic_spraying_equals_the_search(params: ClosParams, down: bool) -> None:
    fab0 = fab = build_clos(params)
    if down:  # one aggregation (spine) switch and one cable down
        spines = [n for n in fab.switch_names if "l" not in n[2:]]
        inner = np.flatnonzero(fab.link_kind >= LEAF_UP)
        lk = int(inner[len(inner) // 3])
        cable = f"{fab.node_name(int(fab.link_src[lk]))}-{fab.node_name(int(fab.link_dst[lk]))}"
        fab = fail(fab, [spines[-1], cable])
    src, dst = _random_flows(params.gpus, 300, 4)
    sport = entropy_ports(src, dst)
    h = ecmp_hash(fab.gpu_ip[src], fab.gpu_ip[dst], sport)
    try:
        fast = route(fab, src, dst, sport, spray=True)
    except NoPathError as e:  # e.g. one spine per plane: that plane is cut
        _assert_no_shortest_path(fab0, fab, src, dst, h, e)
        return
    slow = _route_search(fab, src, dst, h, spray=True)
    assert all(_per_flow(fast, f) == _per_flow(slow, f) for f in range(len(src)))
    assert len(fast.choice_link) == 0


def _controller_topology(fab: Any, down_elements: list[str]) -> tuple[Any, dict[Any, int]]:
    """The controller's own routing (controller/topology.py) of the fabric `to_spec` exports,
    with the same switches and cables down; and each switch's port towards a neighbour."""
    import yaml

    from controller.config import parse
    from controller.topology import Topology, link_id
    from testbed.ctlconfig import ControllerSetup, SwitchAccess, controller_config
    from testbed.flow.fabric import to_spec
    from testbed.model import Scaling

    spec = to_spec(fab)
    access = {s.name: SwitchAccess("127.0.0.1:1", "builtin") for s in spec.switches}
    doc = controller_config(
        spec, Scaling(), access, {}, ControllerSetup("127.0.0.1:1", None, ""), "/p", "/j"
    )
    doc["controller"].pop("log_file", None)
    cfg = parse(yaml.safe_load(yaml.safe_dump(doc)))
    port_of: dict[Any, int] = {}
    down = set()
    failed = set(down_elements)
    for lk in spec.links:
        a, b = lk.a.node, lk.b.node
        if failed & {a, b, f"{a}-{b}", f"{b}-{a}"}:
            down.add(link_id(str(lk.a), str(lk.b)))
        for x, y in ((lk.a, lk.b), (lk.b, lk.a)):
            if x.node in access:  # a switch's port towards a switch, or a host's NIC
                key = (x.node, str(y) if y.node not in access else y.node)
                assert key not in port_of, f"parallel links {key}: not this test's fabric"
                port_of[key] = x.index
    return Topology(cfg, down=frozenset(down)), port_of


@pytest.mark.parametrize(
    "params",
    [
        # rail-optimized, 4 planes of 4 pods (radix 4: no parallel links to tell apart)
        ClosParams(64, gpus_per_server=4, tiers=3, radix=4, switch_tbps=1.6),
        ClosParams(128, tiers=3, rail=False, oversub=3.0, **SMALL),
    ],
)
@pytest.mark.parametrize("down", [[], ["p1d1a1"], ["p1d2a2", "p1d1a1-p1c1"]])
def test_every_choice_is_the_controllers_next_hop_by_the_switch_hash(
    params: ClosParams, down: list[str]
) -> None:
    """At every switch of every path, the link the flow engine takes is the controller's next
    hop for the destination (its routes over what is alive, sorted by port) that the switch's
    selector picks with the weights the controller gives its groups: (hash // the switch's
    digit base) % members (controller.ecmp). The controller's code, not a copy of its rule."""
    fab0 = build_clos(params)
    topo, port_of = _controller_topology(fab0, down)
    fab = fail(fab0, down) if down else fab0
    src, dst = _random_flows(fab.n_gpus, 300, 3)
    apart = src // fab.gpus_per_server != dst // fab.gpus_per_server
    src, dst = src[apart], dst[apart]
    sport = entropy_ports(src, dst)
    r = route(fab, src, dst, sport)
    h = ecmp_hash(fab.gpu_ip[src], fab.gpu_ip[dst], sport)
    routes: dict[str, Any] = {}
    checked = 0
    for f in range(len(src)):
        ip = ".".join(str(int(fab.gpu_ip[dst[f]]) >> s & 255) for s in (24, 16, 8, 0))
        for lk in r.path(f):
            a, b = int(fab.link_src[lk]), int(fab.link_dst[lk])
            if not fab.n_gpus <= a < fab.shape["su_node"]:
                continue  # a NIC's or the scale-up domain's link: no switch decides
            sw = fab.node_name(a)
            host, nic = divmod(b, fab.gpus_per_server)
            nxt = f"h{host + 1}:{nic}" if b < fab.n_gpus else fab.node_name(b)
            if sw not in routes:
                routes[sw] = topo.routes(sw)
            nh = routes[sw][ip]
            pick = (int(h[f]) // topo.ecmp_base[sw]) % len(nh)
            assert port_of[(sw, nxt)] == nh[pick].port, (f, sw, nh)
            checked += 1
    assert checked > 3 * len(src)
