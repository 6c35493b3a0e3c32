"""Collectives as flows: the symmetry shortcuts equal the step-by-step full computation;
the ideal times worked out by hand on small cases."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from testbed.flow import collectives
from testbed.flow.collectives import (
    alltoall,
    ep_groups,
    flat_ring,
    model_link_latency,
    plan_flows,
    rail_rings,
    ring_allreduce,
    ring_latency,
    suite_collective,
)
from testbed.flow.fabric import NIC_UP, ClosParams, build_clos, fail, from_spec
from testbed.model import link_latency_s
from testbed.topo import leafspine, rail
from testbed.traffic.collective_plans import Op, Transfer

SMALL: dict[str, Any] = {"radix": 8, "switch_tbps": 3.2}


@pytest.mark.parametrize(
    "params",
    [
        ClosParams(64, **SMALL),
        ClosParams(128, tiers=3, **SMALL),
        ClosParams(128, tiers=3, rail=False, oversub=3.0, **SMALL),
    ],
)
@pytest.mark.parametrize("down", [(), ("p1d1a2",)])
def test_ring_shortcut_equals_every_step(params: ClosParams, down: tuple[str, ...]) -> None:
    fab = build_clos(params)
    if down and params.tiers == 2:
        return  # one spine per plane there: a spine down cuts its plane
    fab = fail(fab, down)
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


def test_link_latency_is_the_base_rtt_over_the_links_there_and_back() -> None:
    # 1 us over a leaf-spine's longest path (3 switches: 4 links each way): 125 ns a link
    assert link_latency_s(1e-6) == pytest.approx(125e-9)
    assert link_latency_s(1e-6, 5) == pytest.approx(1e-6 / 12)
    assert model_link_latency() == pytest.approx(125e-9)  # the model's 1 us at its speed
    with pytest.raises(ValueError):
        link_latency_s(-1.0)


def test_ring_latency_is_the_slowest_chain_of_hops() -> None:
    # a ring of 4 whose hops cross 2, 2, 4, 2 links; 6 steps: a chain starting at p crosses
    # hops p..p+5 around the ring: p=0: 2+2+4+2+2+2 = 14, p=1: 2+4+2+2+2+4 = 16, p=2: 16,
    # p=3: 2+2+2+4+2+2 = 14 -> 16 links
    assert ring_latency(np.array([[2, 2, 4, 2]]), 6, 1.0) == 16
    # two rings in lockstep: the slower one's chain
    assert ring_latency(np.array([[2, 2, 4, 2], [4, 4, 4, 4]]), 6, 0.5) == 12
    assert ring_latency(np.array([[1, 2]]), 2, 1.0) == 3


def test_ring_pays_its_hops_latency_along_the_chain() -> None:
    # 8 servers, 4 per leaf: rail ring 0..7 crosses leaves at 3 -> 4 and 7 -> 0 (NIC - leaf -
    # spine - leaf - NIC, 4 links), the other hops 2 links; 14 steps: the slowest chain of
    # 14 consecutive hops crosses both boundaries twice: 10 x 2 + 4 x 4 = 36 links
    fab = build_clos(ClosParams(64, **SMALL))
    lat = 100e-9
    r = ring_allreduce(fab, rail_rings(fab), 1 << 20, link_latency=lat)
    assert r.latency_s == pytest.approx(36 * lat)
    assert r.time_s == pytest.approx(14 * (1 << 20) / 8 * 8 / 400e9 + 36 * lat)
    full = ring_allreduce(fab, rail_rings(fab), 1 << 20, symmetric=False, link_latency=lat)
    assert full.time_s == pytest.approx(r.time_s, rel=1e-12)
    assert r.busbw_bps < 400e9


def test_alltoall_pays_its_last_flows_path_once() -> None:
    # 2:1 leaf-spine: the last flows to finish cross the spine (host - leaf - spine - leaf -
    # host, 4 links); on one leaf every flow has 2 links and all finish together
    fab = from_spec(leafspine(2, 2, 4))
    bare = suite_collective(fab, "alltoall", 1 << 20)
    lat = 100e-9
    r = suite_collective(fab, "alltoall", 1 << 20, link_latency=lat)
    assert r.latency_s == pytest.approx(4 * lat)
    assert r.time_s == pytest.approx(bare.time_s + 4 * lat)
    one = alltoall(from_spec(leafspine(1, 1, 4)), [np.arange(4)[None, :]], 48, link_latency=lat)
    # 48 B = 12 floats: blocks of 3 floats, 12 B, one packet each; every NIC sends to its
    # peers in rank order, so the last host's downlink gets its three packets together after
    # three packet times and the latency of one link, and sends them one after another
    piece = 12 * 8 / 400e9
    assert one.queues == "fifo" and one.time_s == pytest.approx(6 * piece + 2 * lat)


def test_alltoall_flows_are_the_library_plan_summed_per_pair_and_channel() -> None:
    # 4 ranks, 64 B = 16 floats: blocks of 4 floats, 16 B to each peer; 2 channels, 8 B
    # messages: each block in 2 pieces of 8 B, one per channel
    src, dst, chan, nbytes = plan_flows(4, 64, 2, 8)
    assert len(src) == 4 * 3 * 2 and set(nbytes) == {8.0}
    assert not np.any(src == dst) and set(chan) == {0, 1}
    # 72 B = 18 floats: blocks of 18 // 4 = 4 floats; the 2 left over stay (the plan's)
    src, dst, chan, nbytes = plan_flows(4, 72, 1, 1 << 20)
    assert len(src) == 12 and set(nbytes) == {16.0}
    r = alltoall(from_spec(leafspine(1, 1, 4)), [np.arange(4)[None, :]], 72)
    # 3 blocks of 16 B out of each NIC, the last host's three arriving in the third round
    assert r.time_s == pytest.approx(6 * 16 * 8 / 400e9)


def test_a_plan_with_dependencies_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    staged = [
        Transfer(0, 0, 1, 0, 4, Op.COPY, (), 0, 0),
        Transfer(1, 1, 0, 0, 4, Op.COPY, (0,), 0, 0),
    ]
    monkeypatch.setattr(collectives, "build", lambda spec: staged)
    with pytest.raises(ValueError, match="not one step"):
        plan_flows(2, 32, 1, 16)


def test_a_spine_down_moves_the_ring_off_it_and_spraying_undoes_collisions() -> None:
    # plain Clos of radix 8: the rings' leaf-crossing flows share uplinks by hash
    fab = build_clos(ClosParams(128, tiers=3, rail=False, **SMALL))
    whole = ring_allreduce(fab, rail_rings(fab), 1 << 20)
    down = fail(fab, ["p1d1a1"])
    r = ring_allreduce(down, rail_rings(down), 1 << 20)
    agg = fab.n_gpus + fab.switch_names.index("p1d1a1")
    assert down.down is not None and down.down[(fab.link_src == agg) | (fab.link_dst == agg)].all()
    sprayed = ring_allreduce(fab, rail_rings(fab), 1 << 20, spray=True)
    assert whole.collisions["excess"] > 0 and sprayed.collisions["excess"] == 0
    # spraying spreads every hop's flows evenly: no slower than any hashing
    assert sprayed.time_s <= min(whole.time_s, r.time_s) + 1e-15


def test_flat_ring_crosses_servers_on_rail_zero_and_pays_8x_the_steps() -> None:
    fab = build_clos(ClosParams(64, **SMALL))
    flat = ring_allreduce(fab, flat_ring(fab), 1 << 20, link_latency=1e-7)
    per_rail = ring_allreduce(fab, rail_rings(fab), 1 << 20, link_latency=1e-7)
    assert flat.ranks == 64 and flat.steps == 2 * 63 and per_rail.steps == 2 * 7
    from testbed.flow.routing import entropy_ports, route

    src = np.arange(64)
    r = route(fab, src, np.roll(src, -1), entropy_ports(src, np.roll(src, -1)))
    nic = r.links[fab.link_kind[r.links] == NIC_UP] - fab.shape["b_nic_up"]
    assert len(nic) == 8 and np.all(nic % 8 == 0)  # one hop per server, from GPU 0's NIC
    # each server's network link carries one ring's 2(n-1)/n of the buffer either way (n
    # the ring's ranks: alike when n is large); the steps' latency is what one channel costs
    b = (1 << 20) * 8 / 400e9
    assert flat.time_s - flat.latency_s == pytest.approx(2 * 63 / 64 * b)
    assert per_rail.time_s - per_rail.latency_s == pytest.approx(2 * 7 / 8 * b)
    assert flat.latency_s > 4 * per_rail.latency_s


def test_flow_iteration_command(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from testbed.main import main

    base = ["flow-iteration", "--gpus", "128", "--tiers", "3", "--radix", "8"]
    base += ["--switch-tbps", "3.2", "--dp-bytes", "1048576", "--ep-bytes", "65536"]
    base += ["--ep-group", "8", "--json"]
    runs = {}
    for name, extra in [
        ("ecmp", ["--clos"]),
        ("spray", ["--clos", "--spray"]),
        ("down", ["--clos", "--fail", "p1d1a1,p1d2a1-p1c1"]),
        ("flat", ["--dp-algo", "flat"]),
        ("hier", ["--dp-algo", "hier"]),
        ("slow", ["--clos", "--slow", "h3g2=10%"]),  # below the collisions' 80G share
    ]:
        assert main(base + extra) == 0
        runs[name] = json.loads(capsys.readouterr().out)
    assert runs["down"]["failed"] == ["p1d1a1", "p1d2a1-p1c1"]
    assert runs["spray"]["routing"] == "spray" and runs["spray"]["ring_collisions"]["excess"] == 0
    assert runs["spray"]["allreduce_s"] <= runs["ecmp"]["allreduce_s"]
    assert runs["slow"]["slowed"] == {"h3g2": 0.1}
    assert runs["slow"]["allreduce_s"] > runs["ecmp"]["allreduce_s"]
    assert runs["flat"]["dp_algo"] == "flat"
    # one DP group either way: the hierarchical one's rings are 8x shorter, on 1/8 shards
    assert runs["hier"]["allreduce_s"] < runs["flat"]["allreduce_s"]
    assert runs["flat"]["allreduce_latency_s"] > runs["ecmp"]["allreduce_latency_s"]
    assert main(base + ["--fail", "p1l1"]) == 2
    assert "a leaf" in capsys.readouterr().err
    assert main(base + ["--slow", "h3g2"]) == 2
    assert "ELEMENT=FRACTION" in capsys.readouterr().err


def test_hier_is_the_librarys_scaleup_steps_around_a_ring_per_rail_on_shards() -> None:
    from testbed.flow.collectives import hier_allreduce
    from testbed.traffic.collective_jobs import NVLINK_BPS, NVLINK_LATENCY_S, nvlink_ring_time

    fab = build_clos(ClosParams(64, **SMALL))  # 8 servers of 8 GPUs
    size = float(1 << 20)
    h = hier_allreduce(fab, size)
    net = ring_allreduce(fab, rail_rings(fab), size / 8)
    intra = 7 * (NVLINK_LATENCY_S + size / 8 * 8 / NVLINK_BPS)  # the library's 7 steps
    assert nvlink_ring_time(8, size, NVLINK_BPS, NVLINK_LATENCY_S) == pytest.approx(intra)
    assert h.time_s == pytest.approx(net.time_s + 2 * intra)
    assert h.scaleup_s == pytest.approx(2 * intra) and h.ranks == 64
    # a network efficiency stretches only the network's part
    assert h.time_at(0.5) == pytest.approx(2 * net.time_s + 2 * intra)


def test_link_load_counts_idle_links_and_stands_one_group_for_its_alikes() -> None:
    from testbed.flow.report import link_load

    fab = build_clos(ClosParams(64, **SMALL))
    one = alltoall(fab, ep_groups(fab, 16), 1 << 20, symmetric=True)
    every = alltoall(fab, ep_groups(fab, 16), 1 << 20, symmetric=False)
    assert one.replicas == 4 and every.replicas == 1 and one.time_s == every.time_s
    a, b = link_load(fab, one, one.time_s), link_load(fab, every, every.time_s)
    assert a.percentiles == pytest.approx(b.percentiles) and a.idle == b.idle
    assert {k: v["mean"] for k, v in a.by_kind.items()} == pytest.approx(
        {k: v["mean"] for k, v in b.by_kind.items()}
    )
    # groups of 16 GPUs = 2 servers under one leaf: only NIC links carry anything, and every
    # one of them; the NIC links are a third of the network's (NIC, leaf up/down, both ways)
    assert b.by_kind["leaf up"]["mean"] == 0 and b.idle == b.links - 2 * fab.n_gpus
    assert b.percentiles["max"] == pytest.approx(b.by_kind["NIC up"]["max"])
    assert 0 < b.percentiles["max"] <= 1 + 1e-9


def test_flow_iteration_writes_its_results_and_plot(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from testbed.main import main

    argv = ["flow-iteration", "--gpus", "128", "--tiers", "3", "--radix", "8"]
    argv += ["--switch-tbps", "3.2", "--dp-bytes", "1048576", "--ep-bytes", "65536"]
    argv += ["--ep-group", "8", "--clos", "--compute-ms", "1", "--run-dir", str(tmp_path)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "busbw(GB/s)" in text and "hottest:" in text and "communication" in text
    doc = json.loads((tmp_path / "iteration.json").read_text())
    it = doc["iteration"]
    assert doc["source"]["commit"] and doc["date"]
    assert it["iteration_s"] == pytest.approx(1e-3 + it["allreduce_s"] + it["alltoall_s"])
    assert set(it["link_load"]) == {"allreduce", "alltoall"}
    assert (tmp_path / "iteration.png").stat().st_size > 10_000


def test_sweep_on_the_flow_engine(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from testbed.main import main
    from testbed.sweep import aggregate

    argv = ["sweep", "--engine", "flow", "--topo", "leafspine:2,2,4", "--quick"]
    argv += ["--scenarios", "allreduce", "--schemes", "none,tita", "--seeds", "1"]
    argv += ["--param", "allreduce_bytes=262144,1048576", "--workers", "1"]
    assert main([*argv, "--run-dir", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["engine"] == "flow" and len(doc["points"]) == 4
    assert doc["source"]["commit"] and doc["date"]  # the grid's provenance
    cells = aggregate(doc["points"])
    for scheme in ("none", "tita"):
        small = cells[(262144, "allreduce", scheme)]["time ms"][0]
        assert small < cells[(1048576, "allreduce", scheme)]["time ms"][0]
    out = capsys.readouterr()
    assert "flow engine" in out.out
    # a progress line as each run ends
    assert "[4/4] allreduce_bytes=" in out.err and out.err.count("done") == 4
    # what the flow engine cannot run is refused before any worker starts
    bad = [a if a != "allreduce" else "incast" for a in argv]
    assert main([*bad, "--run-dir", str(tmp_path / "bad")]) == 2
    assert "--engine flow runs allreduce, alltoall" in capsys.readouterr().err


FLOW_RUN = ["run", "--engine", "flow", "--quick", "--topo", "leafspine:2,2,4"]
FLOW_RUN += ["--schemes", "none", "--scenarios", "allreduce,alltoall"]


def _flow_runs(tmp_path: Any, faults: dict[str, str | None]) -> dict[str, dict[str, float]]:
    """The quick allreduce and alltoall on the flow engine under each fault (a YAML item, or
    None for none): each scenario's completion time per name."""
    import json

    from testbed.main import main

    times = {}
    for name, fault in faults.items():
        extra = []
        if fault:
            (tmp_path / f"{name}.yaml").write_text(f"- {fault}\n")
            extra = ["--faults", str(tmp_path / f"{name}.yaml")]
        assert main([*FLOW_RUN, *extra, "--run-dir", str(tmp_path / name)]) == 0
        doc = json.loads((tmp_path / name / "results.json").read_text())
        times[name] = {r["scenario"]: r["completion_s"] for r in doc["runs"]}
        assert len(doc["setup"]["faults"]) == (0 if fault is None else 1)
    return times


