"""What one switch must hold, as P4Runtime entities of the xingmai program (p4src/README.md).

From the config and the topology, for one switch:
- routing: a /32 route per destination (host NIC or collector) to a *next id*; the next id
  points to one action-profile member (one next hop) or to a group of members (ECMP over the
  equal-cost next hops, hashed on the 5-tuple by the selector). Members, groups and next ids
  are allocated by content, so the IDs already on the switch are kept (controller.reconcile).
- switch_config (node id, report hw id, bytes per queue-depth unit), port_config (tx
  utilisation multiplier from the port's emulated speed, MTU), ECN thresholds per port;
- INT: source watchlist rules for the hosts whose INT the switch does (int: switch), sink
  ports facing them, the collector's addresses, and the report clone session towards the
  collector (plus the CPU clone session for packets punted to the controller).

Names come from `controller.p4names` (generated from the P4Info), clone session numbers from
p4src/include/define.p4 (they are constants of the program, not P4Info objects; a test reads
them from the source).
"""

from __future__ import annotations

import ipaddress
import logging
import math
from dataclasses import dataclass
from typing import Any

import finsy as fy
from finsy.proto import p4r

from controller import p4names as P
from controller.config import Config, SwitchConfig
from controller.reconcile import IdAllocator, Key, SwitchState, group_key, member_key
from controller.topology import NextHop, Topology

log = logging.getLogger("xingmai.controller.program")

REPORT_CLONE_SESSION = 256  # p4src/include/define.p4
CPU_CLONE_SESSION = 257  # p4src/include/define.p4
PUNT_ACL = 1  # p4src/include/define.p4: packet-in reasons
PUNT_REPORT_UNSENT = 2
TX_UTIL_WINDOW_SHIFT = 20  # p4src/include/define.p4: the default window, 2^20 ns
TX_UTIL_WINDOW_NS = 1 << TX_UTIL_WINDOW_SHIFT
# the shortest window the program takes, 2^10 ns (TimeWindow in p4src/include/arch/*.p4): about
# one base RTT at 400G, where a window of the default's length reads the load of a thousand
TX_UTIL_SHIFT_MIN = 10
TX_UTIL_SHIFT = 16  # tx_util = bytes_in_window * tx_util_mult >> 16 (port_telemetry.p4)
# A tx utilisation window holds at least this many mean-size frames at the switch's slowest
# port: fewer, and INT bit 7 swings between 0 and a multiple of 100 % from window to window.
TX_UTIL_WINDOW_FRAMES = 8
WATCHLIST_PRIORITY = 10


def mac_int(mac: str) -> int:
    return int(mac.replace(":", ""), 16)


def ip_int(ip: str) -> int:
    return int(ipaddress.IPv4Address(ip))


def tx_util_window_shift(speed_bps: float, frame_bytes: int) -> int:
    """Window length (2^shift ns, switch_config): the shortest holding TX_UTIL_WINDOW_FRAMES
    frames at `speed_bps`, within what the program takes."""
    need_ns = TX_UTIL_WINDOW_FRAMES * frame_bytes * 8e9 / speed_bps
    return max(TX_UTIL_SHIFT_MIN, min(40, math.ceil(math.log2(need_ns))))


def tx_util_mult(speed_bps: float, shift: int = TX_UTIL_WINDOW_SHIFT) -> int:
    """Multiplier turning the bytes a port sent in one window of 2^shift ns into ppm of its
    speed."""
    ppm_per_byte = 8 * 1e6 / (speed_bps * (1 << shift) * 1e-9)
    return min(0xFFFFFFFF, max(1, round(ppm_per_byte * (1 << TX_UTIL_SHIFT))))


def pmax_scaled(pmax: float) -> int:
    """ECN marking probability at Kmax in units of 2^-16 (ecn.p4)."""
    return min(0xFFFF, round(pmax * 65536))


@dataclass
class Desired:
    entities: list[Any]  # finsy entities
    default_tables: list[str]  # tables whose default action the controller sets

    def encode(self, schema: Any) -> list[p4r.Entity]:
        return [e.encode(schema) for e in self.entities]


def _next_allocations(state: SwitchState, schema: Any) -> dict[Key, int]:
    """Existing next ids by what they point to: ("group", id) or ("member", id)."""
    table_id = schema.tables[P.TBL_NEXT_HOPS].id
    out: dict[Key, int] = {}
    for ent in state.entities:
        if ent.WhichOneof("entity") != "table_entry":
            continue
        te = ent.table_entry
        if te.table_id != table_id or te.is_default_action or not te.match:
            continue
        next_id = int.from_bytes(te.match[0].exact.value, "big")
        which = te.action.WhichOneof("type")
        if which == "action_profile_group_id":
            out[("group", te.action.action_profile_group_id)] = next_id
        elif which == "action_profile_member_id":
            out[("member", te.action.action_profile_member_id)] = next_id
    return out


