"""Flows' paths through a fabric: per-flow ECMP with the switches' own hash, or per-packet
spraying.

The P4 program's ECMP (p4src/control/routing.p4, `next_hops`) picks a group member with an
action selector over (IPv4 src, IPv4 dst, protocol, L4 sport, L4 dport), in that order; the
selector's algorithm is CRC-16 (`ECMP_SELECTOR` in p4src/include/arch/v1model.p4; p4c's
bmv2 JSON says `"algo": "crc16"`), and the built-in switch takes member `hash % group size`
(testbed/switch/tables.py, weights of 1). Every switch hashes the same fields with the same
function and no per-switch seed, so one flow has one hash on its whole path: `ecmp_hash`
computes it for many flows at once, with the table of testbed.switch.hashes.crc16 itself.
RoCEv2 packets are UDP to port 4791; the sport is the queue pair's entropy (the transport
draws it from 49152-65535).

Which member a hash picks depends on the order of the group's members. Here members are in
the order of their links (a leaf's uplinks by port); the controller numbers its members in
its own allocation order, which on the packet engines' leaf-spines is the same (with the
job's own ports, `collectives.job_ports`, each leaf uplink carries what the twin's counters
count: tests/test_flow_twin.py).

Paths are sparse rows (`Routes`: CSR over flows, with a coefficient per link: 1 for a flow
on its one path, 1/k per link when spraying splits it over k).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from controller.ecmp import digit_bases
from controller.wire.roce import ROCE_UDP_PORT
from testbed.flow.fabric import NIC_UP, SCALEUP, Fabric
from testbed.switch.hashes import get_hash

ECMP_ALGO = "crc16"  # the selector's, p4src/include/arch/v1model.p4 (checked by a test)
IP_PROTO_UDP = 17
# the switches' own function, applied to one byte from a zero remainder, is its table
_CRC = get_hash(ECMP_ALGO)
CRC16_TABLE = np.array([_CRC(bytes([b])) for b in range(256)], dtype=np.uint32)


def ecmp_hash(
    src_ip: np.ndarray,
    dst_ip: np.ndarray,
    sport: np.ndarray,
    dport: int = ROCE_UDP_PORT,
    proto: int = IP_PROTO_UDP,
) -> np.ndarray:
    """CRC-16/ARC of the selector's 13 bytes, big-endian as bmv2 packs fields, per flow."""
    n = len(src_ip)
    cols = [
        (src_ip >> 24) & 0xFF,
        (src_ip >> 16) & 0xFF,
        (src_ip >> 8) & 0xFF,
        src_ip & 0xFF,
        (dst_ip >> 24) & 0xFF,
        (dst_ip >> 16) & 0xFF,
        (dst_ip >> 8) & 0xFF,
        dst_ip & 0xFF,
        np.full(n, proto),
        (sport >> 8) & 0xFF,
        sport & 0xFF,
        np.full(n, dport >> 8),
        np.full(n, dport & 0xFF),
    ]
    rem = np.zeros(n, dtype=np.uint32)
    for c in cols:
        rem = CRC16_TABLE[(rem ^ np.asarray(c, dtype=np.uint32)) & 0xFF] ^ (rem >> 8)
    return rem


def entropy_ports(
    src: np.ndarray, dst: np.ndarray, channel: np.ndarray | int = 0, seed: int = 1
) -> np.ndarray:
    """A source port per (src, dst, channel) queue pair, in the transport's range
    49152-65535: a deterministic mix (the twin's LCG per host cannot be replayed without its
    jobs' queue pair order; the ports' spread is what matters to ECMP)."""
    x = (
        np.asarray(src, dtype=np.uint64) * np.uint64(0x9E3779B1)
        + np.asarray(dst, dtype=np.uint64) * np.uint64(0x85EBCA77)
        + np.asarray(channel, dtype=np.uint64) * np.uint64(0xC2B2AE3D)
        + np.uint64(seed) * np.uint64(0x27D4EB2F)
    )
    x ^= x >> np.uint64(15)
    x *= np.uint64(0x2C1B3C6D)
    x ^= x >> np.uint64(12)
    return (49152 + (x >> np.uint64(16)) % np.uint64(16384)).astype(np.uint32)


