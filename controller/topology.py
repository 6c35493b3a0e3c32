"""The fabric as a graph: who is linked to whom, at what speed, and the shortest-path next hops
every switch needs to reach every address.

A *directed* link is named by its transmitting end (`leaf1:3`, `h1:eth0`, `collector`): every
end is in at most one link, so that name is unique, and it is what INT reports as the egress
port of a hop. Capacities are the emulated rates (model speed / scale).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from controller.config import Config, Endpoint
from controller.ecmp import digit_bases
from controller.wire.telemetry_report import nic_node_id

MAX_PROBE_PEERS = 32  # hosts one host probes at most (Pingmesh: a ToR's mesh, a few beyond)


def link_id(a: str, b: str) -> str:
    """An undirected link's name: its two ends, sorted (`leaf1:3-spine1:1`)."""
    return "-".join(sorted((a, b)))


@dataclass(frozen=True, order=True)
class NextHop:
    """Leave `port` of the switch with destination MAC `dmac`."""

    port: int
    dmac: str


@dataclass(frozen=True)
class DirLink:
    name: str  # the transmitting end
    tx: Endpoint
    rx: Endpoint
    capacity_bps: float


@dataclass(frozen=True)
class Destination:
    """An address the fabric routes to: a host NIC or the collector."""

    ip: str
    mac: str
    endpoint: Endpoint  # the host NIC (or the collector)
    attached: Endpoint  # the switch port it hangs off


