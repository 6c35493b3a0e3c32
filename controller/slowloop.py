"""The slow loop: every interval, per-flow caps from the fabric view, pushed to the host agents.

The fast loop (the rate law, per ACK) stays in the NIC; the controller never touches packets.
Every `policy.interval_s` it takes the flows seen recently — from the collector (path from INT)
and from the agents' flow lists (path from the topology: the links every shortest path shares,
for flows whose INT the collector does not see) — and computes weighted max-min fair shares on
each link's capacity × η. Each flow's share is pushed to its sender's agent as a cap; caps of
flows that went idle are cleared. Caps are re-pushed only when they move by more than
`CAP_TOLERANCE`, so a steady fabric costs no RPCs.

The policy (rate law and its parameters) is pushed per host when it changes and whenever an
agent comes back. With `auto_tune`, the additive increase W_AI of each host is set from the
number of flows sharing its flows' bottlenecks (HPCC's W_AI = B·(1−η)/N).

An agent that fails or hangs costs one timeout per interval and a logged, counted skip; the
other agents are served concurrently.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controller.collector import Collector
from controller.config import LawPolicy, PolicyConfig
from controller.health import NicSample, ProbeFlowSample
from controller.maxmin import max_min_fair
from controller.topology import Topology

log = logging.getLogger("xingmai.controller.slowloop")

FlowKey = tuple[str, str, int, int, int]  # src, dst, proto, sport, dport
CAP_TOLERANCE = 0.01


@dataclass(frozen=True)
class AgentFlow:
    key: FlowKey
    rate_bps: float
    cap_bps: float = 0.0  # 0: none
    weight: float = 1.0
    idle_s: float = 0.0  # since the flow's last packet (the agent keeps idle flows a while)


class AgentError(RuntimeError):
    pass


class AgentPort(Protocol):
    """What the slow loop needs from a host agent (controller.agents implements it over gRPC)."""

    host: str

    async def setup(self) -> None: ...
    async def set_policy(self, policy: LawPolicy) -> None: ...
    async def policy_in_force(self, policy: LawPolicy) -> bool: ...
    async def set_caps(self, caps: Mapping[FlowKey, float]) -> None: ...
    async def clear_caps(self, keys: list[FlowKey]) -> None: ...
    async def list_flows(self) -> list[AgentFlow]: ...
    async def nic_counters(self) -> NicSample: ...
    async def probe_flows(self) -> tuple[float, list[ProbeFlowSample]]: ...
    async def close(self) -> None: ...


@dataclass
class FlowCap:
    key: FlowKey
    host: str
    links: list[str]
    cap_bps: float
    bottleneck: str | None
    pushed: bool = False
    rate_bps: float = 0.0


@dataclass
class AgentState:
    reachable: bool = False
    policy_pushed: LawPolicy | None = None
    caps: dict[FlowKey, float] = field(default_factory=dict)  # as the agent holds them
    failures: int = 0
    last_error: str = ""
    flows: dict[FlowKey, AgentFlow] = field(default_factory=dict)


class SlowLoop:
    def __init__(
        self,
        policy: PolicyConfig,
        topo: Topology,
        collector: Collector,
        agents: Mapping[str, AgentPort],
        timeout_s: float = 2.0,
    ):
        self.policy = policy
        self.topo = topo
        self.collector = collector
        self.agents = dict(agents)
        self.timeout_s = timeout_s
        self.state = {h: AgentState() for h in self.agents}
        self.caps: dict[FlowKey, FlowCap] = {}
        self.runs = 0
        self.skips: Counter[str] = Counter()
        self._wake = asyncio.Event()
        self._step_lock = asyncio.Lock()

    # ---- the loop ----

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.step()
            except Exception:  # a bug in one step must not end the loop
                self.skips["step_exception"] += 1
                log.exception("slow loop step failed")
            delay = max(0.0, self.policy.interval_s - (time.monotonic() - started))
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            except TimeoutError:
                pass
            self._wake.clear()

    def poke(self) -> None:
        """Run the next step now (policy changed)."""
        self._wake.set()

    async def _call(self, host: str, what: str, coro: object) -> bool:
        st = self.state[host]
        try:
            await asyncio.wait_for(coro, timeout=self.timeout_s)  # type: ignore[arg-type]
        except (TimeoutError, AgentError, OSError) as exc:
            st.failures += 1
            st.reachable = False
            st.last_error = f"{what}: {type(exc).__name__}: {exc}"[:300]
            self.skips[f"agent_{what}"] += 1
            log.warning(
                "agent call failed", extra={"host": host, "call": what, "error": st.last_error}
            )
            return False
        return True

    async def _refresh_agent(self, host: str) -> None:
        """Flow list (rates); and the policy, when it changed or the agent came back."""
        agent, st = self.agents[host], self.state[host]
        flows: list[AgentFlow] = []

        async def fetch() -> None:
            flows.extend(await agent.list_flows())

        was_reachable = st.reachable
        if not await self._call(host, "list_flows", fetch()):
            return
        st.reachable = True
        st.flows = {f.key: f for f in flows}
        if not was_reachable:
            # first contact, or it came back (maybe restarted): its INT and hop speeds, then
            # the policy again; the caps it holds are what it reports
            if not await self._call(host, "setup", agent.setup()):
                return
            st.policy_pushed = None
            st.caps = {f.key: f.cap_bps for f in flows if f.cap_bps > 0}
            want = self.host_policy(host)
            in_force: list[bool] = []

            async def check() -> None:
                in_force.append(await agent.policy_in_force(want))

            if await self._call(host, "policy_in_force", check()) and in_force[0]:
                st.policy_pushed = want  # already so: not rewritten
        want = self.host_policy(host)
        if st.policy_pushed != want and await self._call(
            host, "set_policy", agent.set_policy(want)
        ):
            st.policy_pushed = want

    def host_policy(self, host: str) -> LawPolicy:
        base = self.policy.for_host(host)
        if not self.policy.auto_tune:
            return base
        n = self._bottleneck_flows(host)
        if n == 0:
            return base
        line = max(
            (dl.capacity_bps for dl in self.topo.links.values() if dl.tx.node == host), default=0.0
        )
        params = dict(base.params)
        params["w_ai_bps"] = round(line * (1 - self.policy.eta) / n)
        return dataclasses.replace(base, params=params)

    def _bottleneck_flows(self, host: str) -> int:
        per_link = Counter(c.bottleneck for c in self.caps.values() if c.bottleneck)
        return max(
            (per_link[c.bottleneck] for c in self.caps.values() if c.host == host and c.bottleneck),
            default=0,
        )

    def flow_paths(self) -> dict[FlowKey, tuple[str, list[str]]]:
        """Active flows: key -> (sending host, links)."""
        out: dict[FlowKey, tuple[str, list[str]]] = {}
        for rec in self.collector.active_flows(self.policy.flow_idle_s):
            host = rec.src_host
            if host is None or host not in self.agents or not rec.links:
                continue
            out[rec.key] = (host, rec.links)
        for host, st in self.state.items():
            for key, f in st.flows.items():
                if key in out or f.rate_bps <= 0 or f.idle_s > self.policy.flow_idle_s:
                    continue
                links = self.topo.common_links(key[0], key[1])
                if links:
                    out[key] = (host, links)
        return out

    async def step(self) -> None:
        async with self._step_lock:
            await self._step()

    async def _step(self) -> None:
        self.runs += 1
        await asyncio.gather(*(self._refresh_agent(h) for h in self.agents))
        paths = self.flow_paths()
        eta = self.policy.eta
        capacity = {name: dl.capacity_bps * eta for name, dl in self.topo.links.items()}
        weights = {
            k: self.state[h].flows[k].weight
            for k, (h, _) in paths.items()
            if k in self.state[h].flows
        }
        shares = max_min_fair(
            {k: links for k, (_, links) in paths.items()}, capacity, weights=weights
        )
        new_caps: dict[FlowKey, FlowCap] = {}
        for key, (host, links) in paths.items():
            s = shares.get(key)
            if s is None:
                continue
            prev = self.caps.get(key)
            agent_flow = self.state[host].flows.get(key)
            new_caps[key] = FlowCap(
                key,
                host,
                links,
                s.rate,
                s.bottleneck,
                pushed=prev.pushed if prev else False,
                rate_bps=agent_flow.rate_bps if agent_flow else 0.0,
            )
        self.caps = new_caps
        if self.policy.push_caps:
            await asyncio.gather(*(self._push(h) for h in self.agents))

    async def _push(self, host: str) -> None:
        st = self.state[host]
        if not st.reachable:
            return
        agent = self.agents[host]
        mine = {k: c for k, c in self.caps.items() if c.host == host}
        changed = {
            k: c.cap_bps
            for k, c in mine.items()
            if abs(st.caps.get(k, 0.0) - c.cap_bps) > CAP_TOLERANCE * c.cap_bps
        }
        stale = [k for k in st.caps if k not in mine]
        if changed and await self._call(host, "set_caps", agent.set_caps(changed)):
            st.caps.update(changed)
        if stale and await self._call(host, "clear_caps", agent.clear_caps(stale)):
            for k in stale:
                st.caps.pop(k, None)
        for k, c in mine.items():
            c.pushed = k in st.caps and abs(st.caps[k] - c.cap_bps) <= CAP_TOLERANCE * c.cap_bps

    # ---- policy changes (gRPC SetPolicy, SIGHUP) ----

    def set_agents(self, agents: Mapping[str, AgentPort]) -> None:
        """New agent connections (config reload): a host's state restarts as unreachable, so
        its policy and caps are pushed again."""
        self.agents = dict(agents)
        self.state = {h: AgentState() for h in self.agents}

    def set_policy(self, policy: PolicyConfig) -> None:
        self.policy = policy
        self.poke()
