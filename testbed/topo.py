"""Topologies: single switch, leaf-spine, rail-optimized; a YAML file format.

A `FabricSpec` is the whole network as data: switches (with the node id INT reports and the
router MAC hosts send to), hosts with their NICs (address, MAC), numbered links, and the switch
port where the telemetry collector hangs. The builders `single()`, `leafspine()` and `rail()`
make the standard shapes; `load()` / `dump()` read and write the YAML format:

    switches: [leaf1, leaf2, spine1]          # names; node ids / MACs may be given as mappings
    hosts:
      - {name: h1, nics: [10.0.1.1]}          # one address per NIC (MAC derived if not given)
    links:
      - [h1:0, leaf1:1]                       # host:NIC index, switch:port
      - [leaf1:3, spine1:1, {gbps: 800, delay_ns: 500}]  # optional: own speed, delay
    collector: leaf1:4                        # optional: where telemetry reports leave

testbed.emu.topo turns a spec into a Mininet `Topo` (this module imports no Mininet: the twin
runs without it). Host NIC i is interface `<host>-eth<i>`. Hosts route everything through their
switch: each NIC has a static neighbour entry for a gateway address that resolves to the
switch's router MAC (the P4 program does no ARP).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,9}$")  # short: Mininet builds interface names
MAX_PORT = 510  # p4src: 9-bit ports, 511 is the drop port
COLLECTOR_IP = "10.0.100.1"
COLLECTOR_MAC = "02:00:00:00:64:01"
COLLECTOR_NODE = "col"  # the Mininet host standing for the collector's dataplane end


class TopologyError(ValueError):
    """An invalid topology; the message names the offending entry."""


@dataclass(frozen=True)
class SwitchSpec:
    name: str
    device_id: int
    node_id: int
    router_mac: str


@dataclass(frozen=True)
class NicSpec:
    ip: str
    mac: str

    @property
    def gateway(self) -> str:
        """The on-link next hop the host routes through (the .254 of its /24): a static
        neighbour entry maps it to the switch's router MAC."""
        return str(ipaddress.IPv4Network(f"{self.ip}/24", strict=False).network_address + 254)

    @property
    def subnet(self) -> str:
        return str(ipaddress.IPv4Network(f"{self.ip}/24", strict=False))


@dataclass(frozen=True)
class HostSpec:
    name: str
    nics: tuple[NicSpec, ...]

    def ifname(self, nic: int) -> str:
        return f"{self.name}-eth{nic}"


@dataclass(frozen=True, order=True)
class End:
    """One end of a link: a switch port, or a host NIC (by index)."""

    node: str
    index: int  # switch port, or host NIC index

    def __str__(self) -> str:
        return f"{self.node}:{self.index}"


MAX_LINK_GBPS = 102_400.0  # more than any link or scale-up port the model has
MAX_LINK_DELAY_NS = 10**9


@dataclass(frozen=True)
class LinkSpec:
    a: End
    b: End
    # the link's own speed in the model, Gb/s (a 100G host under 400G uplinks, a scale-up
    # link inside a server); None: the switch model's port speed
    gbps: float | None = None
    # its propagation delay in the model, ns (None: testbed.model.LINK_DELAY_MODEL_NS, about
    # 16 m of fiber, on both engines)
    delay_ns: int | None = None


