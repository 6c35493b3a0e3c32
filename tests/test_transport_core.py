"""The transport's sans-I/O core (testbed.traffic.transport_core), with no sockets: two cores
joined by a function that moves packets, under a clock the test advances. Both engines (the
socket runner and the simulated twin) run this core; tests/test_transport.py runs it over
sockets in network namespaces.
"""

from __future__ import annotations

import errno
import gc
import socket
import struct
import weakref

import pytest

from controller.wire.int_md import INT_DSCP_DEFAULT
from controller.wire.roce import OP_ACK, OP_CNP, OP_SEND_FIRST, OP_SEND_MIDDLE
from testbed.traffic import transport as transport_mod
from testbed.traffic.transport_core import ECN_CE, TransportConfig, TransportCore
from tests.transport_core_helpers import MTU, A, B, opcode, pair, shuttle


def test_message_is_delivered_intact_with_coalesced_acks() -> None:
    a, b = pair(ack_every=4)
    data = bytes(range(256)) * 40  # 10 packets
    op = a.qps[5].post_send(data, 0.0, tag="m")
    sent = shuttle(a, b, 0.0)
    msg = b.qps[6].poll_recv()
    assert op.done and msg is not None and bytes(msg.data) == data
    ops = [opcode(p) for p in sent]
    assert ops.count(OP_ACK) == 3  # after packets 4, 8 and the last
    assert a.qps[5].counters.tx_packets == 10 and not a.drops and not b.drops
    assert a.next_deadline() is None  # nothing in flight: no timer


def test_lost_packet_is_recovered_by_nak_and_go_back_n() -> None:
    a, b = pair()
    data = bytes(8 * MTU)
    a.qps[5].post_send(data, 0.0)
    dropped: list[bytes] = []

    def lose_third_data(p: bytes) -> bytes | None:
        if opcode(p) in (OP_SEND_FIRST, OP_SEND_MIDDLE) and len(dropped) < 1:
            ihl = 20
            psn = struct.unpack_from("!I", p, ihl + 8 + 8)[0] & 0xFFFFFF
            if psn == 2:
                dropped.append(p)
                return None
        return p

    shuttle(a, b, 0.0, lose_third_data)
    qa = a.qps[5]
    assert dropped and qa.idle
    assert qa.counters.naks_received >= 1 and qa.counters.retransmits >= 1
    assert b.drops["out_of_order"] >= 1 and b.qps[6].counters.messages_received == 1


def test_timeout_retransmits_from_the_oldest_unacknowledged() -> None:
    a, b = pair(rto=0.01, rto_max=0.04)
    a.qps[5].post_send(bytes(3 * MTU), 0.0)
    shuttle(a, b, 0.0, lambda p: None)  # everything lost
    qa = a.qps[5]
    assert a.next_deadline() == pytest.approx(0.01)
    a.expire(0.005)
    assert qa.counters.timeouts == 0
    a.expire(0.01)
    assert qa.counters.timeouts == 1 and qa.nxt == 0
    assert a.next_deadline() == pytest.approx(0.03)  # backed off
    shuttle(a, b, 0.01)
    assert qa.idle and qa.counters.retransmits == 3


def test_cnp_for_ecn_ce_at_most_once_per_interval() -> None:
    a, b = pair(cnp_interval=1.0)

    def mark_ce(p: bytes) -> bytes:
        return p[:1] + bytes([p[1] | ECN_CE]) + p[2:] if opcode(p) != OP_ACK else p

    a.qps[5].post_send(bytes(4 * MTU), 0.0)
    sent = shuttle(a, b, 0.0, mark_ce)
    assert [opcode(p) for p in sent].count(OP_CNP) == 1
    a.qps[5].post_send(bytes(MTU), 2.0)
    sent = shuttle(a, b, 2.0, mark_ce)
    assert [opcode(p) for p in sent].count(OP_CNP) == 1
    assert a.qps[5].counters.cnps_received == 2


SHIM_MD = bytes([0x10, 3, 0, 0]) + bytes([0x20, 0, 0, 0]) + bytes(8)  # shim + MD header


