"""The slow loop's view of the host agents: one gRPC client per agent (controller/proto/
agent.proto, service xingmai.agent.v1.HostAgent).

`setup()` runs when an agent is first reached and whenever it comes back (it may have
restarted): it sets the NIC's INT source (on for hosts whose NIC does INT, off otherwise) and
the speed of every switch egress port (TiTa's per-hop B). `set_policy()` sets the host's rate
law and parameters; `set_caps()` / `clear_caps()` / `list_flows()` / `nic_counters()` map one to
one onto the RPCs.
Every failure is an `AgentError` naming the RPC and the gRPC status.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor

from controller.common.channels import RECONNECT_OPTIONS
from controller.config import RATE_LAW_PARAMS, Config, HostConfig, LawPolicy
from controller.health import NicSample, ProbeFlowSample, probe_congested_bytes
from controller.proto import agent_pb2 as pb
from controller.proto import agent_pb2_grpc as pb_grpc
from controller.slowloop import AgentError, AgentFlow, AgentPort, FlowKey
from controller.topology import Topology, probe_peers
from controller.wire.telemetry_report import Hop

# The RateLawConfig message each law's parameters go in (T, base_rtt_ns, is TitaParams')
_LAW_MESSAGE = {
    "tita": "tita",
    "hpcc": "tita",
    "dcqcn": "dcqcn",
    "timely": "timely",
    "swift": "swift",
}


def rate_law_config(policy: LawPolicy) -> Any:
    """A LawPolicy as the agent's RateLawConfig (unset parameters: the agent's defaults)."""
    allowed = RATE_LAW_PARAMS[policy.rate_law]
    cfg = pb.RateLawConfig(law=pb.RateLaw.Value(f"RATE_LAW_{policy.rate_law.upper()}"))
    for name, value in policy.params.items():
        if name not in allowed:
            raise ValueError(f"{policy.rate_law} has no parameter {name!r}")
        if name == "min_rate_bps":
            target = cfg
        elif name == "base_rtt_ns":
            target = cfg.tita
        else:
            target = getattr(cfg, _LAW_MESSAGE[policy.rate_law])
        # whole numbers where the API's field is an integer (its descriptor says which)
        whole = target.DESCRIPTOR.fields_by_name[name].cpp_type != FieldDescriptor.CPPTYPE_DOUBLE
        setattr(target, name, round(value) if whole else float(value))
    return cfg


def _key(k: FlowKey) -> Any:
    return pb.FlowKey(src_ip=k[0], dst_ip=k[1], protocol=k[2], src_port=k[3], dst_port=k[4])


class GrpcAgent:
    def __init__(self, host: HostConfig, cfg: Config, topo: Topology):
        assert host.agent is not None
        self.host = host.name
        self.addr = host.agent
        self._host = host
        self._cfg = cfg
        self._topo = topo
        self._timeout = cfg.controller.rpc_timeout_s
        self._channel = grpc.aio.insecure_channel(self.addr, options=RECONNECT_OPTIONS)
        self._stub = pb_grpc.HostAgentStub(self._channel)

    async def _rpc(self, name: str, request: Any) -> Any:
        try:
            return await getattr(self._stub, name)(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise AgentError(f"{name}: {exc.code().name} {exc.details() or ''}".strip()) from None

    async def setup(self) -> None:
        c = self._cfg
        nic_int = self._host.int_mode == "nic"
        await self._rpc(
            "SetInt",
            pb.SetIntRequest(
                enabled=nic_int,
                dscp=c.int.dscp,
                instruction_bitmap=c.int.instruction_bitmap,
                hop_budget=c.int.hop_budget,
            ),
        )
        speeds = [
            pb.HopSpeed(
                node_id=s.node_id,
                port=p.port,
                speed_bps=round(self._topo.port_speed_bps(s.name, p.port)),
            )
            for s in c.switches
            for p in s.ports
        ]
        await self._rpc("SetHopSpeeds", pb.SetHopSpeedsRequest(speeds=speeds))
        interval = c.controller.probe_interval_s
        if interval > 0 and self._host.nics:
            ip = {h.name: h.nics[0].ip for h in c.hosts if h.nics}
            peers = probe_peers(self.host, self._topo.leaves())
            await self._rpc(
                "SetProbes",
                pb.SetProbesRequest(
                    interval_s=interval,
                    local_ip=ip[self.host],
                    peers=[ip[p] for p in peers],
                    congested_bytes=probe_congested_bytes(c.model.queue_depth_bytes),
                    seed=1 + [h.name for h in c.hosts].index(self.host),
                ),
            )

    async def set_policy(self, policy: LawPolicy) -> None:
        await self._rpc("SetRateLaw", pb.SetRateLawRequest(config=rate_law_config(policy)))

    async def policy_in_force(self, policy: LawPolicy) -> bool:
        """The agent's host law already is `policy` (a restarted controller then leaves it
        alone): same law, and every parameter the policy sets has that value."""
        st = await self._rpc("GetStatus", pb.GetStatusRequest())
        want = rate_law_config(policy)
        have = st.host_law
        if have.law != want.law:
            return False
        for sub in ("tita", "dcqcn", "timely", "swift"):
            w, h = getattr(want, sub), getattr(have, sub)
            for fd, value in w.ListFields():
                # fractions are fixed point (2^-20) in the NIC: equal within that
                if abs(getattr(h, fd.name) - value) > max(1e-5 * abs(value), 1e-6):
                    return False
        return not want.HasField("min_rate_bps") or have.min_rate_bps == want.min_rate_bps

    async def set_caps(self, caps: Mapping[FlowKey, float]) -> None:
        await self._rpc(
            "SetCaps",
            pb.SetCapsRequest(
                caps=[pb.FlowCap(flow=_key(k), cap_bps=max(1, round(v))) for k, v in caps.items()]
            ),
        )

    async def clear_caps(self, keys: list[FlowKey]) -> None:
        await self._rpc("ClearCaps", pb.ClearCapsRequest(flows=[_key(k) for k in keys]))

    async def list_flows(self) -> list[AgentFlow]:
        resp = await self._rpc("ListFlows", pb.ListFlowsRequest())
        out = []
        for f in resp.flows:
            k = f.flow
            out.append(
                AgentFlow(
                    (k.src_ip, k.dst_ip, k.protocol, k.src_port, k.dst_port),
                    float(f.rate_bps),
                    float(f.cap_bps),
                    float(f.weight or 1),
                    float(f.idle_s),
                )
            )
        return out

    async def nic_counters(self) -> NicSample:
        """The NIC's counters for the localizer, timed by the agent's clock (its rates are
        differences between two readings of the same agent)."""
        r = await self._rpc("GetNicCounters", pb.GetNicCountersRequest())
        return NicSample(
            self.host, r.time_ns / 1e9, r.tx_bytes, r.waiting_bits, r.line_rate_bps, r.paused_ns
        )

    async def probe_flows(self) -> tuple[float, list[ProbeFlowSample]]:
        """The probe flows this host's NIC received (GetProbes), at the agent's time."""
        r = await self._rpc("GetProbes", pb.GetProbesRequest())
        return r.time_ns / 1e9, [
            ProbeFlowSample(
                f.src_ip,
                f.src_port,
                received=f.received,
                lost=f.lost,
                lost_congested=f.lost_congested,
                lost_local=f.lost_local,
                hops=tuple(
                    Hop(
                        node_id=h.node_id, in_port=h.in_port, out_port=h.out_port, qocc=h.qocc_bytes
                    )
                    for h in f.hops
                ),
            )
            for f in r.flows
        ]

    async def close(self) -> None:
        await self._channel.close()


def connect_agents(cfg: Config) -> dict[str, AgentPort]:
    """A client per host that has an agent address (channels connect lazily)."""
    topo = Topology(cfg)
    return {h.name: GrpcAgent(h, cfg, topo) for h in cfg.hosts if h.agent}