@dataclass(frozen=True)
class FabricSpec:
    name: str
    switches: tuple[SwitchSpec, ...]
    hosts: tuple[HostSpec, ...]
    links: tuple[LinkSpec, ...]
    collector: End | None = None  # the switch port the collector hangs off
    extras: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        validate(self)

    def switch(self, name: str) -> SwitchSpec:
        for s in self.switches:
            if s.name == name:
                return s
        raise KeyError(name)

    def host(self, name: str) -> HostSpec:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def is_switch(self, name: str) -> bool:
        return any(s.name == name for s in self.switches)

    def switch_ports(self, name: str) -> list[int]:
        ports = [e.index for lk in self.links for e in (lk.a, lk.b) if e.node == name]
        if self.collector is not None and self.collector.node == name:
            ports.append(self.collector.index)
        return sorted(ports)

    def link_at(self, end: End) -> LinkSpec | None:
        """The link with `end` at one of its ends."""
        for lk in self.links:
            if end in (lk.a, lk.b):
                return lk
        return None

    def link_gbps(self, end: End, default: float) -> float:
        """The model speed of the link at `end` (`default` where it sets none)."""
        lk = self.link_at(end)
        return default if lk is None or lk.gbps is None else lk.gbps

    def attachment(self, host: str, nic: int) -> End:
        """The switch port a host NIC is linked to."""
        for lk in self.links:
            for here, there in ((lk.a, lk.b), (lk.b, lk.a)):
                if here == End(host, nic):
                    return there
        raise KeyError(f"{host}:{nic}")

    def peer(self, end: End) -> End | None:
        for lk in self.links:
            if lk.a == end:
                return lk.b
            if lk.b == end:
                return lk.a
        return None

    def longest_path_switches(self) -> int:
        """Switches on the longest shortest path between two hosts (INT records a packet
        can collect)."""
        adj: dict[str, set[str]] = {s.name: set() for s in self.switches}
        for lk in self.links:
            if self.is_switch(lk.a.node) and self.is_switch(lk.b.node):
                adj[lk.a.node].add(lk.b.node)
                adj[lk.b.node].add(lk.a.node)
        edges = {self.attachment(h.name, i).node for h in self.hosts for i in range(len(h.nics))}
        best = 1
        for src in edges:
            dist = {src: 1}
            todo = [src]
            while todo:
                u = todo.pop(0)
                for v in adj[u]:
                    if v not in dist:
                        dist[v] = dist[u] + 1
                        todo.append(v)
            best = max([best] + [d for n, d in dist.items() if n in edges])
        return best


def validate(spec: FabricSpec) -> None:
    names: set[str] = set()
    for kind, nodes in (("switch", spec.switches), ("host", spec.hosts)):
        for n in nodes:
            if not _NAME.match(n.name):
                raise TopologyError(
                    f"{kind} name {n.name!r}: a letter then letters, digits or "
                    "'_', at most 10 characters"
                )
            if n.name in names or n.name in ("collector", COLLECTOR_NODE):
                raise TopologyError(f"{kind} name {n.name!r} is used twice (or reserved)")
            names.add(n.name)
    for key in ("device_id", "node_id"):
        vals = [getattr(s, key) for s in spec.switches]
        if len(set(vals)) != len(vals):
            raise TopologyError(f"switch {key}s must be unique, got {vals}")
    ips = [n.ip for h in spec.hosts for n in h.nics]
    if len(set(ips)) != len(ips) or COLLECTOR_IP in ips:
        raise TopologyError(
            f"host addresses must be unique (and not the collector's {COLLECTOR_IP})"
        )
    used: set[End] = set()
    ends = [(f"links[{i}]", e) for i, lk in enumerate(spec.links) for e in (lk.a, lk.b)]
    if spec.collector is not None:
        ends.append(("collector", spec.collector))
    for where, e in ends:
        if spec.is_switch(e.node):
            if not 1 <= e.index <= MAX_PORT:
                raise TopologyError(f"{where}: port {e.index} of {e.node} not in 1..{MAX_PORT}")
        elif any(h.name == e.node for h in spec.hosts):
            if not 0 <= e.index < len(spec.host(e.node).nics):
                raise TopologyError(f"{where}: host {e.node} has no NIC {e.index}")
            if where == "collector":
                raise TopologyError("collector: must be a switch port")
        else:
            raise TopologyError(f"{where}: no switch or host named {e.node!r}")
        if e in used:
            raise TopologyError(f"{where}: {e} is linked twice")
        used.add(e)
    for i, lk in enumerate(spec.links):
        if not (spec.is_switch(lk.a.node) or spec.is_switch(lk.b.node)):
            raise TopologyError(f"links[{i}]: a link needs a switch at one end")
    for h in spec.hosts:
        for i in range(len(h.nics)):
            if End(h.name, i) not in used:
                raise TopologyError(f"host {h.name} NIC {i} is not linked to a switch")


# ---- builders -------------------------------------------------------------------------------


