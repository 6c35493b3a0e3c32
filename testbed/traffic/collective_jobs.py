"""One host's side of a collective communicator: a clock-free job (start / poll / next_wake /
result, as testbed.traffic.jobs) that both engines run, the emulation's workers and the twin.

The communicator is the run's hosts listed in `ranks` (all of them by default), each with K
channels: channel c is NIC c (`nic_ips[host][c]`, rail c on the rail topology; hosts with one
NIC run all channels on it, as NCCL runs several channels per NIC). There is one queue pair
per channel and peer, QPN slot `slot + c` (testbed.traffic.queue_pairs), so jobs sharing hosts
take different slots.

Each rank runs the plan (testbed.traffic.collective_plans) as dataflow: a transfer is ready once its
dependencies arrived; ready transfers go out in plan order, at most `depth` messages in flight
per queue pair (8 by default: deep enough that a channel at a quarter of the others' rate
still gets its share, see below). Every message starts with an 8-byte header (iteration,
transfer id), so a receiver takes any transfer from any channel of its peer. The channel
of a transfer is:
- `schedule: static`: the plan's channel (pieces dealt round-robin over the channels);
- `schedule: adaptive`: the channel towards that peer whose queue would finish it first,
  (bytes in flight + its bytes) / the channel's rate. A channel's rate is what it has shown
  it can do, an average of its completed messages' bytes over their service time (from when
  the message reached the head of its queue pair to its last acknowledgment), capped by the
  rate its NIC sends its flow at now, where the engine lets the host read it (the twin's
  NIC; on the emulation the host's agent, WatchRates): a flow that a rate law (or the agent)
  holds back gets less work from the law's cut on, without waiting for its messages to
  complete. A flow that its window already holds to a slow port's pace keeps its NIC rate
  (TiTa does not cut it: docs/collectives.md measures it), and its completions show the
  port; so do they under no rate law. A channel at a fraction f
  of the fastest one's rate gets work only while the fastest has more than 1/f - 1 messages
  queued, hence the depth of 8. `trace_rates` records each change of a channel's rates
  (`rate_trace` in the result: time, peer, channel, completions' and NIC's payload B/s).

A training job is a loop of iterations: `compute` seconds of computation, then the collective
(with `overlap`, the next iteration's computation runs while the collective does). The
hierarchical algorithm's intra-host steps (reduce-scatter before, all-gather after the rails)
run over a modelled NVLink: ring steps over the host's `gpus` GPUs of `nvlink_latency` s and
bytes / `nvlink_bps` each (the sums are computed, the time is modelled).

Data (`payload: data`, the default): rank r's GPU g starts from integers drawn with (seed,
iteration, r, g), exact in float32, so every rank checks its result against the sums it
computes itself (in one process, the twin's, the ranks share that expected buffer).

Sizes (`payload: size`), for scale: a rank keeps one 32-bit fingerprint per piece of its
buffer instead of its elements, the pieces being the ranges between all the boundaries the
plan's transfers have (so every transfer covers whole pieces). Rank r's GPU g starts from
fingerprints drawn with (seed, iteration, r, g); a message carries the fingerprints of its
pieces, then zeros up to the transfer's size (which neither the sender's transport holds nor
the receiver's stores: `QueuePair.store_bytes`), so the network carries the same bytes; the
receiver adds (mod 2^32) or copies them as it would the data. Every rank checks its
fingerprints against the sums of all ranks' (a contribution lost, doubled or misplaced shows,
but for a chance of 2^-32 per piece), and its memory grows with the plan, not the data.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import heapq
import math
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from testbed.traffic.collective_plans import (
    ELEM,
    Op,
    PlanSpec,
    Transfer,
    build,
    bus_factor,
    segments,
)
from testbed.traffic.queue_pairs import QP_SLOTS, QpHost, qpn
from testbed.traffic.transport_core import QueuePair, ReceivedMessage, SendOp

if TYPE_CHECKING:
    from testbed.traffic.jobs import Job

HEADER = struct.Struct("!II")  # iteration, transfer id
RATE_EWMA = 0.5  # weight of the newest sample in a channel's rate
MAX_TRACE = 100_000  # trace_rates: changes a rank records at most
PAYLOADS = ("data", "size")


@dataclass(frozen=True, eq=False)
class Layout:
    """A plan and how a rank's buffer is held for it (`payload`): `units` values of `dtype`,
    elements for data, pieces for sizes (`cuts`: the pieces' first elements, and the end).
    Immutable, so the twin's ranks share one (`layout`)."""

    spec: PlanSpec
    payload: str
    by_src: dict[int, list[Transfer]]
    by_dst: dict[int, list[Transfer]]
    cuts: tuple[int, ...]  # empty for data
    piece_at: dict[int, int]  # element -> index of the piece starting there (sizes)

    @property
    def sizes(self) -> bool:
        return self.payload == "size"

    @property
    def units(self) -> int:
        return len(self.cuts) - 1 if self.sizes else self.spec.count

    @property
    def dtype(self) -> type[np.generic]:
        return np.uint32 if self.sizes else np.float32

    def span(self, lo: int, hi: int) -> tuple[int, int]:
        """The units holding elements [lo, hi)."""
        if not self.sizes:
            return lo, hi
        return self.piece_at[lo], self.piece_at[hi]

    def initial(self, seed: int, it: int, rank: int, gpu: int) -> np.ndarray:
        rng = np.random.default_rng([seed, it, rank, gpu])
        if self.sizes:
            return rng.integers(0, 1 << 32, self.units, dtype=np.uint32)
        return rng.integers(-1000, 1001, self.units).astype(np.float32)

    def inputs(self, seed: int, it: int, rank: int) -> np.ndarray:
        """What rank `rank` puts into the network: its buffer, or for hier its GPUs' sum
        (what the intra-host reduce-scatter leaves, shard by shard)."""
        gpus = self.spec.gpus if self.spec.algorithm == "hier" else 1
        out = self.initial(seed, it, rank, 0)
        for g in range(1, gpus):
            out = out + self.initial(seed, it, rank, g)
        return out

    def error(self, got: np.ndarray, want: np.ndarray) -> float:
        """Data: the largest absolute error; sizes: how many pieces differ."""
        if self.sizes:
            return float(np.count_nonzero(got != want))
        return float(np.max(np.abs(got - want), initial=0.0))


def _cuts(transfers: list[Transfer], count: int, n: int) -> tuple[int, ...]:
    """Every boundary of the plan's ranges (and of the checked segments and blocks), closed
    under the moves whose destination range lies elsewhere (all-to-all): a piece must be
    one piece at both ends."""
    cuts = {0, count, (count // n) * n}
    for lo, hi in segments(0, count, n):
        cuts |= {lo, hi}
    moved = []
    for x in transfers:
        cuts |= {x.lo, x.hi, x.dst_lo, x.dst_lo + x.hi - x.lo}
        if x.dst_lo != x.lo and x.hi > x.lo:
            moved.append(x)
    grew = bool(moved)
    while grew:
        grew = False
        ordered = sorted(cuts)
        for x in moved:
            d, hi = x.dst_lo - x.lo, x.hi
            i, j = bisect.bisect_right(ordered, x.lo), bisect.bisect_left(ordered, hi)
            add = {c + d for c in ordered[i:j]}
            i, j = bisect.bisect_right(ordered, x.dst_lo), bisect.bisect_left(ordered, hi + d)
            add |= {c - d for c in ordered[i:j]}
            if not add <= cuts:
                cuts |= add
                grew = True
    return tuple(sorted(cuts))


@functools.lru_cache(maxsize=2)
def layout(spec: PlanSpec, payload: str) -> Layout:
    """The plan of `spec` indexed by sender and receiver, built once per process."""
    if payload not in PAYLOADS:
        raise ValueError(f"payload {payload!r}: one of {PAYLOADS}")
    transfers = build(spec)
    by_src: dict[int, list[Transfer]] = {}
    by_dst: dict[int, list[Transfer]] = {}
    for x in transfers:
        by_src.setdefault(x.src, []).append(x)
        by_dst.setdefault(x.dst, []).append(x)
    cuts = _cuts(transfers, spec.count, spec.ranks) if payload == "size" else ()
    return Layout(spec, payload, by_src, by_dst, cuts, {c: i for i, c in enumerate(cuts)})


@functools.lru_cache(maxsize=2)
def _expected_of_all(lay: Layout, seed: int, it: int) -> np.ndarray:
    """The buffer every rank of an all-reduce (or all-gather) ends with: computed once per
    process, so the twin's n ranks do not each draw all n inputs. Read-only: it is shared."""
    n = lay.spec.ranks
    out = np.zeros(lay.units, dtype=lay.dtype)
    if lay.spec.collective == "allgather":
        for r, (lo, hi) in enumerate(segments(0, lay.spec.count, n)):
            a, b = lay.span(lo, hi)
            out[a:b] = lay.inputs(seed, it, r)[a:b]
    else:
        for r in range(n):
            out += lay.inputs(seed, it, r)
    out.flags.writeable = False
    return out


def channel_estimate(rate: float, nic_rate: float) -> float:
    """Bytes/s a channel can do: its completions' rate, capped by its NIC's (0: unknown)."""
    if rate and nic_rate:
        return min(rate, nic_rate)
    return rate or nic_rate


@dataclass
class Channel:
    """One queue pair (towards one peer on one channel) and what the scheduler knows of it."""

    index: int
    qp: QueuePair
    peer: int = 0  # the peer's rank
    inflight: deque[tuple[SendOp, Transfer, float]] = field(default_factory=deque)
    inflight_bytes: int = 0
    rate: float = 0.0  # bytes/s its completed messages took, 0 until measured
    nic_rate: float = 0.0  # payload bytes/s its NIC sends its flow at (0: no NIC to read)
    head_since: float = 0.0  # when the oldest message in flight reached the head
    sent_bytes: int = 0
    sent_msgs: int = 0

    @property
    def estimate(self) -> float:
        return channel_estimate(self.rate, self.nic_rate)


NVLINK_BPS = 3.6e12  # NVLink 4: 900 GB/s both directions, 450 GB/s (3.6 Tb/s) each way
NVLINK_LATENCY_S = 2e-6  # per intra-host step


def nvlink_ring_time(gpus: int, size: float, bps: float, latency: float) -> float:
    """One intra-host ring reduce-scatter (or all-gather) of `size` bytes per GPU over a
    host's `gpus` GPUs: g - 1 steps of a 1/g share each (the hierarchical algorithm's
    steps before and after the rails; the flow engine's too)."""
    if gpus < 2:
        return 0.0
    return (gpus - 1) * (latency + size / gpus * 8 / bps)


@dataclass
class CollectiveConfig:
    collective: str
    algorithm: str
    size: int  # bytes per rank (per GPU for hier)
    channels: int
    chunk: int
    schedule: str
    depth: int
    gpus: int
    nvlink_bps: float
    nvlink_latency: float
    iters: int
    compute: float
    overlap: bool
    seed: int
    slot: int
    payload: str
    trace_rates: bool = False

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> CollectiveConfig:
        algorithm = str(spec.get("algorithm", "ring"))
        channels = int(spec.get("channels", 1))
        c = cls(
            collective=str(spec.get("collective", "allreduce")),
            algorithm=algorithm,
            size=int(spec["size"]),
            channels=channels,
            chunk=int(spec.get("chunk", 1 << 19)),
            schedule=str(spec.get("schedule", "static")),
            depth=int(spec.get("depth", 8)),
            gpus=int(spec.get("gpus", channels if algorithm == "hier" else 1)),
            nvlink_bps=float(spec.get("nvlink_bps", NVLINK_BPS)),
            nvlink_latency=float(spec.get("nvlink_latency", NVLINK_LATENCY_S)),
            iters=int(spec.get("iters", 1)),
            compute=float(spec.get("compute", 0.0)),
            overlap=bool(spec.get("overlap", False)),
            seed=int(spec.get("seed", 1)),
            slot=int(spec.get("slot", 8)),
            payload=str(spec.get("payload", "data")),
            trace_rates=bool(spec.get("trace_rates", False)),
        )
        if c.schedule not in ("static", "adaptive"):
            raise ValueError(f"schedule {c.schedule!r}: static or adaptive")
        if not 1 <= c.depth <= 64 or c.iters < 1 or c.compute < 0:
            raise ValueError("depth in 1..64, iters >= 1, compute >= 0")
        if c.nvlink_bps <= 0 or c.nvlink_latency < 0:
            raise ValueError("nvlink_bps > 0 and nvlink_latency >= 0")
        if c.size % ELEM:
            raise ValueError(f"size {c.size}: a whole number of float32 elements")
        if not 0 <= c.slot or c.slot + c.channels > QP_SLOTS:
            raise ValueError(f"slots {c.slot}..{c.slot + c.channels - 1} beyond {QP_SLOTS}")
        return c


class CollectiveJob:
    """This host's rank of the communicator, for `iters` iterations of one collective."""

    def __init__(
        self, t: QpHost, spec: dict[str, Any], me: int, *, expect_ahead: bool = True
    ) -> None:
        self.cfg = cfg = CollectiveConfig.from_spec(spec)
        # the adaptive schedule reads its NIC's rates as it picks among channels, and traces
        # what it read (one channel and no trace: what it reads changes nothing)
        self.reads_nic_rates = cfg.schedule == "adaptive" and (cfg.channels > 1 or cfg.trace_rates)
        self.t = t
        hosts = spec["hosts"]
        self.ranks: list[int] = [int(h) for h in spec.get("ranks", range(len(hosts)))]
        if me not in self.ranks or len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"host {me} is not once in the communicator {self.ranks}")
        self.me = self.ranks.index(me)
        self.n = n = len(self.ranks)
        self.count = cfg.size // ELEM
        self.plan_spec = PlanSpec(
            cfg.collective, cfg.algorithm, n, self.count, cfg.channels, cfg.chunk, cfg.gpus
        )
        self.layout = lay = layout(self.plan_spec, cfg.payload)
        self.outgoing = lay.by_src.get(self.me, [])
        self.incoming = {x.id: x for x in lay.by_dst.get(self.me, [])}
        self.dependents: dict[int, list[Transfer]] = {}
        for x in self.outgoing:
            for d in x.deps:
                self.dependents.setdefault(d, []).append(x)
        nic_ips: list[list[str]] = spec.get("nic_ips") or [[h["ip"]] for h in hosts]
        multi = any(len(ips) > 1 for ips in nic_ips)
        peers = sorted({x.dst for x in self.outgoing} | {x.src for x in self.incoming.values()})
        self.channels: dict[int, list[Channel]] = {}
        for p in peers:
            host = self.ranks[p]
            chans = []
            for c in range(cfg.channels):
                slot = cfg.slot + c
                q = t.qps.get(qpn(host, slot))
                if q is None:
                    peer_ip = nic_ips[host][c % len(nic_ips[host])]
                    if multi:
                        local = nic_ips[me][c % len(nic_ips[me])]
                        q = t.create_qp(qpn(host, slot), peer_ip, qpn(me, slot), local_ip=local)
                    else:
                        q = t.create_qp(qpn(host, slot), peer_ip, qpn(me, slot))
                chans.append(Channel(c, q, peer=p))
            self.channels[p] = chans
        # the queue pairs whose sends completed or that received since the job last looked
        # (the core adds them: QueuePair.watch), so that a poll costs what changed, not a look
        # at each of an all-to-all's n - 1 peers; taken in the channels' order (`_changed`)
        self._changed: set[QueuePair] = set()
        self._chan_of: dict[QueuePair, Channel] = {}
        for chans in self.channels.values():
            for ch in chans:
                self._chan_of[ch.qp] = ch
                ch.qp.watch = self._changed
        if lay.sizes:  # a message is its header and fingerprints, then zeros: store the former
            most: dict[int, int] = {}
            for x in self.incoming.values():
                lo, hi = lay.span(x.dst_lo, x.dst_lo + x.hi - x.lo)
                most[x.src] = max(most.get(x.src, 0), hi - lo)
            unit = np.dtype(lay.dtype).itemsize
            for p, chans in self.channels.items():
                for ch in chans:
                    ch.qp.store_bytes = HEADER.size + unit * most.get(p, 0)
        # the proactive start: the job knows which of its flows start together, and declares
        # each its fair share of its NIC (`start_share_bps`: the NIC's line rate) before it
        # sends, as the incast's senders do (testbed.traffic.jobs)
        line = float(spec.get("start_share_bps") or 0)
        if line:
            for qp, bps in self._start_shares(line, len(nic_ips[me])).items():
                t.hint_rate(qp, round(bps))
        self.t0 = 0.0
        self.it = 0
        self.phase = "idle"  # compute, pre (NVLink), net, post (NVLink), done
        self.phase_end = math.inf  # when a modelled phase (compute, NVLink step) ends
        self.compute_end = 0.0  # end of the computation of the iteration being run
        self.buf = np.zeros(0, dtype=lay.dtype)
        self.send_buf = self.buf
        self.expected = np.zeros(0, dtype=lay.dtype)
        self.waiting: dict[int, int] = {}
        # ready transfers per (peer, channel; -1 for any) in plan order (pieces in the order
        # they started): a heap of (id, transfer)
        self.ready: dict[tuple[int, int], list[tuple[int, Transfer]]] = {}
        self._pending: set[tuple[int, int]] = set()  # the keys of `ready`'s non-empty heaps
        self._rank: dict[tuple[int, int], int] = {}  # each key's place in `ready`
        self._inflight = 0  # messages posted and not complete, on all channels
        self.arrived: set[int] = set()
        self.early: list[tuple[int, Transfer, bytes]] = []
        self.ok = True
        self.max_err = 0.0
        self.coll: list[tuple[float, float]] = []  # per iteration: collective start, end
        self.iter_end: list[float] = []
        self.moved = 0  # transfers the adaptive schedule sent off their static channel
        self.unexpected = 0
        # with trace_rates: (time, peer, channel, completions' B/s, NIC's B/s) per change
        self.rate_trace: list[tuple[float, int, int, float, float]] = []
        # the first iteration's expected result, made before the clock starts (a check of
        # the sums is no part of the collective: drawing every rank's inputs for it took the
        # emulation's ranks seconds of CPU inside the measured time); not for a job made for
        # its queue pairs alone (`expect_ahead=False`: the flow engine's `job_ports`)
        self._expected_ahead = {0: self._expect(0)} if expect_ahead else {}

    # ---- data ----

    def _inputs(self, it: int, rank: int) -> np.ndarray:
        return self.layout.inputs(self.cfg.seed, it, rank)

    def _expect(self, it: int) -> np.ndarray:
        """The buffer this rank must end with (reducescatter: only its segment is checked)."""
        coll, n, lay = self.cfg.collective, self.n, self.layout
        if coll in ("allreduce", "reducescatter", "allgather"):
            return _expected_of_all(lay, self.cfg.seed, it)
        if coll == "alltoall":
            out = self._inputs(it, self.me)  # my own block and the remainder stay
            b, me = self.count // n, self.me
            for r in range(n):  # block r of my result: what rank r sent me (its block me)
                if r != me:
                    lo, hi = lay.span(r * b, (r + 1) * b)
                    src_lo, src_hi = lay.span(me * b, (me + 1) * b)
                    out[lo:hi] = self._inputs(it, r)[src_lo:src_hi]
            return out
        return self._inputs(it, (self.me - 1) % n)  # sendrecv: the previous rank's buffer

    def _start_buffer(self, it: int) -> np.ndarray:
        """The receive buffer; `send_buf` is what goes out. In place (the same array) but for
        all-to-all and send/recv, whose incoming data would overwrite data still to send."""
        coll = self.cfg.collective
        mine = self._inputs(it, self.me)
        self.send_buf = mine
        if coll in ("allreduce", "reducescatter"):
            return mine
        if coll == "alltoall":
            return mine.copy()
        out = np.zeros(self.layout.units, dtype=self.layout.dtype)
        if coll == "allgather":
            lo, hi = self.layout.span(*segments(0, self.count, self.n)[self.me])
            out[lo:hi] = mine[lo:hi]
            self.send_buf = out
        return out

    # ---- job protocol ----

    def start(self, t0: float) -> None:
        self.t0 = t0
        self._begin_iteration(t0)

    @property
    def next_wake(self) -> float:
        return self.phase_end

    def _begin_iteration(self, now: float) -> None:
        """Start the computation of iteration `it` (its collective follows it)."""
        self.compute_end = now + self.cfg.compute
        self.phase = "compute"
        self.phase_end = self.compute_end

    def _nvlink_time(self) -> float:
        """One intra-host ring reduce-scatter (or all-gather) over the host's GPUs."""
        c = self.cfg
        return nvlink_ring_time(c.gpus, c.size, c.nvlink_bps, c.nvlink_latency)

    def _begin_collective(self, now: float) -> None:
        it = self.it
        self.coll.append((now, math.nan))
        self.buf = self._start_buffer(it)
        ahead = self._expected_ahead.pop(it, None)
        self.expected = ahead if ahead is not None else self._expect(it)
        self.arrived = set()
        self.waiting = {x.id: len(x.deps) for x in self.outgoing}
        self.ready = {}
        self._pending = set()
        self._rank = {}
        for x in self.outgoing:
            if not x.deps:
                self._make_ready(x)
        if self.cfg.algorithm == "hier":
            self.phase, self.phase_end = "pre", now + self._nvlink_time()
        else:
            self._begin_net()
        if self.cfg.overlap and it + 1 < self.cfg.iters:
            self.compute_end = now + self.cfg.compute  # the next iteration computes meanwhile

    def _begin_net(self) -> None:
        self.phase, self.phase_end = "net", math.inf
        early, self.early = self.early, []
        for it, x, data in early:
            if it == self.it:
                self._apply(x, data)
            else:
                self.early.append((it, x, data))

    def _end_collective(self, now: float) -> None:
        lo, hi = 0, self.count
        if self.cfg.collective == "reducescatter":  # the rest holds partial sums
            lo, hi = segments(0, self.count, self.n)[self.me]
        lo, hi = self.layout.span(lo, hi)
        err = self.layout.error(self.buf[lo:hi], self.expected[lo:hi])
        self.max_err = max(self.max_err, err)
        self.ok = self.ok and err == 0.0
        start, _ = self.coll[-1]
        self.coll[-1] = (start, now)
        self.iter_end.append(now)
        self.it += 1
        self.arrived = set()  # the next iteration's messages may come while this one computes
        if self.it >= self.cfg.iters:
            self.phase, self.phase_end = "done", math.inf
        elif self.cfg.overlap:
            self.phase, self.phase_end = "compute", self.compute_end
        else:
            self._begin_iteration(now)

    def poll(self, now: float) -> bool:
        while True:
            if self.phase == "done":
                return True
            if self.phase == "compute":
                if now < self.phase_end:
                    self._receive_early()
                    return False
                self._begin_collective(now)
                continue
            if self.phase == "pre":
                if now < self.phase_end:
                    self._receive_early()
                    return False
                self._begin_net()
                continue
            if self.phase == "post":
                if now < self.phase_end:
                    return False
                self._end_collective(now)
                continue
            # net
            self._progress(now)
            if len(self.arrived) < len(self.incoming) or self._pending or self._inflight:
                return False
            if self.cfg.algorithm == "hier":
                self.phase, self.phase_end = "post", now + self._nvlink_time()
            else:
                self._end_collective(now)

    # ---- network ----

    def _receive_early(self) -> None:
        """Take messages of peers already in the collective while this rank still computes
        (they are kept until it gets there)."""
        for ch in self._changed_channels():
            while (m := ch.qp.poll_recv()) is not None:
                self._on_message(ch.peer, m)
        # (the queue pairs stay changed: their completions are the collective's to take)

    def _changed_channels(self) -> list[Channel]:
        """The channels of the changed queue pairs, in the order of `channels` (by peer, then
        channel)."""
        return sorted((self._chan_of[q] for q in self._changed), key=lambda c: (c.peer, c.index))

    def _on_message(self, peer: int, m: ReceivedMessage) -> None:
        data = m.data
        if len(data) < HEADER.size:
            self.unexpected += 1
            return
        it, tid = HEADER.unpack_from(data)
        x = self.incoming.get(tid)
        body = bytes(data[HEADER.size :])  # sizes: the fingerprints (the zeros not stored)
        if (
            x is None
            or x.src != peer
            or m.size - HEADER.size != x.nbytes
            or it < self.it
            or (it == self.it and tid in self.arrived)
        ):
            self.unexpected += 1
            return
        if it > self.it or self.phase != "net":
            if any(e[0] == it and e[1].id == tid for e in self.early):
                self.unexpected += 1
                return
            self.early.append((it, x, body))
            return
        self._apply(x, body)

    def _apply(self, x: Transfer, body: bytes) -> None:
        lo, hi = self.layout.span(x.dst_lo, x.dst_lo + x.hi - x.lo)
        seg = np.frombuffer(body, dtype=self.layout.dtype, count=hi - lo)
        if x.op == Op.SUM:
            self.buf[lo:hi] += seg
        else:
            self.buf[lo:hi] = seg
        self.arrived.add(x.id)
        for y in self.dependents.get(x.id, ()):
            self.waiting[y.id] -= 1
            if self.waiting[y.id] == 0:
                self._make_ready(y)

    def _make_ready(self, x: Transfer) -> None:
        key = (x.dst, x.channel if self.cfg.schedule == "static" else -1)
        heap = self.ready.get(key)
        if heap is None:
            heap = self.ready[key] = []
            self._rank[key] = len(self._rank)
        heapq.heappush(heap, (x.id, x))
        self._pending.add(key)

    def _progress(self, now: float) -> None:
        changed = self._changed_channels()
        self._changed.clear()
        for ch in changed:
            while (m := ch.qp.poll_recv()) is not None:
                self._on_message(ch.peer, m)
            self._complete(ch, now)
        if not self._pending:
            return
        # the non-empty heaps, in the order of `ready`
        for key in sorted(self._pending, key=self._rank.__getitem__):
            queue = self.ready[key]
            while queue:
                x = queue[0][1]
                picked = self._pick(x, now)
                if picked is None:
                    break
                heapq.heappop(queue)
                self._send(picked, x, now)
            if not queue:
                self._pending.discard(key)

    def _complete(self, ch: Channel, now: float) -> None:
        while ch.inflight and ch.inflight[0][0].done:
            op, x, _ = ch.inflight.popleft()
            self._inflight -= 1
            ch.inflight_bytes -= x.nbytes
            t_done = op.t_done if op.t_done is not None else now
            service = t_done - ch.head_since
            if service > 0 and x.nbytes > 0:
                sample = (x.nbytes + HEADER.size) / service
                ch.rate = sample if ch.rate == 0 else RATE_EWMA * sample + (1 - RATE_EWMA) * ch.rate
                self._trace(ch, t_done)
            ch.head_since = t_done

    def _trace(self, ch: Channel, now: float) -> None:
        if self.cfg.trace_rates and len(self.rate_trace) < MAX_TRACE:
            self.rate_trace.append((now - self.t0, ch.peer, ch.index, ch.rate, ch.nic_rate))

    def _start_shares(self, line_bps: float, nics: int) -> dict[QueuePair, float]:
        """Each queue pair that sends at the start (a transfer of this rank with no
        dependency: an all-to-all's n - 1 peers, a ring's next rank) and its share of its NIC:
        the line rate over the queue pairs that start on that NIC (channel c is NIC c mod
        the host's NICs; under the adaptive schedule any channel towards the peer may)."""
        first: set[tuple[int, int]] = set()
        for x in self.outgoing:
            if x.deps:
                continue
            chans = (x.channel,) if self.cfg.schedule == "static" else range(self.cfg.channels)
            first.update((x.dst, c) for c in chans)
        per_nic: dict[int, int] = {}
        for _, c in first:
            per_nic[c % nics] = per_nic.get(c % nics, 0) + 1
        return {
            self.channels[peer][c].qp: line_bps / per_nic[c % nics] for peer, c in sorted(first)
        }

    def _pick(self, x: Transfer, now: float) -> Channel | None:
        chans = self.channels[x.dst]
        depth = self.cfg.depth
        if self.cfg.schedule == "static":
            ch = chans[x.channel]
            return ch if len(ch.inflight) < depth else None
        # adaptive: the channel that would finish it first at what it can do now (its NIC's
        # rate read afresh); unmeasured channels count as the fastest measured one (or all
        # equal before any is measured)
        for c in chans:
            nic = self.t.nic_payload_rate(c.qp)
            if nic != c.nic_rate:
                c.nic_rate = nic
                self._trace(c, now)
        known = [c.estimate for c in chans if c.estimate > 0]
        default = max(known) if known else 1.0

        def finish(c: Channel) -> tuple[float, int]:
            return (
                (c.inflight_bytes + x.nbytes + HEADER.size) / (c.estimate or default),
                0 if c.index == x.channel else 1,
            )

        best = min(chans, key=finish)
        return best if len(best.inflight) < depth else None

    def _send(self, ch: Channel, x: Transfer, now: float) -> None:
        lo, hi = self.layout.span(x.lo, x.hi)
        data = HEADER.pack(self.it, x.id) + self.send_buf[lo:hi].tobytes()
        if not ch.inflight:
            ch.head_since = now
        # sizes: the fingerprints, then zeros up to the transfer's size (not in memory)
        op = ch.qp.post_send(data, now, tag=x.id, size=HEADER.size + x.nbytes)
        ch.inflight.append((op, x, now))
        self._inflight += 1
        ch.inflight_bytes += x.nbytes
        ch.sent_bytes += HEADER.size + x.nbytes
        ch.sent_msgs += 1
        self.moved += ch.index != x.channel

    # ---- results ----

    def result(self, now: float) -> dict[str, Any]:
        if self.phase != "done":
            raise TimeoutError(
                f"{self.cfg.collective} rank {self.me} stuck in iteration "
                f"{self.it} ({self.phase}: {len(self.arrived)} of "
                f"{len(self.incoming)} transfers in)"
            )
        per_channel = [0] * self.cfg.channels
        rates = [0.0] * self.cfg.channels
        for chans in self.channels.values():
            for ch in chans:
                per_channel[ch.index] += ch.sent_bytes
                rates[ch.index] = max(rates[ch.index], ch.rate * 8)
        t0 = self.t0
        return {
            "kind": "collective",
            "rank": self.me,
            "ok": self.ok,
            "max_abs_err": self.max_err,
            "collective": self.cfg.collective,
            "algorithm": self.cfg.algorithm,
            "schedule": self.cfg.schedule,
            "size": self.cfg.size,
            "payload": self.cfg.payload,
            "channels": self.cfg.channels,
            "chunk": self.cfg.chunk,
            "ranks": self.n * (self.cfg.gpus if self.cfg.algorithm == "hier" else 1),
            "bus_factor": bus_factor(
                self.cfg.collective, self.n * (self.cfg.gpus if self.cfg.algorithm == "hier" else 1)
            ),
            "coll": [(a - t0, b - t0) for a, b in self.coll],
            "iter_end": [e - t0 for e in self.iter_end],
            "compute": self.cfg.compute,
            "channel_bytes": per_channel,
            "channel_rate_bps": rates,
            "moved": self.moved,
            **({"rate_trace": self.rate_trace} if self.cfg.trace_rates else {}),
            "transfers_out": len(self.outgoing),
            "unexpected": self.unexpected,
            "checksum": hashlib.sha256(self.buf.tobytes()).hexdigest(),
        }


COLLECTIVE_JOBS: dict[str, type[Job]] = {"collective": CollectiveJob}
