"""The collective library's plans as flows (testbed/traffic/collective_plans.py), step by
step.

- Ring all-reduce: a ring's 2(n-1) steps (reduce-scatter, then all-gather), each rank sending
  a segment of size/n bytes to the next; a step's flows all start together and the next step
  starts when the last of them is done (the plan's pieces pipelining through the steps is
  not modelled). Several rings (one per rail, or one per channel) advance in lockstep.
  Segments are size/n bytes exactly (the plan's integer split differs by at most one
  element).
- All-to-all: the library's own plan (`collective_plans.build`), its transfers summed per
  (source, destination, channel) into flows, all started at once: the plan's transfers have
  no dependencies (`plan_flows` refuses a plan that has), and every rank posts them all at
  the start (its depth of messages in flight per queue pair does not bind: one queue pair
  per peer and channel). Their times are not max-min's: started together, they cross the
  switches' FIFO queues in the order their NICs send them (testbed/flow/fifo.py, which
  measures why), the latency of each hop included; a sprayed all-to-all takes max-min's
  rates.

Latency (alpha-beta): a flow's last byte arrives its path's latency after the max-min
model has it sent, `link_latency` per link (alpha: propagation and a frame's
store-and-forward per link, `testbed.model.link_latency_s` of the base RTT). The library
runs the plan as dataflow, with no barrier between steps: a rank forwards a segment as soon
as it has arrived. So a ring's segment pays the latency of the hops it travels, and the
collective ends with the slowest chain of 2(n-1) consecutive hops (`ring_latency`), not
2(n-1) times the longest hop. The all-to-all, one step, ends with its last flow's finish
plus its own path's latency.

Symmetry, where the routing allows it (`symmetric=True`):
- the ring's steps move the same flows between the same queue pairs (so on the same paths),
  so one step is computed and counted 2(n-1) times;
- rings whose flows share no link, and whose flows meet the same capacities, take the same
  time: one ring is computed (one rail's ring when all rails are alike);
- all-to-all groups that stay under one leaf per plane (their flows cross no switch-to-switch
  link) share no link and are alike: one group is computed.
`tests/test_flow_collectives.py` checks each shortcut against the full computation.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controller.common.gc_pause import gc_paused
from testbed.experiment.suite import ALLTOALL_CHUNK
from testbed.flow import fifo, maxmin
from testbed.flow.fabric import LEAF_UP, NIC_UP, Fabric, leaf_of_gpu
from testbed.flow.routing import Routes, collisions, entropy_ports, route
from testbed.model import DEFAULT_MODEL, Scaling, link_latency_s
from testbed.topo import FabricSpec
from testbed.traffic.collective_jobs import (
    NVLINK_BPS,
    NVLINK_LATENCY_S,
    CollectiveJob,
    nvlink_ring_time,
)
from testbed.traffic.collective_plans import ELEM, PlanSpec, build, bus_factor
from testbed.traffic.transport_core import TransportConfig, TransportCore, port_seed
from testbed.traffic.workloads import ALLREDUCE_SCHEDULE

PROGRESS_S = 2.0  # how often a long computation says how far it is
PACKET_BYTES = Scaling.transport_mtu  # the transport's payload per packet (fifo's pieces)


@dataclass
class CollResult:
    collective: str
    ranks: int  # per ring / group
    bytes_per_rank: float
    time_s: float  # the ideal time (max-min rates, or through FIFOs: `queues`)
    busbw_bps: float
    steps: int
    flows_computed: int  # flows whose rates were computed (after the shortcuts)
    allocations: int  # max-min allocations run (0 through FIFOs)
    shortcut: str  # which symmetry was used
    collisions: dict[str, int] = field(default_factory=dict)
    bottleneck: str = ""  # the most loaded link of the computed flows
    bottleneck_util: float = 0.0  # its load over its capacity during the computed step
    latency_s: float = 0.0  # of time_s, the steps' latency (alpha)
    scaleup_s: float = 0.0  # of time_s, the steps on the scale-up domain alone (hier)
    # bits each link carried over the whole collective, of the flows routed (every flow, or
    # one group of `replicas` alike ones on links of their own: the all-to-all's shortcut)
    link_bits: np.ndarray | None = field(default=None, repr=False)
    replicas: int = 1
    # the flows that finish last are held by the network (a switch's egress, not their own
    # NIC, sets their rate): where congestion control acts (`calibration`'s congested fit)
    held_by_network: bool = False
    # how the flows' times were computed: max-min rates (every step of a ring; a sprayed
    # all-to-all), or an all-to-all's burst through FIFO queues (`fifo`)
    queues: str = "max-min"
    # through FIFOs: the switch port whose queue, with no law acting, passes what the model's
    # shared buffer admits (`fifo.overflow`'s record); None: none does
    overflow: dict[str, Any] | None = None

    def busbw_at(self, time_s: float) -> float:
        """The bus bandwidth (b/s) had the collective taken `time_s`."""
        return self.busbw_bps * self.time_s / time_s if time_s else 0.0

    def time_at(self, efficiency: float) -> float:
        """The time under a scheme whose efficiency on the network is `efficiency` (the
        scale-up domain's steps are not the network's)."""
        return (self.time_s - self.scaleup_s) / efficiency + self.scaleup_s

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "link_bits"}


def _step(fab: Fabric, r: Routes, size: np.ndarray) -> tuple[np.ndarray, int]:
    """A ring step: its flows' completions and the allocations it took."""
    return maxmin.complete(r, fab.link_cap, size)


