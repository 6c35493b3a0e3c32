"""One host's transport process: `python -m testbed.traffic.worker`, started by the runner
inside the host's network namespace. It speaks JSON lines on stdin/stdout:

  runner -> worker  {"spec": {...}, "me": i}       the run and this host's index
  worker -> runner  {"ready": true}                 queue pairs exist
  runner -> worker  {"start_at": t}                 CLOCK_MONOTONIC time to start
  worker -> runner  {"result": {...}}               this host's part is done
  runner -> worker  {"exit": true}                  every host is done (until then the worker
                                                    keeps answering, e.g. re-ACKing)
  worker -> runner  {"counters": {...}}             transport counters, then it exits
Errors go to stderr and a {"error": "..."} line.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
import traceback
from typing import Any

from controller.nic.pfc import PinnedPfc
from controller.wire.roce import ROCE_UDP_PORT
from testbed.switch.native import DEFAULT_PIPELINE
from testbed.traffic.jobs import JOBS, Job
from testbed.traffic.transport import Transport, TransportConfig
from testbed.traffic.transport_core import QueuePair, port_seed


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _read() -> dict[str, Any]:
    line = sys.stdin.readline()
    if not line:
        raise EOFError("runner closed the control pipe")
    msg: dict[str, Any] = json.loads(line)
    return msg


class AgentHand:
    """The host's NIC agent (gRPC at `target`) as the hand the application's flows go through
    before they send: their start rates (SetRate: the agent paces the flow at it from its
    first packet, and the rate law starts there) and the others declared (DeclareFlows: each
    paced in a class of its own from its first packet); and as the NIC whose rates the
    application reads (`rate_bps`, the transport's NicRates: a WatchRates stream, opened at
    the first read, so that only a job that reads its NIC's rates pays for it)."""

    # WatchRates' min_change: a rate is told again when it moved 5 % from what was told
    MIN_CHANGE = 0.05

    def __init__(self, target: str) -> None:
        import grpc

        from controller.proto import agent_pb2, agent_pb2_grpc

        self._pb = agent_pb2
        self._grpc = grpc
        self._stub = agent_pb2_grpc.HostAgentStub(grpc.insecure_channel(target))
        self._rates: dict[tuple[str, str, int], int] = {}  # (src, dst, sport) -> b/s
        self._keys: dict[QueuePair, tuple[str, str, int]] = {}
        self._watch: Any = None
        self._line_bps = 0

    def rate_bps(self, qp: QueuePair) -> int:
        key = self._keys.get(qp)
        if key is None:
            key = self._keys[qp] = (socket.inet_ntoa(qp.local_addr), qp.peer_ip, qp.sport)
        if self._watch is None:
            status = self._stub.GetStatus(self._pb.GetStatusRequest(), timeout=5)
            self._line_bps = int(status.line_rate_bps)
            self._watch = self._stub.WatchRates(
                self._pb.WatchRatesRequest(min_change=self.MIN_CHANGE)
            )
            threading.Thread(target=self._follow, name="watch-rates", daemon=True).start()
        return self._rates.get(key, self._line_bps)

    def _follow(self) -> None:
        try:
            for ch in self._watch:
                f = ch.flow
                if f.protocol == 17 and f.dst_port == ROCE_UDP_PORT:
                    self._rates[(f.src_ip, f.dst_ip, f.src_port)] = int(ch.rate_bps)
        except self._grpc.RpcError as exc:
            if exc.code() != self._grpc.StatusCode.CANCELLED:  # close() cancels it
                print(
                    f"worker: WatchRates ended: {exc.code().name}: {exc.details()}; the job "
                    "reads no NIC rate from here on",
                    file=sys.stderr,
                )

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()

    def _key(self, src: str, dst: str, sport: int) -> Any:
        return self._pb.FlowKey(
            src_ip=src, dst_ip=dst, protocol=17, src_port=sport, dst_port=ROCE_UDP_PORT
        )

    def start_rate(self, src: str, dst: str, sport: int, rate_bps: int) -> int:
        req = self._pb.SetRateRequest(flow=self._key(src, dst, sport), rate_bps=rate_bps)
        return int(self._stub.SetRate(req, timeout=5).rate_bps)

    def declare(self, flows: list[tuple[str, str, int]]) -> int:
        """How many the agent took: all, or none when it refused them (too many flows that
        have not sent yet: logged; they start in the default class, as undeclared)."""
        req = self._pb.DeclareFlowsRequest(flows=[self._key(*f) for f in flows])
        try:
            self._stub.DeclareFlows(req, timeout=10)
        except self._grpc.RpcError as exc:
            print(
                f"worker: DeclareFlows refused: {exc.code().name}: {exc.details()}", file=sys.stderr
            )
            return 0
        return len(flows)


def run_job(t: Transport, job: Job, t0: float, timeout: float) -> dict[str, Any]:
    """Run `job` on `t` from `t0` until its part is done or `timeout` s pass: the job polled
    after every step, or (the native loop, for a job that reads no NIC rate, which the agent
    changes at any time) only after a step that made progress and at its wake-up, the polls
    between them doing nothing by the jobs' contract (testbed/traffic/jobs.py)."""
    t.run_until(lambda: time.monotonic() >= t0)
    job.start(t0)
    deadline = t0 + timeout
    steps = t.native_loop() and not job.reads_nic_rates
    while True:
        now = time.monotonic()
        if job.poll(now) or now >= deadline:
            break
        if steps:
            t.run_steps(min(job.next_wake, deadline))
        else:
            t.step(now, max(0.0, min(0.01, job.next_wake - now, deadline - now)))
    return job.result(time.monotonic())


def main() -> int:
    try:
        hello = _read()
        spec, me = hello["spec"], int(hello["me"])
        host = spec["hosts"][me]
        cfg = TransportConfig(local_ip=host["ip"], **spec.get("transport", {}))
        # a lossless run: the NIC's record of its switch's PFC pauses holds the sends
        pin = spec.get("pfc_pins", {}).get(host["name"])
        pfc = PinnedPfc(pin) if pin else None
        agent = spec.get("agents", {}).get(host["name"])
        hand = AgentHand(agent) if agent else None
        with Transport(
            cfg,
            pfc.hold_until_ns if pfc else None,
            hand.start_rate if hand else None,
            hand.declare if hand else None,
            seed=port_seed(int(spec.get("seed", 1)), me),
            pipeline=spec.get("transport_pipeline", DEFAULT_PIPELINE),
            hold_map=pfc.native_view() if pfc else None,
        ) as t:
            t.core.nic_rates = hand
            job = JOBS[spec["kind"]](t, spec, me)
            t.apply_hints()  # the NIC paces every flow in its own class before any sends
            _emit({"ready": True})
            t0 = float(_read()["start_at"])
            _emit({"result": run_job(t, job, t0, float(spec.get("timeout", 60.0)))})
            last = 0.0

            def exit_requested() -> bool:
                nonlocal last
                now = time.monotonic()
                if now - last < 0.005:
                    return False
                last = now
                return bool(select.select([sys.stdin], [], [], 0)[0])

            t.run_until(exit_requested)
            _emit({"counters": t.counters()})
        if hand is not None:
            hand.close()
        return 0
    except Exception as exc:  # reported to the runner, which fails the run with it
        traceback.print_exc()
        _emit({"error": f"{type(exc).__name__}: {exc}"})
        return 1


if __name__ == "__main__":
    sys.exit(main())
