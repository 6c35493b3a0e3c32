"""gRPC HostAgent service (controller/proto/agent.proto) over an Agent."""

from __future__ import annotations

import ipaddress
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from controller.nic.agent.agent import Agent, AgentLimit, FlowView
from controller.nic.bpf.loader import FlowKey
from controller.nic.ratelaw import CcParams, Law, from_fixed, to_fixed
from controller.proto import agent_pb2 as pb
from controller.proto import agent_pb2_grpc as pb_grpc

log = logging.getLogger("xingmai.agent.service")

LAW_TO_PB = {
    Law.NONE: pb.RATE_LAW_NONE,
    Law.TITA: pb.RATE_LAW_TITA,
    Law.DCQCN: pb.RATE_LAW_DCQCN,
    Law.HPCC: pb.RATE_LAW_HPCC,
    Law.TIMELY: pb.RATE_LAW_TIMELY,
    Law.SWIFT: pb.RATE_LAW_SWIFT,
}
LAW_FROM_PB = {v: k for k, v in LAW_TO_PB.items()}

T = TypeVar("T")


def flow_from_pb(f: pb.FlowKey) -> FlowKey:
    try:
        src = str(ipaddress.IPv4Address(f.src_ip))
        dst = str(ipaddress.IPv4Address(f.dst_ip))
    except ValueError as exc:
        raise ValueError(f"flow addresses must be IPv4: {exc}") from exc
    if f.protocol not in (6, 17):
        raise ValueError(f"flow protocol must be 6 (TCP) or 17 (UDP), not {f.protocol}")
    if not (0 < f.src_port < 65536 and 0 < f.dst_port < 65536):
        raise ValueError("flow ports must be within [1, 65535]")
    return FlowKey(src, dst, f.protocol, f.src_port, f.dst_port)


def flow_to_pb(k: FlowKey) -> pb.FlowKey:
    return pb.FlowKey(
        src_ip=k.src, dst_ip=k.dst, protocol=k.proto, src_port=k.sport, dst_port=k.dport
    )


# Fractions of each law's message (checked within [0, 1], held in fixed point) and the
# integers, by the law's struct field they set.
_TITA_INTS = (("w_ai_bps", "wai_bps"), ("max_stage", "max_stage"), ("base_rtt_ns", "base_rtt_ns"))
_DCQCN_INTS = (
    ("rai_bps", "rai_bps"),
    ("rhai_bps", "rhai_bps"),
    ("byte_counter_bytes", "byte_counter"),
    ("alpha_timer_ns", "alpha_timer_ns"),
    ("rate_timer_ns", "rate_timer_ns"),
    ("cut_interval_ns", "cut_interval_ns"),
    ("fast_recovery_steps", "fast_recovery_steps"),
    ("clamp_target", "clamp_target"),
)
_TIMELY_INTS = ("delta_bps", "t_low_ns", "t_high_ns", "min_rtt_ns", "hai_steps")
_SWIFT_INTS = ("ai_bytes", "base_target_ns", "per_hop_ns", "sender_ttl")


def _fraction(msg: Any, name: str, law: str) -> int:
    v = getattr(msg, name)
    if not 0 <= v <= 1:
        raise ValueError(f"{law} {name} must be within [0, 1]")
    return to_fixed(v)


def overrides_from_pb(c: pb.RateLawConfig) -> dict[str, Any]:
    """The parameters a RateLawConfig sets (unset ones take the scaled defaults)."""
    out: dict[str, Any] = {"tita": {}, "dcqcn": {}, "timely": {}, "swift": {}}
    if c.HasField("min_rate_bps"):
        out["min_rate_bps"] = c.min_rate_bps
    t, d, m, w = c.tita, c.dcqcn, c.timely, c.swift
    if t.HasField("eta"):
        if not 0 < t.eta <= 1:
            raise ValueError("eta must be within (0, 1]")
        out["tita"]["eta"] = to_fixed(t.eta)
    for name, attr in _TITA_INTS:
        if t.HasField(name):
            out["tita"][attr] = getattr(t, name)
    if d.HasField("g"):
        if not 0 < d.g < 1:
            raise ValueError("g must be within (0, 1)")
        out["dcqcn"]["g"] = to_fixed(d.g)
    for name, attr in _DCQCN_INTS:
        if d.HasField(name):
            out["dcqcn"][attr] = getattr(d, name)
    for name in ("alpha", "beta"):
        if m.HasField(name):
            out["timely"][name] = _fraction(m, name, "TIMELY")
    for name in _TIMELY_INTS:
        if m.HasField(name):
            out["timely"][name] = getattr(m, name)
    for name in ("beta", "max_mdf"):
        if w.HasField(name):
            out["swift"][name] = _fraction(w, name, "Swift")
    for name in _SWIFT_INTS:
        if w.HasField(name):
            out["swift"][name] = getattr(w, name)
    return out