def add_int(p: bytes) -> bytes:
    """A data packet as an INT source sends it (an empty stack); other packets unchanged."""
    if opcode(p) == OP_ACK:
        return p
    total = struct.unpack_from("!H", p, 2)[0] + len(SHIM_MD)
    udp_len = struct.unpack_from("!H", p, 24)[0] + len(SHIM_MD)
    tos = (INT_DSCP_DEFAULT << 2) | (p[1] & 3)
    return (
        p[:1]
        + bytes([tos])
        + struct.pack("!H", total)
        + p[4:24]
        + struct.pack("!H", udp_len)
        + p[26:28]
        + SHIM_MD
        + p[28:]
    )


def test_int_stack_is_echoed_in_the_ack() -> None:
    a, b = pair()
    a.qps[5].post_send(bytes(MTU), 0.0)
    sent = shuttle(a, b, 0.0, add_int)
    acks = [p for p in sent if opcode(p) == OP_ACK]
    assert len(acks) == 1 and acks[0][20 + 8 + 12 + 4 : -4] == SHIM_MD
    assert b.qps[6].counters.int_echoes_sent == 1 and not a.drops


def data_psn(p: bytes) -> int | None:
    """The PSN of a data packet with INT (as add_int makes it), None for others."""
    if opcode(p) == OP_ACK:
        return None
    return struct.unpack_from("!I", p, 20 + 8 + len(SHIM_MD) + 8)[0] & 0xFFFFFF


@pytest.mark.parametrize("what", ["late", "lost"])
def test_a_reordered_packet_is_told_from_a_lost_one(what: str) -> None:
    """Go-back-N resends after any gap in the PSNs; the responder tells a packet that came late
    (sent before the packet that showed the gap: the IPv4 ID the sender counts per QP) from
    one that was lost (it comes only when resent), and its NIC's sink reports only the loss,
    on the path of the packet after the gap. A gap up to a packet the responder dropped itself
    (go-back-N drops what follows a gap) is not the network's either."""
    a, b = pair(report_to="10.0.0.9:32766", report_sample_s=10.0)
    a.qps[5].post_send(bytes(6 * MTU), 0.0)
    held: list[bytes] = []

    def wire(p: bytes) -> bytes | None:
        p = add_int(p)
        psn = data_psn(p)
        if psn == 2 and not held:
            held.append(p)
            return None  # late: delivered after PSN 3; lost: never
        if what == "late" and psn == 3 and len(held) == 1:
            b.receive(p, 0.0)
            held.append(p)
            return held[0]
        return p

    shuttle(a, b, 0.0, wire)
    assert a.qps[5].idle and b.qps[6].counters.messages_received == 1
    c = b.qps[6].counters
    assert b.drops["out_of_order"] >= 1 and a.qps[5].counters.retransmits >= 1
    assert b.sink is not None
    if what == "late":
        assert (c.reordered, c.gaps_lost, b.sink.reports["loss"]) == (1, 0, 0)
    else:
        assert (c.reordered, c.gaps_lost, b.sink.reports["loss"]) == (0, 1, 1)


@pytest.mark.parametrize("rto,rto_max", [(0.0, 0.2), (-1.0, 0.2), (0.3, 0.2), (float("nan"), 0.2)])
def test_a_retransmission_timeout_not_above_zero_or_above_its_ceiling_is_refused(
    rto: float, rto_max: float
) -> None:
    with pytest.raises(ValueError, match="rto"):
        TransportConfig(local_ip=A, rto=rto, rto_max=rto_max)


def test_bad_input_is_counted_and_dropped() -> None:
    a, b = pair()
    a.qps[5].post_send(bytes(10), 0.0)
    pkt = a.qps[5].peek(0.0)
    assert pkt is not None
    b.receive(pkt[:-1] + bytes([pkt[-1] ^ 1]), 0.0)
    b.receive(pkt[:10], 0.0)
    b.receive(pkt[:20] + struct.pack("!HHH", 1, 4791, 4000) + pkt[26:], 0.0)
    assert b.drops == {"bad_icrc": 1, "short": 1, "bad_udp_length": 1}
    assert b.qps[6].counters.rx_data_packets == 0


