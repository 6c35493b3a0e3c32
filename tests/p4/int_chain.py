"""A chain of three switches (h1 - s1 - s2 - s3 - h2) and the routes that program it."""

from __future__ import annotations

from tests.p4 import program as P
from tests.p4.harness import Fabric, Topology

# h1 - s1 - s2 - s3 - h2 (sink port when a test says so), s3 also has h3 and the collector.
CHAIN = Topology(
    3,
    links=((0, 2, 1, 1), (1, 2, 2, 1)),
    hosts={"h1": (0, 1), "h2": (2, 2), "collector": (2, 3), "h3": (2, 4)},
)


def sw_mac(i: int) -> int:
    return P.mac(0xB0 + i)


def program_chain(fab: Fabric, frame_bytes: int = 100) -> None:
    unit = fab.qdepth_unit_for(frame_bytes)
    # (host prefix, egress port) per switch
    toward = {
        0: {
            "10.0.1.0/24": (1, P.mac(0x11)),
            "10.0.2.0/24": (2, sw_mac(1)),
            "10.0.3.0/24": (2, sw_mac(1)),
            "10.0.9.0/24": (2, sw_mac(1)),
        },
        1: {
            "10.0.1.0/24": (1, sw_mac(0)),
            "10.0.2.0/24": (2, sw_mac(2)),
            "10.0.3.0/24": (2, sw_mac(2)),
            "10.0.9.0/24": (2, sw_mac(2)),
        },
        2: {
            "10.0.1.0/24": (1, sw_mac(1)),
            "10.0.2.0/24": (2, P.mac(0x22)),
            "10.0.3.0/24": (4, P.mac(0x33)),
            "10.0.9.0/24": (3, P.mac(0x99)),
        },
    }
    for i, routes in toward.items():
        fab.write(i, P.switch_config(node_id=i + 1, qdepth_unit=unit))
        for port in (1, 2, 3, 4):
            fab.write(i, P.port_config(port, speed_bps=100e6))
        for n, (prefix, (port, dmac)) in enumerate(routes.items(), start=1):
            fab.write(i, P.host_route(prefix, n, port=port, smac=sw_mac(i), dmac=dmac))
