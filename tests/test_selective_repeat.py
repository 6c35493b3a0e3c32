"""Selective repeat in the transport's sans-I/O core (`retransmit: sr`) against go-back-N:
two cores joined by tests/transport_core_helpers.py's shuttle, losses chosen by PSN or drawn
from a seeded generator, the clock advanced by the test."""

from __future__ import annotations

import argparse
import random
import struct
from pathlib import Path

import pytest

from controller.wire.roce import (
    AETH_NAK_PSN_SEQ_ERR_SACK,
    DATA_OPCODES,
    OP_ACK,
    OP_SEND_MIDDLE,
    pack_aeth,
    pack_sack,
    unpack_sack,
)
from testbed.packets import AETH, BTH, SACK
from testbed.traffic.transport_core import TransportConfig, TransportCore
from tests.transport_core_helpers import MTU, A, B, opcode, pair, shuttle


def psn_of(pkt: bytes) -> int:
    return int(struct.unpack_from("!I", pkt, 20 + 8 + 8)[0]) & 0xFFFFFF


def syndrome_of(pkt: bytes) -> int:
    return pkt[20 + 8 + 12]


def lose_psns(psns: set[int]) -> object:
    """A wire that loses the first copy of each data packet whose PSN is in `psns`."""
    left = set(psns)

    def wire(p: bytes) -> bytes | None:
        if opcode(p) in DATA_OPCODES and psn_of(p) in left:
            left.discard(psn_of(p))
            return None
        return p

    return wire


@pytest.mark.parametrize("scheme", ["gbn", "sr"])
def test_one_loss_costs_one_resend_with_sr_and_the_window_with_gbn(scheme: str) -> None:
    a, b = pair(retransmit=scheme, window=64)
    data = bytes(random.Random(1).randbytes(32 * MTU))
    a.qps[5].post_send(data, 0.0)
    shuttle(a, b, 0.0, lose_psns({2}))  # type: ignore[arg-type]
    qa, qb = a.qps[5], b.qps[6]
    msg = qb.poll_recv()
    assert qa.idle and msg is not None and bytes(msg.data) == data
    assert qa.counters.timeouts == 0
    if scheme == "sr":
        assert qa.counters.retransmits == 1  # PSN 2 only
        assert qb.counters.rx_kept == 29  # PSNs 3..31 waited for it
        assert not b.drops and not qb.kept
    else:
        assert qa.counters.retransmits == 30  # PSN 2 and the 29 sent after it
        assert b.drops["out_of_order"] == 29


def test_sr_resends_each_hole_once_and_nothing_kept() -> None:
    a, b = pair(retransmit="sr", window=64)
    data = bytes(random.Random(2).randbytes(40 * MTU))
    a.qps[5].post_send(data, 0.0)
    sent = shuttle(a, b, 0.0, lose_psns({2, 5, 6, 17, 38}))  # type: ignore[arg-type]
    qa = a.qps[5]
    msg = b.qps[6].poll_recv()
    assert qa.idle and msg is not None and bytes(msg.data) == data
    assert qa.counters.retransmits == 5 and qa.counters.timeouts == 0
    resent = [psn_of(p) for p in sent if opcode(p) in DATA_OPCODES][40:]
    assert sorted(resent) == [2, 5, 6, 17, 38]


def test_sr_tail_loss_and_lost_resend_recover_by_timeout() -> None:
    a, b = pair(retransmit="sr", window=64, rto=0.01, rto_max=0.04)
    data = bytes(random.Random(3).randbytes(20 * MTU))
    a.qps[5].post_send(data, 0.0)
    lost = {4: 2, 19: 1}  # PSN 4 lost twice (its resend too), the last packet once

    def wire(p: bytes) -> bytes | None:
        if opcode(p) in DATA_OPCODES and lost.get(psn_of(p), 0) > 0:
            lost[psn_of(p)] -= 1
            return None
        return p

    shuttle(a, b, 0.0, wire)
    qa = a.qps[5]
    assert not qa.idle and a.next_deadline() == pytest.approx(0.01)
    a.expire(0.01)
    assert qa.counters.timeouts == 1
    assert list(qa.rtx_q) == [4, 19]  # the SACKed PSNs 5..18 are not resent
    shuttle(a, b, 0.01, wire)
    msg = b.qps[6].poll_recv()
    assert qa.idle and msg is not None and bytes(msg.data) == data
    assert qa.counters.retransmits == 3  # 4, then 4 and 19 after the timeout


