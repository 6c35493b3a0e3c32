"""The active prober (controller/nic/prober.py): which peers a host probes, its probes as a
network would carry them (some lost, one late, one twice), the receiver's exact counts, the
path and congestion its INT says, the transport leaving probes alone, and bad input counted."""

from __future__ import annotations

import pytest

from controller.nic.prober import MAX_FLOWS, ProbeConfig, Prober
from controller.topology import probe_peers
from controller.wire import probe as wire
from controller.wire.int_md import MD_LEN, SHIM_LEN, encode_stack, hop_ml_words
from controller.wire.roce import BTH_LEN
from testbed.traffic.transport_core import TransportConfig, TransportCore

A, B = "10.0.1.1", "10.0.2.1"


def test_a_host_probes_every_other_host_taking_the_leaves_in_turn() -> None:
    leaves = {"leaf1": ["h1", "h2"], "leaf2": ["h3", "h4"], "leaf3": ["h5"]}
    assert probe_peers("h1", leaves) == ["h2", "h3", "h5", "h4"]
    assert probe_peers("h4", leaves) == ["h2", "h3", "h5", "h1"]  # from its position on
    assert probe_peers("h2", leaves, max_peers=2) == ["h1", "h4"]
    assert probe_peers("h9", leaves) == []


def test_probes_lost_late_and_twice_are_counted_exactly() -> None:
    cfg = ProbeConfig(interval_s=0.01, ports_per_peer=2)
    prober = Prober(A, [B], cfg, seed=1)
    recv = Prober(B, [A], cfg, seed=2)
    assert len({t.sport for t in prober.targets}) == 2
    assert prober.gap_s == pytest.approx(0.005)
    probes = []
    for i in range(20):
        out = prober.next_probe(i * 1000)
        assert out is not None
        probes.append(out)
    assert prober.sent == 20
    # flow 0 (even probes): its 3rd and 4th lost, its 6th late (after the 8th);
    # flow 1 (odd probes): its 5th delivered twice
    even = [p for tg, p in probes if tg is prober.targets[0]]
    odd = [p for tg, p in probes if tg is prober.targets[1]]
    for pkt in even[:2] + even[4:5] + even[6:8] + even[5:6] + even[8:] + odd[:5] + odd[4:]:
        assert recv.receive_packet(pkt, None)
    assert recv.malformed == 0
    f0, f1 = (recv.flows[(bytes([10, 0, 1, 1]), t.sport)] for t in prober.targets)
    assert (f0.received, f0.lost, f0.duplicates) == (8, 2, 0)
    assert (f1.received, f1.lost, f1.duplicates) == (10, 0, 1)
    assert f0.src == A and f0.hops == ()  # no INT on this fabric
    # a transport that gets a probe leaves it alone (no queue pair lost it); a probe cut
    # short is the prober's to count; a data packet is not its
    core = TransportCore(TransportConfig(local_ip=B), seed=1)
    core.receive(even[0], 0.0)
    assert core.probes_ignored == 1 and core.drops == {}
    assert recv.receive_packet(even[0][:-1], None) and recv.malformed == 1
    peer = core.create_qp(1, A, 1)
    send = TransportCore(TransportConfig(local_ip=A), seed=2)
    data = send.build(send.create_qp(1, B, 1), 4, 1, 0, False, peer.sport, b"x" * 16)
    assert not recv.receive_packet(data, None)