def test_message_without_last_packet_does_not_grow_without_bound() -> None:
    """Issue 18 item 8: a sender that never sends LAST must not grow the responder's buffer
    past max_message; the connection keeps working for the next message."""
    a, b = pair(max_message=4 * MTU)
    a.qps[5].post_send(bytes(10 * MTU), 0.0)  # longer than the responder buffers
    shuttle(a, b, 0.0)
    qb = b.qps[6]
    assert b.drops["message_too_long"] == 1 and qb.poll_recv() is None
    assert len(qb.rx_buf) == 0 and a.qps[5].idle  # acknowledged, not buffered
    a.qps[5].post_send(b"next", 1.0)
    shuttle(a, b, 1.0)
    msg = qb.poll_recv()
    assert msg is not None and bytes(msg.data) == b"next"


def test_a_queue_pair_stores_the_first_bytes_it_is_told_to() -> None:
    """`store_bytes`: a message's first bytes are stored, the rest counted in its size (the
    collectives' size mode pads its fingerprints with zeros the receiver need not hold);
    max_message still bounds the whole message; a negative count is refused."""
    a, b = pair(max_message=8 * MTU)
    qb = b.qps[6]
    qb.store_bytes = MTU + 7  # within the second packet
    data = bytes(range(256)) * 20
    a.qps[5].post_send(data, 0.0, size=5 * MTU + 3)  # zeros after the data
    a.qps[5].post_send(b"", 0.0, size=10 * MTU)  # too long for the responder, stored or not
    shuttle(a, b, 0.0)
    msg = qb.poll_recv()
    assert msg is not None and bytes(msg.data) == data[: MTU + 7] and msg.size == 5 * MTU + 3
    assert qb.poll_recv() is None and b.drops["message_too_long"] == 1
    qb.store_bytes = 0
    a.qps[5].post_send(b"next", 1.0)
    shuttle(a, b, 1.0)
    msg = qb.poll_recv()
    assert msg is not None and msg.data == b"" and msg.size == 4
    assert b.qps[6].counters.rx_bytes == 5 * MTU + 3 + 10 * MTU + 4
    with pytest.raises(ValueError, match="store_bytes"):
        qb.store_bytes = -1


def test_a_watched_queue_pair_is_named_on_completions_and_messages() -> None:
    """`watch`: the core adds a queue pair to its watcher's set when a send completes and when
    a message arrives, and not for packets that do neither."""
    a, b = pair(ack_every=100)
    seen: set[object] = set()
    a.qps[5].watch = b.qps[6].watch = seen
    a.qps[5].post_send(bytes(3 * MTU), 0.0)
    qa, qb = a.qps[5], b.qps[6]
    b.receive(qa.peek(0.0) or b"", 0.0)  # the first packet: no message yet
    qa.commit(0.0)
    assert not seen
    shuttle(a, b, 0.0)
    assert seen == {qa, qb}


def test_a_completed_message_is_not_kept_by_the_core() -> None:
    """A sender's core forgets a message once it is acknowledged: only its poster holds the
    SendOp (with its data). A queue of completed messages that no job read kept every message
    of a run, and with it every byte a collective sent in its data mode."""
    a, b = pair()
    refs = []
    for i in range(20):
        op = a.qps[5].post_send(bytes([i]) * (3 * MTU), float(i))
        refs.append(weakref.ref(op))
        shuttle(a, b, float(i))
        assert op.done and b.qps[6].poll_recv() is not None
        del op
    gc.collect()
    assert [r for r in refs if r() is not None] == []


def test_same_seed_same_source_ports() -> None:
    ports = []
    for _ in range(2):
        core = TransportCore(TransportConfig(local_ip=A), seed=7)
        ports.append([core.create_qp(q, B, q).sport for q in range(1, 20)])
    assert ports[0] == ports[1] and len(set(ports[0])) == 19
    assert all(49152 <= p < 65536 for p in ports[0])


class _UnreachableSocket:
    """A sending socket whose route is gone."""

    def sendto(self, data: bytes, addr: object) -> int:
        raise OSError(errno.ENETUNREACH, "Network is unreachable")

    def fileno(self) -> int:
        raise OSError(errno.EBADF, "no descriptor")  # no queue to ask: nothing waits in it

    def close(self) -> None:
        pass


