"""The testbed end to end: a 2-leaf 1-spine fabric with 4 hosts (the built-in switches, the
controller, an agent per host), one 3:1 incast per scheme (none, DCQCN, TiTa).

- traffic crosses the fabric with INT: packets from the other leaf arrive with 3 hop records,
  and the receiver's downlink reports a queue;
- the NICs' rates respond: under DCQCN and TiTa the agents' rate maps move below the line rate
  (WatchRates), under no CC they never do;
- TiTa's peak queue at the bottleneck is lower than no CC's;
- afterwards nothing of the testbed remains: processes, namespaces, links, agent pins and
  bpffs mounts, qdiscs/HTB classes and XDP programs on the hosts' NICs.
"""

from __future__ import annotations

import os
import subprocess
from itertools import pairwise
from pathlib import Path

import pytest

from testbed.emu.network import (
    AGENT_BPFFS_ROOT,
    AGENT_RUN_ROOT,
    Testbed,
    TestbedOptions,
)
from testbed.emu.suite import EmuSuite
from testbed.experiment.suite import RunRecord, SuiteConfig
from testbed.model import Scaling, model_with_buffer
from testbed.p4files import BMV2_JSON, P4INFO
from testbed.topo import leafspine

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (P4INFO.exists() and BMV2_JSON.exists()), reason="p4src/build is missing (make p4)"
    ),
    pytest.mark.timeout(300),
]


def _pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # a zombie or a reused PID is not ours: check the command line still names us
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"testbed" in cmd or b"controller" in cmd or b"simple_switch" in cmd:
            alive.append(pid)
    return alive


def test_incast_per_scheme_int_rates_queues_and_clean_teardown(tmp_path: Path) -> None:
    # from line rate: the laws must react (declared at their shares, DCQCN's senders may see
    # no CNP at all)
    cfg = SuiteConfig(
        scenarios=("incast",),
        schemes=("none", "dcqcn", "tita"),
        incast_bytes=1_000_000,
        proactive_start=False,
    )
    tb = Testbed(leafspine(2, 1, 2), TestbedOptions(switch="builtin", run_dir=tmp_path))
    records: dict[str, RunRecord] = {}
    with tb:
        pids = [a.component.pid for a in tb.agents.values()]
        pids += [s.component.pid for s in tb.switches() if s.component is not None]
        assert tb.controller is not None
        pids.append(tb.controller.pid)
        shells = [n.pid for n in tb.net.hosts + tb.net.switches]
        h1 = tb.node("h1")
        assert "xdp" in h1.cmd("ip -d link show dev h1-eth0")  # the NIC programs are on
        assert "htb" in h1.cmd("tc qdisc show dev h1-eth0")
        with EmuSuite(tb, cfg) as suite:
            suite.run()
            records = {r.scheme: r for r in suite.records}
        prefix = tb.prefix
        mgmt = list(tb.mgmt_links)
        collector_ns = tb.collector_netns
        agent_names = [a.name for a in tb.agents.values()]
    assert set(records) == {"none", "dcqcn", "tita"}
    line = tb.scaling.nic_bps
    for scheme, r in records.items():
        assert r.flows == r.flows_completed == 3, (scheme, r)
        assert r.bottleneck == "leaf1:1"  # h1's downlink
        # INT: h3/h4 -> h1 cross leaf2, spine1, leaf1: three records, newest first
        assert r.int_max_hops == 3 and r.int_packets > 100, (scheme, r.int_packets)
        assert r.queue_samples > 100 and r.queue_max_bytes > 0
    none, dcqcn, tita = records["none"], records["dcqcn"], records["tita"]
    assert none.rate_events == 0
    for r in (dcqcn, tita):
        lows = [v for s in r.rate_series.values() for v in s["v"] if v < 0.5 * line]
        assert r.rate_events > 3 and lows, (r.scheme, r.rate_events)
    assert dcqcn.cnps > 0
    assert tita.queue_max_bytes < none.queue_max_bytes, (tita.queue_max_bytes, none.queue_max_bytes)
    # nothing of the testbed is left on the machine
    assert tb.leftovers() == []
    assert _pids_alive(pids + shells) == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert collector_ns is not None and collector_ns not in netns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not [m for m in mgmt if f" {m}@" in links or f" {m}:" in links]
    assert prefix not in links
    for name in agent_names:
        assert not (AGENT_BPFFS_ROOT / name).exists()
        assert not (AGENT_RUN_ROOT / name).exists()
    mounts = Path("/proc/self/mountinfo").read_text()
    assert prefix not in mounts