def build(
    cfg: Config, topo: Topology, sw: SwitchConfig, schema: Any, state: SwitchState, qdepth_unit: int
) -> Desired:
    """The desired entities of switch `sw`, reusing the IDs in `state` where content matches."""
    ents: list[Any] = []
    members = IdAllocator(state.members())
    groups = IdAllocator(state.groups())
    next_ids = IdAllocator(_next_allocations(state, schema))
    routes = topo.routes(sw.name)
    smac = mac_int(sw.router_mac)

    # ---- routing ----
    member_ents: dict[int, Any] = {}
    group_ents: dict[int, Any] = {}
    next_ents: dict[int, Any] = {}

    def member_for(nh: NextHop) -> int:
        m = fy.P4ActionProfileMember(
            P.PROF_ECMP_SELECTOR,
            action=fy.P4TableAction(
                P.ACT_ROUTE,
                **{
                    P.PRM_ROUTE_PORT: nh.port,
                    P.PRM_ROUTE_SMAC: smac,
                    P.PRM_ROUTE_DMAC: mac_int(nh.dmac),
                },
            ),
        )
        mid = members.get(member_key(schema, m))
        if mid not in member_ents:
            m.member_id = mid
            member_ents[mid] = m
        return mid

    def next_for(hops: tuple[NextHop, ...]) -> int:
        mids = sorted({member_for(nh) for nh in hops})
        if len(mids) == 1:
            target: Key = ("member", mids[0])
            action: Any = fy.P4IndirectAction(member_id=mids[0])
        else:
            w = weight if among_switches(hops) else 1
            gid = groups.get(group_key(schema, P.PROF_ECMP_SELECTOR, [(m, w) for m in mids]))
            if gid not in group_ents:
                group_ents[gid] = fy.P4ActionProfileGroup(
                    P.PROF_ECMP_SELECTOR,
                    group_id=gid,
                    members=[fy.P4Member(m, weight=w) for m in mids],
                )
            target = ("group", gid)
            action = fy.P4IndirectAction(group_id=gid)
        nid = next_ids.get(target)
        if nid not in next_ents:
            next_ents[nid] = fy.P4TableEntry(
                P.TBL_NEXT_HOPS,
                match=fy.P4TableMatch(**{P.KEY_NEXT_HOPS_NEXT_ID: nid}),
                action=action,
            )
        return nid

    # this switch's digit of the hash (controller.ecmp), as equal weights on the members of
    # its groups among switches (one among parallel links to one switch reads the lowest);
    # within what one group may hold (TNA's selectors bound it: P4Info's max_group_size, 0
    # for none), else plain ECMP and a warning
    def among_switches(hops: tuple[NextHop, ...]) -> bool:
        return len({nh.dmac for nh in hops}) > 1

    weight = topo.ecmp_base.get(sw.name, 1)
    max_group = schema.action_profiles[P.PROF_ECMP_SELECTOR].max_group_size
    widest = max((len(set(h)) for h in routes.values() if among_switches(h)), default=0)
    if weight > 1 and max_group and widest * weight > max_group:
        log.warning(
            "%s: ECMP groups of %d members weighted %d exceed the selector's %d: plain ECMP "
            "(this tier reads the same digit of the hash as the one below it)",
            sw.name,
            widest,
            weight,
            max_group,
        )
        weight = 1

    route_ents = []
    for ip, hops in routes.items():
        if not hops:
            continue
        nid = next_for(hops)
        route_ents.append(
            fy.P4TableEntry(
                P.TBL_IPV4_ROUTES,
                match=fy.P4TableMatch(**{P.KEY_IPV4_ROUTES_IPV4_DST: f"{ip}/32"}),
                action=fy.P4TableAction(P.ACT_SET_NEXT_ID, **{P.PRM_SET_NEXT_ID_NEXT_ID: nid}),
            )
        )
    ents += list(member_ents.values()) + list(group_ents.values())
    ents += list(next_ents.values()) + route_ents

    # ---- per switch and per port configuration ----
    slowest = min(
        (topo.port_speed_bps(sw.name, pc.port) for pc in sw.ports),
        default=cfg.emulated_bps(cfg.model.port_speed_gbps),
    )
    shift = tx_util_window_shift(slowest, cfg.model.mean_packet_bytes)
    ents.append(
        fy.P4TableEntry(
            P.TBL_SWITCH_CONFIG,
            is_default_action=True,
            action=fy.P4TableAction(
                P.ACT_SET_SWITCH_CONFIG,
                **{
                    P.PRM_SET_SWITCH_CONFIG_NODE_ID: sw.node_id,
                    P.PRM_SET_SWITCH_CONFIG_HW_ID: 0,
                    P.PRM_SET_SWITCH_CONFIG_QDEPTH_UNIT: qdepth_unit,
                    P.PRM_SET_SWITCH_CONFIG_TX_UTIL_SHIFT: shift,
                },
            ),
        )
    )
    ecn = cfg.ecn
    for pc in sw.ports:
        speed = topo.port_speed_bps(sw.name, pc.port)
        ents.append(
            fy.P4TableEntry(
                P.TBL_PORT_CONFIG,
                match=fy.P4TableMatch(**{P.KEY_PORT_CONFIG_PORT: pc.port}),
                action=fy.P4TableAction(
                    P.ACT_SET_PORT_CONFIG,
                    **{
                        P.PRM_SET_PORT_CONFIG_TX_UTIL_MULT: tx_util_mult(speed, shift),
                        P.PRM_SET_PORT_CONFIG_MTU: cfg.int.mtu,
                    },
                ),
            )
        )
        ents.append(
            fy.P4TableEntry(
                P.TBL_ECN_THRESHOLDS,
                match=fy.P4TableMatch(**{P.KEY_ECN_THRESHOLDS_PORT: pc.port}),
                action=fy.P4TableAction(
                    P.ACT_SET_ECN_THRESHOLDS,
                    **{
                        P.PRM_SET_ECN_THRESHOLDS_KMIN_BYTES: ecn.kmin_bytes,
                        P.PRM_SET_ECN_THRESHOLDS_KMAX_BYTES: ecn.kmax_bytes,
                        P.PRM_SET_ECN_THRESHOLDS_PMAX_SCALED: pmax_scaled(ecn.pmax),
                    },
                ),
            )
        )

    # ---- INT source and sink for the hosts whose INT the switch does ----
    icfg = cfg.int
    for port, host_name in topo.host_ports(sw.name):
        host = cfg.host(host_name)
        if host.int_mode != "switch":
            continue
        ents.append(
            fy.P4TableEntry(
                P.TBL_INT_SINK_PORTS,
                match=fy.P4TableMatch(**{P.KEY_INT_SINK_PORTS_PORT: port}),
                action=fy.P4TableAction(P.ACT_SET_SINK),
            )
        )
        peer = topo.peer(sw.name, port)
        nic = next(n for n in host.nics if peer is not None and n.name == peer.nic)
        for w in icfg.watchlist:
            if ipaddress.IPv4Address(nic.ip) not in ipaddress.IPv4Network(w.src):
                continue
            match: dict[str, Any] = {P.KEY_INT_WATCHLIST_IPV4_SRC: (nic.ip, "255.255.255.255")}
            dst = ipaddress.IPv4Network(w.dst)
            if dst.prefixlen:
                match[P.KEY_INT_WATCHLIST_IPV4_DST] = (str(dst.network_address), str(dst.netmask))
            if w.proto is not None:
                match[P.KEY_INT_WATCHLIST_IP_PROTO] = (w.proto, 0xFF)
            if w.dport is not None:
                match[P.KEY_INT_WATCHLIST_L4_DPORT] = (w.dport, 0xFFFF)
            ents.append(
                fy.P4TableEntry(
                    P.TBL_INT_WATCHLIST,
                    match=fy.P4TableMatch(**match),
                    priority=WATCHLIST_PRIORITY,
                    action=fy.P4TableAction(
                        P.ACT_MARK_TO_SOURCE,
                        **{
                            P.PRM_MARK_TO_SOURCE_INSTRUCTION_BITMAP: icfg.instruction_bitmap,
                            P.PRM_MARK_TO_SOURCE_HOP_BUDGET: icfg.hop_budget,
                            P.PRM_MARK_TO_SOURCE_DOMAIN_ID: icfg.domain_id,
                        },
                    ),
                )
            )

    # ---- reports: towards the collector over the fabric ----
    col = icfg.collector
    to_collector = routes.get(col.ip)
    default_tables = [P.TBL_SWITCH_CONFIG, P.TBL_REPORT_COLLECTOR]
    if to_collector:
        first = to_collector[0]  # reports are few: one deterministic path, no ECMP
        ents.append(
            fy.P4TableEntry(
                P.TBL_REPORT_COLLECTOR,
                is_default_action=True,
                action=fy.P4TableAction(
                    P.ACT_SET_COLLECTOR,
                    **{
                        P.PRM_SET_COLLECTOR_SRC_MAC: smac,
                        P.PRM_SET_COLLECTOR_DST_MAC: mac_int(first.dmac),
                        P.PRM_SET_COLLECTOR_SRC_ADDR: ip_int(col.report_src_ip),
                        P.PRM_SET_COLLECTOR_DST_ADDR: ip_int(col.ip),
                        P.PRM_SET_COLLECTOR_DPORT: col.udp_port,
                    },
                ),
            )
        )
        ents.append(fy.P4CloneSessionEntry(REPORT_CLONE_SESSION, replicas=[first.port]))
    else:
        ents.append(
            fy.P4TableEntry(
                P.TBL_REPORT_COLLECTOR,
                is_default_action=True,
                action=fy.P4TableAction(P.ACT_NO_COLLECTOR),
            )
        )
    ents.append(fy.P4CloneSessionEntry(CPU_CLONE_SESSION, replicas=[sw.cpu_port]))
    return Desired(ents, default_tables)


def const_tables(schema: Any) -> list[str]:
    return [t.name for t in schema.tables if t.is_const]
