"""The P4 switch forwards: IPv4 routing (TTL, checksum, options), ECMP, drops with reasons,
port counters, and packet-in / packet-out on the CPU port. Programmed over P4Runtime."""

from __future__ import annotations

from collections import Counter

from scapy.layers.inet import IP, UDP, IPOption_Router_Alert
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw
from scapy.utils import checksum

from tests.p4 import program as P
from tests.p4.fixtures import FabricFactory, fabric  # noqa: F401
from tests.p4.harness import Fabric, Topology

# drops counter indexes (p4src/include/define.p4)
DROP_NOT_IPV4, DROP_IPV4_BAD_CHECKSUM, DROP_IPV4_BAD_IHL = 1, 2, 3
DROP_NO_ROUTE, DROP_TTL_EXPIRED = 4, 5
PUNT_ACL = 1

ONE_SWITCH = Topology(1, hosts={f"h{n}": (0, n) for n in range(1, 6)})
ROUTER_MAC = P.mac(0xA0)
ROUTER = "02:00:00:00:00:a0"


def host_mac(n: int) -> str:
    return f"02:00:00:00:00:{n:02x}"


def program_one_switch(fab: Fabric) -> None:
    fab.write(0, P.switch_config(node_id=1))
    for n in range(1, 6):
        fab.write(0, P.host_route(f"10.0.{n}.0/24", n, port=n, smac=ROUTER_MAC, dmac=P.mac(n)))


def udp(
    src: str = "10.0.1.1",
    dst: str = "10.0.2.2",
    sport: int = 1234,
    ttl: int = 64,
    tos: int = 0x28,
    payload: bytes = b"x" * 20,
) -> Ether:
    return (
        Ether(src=host_mac(1), dst=ROUTER)
        / IP(src=src, dst=dst, ttl=ttl, tos=tos)
        / UDP(sport=sport, dport=5678)
        / Raw(payload)
    )


def routed(pkt: Ether, port: int) -> bytes:
    """What the switch should send for `pkt` routed out of `port`."""
    exp = pkt.copy()
    exp[Ether].src, exp[Ether].dst = ROUTER, host_mac(port)
    exp[IP].ttl -= 1
    del exp[IP].chksum
    return bytes(exp)


def ipv4_header_ok(frame: bytes) -> bool:
    ihl = (frame[14] & 0x0F) * 4
    return checksum(frame[14 : 14 + ihl]) == 0


