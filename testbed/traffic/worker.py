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
import sys
import time
import traceback
from typing import Any

from controller.nic.pfc import PinnedPfc
from controller.wire.roce import ROCE_UDP_PORT
from testbed.traffic.jobs import JOBS, Job
from testbed.traffic.transport import DeclareFn, StartRateFn, Transport, TransportConfig


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _read() -> dict[str, Any]:
    line = sys.stdin.readline()
    if not line:
        raise EOFError("runner closed the control pipe")
    msg: dict[str, Any] = json.loads(line)
    return msg


def agent_start_rate(target: str) -> StartRateFn:
    """The host's NIC agent (gRPC at `target`) as the hand the application's start rates go
    through: SetRate on the flow before it sends (the agent paces it from its first packet,
    and the rate law starts there)."""
    import grpc

    from controller.proto import agent_pb2, agent_pb2_grpc

    stub = agent_pb2_grpc.HostAgentStub(grpc.insecure_channel(target))

    def start_rate(src: str, dst: str, sport: int, rate_bps: int) -> int:
        key = agent_pb2.FlowKey(
            src_ip=src, dst_ip=dst, protocol=17, src_port=sport, dst_port=ROCE_UDP_PORT
        )
        resp = stub.SetRate(agent_pb2.SetRateRequest(flow=key, rate_bps=rate_bps), timeout=5)
        return int(resp.rate_bps)

    return start_rate


def agent_declare(target: str) -> DeclareFn:
    """The host's NIC agent (gRPC at `target`) told of the flows about to send (DeclareFlows):
    each paced in a class of its own from its first packet. A refusal (too many flows that
    have not sent yet) is logged and counted by the transport: those flows start in the
    default class, as undeclared."""
    import grpc

    from controller.proto import agent_pb2, agent_pb2_grpc

    stub = agent_pb2_grpc.HostAgentStub(grpc.insecure_channel(target))

    def declare(flows: list[tuple[str, str, int]]) -> int:
        keys = [
            agent_pb2.FlowKey(
                src_ip=src, dst_ip=dst, protocol=17, src_port=sport, dst_port=ROCE_UDP_PORT
            )
            for src, dst, sport in flows
        ]
        try:
            stub.DeclareFlows(agent_pb2.DeclareFlowsRequest(flows=keys), timeout=10)
        except grpc.RpcError as exc:
            print(
                f"worker: DeclareFlows refused: {exc.code().name}: {exc.details()}", file=sys.stderr
            )
            return 0
        return len(flows)

    return declare


def run_job(t: Transport, job: Job, t0: float, timeout: float) -> dict[str, Any]:
    """Run `job` on `t` from `t0` until its part is done or `timeout` s pass."""
    t.run_until(lambda: time.monotonic() >= t0)
    job.start(t0)
    deadline = t0 + timeout
    while True:
        now = time.monotonic()
        if job.poll(now) or now >= deadline:
            break
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
        start_rate = agent_start_rate(agent) if agent else None
        declare = agent_declare(agent) if agent else None
        with Transport(cfg, pfc.hold_until_ns if pfc else None, start_rate, declare) as t:
            job = JOBS[spec["kind"]](t, spec, me)
            t.apply_hints()  # the NIC paces the hinted flows before any of them sends
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
        return 0
    except Exception as exc:  # reported to the runner, which fails the run with it
        traceback.print_exc()
        _emit({"error": f"{type(exc).__name__}: {exc}"})
        return 1


if __name__ == "__main__":
    sys.exit(main())
