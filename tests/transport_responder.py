"""A transport process in a host's namespace that answers one QP and reports what it got."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

from testbed.traffic.netns import Host

QPN = 7
MTU = 1024

# Runs in the responder's namespace: one QP towards the injector, counters and messages out.
# Its loop: Transport.run_until (Python's steps) or, `steps`, the worker's native loop
# (run_steps, the steps in C).
RESPONDER = textwrap.dedent(
    """
    import hashlib, json, sys, time
    from testbed.traffic.transport import Transport, TransportConfig
    from testbed.traffic.transport_core import counter_values
    args = json.loads(sys.argv[1])
    with Transport(TransportConfig(**args["cfg"])) as t:
        qp = t.create_qp(args["qpn"], args["peer"], args["qpn"])
        if args["send"]:  # a message of its own to the peer, on the same queue pair
            qp.post_send(bytes(args["send"]), time.monotonic())
        print("ready", flush=True)
        if args["loop"] == "steps":
            assert t.native_loop()
            end = time.monotonic() + args["seconds"]
            while time.monotonic() < end:
                t.run_steps(end)
        else:
            t.run_until(lambda: False, timeout=args["seconds"])
        msgs = []
        while (m := qp.poll_recv()) is not None:
            msgs.append({"len": len(m.data), "sha": hashlib.sha256(m.data).hexdigest()})
        print(json.dumps({"messages": msgs, "counters": t.counters(),
                          "qp": counter_values(qp.counters)}), flush=True)
    """
)


def start_responder(
    host: Host, peer: Host, seconds: float, loop: str = "until", send: int = 0, **cfg: Any
) -> subprocess.Popen:
    """The responder, ready; `send`: bytes of a message it sends its peer meanwhile."""
    args = {
        "cfg": {"local_ip": host.ip, "mtu": MTU, **cfg},
        "qpn": QPN,
        "peer": peer.ip,
        "seconds": seconds,
        "loop": loop,
        "send": send,
    }
    proc = subprocess.Popen(
        host.command([sys.executable, "-c", RESPONDER, json.dumps(args)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
    return proc


def finish(proc: subprocess.Popen) -> dict[str, Any]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result
