"""The collector: the fast report decoder agrees with the golden vector and with the project's
scapy layers; lost reports are counted exactly from sequence gaps (and un-counted when a late
one arrives); links, flows and port-counter utilisation are tracked in bounded series; any
malformed datagram is a counted skip."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from scapy.layers.inet import IP

from controller.collector import SEQ_MOD, Collector, SeqTracker, udp_socket
from controller.config import load
from controller.topology import Topology
from controller.wire.telemetry_report import ReportError, decode
from testbed.packets import decode as scapy_decode
from testbed.packets import parse_int, parse_report
from tests.telemetry_helpers import EXAMPLE, hop, report

VECTORS = Path(__file__).parent / "data" / "int_v21.json"


def golden_report() -> bytes:
    doc = json.loads(VECTORS.read_text())
    vec = next(v for v in doc["vectors"] if v["kind"] == "telemetry_report_v2")
    return bytes.fromhex(vec["hex"])


def test_fast_decoder_matches_golden_vector_and_scapy() -> None:
    data = golden_report()
    dg = decode(data)
    ref = parse_report(data)
    assert (dg.seq, dg.node_id, dg.hw_id) == (41, 3, 0)
    assert (ref["seq"], ref["node_id"], ref["hw_id"]) == (41, 3, 0)
    rep = dg.reports[0]
    pkt = IP(ref["reports"][0]["inner"])
    assert rep.flow is not None
    assert rep.flow.astuple() == (pkt.src, pkt.dst, 17, pkt.sport, pkt.dport)
    ref_int = parse_int(scapy_decode(ref["reports"][0]["inner"], first=IP))
    assert ref_int is not None
    assert len(rep.hops) == len(ref_int["hops"]) == 2
    for mine, theirs in zip(rep.hops, ref_int["hops"], strict=True):
        assert mine.node_id == theirs["node_id"]
        assert mine.in_port == theirs["l1_ingress_port"]
        assert mine.out_port == theirs["l1_egress_port"]
        assert mine.latency_ns == theirs["hop_latency"]
        assert mine.qocc == theirs["queue_occupancy"]
        assert mine.egress_ts == theirs["egress_ts"]
        assert mine.tx_util_ppm == theirs["tx_util"]
    assert (rep.sink.in_port, rep.sink.out_port, rep.sink.latency_ns, rep.sink.qocc) == (
        2,
        1,
        900,
        1500,
    )
    assert rep.tracked and not rep.dropped


def test_unavailable_values_are_none() -> None:
    data = report(1, 1, [hop(2, 5, 7, util=None)])
    rep = decode(data).reports[0]
    assert rep.hops[0].tx_util_ppm is None and rep.hops[0].qocc == 0


def test_sequence_tracker_counts_gaps_reorders_duplicates_and_restarts() -> None:
    t = SeqTracker()
    for s in [5, 6, 8, 9, 12]:  # 7, 10, 11 missing
        t.see(s)
    assert (t.received, t.lost) == (5, 3)
    t.see(10)  # late: it was not lost after all
    assert (t.lost, t.reordered) == (2, 1)
    t.see(9)  # seen before
    assert t.duplicates == 1 and t.lost == 2
    t.see(0)  # the switch reloaded its pipeline: a restart, not 2^22 - 13 losses
    assert t.resets == 1 and t.lost == 2
    t.see(1)
    assert t.lost == 2
    w = SeqTracker()
    for s in [SEQ_MOD - 2, SEQ_MOD - 1, 1]:  # wraps, 0 lost
        w.see(s)
    assert (w.lost, w.resets) == (1, 0)


def test_an_outage_whose_next_reports_also_have_gaps_is_counted() -> None:
    """An overloaded collector's socket drops a run longer than the reorder window and then
    keeps dropping: the far report after the outage is followed by another with a gap, not
    by its successor. Every number is still received or lost, none uncounted (the burst
    test of tests/test_collector_hardening.py lost 4,273 of 50,001 so under load)."""
    t = SeqTracker(window=16)
    seen = [1, 2, 3, 100, 102, 105, 106]  # 4..99 in an outage, then 101, 103, 104 dropped
    for s in seen:
        t.see(s)
    assert t.received == len(seen) and t.received + t.lost == 106
    assert t.out_of_window == 0
    # a lone corrupt number far away still moves nothing until the stream follows it
    t.see(5000)
    assert t.lost == 106 - len(seen) and t.out_of_window == 1
    t.see(107)
    assert t.received + t.lost == 108 and t.out_of_window == 1


def test_every_tenth_report_dropped_is_counted_exactly() -> None:
    topo = Topology(load(EXAMPLE))
    col = Collector(topo)
    dropped = 0
    sent = 0
    for node in (1, 2):
        for seq in range(1, 1001):
            if seq % 10 == 0 and seq != 1000:
                dropped += 1
                continue
            col.ingest(
                report(seq, node, [hop(3, 2, 1), hop(2, 1, 5)], src="10.0.2.1", dst="10.0.1.1")
            )
            sent += 1
    assert col.lost == dropped == 2 * 99
    assert sum(n["received"] for n in col.node_summary()) == sent
    assert col.errors == {}


def test_links_and_flows_from_reports_and_port_counters() -> None:
    topo = Topology(load(EXAMPLE))
    col = Collector(topo, series_points=5)
    # h1 -> h5: leaf1 (node 1) in 1 out 5, spine1 (node 3) in 1 out 2, sink leaf2 in 5 out 1
    hops = [hop(3, 1, 2, qocc=3000, lat=7000, util=500_000), hop(1, 1, 5, qocc=100)]
    for seq in range(1, 11):
        col.ingest(
            report(seq, 2, hops, src="10.0.1.1", dst="10.0.2.1", sink_qocc=42), now=float(seq)
        )
    flow = col.flows[("10.0.1.1", "10.0.2.1", 17, 49152, 4791)]
    assert (flow.src_host, flow.dst_host, flow.reports) == ("h1", "h5", 10)
    assert flow.links == ["h1:eth0", "leaf1:5", "spine1:2", "leaf2:1"]
    assert flow.max_qocc_bytes == 3000
    assert len(flow.series) == 5  # bounded
    spine = col.links["spine1:2"]
    assert (spine.qocc_bytes, spine.latency_ns, spine.util_int) == (3000, 7000, 0.5)
    assert spine.capacity_bps == pytest.approx(100e6)
    assert len(spine.int_series) == 5
    assert col.links["leaf2:1"].qocc_bytes == 42
    assert [f.key for f in col.active_flows(3.0, now=12.0)] == [flow.key]
    assert col.active_flows(1.0, now=12.0) == []
    col.port_counter("leaf1", 5, 0, now=100.0)
    col.port_counter("leaf1", 5, 6_250_000, now=101.0)  # 50 Mb/s on a 100 Mb/s link
    assert col.links["leaf1:5"].util_counter == pytest.approx(0.5)
    col.port_counter("leaf1", 5, 10, now=102.0)  # counter reset (switch restarted): no sample
    assert len(col.links["leaf1:5"].counter_series) == 1


def test_flow_table_is_bounded() -> None:
    col = Collector(None, max_flows=10)
    for i in range(25):
        col.ingest(report(i + 1, 1, [hop(2, 1, 2)], sport=1000 + i))
    assert len(col.flows) == 10 and col.flows_evicted == 15
    assert min(k[3] for k in col.flows) == 1015  # the least recently seen went first


def test_malformed_datagrams_are_counted_never_raised() -> None:
    col = Collector(None)
    good = report(1, 1, [hop(2, 1, 2)])
    bad = {
        "short": good[:10],
        "bad_version": bytes([0x30]) + good[1:],
        "bad_report_length": good[:9] + bytes([200]) + good[10:],
        "bad_md_length": good[:10] + bytes([250]) + good[11:],
        "inner_not_ipv4": good[:32] + b"\x60" + good[33:],
    }
    for reason, data in bad.items():
        with pytest.raises(ReportError) as exc:
            decode(data)
        assert exc.value.reason == reason, (reason, exc.value)
        col.ingest(data)
    assert dict(col.errors) == {r: 1 for r in bad}
    # random garbage and every truncation of a good report: never an exception
    rng = random.Random(7)
    for n in range(2000):
        col.ingest(bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 120))))
        col.ingest(good[: n % len(good)])
    col.ingest(good)
    assert col.reports >= 1 and sum(col.errors.values()) > 2000


def test_int_stack_errors_inside_the_inner_packet() -> None:
    good = bytearray(report(1, 1, [hop(2, 1, 2), hop(3, 4, 5)]))
    inner = 8 + 12 + 12  # group + individual header + 3 words of sink metadata
    shim = inner + 20 + 8
    bad_ver = bytearray(good)
    bad_ver[shim + 4] = (1 << 4) | (bad_ver[shim + 4] & 0x0F)
    with pytest.raises(ReportError, match="int_bad_version"):
        decode(bytes(bad_ver))
    bad_ml = bytearray(good)
    bad_ml[shim + 6] = bad_ml[shim + 6] & 0xE0  # Hop ML 0
    with pytest.raises(ReportError, match="int_bad_hop_ml"):
        decode(bytes(bad_ml))
    long_shim = bytearray(good)
    long_shim[shim + 1] = 200
    with pytest.raises(ReportError, match="int_truncated"):
        decode(bytes(long_shim))
    # INT with another DSCP configured is not parsed: the flow is still seen, without hops
    rep = decode(bytes(good), int_dscp=0x20).reports[0]
    assert rep.flow is not None and rep.hops == []


@pytest.mark.root
def test_udp_socket_opens_inside_a_named_network_namespace() -> None:
    ns = f"xcu{uuid.uuid4().hex[:6]}"
    own = os.readlink(f"/proc/self/task/{threading.get_native_id()}/ns/net")
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        sock = udp_socket("127.0.0.1:32766", netns=ns)  # the port may be taken outside: fine
        try:
            sender = (
                "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                "s.sendto(b'inside', ('127.0.0.1', 32766))"
            )
            subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", sender], check=True)
            sock.setblocking(True)
            sock.settimeout(5)
            assert sock.recvfrom(100)[0] == b"inside"
        finally:
            sock.close()
        # the calling thread is back in its own namespace
        assert os.readlink(f"/proc/self/task/{threading.get_native_id()}/ns/net") == own
        with pytest.raises(FileNotFoundError):
            udp_socket("127.0.0.1:0", netns=f"{ns}-missing")
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
