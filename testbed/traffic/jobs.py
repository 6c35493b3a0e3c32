"""What one host does in a run: the per-host side of each workload, driving its `Transport`.

A job is made from the run's spec (JSON) and this host's index, and creates its queue pairs at
construction (before the runner says go, so no peer's first packet finds no QP). Jobs do no
I/O and read no clock (like the transport core they drive): `start(t0)` at the common start
time, then `poll(now)` whenever the transport made progress (a send completed, a message
arrived), `next_wake` came or, for a job whose `reads_nic_rates`, the NIC changed a flow's
rate; a poll at any other time changes nothing (the twin's hosts in C rely on it:
testbed/sim/host_native.py). `poll` returns True once this host's part is done, and
`result(now)` is JSON-able. Both engines run
them: the socket worker (testbed.traffic.worker, times on CLOCK_MONOTONIC, shared by all
namespaces) and the simulated twin (virtual time). Times in results are seconds relative to
the start time.

Queue pairs are numbered as testbed.traffic.queue_pairs says (no handshake needed).
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict, deque
from typing import Any, Protocol

import numpy as np

from testbed.traffic.collective_jobs import COLLECTIVE_JOBS
from testbed.traffic.generators import Flow
from testbed.traffic.queue_pairs import QpHost, qpn
from testbed.traffic.transport_core import QueuePair, SendOp

_PATTERN_PERIOD = 4093  # prime, so a packet landing at the wrong offset never matches


def payload(key: int, size: int) -> bytes:
    """Deterministic message content for flow/message `key` (both ends can make it)."""
    block = np.random.default_rng(key).integers(0, 256, _PATTERN_PERIOD, dtype=np.uint8)
    return np.resize(block, size).tobytes()


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _peer_qp(t: QpHost, me: int, peer: int, slot: int, hosts: list[dict[str, Any]]) -> QueuePair:
    q = t.qps.get(qpn(peer, slot))
    if q is None:
        q = t.create_qp(qpn(peer, slot), hosts[peer]["ip"], qpn(me, slot))
    return q


class FlowsJob:
    """Send this host's flows at their start times; receive and check the flows to it.

    Used by incast, all-to-all, WebSearch/Hadoop and single-message runs. A flow's FCT is the
    sender's completion (last packet acknowledged) minus its start time.
    """

    reads_nic_rates = False

    def __init__(self, t: QpHost, spec: dict[str, Any], me: int) -> None:
        self.t = t
        self.me = me
        self.verify = bool(spec.get("verify", True))
        self.seed = int(spec.get("seed", 1))
        hosts = spec["hosts"]
        flows = [Flow(**f) for f in spec["flows"]]
        self.sends = sorted((f for f in flows if f.src == me), key=lambda f: (f.start, f.id))
        self.expect: dict[int, deque[Flow]] = defaultdict(deque)  # QPN -> flows, in post order
        for f in sorted((f for f in flows if f.dst == me), key=lambda f: (f.start, f.id)):
            q = _peer_qp(t, me, f.src, f.slot, hosts)
            if not self.verify:  # only the sizes are checked: nothing to store
                q.store_bytes = 0
            self.expect[q.qpn].append(f)
        self.send_qp = {f.id: _peer_qp(t, me, f.dst, f.slot, hosts) for f in self.sends}
        # the application's declared pattern: its flows start at this rate (e.g. an incast's
        # fair share), handed to the NIC before they send
        start = spec.get("start_rate_bps")
        if start:
            for qp in {q.qpn: q for q in self.send_qp.values()}.values():
                t.hint_rate(qp, int(start))
        self.ops: list[tuple[Flow, SendOp]] = []
        self.received: list[dict[str, Any]] = []
        self.unexpected = 0
        self.todo: deque[Flow] = deque(self.sends)
        self.t0 = 0.0

    def _key(self, f: Flow) -> int:
        return self.seed * 1_000_003 + f.id

    def start(self, t0: float) -> None:
        self.t0 = t0

    @property
    def next_wake(self) -> float:
        """When the next flow starts (inf: none left)."""
        return self.t0 + self.todo[0].start if self.todo else math.inf

    def _drain_receives(self) -> None:
        for qpn_, queue in self.expect.items():
            qp = self.t.qps[qpn_]
            while (msg := qp.poll_recv()) is not None:
                if not queue:
                    self.unexpected += 1
                    continue
                f = queue.popleft()
                ok = msg.size == f.size
                if ok and self.verify:
                    ok = msg.data == payload(self._key(f), f.size)
                self.received.append(
                    {"id": f.id, "ok": ok, "bytes": msg.size, "t_done": msg.t_done - self.t0}
                )

    def _pending_receives(self) -> int:
        return sum(len(q) for q in self.expect.values())

    def poll(self, now: float) -> bool:
        todo = self.todo
        while todo and self.t0 + todo[0].start <= now:
            f = todo.popleft()
            # unverified: zeros the transport makes as it sends, none in memory (the packets
            # are the same: a message's bytes past its data are zeros)
            data = payload(self._key(f), f.size) if self.verify else b""
            op = self.send_qp[f.id].post_send(
                data, max(now, self.t0 + f.start), tag=f.id, size=f.size
            )
            self.ops.append((f, op))
        self._drain_receives()
        sends_done = not todo and all(op.done for _, op in self.ops)
        return sends_done and not self._pending_receives()

    def result(self, now: float) -> dict[str, Any]:
        t0 = self.t0
        return {
            "sent": [
                {
                    "id": f.id,
                    "src": f.src,
                    "dst": f.dst,
                    "size": f.size,
                    "start": f.start,
                    "done": op.done,
                    "fct": (op.t_done - (t0 + f.start)) if op.t_done is not None else None,
                }
                for f, op in self.ops
            ]
            + [
                {
                    "id": f.id,
                    "src": f.src,
                    "dst": f.dst,
                    "size": f.size,
                    "start": f.start,
                    "done": False,
                    "fct": None,
                }
                for f in self.todo
            ],
            "received": self.received,
            "missing": [f.id for q in self.expect.values() for f in q],
            "unexpected": self.unexpected,
            "elapsed": now - t0,
        }


class LongLivedJob:
    """Keep every flow of this host busy for `duration` s with back-to-back messages, then let
    what is in flight finish (at most `drain` s more) so every queue pair ends idle."""

    reads_nic_rates = False

    def __init__(self, t: QpHost, spec: dict[str, Any], me: int) -> None:
        self.t = t
        self.me = me
        self.duration = float(spec["duration"])
        self.drain = 2.0
        self.msg = int(spec.get("message", 1 << 20))
        hosts = spec["hosts"]
        flows = [Flow(**f) for f in spec["flows"]]
        self.mine = [(f, _peer_qp(t, me, f.dst, f.slot, hosts)) for f in flows if f.src == me]
        self.incoming = [_peer_qp(t, me, f.src, f.slot, hosts) for f in flows if f.dst == me]
        self.data = payload(int(spec.get("seed", 1)), self.msg)
        self.end = 0.0
        self.bad = 0
        self.received = 0
        self.acked: dict[int, int] | None = None
        # each flow's messages posted and not yet acknowledged, oldest first (they complete
        # in order): two at a time, the next posted as one completes
        self.posted: list[deque[SendOp]] = [deque() for _ in self.mine]

    @property
    def next_wake(self) -> float:
        return self.end if self.acked is None else self.end + self.drain

    def start(self, t0: float) -> None:
        self.end = t0 + self.duration
        for (_, qp), posted in zip(self.mine, self.posted, strict=True):
            for _ in range(2):
                posted.append(qp.post_send(self.data, t0))

    def poll(self, now: float) -> bool:
        for (_, qp), posted in zip(self.mine, self.posted, strict=True):
            while posted and posted[0].done:
                posted.popleft()
                if now < self.end:
                    posted.append(qp.post_send(self.data, now))
        for qp in self.incoming:
            while (m := qp.poll_recv()) is not None:
                self.received += 1
                self.bad += m.data != self.data
        if now < self.end:
            return False
        if self.acked is None:
            self.acked = {f.id: qp.counters.messages_sent * self.msg for f, qp in self.mine}
        return all(qp.idle for _, qp in self.mine) or now >= self.end + self.drain

    def result(self, now: float) -> dict[str, Any]:
        acked = self.acked or {f.id: qp.counters.messages_sent * self.msg for f, qp in self.mine}
        return {
            "flows": [
                {
                    "id": f.id,
                    "src": f.src,
                    "dst": f.dst,
                    "acked_bytes": acked[f.id],
                    "goodput_bps": acked[f.id] * 8 / self.duration,
                }
                for f, _ in self.mine
            ],
            "received_messages": self.received,
            "bad_messages": self.bad,
            "duration": self.duration,
        }


class MultiJob:
    """Several jobs at once on one run's hosts (a scenario file's concurrent jobs): this
    host's part of each job in `spec["jobs"]` that has it."""

    def __init__(self, t: QpHost, spec: dict[str, Any], me: int) -> None:
        self.parts: list[tuple[int, Any]] = []
        self.n_jobs = len(spec["jobs"])
        for i, sub in enumerate(spec["jobs"]):
            full = dict(sub, hosts=spec["hosts"], nic_ips=spec.get("nic_ips"))
            if not _has_host(full, me):
                continue
            self.parts.append((i, JOBS[full["kind"]](t, full, me)))
        self.done: set[int] = set()
        self.reads_nic_rates = any(job.reads_nic_rates for _, job in self.parts)

    def start(self, t0: float) -> None:
        for _, job in self.parts:
            job.start(t0)

    @property
    def next_wake(self) -> float:
        wakes = [job.next_wake for i, job in self.parts if i not in self.done]
        return min(wakes, default=math.inf)

    def poll(self, now: float) -> bool:
        for i, job in self.parts:
            if i not in self.done and job.poll(now):
                self.done.add(i)
        return len(self.done) == len(self.parts)

    def result(self, now: float) -> dict[str, Any]:
        out: list[dict[str, Any] | None] = [None] * self.n_jobs
        for i, job in self.parts:
            out[i] = job.result(now)
        return {"kind": "jobs", "jobs": out}


def _has_host(spec: dict[str, Any], me: int) -> bool:
    if spec["kind"] == "collective":
        return me in [int(h) for h in spec.get("ranks", range(len(spec["hosts"])))]
    if "flows" in spec:
        return any(f["src"] == me or f["dst"] == me for f in spec["flows"])
    return True


class Job(Protocol):
    """What the engines drive (see the module's docstring)."""

    def __init__(self, t: QpHost, spec: dict[str, Any], me: int) -> None: ...

    # whether a poll reads the NIC's rates (QpHost.nic_payload_rate): it is polled after the
    # NIC changes one too
    reads_nic_rates: bool

    @property
    def next_wake(self) -> float: ...

    def start(self, t0: float) -> None: ...

    def poll(self, now: float) -> bool: ...

    def result(self, now: float) -> dict[str, Any]: ...


JOBS: dict[str, type[Job]] = {
    "flows": FlowsJob,
    "longlived": LongLivedJob,
    "jobs": MultiJob,
}
JOBS.update(COLLECTIVE_JOBS)  # the collective library's (testbed.traffic.collective_jobs)