def held_by_network(fab: Fabric, r: Routes, end: np.ndarray) -> bool:
    """Whether the flows that finish last (`end`: each flow's completion, all starting
    together) are held by the network: at the first allocation their own NIC's uplink is
    not their bottleneck (it has room, or carries a faster flow of theirs), so a switch's
    egress further on, shared with other senders, sets their rate, and without congestion
    control a queue would build there. Flows that stay in their server are not. At the rates
    the queues see: a lossy link's flows are not held by a switch for it (`fabric.lose`)."""
    if r.n_flows == 0:
        return False
    cap = fab.link_cap if fab.queue_cap is None else fab.queue_cap
    rate = maxmin.rates(r, cap)
    flow = r.flow_of_entry()
    load = np.bincount(r.links, weights=r.coeff * rate[flow], minlength=fab.n_links)
    fastest = np.zeros(fab.n_links)
    np.maximum.at(fastest, r.links, rate[flow])
    nic = fab.link_kind[r.links] == NIC_UP
    lk, f = r.links[nic], flow[nic]
    held = np.zeros(r.n_flows, dtype=bool)
    paced = (load[lk] >= cap[lk] * (1 - 1e-6)) & (rate[f] >= fastest[lk] * (1 - 1e-6))
    held[f] = ~paced
    last = end >= float(end.max()) * (1 - 1e-9)
    return bool(held[last].any())


def model_link_latency() -> float:
    """Seconds per link at the model's own speed: its base RTT (`SwitchModel.base_rtt_us`,
    which the twin's links are built to give: it measures 0.99 us on the leaf-spine) over the
    leaf-spine's links there and back."""
    return link_latency_s(Scaling(scale=1).base_rtt_s)


def path_links(r: Routes) -> np.ndarray:
    """Per flow, the links of its path (a sprayed flow's coefficients sum to its length)."""
    return np.add.reduceat(r.coeff, r.indptr[:-1]) if r.n_flows else np.zeros(0)


