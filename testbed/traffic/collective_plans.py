"""Collective algorithms as dataflow plans: which rank sends which part of the buffer to whom.

A plan is a list of `Transfer`s over one communicator: `src` sends elements [lo, hi) of its
buffer to `dst`, which adds them into its own (SUM) or overwrites its own with them (COPY),
once the transfers listed in `deps` have arrived at `src` (their data is part of what is
sent). Each rank runs the plan as a state machine (testbed.traffic.collective_jobs): a transfer goes
out as soon as its dependencies are in, so chunks pipeline through the steps by themselves,
and any transfer may take any channel (the receiver matches it by its id, not by its queue
pair), which is what lets the scheduler move chunks off a slow rail.

Chunking: the buffer is cut into pieces of about `chunk` bytes per message; every piece runs
its own instance of the algorithm (a piece of a ring all-reduce is n segments, one message
each). `channel` is the static channel of a transfer (piece number mod K): the static split
keeps it, the adaptive scheduler treats it as a hint.

Ranks are the communicator's hosts (one job per host, K NICs each). The hierarchical
algorithm also models the G GPUs inside a host (`gpus` per rank): the intra-host steps run in
the job over a modelled NVLink (testbed.traffic.collective_jobs), the inter-host step is a plan over
the rails in which GPU g's shard of the host's data travels on rail g only.

Collectives and their buffers (`count` float32 elements per rank, nccl-tests' sizes):
- allreduce: every rank ends with the sum of all ranks' buffers;
- reducescatter: rank r ends with segment r of the sum (segments: `segments(count, n)`);
- allgather: rank r contributes segment r, every rank ends with every rank's segment;
- alltoall: block j of rank r's buffer goes to rank j (block r of rank j's result; blocks of
  count // n elements, a remainder stays where it is);
- sendrecv: rank r sends its buffer to rank r+1 (a pipeline-parallel stage boundary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

COLLECTIVES = ("allreduce", "reducescatter", "allgather", "alltoall", "sendrecv")
ALGORITHMS = ("ring", "tree", "hier")
# Which algorithms each collective has (tree and hierarchical are all-reduce algorithms, as
# in NCCL; the others have one data movement each)
SUPPORTED = {
    "allreduce": ("ring", "tree", "hier"),
    "reducescatter": ("ring",),
    "allgather": ("ring",),
    "alltoall": ("ring",),  # "ring" stands for the one pairwise exchange
    "sendrecv": ("ring",),
}
ELEM = 4  # float32


class Op(IntEnum):
    SUM = 0
    COPY = 1


@dataclass(frozen=True, slots=True)  # slots: a 1,024-rank ring has 2M of them
class Transfer:
    id: int
    src: int
    dst: int
    lo: int  # element range of the buffer
    hi: int
    op: Op
    deps: tuple[int, ...]  # transfers that must have arrived at src before this one leaves
    channel: int
    dst_lo: int  # where the range lands in dst's buffer (= lo but for all-to-all)

    @property
    def nbytes(self) -> int:
        return (self.hi - self.lo) * ELEM


def segments(lo: int, hi: int, n: int) -> list[tuple[int, int]]:
    """[lo, hi) cut into n nearly equal consecutive parts (some empty if hi - lo < n)."""
    size = hi - lo
    return [(lo + size * i // n, lo + size * (i + 1) // n) for i in range(n)]


def pieces(lo: int, hi: int, per_piece: int, multiple: int = 1) -> list[tuple[int, int]]:
    """[lo, hi) in consecutive pieces of at most about `per_piece` elements, their number a
    multiple of `multiple` (so that every channel gets its share) unless there are fewer
    elements than that."""
    n = max(1, math.ceil((hi - lo) / max(1, per_piece)))
    n = min(max(1, hi - lo), -(-n // multiple) * multiple)
    return segments(lo, hi, n)


class _Builder:
    def __init__(self) -> None:
        self.transfers: list[Transfer] = []

    def add(
        self,
        src: int,
        dst: int,
        lo: int,
        hi: int,
        op: Op,
        deps: tuple[int, ...],
        channel: int,
        dst_lo: int | None = None,
    ) -> int:
        t = Transfer(
            len(self.transfers),
            src,
            dst,
            lo,
            hi,
            op,
            deps,
            channel,
            lo if dst_lo is None else dst_lo,
        )
        self.transfers.append(t)
        return t.id


def _ring_reduce_scatter(
    b: _Builder, segs: list[tuple[int, int]], ring: list[int], channel: int
) -> list[int]:
    """Ring reduce-scatter of one piece (segs: one per ring position); position p ends with
    segment p reduced. Returns, per position, the transfer that completed its segment."""
    n = len(ring)
    last = [-1] * n  # per position: the transfer it received in the previous step
    for k in range(n - 1):
        now = [-1] * n
        for p in range(n):
            lo, hi = segs[(p - 1 - k) % n]
            deps = (last[p],) if last[p] >= 0 else ()
            now[(p + 1) % n] = b.add(ring[p], ring[(p + 1) % n], lo, hi, Op.SUM, deps, channel)
        last = now
    return last


def _ring_all_gather(
    b: _Builder, segs: list[tuple[int, int]], ring: list[int], channel: int, first: list[int]
) -> None:
    """Ring all-gather of one piece: position p starts with segment p (after transfer
    first[p] arrived, -1: it has it already) and every position ends with all of them."""
    n = len(ring)
    last = first
    for k in range(n - 1):
        now = [-1] * n
        for p in range(n):
            lo, hi = segs[(p - k) % n]
            deps = (last[p],) if last[p] >= 0 else ()
            now[(p + 1) % n] = b.add(ring[p], ring[(p + 1) % n], lo, hi, Op.COPY, deps, channel)
        last = now


def _btree(n: int) -> dict[int, int]:
    """NCCL's binary tree over ranks 0..n-1 (child -> parent; `ncclGetBtree` in its
    src/graph/trees.cc): rank r's parent from its lowest set bit, (r ^ bit) | (bit << 1), or
    r ^ bit where that is out of range; rank 0 is the root, with one child. Leaves and inner
    nodes alternate (the odd ranks are leaves)."""
    parent: dict[int, int] = {}
    for r in range(1, n):
        bit = 1
        while bit < n and not bit & r:
            bit <<= 1
        up = (r ^ bit) | (bit << 1)
        parent[r] = up if up < n else r ^ bit
    return parent


def double_binary_trees(n: int) -> list[dict[int, int]]:
    """NCCL's double binary tree (`ncclGetDtree`): the binary tree, and the same mirrored
    (rank r as n - 1 - r) when n is even or shifted by one when n is odd, so that every rank
    is an inner node of at most one of the two and sends and receives at most twice its share
    of the buffer."""
    first = _btree(n)
    if n % 2:
        second = {(c + 1) % n: (p + 1) % n for c, p in first.items()}
    else:
        second = {n - 1 - c: n - 1 - p for c, p in first.items()}
    return [first, second]


def _tree_all_reduce(
    b: _Builder, lo: int, hi: int, parent: dict[int, int], n: int, channel: int
) -> None:
    """Reduce the piece up the tree to the root, then broadcast it down."""
    children: dict[int, list[int]] = {r: [] for r in range(n)}
    for c, p in parent.items():
        children[p].append(c)
    up: dict[int, int] = {}  # rank -> its transfer to its parent

    def reduce(r: int) -> None:
        for c in children[r]:
            reduce(c)
        if r in parent:
            deps = tuple(up[c] for c in children[r])
            up[r] = b.add(r, parent[r], lo, hi, Op.SUM, deps, channel)

    root = next(r for r in range(n) if r not in parent)
    reduce(root)

    def bcast(r: int, got: tuple[int, ...]) -> None:
        for c in children[r]:
            bcast(c, (b.add(r, c, lo, hi, Op.COPY, got, channel),))

    bcast(root, tuple(up[c] for c in children[root]))


@dataclass(frozen=True)
class PlanSpec:
    collective: str
    algorithm: str
    ranks: int
    count: int  # float32 elements per rank (per GPU for hier)
    channels: int
    chunk: int  # bytes per message (about)
    gpus: int = 1  # GPUs per rank (hier)

    def __post_init__(self) -> None:
        if self.collective not in SUPPORTED:
            raise ValueError(f"unknown collective {self.collective!r}; one of {COLLECTIVES}")
        if self.algorithm not in SUPPORTED[self.collective]:
            raise ValueError(
                f"{self.collective} has no {self.algorithm!r} algorithm; "
                f"one of {SUPPORTED[self.collective]}"
            )
        if self.ranks < 2 or self.channels < 1 or self.chunk < ELEM or self.gpus < 1:
            raise ValueError("a plan needs >= 2 ranks, >= 1 channel, chunk >= 4 B, >= 1 GPU")
        if self.count < self.ranks * self.gpus:
            raise ValueError(f"{self.count} elements: fewer than one per rank and GPU")
        if self.algorithm == "hier" and self.gpus < self.channels:
            raise ValueError("hierarchical: each channel (rail) needs its own GPU")


def build(spec: PlanSpec) -> list[Transfer]:
    """The transfers of one run of the collective (ids are positions in the list)."""
    b = _Builder()
    n, k, count = spec.ranks, spec.channels, spec.count
    per_msg = max(1, spec.chunk // ELEM)
    ring = list(range(n))
    if spec.collective == "allreduce" and spec.algorithm == "ring":
        for i, (lo, hi) in enumerate(pieces(0, count, per_msg * n, k)):
            segs = segments(lo, hi, n)
            done = _ring_reduce_scatter(b, segs, ring, i % k)
            _ring_all_gather(b, segs, ring, i % k, done)
    elif spec.collective == "allreduce" and spec.algorithm == "tree":
        trees = double_binary_trees(n)
        for i, (lo, hi) in enumerate(pieces(0, count, per_msg, 2 * k)):
            _tree_all_reduce(b, lo, hi, trees[i % 2], n, (i // 2) % k)
    elif spec.collective == "allreduce":  # hier: GPU g's shard of the host sum on rail g
        for g, (glo, ghi) in enumerate(segments(0, count, spec.gpus)):
            for lo, hi in pieces(glo, ghi, per_msg * n):
                segs = segments(lo, hi, n)
                done = _ring_reduce_scatter(b, segs, ring, g % k)
                _ring_all_gather(b, segs, ring, g % k, done)
    elif spec.collective in ("reducescatter", "allgather"):
        # the piece-p part of segment r belongs to rank r: a ring over each piece of every
        # segment, so each rank's own segment is the union of its parts
        own = segments(0, count, n)
        parts = [pieces(lo, hi, per_msg, k) for lo, hi in own]
        for i in range(max(len(p) for p in parts)):
            segs = [p[i] if i < len(p) else (p[-1][1], p[-1][1]) for p in parts]
            if spec.collective == "reducescatter":
                _ring_reduce_scatter(b, segs, ring, i % k)
            else:
                _ring_all_gather(b, segs, ring, i % k, [-1] * n)
    elif spec.collective == "alltoall":
        block = count // n
        for shift in range(1, n):  # pairwise exchange: step s sends to r+s (NCCL's order)
            for r in range(n):
                dst = (r + shift) % n
                for i, (plo, phi) in enumerate(pieces(dst * block, (dst + 1) * block, per_msg, k)):
                    b.add(r, dst, plo, phi, Op.COPY, (), i % k, r * block + plo - dst * block)
    else:  # sendrecv
        for i, (lo, hi) in enumerate(pieces(0, count, per_msg, k)):
            for r in range(n):
                b.add(r, (r + 1) % n, lo, hi, Op.COPY, (), i % k)
    return b.transfers


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw for n ranks (docs/PERFORMANCE.md there)."""
    if collective == "allreduce":
        return 2 * (n - 1) / n
    if collective in ("reducescatter", "allgather", "alltoall"):
        return (n - 1) / n
    return 1.0
