"""The host agent's gRPC API, on a real agent (eBPF programs loaded, in a namespace pair: root
only): every RPC with drawn fields — flow keys of every shape, caps, weights, rates, laws and
their parameters of every number, INT settings — the same mutated, and WatchRates streams
opened and left. The answer must be OK, INVALID_ARGUMENT or RESOURCE_EXHAUSTED, in time."""

from __future__ import annotations

import os
import signal
from typing import Any

import grpc
from hypothesis import strategies as st

from tests.fuzz.harness import EDITS, Crash, Surface, mutate
from tests.tc_helpers import tc

ALLOWED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
RPC_TIMEOUT_S = 10.0  # under the harness's wall-time limit: an answer later than this is a hang


def available() -> str | None:
    """Why this surface cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (a real agent: namespaces, eBPF)"
    return None


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status").read().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class AgentSurface(Surface):
    name = "agent_api"
    # the memory that must stay bounded is the agent's, checked in bounds(); this process is
    # only the client (Hypothesis, gRPC channels)
    max_rss_growth_mb = float("inf")
    max_agent_growth_mb = 100.0

    def __init__(self) -> None:
        from controller.proto import agent_pb2 as pb
        from testbed.emu.nicrig import AgentProcess, NetnsPair

        self.pb = pb
        self._pair_cm = NetnsPair.create()
        self.pair = self._pair_cm.__enter__()
        self.agent = AgentProcess(self.pair.a, self.pair.dev_a, 100_000_000).start()
        self.stub = self.agent.stub()
        self.streams: list[Any] = []
        assert self.agent.proc is not None
        self.agent_rss_mb = _rss_mb(self.agent.proc.pid)

    def strategy(self) -> st.SearchStrategy[Any]:
        pb = self.pb
        ip = st.one_of(
            st.just(self.pair.ip_a),
            st.just(self.pair.ip_b),
            st.text(max_size=20),
            st.ip_addresses(v=4).map(str),
            st.ip_addresses(v=6).map(str),
        )
        port = st.one_of(st.integers(0, 65536), st.just(4791), st.integers(0, 2**32 - 1))
        flow = st.builds(
            pb.FlowKey,
            src_ip=ip,
            dst_ip=ip,
            protocol=st.one_of(st.sampled_from([6, 17]), st.integers(0, 2**32 - 1)),
            src_port=port,
            dst_port=port,
        )
        u64 = st.one_of(st.integers(0, 10**9), st.integers(0, 2**64 - 1))
        f64 = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 1))
        tita = st.builds(
            pb.TitaParams,
            eta=f64,
            w_ai_bps=u64,
            max_stage=st.integers(0, 2**32 - 1),
            base_rtt_ns=u64,
        )
        dcqcn = st.builds(
            pb.DcqcnParams,
            g=f64,
            rai_bps=u64,
            rhai_bps=u64,
            byte_counter_bytes=u64,
            alpha_timer_ns=u64,
            rate_timer_ns=u64,
            cut_interval_ns=u64,
            fast_recovery_steps=st.integers(0, 2**32 - 1),
            clamp_target=st.integers(0, 2**32 - 1),
        )
        law = st.builds(
            pb.RateLawConfig,
            law=st.one_of(st.integers(0, 3), st.integers(0, 2**31 - 1)),
            min_rate_bps=u64,
            tita=tita,
            dcqcn=dcqcn,
        )
        reqs = st.one_of(
            st.tuples(
                st.just("SetCaps"),
                st.builds(
                    pb.SetCapsRequest,
                    caps=st.lists(st.builds(pb.FlowCap, flow=flow, cap_bps=u64), max_size=4),
                ),
            ),
            st.tuples(
                st.just("ClearCaps"),
                st.builds(pb.ClearCapsRequest, flows=st.lists(flow, max_size=4)),
            ),
            st.tuples(
                st.just("SetWeights"),
                st.builds(
                    pb.SetWeightsRequest,
                    weights=st.lists(
                        st.builds(pb.FlowWeight, flow=flow, weight=st.integers(0, 2**32 - 1)),
                        max_size=4,
                    ),
                ),
            ),
            st.tuples(st.just("SetRateLaw"), st.builds(pb.SetRateLawRequest, config=law)),
            st.tuples(
                st.just("SetRateLaw"), st.builds(pb.SetRateLawRequest, flow=flow, config=law)
            ),
            st.tuples(
                st.just("ClearFlowRateLaw"), st.builds(pb.ClearFlowRateLawRequest, flow=flow)
            ),
            st.tuples(st.just("SetRate"), st.builds(pb.SetRateRequest, flow=flow, rate_bps=u64)),
            st.tuples(
                st.just("SetHopSpeeds"),
                st.builds(
                    pb.SetHopSpeedsRequest,
                    speeds=st.lists(
                        st.builds(pb.HopSpeed, node_id=st.integers(0, 2**32 - 1), speed_bps=u64),
                        max_size=4,
                    ),
                ),
            ),
            st.tuples(
                st.just("SetInt"),
                st.builds(
                    pb.SetIntRequest,
                    dscp=st.integers(0, 2**32 - 1),
                    instruction_bitmap=st.integers(0, 2**32 - 1),
                    hop_budget=st.integers(0, 2**32 - 1),
                ),
            ),
            st.tuples(st.just("ListFlows"), st.just(pb.ListFlowsRequest())),
            st.tuples(st.just("GetStatus"), st.just(pb.GetStatusRequest())),
            st.tuples(
                st.just("WatchRates"),
                st.builds(pb.WatchRatesRequest, flows=st.lists(flow, max_size=2), min_change=f64),
            ),
        )
        return st.one_of(reqs, st.tuples(st.just("mutated"), reqs, EDITS))

    def check(self, case: Any) -> str:
        name, req = case[0], case[1]
        if name == "mutated":
            name, orig = req
            req = type(orig)()
            try:
                req.ParseFromString(mutate(orig.SerializeToString(), case[2]))
            except Exception:
                return "unparseable"
        if name == "WatchRates":
            call = self.stub.WatchRates(req, timeout=30)
            self.streams.append(call)
            if len(self.streams) > 12:  # clients that go away: their streams end
                self.streams.pop(0).cancel()
            return "stream"
        try:
            getattr(self.stub, name)(req, timeout=RPC_TIMEOUT_S)
            return f"{name}:OK"
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Crash(f"{name} hung (no answer in {RPC_TIMEOUT_S} s)") from exc
            if code not in ALLOWED:
                raise Crash(f"{name} answered {code.name}: {exc.details()}") from exc
            return f"{name}:{code.name}"

    def bounds(self) -> list[str]:
        out = []
        for s in self.streams:
            s.cancel()
        st = self.stub.GetStatus(self.pb.GetStatusRequest(), timeout=5)
        if not st.healthy:
            out.append("the agent is not healthy after the run")
        classes = tc(self.pair.a, "class", "show", "dev", self.pair.dev_a).count("class htb")
        if classes > 256 + 2:
            out.append(f"{classes} HTB classes")
        assert self.agent.proc is not None
        grew = _rss_mb(self.agent.proc.pid) - self.agent_rss_mb
        if grew > self.max_agent_growth_mb:
            out.append(f"the agent's memory grew {grew:.0f} MB")
        return out

    def close(self) -> None:
        try:
            rc = self.agent.stop(signal.SIGTERM)
            if rc != 0:
                raise RuntimeError(f"the agent exited {rc}: {self.agent.log_tail()}")
        finally:
            self._pair_cm.__exit__(None, None, None)
