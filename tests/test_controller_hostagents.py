"""The agents' gRPC client against in-process fake HostAgent servers: setup (INT source and hop
speeds), rate law mapping, caps, flow lists; the slow loop through real gRPC gives 4 flows
through one bottleneck a quarter of capacity x eta each; a hanging or absent agent is a
counted skip."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.collector import Collector
from controller.config import Config, LawPolicy, load
from controller.hostagents import GrpcAgent, rate_law_config
from controller.proto import agent_pb2 as pb
from controller.slowloop import AgentError, SlowLoop
from controller.topology import Topology
from tests.controller_rig import FakeHostAgent, free_port
from tests.telemetry_helpers import hop, report

EXAMPLE = Path(__file__).parents[1] / "controller" / "examples" / "leafspine-2x2.yaml"


def test_rate_law_config_maps_parameters_by_law() -> None:
    c = rate_law_config(LawPolicy("tita", {"eta": 0.9, "w_ai_bps": 1e5 + 0.4, "min_rate_bps": 1e6}))
    assert c.law == pb.RATE_LAW_TITA and c.tita.eta == pytest.approx(0.9)
    assert c.tita.w_ai_bps == 100000 and c.min_rate_bps == 1_000_000
    assert not c.tita.HasField("max_stage")  # unset: the agent's default
    d = rate_law_config(LawPolicy("dcqcn", {"g": 1 / 256, "rai_bps": 5e6}))
    assert d.law == pb.RATE_LAW_DCQCN and d.dcqcn.rai_bps == 5_000_000
    with pytest.raises(ValueError, match="no parameter 'g'"):
        rate_law_config(LawPolicy("tita", {"g": 0.5}))


@pytest.fixture
def fakes() -> Iterator[dict[str, FakeHostAgent]]:
    agents = {f"h{i}": FakeHostAgent(f"h{i}") for i in range(1, 9)}
    yield agents
    for a in agents.values():
        a.close()


def config_with(agents: dict[str, FakeHostAgent]) -> Config:
    import dataclasses

    cfg = load(EXAMPLE)
    hosts = tuple(
        dataclasses.replace(h, agent=agents[h.name].addr if h.name in agents else None)
        for h in cfg.hosts
    )
    ctl = dataclasses.replace(cfg.controller, rpc_timeout_s=0.5)
    return dataclasses.replace(cfg, hosts=hosts, controller=ctl)


def test_grpc_agent_calls(fakes: dict[str, FakeHostAgent]) -> None:
    cfg = config_with(fakes)
    topo = Topology(cfg)
    key = ("10.0.1.1", "10.0.2.1", 17, 49152, 4791)

    async def body() -> None:
        agent = GrpcAgent(cfg.host("h1"), cfg, topo)
        await agent.setup()
        await agent.set_policy(LawPolicy("dcqcn", {"rai_bps": 2e6}))
        await agent.set_caps({key: 23.75e6})
        fakes["h1"].flows = [(key, 20_000_000)]
        flows = await agent.list_flows()
        assert flows[0].key == key and flows[0].rate_bps == 20e6
        assert flows[0].cap_bps == 23_750_000
        await agent.clear_caps([key])
        await agent.close()

    asyncio.run(body())
    f = fakes["h1"]
    # h1 is "int: switch" in the example: the NIC's INT source is off
    assert f.int.enabled is False and f.int.dscp == 0x17 and f.int.instruction_bitmap == 0xF500
    assert len(f.hop_speeds) == 7 + 6 + 2 + 2  # every switch port
    assert {s.speed_bps for s in f.hop_speeds} == {100_000_000}
    assert f.law.law == pb.RATE_LAW_DCQCN and f.law.dcqcn.rai_bps == 2_000_000
    assert f.caps == {}
    assert f.calls == ["SetInt", "SetHopSpeeds", "SetRateLaw", "SetCaps", "ListFlows", "ClearCaps"]


def test_absent_and_hanging_agents_raise_agent_errors(fakes: dict[str, FakeHostAgent]) -> None:
    cfg = config_with(fakes)
    topo = Topology(cfg)
    import dataclasses

    gone = dataclasses.replace(cfg.host("h2"), agent=f"127.0.0.1:{free_port()}")
    fakes["h3"].hang.set()

    async def body() -> None:
        a = GrpcAgent(gone, cfg, topo)
        with pytest.raises(AgentError, match="ListFlows: UNAVAILABLE"):
            await a.list_flows()
        await a.close()
        b = GrpcAgent(cfg.host("h3"), cfg, topo)
        t0 = time.monotonic()
        with pytest.raises(AgentError, match="SetCaps: DEADLINE_EXCEEDED"):
            await b.set_caps({("10.0.1.3", "10.0.2.1", 17, 1, 4791): 1e6})
        assert time.monotonic() - t0 < 2.0
        await b.close()

    asyncio.run(body())


def test_slow_loop_over_grpc_caps_four_flows_at_a_quarter(fakes: dict[str, FakeHostAgent]) -> None:
    cfg = config_with(fakes)
    topo = Topology(cfg)
    col = Collector(topo)
    for seq, (port, ip) in enumerate(
        [("1", "10.0.1.1"), ("2", "10.0.1.2"), ("3", "10.0.1.3"), ("4", "10.0.1.4")], start=1
    ):
        col.ingest(report(seq, 2, [hop(3, 1, 2), hop(1, int(port), 5)], src=ip, dst="10.0.2.1"))
    fakes["h7"].hang.set()  # an agent that hangs delays nobody and is skipped

    async def body() -> SlowLoop:
        agents = {h.name: GrpcAgent(h, cfg, topo) for h in cfg.hosts if h.agent}
        loop = SlowLoop(cfg.policy, topo, col, agents, timeout_s=0.5)
        await loop.step()
        for a in agents.values():
            await a.close()
        return loop

    loop = asyncio.run(body())
    want = 100e6 * 0.95 / 4
    for i in range(1, 5):
        caps = fakes[f"h{i}"].caps
        assert len(caps) == 1
        assert abs(next(iter(caps.values())) - want) <= 0.05 * want
    assert fakes["h5"].caps == {}
    assert fakes["h8"].law.tita.eta == pytest.approx(0.9)  # per-host policy
    assert fakes["h1"].law.law == pb.RATE_LAW_TITA
    assert not loop.state["h7"].reachable and loop.skips["agent_list_flows"] == 1


def test_policy_in_force_compares_what_the_policy_sets(fakes: dict[str, FakeHostAgent]) -> None:
    cfg = config_with(fakes)
    topo = Topology(cfg)

    async def body() -> list[bool]:
        a = GrpcAgent(cfg.host("h1"), cfg, topo)
        out = [await a.policy_in_force(LawPolicy("tita", {}))]  # nothing set yet
        await a.set_policy(LawPolicy("tita", {"eta": 0.9}))
        out += [
            await a.policy_in_force(LawPolicy("tita", {"eta": 0.9})),
            await a.policy_in_force(LawPolicy("tita", {})),
            await a.policy_in_force(LawPolicy("tita", {"eta": 0.95})),
            await a.policy_in_force(LawPolicy("dcqcn", {})),
        ]
        await a.close()
        return out

    assert asyncio.run(body()) == [False, True, True, False, False]


@pytest.mark.root
def test_real_agent_round_trip(tmp_path: Path) -> None:
    """The client against a real xingmai-agent (eBPF NIC) in a namespace: the API agrees."""
    import dataclasses

    ns = f"xch{uuid.uuid4().hex[:5]}"
    sock = tmp_path / "agent.sock"
    proc = None
    try:
        for argv in (
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", f"{ns}a", "type", "veth", "peer", "name", f"{ns}b"],
            ["ip", "link", "set", f"{ns}b", "netns", ns],
            ["ip", "netns", "exec", ns, "ip", "addr", "add", "10.0.1.1/24", "dev", f"{ns}b"],
            ["ip", "netns", "exec", ns, "ip", "link", "set", f"{ns}b", "up"],
            ["ip", "link", "set", f"{ns}a", "up"],
        ):
            subprocess.run(argv, check=True, capture_output=True)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "controller.nic.agent.main",
                "--netns",
                ns,
                "--name",
                ns,
                "--line-rate",
                "100M",
                "--listen",
                f"unix://{sock}",
                "--log-file",
                str(tmp_path / "agent.log"),
            ],
            cwd=Path(__file__).parents[1],
        )
        cfg = load(EXAMPLE)
        host = dataclasses.replace(cfg.host("h1"), agent=f"unix://{sock}", int_mode="nic")
        key = ("10.0.1.1", "10.0.2.1", 17, 49152, 4791)

        async def body() -> None:
            a = GrpcAgent(host, cfg, Topology(cfg))
            for _ in range(120):  # the agent compiles its programs first
                try:
                    await a.list_flows()
                    break
                except AgentError:
                    assert proc is not None and proc.poll() is None, "agent exited"
                    await asyncio.sleep(0.5)
            await a.setup()
            law = LawPolicy("tita", {"eta": 0.9, "w_ai_bps": 500_000})
            assert not await a.policy_in_force(law)
            await a.set_policy(law)
            assert await a.policy_in_force(law)
            await a.set_caps({key: 23.75e6})
            (flow,) = [f for f in await a.list_flows() if f.key == key]
            assert flow.cap_bps == 23_750_000 and flow.rate_bps <= 23_750_000
            await a.clear_caps([key])
            assert all(f.cap_bps == 0 for f in await a.list_flows() if f.key == key)
            await a.close()

        asyncio.run(body())
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{ns}a"], capture_output=True)
