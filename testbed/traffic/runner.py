"""Run one job on a set of hosts: a worker process per host in its network namespace.

`run_job(hosts, spec)` starts `python -m testbed.traffic.worker` in every host's namespace
(`nsenter --net=...`, so the mount namespace and bpffs pins stay visible), hands each the job
spec, waits until all have created their queue pairs, gives them a common start time, gathers
their results, then lets them exit together (a host that finished early keeps answering its
peers' retransmissions until then). It stops only the processes it started.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from testbed.traffic.netns import Host

_REPO = Path(__file__).resolve().parents[2]


class RunError(RuntimeError):
    pass


@dataclass
class RunOutput:
    spec: dict[str, Any]
    results: list[dict[str, Any]]  # per host, in host order
    counters: list[dict[str, Any]] = field(default_factory=list)


class _Worker:
    def __init__(self, host: Host) -> None:
        self.host = host
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            host.command([sys.executable, "-m", "testbed.traffic.worker"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            # a session of its own: under the kernel's autogroup scheduling each worker gets a
            # CPU share of its own instead of all of them sharing the caller's
            start_new_session=True,
        )

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def stderr_tail(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stderr is not None
        return self.proc.stderr.read()[-2000:]


def _gather(workers: list[_Worker], key: str, deadline: float) -> list[Any]:
    """The `key` value of the next message from every worker."""
    out: dict[int, Any] = {}
    while len(out) < len(workers):
        pending: dict[IO[str], int] = {
            w.proc.stdout: i for i, w in enumerate(workers) if i not in out and w.proc.stdout
        }
        wait = deadline - time.monotonic()
        if wait <= 0:
            names = [workers[i].host.name for i in pending.values()]
            raise RunError(f"timed out waiting for '{key}' from {names}")
        ready, _, _ = select.select(list(pending), [], [], wait)
        for stream in ready:
            i = pending[stream]
            assert stream is not None
            line = stream.readline()
            if not line:
                w = workers[i]
                w.proc.wait(timeout=5)
                raise RunError(
                    f"worker on {w.host.name} exited ({w.proc.returncode}):\n{w.stderr_tail()}"
                )
            msg = json.loads(line)
            if "error" in msg:
                raise RunError(f"worker on {workers[i].host.name}: {msg['error']}")
            out[i] = msg[key]
    return [out[i] for i in range(len(workers))]


def run_job(
    hosts: list[Host],
    spec: dict[str, Any],
    *,
    setup_timeout: float = 30.0,
    on_start: Callable[[float], None] | None = None,
) -> RunOutput:
    """Run `spec` (a job for testbed.traffic.jobs; `spec["hosts"]` is filled in) on `hosts`.
    `on_start(t)`: told the unix time the job starts at, once every worker is ready (starting
    the workers takes seconds: a scenario's clock starts here, not at the call)."""
    if len(hosts) < 2:
        raise ValueError("a run needs at least two hosts")
    spec = dict(spec, hosts=[{"name": h.name, "ip": h.ip} for h in hosts])
    run_timeout = float(spec.setdefault("timeout", 60.0))
    workers = [_Worker(h) for h in hosts]
    try:
        for i, w in enumerate(workers):
            w.send({"spec": spec, "me": i})
        _gather(workers, "ready", time.monotonic() + setup_timeout)
        start_at = time.monotonic() + 0.05
        for w in workers:
            w.send({"start_at": start_at})
        if on_start is not None:
            on_start(time.time() + start_at - time.monotonic())
        results = _gather(workers, "result", start_at + run_timeout + 10.0)
        for w in workers:
            w.send({"exit": True})
        counters = _gather(workers, "counters", time.monotonic() + 10.0)
        for w in workers:
            w.proc.wait(timeout=10)
        return RunOutput(spec, results, counters)
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
            for stream in (w.proc.stdin, w.proc.stdout, w.proc.stderr):
                if stream is not None:
                    stream.close()