def _switches(names: list[str]) -> tuple[SwitchSpec, ...]:
    return tuple(
        SwitchSpec(n, i + 1, i + 1, f"02:00:00:00:fe:{i + 1:02x}") for i, n in enumerate(names)
    )


def _host_mac(ip: str) -> str:
    a = ipaddress.IPv4Address(ip).packed
    return "02:00:" + ":".join(f"{b:02x}" for b in a)


def single(hosts: int = 4) -> FabricSpec:
    """One switch `s1`, hosts h1..hN on ports 1..N; the collector on port N+1."""
    if not 2 <= hosts <= 250:
        raise TopologyError("single: 2..250 hosts")
    hs = tuple(
        HostSpec(f"h{j}", (NicSpec(f"10.0.1.{j}", _host_mac(f"10.0.1.{j}")),))
        for j in range(1, hosts + 1)
    )
    links = tuple(LinkSpec(End(f"h{j}", 0), End("s1", j)) for j in range(1, hosts + 1))
    return FabricSpec(f"single-{hosts}", _switches(["s1"]), hs, links, End("s1", hosts + 1))


def leafspine(
    leaves: int = 2, spines: int = 2, hosts_per_leaf: int = 4, host_gbps: int | None = None
) -> FabricSpec:
    """L leaves, S spines, H hosts per leaf. Host j of leaf i is 10.0.i.j on leaf port j;
    leaf i's uplink to spine k is port H+k (spine port i); the collector is on leaf1's port
    H+S+1. `host_gbps`: the hosts' links' own speed (e.g. 100 under the switch model's 400G
    ports, as HPCC's fat-tree has them); None: the switch model's port speed."""
    return _leafspine("leafspine", leaves, spines, hosts_per_leaf, host_gbps)


def crossed(
    leaves: int = 2, spines: int = 1, hosts_per_leaf: int = 4, host_gbps: int | None = None
) -> FabricSpec:
    """The leaf-spine with its hosts numbered round the leaves (h1 on leaf1, h2 on leaf2,
    ...; addresses, ports and `host_gbps` as `leafspine`), so that a ring in host order
    crosses the spines at every hop: with one spine, H ring flows share each leaf's uplink,
    the ECMP collision of a large Clos (docs/flow.md) in miniature."""
    return _leafspine("crossed", leaves, spines, hosts_per_leaf, host_gbps)


def _host_links(kind: str, host_gbps: int | None) -> tuple[float | None, str]:
    """The hosts' links' own speed (None: the switch model's) and the fabric name's suffix
    for it (`-100g`)."""
    if host_gbps is None:
        return None, ""
    if not 0 < host_gbps <= MAX_LINK_GBPS:
        raise TopologyError(f"{kind}: host link speed {host_gbps} Gb/s is not a speed")
    return float(host_gbps), f"-{host_gbps}g"


def _leafspine(
    kind: str, leaves: int, spines: int, hosts_per_leaf: int, host_gbps: int | None
) -> FabricSpec:
    if not (1 <= leaves <= 99 and 1 <= spines <= 99 and 1 <= hosts_per_leaf <= 200):
        raise TopologyError(f"{kind}: 1..99 leaves and spines, 1..200 hosts per leaf")
    if leaves * hosts_per_leaf < 2:
        raise TopologyError(f"{kind}: at least two hosts")
    gbps, speed = _host_links(kind, host_gbps)
    sw = _switches(
        [f"leaf{i}" for i in range(1, leaves + 1)] + [f"spine{k}" for k in range(1, spines + 1)]
    )
    hosts: list[HostSpec] = []
    links: list[LinkSpec] = []
    for i in range(1, leaves + 1):
        for j in range(1, hosts_per_leaf + 1):
            n = (j - 1) * leaves + i if kind == "crossed" else (i - 1) * hosts_per_leaf + j
            ip = f"10.0.{i}.{j}"
            hosts.append(HostSpec(f"h{n}", (NicSpec(ip, _host_mac(ip)),)))
            links.append(LinkSpec(End(f"h{n}", 0), End(f"leaf{i}", j), gbps=gbps))
    for i in range(1, leaves + 1):
        for k in range(1, spines + 1):
            links.append(LinkSpec(End(f"leaf{i}", hosts_per_leaf + k), End(f"spine{k}", i)))
    return FabricSpec(
        f"{kind}-{leaves}x{spines}x{hosts_per_leaf}{speed}",
        sw,
        tuple(sorted(hosts, key=lambda h: int(h.name[1:]))),
        tuple(links),
        End("leaf1", hosts_per_leaf + spines + 1),
    )