def test_run_on_the_flow_engine_with_a_spine_killed_and_a_link_down(tmp_path: Any) -> None:
    from testbed.main import main

    times = _flow_runs(
        tmp_path,
        {
            "whole": None,
            "kill": "{at: 0, target: spine1, kind: kill}",
            "down": "{at: 0, target: leaf1:5, kind: down}",  # leaf1's uplink to spine1
        },
    )
    # the all-to-all's cross-leaf half loses one of two uplinks; the ring's two leaf-crossing
    # flows had an uplink each and keep one
    assert times["kill"]["alltoall"] > 1.3 * times["whole"]["alltoall"]
    assert times["down"]["alltoall"] == pytest.approx(times["kill"]["alltoall"])
    assert times["kill"]["allreduce"] == pytest.approx(times["whole"]["allreduce"])
    for bad in (
        "{at: 0.1, target: spine1, kind: kill}",
        "{at: 0, target: leaf1:5, kind: delay, value: 2ms}",
        "{at: 0, target: h1, kind: down}",  # a NIC cut off: no re-route helps
    ):
        (tmp_path / "bad.yaml").write_text(f"- {bad}\n")
        assert (
            main(
                [
                    *FLOW_RUN,
                    "--faults",
                    str(tmp_path / "bad.yaml"),
                    "--run-dir",
                    str(tmp_path / "b"),
                ]
            )
            == 1
        )