def test_lossless_incast_pauses_every_hop_back_to_the_senders_and_drops_nothing(
    tmp_path: Path,
) -> None:
    """PFC on the emulation (`dcqcn+pfc`): the built-in switches pause their upstream ports,
    the NICs' XDP records the pauses and the senders' transports hold while it says so; the
    3:1 incast completes without a drop. On the static buffer (500 KB per queue, a static
    XOFF), which this incast fills: the default shared buffer absorbs it with a pause or two
    from the spine's port alone."""
    # from line rate: declared at their shares the senders would not fill the queue
    cfg = SuiteConfig(
        scenarios=("incast",),
        schemes=("dcqcn+pfc",),
        incast_bytes=1_000_000,
        proactive_start=False,
    )
    static = Scaling(model=model_with_buffer("static"))
    opts = TestbedOptions(switch="builtin", run_dir=tmp_path, scaling=static)
    tb = Testbed(leafspine(2, 1, 2), opts)
    with tb, EmuSuite(tb, cfg) as suite:
        suite.run()
        (r,) = suite.records
        assert tb.pfc_on
    assert r.flows == r.flows_completed == 3
    assert r.drops == 0, r.drops
    assert r.pauses > 0 and r.paused_s > 0
    by_port = r.pfc_by_port
    # h1's switch paused its upstreams, and the pauses reached the sending NICs
    assert any(p.startswith("leaf1:") and c.get("xoff_sent", 0) for p, c in by_port.items())
    nics = {p: c for p, c in by_port.items() if p.startswith("h")}
    assert nics and all(c["pauses_received"] > 0 and c["paused_ns"] > 0 for c in nics.values())
    assert set(nics) <= {"h2:0", "h3:0", "h4:0"}  # senders only
    assert r.sender_holds > 0 and r.sender_held_s > 0  # and their transports held


def listed_flows(suite: EmuSuite) -> list[int]:
    """How many flows each host's agent holds (ListFlows)."""
    from controller.proto import agent_pb2

    return [
        len(stub.ListFlows(agent_pb2.ListFlowsRequest(), timeout=10).flows)
        for stub in suite.agents.values()
    ]