def test_sr_resends_a_lost_resend_when_a_later_packet_is_sacked() -> None:
    # window 8 of 40 packets: new packets follow PSN 4's resend, and their SACKs show it lost
    a, b = pair(retransmit="sr", window=8)
    data = bytes(random.Random(5).randbytes(40 * MTU))
    a.qps[5].post_send(data, 0.0)
    lost = {4: 2}

    def wire(p: bytes) -> bytes | None:
        if opcode(p) in DATA_OPCODES and lost.get(psn_of(p), 0) > 0:
            lost[psn_of(p)] -= 1
            return None
        return p

    shuttle(a, b, 0.0, wire)
    qa = a.qps[5]
    msg = b.qps[6].poll_recv()
    assert qa.idle and msg is not None and bytes(msg.data) == data
    assert qa.counters.timeouts == 0 and qa.counters.retransmits == 2


def test_sr_timeout_with_everything_sacked_asks_for_the_lost_ack() -> None:
    a, b = pair(retransmit="sr", window=64, rto=0.01)
    data = bytes(random.Random(6).randbytes(8 * MTU))
    a.qps[5].post_send(data, 0.0)
    lost_ack = []

    def wire(p: bytes) -> bytes | None:
        if opcode(p) in DATA_OPCODES and psn_of(p) == 2 and not lost_ack:
            lost_ack.append(False)
            return None  # PSN 2 lost once: 3..7 kept and SACKed
        if opcode(p) == OP_ACK and syndrome_of(p) == 0 and psn_of(p) == 7 and lost_ack == [False]:
            lost_ack[0] = True
            return None  # the ACK after the gap filled lost: the requester saw 3..7 SACKed
        return p

    shuttle(a, b, 0.0, wire)
    qa = a.qps[5]
    assert lost_ack == [True] and not qa.idle and qa.high == 8
    assert 3 <= qa.una and qa.sacked == set(range(qa.una, 8))
    a.expire(0.01)
    assert list(qa.rtx_q) == [qa.una]  # all SACKed: the oldest again, asking for an ACK
    shuttle(a, b, 0.01)
    msg = b.qps[6].poll_recv()
    assert qa.idle and msg is not None and bytes(msg.data) == data
    assert b.drops["duplicate"] == 1 and qa.counters.retransmits == 2


def test_sr_keeps_at_most_the_window_and_counts_what_is_beyond() -> None:
    # a requester that ignores the responder's window (bad input): 32 in flight against 8
    a = TransportCore(TransportConfig(local_ip=A, mtu=MTU, window=32, retransmit="sr"), seed=1)
    b = TransportCore(TransportConfig(local_ip=B, mtu=MTU, window=8, retransmit="sr"), seed=2)
    a.create_qp(5, B, 6)
    b.create_qp(6, A, 5)
    a.qps[5].post_send(bytes(32 * MTU), 0.0)
    pkts = []
    qa = a.qps[5]
    while (p := qa.peek(0.0)) is not None:
        qa.commit(0.0)
        pkts.append(p)
    assert len(pkts) == 32
    for p in pkts[1:]:  # PSN 0 lost: 1..7 fit the window, 8..31 do not
        b.receive(p, 0.0)
    qb = b.qps[6]
    assert len(qb.kept) == 7 and qb.counters.rx_kept == 7
    assert b.drops["sr_out_of_window"] == 24
    b.receive(pkts[3], 0.0)  # a kept PSN again: SACKed again
    assert b.drops["duplicate"] == 1 and len(qb.kept) == 7
    naks = [o.packet for o in b.feedback]
    assert len(naks) == 8 and {syndrome_of(n) for n in naks} == {AETH_NAK_PSN_SEQ_ERR_SACK}
    assert [unpack_sack(n, 20 + 8 + 12 + 4) for n in naks] == [*range(1, 8), 3]
    b.feedback.clear()
    b.receive(pkts[0], 0.0)  # the gap filled: 0..7 delivered, one ACK for the lot at least
    assert not qb.kept and qb.counters.rx_data_packets == 8
    assert psn_of(b.feedback[-1].packet) == 7