def params_to_pb(p: CcParams) -> pb.RateLawConfig:
    t = p.hpcc if p.law is Law.HPCC else p.tita  # the TitaParams message carries HPCC's own
    m, w = p.timely, p.swift
    return pb.RateLawConfig(
        law=LAW_TO_PB[p.law],
        min_rate_bps=p.min_rate_bps,
        tita=pb.TitaParams(
            eta=from_fixed(t.eta),
            w_ai_bps=t.wai_bps,
            max_stage=t.max_stage,
            base_rtt_ns=t.base_rtt_ns,
        ),
        dcqcn=pb.DcqcnParams(
            g=from_fixed(p.dcqcn.g),
            rai_bps=p.dcqcn.rai_bps,
            rhai_bps=p.dcqcn.rhai_bps,
            byte_counter_bytes=p.dcqcn.byte_counter,
            alpha_timer_ns=p.dcqcn.alpha_timer_ns,
            rate_timer_ns=p.dcqcn.rate_timer_ns,
            cut_interval_ns=p.dcqcn.cut_interval_ns,
            fast_recovery_steps=p.dcqcn.fast_recovery_steps,
            clamp_target=p.dcqcn.clamp_target,
        ),
        timely=pb.TimelyParams(
            alpha=from_fixed(m.alpha),
            beta=from_fixed(m.beta),
            delta_bps=m.delta_bps,
            t_low_ns=m.t_low_ns,
            t_high_ns=m.t_high_ns,
            min_rtt_ns=m.min_rtt_ns,
            hai_steps=m.hai_steps,
        ),
        swift=pb.SwiftParams(
            ai_bytes=w.ai_bytes,
            beta=from_fixed(w.beta),
            max_mdf=from_fixed(w.max_mdf),
            base_target_ns=w.base_target_ns,
            per_hop_ns=w.per_hop_ns,
            sender_ttl=w.sender_ttl,
        ),
    )


def flow_view_to_pb(v: FlowView) -> pb.Flow:
    return pb.Flow(
        flow=flow_to_pb(v.key),
        rate_bps=v.rate_bps,
        rate_origin=v.rate_origin,
        cap_bps=v.cap_bps,
        weight=v.weight,
        law=LAW_TO_PB[v.law],
        tx_bytes=v.tx_bytes,
        tx_packets=v.tx_packets,
        int_packets=v.int_packets,
        idle_s=v.idle_s,
        interface=v.interface,
        paced_rate_bps=v.paced_rate_bps,
        cc=pb.CcState(**v.cc) if v.cc else None,  # type: ignore[arg-type]
    )


def law_from_pb(value: int) -> Law:
    for pb_law, law in LAW_FROM_PB.items():
        if pb_law == value:
            return law
    raise ValueError(f"config.law {value} is not a rate law this agent knows")


# Server threads: each open WatchRates stream holds one, so at most MAX_WATCHERS streams are
# let in and the rest always serve the unary calls (GetStatus, SetCaps, ...).
MAX_WORKERS = 16
MAX_WATCHERS = 8