def test_a_topologys_link_fails_by_its_end_and_a_host_link_is_refused() -> None:
    from testbed.flow.fabric import FabricError

    fab = from_spec(leafspine(2, 2, 4))
    down = fail(fab, ["leaf1:5"])
    assert down.down is not None and down.down.sum() == 2
    ends = {fab.end_names[i] for i in np.flatnonzero(down.down)} if fab.end_names else set()
    assert "leaf1:5" in ends and len(ends) == 2
    with pytest.raises(FabricError, match="a host's link"):
        fail(fab, ["leaf1:1"])
    with pytest.raises(FabricError, match="no link"):
        fail(fab, ["leaf1:99"])


def test_held_by_the_network_where_a_switch_not_the_nic_sets_the_rate() -> None:
    lat = model_link_latency()
    for topo, coll, held in [
        ("leafspine:2,1,4", "alltoall", True),  # 4:1: the leaf's one uplink
        ("leafspine:2,1,4", "allreduce", False),  # a ring: one flow per link, NIC-paced
        ("rail:2,8,1", "alltoall", False),  # every NIC shares its rate evenly, no switch binds
    ]:
        spec = leafspine(2, 1, 4) if topo.startswith("leaf") else rail(2, 8, 1)
        r = suite_collective(from_spec(spec), coll, 1 << 20, lat, spec)
        assert r.held_by_network is held, (topo, coll)
    # ECMP collisions on a plain Clos hold the ring; the rail-optimized fabric's do not exist
    plain = build_clos(ClosParams(128, tiers=3, rail=False, **SMALL))
    railed = build_clos(ClosParams(128, tiers=3, **SMALL))
    assert ring_allreduce(plain, rail_rings(plain), 1 << 20).held_by_network
    assert not ring_allreduce(railed, rail_rings(railed), 1 << 20).held_by_network