def ring_latency(links: np.ndarray, steps: int, link_latency: float) -> float:
    """`links`: (rings, n), the links of each ring's hop from position p to p + 1. A segment
    that starts at position p crosses the hops p .. p + steps - 1 (around the ring): the
    slowest such chain of any ring, `link_latency` per link."""
    links = np.atleast_2d(links).astype(float)
    n = links.shape[1]
    reps = -(-steps // n) + 1  # enough turns for a chain starting at any position
    cs = np.concatenate([np.zeros((len(links), 1)), np.cumsum(np.tile(links, reps), 1)], 1)
    chains = cs[:, steps : steps + n] - cs[:, :n]
    return float(chains.max(initial=0.0)) * link_latency


def link_bits(fab: Fabric, r: Routes, nbytes: np.ndarray) -> np.ndarray:
    """Bits on each link of the fabric when flow f of `r` moves nbytes[f]."""
    return np.bincount(
        r.links, weights=r.coeff * np.repeat(nbytes * 8.0, np.diff(r.indptr)), minlength=fab.n_links
    )


def _bottleneck(fab: Fabric, r: Routes, size: np.ndarray, t: float) -> tuple[str, float]:
    """The link that carried the most bits relative to its capacity over time t."""
    bits = link_bits(fab, r, size)
    util = bits / (fab.link_cap * t) if t > 0 else bits
    i = int(util.argmax())
    return fab.link_name(i), float(util[i])


def ring_allreduce(
    fab: Fabric,
    rings: list[np.ndarray],
    bytes_per_rank: float,
    symmetric: bool = True,
    spray: bool = False,
    seed: int = 1,
    rank_bytes: float | None = None,
    link_latency: float = 0.0,
    progress: Callable[[str], None] | None = None,
    collective: str = "allreduce",
    adaptive: bool = False,
    ports: Ports | None = None,
) -> CollResult:
    """`rings`: each an array of GPUs in ring order (all of one length n), each all-reducing
    `bytes_per_rank` per member. `rank_bytes`: the size per rank busbw is reported for
    (default bytes_per_rank; a host's whole buffer when its channels are the rings).
    `link_latency`: seconds per link of a step's longest path (0: bandwidth only).
    `progress`: told how far the step-by-step computation (`symmetric=False`) is, every
    few seconds. `collective`: "reducescatter" or "allgather" runs the ring's half of the
    all-reduce (n - 1 steps of a segment each, `bytes_per_rank` the whole buffer, as
    nccl-tests sizes them).

    `adaptive`: the rings are the channels of one collective (ring c's hop i joins the same
    two servers on every channel), under the library's adaptive schedule at its best: its
    work-stealing moves a step's pieces between the channels of a hop, so a hop moves its
    servers' whole segment at the sum of its channels' rates, every channel busy to the
    step's end, and a step lasts as long as its slowest hop. The rates are the max-min
    allocation of every channel's flows at once (the static split's first): a channel
    behind an ECMP collision or a slow NIC carries less, the others more. The scale-up hops
    that hand pieces between a server's GPUs are not counted. `ports`: the flows' source
    ports (default: the flow engine's own draw at `seed`)."""
    n = len(rings[0])
    if any(len(rg) != n for rg in rings) or n < 2:
        raise ValueError("rings of one length, at least 2")
    if collective not in RING_STEPS:
        raise ValueError(f"a ring runs {', '.join(RING_STEPS)}, not {collective!r}")
    steps = RING_STEPS[collective] * (n - 1)
    src = np.concatenate(rings)
    dst = np.concatenate([np.roll(rg, -1) for rg in rings])
    chan = np.repeat(np.arange(len(rings)), n)
    sport = (ports or entropy_ports)(src, dst, chan, seed)
    seg = bytes_per_rank / n
    r_all = route(fab, src, dst, sport, spray)
    coll = collisions(r_all)
    if not symmetric:
        total, allocs = 0.0, 0
        size = np.full(len(src), seg)
        told = time.monotonic()
        for i in range(steps):  # every step on its own, as the plan runs them
            end, a = _step(fab, r_all, size)
            total += float(end.max())
            allocs += a
            if progress is not None and time.monotonic() - told > PROGRESS_S:
                told = time.monotonic()
                progress(f"all-reduce: step {i + 1} of {steps} computed")
        computed, how, r, t_one = len(src) * steps, "none", r_all, total / steps
    else:
        r, how = r_all, "steps"
        if len(rings) > 1 and _rings_alike(fab, r_all, len(rings), n):
            r = route(fab, rings[0], np.roll(rings[0], -1), sport[:n], spray)
            how = "steps, one ring"
        size = np.full(r.n_flows, seg)
        end, allocs = _step(fab, r, size)
        t_one = float(end.max())
        total, computed = t_one * steps, r.n_flows
    name, util = _bottleneck(fab, r, np.full(r.n_flows, seg), t_one)
    held = held_by_network(fab, r, end)  # every step alike: the last one's flows
    carried = np.full(r_all.n_flows, seg * steps)  # each flow's bytes over the collective
    if adaptive and len(rings) > 1:  # one channel: nothing to steal
        k = len(rings)
        servers = src.reshape(k, n) // fab.gpus_per_server
        if np.any(servers != servers[0]):
            raise ValueError(
                "the adaptive schedule steals between channels that join the same servers "
                "hop by hop: rings of GPUs of the same servers in the same order"
            )
        rate = maxmin.rates(r_all, fab.link_cap).reshape(k, n)
        hop = rate.sum(axis=0)  # b/s each server-to-server hop moves on all its channels
        total, how = steps * k * seg * 8 / float(hop.min()), "adaptive"
        carried = (steps * k * seg * rate / hop).ravel()
    latency = ring_latency(path_links(r_all).reshape(len(rings), n), steps, link_latency)
    total += latency
    per_rank = bytes_per_rank if rank_bytes is None else rank_bytes
    return CollResult(
        collective,
        n,
        per_rank,
        total,
        per_rank * 8 / total * bus_factor(collective, n) if total else 0.0,
        steps,
        computed,
        allocs,
        how,
        coll,
        name,
        util,
        latency,
        link_bits=link_bits(fab, r_all, carried),
        held_by_network=held,
    )


# a ring's steps per (n - 1): the all-reduce is a reduce-scatter then an all-gather
RING_STEPS = {"allreduce": 2, "reducescatter": 1, "allgather": 1}


def _rings_alike(fab: Fabric, r: Routes, k: int, n: int) -> bool:
    """No link carries two flows of a step, and every ring's flows meet the same
    bottleneck capacities: then every ring's step is each flow at its path's narrowest
    link, the same for all rings."""
    if r.link_flows(fab.n_links).max() > 1 or not np.all(r.coeff == 1.0):
        return False
    narrowest = np.minimum.reduceat(fab.link_cap[r.links], r.indptr[:-1])
    per_ring = np.sort(narrowest.reshape(k, n), axis=1)
    return bool(np.all(per_ring == per_ring[0]))


def plan_flows(
    ranks: int, bytes_per_rank: int, channels: int, chunk: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The collective library's all-to-all plan for `ranks` ranks of `channels` channels as
    flows: (source rank, destination rank, channel, bytes), its transfers summed per
    (source, destination, channel). Refuses a plan whose transfers wait for others (the flow
    model starts them all at once)."""
    plan = build(PlanSpec("alltoall", "ring", ranks, bytes_per_rank // ELEM, channels, chunk))
    if any(x.deps for x in plan):
        raise ValueError("the library's all-to-all plan has dependencies: not one step")
    key = np.array([(x.src, x.dst, x.channel) for x in plan], dtype=np.int64).reshape(-1, 3)
    nbytes = np.array([x.nbytes for x in plan], dtype=float)
    uniq, inv = np.unique(key, axis=0, return_inverse=True)
    total = np.bincount(inv.ravel(), weights=nbytes, minlength=len(uniq))
    keep = total > 0
    return uniq[keep, 0], uniq[keep, 1], uniq[keep, 2], total[keep]


Ports = Callable[[np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]


def job_ports(
    spec: FabricSpec, bytes_per_rank: int, seed: int, chunk: int, collective: str = "alltoall"
) -> Ports:
    """The source ports the packet engines' `collective` job (the all-to-all, or the ring
    all-reduce) draws, as (source GPU, destination GPU, channel) -> port: every host's rank
    made as the runner makes it (the collective job on a transport seeded
    `port_seed(seed, host)`, the job creating its queue pairs in its own order), so the flow
    engine routes each flow on the twin's path, not on a mix of its own. For a packet
    engine's topology (hundreds of hosts at most: one job per host)."""
    table = _port_table(spec, bytes_per_rank, seed, chunk, collective)

    def ports(src: np.ndarray, dst: np.ndarray, chan: np.ndarray, _seed: int) -> np.ndarray:
        return np.array(
            [table[(int(a), int(b), int(c))] for a, b, c in zip(src, dst, chan, strict=True)],
            dtype=np.uint32,
        )

    return ports


@functools.lru_cache(maxsize=2)  # a suite asks again for every scheme (both collectives)
def _port_table(
    spec: FabricSpec, bytes_per_rank: int, seed: int, chunk: int, collective: str
) -> dict[tuple[int, int, int], int]:
    """`job_ports`' (source GPU, destination GPU, channel) -> source port."""
    g = len(spec.hosts[0].nics)
    job = {
        "kind": "collective",
        "collective": collective,
        "size": bytes_per_rank,
        "chunk": chunk,
        "channels": g,
        "nic_ips": [[n.ip for n in h.nics] for h in spec.hosts],
        "seed": seed,
        "payload": "size",  # the same queue pairs; no rank draws every rank's data
        "hosts": [{"name": h.name, "ip": h.nics[0].ip} for h in spec.hosts],
    }
    if collective == "allreduce":  # as the suite's all-reduce runs (workloads.collective)
        job.update(algorithm="ring", schedule=ALLREDUCE_SCHEDULE)
    table: dict[tuple[int, int, int], int] = {}
    for i, h in enumerate(spec.hosts):
        # a rank's job is a queue pair per peer, made at once (controller.common.gc_pause)
        with gc_paused():
            core = TransportCore(TransportConfig(local_ip=h.nics[0].ip), seed=port_seed(seed, i))
            rank = CollectiveJob(core, job, i, expect_ahead=False)
        for peer, chans in rank.channels.items():
            for ch in chans:
                k = ch.index % g
                table[(i * g + k, peer * g + k, ch.index)] = ch.qp.sport
    return table


def alltoall(
    fab: Fabric,
    groups: list[np.ndarray],
    bytes_per_rank: int,
    symmetric: bool = True,
    spray: bool = False,
    seed: int = 1,
    chunk: int | None = None,
    link_latency: float = 0.0,
    ports: Ports | None = None,
) -> CollResult:
    """`groups`: arrays of shape (channels, n): row c holds the GPUs of the group's n ranks
    on channel c (a rank with K NICs is a column of K GPUs; a GPU rank is a column of one).
    Every group runs the library's all-to-all plan (`plan_flows`) of `bytes_per_rank` with
    messages of `chunk` bytes (default: one piece per block and channel; the chunk only moves
    piece boundaries, hence a byte or so between channels). `link_latency`: seconds per link
    of the longest path, paid once."""
    groups = [np.atleast_2d(gp) for gp in groups]
    k, n = groups[0].shape
    if any(gp.shape != (k, n) for gp in groups) or n < 2:
        raise ValueError("groups of one shape, at least 2 ranks")
    how = "none"
    todo = groups
    if symmetric and len(groups) > 1 and _groups_local(fab, groups):
        todo, how = groups[:1], "one group"
    i, j, c, nbytes = plan_flows(n, int(bytes_per_rank), k, chunk or max(ELEM, int(bytes_per_rank)))
    src = np.concatenate([gp[c, i] for gp in todo])
    dst = np.concatenate([gp[c, j] for gp in todo])
    chan = np.concatenate([c for _ in todo])
    r = route(fab, src, dst, (ports or entropy_ports)(src, dst, chan, seed), spray)
    size = np.tile(nbytes, len(todo))
    overflow = None
    if spray:  # split over paths: max-min's even load
        end, allocs = maxmin.complete(r, fab.link_cap, size)
        t_bw = float(end.max())
        t = float((end + path_links(r) * link_latency).max())
        queues = "max-min"
    else:  # all started at once: through the switches' FIFOs (testbed/flow/fifo.py)
        peak = np.zeros(fab.n_links)
        end, allocs = fifo.burst(fab, r, size, PACKET_BYTES, link_latency, peak=peak), 0
        m = DEFAULT_MODEL
        overflow = fifo.overflow(fab, peak, m.buffer_per_port(), m.buffer_alpha)
        t = float(end.max())
        t_bw = t - float(path_links(r).max(initial=0.0)) * link_latency
        queues = "fifo"
    name, util = _bottleneck(fab, r, size, t_bw)
    latency = t - t_bw
    return CollResult(
        "alltoall",
        n,
        bytes_per_rank,
        t,
        bytes_per_rank * 8 / t * bus_factor("alltoall", n) if t else 0.0,
        1,
        r.n_flows,
        allocs,
        how,
        collisions(r),
        name,
        util,
        latency,
        link_bits=link_bits(fab, r, size),
        replicas=len(groups) // len(todo),
        held_by_network=held_by_network(fab, r, end),
        queues=queues,
        overflow=overflow,
    )


def _groups_local(fab: Fabric, groups: list[np.ndarray]) -> bool:
    """Every group's GPUs hang off one leaf per plane (so its flows never leave their
    leaves), and every group is laid out alike over its servers."""
    if not fab.structured or not fab.has_scaleup:
        return False
    assert fab.params is not None
    g = fab.gpus_per_server
    first = None
    for gp in groups:
        flat = gp.ravel()
        servers = flat // g
        # under one leaf in every plane: the leaf of each server's NIC on plane 0
        leaf = leaf_of_gpu(fab.shape, fab.params, servers * g)
        if fab.params.rail:
            if leaf.min() != leaf.max():
                return False
        elif np.unique(leaf_of_gpu(fab.shape, fab.params, flat)).size != 1:
            return False
        shape = (tuple(flat % g), tuple(servers - servers.min()))
        if first is None:
            first = shape
        elif shape != first:
            return False
    return True


def rail_rings(fab: Fabric) -> list[np.ndarray]:
    """One ring per rail: GPU g of every server, in server order."""
    g = fab.gpus_per_server
    return [np.arange(fab.servers) * g + c for c in range(g)]


def hier_allreduce(
    fab: Fabric,
    bytes_per_gpu: float,
    symmetric: bool = True,
    spray: bool = False,
    link_latency: float = 0.0,
    adaptive: bool = False,
) -> CollResult:
    """The collective library's hierarchical all-reduce over every GPU (`hier`): a ring
    reduce-scatter over each server's GPUs on the scale-up domain, then GPU g's shard of
    its server's sum all-reduced on rail g (a ring per rail, TCCL's channel per NIC rail),
    then a ring all-gather on the scale-up domain; the intra-server steps timed as the
    library times them (`nvlink_ring_time`: its step latency, the fabric's scale-up
    bandwidth one way). On a packet engine's topology a host's NICs are its GPUs.

    `adaptive`: the library's adaptive schedule at its best (`ring_allreduce`'s: each hop's
    pieces stolen between the rails' channels, so a slow rail or a collision carries less;
    its work-stealing gets within a few % of that on the packet engines,
    docs/collectives.md and docs/flow.md)."""
    g = fab.gpus_per_server
    # a Clos built here has scale-up links; a packet engine's topology has none, and its
    # hosts' NVLink is the library's (what the packet engines time the steps with)
    su_bps = float(fab.link_cap[fab.shape["b_scaleup_out"]]) if fab.has_scaleup else NVLINK_BPS
    intra = nvlink_ring_time(g, bytes_per_gpu, su_bps, NVLINK_LATENCY_S)
    net = ring_allreduce(
        fab,
        rail_rings(fab),
        bytes_per_gpu / g,
        symmetric=symmetric,
        spray=spray,
        link_latency=link_latency,
        adaptive=adaptive,
    )
    total = 2 * intra + net.time_s
    n = fab.n_gpus
    return CollResult(
        "allreduce",
        n,
        bytes_per_gpu,
        total,
        bytes_per_gpu * 8 / total * bus_factor("allreduce", n),
        2 * (g - 1) + net.steps,
        net.flows_computed,
        net.allocations,
        net.shortcut,
        net.collisions,
        net.bottleneck,
        net.bottleneck_util,
        net.latency_s + 2 * (g - 1) * NVLINK_LATENCY_S,
        2 * intra,
        link_bits=net.link_bits,  # the network's (the scale-up steps are not routed)
        held_by_network=net.held_by_network,
    )


def flat_ring(fab: Fabric) -> list[np.ndarray]:
    """One ring through every GPU, server by server (one channel: inside a server over the
    scale-up domain, between servers over one NIC, GPU g-1's of one server to GPU 0's of the
    next; on a rail-optimized fabric that hop relays to the sender's GPU 0 first (PXN), so
    every server-to-server hop is on rail 0)."""
    return [np.arange(fab.n_gpus)]


def ep_groups(fab: Fabric, size: int) -> list[np.ndarray]:
    """Consecutive groups of `size` GPUs (expert parallelism), one rank per GPU."""
    if fab.n_gpus % size:
        raise ValueError(
            f"--ep-group {size}: the {fab.n_gpus} GPUs do not split into groups of {size}"
        )
    return [np.arange(a, a + size)[None, :] for a in range(0, fab.n_gpus, size)]


def uplink_share(fab: Fabric, r: Routes) -> float:
    """Of the computed flows' link entries, the share on leaf uplinks (how much of the
    traffic left its leaf)."""
    return float(np.mean(fab.link_kind[r.links] == LEAF_UP)) if len(r.links) else 0.0


def suite_collective(
    fab: Fabric,
    collective: str,
    bytes_per_rank: int,
    link_latency: float = 0.0,
    spec: FabricSpec | None = None,
    seed: int = 1,
) -> CollResult:
    """The suite's collective on a packet engine's topology, as the collective library runs
    it there: one rank per host, the host's buffer split over its K NICs (channel c is NIC
    c, a ring of NIC c of every host) by the suite's schedule (`ALLREDUCE_SCHEDULE`,
    adaptive: work-stealing between the channels), all hosts in one communicator; the all-to-all
    with the suite's messages (`ALLTOALL_CHUNK`); both on the job's own source ports when
    `spec` (the topology `fab` was built from) is given (`job_ports`: the run's `seed`)."""
    k, hosts = fab.gpus_per_server, fab.servers
    per_channel = [np.arange(hosts) * k + c for c in range(k)]
    if collective == "allreduce":
        return ring_allreduce(
            fab,
            per_channel,
            bytes_per_rank / k,
            rank_bytes=bytes_per_rank,
            link_latency=link_latency,
            adaptive=ALLREDUCE_SCHEDULE == "adaptive",  # the suite's schedule
            # a ring's queue pairs, hence its ports, are the same whatever its chunk and size
            ports=None
            if spec is None
            else job_ports(spec, bytes_per_rank, seed, ALLTOALL_CHUNK, "allreduce"),
        )
    if collective == "alltoall":
        return alltoall(
            fab,
            [np.stack(per_channel)],
            bytes_per_rank,
            chunk=ALLTOALL_CHUNK,
            link_latency=link_latency,
            ports=None if spec is None else job_ports(spec, bytes_per_rank, seed, ALLTOALL_CHUNK),
        )
    raise ValueError(f"the flow engine models allreduce and alltoall, not {collective!r}")
