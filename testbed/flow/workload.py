"""SimAI/AICB workload files on the flow engine: a training iteration's layers, each with its
forward, input-gradient and weight-gradient computation and collective, over the groups of
a TP x DP x PP x EP job (issue 31's workloads; docs/flow.md).

The file is what AICB's SimAI workload generator writes and SimAI reads
(astra-sim-alibabacloud/astra-sim/workload/Workload.cc, `initialize_workload`): a first
line with the policy (`HYBRID_TRANSFORMER_FWD_IN_BCKWD` or `HYBRID_TRANSFORMER`) and
`model_parallel_NPU_group: TP ep: EP pp: PP vpp: V ga: GA all_gpus: N checkpoints: 0
checkpoint_initiates: 0 [pp_comm BYTES]`, a line with the number of layers, then per layer
`name dependency fwd_compute fwd_comm fwd_bytes ig_compute ig_comm ig_bytes wg_compute
wg_comm wg_bytes wg_update`, times in ns (SimAI's ticks), sizes in bytes. A collective is
ALLREDUCE, ALLGATHER, REDUCESCATTER or ALLTOALL, or NONE; its group as SimAI decodes it:
the forward and input-gradient collectives run in the TP group, the weight-gradient ones in
the DP group, `_EP` in the EP group and `_DP_EP` in the DP group's ranks of one expert
index (DP / EP of them).

The ranks are laid out as Megatron-LM orders them (our reading; SimAI's group builder is in
SimCCL, not read here): TP fastest, then DP, then PP; an EP group is EP consecutive DP
ranks. GPU r of the fabric is rank r, so a TP group of up to 8 is one server's GPUs (over
its scale-up domain) and a DP group is one GPU index of many servers (a rail).

The iteration runs SimAI's loop for one pass (`iterate_hybrid_parallel_Transformer_fwd_in_
bckwd`, without activation checkpoints): each layer's forward computation then its
collective, waited for; then backwards from the last layer: input-gradient computation and
collective (waited for), weight-gradient computation, and its collective issued without
waiting, the weight-gradient collectives run one after another (FIFO) beside the rest of
the backward pass; the iteration ends when the last of them does. Every group of a kind
runs its collective at once, on the flow engine (max-min rates, an all-to-all through FIFO
queues, over the fabric's routes,
the latency term, a scheme's calibrated efficiency). Pipeline parallelism's bubble is
given by SimAI's own formula, its point-to-point traffic (`pp_comm`) is not modelled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from testbed.errors import UserError
from testbed.flow.collectives import CollResult, alltoall, ring_allreduce
from testbed.flow.fabric import SCALEUP, Fabric

POLICIES = ("HYBRID_TRANSFORMER_FWD_IN_BCKWD", "HYBRID_TRANSFORMER")
# the first line's keys, and the field each sets
KEYS = {
    "model_parallel_NPU_group:": "tp",
    "ep:": "ep",
    "pp:": "pp",
    "vpp:": "vpp",
    "ga:": "ga",
    "all_gpus:": "all_gpus",
    "checkpoints:": "checkpoints",
    "checkpoint_initiates:": "checkpoint_initiates",
    "pp_comm": "pp_comm",
    "pp_comm:": "pp_comm",
}
COMMS = {
    "ALLREDUCE": "allreduce",
    "ALLGATHER": "allgather",
    "REDUCESCATTER": "reducescatter",
    "ALLTOALL": "alltoall",
}
GROUP_SUFFIXES = {"": None, "_EP": "EP", "_DP_EP": "DP_EP"}  # None: the phase's own group
PHASES = ("fwd", "ig", "wg")
PHASE_GROUP = {"fwd": "TP", "ig": "TP", "wg": "DP"}  # a collective with no suffix


class WorkloadError(UserError):
    pass


@dataclass(frozen=True)
class Phase:
    compute_s: float
    collective: str  # allreduce, allgather, reducescatter, alltoall, or "" (none)
    group: str  # TP, DP, EP or DP_EP ("" with no collective)
    nbytes: int


@dataclass(frozen=True)
class Layer:
    name: str
    fwd: Phase
    ig: Phase
    wg: Phase


@dataclass(frozen=True)
class Workload:
    path: str
    policy: str
    tp: int
    ep: int
    pp: int
    vpp: int
    ga: int
    all_gpus: int
    pp_comm: int
    layers: tuple[Layer, ...]

    @property
    def dp(self) -> int:
        return self.all_gpus // (self.tp * self.pp)

    def group_size(self, group: str) -> int:
        return {"TP": self.tp, "DP": self.dp, "EP": self.ep, "DP_EP": self.dp // self.ep}[group]


def read(path: Path) -> Workload:
    """A workload file, or a WorkloadError naming the line and what is wrong with it."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise WorkloadError(f"{path}: {exc.strerror or exc}") from None
    words = [ln.split() for ln in lines]
    words = [w for w in words if w]  # blank lines carry nothing
    if len(words) < 2:
        raise WorkloadError(f"{path}: a header line and a layer count, then the layers")
    head = words[0]
    if head[0] not in POLICIES:
        raise WorkloadError(
            f"{path}:1: policy {head[0]!r}; the flow engine reads {', '.join(POLICIES)}"
        )
    got: dict[str, int] = {}
    for i, w in enumerate(head[1:], 1):
        if w in KEYS:
            got[KEYS[w]] = _int(path, 1, w, head[i + 1] if i + 1 < len(head) else "")
    for key in ("tp", "ep", "pp", "vpp", "ga", "all_gpus"):
        if got.get(key, 0) < 1:
            raise WorkloadError(f"{path}:1: {key} must be given and at least 1")
    if got.get("checkpoints", 0) or got.get("checkpoint_initiates", 0):
        raise WorkloadError(
            f"{path}:1: activation checkpoints (a forward pass inside the backward one) are "
            "not modelled by the flow engine"
        )
    tp, pp, ep, n = got["tp"], got["pp"], got["ep"], got["all_gpus"]
    if n % (tp * pp):
        raise WorkloadError(f"{path}:1: all_gpus {n} is not a multiple of TP {tp} x PP {pp}")
    if (n // (tp * pp)) % ep:
        raise WorkloadError(f"{path}:1: the DP size {n // (tp * pp)} is not a multiple of EP {ep}")
    count = _int(path, 2, "the layer count", words[1][0])
    body = [w for w in words[2:]]
    if len(body) != count:
        raise WorkloadError(f"{path}:2: {count} layers announced, {len(body)} given")
    layers = tuple(_layer(path, 3 + i, w) for i, w in enumerate(body))
    return Workload(
        str(path),
        head[0],
        tp,
        ep,
        pp,
        got["vpp"],
        got["ga"],
        n,
        got.get("pp_comm", 0),
        layers,
    )


def _int(path: Path, line: int, what: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise WorkloadError(f"{path}:{line}: {what} {text!r} is not a whole number") from None


def _layer(path: Path, line: int, w: list[str]) -> Layer:
    if len(w) < 12:
        raise WorkloadError(
            f"{path}:{line}: {len(w)} fields; a layer has 12 (name, dependency, then compute "
            "time, collective and bytes for fwd, ig and wg, and the weight update)"
        )
    phases = {}
    for k, phase in enumerate(PHASES):
        compute, comm, nbytes = w[2 + 3 * k : 5 + 3 * k]
        ns = _int(path, line, f"{phase} compute time", compute)
        size = _int(path, line, f"{phase} bytes", nbytes)
        if ns < 0 or size < 0:
            raise WorkloadError(f"{path}:{line}: {phase}: a negative time or size")
        coll, group = _comm(path, line, phase, comm)
        if not coll or not size:  # SimAI issues nothing for either
            coll, group, size = "", "", 0
        phases[phase] = Phase(ns * 1e-9, coll, group, size)
    return Layer(w[0], phases["fwd"], phases["ig"], phases["wg"])


def _comm(path: Path, line: int, phase: str, text: str) -> tuple[str, str]:
    if text == "NONE":
        return "", ""
    for name, coll in COMMS.items():
        if text.startswith(name) and text[len(name) :] in GROUP_SUFFIXES:
            return coll, GROUP_SUFFIXES[text[len(name) :]] or PHASE_GROUP[phase]
    raise WorkloadError(
        f"{path}:{line}: {phase} collective {text!r}: one of NONE, "
        + ", ".join(f"{c}[_EP|_DP_EP]" for c in COMMS)
    )


def groups(wl: Workload, group: str) -> list[np.ndarray]:
    """The GPUs of every group of a kind, each in rank order (Megatron-LM's layout: TP
    fastest, then DP, then PP; EP groups EP consecutive DP ranks)."""
    rank = np.arange(wl.all_gpus).reshape(wl.pp, wl.dp, wl.tp)  # [pp, dp, tp]
    if group == "TP":
        return list(rank.reshape(-1, wl.tp))
    if group == "DP":
        return list(rank.transpose(0, 2, 1).reshape(-1, wl.dp))
    by_ep = rank.reshape(wl.pp, wl.dp // wl.ep, wl.ep, wl.tp)  # [pp, block, e, tp]
    if group == "EP":
        return list(by_ep.transpose(0, 1, 3, 2).reshape(-1, wl.ep))
    if group == "DP_EP":
        return list(by_ep.transpose(0, 2, 3, 1).reshape(-1, wl.dp // wl.ep))
    raise ValueError(group)


def channel_rings(gps: list[np.ndarray], gpus_per_server: int) -> list[np.ndarray]:
    """The rings NCCL builds for each group: where a group has k GPUs in each of several
    servers, k channels, each a ring through every member server by server, channel c
    entering and leaving each server by a different member (the server's members rotated
    by c), so that every member's NIC carries one channel's hop between servers; each
    channel moves 1/k of the buffer. A group inside one server, or with one GPU per
    server, is one ring."""
    out = []
    for g in gps:
        server = g // gpus_per_server
        _, per = np.unique(server, return_counts=True)
        k = int(per[0])
        if k == 1 or len(per) == 1 or np.any(per != k) or np.any(np.diff(server) < 0):
            out.append(g)
            continue
        blocks = g.reshape(-1, k)  # the members of each server, servers in order
        out += [np.roll(blocks, -c, axis=1).ravel() for c in range(k)]
    return out


@dataclass
class Timeline:
    """One pass of the workload: where its time went."""

    time_s: float = 0.0
    compute_s: float = 0.0
    blocking_comm_s: float = 0.0  # forward and input-gradient collectives, waited for
    wg_comm_s: float = 0.0  # weight-gradient collectives (FIFO, beside the backward pass)
    wg_exposed_s: float = 0.0  # of them, what the backward pass did not hide
    comm_by_group: dict[str, float] = field(default_factory=dict)
    bubble_s: float = 0.0  # pipeline bubble, SimAI's formula (PP > 1)
    # every distinct (collective, group, bytes): the flow engine's result, and the time it
    # ran at (the scheme's efficiency applied where it crossed the network)
    collectives: dict[tuple[str, str, int], CollResult] = field(default_factory=dict)
    times: dict[tuple[str, str, int], float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("collectives", "times")}
        out["collectives"] = [
            {
                "collective": c,
                "group": g,
                "bytes": b,
                **r.as_dict(),
                "time_under_scheme_s": self.times[c, g, b],
            }
            for (c, g, b), r in self.collectives.items()
        ]
        return out


def run(
    fab: Fabric,
    wl: Workload,
    link_latency: float,
    efficiency: Callable[[str, CollResult], float] = lambda coll, r: 1.0,
    spray: bool = False,
    jobs: tuple[int, ...] = (0,),
) -> Timeline:
    """One pass of `wl` on `fab` (SimAI's loop, above); every distinct (collective, group,
    bytes) computed once on the flow engine, every group of that kind at once, its time
    under `efficiency(collective, result)` (1: the ideal). `jobs`: the first GPU of each
    copy of the job (its GPUs the next all_gpus), all in lockstep: their same collectives
    at once on the fabric, the worst alignment of identical jobs (every copy's pass the
    same time)."""
    if max(jobs) + wl.all_gpus > fab.n_gpus or min(jobs) < 0:
        raise WorkloadError(
            f"{wl.path}: {len(jobs)} job(s) of all_gpus {wl.all_gpus} do not fit the fabric's "
            f"{fab.n_gpus} GPUs"
        )
    starts = sorted(jobs)
    if any(b - a < wl.all_gpus for a, b in zip(starts, starts[1:], strict=False)):
        raise WorkloadError(f"{wl.path}: jobs overlap (first GPUs {starts})")
    tl = Timeline()
    all_groups: dict[str, list[np.ndarray]] = {}

    def comm(p: Phase) -> float:
        if not p.collective or wl.group_size(p.group) < 2:
            return 0.0
        key = (p.collective, p.group, p.nbytes)
        if key not in tl.times:
            if p.group not in all_groups:
                one = groups(wl, p.group)
                all_groups[p.group] = [g + j for j in jobs for g in one]
            gps = all_groups[p.group]
            if p.collective == "alltoall":
                r = alltoall(
                    fab, [g[None, :] for g in gps], p.nbytes, spray=spray, link_latency=link_latency
                )
            else:
                rings = channel_rings(gps, fab.gpus_per_server)
                r = ring_allreduce(
                    fab,
                    rings,
                    p.nbytes * len(gps) / len(rings),
                    spray=spray,
                    link_latency=link_latency,
                    collective=p.collective,
                    rank_bytes=p.nbytes,
                )
            tl.collectives[key] = r
            # a collective inside the servers (a TP group of up to 8) never meets the
            # network's congestion control: its time is the ideal one
            on_network = r.link_bits is not None and bool(
                r.link_bits[fab.link_kind != SCALEUP].any()
            )
            tl.times[key] = r.time_at(efficiency(p.collective, r)) if on_network else r.time_s
        t = tl.times[key]
        tl.comm_by_group[p.group] = tl.comm_by_group.get(p.group, 0.0) + t
        return t

    t = 0.0
    pre_bubble = 0.0  # SimAI's: every layer's but the embedding's compute and waits
    for layer in wl.layers:
        c = comm(layer.fwd)
        t += layer.fwd.compute_s + c
        tl.compute_s += layer.fwd.compute_s
        tl.blocking_comm_s += c
        if layer.name != "embedding_layer":
            pre_bubble += layer.fwd.compute_s + c
    wg_end = 0.0
    for layer in reversed(wl.layers):
        c = comm(layer.ig)
        t += layer.ig.compute_s + c + layer.wg.compute_s
        tl.compute_s += layer.ig.compute_s + layer.wg.compute_s
        tl.blocking_comm_s += c
        w = comm(layer.wg)
        if w:
            wg_end = max(t, wg_end) + w
            tl.wg_comm_s += w
        if layer.name != "embedding_layer":
            pre_bubble += layer.ig.compute_s + c + layer.wg.compute_s
    tl.time_s = max(t, wg_end)
    tl.wg_exposed_s = tl.time_s - t
    tl.bubble_s = pre_bubble * (wl.pp - 1) / (wl.ga * wl.vpp)
    return tl