def test_a_slow_nic_holds_its_ring_and_every_ring_waits() -> None:
    from testbed.flow.fabric import FabricError, slow

    fab = build_clos(ClosParams(64, **SMALL))  # one ring per rail of 8 servers
    whole = ring_allreduce(fab, rail_rings(fab), 1 << 20)
    cut = slow(fab, {"h3g2": 0.25})  # server 3's GPU 2: its NIC at a quarter, both ways
    assert cut.slowed == (("h3g2", 0.25),)
    r = ring_allreduce(cut, rail_rings(cut), 1 << 20)
    # ring 2's hops into and out of that GPU run at 100G, and a ring steps at its slowest
    assert r.time_s == pytest.approx(4 * whole.time_s)
    assert r.shortcut == "steps"  # the rings are no longer alike: each is computed
    for bad, why in [("p1l1", "a switch"), ("h99g0", "no such GPU"), ("h1g9", "no such GPU")]:
        with pytest.raises(FabricError, match=why):
            slow(fab, {bad: 0.5})
    with pytest.raises(FabricError, match="a fraction"):
        slow(fab, {"h1g0": 1.5})


def test_rate_faults_on_the_flow_engine_as_the_packet_engines_set_them(tmp_path: Any) -> None:
    times = _flow_runs(
        tmp_path,
        {
            "whole": None,
            "uplink": "{at: 0, target: leaf1:5, kind: rate, value: 25%}",
            "nic": "{at: 0, target: h1, kind: rate, value: 25%}",
        },
    )
    # h1's NIC sends at a quarter: the ring waits for its hop; the all-to-all for its flows
    assert times["nic"]["allreduce"] > 3 * times["whole"]["allreduce"]
    assert times["nic"]["alltoall"] > 2 * times["whole"]["alltoall"]
    # a leaf uplink at a quarter: the all-to-all's cross-leaf half slows
    assert times["uplink"]["alltoall"] > 1.2 * times["whole"]["alltoall"]