@dataclass
class Routes:
    """Flow f crosses links[indptr[f]:indptr[f+1]], carrying coeff x its rate on each."""

    indptr: np.ndarray
    links: np.ndarray
    coeff: np.ndarray
    # every ECMP choice made: the group (switch and, going down, the next switch), the link
    # taken and the group's size (for counting collisions)
    choice_group: np.ndarray
    choice_link: np.ndarray
    choice_size: np.ndarray
    _incidence: tuple[np.ndarray, np.ndarray] | None = field(
        default=None, repr=False, compare=False
    )

    @property
    def n_flows(self) -> int:
        return len(self.indptr) - 1

    def flow_of_entry(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_flows), np.diff(self.indptr))

    def incidence(self) -> tuple[np.ndarray, np.ndarray]:
        """The flow of every entry, and the entries in link order (stable: a link's in flow
        order); made once, for the rates' allocations at every completion."""
        if self._incidence is None:
            self._incidence = (self.flow_of_entry(), np.argsort(self.links, kind="stable"))
        return self._incidence

    def path(self, f: int) -> list[int]:
        return [int(x) for x in self.links[self.indptr[f] : self.indptr[f + 1]]]

    def link_flows(self, n_links: int) -> np.ndarray:
        """Flows on each link."""
        return np.bincount(self.links, minlength=n_links)