def hop_stack(hops: list[tuple[int, int, int, int]]) -> bytes:
    """INT headers (shim, MD, stack) with node id, L1 ports and queue per hop, first first."""
    bitmap = 0xD000
    stack = encode_stack(
        [
            {
                "node_id": n,
                "l1_ingress_port": i,
                "l1_egress_port": o,
                "queue_id": 0,
                "queue_occupancy": q,
            }
            for n, i, o, q in reversed(hops)
        ],
        bitmap,
    )
    shim = bytes([1 << 4, (MD_LEN + len(stack)) // 4, 0, 0])
    md = bytes([2 << 4, 0, hop_ml_words(bitmap), 8, bitmap >> 8, bitmap & 0xFF]) + bytes(6)
    assert len(shim) == SHIM_LEN and len(md) == MD_LEN
    return shim + md + stack


def test_the_path_comes_from_int_and_a_gap_behind_a_full_queue_is_congestion() -> None:
    p = Prober(B, [], ProbeConfig(interval_s=1.0, congested_bytes=100_000), seed=1)
    src = bytes([10, 0, 1, 1])
    calm = hop_stack([(1, 1, 5, 0), (3, 1, 2, 2_000)])
    full = hop_stack([(1, 1, 5, 0), (3, 1, 2, 120_000)])
    p.receive(src, 50000, memoryview(wire.encode(0, 0)), calm)
    p.receive(src, 50000, memoryview(wire.encode(3, 0)), full)  # 1 and 2 lost: congestion
    p.receive(src, 50000, memoryview(wire.encode(5, 0)), calm)  # 4 lost: not
    f = p.flows[(src, 50000)]
    assert (f.received, f.lost, f.lost_congested) == (3, 3, 2)
    assert [(h.node_id, h.in_port, h.out_port, h.qocc) for h in f.hops] == [
        (1, 1, 5, 0),
        (3, 1, 2, 2_000),
    ]
    p.receive(src, 50000, memoryview(wire.encode(1, 0)), calm)  # late after all
    assert (f.received, f.lost, f.lost_congested) == (4, 2, 1)


def test_bad_probes_are_counted_and_the_receiver_forgets_the_oldest_flows() -> None:
    p = Prober(B, [], ProbeConfig(interval_s=1.0), seed=1)
    src = bytes([10, 0, 1, 1])
    p.receive(src, 1, memoryview(b"XP"), None)  # short
    p.receive(src, 1, memoryview(b"ZZ" + wire.encode(0, 0)[2:]), None)  # not a probe
    p.receive(src, 1, memoryview(wire.encode(0, 0)), b"\x10\x01")  # INT cut short
    assert p.malformed == 3 and not p.flows
    for sport in range(MAX_FLOWS + 10):
        p.receive(src, sport, memoryview(wire.encode(0, 0)), None)
    assert len(p.flows) == MAX_FLOWS and p.flows_evicted == 10


def test_no_queue_pair_takes_the_probers_number_and_bad_configs_are_refused() -> None:
    core = TransportCore(TransportConfig(local_ip=A), seed=1)
    with pytest.raises(ValueError, match="prober"):
        core.create_qp(wire.PROBE_QPN, B, 5)
    with pytest.raises(ValueError, match="prober"):
        core.create_qp(5, B, wire.PROBE_QPN)
    with pytest.raises(ValueError):
        ProbeConfig(interval_s=0)
    with pytest.raises(ValueError):
        ProbeConfig(interval_s=1.0, ports_per_peer=0)
    assert wire.PAYLOAD_LEN + BTH_LEN == 28


def test_a_gap_revealed_while_the_receivers_socket_dropped_is_the_hosts() -> None:
    # the agent's socket says how many packets it had dropped when each one was queued
    # (SO_RXQ_OVFL): a gap revealed after that count moved may be the host's own loss
    p = Prober(B, [], ProbeConfig(interval_s=1.0), seed=1)
    src = bytes([10, 0, 1, 1])
    p.receive(src, 1, memoryview(wire.encode(0, 0)), None, 0)
    p.receive(src, 1, memoryview(wire.encode(2, 0)), None, 0)  # 1 lost: the network's
    p.receive(src, 1, memoryview(wire.encode(6, 0)), None, 3)  # 3-5 lost: the socket dropped
    p.receive(src, 1, memoryview(wire.encode(8, 0)), None, 3)  # 7 lost: the network's again
    f = p.flows[(src, 1)]
    assert (f.received, f.lost, f.lost_local, f.lost_congested) == (4, 5, 3, 0)
    p.receive(src, 1, memoryview(wire.encode(4, 0)), None, 3)  # late after all
    assert (f.lost, f.lost_local) == (4, 2)
