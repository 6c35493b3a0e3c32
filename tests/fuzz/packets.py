"""The switch's packet path: frames into a leaf of a small leaf-spine fabric of built-in
switches running p4src/ (programmed as the controller programs them, the simulated twin's
fabric): valid RoCE data with and without INT, the same mutated, and random frames; the fabric
runs until it is idle after each."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from scapy.layers.l2 import Ether

from testbed.model import Scaling
from testbed.packets import int_packet
from testbed.sim.fabric import SimFabric
from testbed.topo import leafspine
from tests.fuzz.harness import EDITS, Surface, mutate

RUN_NS = 50_000_000  # how long the fabric runs after each frame (virtual time)


class PacketPathSurface(Surface):
    name = "switch_packet_path"

    def __init__(self) -> None:
        spec = leafspine(2, 1, 1)
        self.spec = spec
        self.fab = SimFabric(spec, Scaling(scale=1, max_hops=spec.longest_path_switches()))
        h1, h2 = spec.hosts[0], spec.hosts[1]
        self.leaf = spec.attachment(h1.name, 0)
        gw = spec.switch(self.leaf.node).router_mac
        src, dst = h1.nics[0], h2.nics[0]
        bth = b"\x04\x00\xff\xff\x00\x00\x00\x12\x00\x00\x00\x07"  # RC SEND ONLY, QP 0x12
        self.templates = []
        for hops, payload in (
            ((), bth + bytes(16)),
            (
                (
                    {
                        "node_id": 9,
                        "l1_ingress_port": 1,
                        "l1_egress_port": 2,
                        "hop_latency": 5,
                        "queue_id": 0,
                        "queue_occupancy": 7,
                        "egress_ts": 1,
                        "tx_util": 3,
                    },
                ),
                bth + bytes(64),
            ),
        ):
            ip = int_packet(
                src_ip=src.ip,
                dst_ip=dst.ip,
                sport=49152,
                hops=hops,
                payload=payload,
                src_mac=src.mac,
                dst_mac=gw,
            )
            self.templates.append(
                bytes(ip if isinstance(ip, Ether) else Ether(src=src.mac, dst=gw) / ip)
            )
        self.frames = 0

    def strategy(self) -> st.SearchStrategy[Any]:
        return st.one_of(
            st.tuples(st.just("valid"), st.integers(0, len(self.templates) - 1), st.just([])),
            st.tuples(st.just("mutated"), st.integers(0, len(self.templates) - 1), EDITS),
            st.tuples(st.just("random"), st.binary(max_size=400), st.just([])),
        )

    def check(self, case: Any) -> str:
        kind, i, edits = case
        frame = bytes(i) if kind == "random" else self.templates[i]
        if kind == "mutated":
            frame = mutate(frame, edits)
        sw = self.fab.switches[self.leaf.node]
        before = dict(sw.sw.stats.dropped)
        tx = sw.sw.stats.tx
        sw.receive(self.leaf.index, frame)
        self.fab.loop.run(until_ns=self.fab.loop.now_ns + RUN_NS)
        self.frames += 1
        new = {
            k: v - before.get(k, 0) for k, v in sw.sw.stats.dropped.items() if v != before.get(k, 0)
        }
        if new:
            return "dropped:" + ",".join(sorted(new))
        return "forwarded" if sw.sw.stats.tx > tx else "absorbed"

    def bounds(self) -> list[str]:
        out = []
        for name, s in self.fab.switches.items():
            for port, q in s.sw.tm.ports.items():
                n, _ = q.total()
                if n > q.depth_pkts * q.nb_queues:
                    out.append(f"{name}:{port}: {n} packets queued")
        if self.fab.loop.pending > 10_000:
            out.append(f"{self.fab.loop.pending} events pending")
        return out