def rail(nics: int = 2, hosts: int = 4, spines: int = 1) -> FabricSpec:
    """Rail-optimized: every host has K NICs (one per GPU); NIC i of every host is on rail
    leaf `rail<i+1>` (port = host number), and spines join the rails. NIC i of host h is
    10.0.<i+1>.<h>, so traffic between same-numbered NICs stays on its rail."""
    if not (1 <= nics <= 16 and 2 <= hosts <= 200 and 1 <= spines <= 16):
        raise TopologyError("rail: 1..16 NICs per host, 2..200 hosts, 1..16 spines")
    sw = _switches(
        [f"rail{i}" for i in range(1, nics + 1)] + [f"spine{k}" for k in range(1, spines + 1)]
    )
    hs = tuple(
        HostSpec(
            f"h{h}",
            tuple(NicSpec(f"10.0.{i}.{h}", _host_mac(f"10.0.{i}.{h}")) for i in range(1, nics + 1)),
        )
        for h in range(1, hosts + 1)
    )
    links = [
        LinkSpec(End(f"h{h}", i - 1), End(f"rail{i}", h))
        for i in range(1, nics + 1)
        for h in range(1, hosts + 1)
    ]
    links += [
        LinkSpec(End(f"rail{i}", hosts + k), End(f"spine{k}", i))
        for i in range(1, nics + 1)
        for k in range(1, spines + 1)
    ]
    return FabricSpec(
        f"rail-{nics}x{hosts}x{spines}", sw, hs, tuple(links), End("rail1", hosts + spines + 1)
    )


def fattree(
    pods: int = 5,
    tors_per_pod: int = 4,
    hosts_per_tor: int = 16,
    aggs_per_pod: int = 4,
    cores_per_agg: int = 4,
    host_gbps: int | None = 100,
) -> FabricSpec:
    """Three tiers as HPCC's paper and simulator have them (its `mix/fat.txt`, the defaults:
    320 hosts at 100G, 20 ToRs, 20 aggregation and 16 core switches at the model's 400G):
    P pods of T ToRs and A aggregation switches, every ToR linked to every aggregation
    switch of its pod; aggregation switch j of every pod linked to the C cores of group j.
    Host k of ToR i is 10.0.i.k on ToR port k; a ToR's uplinks are ports H+1..H+A, an
    aggregation switch's T+1..T+C (its ToRs on 1..T), a core's port p faces pod p; the
    collector is on tor1's port H+A+1. `host_gbps` as `leafspine` (None: the model's)."""
    n_tor, n_agg, n_core = pods * tors_per_pod, pods * aggs_per_pod, aggs_per_pod * cores_per_agg
    if not (1 <= pods <= 64 and 1 <= tors_per_pod and 1 <= aggs_per_pod and 1 <= cores_per_agg):
        raise TopologyError("fattree: at least one pod, ToR, aggregation switch and core each")
    if not (n_tor <= 250 and 1 <= hosts_per_tor <= 200 and n_tor * hosts_per_tor >= 2):
        raise TopologyError("fattree: 1..250 ToRs in all, 1..200 hosts per ToR, two hosts at least")
    if max(hosts_per_tor + aggs_per_pod + 1, tors_per_pod + cores_per_agg, pods) > MAX_PORT:
        raise TopologyError(f"fattree: more than {MAX_PORT} ports on a switch")
    gbps, speed = _host_links("fattree", host_gbps)
    sw = _switches(
        [f"tor{i}" for i in range(1, n_tor + 1)]
        + [f"agg{i}" for i in range(1, n_agg + 1)]
        + [f"core{i}" for i in range(1, n_core + 1)]
    )
    hosts: list[HostSpec] = []
    links: list[LinkSpec] = []
    for i in range(1, n_tor + 1):
        for k in range(1, hosts_per_tor + 1):
            n, ip = (i - 1) * hosts_per_tor + k, f"10.0.{i}.{k}"
            hosts.append(HostSpec(f"h{n}", (NicSpec(ip, _host_mac(ip)),)))
            links.append(LinkSpec(End(f"h{n}", 0), End(f"tor{i}", k), gbps=gbps))
    for p in range(pods):
        for t in range(1, tors_per_pod + 1):
            tor = p * tors_per_pod + t
            for j in range(1, aggs_per_pod + 1):
                agg = p * aggs_per_pod + j
                links.append(LinkSpec(End(f"tor{tor}", hosts_per_tor + j), End(f"agg{agg}", t)))
        for j in range(1, aggs_per_pod + 1):
            agg = p * aggs_per_pod + j
            for c in range(1, cores_per_agg + 1):
                core = (j - 1) * cores_per_agg + c
                links.append(
                    LinkSpec(End(f"agg{agg}", tors_per_pod + c), End(f"core{core}", p + 1))
                )
    return FabricSpec(
        f"fattree-{pods}x{tors_per_pod}x{hosts_per_tor}x{aggs_per_pod}x{cores_per_agg}{speed}",
        sw,
        tuple(hosts),
        tuple(links),
        End("tor1", hosts_per_tor + aggs_per_pod + 1),
    )


