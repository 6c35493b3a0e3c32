"""Monitoring on the emulation: the testbed's Prometheus server scrapes the controller, every
built-in switch (on its management address) and every host agent (on loopback); during an
incast it holds the switches' queues, the agents' flow rates and the controller's link series;
the controller's fabric page answers; the server goes away with the testbed."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from testbed.emu.network import Testbed, TestbedOptions
from testbed.emu.prometheus import binary
from testbed.emu.suite import EmuSuite
from testbed.experiment.suite import SuiteConfig
from testbed.p4files import BMV2_JSON, P4INFO
from testbed.topo import leafspine
from tests.grafana_helpers import queries

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (P4INFO.exists() and BMV2_JSON.exists()), reason="p4src/build is missing (make p4)"
    ),
    pytest.mark.skipif(binary() is None, reason="prometheus is not installed (make install)"),
    pytest.mark.timeout(300),
]


EVENT_SERIES = ("drops", "suspect", "dead_links", "reports", "controller_flow_")


def test_prometheus_scrapes_every_daemon_and_the_page_answers(tmp_path: Path) -> None:
    tb = Testbed(leafspine(2, 1, 2), TestbedOptions(switch="builtin", run_dir=tmp_path))
    with tb:
        prom = tb.prometheus
        assert prom is not None and prom.component is not None
        targets = prom.targets()
        nodes = {(t["job"], t["node"]) for t in targets}
        assert nodes == (
            {("controller", "controller")}
            | {("switch", s.name) for s in tb.switches()}
            | {("agent", h) for h in tb.agents}
        )
        assert all(t["health"] == "up" for t in targets), targets
        # every endpoint is on loopback or a switch's management address, never 0.0.0.0
        for t in targets:
            host = t["instance"].rsplit(":", 1)[0]
            assert host == "127.0.0.1" or host.startswith("169.254."), t
        # no CC keeps the receiver's downlink queue full for a second or so; TiTa sets the
        # NICs' rates
        with EmuSuite(
            tb, SuiteConfig(scenarios=("incast",), schemes=("none", "tita"), incast_bytes=1_000_000)
        ) as suite:
            suite.run()
        # what the run left in Prometheus: the bottleneck's queue from its switch, the flows'
        # NIC rates from the agents, the controller's view of the switches
        peak = prom.query("max_over_time(xingmai_switch_queue_bytes[5m])")
        assert {m["node"] for m, _ in peak} == {s.name for s in tb.switches()}
        assert max(v for _, v in peak) > 0
        rates = prom.query("max_over_time(xingmai_agent_flow_rate_bps[5m])")
        assert {m["node"] for m, _ in rates} >= {"h2", "h3", "h4"}  # the incast's senders
        up = prom.query("xingmai_controller_switch_connected")
        assert sorted(m["switch"] for m, v in up if v == 1) == sorted(s.name for s in tb.switches())
        # every query of the shipped Grafana dashboard finds its series
        # the controller's INT series come from Telemetry Reports: required once reports flow
        reports = prom.query("sum(xingmai_controller_reports_total)")
        from_reports = ("link_queue", "hop_latency", 'source="int"')
        event_series = EVENT_SERIES + (() if reports and reports[0][1] > 0 else from_reports)
        for prefix in ("xingmai_switch_", "xingmai_agent_", "xingmai_nic_", "xingmai_controller_"):
            for expr in queries(prefix):
                series = prom.query(expr)  # raises if Prometheus refuses the query
                # series that exist only once something happened: drops (a switch exports a
                # reason once seen), suspects, telemetry reports (sinks that report), and
                # flows (idle by now: the controller lists active ones)
                if not any(w in expr for w in event_series):
                    assert series, expr
        with urllib.request.urlopen(tb.web_url + "api/fabric", timeout=10) as resp:
            state = json.loads(resp.read())
        assert {s["name"] for s in state["topology"]["switches"]} == {s.name for s in tb.switches()}
        with urllib.request.urlopen(tb.web_url, timeout=10) as resp:
            assert b"xingmai fabric" in resp.read()
        pid = prom.component.pid
    assert not any(f"process prometheus (pid {pid})" in x for x in tb.leftovers())
    assert (
        not Path(f"/proc/{pid}").exists()
        or b"prometheus" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    )
    assert (tmp_path / "prometheus" / "prometheus.yml").is_file()
