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
from dataclasses import dataclass

import numpy as np

from controller.wire.roce import ROCE_UDP_PORT
from testbed.flow.fabric import Fabric
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

    @property
    def n_flows(self) -> int:
        return len(self.indptr) - 1

    def flow_of_entry(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_flows), np.diff(self.indptr))

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
    if fab.structured and not spray:
        return _route_clos(fab, src, dst, h.astype(np.int64))
    return _route_search(fab, src, dst, h, spray)


# ---- a Clos built here: arithmetic ------------------------------------------------------------


def _route_clos(fab: Fabric, src: np.ndarray, dst: np.ndarray, h: np.ndarray) -> Routes:
    p, s = fab.params, fab.shape
    assert p is not None
    g = fab.gpus_per_server
    n = len(src)
    width = 8
    paths = np.full((n, width), -1, dtype=np.int64)
    groups: list[np.ndarray] = []
    chosen: list[np.ndarray] = []
    sizes: list[np.ndarray] = []
    same_server = src // g == dst // g
    # scale-up: same server; or a hop to the GPU on the destination's rail (PXN), since
    # the planes of a rail-optimized fabric are joined only inside the servers
    relay = src.copy()
    if p.rail:
        relay = (src // g) * g + dst % g
    via_su = same_server | (relay != src)
    paths[via_su, 0] = s["b_scaleup_out"] + src[via_su]
    su_dst = np.where(same_server, dst, relay)
    paths[via_su, 1] = s["b_scaleup_in"] + su_dst[via_su]
    net = ~same_server
    a, b, hh = relay[net], dst[net], h[net]
    rows = np.flatnonzero(net)
    up, aggs, leaves, per_pod = s["up"], s["aggs"], s["leaves"], s["per_pod"]
    if p.rail:
        la = (a % g) * leaves + (a // g) // s["down"]
        lb = (b % g) * leaves + (b // g) // s["down"]
    else:
        la, lb = a // s["down"], b // s["down"]
    paths[rows, 2] = s["b_nic_up"] + a
    paths[rows, 7] = s["b_nic_down"] + b
    cross = la != lb
    k1 = hh % up
    ag = k1 % aggs
    mu = up // aggs
    leaf_node = s["leaf_node"] + la
    paths[rows[cross], 3] = s["b_leaf_up"] + (la * up + k1)[cross]
    groups.append(leaf_node[cross])
    chosen.append((s["b_leaf_up"] + la * up + k1)[cross])
    sizes.append(np.full(int(cross.sum()), up))
    pod_a, pod_b = (la % leaves) // per_pod, (lb % leaves) // per_pod
    plane = la // leaves
    far = cross & (pod_a != pod_b)
    # down from agg ag (of the destination's pod) to leaf lb: its parallel links
    kdown = ag + aggs * (hh % mu)
    down_link = s["b_leaf_down"] + lb * up + kdown
    paths[rows[cross], 6] = down_link[cross]
    agg_b = s["agg_node"] + (plane * s["pods"] + pod_b) * aggs + ag
    if mu > 1:
        groups.append((agg_b * fab.n_nodes + s["leaf_node"] + lb)[cross])
        chosen.append(down_link[cross])
        sizes.append(np.full(int(cross.sum()), mu))
    if far.any():
        au, cores = s["agg_up"], s["cores"]
        mc = au // cores
        k2 = hh % au
        agg_a_flat = (plane * s["pods"] + pod_a) * aggs + ag
        agg_b_flat = (plane * s["pods"] + pod_b) * aggs + ag
        up2 = s["b_agg_up"] + agg_a_flat * au + k2
        paths[rows[far], 4] = up2[far]
        groups.append((s["agg_node"] + agg_a_flat)[far])
        chosen.append(up2[far])
        sizes.append(np.full(int(far.sum()), au))
        core = k2 % cores
        down2 = s["b_agg_down"] + agg_b_flat * au + core + cores * (hh % mc)
        paths[rows[far], 5] = down2[far]
        if mc > 1:
            core_node = s["core_node"] + (plane * aggs + ag) * cores + core
            groups.append((core_node * fab.n_nodes + s["agg_node"] + agg_b_flat)[far])
            chosen.append(down2[far])
            sizes.append(np.full(int(far.sum()), mc))
    mask = paths >= 0
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(mask.sum(axis=1), out=indptr[1:])
    links = paths[mask].astype(np.int64)
    return Routes(indptr, links, np.ones(len(links)), _cat(groups), _cat(chosen), _cat(sizes))


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


# ---- any fabric: search -------------------------------------------------------------------


class _Graph:
    """Out-links per node (in link order), and hop distances to a node, cached."""

    def __init__(self, fab: Fabric):
        self.fab = fab
        order = np.argsort(fab.link_src, kind="stable")
        self.out_ptr = np.zeros(fab.n_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(fab.link_src, minlength=fab.n_nodes), out=self.out_ptr[1:])
        self.out_links = order
        order_in = np.argsort(fab.link_dst, kind="stable")
        self.in_ptr = np.zeros(fab.n_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(fab.link_dst, minlength=fab.n_nodes), out=self.in_ptr[1:])
        self.in_links = order_in
        self._dist: dict[int, np.ndarray] = {}

    def outs(self, u: int) -> np.ndarray:
        return self.out_links[self.out_ptr[u] : self.out_ptr[u + 1]]

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
                cand = [lk for lk in gr.outs(u) if d[fab.link_dst[lk]] == d[u] - 1]
                lk = int(cand[hv % len(cand)])
                if len(cand) > 1:
                    # the group: this switch and, where the candidates all lead to one next
                    # switch (parallel links), that one too
                    nxt_nodes = {int(fab.link_dst[c]) for c in cand}
                    key = u if len(nxt_nodes) > 1 else u * fab.n_nodes + nxt_nodes.pop()
                    groups.append(key)
                    chosen.append(lk)
                    sizes.append(len(cand))
                links.append(lk)
                coeff.append(1.0)
                u = int(fab.link_dst[lk])
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