def collisions(r: Routes) -> dict[str, int]:
    """Flows sharing a link beyond what a perfect spread would give: per ECMP group (a
    switch's uplinks, or the parallel links from a switch to the next one down) with F flows
    over k links, a link carries at most ceil(F / k) in a perfect spread; `excess` sums
    what the links carry above that, `worst` is the most flows one of them carries."""
    if len(r.choice_link) == 0:
        return {"decisions": 0, "groups": 0, "excess": 0, "worst": 0, "worst_perfect": 0}
    groups, inv = np.unique(r.choice_group, return_inverse=True)
    per_group = np.bincount(inv)
    size = np.zeros(len(groups), dtype=np.int64)
    size[inv] = r.choice_size
    perfect = -(-per_group // size)
    links, linv = np.unique(r.choice_link, return_inverse=True)
    on_link = np.bincount(linv)
    link_group = np.zeros(len(links), dtype=np.int64)
    link_group[linv] = inv
    over = on_link - perfect[link_group]
    worst = int(on_link.argmax())
    return {
        "decisions": len(r.choice_link),
        "groups": len(groups),
        "excess": int(over[over > 0].sum()),
        "worst": int(on_link[worst]),
        "worst_perfect": int(perfect[link_group[worst]]),
    }


def route(
    fab: Fabric, src: np.ndarray, dst: np.ndarray, sport: np.ndarray, spray: bool = False
) -> Routes:
    """Paths from GPU src to GPU dst (arrays), hashed with each flow's sport. A Clos built
    here is routed by arithmetic (any size); a topology from a spec, or spraying, by search
    (small fabrics)."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    h = ecmp_hash(fab.gpu_ip[src], fab.gpu_ip[dst], np.asarray(sport, dtype=np.uint32))
    if fab.structured:
        if spray:
            return _spray_clos(fab, src, dst)
        return _route_clos(fab, src, dst, h.astype(np.int64))
    return _route_search(fab, src, dst, h, spray)


# ---- a Clos built here: arithmetic ------------------------------------------------------------


def _nth(ok: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ECMP over live members: per row of `ok` (flows x members, True where the member is
    on a shortest live path), member number h % (live members) among the live ones, in
    member (port) order; and the live count. With every member live it is h % members."""
    count = ok.sum(axis=1)
    pick = h % np.maximum(count, 1)
    return np.argmax(np.cumsum(ok, axis=1) > pick[:, None], axis=1), count


def _pick(h: np.ndarray, size: int, live: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """An ECMP choice among `size` members: h % size, or with links down among the live
    ones (`live`: flows x members); and how many there were."""
    if live is None:
        return h % size, np.full(len(h), size)
    return _nth(live, h)


class NoPathError(ValueError):
    """A flow with no shortest path left under the fabric's failures."""


@dataclass
class _Ends:
    """Where a Clos's flows start and end: the scale-up hop (same server, or PXN to the
    destination's rail), and for the flows that enter the network (`rows`) their leaves,
    pods and plane."""

    via_su: np.ndarray  # flows that take the scale-up domain first
    su_dst: np.ndarray  # the GPU they reach there
    rows: np.ndarray  # flows that enter the network
    a: np.ndarray  # (rows) the GPU whose NIC sends, and the one whose NIC receives
    b: np.ndarray
    la: np.ndarray  # their leaves (over all planes)
    lb: np.ndarray
    plane: np.ndarray
    cross: np.ndarray  # leaving the leaf
    far: np.ndarray  # leaving the pod
    base_a: np.ndarray  # the first aggregation switch of the source's and destination's pod
    base_b: np.ndarray


def _clos_ends(fab: Fabric, src: np.ndarray, dst: np.ndarray) -> _Ends:
    p, s = fab.params, fab.shape
    assert p is not None
    g = fab.gpus_per_server
    same_server = src // g == dst // g
    # scale-up: same server; or a hop to the GPU on the destination's rail (PXN), since
    # the planes of a rail-optimized fabric are joined only inside the servers
    relay = (src // g) * g + dst % g if p.rail else src.copy()
    via_su = same_server | (relay != src)
    net = ~same_server
    a, b = relay[net], dst[net]
    leaves, per_pod = s["leaves"], s["per_pod"]
    if p.rail:
        la = (a % g) * leaves + (a // g) // s["down"]
        lb = (b % g) * leaves + (b // g) // s["down"]
    else:
        la, lb = a // s["down"], b // s["down"]
    pod_a, pod_b = (la % leaves) // per_pod, (lb % leaves) // per_pod
    plane = la // leaves
    return _Ends(
        via_su,
        np.where(same_server, dst, relay),
        np.flatnonzero(net),
        a,
        b,
        la,
        lb,
        plane,
        la != lb,
        (la != lb) & (pod_a != pod_b),
        (plane * s["pods"] + pod_a) * s["aggs"],
        (plane * s["pods"] + pod_b) * s["aggs"],
    )


def _dead(fab: Fabric) -> np.ndarray | None:
    return fab.down if fab.down is not None and fab.down.any() else None


def _leaf_ok(fab: Fabric, e: _Ends, live: _Live, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """(network flows, leaf uplinks): the uplinks on a shortest live path (to an aggregation
    switch that still reaches the destination's leaf: directly, or over a core between
    pods); refuses a leaving flow with none."""
    s = fab.shape
    up, aggs = s["up"], s["aggs"]
    ks = np.arange(up)
    ok = ~live.dead[s["b_leaf_up"] + e.la[:, None] * up + ks]
    ok &= live.agg_to_leaf[e.lb][:, ks % aggs]
    if e.far.any():
        ok[e.far] &= live.pods_joined(e.base_a[e.far], e.base_b[e.far])[:, ks % aggs]
    stuck = e.cross & ~ok.any(axis=1)
    if stuck.any():
        f = int(e.rows[np.flatnonzero(stuck)[0]])
        raise NoPathError(
            f"GPU {src[f]} -> GPU {dst[f]}: no up-down path left with "
            f"{', '.join(fab.failed)} down (the controller would take a longer one, if "
            "any: the flow engine routes a Clos over shortest up-down paths only)"
        )
    return ok


def _core_ok(fab: Fabric, live: _Live, agg_a: np.ndarray, agg_b: np.ndarray) -> np.ndarray:
    """(flows, ..., agg uplinks): aggregation switch agg_a's uplinks to a core that still
    reaches agg_b (arrays of one shape)."""
    s = fab.shape
    au = s["agg_up"]
    k2 = np.arange(au)
    ok = ~live.dead[s["b_agg_up"] + agg_a[..., None] * au + k2]
    return ok & live.core_to_agg[agg_b][..., k2 % s["cores"]]


def _route_clos(fab: Fabric, src: np.ndarray, dst: np.ndarray, h: np.ndarray) -> Routes:
    """Up to the lowest tier the two ends share, then down. With links down (`fab.down`),
    each ECMP choice is over the members that still lie on a shortest path (the controller's
    fail-over recomputes shortest paths over what is alive): a leaf's uplink to an
    aggregation switch that still reaches the destination's leaf (over a core, between
    pods), an aggregation switch's uplink to a core that still reaches the destination's
    aggregation switch, and the live ones of parallel links. A flow whose shortest paths
    are all gone is refused (a longer path is what the search router would find: small
    fabrics)."""
    s = fab.shape
    n = len(src)
    paths = np.full((n, 8), -1, dtype=np.int64)
    groups: list[np.ndarray] = []
    chosen: list[np.ndarray] = []
    sizes: list[np.ndarray] = []
    e = _clos_ends(fab, src, dst)
    paths[e.via_su, 0] = s["b_scaleup_out"] + src[e.via_su]
    paths[e.via_su, 1] = s["b_scaleup_in"] + e.su_dst[e.via_su]
    rows, la, lb, cross, far, hh = e.rows, e.la, e.lb, e.cross, e.far, h[e.rows]
    paths[rows, 2] = s["b_nic_up"] + e.a
    paths[rows, 7] = s["b_nic_down"] + e.b
    up, aggs, au, cores = s["up"], s["aggs"], s["agg_up"], s["cores"]
    mu, mc = up // aggs, au // cores if cores else 1
    dead = _dead(fab)
    live = _Live(fab, dead) if dead is not None else None

    ok = None if live is None else _leaf_ok(fab, e, live, src, dst)
    k1, n_up = _pick(hh, up, ok)
    per_agg = None if ok is None else np.asarray(ok[cross].reshape(-1, mu, aggs).any(axis=1))
    ag = k1 % aggs
    up1 = s["b_leaf_up"] + la * up + k1
    paths[rows[cross], 3] = up1[cross]
    groups.append(
        _group_key(
            fab,
            (s["leaf_node"] + la)[cross],
            per_agg,
            aggs,
            lambda r, i: fab.link_dst[s["b_leaf_up"] + la[cross][r] * up + i],
        )
    )
    chosen.append(up1[cross])
    sizes.append(n_up[cross])
    # down from agg ag (of the destination's pod) to leaf lb: its parallel links
    par = s["b_leaf_down"] + (lb * up + ag)[:, None] + aggs * np.arange(mu)
    j, n_par = _pick(hh, mu, None if live is None else ~live.dead[par])
    down_link = s["b_leaf_down"] + lb * up + ag + aggs * j
    paths[rows[cross], 6] = down_link[cross]
    agg_b = s["agg_node"] + e.base_b + ag
    groups.append((agg_b * fab.n_nodes + s["leaf_node"] + lb)[cross])
    chosen.append(down_link[cross])
    sizes.append(n_par[cross])
    if far.any():
        agg_a_flat, agg_b_flat = (e.base_a + ag)[far], (e.base_b + ag)[far]
        hf = hh[far]
        ok2 = None if live is None else _core_ok(fab, live, agg_a_flat, agg_b_flat)
        # an aggregation switch's choice among cores reads the hash's next digit
        # (controller.ecmp): (hash // up) % its uplinks, the leaf's being hash % up
        k2, n_core = _pick(hf // up, au, ok2)
        per_core = None if ok2 is None else np.asarray(ok2.reshape(-1, mc, cores).any(axis=1))
        up2 = s["b_agg_up"] + agg_a_flat * au + k2
        paths[rows[far], 4] = up2
        groups.append(
            _group_key(
                fab,
                s["agg_node"] + agg_a_flat,
                per_core,
                cores,
                lambda r, i: fab.link_dst[s["b_agg_up"] + agg_a_flat[r] * au + i],
            )
        )
        chosen.append(up2)
        sizes.append(n_core)
        core = k2 % cores
        par2 = s["b_agg_down"] + (agg_b_flat * au + core)[:, None] + cores * np.arange(mc)
        m, n_par2 = _pick(hf, mc, None if live is None else ~live.dead[par2])
        down2 = s["b_agg_down"] + agg_b_flat * au + core + cores * m
        paths[rows[far], 5] = down2
        core_node = s["core_node"] + (e.plane[far] * aggs + ag[far]) * cores + core
        groups.append(core_node * fab.n_nodes + s["agg_node"] + agg_b_flat)
        chosen.append(down2)
        sizes.append(n_par2)
    mask = paths >= 0
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(mask.sum(axis=1), out=indptr[1:])
    links = paths[mask].astype(np.int64)
    # a choice among one member is no choice (the search records none either)
    grp, ch, sz = _cat(groups), _cat(chosen), _cat(sizes)
    keep = sz > 1
    return Routes(indptr, links, np.ones(len(links)), grp[keep], ch[keep], sz[keep])


SPRAY_BATCH = 2048  # pod-crossing flows sprayed at once (each a dense aggs x agg_up block)


def _spray_clos(fab: Fabric, src: np.ndarray, dst: np.ndarray) -> Routes:
    """Every flow split evenly at each switch over its next hops on shortest live paths
    (as the search sprays: a switch divides what reaches it), computed per tier with
    dense blocks instead of a walk: a leaf's uplinks, the parallel links down from each
    aggregation switch, and between pods each aggregation switch's uplinks and each core's
    parallel links down."""
    s = fab.shape
    e = _clos_ends(fab, src, dst)
    up, aggs, au, cores = s["up"], s["aggs"], s["agg_up"], s["cores"]
    mu = up // aggs
    dead = _dead(fab)
    live = _Live(fab, np.zeros(fab.n_links, dtype=bool) if dead is None else dead)
    flows: list[np.ndarray] = []
    links: list[np.ndarray] = []
    coeffs: list[np.ndarray] = []

    def put(f: np.ndarray, lk: np.ndarray, c: np.ndarray) -> None:
        keep = c > 0
        flows.append(np.broadcast_to(f, c.shape)[keep])
        links.append(np.broadcast_to(lk, c.shape)[keep])
        coeffs.append(c[keep])

    su = np.flatnonzero(e.via_su)
    put(su, s["b_scaleup_out"] + src[su], np.ones(len(su)))
    put(su, s["b_scaleup_in"] + e.su_dst[su], np.ones(len(su)))
    put(e.rows, s["b_nic_up"] + e.a, np.ones(len(e.rows)))
    ok = _leaf_ok(fab, e, live, src, dst)[e.cross]
    rows, la, lb = e.rows[e.cross], e.la[e.cross], e.lb[e.cross]
    w_up = ok / ok.sum(axis=1, keepdims=True)
    put(rows[:, None], s["b_leaf_up"] + la[:, None] * up + np.arange(up), w_up)
    w_agg = w_up.reshape(-1, mu, aggs).sum(axis=1)  # what reaches each aggregation switch
    far = e.far[e.cross]
    if far.any():
        for lo in range(0, int(far.sum()), SPRAY_BATCH):
            sel = np.flatnonzero(far)[lo : lo + SPRAY_BATCH]
            ags = np.arange(aggs)
            agg_a = e.base_a[e.cross][sel, None] + ags
            agg_b = e.base_b[e.cross][sel, None] + ags
            ok2 = _core_ok(fab, live, agg_a, agg_b)  # (flows, aggs, agg_up)
            w2 = ok2 * (w_agg[sel] / np.maximum(ok2.sum(axis=2), 1))[..., None]
            put(rows[sel, None, None], s["b_agg_up"] + agg_a[..., None] * au + np.arange(au), w2)
            w_core = w2.reshape(len(sel), aggs, -1, cores).sum(axis=2)  # into each core
            dn = s["b_agg_down"] + agg_b[..., None] * au + np.arange(au)
            par = (~live.dead[dn]).reshape(len(sel), aggs, -1, cores)
            w3 = par * (w_core / np.maximum(par.sum(axis=2), 1))[:, :, None, :]
            put(rows[sel, None, None], dn, w3.reshape(len(sel), aggs, au))
    dn = s["b_leaf_down"] + lb[:, None] * up + np.arange(up)
    par = (~live.dead[dn]).reshape(-1, mu, aggs)
    w_dn = par * (w_agg / np.maximum(par.sum(axis=1), 1))[:, None, :]
    put(rows[:, None], dn, w_dn.reshape(-1, up))
    put(e.rows, s["b_nic_down"] + e.b, np.ones(len(e.rows)))
    f_all = _cat(flows)
    order = np.argsort(f_all, kind="stable")  # each flow's links in path order
    indptr = np.zeros(len(src) + 1, dtype=np.int64)
    np.cumsum(np.bincount(f_all, minlength=len(src)), out=indptr[1:])
    none = np.zeros(0, dtype=np.int64)
    return Routes(indptr, _cat(links)[order], np.concatenate(coeffs)[order], none, none, none)


def _group_key(
    fab: Fabric,
    node: np.ndarray,
    per_next: np.ndarray | None,
    n_next: int,
    next_node: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> np.ndarray:
    """The search's key for an ECMP choice at switch `node`: the switch; or, where its live
    members all lead to one next switch (parallel links), the pair. `per_next` (flows x
    next switches): the next switches live members lead to (None: all `n_next`);
    `next_node(rows, i)`: the node of next switch i of those rows."""
    one = np.full(len(node), n_next == 1) if per_next is None else per_next.sum(axis=1) == 1
    key = node.astype(np.int64)
    if one.any():
        rows = np.flatnonzero(one)
        i = np.zeros(len(rows), dtype=np.int64) if per_next is None else per_next[rows].argmax(1)
        key[rows] = node[rows] * fab.n_nodes + next_node(rows, i)
    return key


class _Live:
    """What is still joined under a fabric's failures (`dead`: links down), per block:
    `agg_to_leaf[leaf, a]`: agg a of the leaf's pod has a live link down to it;
    `core_to_agg[agg, c]`: core c of the agg's group has a live link down to it;
    `agg_to_core[agg, c]`: the agg has a live link up to core c."""

    def __init__(self, fab: Fabric, dead: np.ndarray):
        self.dead = dead
        s = fab.shape
        up, aggs = s["up"], s["aggs"]
        n_leaves = s["planes"] * s["leaves"]
        blk = dead[s["b_leaf_down"] : s["b_leaf_down"] + n_leaves * up]
        self.agg_to_leaf = np.asarray((~blk).reshape(n_leaves, up // aggs, aggs).any(axis=1))
        if s["cores"]:
            au, cores = s["agg_up"], s["cores"]
            n_aggs = s["planes"] * s["pods"] * aggs
            shape = (n_aggs, au // cores, cores)
            up_blk = dead[s["b_agg_up"] : s["b_agg_up"] + n_aggs * au]
            dn_blk = dead[s["b_agg_down"] : s["b_agg_down"] + n_aggs * au]
            self.agg_to_core = np.asarray((~up_blk).reshape(shape).any(axis=1))
            self.core_to_agg = np.asarray((~dn_blk).reshape(shape).any(axis=1))
        self.aggs = aggs

    def pods_joined(self, base_a: np.ndarray, base_b: np.ndarray) -> np.ndarray:
        """(flows, aggs): agg a of the source pod (first agg `base_a`) reaches agg a of the
        destination pod over some core; computed once per pair of pods."""
        pairs, inv = np.unique(np.stack([base_a, base_b], axis=1), axis=0, return_inverse=True)
        ags = np.arange(self.aggs)
        joined = np.stack(
            [
                (self.agg_to_core[pa + ags] & self.core_to_agg[pb + ags]).any(axis=1)
                for pa, pb in pairs
            ]
        )
        return joined[inv.ravel()]


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


# ---- any fabric: search -------------------------------------------------------------------


class _Graph:
    """Out-links per node (in link order), and hop distances to a node, cached."""

    def __init__(self, fab: Fabric):
        self.fab = fab
        # links down (fab.down) are left out, as the controller's fail-over leaves them
        live = np.arange(fab.n_links) if fab.down is None else np.flatnonzero(~fab.down)
        src, dst = fab.link_src[live], fab.link_dst[live]
        self.out_ptr = np.zeros(fab.n_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=fab.n_nodes), out=self.out_ptr[1:])
        self.out_links = live[np.argsort(src, kind="stable")]
        self.in_ptr = np.zeros(fab.n_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=fab.n_nodes), out=self.in_ptr[1:])
        self.in_links = live[np.argsort(dst, kind="stable")]
        self._dist: dict[int, np.ndarray] = {}
        self._hops: dict[tuple[int, int], tuple[list[int], int | None]] = {}
        self.link_dst: list[int] = fab.link_dst.tolist()  # plain ints: read once per hop
        self.base = _digit_bases(fab)

    def outs(self, u: int) -> np.ndarray:
        return self.out_links[self.out_ptr[u] : self.out_ptr[u + 1]]

    def hop(self, u: int, target: int) -> tuple[list[int], int | None]:
        """The links out of `u` on a shortest path to `target` (in link order: the ECMP
        members), and their ECMP group when there is a choice: this switch and, where the
        members all lead to one next switch (parallel links), that one too. Cached: a
        fabric's flows share few (node, target) pairs, and an all-to-all of a thousand hosts
        asks a million flows' hops."""
        got = self._hops.get((u, target))
        if got is None:
            d = self.dist(target)
            outs = self.outs(u)
            nxt = self.fab.link_dst[outs]
            on = d[nxt] == d[u] - 1
            cand = [int(lk) for lk in outs[on]]
            key = None
            if len(cand) > 1:
                nodes = np.unique(nxt[on])
                key = u if len(nodes) > 1 else u * self.fab.n_nodes + int(nodes[0])
            got = self._hops[(u, target)] = (cand, key)
        return got

    def dist(self, target: int) -> np.ndarray:
        """Hops to `target` over the network: GPUs are endpoints (never crossed), and
        scale-up switches are not part of the network."""
        if target in self._dist:
            return self._dist[target]
        fab = self.fab
        d = np.full(fab.n_nodes, np.iinfo(np.int32).max, dtype=np.int64)
        d[target] = 0
        todo = deque([target])
        while todo:
            v = todo.popleft()
            if v < fab.n_gpus and v != target:
                continue
            for lk in self.in_links[self.in_ptr[v] : self.in_ptr[v + 1]]:
                if fab.link_kind[lk] == 0:  # scale-up
                    continue
                u = int(fab.link_src[lk])
                if d[u] > d[v] + 1:
                    d[u] = d[v] + 1
                    todo.append(u)
        self._dist[target] = d
        return d


def _digit_bases(fab: Fabric) -> list[int]:
    """Each node's digit of the ECMP hash (controller.ecmp, as the controller weights its
    groups): from every switch-to-switch link (up or down), the leaves being the switches
    the NICs hang off; 1 for GPUs and scale-up switches."""
    net = (fab.link_kind != SCALEUP) & (fab.link_src >= fab.n_gpus) & (fab.link_dst >= fab.n_gpus)
    adj: dict[int, list[int]] = {}
    for u, v in zip(fab.link_src[net].tolist(), fab.link_dst[net].tolist(), strict=True):
        adj.setdefault(u, []).append(v)
    edge = set(fab.link_dst[fab.link_kind == NIC_UP].tolist())
    for e in edge:
        adj.setdefault(e, [])
    base = [1] * fab.n_nodes
    for node, w in digit_bases(adj, edge).items():
        base[node] = w
    return base


def _route_search(
    fab: Fabric, src: np.ndarray, dst: np.ndarray, h: np.ndarray, spray: bool
) -> Routes:
    gr = _Graph(fab)
    g = fab.gpus_per_server
    rows_links: list[list[int]] = []
    rows_coeff: list[list[float]] = []
    groups: list[int] = []
    chosen: list[int] = []
    sizes: list[int] = []
    unreachable = np.iinfo(np.int32).max
    for f in range(len(src)):
        a, b, hv = int(src[f]), int(dst[f]), int(h[f])
        links: list[int] = []
        coeff: list[float] = []
        if a // g == b // g and fab.has_scaleup:
            rows_links.append(
                [_scaleup_link(fab, a, b, out=True), _scaleup_link(fab, a, b, out=False)]
            )
            rows_coeff.append([1.0, 1.0])
            continue
        d = gr.dist(b)
        if d[a] == unreachable and fab.has_scaleup:
            relay = (a // g) * g + b % g  # PXN: over scale-up to the destination's rail
            links += [
                _scaleup_link(fab, a, relay, out=True),
                _scaleup_link(fab, a, relay, out=False),
            ]
            coeff += [1.0, 1.0]
            a = relay
        if d[a] == unreachable:
            raise ValueError(f"no path from GPU {a} to GPU {b} in {fab.name}")
        if spray:
            frac = {a: 1.0}
            layer = [a]
            while layer:
                nxt: dict[int, float] = {}
                for u in layer:
                    if u == b:
                        continue
                    cand = [lk for lk in gr.outs(u) if d[fab.link_dst[lk]] == d[u] - 1]
                    for lk in cand:
                        share = frac[u] / len(cand)
                        links.append(int(lk))
                        coeff.append(share)
                        v = int(fab.link_dst[lk])
                        nxt[v] = nxt.get(v, 0.0) + share
                frac = nxt
                layer = list(nxt)
        else:
            u = a
            while u != b:
                cand, key = gr.hop(u, b)
                # a choice among switches reads the switch's digit of the hash; one among
                # parallel links to one switch (key > n_nodes), the lowest (controller.ecmp)
                digit = gr.base[u] if key is not None and key < fab.n_nodes else 1
                lk = cand[(hv // digit) % len(cand)]
                if key is not None:
                    groups.append(key)
                    chosen.append(lk)
                    sizes.append(len(cand))
                links.append(lk)
                coeff.append(1.0)
                u = gr.link_dst[lk]
        rows_links.append(links)
        rows_coeff.append(coeff)
    indptr = np.zeros(len(src) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in rows_links], out=indptr[1:])
    flat = [x for row in rows_links for x in row]
    return Routes(
        indptr,
        np.array(flat, dtype=np.int64),
        np.array([c for row in rows_coeff for c in row], dtype=np.float64),
        np.array(groups, dtype=np.int64),
        np.array(chosen, dtype=np.int64),
        np.array(sizes, dtype=np.int64),
    )


def _scaleup_link(fab: Fabric, a: int, b: int, out: bool) -> int:
    """GPU a's link into its server's scale-up switch (out), or that switch's link to GPU b."""
    if fab.structured:
        return fab.shape["b_scaleup_out"] + a if out else fab.shape["b_scaleup_in"] + b
    raise ValueError(f"{fab.name} has no scale-up links")