def test_socket_runner_survives_enetunreach(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18 item 8: ENETUNREACH from a send must not escape step(): it is counted and the
    packet is treated as lost (the retransmission timer recovers it)."""
    rx, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    keep, _ = socket.socketpair()
    monkeypatch.setattr(transport_mod, "open_rx_sockets", lambda port, size: (rx, keep))
    monkeypatch.setattr(transport_mod, "open_tx_socket", lambda size: _UnreachableSocket())
    cfg = TransportConfig(local_ip=A, mtu=MTU, rto=0.001)
    with transport_mod.Transport(cfg, pipeline="reference") as t:
        qp = t.create_qp(5, B, 6)
        qp.post_send(bytes(2 * MTU), 0.0)
        t.step(0.0, 0.0)
        assert qp.counters.tx_errors == 2 and t.drops["send_error_ENETUNREACH"] == 2
        assert qp.high == 2  # lost on the way out, in flight as far as the protocol knows
        t.step(0.01, 0.0)
        assert qp.counters.timeouts == 1 and qp.counters.retransmits == 2
    peer.close()


def test_native_sends_survive_a_failing_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on the native core, whose data sends are C's `sendto` on the socket itself: a
    datagram socket of the wrong family refuses every IPv4 destination (EINVAL), and each
    refused packet is counted and treated as lost, as the reference does with any error but a
    full buffer."""
    rx, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    keep, _ = socket.socketpair()
    tx, tx_peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    monkeypatch.setattr(transport_mod, "open_rx_sockets", lambda port, size: (rx, keep))
    monkeypatch.setattr(transport_mod, "open_tx_socket", lambda size: tx)
    cfg = TransportConfig(local_ip=A, mtu=MTU, rto=0.001)
    with transport_mod.Transport(cfg, pipeline="native") as t:
        if t.native_reason:
            pytest.skip(f"native transport: {t.native_reason}")
        qp = t.create_qp(5, B, 6)
        qp.post_send(bytes(2 * MTU), 0.0)
        t.step(0.0, 0.0)
        assert qp.counters.tx_errors == 2 and t.drops["send_error_EINVAL"] == 2
        assert qp.high == 2
        t.step(0.01, 0.0)
        assert qp.counters.timeouts == 1 and qp.counters.retransmits == 2
    for s in (peer, tx_peer):
        s.close()


def test_a_duplicate_is_acked_again_ackreq_or_not() -> None:
    """IBA C9-105: a duplicate SEND is ACKed again. A requester resends after a timeout when
    the ACK it waits for was coalesced away (ACK every N) or lost; a responder that dropped
    the duplicate silently unless it carried AckReq left a slow sender resending the same
    packet for ever (the twin's dcqcn+pfc all-to-all on crossed:4,1,4 at 2 MiB: rates of a
    few Mb/s, one packet per timeout, no ACK, no rate increase)."""
    a, b = pair(ack_every=4, rto=0.01, rto_max=0.04)
    a.qps[5].post_send(bytes(4 * MTU), 0.0)

    def psn(p: bytes) -> int:
        return struct.unpack_from("!I", p, 20 + 8 + 8)[0] & 0xFFFFFF

    # packets 0 and 1 arrive (no ACK: neither is the 4th nor asks for one); 2 and 3 are lost
    shuttle(a, b, 0.0, lambda p: p if opcode(p) != OP_ACK and psn(p) < 2 else None)
    qa = a.qps[5]
    assert b.qps[6].epsn == 2 and qa.una == 0
    a.expire(0.01)  # the timeout: go back to the oldest unacknowledged, packet 0
    assert qa.counters.timeouts == 1 and qa.nxt == 0
    resend = qa.peek(0.01)
    assert resend is not None and psn(resend) == 0
    qa.commit(0.01)
    b.receive(resend, 0.01)  # a duplicate without AckReq
    assert b.drops["duplicate"] == 1
    acks = [f.packet for f in b.feedback if opcode(f.packet) == OP_ACK]
    assert acks, "the duplicate went unanswered"
    a.receive(acks[-1], 0.01)
    assert qa.una == 2  # the requester learns 0 and 1 arrived and moves on
    shuttle(a, b, 0.01)
    assert qa.idle and b.qps[6].counters.messages_received == 1