BUILDERS = {
    "single": single,
    "leafspine": leafspine,
    "crossed": crossed,
    "rail": rail,
    "fattree": fattree,
}


# ---- YAML -----------------------------------------------------------------------------------


def _end(v: Any, where: str) -> End:
    if not isinstance(v, str) or v.count(":") != 1:
        raise TopologyError(f"{where}: expected NODE:INDEX, got {v!r}")
    node, idx = v.split(":")
    if not idx.isdigit():
        raise TopologyError(f"{where}: {v!r}: the index after ':' must be a number")
    return End(node, int(idx))


def from_doc(doc: Any, name: str = "fabric") -> FabricSpec:
    """A spec from a parsed YAML document (TopologyError naming the bad entry)."""
    if not isinstance(doc, dict):
        raise TopologyError("topology: expected a mapping with switches, hosts and links")
    unknown = set(doc) - {"name", "switches", "hosts", "links", "collector"}
    if unknown:
        raise TopologyError(f"topology: unknown key(s) {sorted(unknown)}")
    sw_names: list[str] = []
    overrides: dict[str, dict[str, Any]] = {}
    for i, s in enumerate(doc.get("switches") or []):
        if isinstance(s, str):
            s = {"name": s}
        if not isinstance(s, dict) or "name" not in s:
            raise TopologyError(f"switches[{i}]: expected a name or {{name: ...}}")
        extra = set(s) - {"name", "node_id", "router_mac"}
        if extra:
            raise TopologyError(f"switches[{i}]: unknown key(s) {sorted(extra)}")
        sw_names.append(str(s["name"]))
        overrides[str(s["name"])] = {k: v for k, v in s.items() if k != "name"}
    switches = tuple(
        SwitchSpec(
            s.name,
            s.device_id,
            int(overrides[s.name].get("node_id", s.node_id)),
            str(overrides[s.name].get("router_mac", s.router_mac)).lower(),
        )
        for s in _switches(sw_names)
    )
    hosts = []
    for i, h in enumerate(doc.get("hosts") or []):
        if not isinstance(h, dict) or "name" not in h or not isinstance(h.get("nics"), list):
            raise TopologyError(f"hosts[{i}]: expected {{name: ..., nics: [ADDRESS, ...]}}")
        nics = []
        for j, n in enumerate(h["nics"]):
            ip, mac = (
                (n, None)
                if isinstance(n, str)
                else ((n.get("ip"), n.get("mac")) if isinstance(n, dict) else (None, None))
            )
            try:
                ip = str(ipaddress.IPv4Address(ip))
            except ValueError:
                raise TopologyError(
                    f"hosts[{i}].nics[{j}]: {n!r} is not an IPv4 address (or {{ip: ..., mac: ...}})"
                ) from None
            nics.append(NicSpec(ip, str(mac).lower() if mac else _host_mac(ip)))
        if not nics:
            raise TopologyError(f"hosts[{i}].nics: a host needs a NIC")
        hosts.append(HostSpec(str(h["name"]), tuple(nics)))
    links = []
    for i, lk in enumerate(doc.get("links") or []):
        if not isinstance(lk, list) or len(lk) not in (2, 3):
            raise TopologyError(
                f"links[{i}]: expected [END, END] or [END, END, {{gbps: G, delay_ns: N}}]"
            )
        gbps, delay = _link_params(lk[2] if len(lk) == 3 else {}, f"links[{i}]")
        links.append(LinkSpec(_end(lk[0], f"links[{i}]"), _end(lk[1], f"links[{i}]"), gbps, delay))
    col = doc.get("collector")
    return FabricSpec(
        str(doc.get("name", name)),
        switches,
        tuple(hosts),
        tuple(links),
        _end(col, "collector") if col is not None else None,
    )


