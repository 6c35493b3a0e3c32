"""The slow loop against fake agents: max-min caps from the flows the collector sees, pushed only
when they change, cleared when a flow goes idle; the policy pushed per host and again after an
agent comes back; a hanging or failing agent is a counted skip that delays nobody else."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from controller.collector import Collector
from controller.config import LawPolicy, load
from controller.health import NicSample
from controller.slowloop import AgentError, AgentFlow, FlowKey, SlowLoop
from controller.topology import Topology
from tests.telemetry_helpers import hop, report

EXAMPLE = Path(__file__).parents[1] / "controller" / "examples" / "leafspine-2x2.yaml"


class FakeAgent:
    def __init__(self, host: str):
        self.host = host
        self.caps: dict[FlowKey, float] = {}
        self.policy: LawPolicy | None = None
        self.calls: list[str] = []
        self.hang = False
        self.fail = False
        self.flows: list[AgentFlow] = []

    async def _enter(self, what: str) -> None:
        self.calls.append(what)
        if self.hang:
            await asyncio.sleep(3600)
        if self.fail:
            raise AgentError("refused")

    async def setup(self) -> None:
        await self._enter("setup")

    async def set_policy(self, policy: LawPolicy) -> None:
        await self._enter("set_policy")
        self.policy = policy

    async def policy_in_force(self, policy: LawPolicy) -> bool:
        await self._enter("policy_in_force")
        return self.policy == policy

    async def set_caps(self, caps: Mapping[FlowKey, float]) -> None:
        await self._enter("set_caps")
        self.caps.update(caps)

    async def clear_caps(self, keys: list[FlowKey]) -> None:
        await self._enter("clear_caps")
        for k in keys:
            self.caps.pop(k, None)

    async def list_flows(self) -> list[AgentFlow]:
        await self._enter("list_flows")
        return [
            AgentFlow(f.key, f.rate_bps, self.caps.get(f.key, 0.0), f.weight, f.idle_s)
            for f in self.flows
        ]

    async def nic_counters(self) -> NicSample:
        await self._enter("nic_counters")
        return NicSample(self.host, 0.0, 0, 0.0, 1e9)

    async def close(self) -> None:
        pass


def incast_reports(col: Collector, seq0: int, senders: list[tuple[str, str]]) -> int:
    """Reports from leaf2 (node 2) for flows from leaf1's hosts to h5 through spine1."""
    seq = seq0
    for port, ip in senders:
        seq += 1
        col.ingest(
            report(
                seq,
                2,
                [hop(3, 1, 2), hop(1, int(port), 5)],
                src=ip,
                dst="10.0.2.1",
                sink_in=5,
                sink_out=1,
            )
        )
    return seq


def setup(hosts: list[str]) -> tuple[SlowLoop, Collector, dict[str, FakeAgent]]:
    cfg = load(EXAMPLE)
    topo = Topology(cfg)
    col = Collector(topo)
    agents = {h: FakeAgent(h) for h in hosts}
    return SlowLoop(cfg.policy, topo, col, agents, timeout_s=0.3), col, agents


SENDERS = [("1", "10.0.1.1"), ("2", "10.0.1.2"), ("3", "10.0.1.3"), ("4", "10.0.1.4")]


def test_four_flows_through_one_bottleneck_get_a_quarter_of_capacity_times_eta() -> None:
    loop, col, agents = setup(["h1", "h2", "h3", "h4", "h5"])
    incast_reports(col, 0, SENDERS)

    async def body() -> None:
        await loop.step()

    asyncio.run(body())
    expected = 100e6 * 0.95 / 4
    for i, h in enumerate(["h1", "h2", "h3", "h4"]):
        key = (SENDERS[i][1], "10.0.2.1", 17, 49152, 4791)
        assert agents[h].caps == {key: pytest.approx(expected, rel=0.05)}
        assert agents[h].policy == LawPolicy("tita", {})
    assert agents["h5"].caps == {}
    cap = loop.caps[("10.0.1.1", "10.0.2.1", 17, 49152, 4791)]
    assert cap.bottleneck in ("leaf1:5", "spine1:2", "leaf2:1") and cap.pushed


def test_caps_pushed_once_then_only_on_change_and_cleared_when_idle() -> None:
    loop, col, agents = setup(["h1", "h2", "h3", "h4"])
    loop.policy = type(loop.policy)(**{**loop.policy.__dict__, "flow_idle_s": 0.5})

    async def body() -> None:
        seq = incast_reports(col, 0, SENDERS)
        await loop.step()
        seq = incast_reports(col, seq, SENDERS)
        await loop.step()  # same caps: nothing to push
        assert agents["h1"].calls.count("set_caps") == 1
        assert agents["h1"].calls.count("set_policy") == 1
        # h3 and h4 stop: h1 and h2 share the bottleneck in halves
        time.sleep(0.6)
        incast_reports(col, seq, SENDERS[:2])
        await loop.step()
        assert agents["h1"].caps == {
            ("10.0.1.1", "10.0.2.1", 17, 49152, 4791): pytest.approx(100e6 * 0.95 / 2)
        }
        assert agents["h3"].caps == {} and "clear_caps" in agents["h3"].calls

    asyncio.run(body())


