"""What one host does in a run: the per-host side of each workload, driving its `Transport`.

A job is made from the run's spec (JSON) and this host's index, creates its queue pairs at
construction (before the runner says go, so no peer's first packet finds no QP), and `run()`
executes it from a common start time and returns JSON-able results. Times in results are
seconds relative to the start time, on CLOCK_MONOTONIC (shared by all namespaces).

Queue pair numbering: the QP of host i towards host j in slot k has QPN `qpn(j, k)` on host i
and `qpn(i, k)` on host j, so both ends know each other's QPN without a handshake.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict, deque
from typing import Any

import numpy as np

from testbed.traffic.generators import Flow
from testbed.traffic.transport import QueuePair, SendOp, Transport

QP_SLOTS = 64
_PATTERN_PERIOD = 4093  # prime, so a packet landing at the wrong offset never matches


def qpn(peer: int, slot: int) -> int:
    if not 0 <= slot < QP_SLOTS:
        raise ValueError(f"slot {slot} out of range")
    return 1 + peer * QP_SLOTS + slot


def payload(key: int, size: int) -> bytes:
    """Deterministic message content for flow/message `key` (both ends can make it)."""
    block = np.random.default_rng(key).integers(0, 256, _PATTERN_PERIOD, dtype=np.uint8)
    return np.resize(block, size).tobytes()


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _peer_qp(t: Transport, me: int, peer: int, slot: int, hosts: list[dict[str, Any]]) -> QueuePair:
    q = t.qps.get(qpn(peer, slot))
    if q is None:
        q = t.create_qp(qpn(peer, slot), hosts[peer]["ip"], qpn(me, slot))
    return q


class FlowsJob:
    """Send this host's flows at their start times; receive and check the flows to it.

    Used by incast, all-to-all, WebSearch/Hadoop and single-message runs. A flow's FCT is the
    sender's completion (last packet acknowledged) minus its start time.
    """

    def __init__(self, t: Transport, spec: dict[str, Any], me: int) -> None:
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

    def _key(self, f: Flow) -> int:
        return self.seed * 1_000_003 + f.id

    def _drain_receives(self, t0: float) -> None:
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
                    {"id": f.id, "ok": ok, "bytes": len(msg.data), "t_done": msg.t_done - t0}
                )

    def _pending_receives(self) -> int:
        return sum(len(q) for q in self.expect.values())

    def run(self, t0: float, timeout: float) -> dict[str, Any]:
        t = self.t
        todo = deque(self.sends)
        deadline = t0 + timeout
        while True:
            now = time.monotonic()
            while todo and t0 + todo[0].start <= now:
                f = todo.popleft()
                data = payload(self._key(f), f.size) if self.verify else bytes(f.size)
                op = self.send_qp[f.id].post_send(data, tag=f.id)
                op.t_post = max(op.t_post, t0 + f.start)
                self.ops.append((f, op))
            self._drain_receives(t0)
            sends_done = not todo and all(op.done for _, op in self.ops)
            if sends_done and not self._pending_receives():
                break
            if now >= deadline:
                break
            # run the transport until the next flow starts, re-checking completions every 5 ms
            wake = min(t0 + todo[0].start if todo else deadline, deadline, now + 0.005)
            t.run_until(lambda: False, timeout=max(0.0, wake - now))
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
                for f in todo
            ],
            "received": self.received,
            "missing": [f.id for q in self.expect.values() for f in q],
            "unexpected": self.unexpected,
            "elapsed": time.monotonic() - t0,
        }


class AllReduceJob:
    """Ring all-reduce of a float32 vector: reduce-scatter then all-gather, n-1 steps each.

    Each step sends one segment to the next rank (in messages of at most `chunk` bytes) and
    waits for the segment from the previous rank before the next step, as NCCL's ring does.
    Rank r starts from integers drawn with seed+r (exact in float32), so every rank can check
    the reduced vector against the sum it computes itself.
    """

    def __init__(self, t: Transport, spec: dict[str, Any], me: int) -> None:
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

    def _initial(self, rank: int) -> np.ndarray:
        rng = np.random.default_rng(self.seed * 7919 + rank)
        return rng.integers(-1000, 1001, self.count).astype(np.float32)

    def _exchange(self, send: np.ndarray, recv_len: int, deadline: float) -> np.ndarray:
        raw = send.tobytes()
        ops = [
            self.next_qp.post_send(raw[i : i + self.chunk])
            for i in range(0, max(1, len(raw)), self.chunk)
        ]
        parts: list[bytes | bytearray] = []
        need = recv_len * 4
        n_msgs = max(1, -(-need // self.chunk))  # the previous rank chunks the same way

        def step_done() -> bool:
            # take only this step's messages: a faster neighbour may already be a step ahead
            while len(parts) < n_msgs and (m := self.prev_qp.poll_recv()) is not None:
                parts.append(m.data)
            return len(parts) == n_msgs and all(op.done for op in ops)

        if not self.t.run_until(step_done, timeout=max(0.0, deadline - time.monotonic())):
            raise TimeoutError("all-reduce step timed out")
        got = b"".join(parts)
        if len(got) != need:
            raise ValueError(f"segment of {len(got)} bytes, expected {need}")
        return np.frombuffer(got, dtype=np.float32)

    def run(self, t0: float, timeout: float) -> dict[str, Any]:
        n, me = self.n, self.me
        expected = sum(self._initial(r) for r in range(n))
        deadline = t0 + timeout
        times = []
        ok = True
        max_err = 0.0
        for _ in range(self.iters):
            buf = self._initial(me)
            start = time.monotonic()
            for s in range(n - 1):  # reduce-scatter
                send_i, recv_i = (me - s) % n, (me - s - 1) % n
                a, b = self.segs[send_i]
                c, d = self.segs[recv_i]
                buf[c:d] += self._exchange(buf[a:b], d - c, deadline)
            for s in range(n - 1):  # all-gather
                send_i, recv_i = (me + 1 - s) % n, (me - s) % n
                a, b = self.segs[send_i]
                c, d = self.segs[recv_i]
                buf[c:d] = self._exchange(buf[a:b], d - c, deadline)
            times.append(time.monotonic() - start)
            err = float(np.max(np.abs(buf - expected)))
            max_err = max(max_err, err)
            ok = ok and err == 0.0
        return {
            "ok": ok,
            "max_abs_err": max_err,
            "times": times,
            "size": self.count * 4,
            "checksum": digest(buf.tobytes()),
        }


class LongLivedJob:
    """Keep every flow of this host busy for `duration` s with back-to-back messages."""

    def __init__(self, t: Transport, spec: dict[str, Any], me: int) -> None:
        self.t = t
        self.me = me
        self.duration = float(spec["duration"])
        self.msg = int(spec.get("message", 1 << 20))
        hosts = spec["hosts"]
        flows = [Flow(**f) for f in spec["flows"]]
        self.mine = [(f, _peer_qp(t, me, f.dst, f.slot, hosts)) for f in flows if f.src == me]
        self.incoming = [_peer_qp(t, me, f.src, f.slot, hosts) for f in flows if f.dst == me]
        self.data = payload(int(spec.get("seed", 1)), self.msg)

    def run(self, t0: float, timeout: float) -> dict[str, Any]:
        end = t0 + self.duration
        for _, qp in self.mine:
            for _ in range(2):
                qp.post_send(self.data)
        bad = 0
        received = 0

        def tick() -> bool:
            nonlocal bad, received
            now = time.monotonic()
            for _, qp in self.mine:
                while qp.completions:
                    qp.completions.popleft()
                    if now < end:
                        qp.post_send(self.data)
            for qp in self.incoming:
                while (m := qp.poll_recv()) is not None:
                    received += 1
                    bad += m.data != self.data
            return now >= end

        self.t.run_until(tick)
        acked = {f.id: qp.counters.messages_sent * self.msg for f, qp in self.mine}
        # let what is in flight finish so every queue pair ends idle
        self.t.run_until(lambda: all(qp.idle for _, qp in self.mine), timeout=2.0)
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
            "received_messages": received,
            "bad_messages": bad,
            "duration": self.duration,
        }


JOBS: dict[str, type[FlowsJob | AllReduceJob | LongLivedJob]] = {
    "flows": FlowsJob,
    "allreduce": AllReduceJob,
    "longlived": LongLivedJob,
}
