"""The switch programming against the real P4 program on an in-process built-in switch (virtual
clock, no root): a SwitchSession pushes the pipeline and reconciles leaf1 of the example
fabric; packets are then routed (ECMP over the spines), get INT at the source, and a sink
sends a Telemetry Report the collector decodes. A reload writes only the difference, and a
new session on the programmed switch writes nothing. The generated names match the P4Info."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from controller import p4gen
from controller.collector import Collector
from controller.common.ports import free_port
from controller.config import Config, load
from controller.proto import switch_pb2_grpc
from controller.switches import SwitchHealth, SwitchSession
from controller.topology import Topology
from controller.wire.telemetry_report import decode
from testbed.packets import decode as scapy_decode
from testbed.packets import parse_int, parse_report
from testbed.switch.admin import SwitchAdminService
from testbed.switch.p4runtime import P4RuntimeService, serve
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import V1Switch
from tests.controller_rig import BMV2_JSON, P4INFO, REPO

pytestmark = pytest.mark.skipif(not P4INFO.exists(), reason=f"{P4INFO} not built (make p4)")
EXAMPLE = REPO / "controller" / "examples" / "leafspine-2x2.yaml"
LEAF1_MAC = "00:00:00:00:fe:01"


class InProcessSwitch:
    def __init__(self, device_id: int = 1):
        self.sw = V1Switch(
            Clock(virtual=True), device_id=device_id, cpu_port=255, qdepth_unit="bytes"
        )
        self.out: list[tuple[int, bytes]] = []
        self.p4rt = P4RuntimeService(self.sw, device_id)

        def transmit(port: int, data: bytes) -> None:
            if port == 255:
                self.p4rt.packet_in(data)
            else:
                self.out.append((port, data))

        self.sw.transmit = transmit
        self.addr = f"127.0.0.1:{free_port()}"
        self.server = serve(self.p4rt, self.addr)
        switch_pb2_grpc.add_SwitchAdminServicer_to_server(
            SwitchAdminService(self.sw, None, self.p4rt), self.server
        )

    def send(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        self.out.clear()
        with self.sw.lock:
            self.sw.receive(port, frame)
            for _ in range(3):  # queues drain at the port rate the controller set
                self.sw.clock.advance(1_000_000)
                self.sw.service()
        return list(self.out)


def example(addr: str, **pipeline: Any) -> Config:
    cfg = load(EXAMPLE)
    pipe = dataclasses.replace(cfg.pipeline, p4info=P4INFO, bmv2_json=BMV2_JSON)
    switches = tuple(
        dataclasses.replace(s, grpc_addr=addr) if s.name == "leaf1" else s for s in cfg.switches
    )
    return dataclasses.replace(cfg, pipeline=pipe, switches=switches)


@pytest.fixture
def leaf1() -> Iterator[InProcessSwitch]:
    s = InProcessSwitch()
    yield s
    s.server.stop(0)


async def run_session(
    cfg: Config, name: str, collector: Collector | None = None, until: Any = None
) -> SwitchSession:
    topo = Topology(cfg)
    sess = SwitchSession(cfg, topo, cfg.switch(name), collector)
    sess.start()
    for _ in range(300):
        await asyncio.sleep(0.05)
        if sess.health.reconciles and sess.health.queues_set and (until is None or until(sess)):
            break
    return sess


def test_generated_names_match_the_p4info() -> None:
    text = P4INFO.read_text()
    generated = p4gen.generate(
        text, str(P4INFO.relative_to(REPO)) if P4INFO.is_relative_to(REPO) else str(P4INFO)
    )
    current = (REPO / "controller" / "p4names.py").read_text()
    body = generated.split("\n", 3)[3]  # past the docstring's first lines (the source path)
    assert body in current, "controller/p4names.py is stale: run python -m controller.p4gen"


def test_leaf_programmed_routes_ecmp_int_and_reports(leaf1: InProcessSwitch) -> None:
    cfg = example(leaf1.addr)
    col = Collector(Topology(cfg))

    async def body() -> SwitchHealth:
        sess = await run_session(cfg, "leaf1", col)
        seen = dataclasses.replace(sess.health)  # while the session is up
        await sess.stop()
        # a session that ended knows nothing of the switch any more (it may restart empty)
        assert not (sess.health.connected or sess.health.programmed or sess.health.queues_set)
        return seen

    h = asyncio.run(body())
    assert h.programmed and h.queues_set and h.write_failures == 0, h
    # 9 routes, 4 host next hops + collector + 1 ECMP next id; members: 5 + 2 spines
    assert h.last_plan["insert"] >= 9 + 6 + 7 + 1 and h.last_plan["delete"] == 0
    assert leaf1.sw.tm.ports[5].rate_bps == pytest.approx(100e6)

    # h1 -> h5 (another leaf): ECMP over ports 5 and 6, MACs rewritten, TTL - 1
    ports = set()
    for sport in range(40):
        frame = (
            Ether(src="02:00:00:00:01:01", dst=LEAF1_MAC)
            / IP(src="10.0.1.1", dst="10.0.2.1", ttl=64)
            / UDP(sport=1000 + sport, dport=7000)
            / (b"x" * 20)
        )
        ((port, data),) = leaf1.send(1, bytes(frame))
        pkt = Ether(data)
        assert pkt.src == LEAF1_MAC and pkt[IP].ttl == 63
        assert pkt.dst == {5: "00:00:00:00:fe:03", 6: "00:00:00:00:fe:04"}[port]
        ports.add(port)
    assert ports == {5, 6}
    # h1 -> h5 on 4791: h1's NIC does not do INT (int: switch), so leaf1 is the INT source:
    # shim + MD header inserted, the INT DSCP set, and leaf1's own hop record pushed
    frame = (
        Ether(src="02:00:00:00:01:01", dst=LEAF1_MAC)
        / IP(src="10.0.1.1", dst="10.0.2.1", tos=0b10)
        / UDP(sport=49152, dport=4791)
        / (b"\x04" + b"\x00" * 27)
    )
    ((port, data),) = leaf1.send(1, bytes(frame))
    assert port in (5, 6)
    info = parse_int(scapy_decode(data, int_dscp=0x17))
    assert info is not None and info["md"]["bitmap"] == 0xF500
    assert info["md"]["remaining_hop_cnt"] == 7 and info["shim"]["dscp"] == 0
    (rec,) = info["hops"]
    assert (rec["node_id"], rec["l1_ingress_port"], rec["l1_egress_port"]) == (1, 1, port)


def test_transit_hop_from_a_spine_and_sink_report(leaf1: InProcessSwitch) -> None:
    """An INT packet from a spine (hop record of node 3 already there) to h3."""
    cfg = example(leaf1.addr)

    async def body() -> None:
        sess = await run_session(cfg, "leaf1")
        await sess.stop()

    asyncio.run(body())
    from testbed.packets import int_packet

    pkt = int_packet(
        src_ip="10.0.2.1",
        dst_ip="10.0.1.3",
        sport=50000,
        bitmap=0xF500,
        hops=[
            {
                "node_id": 3,
                "l1_ingress_port": 2,
                "l1_egress_port": 1,
                "hop_latency": 1000,
                "queue_id": 0,
                "queue_occupancy": 0,
                "egress_ts": 5,
                "tx_util": 0,
            }
        ],
        remaining_hop_cnt=7,
        payload=b"\x04" + b"\x00" * 15,
        dst_mac=LEAF1_MAC,
    )
    out = dict(leaf1.send(5, bytes(pkt)))
    assert set(out) == {3, 7}
    report = Ether(out[7])
    assert report.dst == "02:00:00:00:64:01" and report.src == LEAF1_MAC
    assert (report[IP].src, report[IP].dst, report[UDP].dport) == (
        "10.0.100.254",
        "10.0.100.1",
        32766,
    )
    host = Ether(out[3])
    assert host[IP].tos >> 2 == 0 and host[UDP].dport == 4791 and len(host[UDP].payload) == 16
    col = Collector(Topology(cfg))
    col.ingest(bytes(report[UDP].payload))
    assert col.errors == {} and col.reports == 1
    assert col.node_summary()[0]["name"] == "leaf1"
    flow = col.flows[("10.0.2.1", "10.0.1.3", 17, 50000, 4791)]
    assert (flow.src_host, flow.dst_host) == ("h5", "h3")
    # the oldest record is the spine's (arrived from leaf2): that link, the spine's, ours
    assert flow.links == ["leaf2:5", "spine1:1", "leaf1:3"]
    dg = decode(bytes(report[UDP].payload))
    rep = dg.reports[0]
    assert dg.node_id == 1 and [h.node_id for h in rep.hops] == [3]
    assert (rep.sink.in_port, rep.sink.out_port) == (5, 3)
    inner = parse_report(bytes(report[UDP].payload))["reports"][0]["inner"]
    ref = parse_int(scapy_decode(inner, first=IP))
    assert ref is not None and ref["hops"][0]["node_id"] == 3


def test_reload_writes_the_difference_and_a_new_session_writes_nothing(
    leaf1: InProcessSwitch,
) -> None:
    cfg = example(leaf1.addr)

    async def body() -> tuple[SwitchSession, SwitchSession, SwitchSession]:
        first = await run_session(cfg, "leaf1")
        # h8 leaves the fabric, ECN thresholds change
        hosts = tuple(h for h in cfg.hosts if h.name != "h8")
        links = tuple(lk for lk in cfg.links if "h8" not in (lk.a.node, lk.b.node))
        new = dataclasses.replace(
            cfg,
            hosts=hosts,
            links=links,
            ecn=dataclasses.replace(cfg.ecn, kmin_bytes=30_000),
            policy=dataclasses.replace(cfg.policy, hosts={}),
        )
        written = first.health.written
        await first.reload(new, Topology(new), new.switch("leaf1"))
        first.health.written -= written
        await first.stop()
        second = await run_session(new, "leaf1")
        await second.stop()
        third = await run_session(cfg, "leaf1")  # back to the first config
        await third.stop()
        return first, second, third

    first, second, third = asyncio.run(body())
    # one route deleted, 7 ECN entries modified, nothing else
    assert first.health.last_plan == {
        "insert": 0,
        "modify": 7,
        "delete": 1,
        "unchanged": first.health.last_plan["unchanged"],
    }
    assert second.health.written == 0 and second.health.last_plan["insert"] == 0
    assert second.health.last_plan["modify"] == 0 and second.health.last_plan["delete"] == 0
    assert third.health.last_plan["insert"] == 1 and third.health.last_plan["modify"] == 7


def test_without_a_collector_route_int_comes_as_packet_in(leaf1: InProcessSwitch) -> None:
    cfg = example(leaf1.addr)
    cfg = dataclasses.replace(
        cfg, links=tuple(lk for lk in cfg.links if "collector" not in (lk.a.node, lk.b.node))
    )
    col = Collector(Topology(cfg))
    from testbed.packets import int_packet

    pkt = int_packet(
        src_ip="10.0.2.1",
        dst_ip="10.0.1.3",
        sport=50000,
        bitmap=0xF500,
        hops=[
            {
                "node_id": 3,
                "l1_ingress_port": 2,
                "l1_egress_port": 1,
                "hop_latency": 1000,
                "queue_id": 0,
                "queue_occupancy": 0,
                "egress_ts": 5,
                "tx_util": 0,
            }
        ],
        payload=b"\x04" + b"\x00" * 15,
        dst_mac=LEAF1_MAC,
    )

    async def body() -> SwitchSession:
        sess = await run_session(cfg, "leaf1", col)
        await asyncio.sleep(0.2)  # the packet-in reader is listening
        out = await asyncio.to_thread(leaf1.send, 5, bytes(pkt))
        assert [p for p, _ in out] == [3]  # the host still gets it; the clone went to the CPU
        for _ in range(100):
            if col.punted:
                break
            await asyncio.sleep(0.05)
        await sess.stop()
        return sess

    sess = asyncio.run(body())
    assert sess.health.packet_ins == {2: 1}
    assert col.punted == 1 and col.errors == {}
    flow = col.flows[("10.0.2.1", "10.0.1.3", 17, 50000, 4791)]
    assert [h[0] for h in flow.path] == [3, 1] and flow.links[:2] == ["leaf2:5", "spine1:1"]


def test_program_constants_match_the_p4_source() -> None:
    """Clone sessions, packet-in reasons and the tx window are P4 constants, not P4Info."""
    import re

    from controller import program

    define = (REPO / "p4src" / "include" / "define.p4").read_text()

    def const(name: str) -> int:
        m = re.search(rf"(?:const\s+bit<\d+>\s+{name}\s*=|#define\s+{name})\s*(\w+)", define)
        assert m is not None, name
        return int(m.group(1), 0)

    assert const("REPORT_CLONE_SESSION") == program.REPORT_CLONE_SESSION
    assert const("CPU_CLONE_SESSION") == program.CPU_CLONE_SESSION
    assert const("PUNT_ACL") == program.PUNT_ACL
    assert const("PUNT_REPORT_UNSENT") == program.PUNT_REPORT_UNSENT
    assert 1 << const("TX_UTIL_WINDOW_SHIFT") == program.TX_UTIL_WINDOW_NS
    assert program.tx_util_mult(100e6) == 5_000_000  # p4src/README.md's figures
    assert program.tx_util_mult(400e9) == 1250
    assert program.tx_util_mult(20e6, 24) == 1_562_500  # 2^16 * 8e15 / (20e6 * 2^24)
    # a window holds 8 mean frames at the slowest port: 1000 B at 100 Mb/s fit the default
    # 2^20 ns; 4154 B at 20 Mb/s need 13.3 ms -> 2^24 ns
    assert program.tx_util_window_shift(100e6, 1000) == 20
    assert program.tx_util_window_shift(20e6, 4154) == 24
    # at 400G 8 frames take 160 ns: the program's shortest window, 1.02 us (about the base RTT)
    assert program.tx_util_window_shift(400e9, 1000) == program.TX_UTIL_SHIFT_MIN == 10
    assert program.tx_util_window_shift(400e9, 4154) == 10  # 665 ns
    # the shortest window is what both architectures' TimeWindow take
    arch = REPO / "p4src" / "include" / "arch"
    v1 = re.search(r"if \(s < (\d+) \|\| s > 40\)", (arch / "v1model.p4").read_text())
    assert v1 is not None and int(v1.group(1)) == program.TX_UTIL_SHIFT_MIN
    tna = re.search(r"#define WINDOW_ALL\(X\)\s*\\\s*X\((\d+), 0\)", (arch / "tna.p4").read_text())
    assert tna is not None and int(tna.group(1)) == program.TX_UTIL_SHIFT_MIN
    # The Tofino programs multiply by tx_util_mult's two leading bits among bits 0-26
    # (include/arch/tna.p4, MulShr8): the window the controller picks keeps every port's
    # multiplier below 2^27, down to minimum-size frames at the slowest port.
    for slowest in (1e6, 10e6, 20e6, 100e6, 1e9, 400e9):
        for frame in (64, 100, 1000, 9000):
            shift = program.tx_util_window_shift(slowest, frame)
            for speed in (slowest, slowest * 4, 800e9):
                assert program.tx_util_mult(speed, shift) < 1 << 27, (slowest, frame, speed)