def test_routes_rewrites_macs_decrements_ttl_and_fixes_checksum(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(ONE_SWITCH)
    program_one_switch(fab)
    pkt = udp()
    fab.send("h1", bytes(pkt))
    fab.settle()
    (out,) = fab.take("h2")
    assert out == routed(pkt, 2)
    assert ipv4_header_ok(out)
    assert all(not fab.take(h) for h in ("h1", "h3", "h4", "h5"))
    assert fab.counter(0, "port_rx", 1)[0] == 1
    assert fab.counter(0, "port_tx", 2)[0] == 1


def test_ipv4_options_are_carried_and_checksummed(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(ONE_SWITCH)
    program_one_switch(fab)
    pkt = (
        Ether(src=host_mac(1), dst=ROUTER)
        / IP(src="10.0.1.1", dst="10.0.3.3", options=[IPOption_Router_Alert()])
        / UDP(sport=1, dport=2)
        / Raw(b"opt")
    )
    assert pkt[IP].ihl is None and len(bytes(pkt[IP])) > 20 + 8
    fab.send("h1", bytes(pkt))
    fab.settle()
    (out,) = fab.take("h3")
    assert out[14] & 0x0F == 6
    assert out == routed(Ether(bytes(pkt)), 3)
    assert ipv4_header_ok(out)


def test_drops_are_counted_by_reason(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(ONE_SWITCH)
    program_one_switch(fab)
    bad_sum = bytearray(bytes(udp()))
    bad_sum[24] ^= 0xFF  # IPv4 header checksum
    bad_ihl = bytearray(bytes(udp()))
    bad_ihl[14] = 0x44  # IHL 4
    frames = [
        bytes(udp(ttl=1)),  # forwarding would make it 0
        bytes(udp(ttl=0)),
        bytes(udp(dst="192.168.7.7")),  # no route
        bytes(bad_sum),
        bytes(bad_ihl),
        bytes(Ether(src=host_mac(1), dst="ff:ff:ff:ff:ff:ff") / ARP(pdst="10.0.1.254")),
    ]
    for f in frames:
        fab.send("h1", f)
    fab.settle()
    assert all(not fab.take(h) for h in ("h1", "h2", "h3", "h4", "h5"))
    assert fab.counter(0, "drops", DROP_TTL_EXPIRED)[0] == 2
    assert fab.counter(0, "drops", DROP_NO_ROUTE)[0] == 1
    assert fab.counter(0, "drops", DROP_IPV4_BAD_CHECKSUM)[0] == 1
    assert fab.counter(0, "drops", DROP_IPV4_BAD_IHL)[0] == 1
    assert fab.counter(0, "drops", DROP_NOT_IPV4)[0] == 1
    assert fab.counter(0, "port_rx", 1)[0] == len(frames)
    # ... and the switch still forwards
    fab.send("h1", bytes(udp()))
    fab.settle()
    assert len(fab.take("h2")) == 1


def test_ecmp_spreads_1000_flows_over_4_next_hops(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(ONE_SWITCH)
    program_one_switch(fab)
    hops = [(port, ROUTER_MAC, P.mac(port)) for port in (2, 3, 4, 5)]
    fab.write(0, P.route("10.9.0.0/16", 9) + P.next_hops(9, hops))

    def flow(i: int) -> bytes:
        return bytes(
            udp(
                src=f"10.0.1.{1 + i % 200}",
                dst=f"10.9.{i // 250}.{1 + i % 250}",
                sport=49152 + i,
                tos=0,
            )
        )

    for i in range(1000):
        fab.send("h1", flow(i))
        if i % 16 == 15:  # stay within the ports' queues (64 packets)
            fab.settle()
    fab.settle()
    per_host = {h: fab.take(h) for h in ("h2", "h3", "h4", "h5")}
    counts = {h: len(v) for h, v in per_host.items()}
    assert sum(counts.values()) == 1000, counts
    for h, n in counts.items():
        assert 0.85 * 250 <= n <= 1.15 * 250, counts
        port = int(h[1:])
        assert all(Ether(f).dst == host_mac(port) for f in per_host[h])
    # a flow always takes the same next hop
    first = {}
    for h, frames in per_host.items():
        for f in frames:
            first[(IP(f[14:]).src, IP(f[14:]).dst, UDP(f[34:]).sport)] = h
    for i in range(0, 1000, 20):
        fab.send("h1", flow(i))
    fab.settle()
    again: Counter[str] = Counter()
    for h in ("h2", "h3", "h4", "h5"):
        for f in fab.take(h):
            key = (IP(f[14:]).src, IP(f[14:]).dst, UDP(f[34:]).sport)
            assert first[key] == h
            again[h] += 1
    assert sum(again.values()) == 50


def test_punt_to_cpu_and_packet_out(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(ONE_SWITCH)
    program_one_switch(fab)
    fab.write(0, P.punt(eth_type=0x88CC))
    probe = bytes(Ether(src=host_mac(4), dst="01:80:c2:00:00:0e", type=0x88CC) / Raw(b"probe"))
    fab.send("h4", probe)
    fab.settle()
    (pin,) = fab.packet_ins(0, wait=5)
    assert pin.payload == probe
    assert pin["ingress_port"] == 4 and pin["reason"] == PUNT_ACL
    assert all(not fab.take(h) for h in ("h1", "h2", "h3", "h4", "h5"))

    # The controller answers out of a port of its choosing, untouched by the pipeline.
    fab.packet_out(0, probe, egress_port=3)
    fab.settle()
    assert fab.take("h3") == [probe]
    # a routed packet is not punted
    fab.send("h1", bytes(udp()))
    fab.settle()
    assert len(fab.take("h2")) == 1 and not fab.packet_ins(0)
