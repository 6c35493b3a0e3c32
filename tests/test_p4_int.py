"""INT-MD v2.1 in the P4 switch: transit across a chain of three switches, agreement with the
golden vectors, hop budget (E bit), MTU (M bit), tx utilization, INT source and sink with
Telemetry Report v2.0, and malformed INT. Switches are programmed over P4Runtime; frames are
decoded with the project's scapy layers (testbed/packets)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import checksum

from controller.wire.int_md import INT_DSCP_DEFAULT
from testbed.packets import decode, encode_stack, int_packet, parse_int, parse_report
from testbed.packets.telemetry_report import TelemetryReportIndividual
from tests.p4 import program as P
from tests.p4.fixtures import FabricFactory, fabric  # noqa: F401
from tests.p4.harness import Fabric, Topology
from tests.p4.int_chain import CHAIN, program_chain, sw_mac

VECTORS = {
    v["name"]: v
    for v in json.loads((Path(__file__).parent / "data" / "int_v21.json").read_text())["vectors"]
}
BITMAP = 0xF500  # bits 0,1,2,3,5,7: Hop ML 7
HOP_BYTES = 28
STACK_AT = 14 + 20 + 8 + 4 + 12  # where the metadata stack starts in a frame without options
# byte offsets in such a frame: shim type 42, shim length 43, MD version 46, Hop ML 48 (low
# 5 bits), RemainingHopCnt 49

# counter indexes (p4src/include/define.p4)
INT_OK, INT_TRUNCATED, INT_LEN_PAST_END, INT_BAD_SHIM_LEN = 1, 2, 3, 4
INT_BAD_VERSION, INT_BAD_HOP_ML, INT_UNSUPPORTED = 5, 6, 7
SOURCE_INSERTED = 0
TRANSIT_PUSHED, TRANSIT_E_BIT, TRANSIT_M_BIT = 0, 1, 2
SINK_STRIPPED, SINK_REPORT, SINK_REPORT_TO_CPU = 0, 1, 2
PUNT_REPORT_UNSENT = 2

# One switch, ports as in the golden vectors' second hop (node 2: port 5 -> port 7).
ONE = Topology(1, hosts={"a": (0, 5), "b": (0, 7), "s": (0, 8)})


def program_one(fab: Fabric, node_id: int = 2, mtu: int = 9000) -> None:
    fab.write(0, P.switch_config(node_id=node_id))
    for port in (5, 7, 8):
        fab.write(0, P.port_config(port, speed_bps=100e6, mtu=mtu))
    fab.write(0, P.host_route("10.0.2.0/24", 1, port=7, smac=sw_mac(9), dmac=P.mac(0x22)))
    fab.write(0, P.host_route("10.0.1.0/24", 2, port=5, smac=sw_mac(9), dmac=P.mac(0x11)))
    fab.write(0, P.host_route("10.0.8.0/24", 3, port=8, smac=sw_mac(9), dmac=P.mac(0x88)))


def golden(name: str) -> bytes:
    return bytes.fromhex(VECTORS[name]["hex"])


def fix_ipv4(frame: bytearray) -> bytes:
    frame[24:26] = b"\x00\x00"
    ihl = (frame[14] & 0x0F) * 4
    frame[24:26] = checksum(bytes(frame[14 : 14 + ihl])).to_bytes(2, "big")
    return bytes(frame)


def routed(frame: bytes, smac: int, dmac: int, hops: int = 1) -> bytes:
    """`frame` as a router leaves it: MACs rewritten, TTL - hops, IPv4 checksum fixed."""
    out = bytearray(frame)
    out[0:6] = dmac.to_bytes(6, "big")
    out[6:12] = smac.to_bytes(6, "big")
    out[22] -= hops
    return fix_ipv4(out)


def int_of(frame: bytes) -> dict[str, Any]:
    info = parse_int(decode(frame, INT_DSCP_DEFAULT))
    assert info is not None, "no INT in the frame"
    return info


def ipv4_ok(frame: bytes, at: int = 14) -> bool:
    ihl = (frame[at] & 0x0F) * 4
    return checksum(frame[at : at + ihl]) == 0


def plain_udp(sport: int = 49152, dscp: int = 0x0A, payload: bytes = bytes(range(40))) -> bytes:
    """A RoCE-like packet from a host that does not do INT (UDP checksum 0, ECT(0))."""
    return bytes(
        Ether(src="02:00:00:00:00:11", dst="02:00:00:00:00:b0")
        / IP(src="10.0.1.1", dst="10.0.2.2", tos=(dscp << 2) | 0b10, ttl=64, flags="DF", id=7)
        / UDP(sport=sport, dport=4791, chksum=0)
        / Raw(payload)
    )


def test_int_across_three_switches(fabric: FabricFactory) -> None:  # noqa: F811
    """3 records newest first, node ids and ports right, egress timestamps increasing along
    the path, queue occupancy > 0 where the egress port is slower than the offered load; the
    INT bytes agree with the golden three-hop vector field by field."""
    fab = fabric(CHAIN)
    src = golden("no_hops_yet")
    program_chain(fab, frame_bytes=len(src) + 3 * HOP_BYTES)
    n = 8
    fab.set_port_rate(2, 2, pps=1000, frame_bytes=len(src) + 3 * HOP_BYTES)
    for _ in range(n):
        fab.send("h1", src)
    fab.settle()
    out = fab.take("h2")
    assert len(out) == n
    want = VECTORS["three_hops_newest_first"]
    want_frame = golden("three_hops_newest_first")
    occupancy = []
    for frame in out:
        assert len(frame) == len(want_frame)
        assert frame[:12] == (P.mac(0x22).to_bytes(6, "big") + sw_mac(2).to_bytes(6, "big"))
        assert frame[22] == src[22] - 3  # TTL
        assert ipv4_ok(frame)
        # IPv4 total length, UDP length, shim length as in the vector (same packet, 3 hops)
        assert frame[16:18] == want_frame[16:18]
        assert frame[38:40] == want_frame[38:40] and frame[40:42] == b"\x00\x00"
        info = int_of(frame)
        assert info["md"] == want["decoded"]["md"]
        assert info["shim"]["length"] == 3 + 3 * 7 and info["shim"]["dscp"] == 0
        assert info["payload"].hex() == want["decoded"]["payload_hex"]
        hops = info["hops"]
        assert [h["node_id"] for h in hops] == [3, 2, 1]
        assert [(h["l1_ingress_port"], h["l1_egress_port"]) for h in hops] == [(1, 2)] * 3
        assert [set(h) for h in hops] == [set(h) for h in want["decoded"]["hops"]]
        ts = [h["egress_ts"] for h in reversed(hops)]
        assert ts == sorted(ts) and len(set(ts)) == 3, ts
        for h in hops:
            assert h["queue_id"] == 0
            assert h["hop_latency"] is not None and h["tx_util"] is not None
        if fab.virtual_time:  # (bmv2's software ports are slow enough to queue anywhere)
            assert hops[1]["queue_occupancy"] == 0 and hops[2]["queue_occupancy"] == 0
        occupancy.append(hops[0]["queue_occupancy"])
        # re-encoding the decoded fields gives the switch's bytes
        assert encode_stack(hops, BITMAP) == frame[STACK_AT : STACK_AT + 3 * HOP_BYTES]
    assert max(occupancy) > 0, occupancy
    if fab.virtual_time:
        # the queue left behind each packet, in bytes, exactly
        assert occupancy == [(n - 1 - k) * (len(src) + 2 * HOP_BYTES) for k in range(n)]
    for i in range(3):
        assert fab.counter(i, "int_transit_events", TRANSIT_PUSHED)[0] == n
        assert fab.counter(i, "int_status", INT_OK)[0] == n


@pytest.mark.parametrize("name", ["no_hops_yet", "one_hop", "three_hops_newest_first"])
def test_transit_appends_to_golden_vectors(fabric: FabricFactory, name: str) -> None:  # noqa: F811
    fab = fabric(ONE)
    program_one(fab)
    src = golden(name)
    vec = VECTORS[name]["decoded"]
    fab.send("a", src)
    fab.settle()
    (out,) = fab.take("b")
    assert ipv4_ok(out)
    info = int_of(out)
    assert info["md"] == {**vec["md"], "remaining_hop_cnt": vec["md"]["remaining_hop_cnt"] - 1}
    new, *old = info["hops"]
    assert old == vec["hops"]
    assert new["node_id"] == 2
    assert (new["l1_ingress_port"], new["l1_egress_port"]) == (5, 7)
    # everything after the new record is the vector's stack and payload, byte for byte
    assert out[STACK_AT + HOP_BYTES :] == src[STACK_AT:]
    # lengths grew by one record
    assert int.from_bytes(out[16:18], "big") == int.from_bytes(src[16:18], "big") + HOP_BYTES
    assert int.from_bytes(out[38:40], "big") == int.from_bytes(src[38:40], "big") + HOP_BYTES
    assert out[43] == src[43] + 7  # shim length, words


def test_every_instruction_bit_all_ones_where_unavailable(fabric: FabricFactory) -> None:  # noqa: F811
    """Bitmap 0xFFFF: a 19-word record in bit order; L2 ports (6), buffer (8), reserved
    (9-14) and checksum complement (15) are all-ones (None when decoded), the rest values."""
    fab = fabric(ONE)
    program_one(fab)
    src = int_packet(
        src_ip="10.0.1.1", dst_ip="10.0.2.2", sport=49152, bitmap=0xFFFF, payload=b"\x00" * 16
    )
    fab.send("a", bytes(src))
    fab.settle()
    (out,) = fab.take("b")
    info = int_of(out)
    assert info["md"]["hop_ml"] == 19 and info["md"]["remaining_hop_cnt"] == 7
    (hop,) = info["hops"]
    unavailable = {
        "l2_ingress_port",
        "l2_egress_port",
        "buffer_id",
        "buffer_occupancy",
        "checksum_complement",
        *(f"reserved_bit{b}" for b in range(9, 15)),
    }
    assert {k for k, v in hop.items() if v is None} == unavailable
    assert hop["node_id"] == 2 and (hop["l1_ingress_port"], hop["l1_egress_port"]) == (5, 7)
    assert hop["egress_ts"] >= hop["ingress_ts"]
    assert hop["hop_latency"] == hop["egress_ts"] - hop["ingress_ts"]
    record = out[STACK_AT : STACK_AT + 19 * 4]
    assert record[-4 * 8 :] == b"\xff" * 32  # bits 8..15: one word each, in order, last
    assert encode_stack([hop], 0xFFFF) == record


def test_spent_hop_budget_sets_e_and_adds_nothing(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(ONE)
    program_one(fab)
    src = golden("budget_exhausted_E_set")
    fab.send("a", src)
    fab.settle()
    (out,) = fab.take("b")
    assert out == routed(src, sw_mac(9), P.mac(0x22))
    assert fab.counter(0, "int_transit_events", TRANSIT_E_BIT)[0] == 1


def test_hop_budget_of_two_over_three_hops(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(CHAIN)
    program_chain(fab)
    src = bytearray(golden("no_hops_yet"))
    src[49] = 2  # RemainingHopCnt
    fab.send("h1", bytes(src))
    fab.settle()
    (out,) = fab.take("h2")
    info = int_of(out)
    assert info["md"]["E"] == 1 and info["md"]["remaining_hop_cnt"] == 0
    assert [h["node_id"] for h in info["hops"]] == [2, 1]
    assert fab.counter(2, "int_transit_events", TRANSIT_E_BIT)[0] == 1
    assert fab.counter(2, "int_transit_events", TRANSIT_PUSHED)[0] == 0


def test_mtu_sets_m_instead_of_growing_past_it(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(CHAIN)
    program_chain(fab)
    src = golden("no_hops_yet")
    ip_len = int.from_bytes(src[16:18], "big")
    # s2's link to s3 takes one record more than the packet arriving from s1, not two
    fab.write(1, P.port_config(2, mtu=ip_len + HOP_BYTES + 10, modify=True))
    fab.send("h1", src)
    fab.settle()
    (out,) = fab.take("h2")
    info = int_of(out)
    assert info["md"]["M"] == 1
    assert [h["node_id"] for h in info["hops"]] == [3, 1]
    assert info["md"]["remaining_hop_cnt"] == 6
    assert fab.counter(1, "int_transit_events", TRANSIT_M_BIT)[0] == 1


@pytest.mark.parametrize("shift", [P.TX_UTIL_WINDOW_SHIFT, 22, 13])
def test_tx_utilization_per_window(fabric: FabricFactory, shift: int) -> None:  # noqa: F811
    """Each packet carries its egress port's utilization over the previous window of 2^shift
    ns (the program's default 2^20, or what switch_config sets, down to 2^10: 2^13 is 8.2 us,
    8 or 9 steps of v1model's microsecond clock): exactly the bytes (as enqueued, before this
    hop's record, as the traffic manager charges them) the packets in that window brought, by
    their own egress timestamps, each scaled to ppm with 8 fraction bits; and a stream at half
    the port's speed reads about 500,000 ppm."""
    window_ns = 1 << shift
    fab = fabric(ONE)
    if window_ns < 100_000 and not fab.virtual_time:
        pytest.skip("a real-time target cannot be sent a stream 100 ns apart")
    program_one(fab)
    if shift != P.TX_UTIL_WINDOW_SHIFT:
        fab.write(0, P.switch_config(node_id=2, tx_util_shift=shift))
    src = golden("no_hops_yet")
    gap_ns = min(100_000, window_ns // 80)
    if not fab.virtual_time:
        # A real-time target must keep up with the stream or drop at its queue (64 packets):
        # bmv2 on a busy 2-core box lost 70-90 of 251 frames sent 100 us apart, so a real
        # clock sends at most a queue's worth of frames, spread over the same six windows.
        gap_ns = max(gap_ns, 6 * window_ns // 60)
    speed = len(src) * 8 / (gap_ns / 1e9) * 2  # the stream fills half the port
    fab.write(0, P.port_config(7, speed_bps=speed, modify=True, tx_util_shift=shift))
    n = 6 * window_ns // gap_ns  # five windows and more
    for _ in range(n):
        fab.send("a", src)
        fab.wait(gap_ns)
    fab.settle()
    out = fab.take("b")
    assert len(out) == n
    hops = [int_of(f)["hops"][0] for f in out]
    window = [h["egress_ts"] >> shift for h in hops]
    per_window = Counter(window)
    mult = P.tx_util_mult(speed, shift)
    # each packet adds its bytes scaled to ppm with 8 fraction bits; a window's sum, >> 8
    want = [(per_window[w - 1] * ((len(src) * mult) >> 8)) >> 8 for w in window]
    assert [h["tx_util"] for h in hops] == want
    if fab.virtual_time:  # (a real clock paces the stream only roughly)
        settled = want[int(1.5 * window_ns // gap_ns) :]
        assert all(abs(u - 500_000) <= 0.12 * 500_000 for u in settled), want


def program_source_and_sink(fab: Fabric, with_collector: bool = True) -> None:
    program_chain(fab)
    fab.write(
        0, P.watch(bitmap=BITMAP, hop_budget=8, domain_id=5, ipv4_src="10.0.1.1", ip_proto=17)
    )
    fab.write(2, P.sink_port(2))
    if with_collector:
        fab.write(
            2,
            P.collector(
                src_mac=sw_mac(2),
                dst_mac=P.mac(0x99),
                src_addr="10.0.0.3",
                dst_addr="10.0.9.9",
                port=3,
            ),
        )
    else:
        fab.write(2, P.cpu_clone_session())


def test_source_and_sink_restore_the_packet_and_report(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(CHAIN)
    program_source_and_sink(fab)
    n = 5
    sent = [plain_udp(sport=49152 + k) for k in range(n)]
    for f in sent:
        fab.send("h1", f)
        fab.settle()
    # the host gets the original packet: no INT, original DSCP, lengths and checksums right
    got = fab.take("h2")
    assert got == [routed(f, sw_mac(2), P.mac(0x22), hops=3) for f in sent]
    assert fab.counter(0, "int_source_events", SOURCE_INSERTED)[0] == n
    assert fab.counter(2, "int_sink_events", SINK_STRIPPED)[0] == n
    assert fab.counter(2, "int_sink_events", SINK_REPORT)[0] == n

    reports = fab.take("collector")
    assert len(reports) == n
    seqs = []
    for k, frame in enumerate(reports):
        pkt = Ether(frame)
        assert pkt.dst == "02:00:00:00:00:99" and pkt.src == "02:00:00:00:00:b2"
        assert pkt[IP].src == "10.0.0.3" and pkt[IP].dst == "10.0.9.9" and pkt[IP].ttl == 64
        assert ipv4_ok(frame) and pkt[IP].len == len(frame) - 14
        assert pkt[UDP].dport == 32766 and pkt[UDP].len == len(frame) - 34
        rep = parse_report(bytes(pkt[UDP].payload), INT_DSCP_DEFAULT)
        assert rep["ver"] == 2 and rep["node_id"] == 3
        seqs.append(rep["seq"])
        (ind,) = rep["reports"]
        assert (ind["rep_type"], ind["in_type"]) == (1, 4)
        assert (ind["D"], ind["Q"], ind["F"], ind["I"]) == (0, 0, 1, 0)
        assert ind["rep_md_bits"] == 0x7500 and ind["md_len_words"] == 6
        assert ind["domain_id"] == 5
        assert ind["report_len_words"] == 2 + 6 + len(ind["inner"]) // 4
        sink_md = TelemetryReportIndividual(bytes(pkt[UDP].payload)[8:]).metadata_dict()
        assert (sink_md["l1_ingress_port"], sink_md["l1_egress_port"]) == (1, 2)
        assert sink_md["egress_ts"] is not None and sink_md["tx_util"] is not None
        # inner: the packet as the sink received it, INT stack included, 16 bytes past it
        inner = decode(ind["inner"], INT_DSCP_DEFAULT, first=IP)
        info = parse_int(inner)
        assert info is not None
        assert inner[IP].src == "10.0.1.1" and inner[IP].dst == "10.0.2.2"
        assert inner[IP].tos >> 2 == INT_DSCP_DEFAULT and inner[IP].ttl == 62
        assert info["shim"]["dscp"] == 0x0A
        assert info["md"]["domain_id"] == 5 and info["md"]["remaining_hop_cnt"] == 6
        assert [h["node_id"] for h in info["hops"]] == [2, 1]
        assert info["payload"] == bytes(range(16))
        assert inner[UDP].sport == 49152 + k
    assert seqs == list(range(seqs[0], seqs[0] + n)), seqs


def test_report_carries_the_sink_ports_utilization(fabric: FabricFactory) -> None:  # noqa: F811
    """A report's tx utilization is the sink port's, as its latest packet left it: the load of
    the port's last complete window (each packet's bytes scaled to ppm with 8 fraction bits),
    so once the stream has run a few windows every report reads one window's worth of the
    stream."""
    fab = fabric(CHAIN)
    program_source_and_sink(fab)
    gap_ns = 100_000  # 10.5 packets per 2^20 ns window
    n = 60
    for k in range(n):
        fab.send("h1", plain_udp(sport=49152 + k))
        fab.wait(gap_ns)
    fab.settle()
    reports = fab.take("collector")
    assert len(reports) == n
    utils = []
    for frame in reports:
        payload = bytes(Ether(frame)[UDP].payload)
        utils.append(TelemetryReportIndividual(payload[8:]).metadata_dict()["tx_util"])
    # the sink port's packets as enqueued: the INT packet as the sink received it
    (ind,) = parse_report(bytes(Ether(reports[0])[UDP].payload), INT_DSCP_DEFAULT)["reports"]
    frame_len = 14 + decode(ind["inner"], INT_DSCP_DEFAULT, first=IP)[IP].len
    per_packet = (frame_len * P.tx_util_mult(100e6)) >> 8
    possible = {(c * per_packet) >> 8 for c in range(0, 13)}
    assert set(utils) <= possible, (utils, frame_len)
    if fab.virtual_time:  # (a real clock paces the stream only roughly)
        settled = utils[n // 2 :]
        assert all(u in {(c * per_packet) >> 8 for c in (10, 11)} for u in settled), utils
    else:
        assert any(utils[n // 2 :]), utils


def test_source_and_sink_on_one_switch_leave_the_packet_plain(fabric: FabricFactory) -> None:  # noqa: F811
    """Both hosts on one switch, neither doing INT: the watchlist matches but the egress port
    is a sink port, so there is no fabric hop to measure and nothing is added."""
    fab = fabric(ONE)
    program_one(fab)
    fab.write(
        0, P.watch(bitmap=BITMAP, hop_budget=8, domain_id=5, ipv4_src="10.0.1.1", ip_proto=17)
    )
    fab.write(0, P.sink_port(7))
    sent = plain_udp()
    fab.send("a", sent)
    fab.settle()
    assert fab.take("b") == [routed(sent, sw_mac(9), P.mac(0x22))]
    assert fab.counter(0, "int_source_events", SOURCE_INSERTED)[0] == 0
    assert fab.counter(0, "int_sink_events", SINK_STRIPPED)[0] == 0


def test_sink_without_collector_sends_packet_in(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(CHAIN)
    program_source_and_sink(fab, with_collector=False)
    sent = plain_udp()
    fab.send("h1", sent)
    fab.settle()
    assert fab.take("h2") == [routed(sent, sw_mac(2), P.mac(0x22), hops=3)]
    (pin,) = fab.packet_ins(2, wait=5)
    assert pin["reason"] == PUNT_REPORT_UNSENT and pin["ingress_port"] == 1
    info = int_of(pin.payload)  # the INT packet as s3 received it
    assert [h["node_id"] for h in info["hops"]] == [2, 1]
    assert fab.counter(2, "int_sink_events", SINK_REPORT_TO_CPU)[0] == 1
    assert not fab.take("collector")


def test_hosts_doing_int_themselves_pass_untouched(fabric: FabricFactory) -> None:  # noqa: F811
    """An INT packet from a NIC source is not sourced again; a port without a sink entry
    (the NIC is the sink) delivers it with every hop's record."""
    fab = fabric(CHAIN)
    program_source_and_sink(fab)
    nic_int = bytearray(golden("no_hops_yet"))
    nic_int[32:34] = b"\x03\x03"  # 10.0.2.2 -> 10.0.3.3 (h3, no sink entry)
    nic_int = bytearray(fix_ipv4(nic_int))
    fab.send("h1", bytes(nic_int))
    fab.settle()
    (out,) = fab.take("h3")
    info = int_of(out)
    assert [h["node_id"] for h in info["hops"]] == [3, 2, 1]
    assert out[STACK_AT + 3 * HOP_BYTES :] == bytes(nic_int[STACK_AT:])
    assert fab.counter(0, "int_source_events", SOURCE_INSERTED)[0] == 0
    assert not fab.take("collector") and not fab.take("h2")


def malformed_cases() -> dict[str, tuple[bytes, int]]:
    """Name -> (frame, int_status index it must be counted under)."""
    good = golden("no_hops_yet")
    cases: dict[str, tuple[bytes, int]] = {}

    # the packet ends inside the MD header (IPv4/UDP lengths say so too)
    short = bytearray(good[: 14 + 20 + 8 + 4 + 6])
    short[16:18] = (len(short) - 14).to_bytes(2, "big")
    short[38:40] = (len(short) - 34).to_bytes(2, "big")
    cases["truncated"] = (fix_ipv4(short), INT_TRUNCATED)

    past = bytearray(good)
    past[43] = 40  # shim length: 160 bytes, the packet has 28 after the shim
    cases["shim_length_past_the_packet"] = (bytes(past), INT_LEN_PAST_END)

    hop_ml_0 = bytearray(good)
    hop_ml_0[48] &= 0xE0
    cases["hop_ml_0"] = (bytes(hop_ml_0), INT_BAD_HOP_ML)

    hop_ml_wrong = bytearray(good)
    hop_ml_wrong[48] = (hop_ml_wrong[48] & 0xE0) | 5  # the bitmap needs 7
    cases["hop_ml_not_the_bitmap"] = (bytes(hop_ml_wrong), INT_BAD_HOP_ML)

    version = bytearray(good)
    version[46] = (3 << 4) | (version[46] & 0x0F)
    cases["unknown_version"] = (bytes(version), INT_BAD_VERSION)

    shim_short = bytearray(good)
    shim_short[43] = 2
    cases["shim_shorter_than_md"] = (bytes(shim_short), INT_BAD_SHIM_LEN)

    other_type = bytearray(good)
    other_type[42] = (3 << 4) | (other_type[42] & 0x0F)  # INT-MX
    cases["not_int_md"] = (bytes(other_type), INT_UNSUPPORTED)
    return cases


def test_malformed_int_is_forwarded_untouched_and_counted(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(ONE)
    program_one(fab)
    fab.write(0, P.sink_port(8))
    fab.write(0, P.cpu_clone_session())
    good = golden("no_hops_yet")
    cases = malformed_cases()
    for name, (frame, status) in cases.items():
        fab.send("a", frame)
        fab.settle()
        assert fab.take("b") == [routed(frame, sw_mac(9), P.mac(0x22))], name
        assert fab.counter(0, "int_status", status)[0] >= 1, name
        # the next packet is processed as if nothing had happened
        fab.send("a", good)
        fab.settle()
        (out,) = fab.take("b")
        info = int_of(out)
        assert [h["node_id"] for h in info["hops"]] == [2], name
        assert out[STACK_AT + HOP_BYTES :] == good[STACK_AT:], name
        # to a sink port: not stripped, no report
        to_sink = bytearray(frame)
        to_sink[32] = 8  # 10.0.2.2 -> 10.0.8.2
        to_sink = bytearray(fix_ipv4(to_sink))
        fab.send("a", bytes(to_sink))
        fab.settle()
        assert fab.take("s") == [routed(bytes(to_sink), sw_mac(9), P.mac(0x88))], name
        assert not fab.packet_ins(0), name
    counts = {status: 0 for _, status in cases.values()}
    for _, status in cases.values():
        counts[status] += 2  # to b and to the sink port
    for status, n in counts.items():
        assert fab.counter(0, "int_status", status)[0] == n
    assert fab.counter(0, "int_status", INT_OK)[0] == len(cases)
    assert fab.counter(0, "int_transit_events", TRANSIT_PUSHED)[0] == len(cases)
