"""Fabrics as numpy arrays of directed links: the deployed Clos shapes from a few parameters
(`ClosParams`, `build_clos`), or any topology the packet engines take (`from_spec`).

Nodes are numbered GPUs first (a GPU and its NIC are one node: the NIC's link is the GPU's
way out), then switches, then one scale-up switch per server (NVSwitch-like). Links are
directed, one entry per direction of a cable, in blocks whose layout `routing` computes
with arithmetic instead of searching a graph:

    scale-up out  (GPU -> its server's scale-up switch)      n_gpus links
    scale-up in   (scale-up switch -> GPU)                   n_gpus
    NIC up        (GPU's NIC -> its leaf)                    n_gpus
    NIC down      (leaf -> NIC)                              n_gpus
    leaf up       (plane, leaf, uplink k)                    planes x leaves x up
    leaf down     (the reverse of leaf up, same order)       planes x leaves x up
    agg up        (plane, pod, agg, uplink k)  [3 tiers]     planes x pods x aggs x agg_up
    agg down      (the reverse of agg up)      [3 tiers]

Rail-optimized multi-plane (`rail=True`): NIC g of every server is on plane g, each plane a
Clos of its own (the planes share no switch). Plain Clos: one plane, a server's NICs on
consecutive leaf ports. 2 tiers: leaves and spines ("aggs" of one pod); 3 tiers: pods of
leaves and aggregation switches, and core switches joining the pods.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from testbed.topo import End, FabricSpec, HostSpec, LinkSpec, NicSpec, SwitchSpec
from testbed.traffic.collective_jobs import NVLINK_BPS

# link kinds
SCALEUP, NIC_UP, NIC_DOWN, LEAF_UP, LEAF_DOWN, AGG_UP, AGG_DOWN = range(7)
KIND_NAMES = ("scale-up", "NIC up", "NIC down", "leaf up", "leaf down", "agg up", "agg down")
BYTES_PER_LINK = 4 + 4 + 8 + 1  # src, dst, capacity, kind
MAX_EXPORT_GPUS = 2048  # topology YAML for the packet engines: they cannot run more anyway
MAX_SERVERS = 64_000  # the address plan below: 10.<nic+1>.<s // 250>.<s % 250 + 1>


class FabricError(ValueError):
    """A fabric that cannot be built; the message names the parameter."""


@dataclass(frozen=True)
class ClosParams:
    gpus: int
    gpus_per_server: int = 8
    tiers: int = 2
    rail: bool = True  # rail-optimized multi-plane; False: plain Clos
    oversub: float = 1.0  # leaf downlinks : uplinks
    radix: int = 128  # switch ports
    port_gbps: float = 400.0
    switch_tbps: float = 51.2  # what a switch can carry: radix x port speed at most
    nic_gbps: float = 400.0
    # scale-up bandwidth per GPU, both directions together as NVLink 4 quotes its 900 GB/s
    # (the collective library's NVLink); each direction is a link of half of it
    scaleup_gbytes: float = NVLINK_BPS * 2 / 8e9
    # the machine's memory the fabric may take (bytes); None: what /proc/meminfo says is
    # available
    memory_limit: int | None = None

    def check(self) -> None:
        if self.gpus_per_server < 1:
            raise FabricError(f"--gpus-per-server {self.gpus_per_server}: at least 1")
        if self.gpus < 2 * self.gpus_per_server or self.gpus % self.gpus_per_server:
            raise FabricError(
                f"--gpus {self.gpus}: a multiple of the server size "
                f"{self.gpus_per_server}, at least two servers"
            )
        if self.tiers not in (2, 3):
            raise FabricError(f"--tiers {self.tiers}: 2 or 3")
        if self.radix < 4:
            raise FabricError(f"--radix {self.radix}: at least 4 ports")
        if self.radix * self.port_gbps > self.switch_tbps * 1000 + 1e-6:
            raise FabricError(
                f"--radix {self.radix}: {self.radix} x {self.port_gbps:g}G is "
                f"beyond the {self.switch_tbps:g}T switch's "
                f"{int(self.switch_tbps * 1000 // self.port_gbps)} ports"
            )
        if not self.oversub > 0:
            raise FabricError(f"--oversub {self.oversub}: a positive ratio")
        if self.nic_gbps > self.port_gbps:
            raise FabricError(
                f"--nic-gbps {self.nic_gbps:g}: above the switch port's {self.port_gbps:g}G"
            )
        if self.servers > MAX_SERVERS:
            raise FabricError(
                f"--gpus {self.gpus}: {self.servers} servers, beyond the "
                f"address plan's {MAX_SERVERS}"
            )

    @property
    def servers(self) -> int:
        return self.gpus // self.gpus_per_server

    @property
    def leaf_ports(self) -> tuple[int, int]:
        """(downlinks, uplinks) of a leaf: the radix split by the oversubscription."""
        down = round(self.radix * self.oversub / (1 + self.oversub))
        if not 1 <= down < self.radix:
            raise FabricError(
                f"--oversub {self.oversub:g}: leaves {down} ports down of "
                f"{self.radix}, none up (or none down)"
            )
        return down, self.radix - down


@dataclass
class Fabric:
    """Directed links as arrays (index = link id), and what routing needs of the shape."""

    name: str
    n_gpus: int
    gpus_per_server: int
    link_src: np.ndarray  # int32 node ids
    link_dst: np.ndarray
    link_cap: np.ndarray  # float64, b/s
    link_kind: np.ndarray  # uint8, the kinds above
    n_nodes: int
    gpu_ip: np.ndarray  # uint32, each GPU's NIC address (what the switches hash)
    params: ClosParams | None = None  # None: built from a topology spec (`from_spec`)
    # the Clos shape (build_clos): planes, leaves per plane, leaf down/up ports, pods,
    # leaves per pod, aggs per pod, agg up ports, cores per agg group; and the block bases
    shape: dict[str, int] = field(default_factory=dict)
    # from a spec: each link's transmitting end ("leaf1:3", "h1:0"), switch names
    end_names: list[str] | None = None
    switch_names: list[str] = field(default_factory=list)
    has_scaleup: bool = True
    # links that carry nothing (`fail`: switches and cables down); None: all up
    down: np.ndarray | None = None
    failed: tuple[str, ...] = ()  # what `fail` took down, as named
    slowed: tuple[tuple[str, float], ...] = ()  # what `slow` cut, as named, and to what
    lossy: tuple[tuple[str, float], ...] = ()  # what `lose` cut, as named, to its goodput
    # link_cap before `lose` cut it: what the queues see (a lossy link's resends leave its
    # rate, so no switch's queue holds its flows); None: no loss
    queue_cap: np.ndarray | None = None

    @property
    def n_links(self) -> int:
        return len(self.link_src)

    @property
    def servers(self) -> int:
        return self.n_gpus // self.gpus_per_server

    @property
    def structured(self) -> bool:
        """Routing by arithmetic (a Clos built here) rather than by search."""
        return self.params is not None

    def nic_bps(self) -> float:
        return (
            float(self.link_cap[self.shape["b_nic_up"]])
            if self.structured
            else float(self.link_cap[self.nic_up_link(0)])
        )

    def nic_up_link(self, gpu: int) -> int:
        if self.structured:
            return self.shape["b_nic_up"] + gpu
        return int(np.flatnonzero((self.link_src == gpu) & (self.link_kind == NIC_UP))[0])

    def link_name(self, i: int) -> str:
        """A link by its transmitting end, as the packet engines name ports."""
        if self.end_names is not None:
            return self.end_names[i]
        kind = int(self.link_kind[i])
        src = int(self.link_src[i])
        if src < self.n_gpus:
            s, g = divmod(src, self.gpus_per_server)
            return f"h{s + 1}:{g}" if kind == NIC_UP else f"h{s + 1}:gpu{g}"
        return f"{self.node_name(src)}->{self.node_name(int(self.link_dst[i]))}"

    def node_name(self, node: int) -> str:
        if node < self.n_gpus:
            s, g = divmod(node, self.gpus_per_server)
            return f"h{s + 1}g{g}"
        if node - self.n_gpus < len(self.switch_names):
            return self.switch_names[node - self.n_gpus]
        return f"su{node - self.n_gpus - len(self.switch_names) + 1}"


# ---- the Clos shapes --------------------------------------------------------------------------


def _divisor_at_least(n: int, low: int) -> int:
    """The smallest divisor of n that is >= low (so that n links spread evenly)."""
    for d in range(max(1, low), n + 1):
        if n % d == 0:
            return d
    return n


def clos_shape(p: ClosParams) -> dict[str, int]:
    """How many of everything (no arrays yet), or FabricError naming what does not fit."""
    p.check()
    planes = p.gpus_per_server if p.rail else 1
    per_plane = p.servers if p.rail else p.gpus
    down, up = p.leaf_ports
    leaves = math.ceil(per_plane / down)
    if p.tiers == 2:
        if leaves > p.radix:
            most = p.radix * down * planes
            raise FabricError(
                f"--gpus {p.gpus}: {leaves} leaves per plane, more than a "
                f"spine's {p.radix} ports: 2 tiers reach {most} GPUs; use "
                "--tiers 3"
            )
        aggs = _divisor_at_least(up, math.ceil(leaves * up / p.radix))
        pods, per_pod, agg_up, cores = 1, leaves, 0, 0
    else:
        aggs = up  # one link from every leaf to every agg of its pod
        agg_down = p.radix // 2  # aggs not oversubscribed: half down, half up
        per_pod = min(leaves, agg_down)
        pods = math.ceil(leaves / per_pod)
        agg_up = p.radix - per_pod
        if pods > p.radix:
            most = p.radix * agg_down * down * planes
            raise FabricError(
                f"--gpus {p.gpus}: {pods} pods per plane, more than a core's "
                f"{p.radix} ports: 3 tiers of radix {p.radix} reach {most} GPUs"
            )
        cores = _divisor_at_least(agg_up, math.ceil(pods * agg_up / p.radix))
    n = p.gpus
    shape = {
        "planes": planes,
        "per_plane": per_plane,
        "leaves": leaves,
        "down": down,
        "up": up,
        "pods": pods,
        "per_pod": per_pod,
        "aggs": aggs,
        "agg_up": agg_up,
        "cores": cores,
    }
    n_leaf_up = planes * leaves * up
    n_agg_up = planes * pods * aggs * agg_up if p.tiers == 3 else 0
    shape.update(
        b_scaleup_out=0,
        b_scaleup_in=n,
        b_nic_up=2 * n,
        b_nic_down=3 * n,
        b_leaf_up=4 * n,
        b_leaf_down=4 * n + n_leaf_up,
        b_agg_up=4 * n + 2 * n_leaf_up,
        b_agg_down=4 * n + 2 * n_leaf_up + n_agg_up,
        n_links=4 * n + 2 * n_leaf_up + 2 * n_agg_up,
    )
    # switch node ids: leaves, then aggs (spines), then cores, then scale-up switches
    shape["leaf_node"] = n
    shape["agg_node"] = n + planes * leaves
    shape["core_node"] = shape["agg_node"] + planes * pods * aggs
    shape["su_node"] = shape["core_node"] + planes * aggs * cores
    shape["n_switches"] = shape["su_node"] - n
    shape["n_nodes"] = shape["su_node"] + p.servers
    return shape


def estimate_bytes(p: ClosParams) -> int:
    """Memory the fabric's arrays take, before allocating them (the arrays, their build's
    temporaries (about as much again) and the addresses)."""
    s = clos_shape(p)
    return 2 * s["n_links"] * BYTES_PER_LINK + p.gpus * 16


def available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def gpu_addresses(servers: int, g: int) -> np.ndarray:
    """NIC addresses, 10.<nic + 1>.<server // 250>.<server % 250 + 1> (never .0, .254 (the
    gateway the hosts' neighbour entries use), .255)."""
    s = np.repeat(np.arange(servers, dtype=np.uint32), g)
    nic = np.tile(np.arange(g, dtype=np.uint32), servers)
    return ((10 << 24) | ((nic + 1) << 16) | ((s // 250) << 8) | (s % 250 + 1)).astype(np.uint32)


def build_clos(p: ClosParams) -> Fabric:
    s = clos_shape(p)
    need = estimate_bytes(p)
    limit = p.memory_limit if p.memory_limit is not None else int(0.8 * available_bytes())
    if need > limit:
        raise FabricError(
            f"--gpus {p.gpus}: the fabric's arrays need about {need / 2**30:.1f} "
            f"GiB, more than the {limit / 2**30:.1f} GiB this machine has free; "
            "fewer --gpus"
        )
    n, g = p.gpus, p.gpus_per_server
    src = np.empty(s["n_links"], dtype=np.int32)
    dst = np.empty(s["n_links"], dtype=np.int32)
    cap = np.empty(s["n_links"], dtype=np.float64)
    kind = np.empty(s["n_links"], dtype=np.uint8)
    gpu = np.arange(n, dtype=np.int32)
    su = (s["su_node"] + gpu // g).astype(np.int32)
    leaf = (s["leaf_node"] + leaf_of_gpu(s, p, gpu)).astype(np.int32)

    def put(base: int, a: np.ndarray, b: np.ndarray, bps: float, k: int) -> None:
        src[base : base + len(a)], dst[base : base + len(a)] = a, b
        cap[base : base + len(a)], kind[base : base + len(a)] = bps, k

    half_su = p.scaleup_gbytes * 8e9 / 2
    put(s["b_scaleup_out"], gpu, su, half_su, SCALEUP)
    put(s["b_scaleup_in"], su, gpu, half_su, SCALEUP)
    put(s["b_nic_up"], gpu, leaf, p.nic_gbps * 1e9, NIC_UP)
    put(s["b_nic_down"], leaf, gpu, p.nic_gbps * 1e9, NIC_DOWN)
    # leaf (plane, l) uplink k -> agg k % aggs of the leaf's pod
    planes, leaves, up, aggs = s["planes"], s["leaves"], s["up"], s["aggs"]
    li = np.arange(planes * leaves * up, dtype=np.int64)
    pl, rest = np.divmod(li, leaves * up)
    lf, k = np.divmod(rest, up)
    leaf_node = s["leaf_node"] + pl * leaves + lf
    agg_node = s["agg_node"] + (pl * s["pods"] + lf // s["per_pod"]) * aggs + k % aggs
    put(
        s["b_leaf_up"],
        leaf_node.astype(np.int32),
        agg_node.astype(np.int32),
        p.port_gbps * 1e9,
        LEAF_UP,
    )
    put(
        s["b_leaf_down"],
        agg_node.astype(np.int32),
        leaf_node.astype(np.int32),
        p.port_gbps * 1e9,
        LEAF_DOWN,
    )
    if p.tiers == 3:
        # agg (plane, pod, a) uplink k -> core (plane, a, k % cores)
        au, cores = s["agg_up"], s["cores"]
        ai = np.arange(planes * s["pods"] * aggs * au, dtype=np.int64)
        agg_flat, k2 = np.divmod(ai, au)
        pl2 = agg_flat // (s["pods"] * aggs)
        a = agg_flat % aggs
        anode = s["agg_node"] + agg_flat
        cnode = s["core_node"] + (pl2 * aggs + a) * cores + k2 % cores
        put(
            s["b_agg_up"], anode.astype(np.int32), cnode.astype(np.int32), p.port_gbps * 1e9, AGG_UP
        )
        put(
            s["b_agg_down"],
            cnode.astype(np.int32),
            anode.astype(np.int32),
            p.port_gbps * 1e9,
            AGG_DOWN,
        )
    kind_name = "rail" if p.rail else "clos"
    fab = Fabric(
        name=f"{kind_name}{p.tiers}-{p.gpus}",
        n_gpus=n,
        gpus_per_server=g,
        link_src=src,
        link_dst=dst,
        link_cap=cap,
        link_kind=kind,
        n_nodes=s["n_nodes"],
        gpu_ip=gpu_addresses(p.servers, g),
        params=p,
        shape=s,
    )
    fab.switch_names = clos_switch_names(s)
    return fab


def leaf_of_gpu(s: dict[str, int], p: ClosParams, gpu: np.ndarray) -> np.ndarray:
    """The leaf (index over all planes) each GPU's NIC hangs off."""
    g = p.gpus_per_server
    if p.rail:
        server, plane = np.divmod(gpu, g)
        return plane * s["leaves"] + server // s["down"]
    return gpu // s["down"]


def leaf_port_of_gpu(s: dict[str, int], p: ClosParams, gpu: np.ndarray) -> np.ndarray:
    pos = gpu // p.gpus_per_server if p.rail else gpu
    return pos % s["down"]


def clos_switch_names(s: dict[str, int]) -> list[str]:
    """p<plane>l<leaf>, p<plane>a<agg> (or s<spine>), p<plane>c<core>, 1-based; short enough
    for the topology format's 10 characters up to 131k GPUs."""
    names = [f"p{pl + 1}l{lf + 1}" for pl in range(s["planes"]) for lf in range(s["leaves"])]
    two = s["cores"] == 0
    for pl in range(s["planes"]):
        for pod in range(s["pods"]):
            for a in range(s["aggs"]):
                names.append(f"p{pl + 1}s{a + 1}" if two else f"p{pl + 1}d{pod + 1}a{a + 1}")
    for pl in range(s["planes"]):
        for a in range(s["aggs"]):
            for c in range(s["cores"]):
                names.append(f"p{pl + 1}c{a * s['cores'] + c + 1}")
    return names


# ---- failures -------------------------------------------------------------------------------


def _element_links(fab: Fabric, el: str, option: str) -> tuple[np.ndarray, str]:
    """The links of one named element, both directions, and what it is: a topology's link by
    one of its ends (`leaf1:3`, on a fabric `from_spec`), the cables between two switches
    (`p1l3-p1s2`), a GPU's NIC link (`h5g2`) or a switch (`p1s3`: its links but its NICs')."""
    index = {name: fab.n_gpus + i for i, name in enumerate(fab.switch_names)}
    touches_nic = (fab.link_kind == NIC_UP) | (fab.link_kind == NIC_DOWN)
    if ":" in el and fab.end_names is not None:
        if el not in fab.end_names:
            raise FabricError(f"{option} {el}: no link of {fab.name} has that end")
        i = fab.end_names.index(el)
        hit = np.zeros(fab.n_links, dtype=bool)
        hit[[i - i % 2, i - i % 2 + 1]] = True  # a cable's two directions, side by side
        return hit, "nic" if touches_nic[hit].any() else "cable"
    if "-" in el:
        a_name, b_name = el.split("-", 1)
        a, b = index.get(a_name), index.get(b_name)
        if a is None or b is None:
            raise FabricError(f"{option} {el}: a cable is SWITCH-SWITCH, both named in {fab.name}")
        hit = ((fab.link_src == a) & (fab.link_dst == b)) | (
            (fab.link_src == b) & (fab.link_dst == a)
        )
        if not hit.any():
            raise FabricError(f"{option} {el}: no cable between {a_name} and {b_name}")
        return hit, "cable"
    gpu = _GPU_NAME.fullmatch(el)
    if gpu is not None:
        g = (int(gpu.group(1)) - 1) * fab.gpus_per_server + int(gpu.group(2))
        if not 0 <= g < fab.n_gpus or int(gpu.group(2)) >= fab.gpus_per_server:
            raise FabricError(f"{option} {el}: no such GPU in {fab.name}")
        return ((fab.link_src == g) | (fab.link_dst == g)) & touches_nic, "nic"
    n = index.get(el)
    if n is None:
        some = ", ".join(fab.switch_names[:: max(1, len(fab.switch_names) // 4)][:4])
        raise FabricError(f"{option} {el}: no switch of that name in {fab.name} (e.g. {some})")
    leaves = set(fab.link_dst[fab.link_kind == NIC_UP].tolist())
    kind = "leaf" if n in leaves else "switch"
    return ((fab.link_src == n) | (fab.link_dst == n)) & ~touches_nic, kind


_GPU_NAME = re.compile(r"h(\d+)g(\d+)")


def fail(fab: Fabric, elements: Sequence[str]) -> Fabric:
    """The fabric with `elements` down: a switch by name (`p1s3`, `p2d1a4`, `p1c5`, or a
    topology's `spine1`), every cable between two switches (`p1l3-p1s2`), or on a
    topology's fabric (`from_spec`) a link by one of its ends (`leaf1:3`, as `--faults`
    names it). Their links stay in the arrays (ids and capacities unchanged) and are marked
    `down`: routing leaves them out as the controller's fail-over does (shortest paths over
    what is alive, ECMP over the live next hops in port order). A leaf or a NIC's link cannot
    fail here: it would cut off NICs, which no re-route can help (the hosts' side is not
    modelled)."""
    down = np.zeros(fab.n_links, dtype=bool) if fab.down is None else fab.down.copy()
    for el in elements:
        hit, kind = _element_links(fab, el, "--fail")
        if kind in ("leaf", "nic"):
            what = "a leaf" if kind == "leaf" else "a host's link"
            raise FabricError(
                f"--fail {el}: {what}; its NICs would be cut off, which no re-route helps "
                "(fail a spine, aggregation or core switch, or a cable between switches)"
            )
        down |= hit
    return replace(fab, down=down, failed=fab.failed + tuple(elements))


def _cut(
    fab: Fabric, cuts: Mapping[str, float], option: str, ends: Callable[[str], np.ndarray]
) -> np.ndarray:
    """Per link, the product of the fractions `cuts` ({element: fraction}) put on it; a
    topology's link named by one of its ends acts in the directions `ends(end)` selects."""
    factor = np.ones(fab.n_links)
    for el, frac in cuts.items():
        if not 0 < frac <= 1:
            raise FabricError(f"{option} {el}={frac:g}: a fraction of the rate in (0, 1]")
        hit, kind = _element_links(fab, el, option)
        if kind in ("leaf", "switch"):
            raise FabricError(f"{option} {el}: a switch; name a cable or a NIC's link")
        if ":" in el and fab.end_names is not None:
            hit &= ends(el)
        factor[hit] *= frac
    return factor


def slow(fab: Fabric, cuts: Mapping[str, float]) -> Fabric:
    """The fabric with links at a fraction of their rate: `{element: fraction}`, an element
    a cable between switches (`p1l3-p1s2`, both directions), a GPU's NIC link (`h5g2`, both
    directions) or on a topology's fabric a link by one of its ends as the packet engines'
    faults name it (`leaf1:3`: what its switch ports send; `h3:0`: what that NIC sends); a
    gray failure the routes do not see (the controller routes around what is down, not what
    is slow)."""
    by_host = fab.link_src < fab.n_gpus

    def sending(el: str) -> np.ndarray:
        # as the packet engines' faults act: a link's switch ports (a host's NIC has no
        # traffic manager), or, named by a host's end, that NIC's sending
        i = (fab.end_names or []).index(el)
        return np.arange(fab.n_links) == i if by_host[i] else ~by_host

    factor = _cut(fab, cuts, "--slow", sending)
    return replace(
        fab,
        link_cap=fab.link_cap * factor,
        queue_cap=None if fab.queue_cap is None else fab.queue_cap * factor,
        slowed=fab.slowed + tuple(cuts.items()),
    )


def lose(fab: Fabric, goodput: Mapping[str, float]) -> Fabric:
    """The fabric with lossy links carrying `{element: goodput}` of their rate as goodput (what
    the transport keeps through a link that loses frames: `testbed.flow.lossfit`). An element
    as `slow` names it; on a topology's fabric a link by one of its ends (`leaf1:3`, as
    `--faults` names it) loses what its switch ends receive, as the packet engines' loss
    fault does: a host's link what the NIC sends, a link between switches both directions.
    The queues see the rates before the cut (`queue_cap`): a lossy link's sender keeps
    sending at its rate, resends included, so no switch's queue holds its flows for it."""
    received = fab.link_dst >= fab.n_gpus  # what a switch port receives
    factor = _cut(fab, goodput, "--loss", lambda el: received)
    return replace(
        fab,
        link_cap=fab.link_cap * factor,
        queue_cap=fab.link_cap if fab.queue_cap is None else fab.queue_cap,
        lossy=fab.lossy + tuple(goodput.items()),
    )


# ---- what it is -----------------------------------------------------------------------------


def summary(fab: Fabric) -> dict[str, float]:
    """Switches, cables (both directions of one count once), and bisection bandwidth: half
    the GPUs sending to the other half, bounded at each tier by the capacity going up
    (NICs, leaf uplinks, agg uplinks), in one direction."""
    kinds = np.bincount(fab.link_kind, minlength=len(KIND_NAMES))
    caps = np.bincount(fab.link_kind, weights=fab.link_cap, minlength=len(KIND_NAMES))
    up = [caps[NIC_UP], caps[LEAF_UP]] + ([caps[AGG_UP]] if kinds[AGG_UP] else [])
    return {
        "gpus": fab.n_gpus,
        "servers": fab.servers,
        "switches": len(fab.switch_names),
        "cables": int(kinds[NIC_UP] + kinds[LEAF_UP] + kinds[AGG_UP]),
        "nic_cables": int(kinds[NIC_UP]),
        "leaf_up_cables": int(kinds[LEAF_UP]),
        "agg_up_cables": int(kinds[AGG_UP]),
        "scaleup_links": int(kinds[SCALEUP]),
        "directed_links": fab.n_links,
        "bisection_bps": float(min(up)) / 2,
        "array_bytes": int(
            sum(a.nbytes for a in (fab.link_src, fab.link_dst, fab.link_cap, fab.link_kind))
        ),
    }


def describe(fab: Fabric) -> str:
    s = summary(fab)
    p = fab.params
    head = fab.name
    if p is not None:
        sh = fab.shape
        head += (
            f": {p.gpus} GPUs in {p.servers} servers of {p.gpus_per_server}, "
            f"{'rail-optimized, ' + str(sh['planes']) + ' planes' if p.rail else 'plain'} "
            f"{p.tiers}-tier Clos of {p.switch_tbps:g}T switches ({p.radix} x "
            f"{p.port_gbps:g}G), leaves {sh['down']} down / {sh['up']} up "
            f"(oversubscription {p.oversub:g}:1)"
        )
    lines = [
        head,
        f"  switches        {s['switches']:>10,}",
        f"  cables          {s['cables']:>10,}  (NIC {s['nic_cables']:,}, leaf up "
        f"{s['leaf_up_cables']:,}, agg up {s['agg_up_cables']:,})",
        f"  directed links  {s['directed_links']:>10,}  (scale-up "
        f"{s['scaleup_links']:,}); arrays {s['array_bytes'] / 2**20:.1f} MiB",
        f"  bisection       {s['bisection_bps'] / 1e12:>10,.1f} Tb/s per direction "
        f"({s['bisection_bps'] / (fab.n_gpus / 2 * fab.nic_bps()):.0%} of the NICs')",
    ]
    if p is not None:
        sh = fab.shape
        lines.insert(
            2,
            f"    per plane: {sh['leaves']} leaves"
            + (
                f", {sh['aggs']} spines"
                if p.tiers == 2
                else f" in {sh['pods']} pods of {sh['per_pod']}, {sh['aggs']} aggs per pod,"
                f" {sh['aggs'] * sh['cores']} cores"
            ),
        )
    return "\n".join(lines)


# ---- to and from the packet engines' topology format --------------------------------------


def to_spec(fab: Fabric) -> FabricSpec:
    """A built Clos as a testbed.topo spec (the packet engines' YAML): servers are hosts
    with one NIC per GPU; the scale-up domain is left out (the topology format has no
    scale-up links)."""
    p = fab.params
    if p is None:
        raise FabricError("only a Clos built here exports (this one came from a topology)")
    if fab.n_gpus > MAX_EXPORT_GPUS:
        raise FabricError(
            f"--gpus {fab.n_gpus}: the packet engines take at most "
            f"{MAX_EXPORT_GPUS} GPUs; export a smaller fabric"
        )
    s, g = fab.shape, fab.gpus_per_server
    switches = tuple(
        SwitchSpec(nm, i + 1, i + 1, f"02:00:00:{(i + 1) >> 8 & 0xFF:02x}:fe:{(i + 1) & 0xFF:02x}")
        for i, nm in enumerate(fab.switch_names)
    )
    hosts = []
    for sv in range(p.servers):
        nics = []
        for k in range(g):
            ip = int(fab.gpu_ip[sv * g + k])
            a = ip.to_bytes(4, "big")
            nics.append(NicSpec(".".join(map(str, a)), "02:00:" + ":".join(f"{b:02x}" for b in a)))
        hosts.append(HostSpec(f"h{sv + 1}", tuple(nics)))
    links: list[LinkSpec] = []
    names = fab.switch_names
    gpus = np.arange(fab.n_gpus)
    lp = leaf_port_of_gpu(s, p, gpus)
    lf = leaf_of_gpu(s, p, gpus)
    for gp in range(fab.n_gpus):
        sv, k = divmod(gp, g)
        links.append(
            LinkSpec(
                End(f"h{sv + 1}", k),
                End(names[int(lf[gp])], int(lp[gp]) + 1),
                gbps=p.nic_gbps if p.nic_gbps != p.port_gbps else None,
            )
        )
    base = s["b_leaf_up"]
    for i in range(s["planes"] * s["leaves"] * s["up"]):
        leaf, k = divmod(i, s["up"])
        a_node = int(fab.link_dst[base + i]) - fab.n_gpus
        lf_in_pod = (leaf % s["leaves"]) % s["per_pod"]
        mu = s["up"] // s["aggs"]
        links.append(
            LinkSpec(
                End(names[leaf], s["down"] + k + 1),
                End(names[a_node], lf_in_pod * mu + k // s["aggs"] + 1),
            )
        )
    if p.tiers == 3:
        base = s["b_agg_up"]
        mc = s["agg_up"] // s["cores"]
        for i in range(s["planes"] * s["pods"] * s["aggs"] * s["agg_up"]):
            agg, k2 = divmod(i, s["agg_up"])
            pod = (agg // s["aggs"]) % s["pods"]
            c_node = int(fab.link_dst[base + i]) - fab.n_gpus
            a_node = int(fab.link_src[base + i]) - fab.n_gpus
            links.append(
                LinkSpec(
                    End(names[a_node], s["per_pod"] + k2 + 1),
                    End(names[c_node], pod * mc + k2 // s["cores"] + 1),
                )
            )
    return FabricSpec(fab.name.replace("-", "_")[:40], switches, tuple(hosts), tuple(links))


def from_spec(spec: FabricSpec, port_gbps: float = 400.0) -> Fabric:
    """A topology of the packet engines (leafspine, rail, a YAML file) as arrays, routed by
    search (`routing.route`). Every host's NICs are its GPUs; no scale-up links (the
    packet engines model none). Links at their own speed where the spec gives one."""
    nics_per_host = {len(h.nics) for h in spec.hosts}
    if len(nics_per_host) != 1:
        raise FabricError(f"{spec.name}: hosts with different NIC counts {sorted(nics_per_host)}")
    g = nics_per_host.pop()
    gpu_of = {(h.name, k): i * g + k for i, h in enumerate(spec.hosts) for k in range(g)}
    sw_of = {s.name: len(gpu_of) + i for i, s in enumerate(spec.switches)}
    src, dst, cap, kind, names = [], [], [], [], []

    def node(e: End) -> int:
        return gpu_of[(e.node, e.index)] if (e.node, e.index) in gpu_of else sw_of[e.node]

    for lk in spec.links:
        bps = (lk.gbps or port_gbps) * 1e9
        # switch to switch: the first direction counts as "up" (a cable counts once)
        for (a, b), up in (((lk.a, lk.b), LEAF_UP), ((lk.b, lk.a), LEAF_DOWN)):
            src.append(node(a))
            dst.append(node(b))
            cap.append(bps)
            host_a, host_b = (a.node, a.index) in gpu_of, (b.node, b.index) in gpu_of
            kind.append(NIC_UP if host_a else NIC_DOWN if host_b else up)
            names.append(str(a))
    ips = np.array(
        [
            int.from_bytes(bytes(map(int, n.ip.split("."))), "big")
            for h in spec.hosts
            for n in h.nics
        ],
        dtype=np.uint32,
    )
    return Fabric(
        name=spec.name,
        n_gpus=len(gpu_of),
        gpus_per_server=g,
        link_src=np.array(src, dtype=np.int32),
        link_dst=np.array(dst, dtype=np.int32),
        link_cap=np.array(cap, dtype=np.float64),
        link_kind=np.array(kind, dtype=np.uint8),
        n_nodes=len(gpu_of) + len(sw_of),
        gpu_ip=ips,
        end_names=names,
        switch_names=[s.name for s in spec.switches],
        has_scaleup=False,
    )