class Topology:
    """`down`: links (`link_id`, both ends sorted: "leaf1:3-spine1:1") that carry nothing:
    routing leaves them out (fail-over), everything else still knows them."""

    def __init__(self, cfg: Config, down: frozenset[str] = frozenset()):
        self.cfg = cfg
        self.down = down
        self.switches = {s.name: s for s in cfg.switches}
        self._peer: dict[str, Endpoint] = {}
        self.links: dict[str, DirLink] = {}
        for link in cfg.links:
            speed = self._speed(link.a, link.b)
            cap = cfg.emulated_bps(speed)
            self._peer[str(link.a)] = link.b
            self._peer[str(link.b)] = link.a
            self.links[str(link.a)] = DirLink(str(link.a), link.a, link.b, cap)
            self.links[str(link.b)] = DirLink(str(link.b), link.b, link.a, cap)
        self.by_node_id = {s.node_id: s.name for s in cfg.switches}
        # NIC sinks report with their address as node id (wire.telemetry_report.nic_node_id)
        self.nic_by_node_id = {nic_node_id(n.ip): h.name for h in cfg.hosts for n in h.nics}
        self.destinations: dict[str, Destination] = {}
        self.ip_owner: dict[str, str] = {}  # ip -> host name
        for h in cfg.hosts:
            for n in h.nics:
                ep = Endpoint(h.name, nic=n.name)
                att = self._peer.get(str(ep))
                if att is None or att.port is None:
                    continue  # config validation guarantees a switch port
                self.destinations[n.ip] = Destination(n.ip, n.mac, ep, att)
                self.ip_owner[n.ip] = h.name
        coll = self._peer.get("collector")
        if coll is not None and coll.port is not None:
            c = cfg.int.collector
            self.destinations[c.ip] = Destination(c.ip, c.mac, Endpoint("collector"), coll)
        # switch adjacency: (neighbor switch, local port) over the live links; `full` over every
        # link, for each switch's digit of the ECMP hash (controller.ecmp): a link down
        # changes the groups' members, never their weights
        self.adj: dict[str, list[tuple[str, int]]] = {s: [] for s in self.switches}
        full: dict[str, list[str]] = {s: [] for s in self.switches}
        for link in cfg.links:
            a, b = link.a, link.b
            if a.node not in self.switches or b.node not in self.switches:
                continue
            full[a.node].append(b.node)
            full[b.node].append(a.node)
            if link_id(str(a), str(b)) not in down:
                assert a.port is not None and b.port is not None
                self.adj[a.node].append((b.node, a.port))
                self.adj[b.node].append((a.node, b.port))
        edge = [d.attached.node for ip, d in self.destinations.items() if ip in self.ip_owner]
        self.ecmp_base: dict[str, int] = digit_bases(full, edge)

    def _speed(self, a: Endpoint, b: Endpoint) -> float:
        speeds = []
        for ep in (a, b):
            if ep.node in {s.name for s in self.cfg.switches} and ep.port is not None:
                pc = self.cfg.switch(ep.node).port(ep.port)
                if pc is not None:
                    speeds.append(pc.speed_gbps)
        return min(speeds) if speeds else self.cfg.model.port_speed_gbps

    # ---- lookups ----

    def peer(self, switch: str, port: int) -> Endpoint | None:
        return self._peer.get(f"{switch}:{port}")

    def egress_link(self, switch: str, port: int) -> DirLink | None:
        """The link a packet takes leaving `switch` by `port`."""
        return self.links.get(f"{switch}:{port}")

    def ingress_link(self, switch: str, port: int) -> DirLink | None:
        """The link a packet arrived on at `switch` port `port`."""
        peer = self.peer(switch, port)
        return self.links.get(str(peer)) if peer is not None else None

    def leaves(self) -> dict[str, list[str]]:
        """The hosts under each switch, by their first NIC, in the config's order."""
        out: dict[str, list[str]] = {}
        for h in self.cfg.hosts:
            dest = self.destinations.get(h.nics[0].ip) if h.nics else None
            if dest is not None:
                out.setdefault(dest.attached.node, []).append(h.name)
        return out

    def host_ports(self, switch: str) -> list[tuple[int, str]]:
        """(port, host name) of the ports of `switch` that face hosts."""
        out = []
        for pc in self.switches[switch].ports:
            peer = self.peer(switch, pc.port)
            if peer is not None and peer.nic is not None:
                out.append((pc.port, peer.node))
        return out

    def port_speed_bps(self, switch: str, port: int) -> float:
        link = self.egress_link(switch, port)
        if link is not None:
            return link.capacity_bps
        pc = self.switches[switch].port(port)
        return self.cfg.emulated_bps(pc.speed_gbps if pc else self.cfg.model.port_speed_gbps)

    # ---- routing ----

    def _distances(self, root: str) -> dict[str, int]:
        dist = {root: 0}
        todo = deque([root])
        while todo:
            u = todo.popleft()
            for v, _ in self.adj[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    todo.append(v)
        return dist

    def routes(self, switch: str) -> dict[str, tuple[NextHop, ...]]:
        """For every destination address, the equal-cost next hops of `switch` (sorted).

        A destination hanging off `switch` itself has exactly one next hop, its port. An
        unreachable destination (partitioned fabric) is left out.
        """
        out: dict[str, tuple[NextHop, ...]] = {}
        dist_cache: dict[str, dict[str, int]] = {}
        for ip, dest in sorted(self.destinations.items()):
            leaf = dest.attached.node
            assert dest.attached.port is not None
            if leaf == switch:
                out[ip] = (NextHop(dest.attached.port, dest.mac),)
                continue
            dist = dist_cache.get(leaf)
            if dist is None:
                dist = dist_cache[leaf] = self._distances(leaf)
            if switch not in dist:
                continue
            hops = {
                NextHop(port, self.switches[nb].router_mac)
                for nb, port in self.adj[switch]
                if dist.get(nb, -1) == dist[switch] - 1
            }
            out[ip] = tuple(sorted(hops))
        return out

    def common_links(self, src_ip: str, dst_ip: str, max_paths: int = 256) -> list[str]:
        """Directed links that every shortest path from `src_ip` to `dst_ip` crosses, in order
        (for a flow whose ECMP choice is unknown: its sender's uplink, its receiver's downlink,
        and any link all equal-cost paths share). Empty if either end is unknown."""
        src = self.destinations.get(src_ip)
        dst = self.destinations.get(dst_ip)
        if src is None or dst is None:
            return []
        route_cache: dict[str, dict[str, tuple[NextHop, ...]]] = {}
        paths: list[list[str]] = []

        def walk(switch: str, acc: list[str], depth: int) -> None:
            if len(paths) >= max_paths or depth > len(self.switches):
                return
            routes = route_cache.get(switch)
            if routes is None:
                routes = route_cache[switch] = self.routes(switch)
            for nh in routes.get(dst_ip, ()):
                link = f"{switch}:{nh.port}"
                peer = self.peer(switch, nh.port)
                if peer is None:
                    continue
                if peer.node in self.switches:
                    walk(peer.node, acc + [link], depth + 1)
                else:
                    paths.append(acc + [link])

        walk(src.attached.node, [str(src.endpoint)], 0)
        if not paths:
            return []
        common = set(paths[0]).intersection(*paths[1:])
        return [lk for lk in paths[0] if lk in common]


def probe_peers(
    me: str, leaves: dict[str, list[str]], max_peers: int = MAX_PROBE_PEERS
) -> list[str]:
    """The hosts `me` probes: every other host, at most `max_peers` of them, taken from the
    leaves in turn (its own leaf's too), each leaf's from `me`'s own position under its leaf
    on. A host that probes several peers, and is probed by several, tells its own link
    from theirs: its link is on all of its probe flows, a peer's on a share of them."""
    mine = next((hs for hs in leaves.values() if me in hs), None)
    if mine is None:
        return []
    pos = mine.index(me)
    rings = [[hs[(pos + j) % len(hs)] for j in range(len(hs))] for hs in leaves.values()]
    rings = [[h for h in ring if h != me] for ring in rings]
    out: list[str] = []
    for j in range(max((len(r) for r in rings), default=0)):
        for ring in rings:
            if j < len(ring) and len(out) < max_peers:
                out.append(ring[j])
    return out