def test_bad_sack_input_is_counted_and_dropped() -> None:
    a, b = pair(retransmit="sr", window=16)
    qa, qb = a.qps[5], b.qps[6]
    qa.post_send(bytes(8 * MTU), 0.0)
    while qa.peek(0.0) is not None:
        qa.commit(0.0)

    def nak(epsn: int, payload: bytes) -> bytes:
        return b.build(qb, OP_ACK, qb.remote_qpn, epsn, False, qa.sport, payload)

    sack = pack_aeth(AETH_NAK_PSN_SEQ_ERR_SACK, 0)
    a.receive(nak(2, sack + pack_sack(9)), 0.0)  # SACKs a PSN never sent
    a.receive(nak(2, sack + pack_sack(1)), 0.0)  # SACKs one below the gap
    a.receive(nak(2, sack + pack_sack(0x800005)), 0.0)  # half the PSN space away
    assert a.drops["sack_out_of_window"] == 3
    a.receive(nak(2, sack), 0.0)  # no SACK header
    a.receive(nak(2, sack + pack_sack(4) + b"\x00" * 4), 0.0)  # bytes after it
    assert a.drops["bad_sack"] == 2
    assert qa.una == 0 and not qa.rtx_q and not qa.sacked and qa.counters.naks_received == 0
    a.receive(nak(2, sack + pack_sack(5)), 0.0)  # a good one: 2..4 are holes
    assert qa.una == 2 and list(qa.rtx_q) == [2, 3, 4] and qa.sacked == {5}
    a.receive(nak(2, sack + pack_sack(6)), 0.0)  # the next kept one: no new hole
    assert list(qa.rtx_q) == [2, 3, 4] and qa.sacked == {5, 6}


@pytest.mark.parametrize(("sender", "receiver"), [("gbn", "sr"), ("sr", "gbn")])
def test_mixed_schemes_still_deliver(sender: str, receiver: str) -> None:
    a = TransportCore(TransportConfig(local_ip=A, mtu=MTU, retransmit=sender), seed=1)
    b = TransportCore(TransportConfig(local_ip=B, mtu=MTU, retransmit=receiver), seed=2)
    a.create_qp(5, B, 6)
    b.create_qp(6, A, 5)
    data = bytes(random.Random(4).randbytes(16 * MTU))
    a.qps[5].post_send(data, 0.0)
    shuttle(a, b, 0.0, lose_psns({3, 9}))  # type: ignore[arg-type]
    now = 0.0
    while not a.qps[5].idle and now < 1.0:  # a plain NAK names one hole: timeouts do the rest
        now += a.cfg.rto
        a.expire(now)
        shuttle(a, b, now)
    msg = b.qps[6].poll_recv()
    assert a.qps[5].idle and msg is not None and bytes(msg.data) == data
    assert not a.drops


def test_scheme_is_checked() -> None:
    with pytest.raises(ValueError, match="retransmit 'selective'"):
        TransportConfig(local_ip=A, retransmit="selective")