def test_the_adaptive_schedule_shares_the_data_by_the_rails_rates() -> None:
    from testbed.flow.collectives import hier_allreduce
    from testbed.flow.fabric import slow

    fab = build_clos(ClosParams(64, **SMALL))  # 8 rails, rings of 8 servers
    size = float(1 << 22)
    whole = hier_allreduce(fab, size)
    assert hier_allreduce(fab, size, adaptive=True).time_s == pytest.approx(whole.time_s)
    cut = slow(fab, {"h3g2": 0.25})  # rail 2's ring at a quarter
    static = hier_allreduce(cut, size)
    adaptive = hier_allreduce(cut, size, adaptive=True)
    net = whole.time_s - whole.scaleup_s - whole.latency_s + 2 * 7 * 2e-6  # its bandwidth part
    bw = lambda r: r.time_s - r.scaleup_s - r.latency_s + 2 * 7 * 2e-6  # noqa: E731
    assert bw(static) == pytest.approx(4 * net)  # a static split: the slow rail's ring ends last
    assert bw(adaptive) == pytest.approx(8 / (7 + 1 / 4) * net)  # shares by rate: 8 / 7.25
    # a plain Clos: the rails' rings collide under ECMP; the stealing moves each hop's pieces
    # to its channels with room: the slowest hop's summed first max-min rates set a step
    from testbed.flow import maxmin
    from testbed.flow.collectives import rail_rings, ring_allreduce
    from testbed.flow.routing import entropy_ports, route

    plain = build_clos(ClosParams(128, tiers=3, rail=False, **SMALL))
    st, ad = hier_allreduce(plain, size), hier_allreduce(plain, size, adaptive=True)
    assert ad.time_s < st.time_s
    rings = rail_rings(plain)
    k, n = len(rings), len(rings[0])
    src = np.concatenate(rings)
    dst = np.concatenate([np.roll(rg, -1) for rg in rings])
    r = route(plain, src, dst, entropy_ports(src, dst, np.repeat(np.arange(k), n), 1))
    hop = maxmin.rates(r, plain.link_cap).reshape(k, n).sum(axis=0)
    assert hop.min() < hop.max()  # the collisions are on some hops only
    seg = size / k / n
    assert bw(ad) == pytest.approx(2 * (n - 1) * k * seg * 8 / hop.min())
    with pytest.raises(ValueError, match="same servers"):
        ring_allreduce(plain, [rings[0], np.roll(rings[1], 1)], size / k, adaptive=True)
