"""The flow engine's burst through FIFO queues (testbed/flow/fifo.py): hand-computed cases,
the pieces of a long flow, the order links are served in, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from testbed.flow import calibration, fifo, maxmin
from testbed.flow.collectives import ep_groups, plan_flows, suite_collective
from testbed.flow.fabric import ClosParams, build_clos, from_spec
from testbed.flow.routing import Routes, entropy_ports, route
from testbed.main import main
from testbed.topo import leafspine

MTU = 4096
PKT = MTU * 8 / 400e9  # a packet's time at 400G


def test_two_senders_share_a_downlink_packet_by_packet() -> None:
    # h1 and h2 send 3 packets each to h3: both NICs put a packet on their link every packet
    # time, the downlink gets two per packet time and sends one: its FIFO serves them in
    # arrival order (ties: h1's flow first), the last leaving after 7 packet times
    fab = from_spec(leafspine(1, 1, 4))
    r = route(fab, np.array([0, 1]), np.array([2, 2]), np.array([49152, 49153]))
    end = fifo.burst(fab, r, np.array([3.0 * MTU, 3.0 * MTU]), MTU)
    assert end == pytest.approx([6 * PKT, 7 * PKT])
    lat = 100e-9  # each link's latency delays every arrival and the last byte's
    end = fifo.burst(fab, r, np.array([3.0 * MTU, 3.0 * MTU]), MTU, link_latency=lat)
    assert end == pytest.approx([6 * PKT + 2 * lat, 7 * PKT + 2 * lat])
    # max-min has the downlink busy from the start: 6 packet times for both
    done, _ = maxmin.complete(r, fab.link_cap, np.array([3.0 * MTU, 3.0 * MTU]))
    assert done == pytest.approx([6 * PKT, 6 * PKT])


def test_a_nic_sends_its_flows_round_robin() -> None:
    # h1 sends 2 packets to each of h2, h3, h4: rounds of one packet per flow, in flow order;
    # each downlink forwards a packet one packet time after it arrives
    fab = from_spec(leafspine(1, 1, 4))
    r = route(fab, np.zeros(3, dtype=np.int64), np.array([1, 2, 3]), np.arange(3) + 49152)
    end = fifo.burst(fab, r, np.full(3, 2.0 * MTU), MTU)
    assert end == pytest.approx([5 * PKT, 6 * PKT, 7 * PKT])


def test_a_long_flow_goes_in_at_most_max_pieces() -> None:
    fab = from_spec(leafspine(1, 1, 4))
    r = route(fab, np.array([0]), np.array([1]), np.array([49152]))
    size = 64.0 * MTU  # 16 pieces of 4 packets: each crosses the second link a packet behind
    (end,) = fifo.burst(fab, r, np.array([size]), MTU, max_pieces=16)
    assert end == pytest.approx(65 * PKT)  # as packet by packet
    (exact,) = fifo.burst(fab, r, np.array([size]), MTU, max_pieces=64)
    assert exact == pytest.approx(65 * PKT)
    assert fifo.pieces(np.array([0.0, 1.0, MTU + 1.0, 1e9]), MTU).tolist() == [0, 1, 2, 64]
    many = np.full(fifo.MAX_TOTAL_PIECES // 8, 1e9)  # fewer pieces per flow where many flows
    assert set(fifo.pieces(many, MTU).tolist()) == {8}


def test_coarse_rounds_cost_little_on_a_large_all_to_all() -> None:
    # one 64-GPU group of a rail-optimized fabric, 4 MiB per pair (1,024 packets): the
    # NICs' rounds at 64 pieces per flow leave links idle at their edges for about 1 % of
    # the time (the docstring's figure), at 16 pieces about 4 times that
    fab = build_clos(ClosParams(1024, tiers=3))
    gp = np.atleast_2d(ep_groups(fab, 64)[0])
    i, j, c, nbytes = plan_flows(gp.shape[1], 256 << 20, gp.shape[0], 256 << 20)
    src, dst = gp[c, i], gp[c, j]
    r = route(fab, src, dst, entropy_ports(src, dst, c, 1))
    fluid, _ = maxmin.complete(r, fab.link_cap, nbytes)
    at64 = fifo.burst(fab, r, nbytes, MTU).max() / fluid.max()
    at16 = fifo.burst(fab, r, nbytes, MTU, max_pieces=16).max() / fluid.max()
    assert 1.0 < at64 < 1.015 and 1.03 < at16 < 1.06


def test_the_suite_all_to_all_through_fifos_is_never_faster_than_max_min() -> None:
    # every link sends its bytes at its capacity at best: the FIFOs' time is at least the
    # busiest link's, which is max-min's here (every flow held by one link); at 32 hosts
    # the spines' links wait behind the uplinks' queues (docs/flow.md)
    for leaves in (2, 8):
        fab = from_spec(leafspine(leaves, 2, 4))
        i, j, c, nbytes = plan_flows(leaves * 4, 1 << 18, 1, 64 << 10)
        r = route(fab, i, j, entropy_ports(i, j, c, 1))
        end = fifo.burst(fab, r, nbytes, MTU)
        done, _ = maxmin.complete(r, fab.link_cap, nbytes)
        assert end.max() >= done.max() * (1 - 1e-9)
        res = suite_collective(fab, "alltoall", 1 << 18)
        assert res.queues == "fifo" and res.time_s == pytest.approx(end.max())
    assert end.max() > 1.1 * done.max()  # 32 hosts


def test_links_are_served_in_the_order_paths_cross_them() -> None:
    # on a rail fabric a GPU reaches another rail's GPU through its server's scale-up
    # domain first: scale-up out, scale-up in, then the network
    fab = build_clos(ClosParams(64, radix=8, switch_tbps=3.2))
    r = route(fab, np.array([0]), np.array([9]), np.array([49152]))
    levels = fifo.link_levels(fab, r)
    assert levels[r.links].tolist() == list(range(len(r.links)))
    assert len(r.links) == 4
    # two flows crossing the same two links in opposite orders: no order serves both
    loop = Routes(
        indptr=np.array([0, 2, 4]),
        links=np.array([0, 1, 1, 0]),
        coeff=np.ones(4),
        choice_group=np.zeros(0, dtype=np.int64),
        choice_link=np.zeros(0, dtype=np.int64),
        choice_size=np.zeros(0, dtype=np.int64),
    )
    with pytest.raises(ValueError, match="loop"):
        fifo.link_levels(fab, loop)


def test_sprayed_flows_are_refused() -> None:
    fab = from_spec(leafspine(2, 2, 4))
    r = route(fab, np.array([0]), np.array([4]), np.array([49152]), spray=True)
    with pytest.raises(ValueError, match="sprayed"):
        fifo.burst(fab, r, np.array([1e6]), MTU)
    with pytest.raises(ValueError, match="one size per flow"):
        fifo.burst(fab, r, np.array([1e6, 1e6]), MTU)


def test_a_fit_made_on_max_mins_all_to_all_is_refused(tmp_path: Path) -> None:
    # fits made before the FIFOs record no `queues`: their ideal was max-min's
    doc = calibration.load()
    entry = doc["schemes"]["none"]["alltoall"]
    for fitted in [entry["fitted_on"], *(p["fitted_on"] for p in entry["congested"]["points"])]:
        assert fitted["queues"] == "fifo"
        del fitted["queues"]
    path = tmp_path / "calibration.yaml"
    calibration.write(doc, path)
    res = suite_collective(from_spec(leafspine(4, 2, 4)), "alltoall", 1 << 18)
    with pytest.raises(calibration.Uncalibrated, match="calibrate-flow --scheme none"):
        calibration.applied("none", "alltoall", res, path)
    assert calibration.applied("none", "alltoall", res).regime in ("free", "congested")


def test_the_fifos_queues_and_the_buffer_they_would_pass() -> None:
    # h1 and h2 send 3 packets each to h3: h3's downlink holds 2, 3 and then 4 packets at
    # the arrivals (the one it is sending counted); the NICs' links are no switch's queue
    fab = from_spec(leafspine(1, 1, 4))
    r = route(fab, np.array([0, 1]), np.array([2, 2]), np.array([49152, 49153]))
    peak = np.zeros(fab.n_links)
    fifo.burst(fab, r, np.array([3.0 * MTU, 3.0 * MTU]), MTU, peak=peak)
    down = r.links[r.indptr[1] - 1]
    assert peak[down] == pytest.approx(4 * MTU)
    assert np.count_nonzero(peak) == 1
    # leaf1 has 5 ports with a link (4 hosts, a spine): 5 x 5 KB of buffer, the downlink's
    # 16 KB leaves 8.6 KB free, and alpha 1 admits a queue to that: past it; with 10 KB a
    # port (33.6 KB free) it is not
    got = fifo.overflow(fab, peak, 5_000, 1.0)
    assert got is not None and got["link"] == fab.link_name(int(down))
    assert (got["queue_bytes"], got["switch_queues_bytes"], got["switch_buffer_bytes"]) == (
        pytest.approx((4 * MTU, 4 * MTU, 25_000))
    )
    assert fifo.overflow(fab, peak, 10_000, 1.0) is None


def test_a_suite_all_to_all_past_the_buffer_says_so(tmp_path: Path) -> None:
    # 4 MiB per rank on 32 hosts: the twin drops 9,217 frames there without CC (docs/flow.md);
    # 1 MiB fits the buffer (no drop on the twin)
    for size, flagged in ((4 << 20, True), (1 << 20, False)):
        out = tmp_path / str(size)
        argv = ["run", "--engine", "flow", "--quick", "--topo", "leafspine:8,2,4"]
        argv += ["--schemes", "tita", "--scenarios", "alltoall", "--run-dir", str(out)]
        assert main([*argv, "--param", f"alltoall_bytes={size}"]) == 0
        doc = json.loads((out / "results.json").read_text())
        note = doc["setup"]["flow_efficiency"]["tita"]["alltoall"]["note"]
        assert ("shared buffer" in note) == flagged, note