def run_lossy(scheme: str, loss: float, seed: int) -> tuple[list[bytes], list[bytes], int]:
    """Six messages each way under random loss of data and feedback alike; returns what was
    posted, what arrived, and the data packets resent."""
    a, b = pair(retransmit=scheme, window=32, rto=0.01, rto_max=0.04)
    rng = random.Random(seed)
    posted = [rng.randbytes(rng.randrange(1, 20 * MTU)) for _ in range(6)]
    for m in posted:
        a.qps[5].post_send(m, 0.0)
    now = 0.0
    while not a.qps[5].idle and now < 10.0:
        shuttle(a, b, now, lambda p: None if rng.random() < loss else p)
        now += 0.01
        a.expire(now)
    got = []
    while (m := b.qps[6].poll_recv()) is not None:
        got.append(bytes(m.data))
    return posted, got, a.qps[5].counters.retransmits


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_loss_delivers_everything_and_sr_resends_less(seed: int) -> None:
    resent = {}
    for scheme in ("gbn", "sr"):
        posted, got, resent[scheme] = run_lossy(scheme, 0.05, seed)
        assert got == posted
    assert 0 < resent["sr"] < resent["gbn"]


def test_scapy_decodes_a_selective_nak() -> None:
    a, b = pair(retransmit="sr")
    a.qps[5].post_send(bytes(4 * MTU), 0.0)
    qa = a.qps[5]
    pkts = []
    while (p := qa.peek(0.0)) is not None:
        qa.commit(0.0)
        pkts.append(p)
    assert opcode(pkts[1]) == OP_SEND_MIDDLE
    b.receive(pkts[2], 0.0)
    from scapy.layers.inet import IP

    nak = IP(b.feedback[0].packet)
    assert nak[AETH].syndrome == AETH_NAK_PSN_SEQ_ERR_SACK and nak[BTH].psn == 0
    assert nak[SACK].psn == 2
    built = bytes(IP(bytes(nak)))
    assert built == b.feedback[0].packet


def sweep_args(**kw: object) -> argparse.Namespace:
    base = dict(
        engine="sim",
        topo="rail:2,4,1",
        scale=None,
        scheme="dcqcn",
        seed=1,
        proactive_start=True,
        switch="builtin",
        run_dir=None,
        losses="1%",
        retransmits="gbn,sr",
        workloads="allreduce",
        seeds="1",
        size="512K",
        chunk="128K",
        iters=2,
        warmup=1,
        workers=1,
    )
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.slow
def test_twin_sweep_point_sr_at_least_gbn_under_one_percent_loss(tmp_path: Path) -> None:
    from testbed.collective import loss
    from testbed.collective_cli import open_suite

    # three seeds: a single timeout (a lost tail packet, either scheme) moves one run a lot
    args = sweep_args(seeds="1,2,3")
    rows = loss.run_sweep(args, open_suite, lambda line: None)
    assert len(rows) == 6 and all(r["completed"] and r["correct"] for r in rows)
    cells = {c["retransmit"]: c for c in loss.summary(rows)}
    gbn, sr = cells["gbn"], cells["sr"]
    assert gbn["resent_share"]["min"] > 0.02  # the loss was there; GBN resends the window
    assert sr["resent_share"]["max"] < 0.02  # SR only the holes (about the 1 % lost)
    assert sr["busbw_Bps"]["median"] >= gbn["busbw_Bps"]["median"]
    # the same seed draws the same losses: a point repeats exactly
    again = loss.run_sweep(sweep_args(retransmits="sr"), open_suite, lambda line: None)[0]
    first = next(r for r in rows if r["retransmit"] == "sr" and r["seed"] == 1)
    assert again["retransmits"] == first["retransmits"] and again["iter_s"] == first["iter_s"]
    text = loss.write(args, rows, tmp_path)
    assert "allreduce  sr" in text and (tmp_path / "loss.csv").read_text().count("\n") == 7


def test_loss_faults_cover_every_link_once() -> None:
    from testbed.collective import loss
    from testbed.topo import parse_choice

    spec = parse_choice("rail:2,4,1")
    fs = loss.fabric_loss_faults(spec, 0.001)
    assert len(fs) == len(spec.links) and {f.kind for f in fs} == {"loss"}
    assert all(f.value == 0.001 for f in fs)
    assert loss.parse_losses("0,0.01%,1%") == [0.0, 0.0001, 0.01]
    with pytest.raises(ValueError, match="workload 'bogus'"):
        loss.points(sweep_args(workloads="bogus"))
