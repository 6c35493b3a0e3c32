"""P4Runtime updates for the xingmai program, by the names p4src/README.md documents.

These are what a controller writes; the tests build their switches' state from them only.
"""

from __future__ import annotations

from typing import Any

import finsy as fy

from tests.p4.harness import CPU_CLONE_SESSION, CPU_PORT, REPORT_CLONE_SESSION

# Egress tx utilization windows are 2^shift ns, shift from switch_config; the program's default
# is 20 (TX_UTIL_WINDOW_SHIFT in p4src/include/define.p4).
TX_UTIL_WINDOW_SHIFT = 20
TX_UTIL_WINDOW_NS = 1 << TX_UTIL_WINDOW_SHIFT


def tx_util_mult(speed_bps: float, shift: int = TX_UTIL_WINDOW_SHIFT) -> int:
    """set_port_config's tx_util_mult for a port speed: util_ppm = bytes_per_window * mult
    >> 16, i.e. mult = 2^16 * 8e15 / (speed_bps * 2^shift)."""
    return round((1 << 16) * 8e15 / (speed_bps * (1 << shift)))


def mac(n: int) -> int:
    return 0x02_00_00_00_00_00 | n


def switch_config(
    node_id: int, qdepth_unit: int = 1, hw_id: int = 0, tx_util_shift: int = TX_UTIL_WINDOW_SHIFT
) -> list[Any]:
    return [
        ~fy.P4TableEntry(
            "switch_config",
            action=fy.P4TableAction(
                "set_switch_config",
                node_id=node_id,
                hw_id=hw_id,
                qdepth_unit=qdepth_unit,
                tx_util_shift=tx_util_shift,
            ),
            is_default_action=True,
        )
    ]


def port_config(
    port: int,
    speed_bps: float = 100e6,
    mtu: int = 9000,
    modify: bool = False,
    tx_util_shift: int = TX_UTIL_WINDOW_SHIFT,
) -> list[Any]:
    entry = fy.P4TableEntry(
        "port_config",
        match=fy.P4TableMatch(port=port),
        action=fy.P4TableAction(
            "set_port_config", tx_util_mult=tx_util_mult(speed_bps, tx_util_shift), mtu=mtu
        ),
    )
    return [~entry if modify else +entry]


def route(prefix: str, next_id: int) -> list[Any]:
    return [
        +fy.P4TableEntry(
            "ipv4_routes",
            match=fy.P4TableMatch(ipv4_dst=prefix),
            action=fy.P4TableAction("set_next_id", next_id=next_id),
        )
    ]


def next_hops(next_id: int, hops: list[tuple[int, int, int]]) -> list[Any]:
    """An ECMP group for `next_id` over (port, smac, dmac) hops: one member per hop, one
    group, one next_hops entry pointing at the group."""
    members = []
    for i, (port, smac, dmac) in enumerate(hops):
        members.append(
            +fy.P4ActionProfileMember(
                "ecmp_selector",
                member_id=next_id * 100 + i,
                action=fy.P4TableAction("route", port=port, smac=smac, dmac=dmac),
            )
        )
    group = +fy.P4ActionProfileGroup(
        "ecmp_selector",
        group_id=next_id,
        max_size=max(len(hops), 1),
        members=[fy.P4Member(next_id * 100 + i, weight=1) for i in range(len(hops))],
    )
    entry = +fy.P4TableEntry(
        "next_hops",
        match=fy.P4TableMatch(next_id=next_id),
        action=fy.P4IndirectAction(group_id=next_id),
    )
    return [*members, group, entry]


def host_route(prefix: str, next_id: int, port: int, smac: int, dmac: int) -> list[Any]:
    return route(prefix, next_id) + next_hops(next_id, [(port, smac, dmac)])


def watch(bitmap: int = 0xF500, hop_budget: int = 8, domain_id: int = 0, **match: Any) -> list[Any]:
    """An int_watchlist entry: match fields as ternary values ("10.0.0.1", or (value, mask))."""
    return [
        +fy.P4TableEntry(
            "int_watchlist",
            match=fy.P4TableMatch(**match),
            action=fy.P4TableAction(
                "mark_to_source",
                instruction_bitmap=bitmap,
                hop_budget=hop_budget,
                domain_id=domain_id,
            ),
            priority=10,
        )
    ]


def sink_port(port: int) -> list[Any]:
    return [
        +fy.P4TableEntry(
            "int_sink_ports", match=fy.P4TableMatch(port=port), action=fy.P4TableAction("set_sink")
        )
    ]


def collector(
    src_mac: int,
    dst_mac: int,
    src_addr: str,
    dst_addr: str,
    dport: int = 32766,
    port: int | None = None,
) -> list[Any]:
    """The report collector (default action of report_collector) and, when `port` is given,
    the report clone session towards it."""
    out: list[Any] = [
        ~fy.P4TableEntry(
            "report_collector",
            action=fy.P4TableAction(
                "set_collector",
                src_mac=src_mac,
                dst_mac=dst_mac,
                src_addr=src_addr,
                dst_addr=dst_addr,
                dport=dport,
            ),
            is_default_action=True,
        )
    ]
    if port is not None:
        out.append(+fy.P4CloneSessionEntry(REPORT_CLONE_SESSION, replicas=[(port, 1)]))
    return out


def cpu_clone_session() -> list[Any]:
    return [+fy.P4CloneSessionEntry(CPU_CLONE_SESSION, replicas=[(CPU_PORT, 1)])]


def ecn_thresholds(port: int, kmin: int, kmax: int, pmax: float = 1.0) -> list[Any]:
    return [
        +fy.P4TableEntry(
            "ecn_thresholds",
            match=fy.P4TableMatch(port=port),
            action=fy.P4TableAction(
                "set_ecn_thresholds",
                kmin_bytes=kmin,
                kmax_bytes=kmax,
                pmax_scaled=min(65535, round(pmax * 65536)),
            ),
        )
    ]


def punt(priority: int = 10, **match: Any) -> list[Any]:
    return [
        +fy.P4TableEntry(
            "acl",
            match=fy.P4TableMatch(**match),
            action=fy.P4TableAction("punt_to_cpu"),
            priority=priority,
        )
    ]