def _link_params(doc: Any, where: str) -> tuple[float | None, int | None]:
    """A link's own speed (Gb/s) and delay (ns) from its optional third element."""
    if not isinstance(doc, dict) or set(doc) - {"gbps", "delay_ns"}:
        raise TopologyError(f"{where}: the third element is a mapping of gbps and delay_ns")
    gbps, delay = doc.get("gbps"), doc.get("delay_ns")
    if gbps is not None and (
        isinstance(gbps, bool) or not isinstance(gbps, int | float) or not 0 < gbps <= MAX_LINK_GBPS
    ):
        raise TopologyError(f"{where}: gbps {gbps!r} is not a speed in (0, {MAX_LINK_GBPS:g}]")
    if delay is not None and (
        isinstance(delay, bool) or not isinstance(delay, int) or not 0 <= delay <= MAX_LINK_DELAY_NS
    ):
        raise TopologyError(
            f"{where}: delay_ns {delay!r} is not whole ns in [0, {MAX_LINK_DELAY_NS}]"
        )
    return (None if gbps is None else float(gbps)), delay


def _link_doc(lk: LinkSpec) -> list[Any]:
    doc: list[Any] = [str(lk.a), str(lk.b)]
    own = {k: v for k, v in (("gbps", lk.gbps), ("delay_ns", lk.delay_ns)) if v is not None}
    return [*doc, own] if own else doc


def load(path: str | Path) -> FabricSpec:
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise TopologyError(f"{p}: {exc}") from None
    try:
        return from_doc(doc, p.stem)
    except TopologyError as exc:
        raise TopologyError(f"{p}: {exc}") from None


def to_doc(spec: FabricSpec) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": spec.name,
        "switches": [
            {"name": s.name, "node_id": s.node_id, "router_mac": s.router_mac}
            for s in spec.switches
        ],
        "hosts": [
            {"name": h.name, "nics": [{"ip": n.ip, "mac": n.mac} for n in h.nics]}
            for h in spec.hosts
        ],
        "links": [_link_doc(lk) for lk in spec.links],
    }
    if spec.collector is not None:
        doc["collector"] = str(spec.collector)
    return doc


def dump(spec: FabricSpec) -> str:
    return yaml.safe_dump(to_doc(spec), sort_keys=False, default_flow_style=None)


def parse_choice(text: str) -> FabricSpec:
    """`leafspine:2,2,4` (`leafspine:20,4,16,100`: hosts on 100G links), `single:4`,
    `rail:2,4,1`, `fattree` (HPCC's; `fattree:P,T,H,A,C,G`), or a YAML file path."""
    kind, _, args = text.partition(":")
    if kind in BUILDERS:
        try:
            nums = [int(a) for a in args.split(",") if a.strip()]
        except ValueError:
            raise TopologyError(f"{text!r}: arguments must be integers") from None
        try:
            return BUILDERS[kind](*nums)  # type: ignore[operator]
        except TypeError:
            raise TopologyError(f"{text!r}: too many arguments for {kind}") from None
    if Path(text).exists():
        return load(text)
    raise TopologyError(
        f"{text!r}: not single[:H], leafspine[:L,S,H[,G]], crossed[:L,S,H[,G]], rail[:K,H,S], "
        "fattree[:P,T,H,A,C[,G]] or a YAML file"
    )