class HostAgentService(pb_grpc.HostAgentServicer):
    def __init__(
        self, agent: Agent, metrics_text: Callable[[], str], max_watchers: int = MAX_WATCHERS
    ):
        self.agent = agent
        self.metrics_text = metrics_text
        self._watch_slots = threading.BoundedSemaphore(max_watchers)
        self.max_watchers = max_watchers

    def _call(self, context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
        """Bad input is INVALID_ARGUMENT with the reason, a request over a bound
        RESOURCE_EXHAUSTED; anything else INTERNAL, logged."""
        try:
            return fn()
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except AgentLimit as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except Exception as exc:
            log.exception("request failed")
            context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        raise AssertionError("unreachable")

    def SetCaps(self, request: pb.SetCapsRequest, context: Any) -> pb.SetCapsResponse:
        def run() -> int:
            caps = [(flow_from_pb(c.flow), c.cap_bps) for c in request.caps]
            return self.agent.set_caps(caps)

        return pb.SetCapsResponse(applied=self._call(context, run))

    def ClearCaps(self, request: pb.ClearCapsRequest, context: Any) -> pb.ClearCapsResponse:
        n = self._call(
            context, lambda: self.agent.clear_caps([flow_from_pb(f) for f in request.flows])
        )
        return pb.ClearCapsResponse(cleared=n)

    def SetWeights(self, request: pb.SetWeightsRequest, context: Any) -> pb.SetWeightsResponse:
        def run() -> int:
            weights = [(flow_from_pb(w.flow), w.weight) for w in request.weights]
            return self.agent.set_weights(weights)

        return pb.SetWeightsResponse(applied=self._call(context, run))

    def SetRateLaw(self, request: pb.SetRateLawRequest, context: Any) -> pb.SetRateLawResponse:
        def run() -> CcParams:
            cfg = request.config
            if cfg.law == pb.RATE_LAW_UNSPECIFIED:
                raise ValueError("config.law is required")
            key = flow_from_pb(request.flow) if request.HasField("flow") else None
            return self.agent.set_rate_law(key, law_from_pb(cfg.law), overrides_from_pb(cfg))

        return pb.SetRateLawResponse(effective=params_to_pb(self._call(context, run)))

    def ClearFlowRateLaw(
        self, request: pb.ClearFlowRateLawRequest, context: Any
    ) -> pb.ClearFlowRateLawResponse:
        self._call(context, lambda: self.agent.clear_flow_rate_law(flow_from_pb(request.flow)))
        return pb.ClearFlowRateLawResponse()

    def SetRate(self, request: pb.SetRateRequest, context: Any) -> pb.SetRateResponse:
        def run() -> int:
            if request.rate_bps <= 0:
                raise ValueError("rate_bps must be positive")
            return self.agent.set_rate(flow_from_pb(request.flow), request.rate_bps)

        return pb.SetRateResponse(rate_bps=self._call(context, run))

    def DeclareFlows(
        self, request: pb.DeclareFlowsRequest, context: Any
    ) -> pb.DeclareFlowsResponse:
        keys = [flow_from_pb(f) for f in request.flows]
        return pb.DeclareFlowsResponse(
            declared=self._call(context, lambda: self.agent.declare_flows(keys))
        )

    def ClearFlows(self, request: pb.ClearFlowsRequest, context: Any) -> pb.ClearFlowsResponse:
        return pb.ClearFlowsResponse(cleared=self._call(context, self.agent.clear_flows))

    def SetPortRate(self, request: pb.SetPortRateRequest, context: Any) -> pb.SetPortRateResponse:
        return pb.SetPortRateResponse(
            rate_bps=self._call(context, lambda: self.agent.set_port_rate(request.rate_bps))
        )

    def SetHopSpeeds(
        self, request: pb.SetHopSpeedsRequest, context: Any
    ) -> pb.SetHopSpeedsResponse:
        speeds = [
            (s.node_id, s.port if s.HasField("port") else None, s.speed_bps) for s in request.speeds
        ]
        self._call(context, lambda: self.agent.set_hop_speeds(speeds))
        return pb.SetHopSpeedsResponse()

    def SetInt(self, request: pb.SetIntRequest, context: Any) -> pb.SetIntResponse:
        r = request
        self._call(
            context,
            lambda: self.agent.set_int(
                enabled=r.enabled if r.HasField("enabled") else None,
                dscp=r.dscp if r.HasField("dscp") else None,
                bitmap=r.instruction_bitmap if r.HasField("instruction_bitmap") else None,
                hop_budget=r.hop_budget if r.HasField("hop_budget") else None,
            ),
        )
        return pb.SetIntResponse()

    def ListFlows(self, request: pb.ListFlowsRequest, context: Any) -> pb.ListFlowsResponse:
        import time

        views = self._call(context, self.agent.list_flows)
        return pb.ListFlowsResponse(
            flows=[flow_view_to_pb(v) for v in views], time_ns=time.monotonic_ns()
        )

    def WatchRates(self, request: pb.WatchRatesRequest, context: Any) -> Iterator[pb.RateChange]:
        flows = self._call(context, lambda: {flow_from_pb(f) for f in request.flows}) or None
        if not self._watch_slots.acquire(blocking=False):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {self.max_watchers} WatchRates streams at once",
            )
        try:
            w = self.agent.watch(flows, max(0.0, request.min_change))
            try:
                while context.is_active():
                    try:
                        ev = w.q.get(timeout=0.5)
                    except queue.Empty:
                        continue
                    if ev is None:
                        return
                    yield pb.RateChange(
                        flow=flow_to_pb(ev.key),
                        rate_bps=ev.rate_bps,
                        previous_bps=ev.previous_bps,
                        origin=ev.origin,
                        time_ns=ev.time_ns,
                    )
            finally:
                self.agent.unwatch(w)
        finally:
            self._watch_slots.release()

    def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.Status:
        s = self._call(context, self.agent.status)
        return pb.Status(
            name=s["name"],
            version=s["version"],
            healthy=s["healthy"],
            interfaces=s["interfaces"],
            pacing_mode=s["pacing_mode"],
            pacing_detail=s["pacing_detail"],
            line_rate_bps=s["line_rate_bps"],
            host_law=params_to_pb(s["host_law"]),
            int_enabled=s["int_enabled"],
            int_dscp=s["int_dscp"],
            int_instruction_bitmap=s["int_bitmap"],
            int_hop_budget=s["int_hop_budget"],
            bpffs=s["bpffs"],
            adopted_pins=s["adopted_pins"],
            kernel_headers=s["kernel_headers"],
            flows=s["flows"],
            counters=s["counters"],
            uptime_s=s["uptime_s"],
        )

    def GetNicCounters(self, request: pb.GetNicCountersRequest, context: Any) -> pb.NicCounters:
        return pb.NicCounters(**self._call(context, self.agent.nic_counters))

    def SetProbes(self, request: pb.SetProbesRequest, context: Any) -> pb.SetProbesResponse:
        r = request
        cfg = {
            "ports_per_peer": r.ports_per_peer,
            "congested_bytes": r.congested_bytes,
            "seed": r.seed,
        }
        flows = self._call(
            context,
            lambda: self.agent.set_probes(r.interval_s, r.local_ip, list(r.peers), cfg),
        )
        return pb.SetProbesResponse(flows=flows)

    def PauseProbes(self, request: pb.PauseProbesRequest, context: Any) -> pb.PauseProbesResponse:
        probing = self._call(context, lambda: self.agent.pause_probes(request.paused))
        return pb.PauseProbesResponse(probing=probing)

    def GetProbes(self, request: pb.GetProbesRequest, context: Any) -> pb.ProbeTallies:
        t = self._call(context, self.agent.probe_tallies)
        return pb.ProbeTallies(
            time_ns=t["time_ns"],
            sent=t.get("sent", 0),
            send_errors=t.get("send_errors", 0),
            malformed=t.get("malformed", 0),
            flows_evicted=t.get("flows_evicted", 0),
            flows=[
                pb.ProbeFlow(
                    src_ip=f.src,
                    src_port=f.sport,
                    received=f.received,
                    lost=f.lost,
                    lost_congested=f.lost_congested,
                    duplicates=f.duplicates,
                    lost_local=f.lost_local,
                    hops=[
                        pb.ProbeHop(
                            node_id=h.node_id or 0,
                            in_port=h.in_port or 0,
                            out_port=h.out_port or 0,
                            qocc_bytes=h.qocc or 0,
                        )
                        for h in f.hops
                    ],
                )
                for f in t.get("flows", [])
            ],
        )

    def GetMetrics(self, request: pb.GetMetricsRequest, context: Any) -> pb.GetMetricsResponse:
        return pb.GetMetricsResponse(text=self._call(context, self.metrics_text))