def test_the_proactive_start_reaches_the_nics_through_the_agents(tmp_path: Path) -> None:
    """`--proactive-start` on the emulation: each incast sender's transport hands its flow's
    fair share to its host's agent (SetRate) before it sends; the NIC paces the flow at it
    from the first packet and TiTa's law starts there (how far the startup burst shrinks is
    the twin's test: here it depends on how the box schedules the senders)."""
    tb = Testbed(leafspine(2, 1, 2), TestbedOptions(switch="builtin", run_dir=tmp_path))
    recs = {}
    t_s = 0.0
    with tb:
        for proactive in (False, True):
            cfg = SuiteConfig(
                scenarios=("incast",),
                schemes=("tita",),
                incast_bytes=1_000_000,
                proactive_start=proactive,
            )
            with EmuSuite(tb, cfg) as suite:
                suite.run()
                (recs[proactive],) = suite.records
                t_s = suite.tita_t_s
                # the next run's flows reuse these 5-tuples: the NICs forget them first
                assert any(listed_flows(suite)), "the run left no flow in the agents"
                assert not suite._fresh()  # the fabric lives on
                assert not any(listed_flows(suite))
    plain, hinted = recs[False], recs[True]
    assert plain.start_hints == 0 and hinted.start_hints == 3
    assert hinted.flows_completed == hinted.flows == 3 and hinted.drops == 0

    # The hint reached each NIC before the flow's first packet: every hinted flow's first
    # rate is its share of the line, set before the job started; the plain flows start at
    # the line rate their declaration gave them (no change: no event), and only their law
    # moves them, after the start
    share = tb.scaling.nic_bps / 3
    for s in hinted.rate_series.values():
        assert s["t"][0] <= 0.0 and abs(s["v"][0] - share) < 0.01 * share, (s, share)
    assert all(s["t"][0] > 0.0 for s in plain.rate_series.values()), plain.rate_series
    assert len(hinted.rate_series) == len(plain.rate_series) == 3

    # What the hint does to the startup burst is the twin's test to assert
    # (test_sim.py::test_the_proactive_start_paces_the_incast_at_its_fair_share_from_the_first_
    # packet): here the plain flows fill the bottleneck's queue as fast as the box schedules
    # three line-rate senders and three switches on its cores, and a loaded box starves them
    # (the ratio of the mean startup queues was 0.10-0.74 in 15 runs alone; in full test runs
    # the plain burst failed a 0.5 bound in CI and, at commit c53040d, did not happen at all:
    # plain 2955 B, hinted 3239 B over the first 3 T). Printed, not asserted.
    def startup_mean(r: RunRecord) -> float:  # each sample held until the next
        q = r.queue_series
        pts = [(t, v) for t, v in zip(q["t"], q["v"], strict=True) if t <= 3 * t_s]
        pts.append((3 * t_s, 0.0))
        return sum((b[0] - a[0]) * a[1] for a, b in pairwise(pts)) / (3 * t_s)

    plain_q, hinted_q = startup_mean(plain), startup_mean(hinted)
    print(f"startup mean queue: plain {plain_q:.0f} B, hinted {hinted_q:.0f} B")


def test_rail_topology_routes_each_rail_and_across(tmp_path: Path) -> None:
    """Two hosts with two NICs each on two rail leaves and a spine: NIC i talks to NIC i over
    rail i, and across rails through the spine; one agent per host on both NICs."""
    from testbed.topo import rail

    tb = Testbed(
        rail(nics=2, hosts=2, spines=1), TestbedOptions(switch="builtin", run_dir=tmp_path)
    )
    with tb:
        h1 = tb.node("h1")
        for dst in ("10.0.1.2", "10.0.2.2"):  # same rail each
            assert " 0% packet loss" in h1.cmd(f"ping -c 2 -W 2 {dst}"), dst
        # out of h1's NIC 0 to h2's NIC 1: rail1 -> spine1 -> rail2 (the reply stays on rail 1)
        out = h1.cmd("ping -c 2 -W 2 -I h1-eth0 10.0.2.2")
        assert " 0% packet loss" in out, out
        route = h1.cmd("ip route get 10.0.2.2")
        assert "h1-eth1" in route, route
        assert "xdp" in h1.cmd("ip -d link show dev h1-eth1")  # the agent is on both NICs
    assert tb.leftovers() == []


def test_a_component_that_does_not_come_up_is_named_and_nothing_is_left(tmp_path: Path) -> None:
    """An agent that cannot start (a bad option) fails the boot with its name and the tail of
    its log; what was started by then is removed."""
    from testbed.emu.procs import ComponentError
    from testbed.topo import single

    tb = Testbed(single(2), TestbedOptions(switch="builtin", run_dir=tmp_path, agent_sync="soon"))
    with pytest.raises(ComponentError) as info:
        tb.start()
    assert info.value.component.startswith("agent h")
    assert "not a duration" in str(info.value)  # the agent's own complaint, from its log
    assert tb.leftovers() == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tb.prefix not in netns