def test_hanging_and_failing_agents_are_counted_skips() -> None:
    loop, col, agents = setup(["h1", "h2", "h3", "h4"])
    agents["h2"].hang = True
    agents["h3"].fail = True
    incast_reports(col, 0, SENDERS)

    async def body() -> float:
        t0 = time.monotonic()
        await loop.step()
        return time.monotonic() - t0

    took = asyncio.run(body())
    assert took < 1.5  # one timeout (0.3 s), concurrently, not one per agent in a row
    assert loop.skips["agent_list_flows"] == 2
    assert not loop.state["h2"].reachable and "TimeoutError" in loop.state["h2"].last_error
    assert "refused" in loop.state["h3"].last_error
    # the healthy agents got their caps: the max-min shares still count all four flows
    assert agents["h1"].caps and agents["h4"].caps
    # h3 comes back: it gets the policy again and its cap
    agents["h3"].fail = False
    asyncio.run(loop.step())
    assert agents["h3"].policy is not None and agents["h3"].caps


def test_flows_known_only_to_agents_use_the_links_all_paths_share() -> None:
    loop, col, agents = setup(["h1", "h2"])
    # NIC-INT hosts: the collector sees nothing; the agents list their flows
    agents["h1"].flows = [AgentFlow(("10.0.1.1", "10.0.2.1", 17, 5000, 4791), 80e6)]
    agents["h2"].flows = [AgentFlow(("10.0.1.2", "10.0.2.1", 17, 5001, 4791), 80e6)]
    asyncio.run(loop.step())
    cap = loop.caps[("10.0.1.1", "10.0.2.1", 17, 5000, 4791)]
    assert cap.links == ["h1:eth0", "leaf2:1"] and cap.bottleneck == "leaf2:1"
    assert cap.cap_bps == pytest.approx(100e6 * 0.95 / 2)
    assert cap.rate_bps == 80e6


def test_flows_the_agents_report_idle_take_no_share() -> None:
    loop, col, agents = setup(["h1", "h2"])
    live = ("10.0.1.1", "10.0.2.1", 17, 5000, 4791)
    # an agent keeps a finished flow (with its last rate) until its own idle timeout
    agents["h1"].flows = [AgentFlow(live, 80e6)]
    agents["h2"].flows = [
        AgentFlow(
            ("10.0.1.2", "10.0.2.1", 17, 5001, 4791), 80e6, idle_s=loop.policy.flow_idle_s + 1
        )
    ]
    asyncio.run(loop.step())
    assert list(loop.caps) == [live]
    assert loop.caps[live].cap_bps == pytest.approx(100e6 * 0.95)


def test_auto_tune_sets_w_ai_from_the_bottleneck_flow_count() -> None:
    loop, col, agents = setup(["h1", "h2", "h3", "h4"])
    loop.policy = type(loop.policy)(**{**loop.policy.__dict__, "auto_tune": True})
    incast_reports(col, 0, SENDERS)
    asyncio.run(loop.step())  # first step: the caps (and the flow counts) appear
    asyncio.run(loop.step())
    pol = agents["h1"].policy
    assert pol is not None and pol.params["w_ai_bps"] == round(100e6 * (1 - 0.95) / 4)


@pytest.mark.fault
def test_a_restarted_controller_leaves_policies_and_caps_in_force_alone() -> None:
    loop, col, agents = setup(["h1", "h2", "h3", "h4"])
    incast_reports(col, 0, SENDERS)
    asyncio.run(loop.step())
    # a new controller (new loop, same agents that keep their state)
    loop2 = SlowLoop(loop.policy, loop.topo, col, agents, timeout_s=0.3)
    for a in agents.values():
        a.flows = [AgentFlow(k, 20e6) for k in a.caps]
        a.calls.clear()
    asyncio.run(loop2.step())
    from tests.faults import record

    record(
        "controller_restart_keeps_rates",
        agents=len(agents),
        caps_in_force=sum(len(a.caps) for a in agents.values()),
        caps_rewritten=sum(a.calls.count("set_caps") for a in agents.values()),
        policies_rewritten=sum(a.calls.count("set_policy") for a in agents.values()),
    )
    for a in agents.values():
        assert "set_policy" not in a.calls and "set_caps" not in a.calls, a.calls
        assert a.calls[:3] == ["list_flows", "setup", "policy_in_force"]
