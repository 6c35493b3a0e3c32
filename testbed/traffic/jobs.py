"""What one host does in a run: the per-host side of each workload, driving its `Transport`.

A job is made from the run's spec (JSON) and this host's index, and creates its queue pairs at
construction (before the runner says go, so no peer's first packet finds no QP). Jobs do no
I/O and read no clock (like the transport core they drive): `start(t0)` at the common start
time, then `poll(now)` whenever the transport made progress or `next_wake` came; `poll`
returns True once this host's part is done, and `result(now)` is JSON-able. Both engines run
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

from testbed.collective.job import COLLECTIVE_JOBS
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
            self.expect[_peer_qp(t, me, f.src, f.slot, hosts).qpn].append(f)
        self.send_qp = {f.id: _peer_qp(t, me, f.dst, f.slot, hosts) for f in self.sends}
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
                ok = len(msg.data) == f.size
                if ok and self.verify:
                    ok = msg.data == payload(self._key(f), f.size)
                self.received.append(
                    {"id": f.id, "ok": ok, "bytes": len(msg.data), "t_done": msg.t_done - self.t0}
                )

    def _pending_receives(self) -> int:
        return sum(len(q) for q in self.expect.values())

    def poll(self, now: float) -> bool:
        todo = self.todo
        while todo and self.t0 + todo[0].start <= now:
            f = todo.popleft()
            data = payload(self._key(f), f.size) if self.verify else bytes(f.size)
            op = self.send_qp[f.id].post_send(data, max(now, self.t0 + f.start), tag=f.id)
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


class AllReduceJob:
    """Ring all-reduce of a float32 vector: reduce-scatter then all-gather, n-1 steps each.

    Each step sends one segment to the next rank (in messages of at most `chunk` bytes) and
    waits for the segment from the previous rank before the next step, as NCCL's ring does.
    Rank r starts from integers drawn with seed+r (exact in float32), so every rank can check
    the reduced vector against the sum it computes itself.
    """

    next_wake = math.inf  # it only waits for the network

    def __init__(self, t: QpHost, spec: dict[str, Any], me: int) -> None:
        self.t = t
        self.me = me
        self.n = n = len(spec["hosts"])
        self.count = int(spec["size"]) // 4
        if self.count < n:
            raise ValueError("all-reduce size must hold at least one float32 per rank")
        self.chunk = int(spec.get("chunk", 1 << 20))
        self.iters = int(spec.get("iters", 1))
        self.seed = int(spec.get("seed", 1))
        hosts = spec["hosts"]
        self.next_qp = _peer_qp(t, me, (me + 1) % n, 0, hosts)
        self.prev_qp = _peer_qp(t, me, (me - 1) % n, 0, hosts)
        bounds = np.linspace(0, self.count, n + 1).astype(int)
        self.segs = [(int(bounds[i]), int(bounds[i + 1])) for i in range(n)]
        self.expected = np.zeros(0, dtype=np.float32)
        self.buf = np.zeros(0, dtype=np.float32)
        self.times: list[float] = []
        self.ok = True
        self.max_err = 0.0
        self.it = 0  # iteration
        self.s = 0  # step within the iteration: n-1 reduce-scatter, then n-1 all-gather
        self.t_iter = 0.0
        self.ops: list[SendOp] = []
        self.parts: list[bytes | bytearray] = []
        self.finished = False

    def _initial(self, rank: int) -> np.ndarray:
        rng = np.random.default_rng(self.seed * 7919 + rank)
        return rng.integers(-1000, 1001, self.count).astype(np.float32)

    def _segments(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(segment sent, segment received) in step `s`."""
        n, me, s = self.n, self.me, self.s
        if s < n - 1:  # reduce-scatter
            return self.segs[(me - s) % n], self.segs[(me - s - 1) % n]
        s -= n - 1  # all-gather
        return self.segs[(me + 1 - s) % n], self.segs[(me - s) % n]

    def _post_step(self, now: float) -> None:
        (a, b), _ = self._segments()
        raw = self.buf[a:b].tobytes()
        self.ops = [self.next_qp.post_send(raw[i : i + self.chunk], now)
                    for i in range(0, max(1, len(raw)), self.chunk)]
        self.parts = []

    def _begin_iteration(self, now: float) -> None:
        self.buf = self._initial(self.me)
        self.t_iter = now
        self.s = 0
        self._post_step(now)

    def start(self, t0: float) -> None:
        self.expected = sum((self._initial(r) for r in range(self.n)),
                            np.zeros(self.count, dtype=np.float32))
        self._begin_iteration(t0)

    def poll(self, now: float) -> bool:
        n = self.n
        while not self.finished:
            _, (c, d) = self._segments()
            need = (d - c) * 4
            n_msgs = max(1, -(-need // self.chunk))  # the previous rank chunks the same way
            # take only this step's messages: a faster neighbour may already be a step ahead
            while len(self.parts) < n_msgs and (m := self.prev_qp.poll_recv()) is not None:
                self.parts.append(m.data)
            if len(self.parts) < n_msgs or not all(op.done for op in self.ops):
                return False
            got = b"".join(self.parts)
            if len(got) != need:
                raise ValueError(f"segment of {len(got)} bytes, expected {need}")
            seg = np.frombuffer(got, dtype=np.float32)
            if self.s < n - 1:
                self.buf[c:d] += seg
            else:
                self.buf[c:d] = seg
            self.s += 1
            if self.s < 2 * (n - 1):
                self._post_step(now)
                continue
            self.times.append(now - self.t_iter)
            err = float(np.max(np.abs(self.buf - self.expected)))
            self.max_err = max(self.max_err, err)
            self.ok = self.ok and err == 0.0
            self.it += 1
            if self.it < self.iters:
                self._begin_iteration(now)
            else:
                self.finished = True
        return True

    def result(self, now: float) -> dict[str, Any]:
        if not self.finished:
            raise TimeoutError("all-reduce step timed out")
        return {
            "ok": self.ok,
            "max_abs_err": self.max_err,
            "times": self.times,
            "size": self.count * 4,
            "checksum": digest(self.buf.tobytes()),
        }


class LongLivedJob:
    """Keep every flow of this host busy for `duration` s with back-to-back messages, then let
    what is in flight finish (at most `drain` s more) so every queue pair ends idle."""

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

    @property
    def next_wake(self) -> float:
        return self.end if self.acked is None else self.end + self.drain

    def start(self, t0: float) -> None:
        self.end = t0 + self.duration
        for _, qp in self.mine:
            for _ in range(2):
                qp.post_send(self.data, t0)

    def poll(self, now: float) -> bool:
        for _, qp in self.mine:
            while qp.completions:
                qp.completions.popleft()
                if now < self.end:
                    qp.post_send(self.data, now)
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


class Job(Protocol):
    """What the engines drive (see the module's docstring)."""

    def __init__(self, t: QpHost, spec: dict[str, Any], me: int) -> None: ...

    @property
    def next_wake(self) -> float: ...

    def start(self, t0: float) -> None: ...

    def poll(self, now: float) -> bool: ...

    def result(self, now: float) -> dict[str, Any]: ...


JOBS: dict[str, type[Job]] = {
    "flows": FlowsJob,
    "allreduce": AllReduceJob,
    "longlived": LongLivedJob,
}
JOBS.update(COLLECTIVE_JOBS)  # the collective library's (testbed.collective.job)
