"""The baselines' XDP laws (HPCC, TIMELY, Swift) and tc's RTT probe vs the Python reference,
packet by packet (BPF_PROG_TEST_RUN, root).

As tests/test_nic_ratelaw.py does for TiTa and DCQCN: synthetic feedback goes through the XDP
program, and after each packet the rate XDP wrote must be the reference's
(controller/nic/ratelaw/), here exactly. The reference is given what XDP read from other maps
(tc's tx bytes, next PSN and RTT probe) and XDP's packet time (the CC state's last_fb_ns).
RTTs are set by writing tc's probe with a send time that far before now (CLOCK_MONOTONIC,
bpf_ktime_get_ns()'s clock).
"""

from __future__ import annotations

import os
import time

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from controller.nic.bpf.loader import FlowKey
from controller.nic.bpf.syscalls import prog_test_run
from controller.nic.ratelaw import (
    CcParams,
    CcState,
    Law,
    ReferenceNic,
    RttProbe,
    tc_rtt_probe,
    wire_stamp_rtt_probe,
)
from testbed.emu.nicrig import standalone_nic
from testbed.packets.int_md import IntHop, IntMD, IntShim
from testbed.packets.roce import AETH, BTH, CNP

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (eBPF programs, bpffs)"),
]

XDP_PASS = 2
TC_ACT_OK = 0
LINE = 100_000_000
A, B = "10.0.1.1", "10.0.2.2"  # the data sender (this NIC) and the receiver
MS = 1_000_000


def ack(
    sport: int,
    psn: int,
    hops: list[dict[str, int]] | None = None,
    ttl: int = 62,
    bitmap: int = 0xF500,
) -> bytes:
    pkt = (
        Ether()
        / IP(src=B, dst=A, ttl=ttl)
        / UDP(sport=sport, dport=4791)
        / BTH(opcode=0x11, psn=psn)
        / AETH(syndrome=0)
    )
    if hops is not None:
        pkt = (
            pkt
            / IntShim()
            / IntMD(
                instruction_bitmap=bitmap,
                remaining_hop_cnt=8 - len(hops),
                hops=[IntHop(bitmap, **h) for h in hops],
            )
        )
    return bytes(pkt)


def cnp(sport: int) -> bytes:
    return bytes(
        Ether() / IP(src=B, dst=A) / UDP(sport=sport, dport=4791) / BTH(opcode=0x81, dqpn=5) / CNP()
    )


def data(sport: int, psn: int) -> bytes:
    return bytes(
        Ether()
        / IP(src=A, dst=B)
        / UDP(sport=sport, dport=4791)
        / BTH(opcode=0x04, dqpn=7, psn=psn)
        / Raw(b"x" * 200)
    )


class Driver:
    """Feeds frames to XDP and to the reference, with tc's view of the flow set alike."""

    def __init__(self, nic, ref: ReferenceNic, sport: int):  # type: ignore[no-untyped-def]
        self.nic, self.ref, self.sport = nic, ref, sport
        self.key = FlowKey(A, B, 17, sport, 4791)
        self.probe = RttProbe()
        self.rtt_ns: int | None = None

    def set_probe(self, psn: int, rtt_ns: int) -> None:
        """tc's next probe: PSN `psn`, sent `rtt_ns` before the next frame."""
        self.probe = RttProbe(self.probe.seq + 1, psn)
        self.rtt_ns = rtt_ns

    def send(self, frame: bytes, tx_bytes: int, snd_nxt: int) -> tuple[int, int]:
        if self.rtt_ns is not None:
            self.probe.sent_ns = time.monotonic_ns() - self.rtt_ns
            self.rtt_ns = None
        st = self.nic.new_value("xm_flows")
        st.tx_bytes, st.snd_nxt_psn, st.flags = tx_bytes, snd_nxt, 1
        st.rtt_probe_seq = self.probe.seq
        st.rtt_probe_psn = self.probe.psn
        st.rtt_probe_ns = self.probe.sent_ns
        self.nic.put("xm_flows", self.key, st)
        assert prog_test_run(self.nic.fd("xdp"), frame).retval == XDP_PASS
        cc = self.nic.get("xm_cc", self.key)
        xdp_rate = int(self.nic.get("xm_rates", self.key).rate_bps)
        ref_rate = self.ref.on_frame(
            frame,
            now_ns=int(cc.last_fb_ns),
            tx_bytes=tx_bytes,
            snd_nxt_psn=snd_nxt,
            rtt_probe=self.probe,
        )
        assert ref_rate is not None
        mine = self.ref.flows[(self.ref_key())]
        assert (int(cc.rtt_ns), int(cc.rtt_diff_ns), int(cc.inc_stage), int(cc.rtt_done_seq)) == (
            mine.rtt_ns,
            mine.rtt_diff_ns,
            mine.inc_stage,
            mine.rtt_done_seq,
        )
        return xdp_rate, ref_rate

    def ref_key(self) -> tuple[int, int, int, int, int]:
        return (
            int.from_bytes(bytes(map(int, A.split("."))), "big"),
            int.from_bytes(bytes(map(int, B.split("."))), "big"),
            self.sport,
            4791,
            17,
        )


def test_hpcc_ramp_matches_reference_and_commits_u_per_ack() -> None:
    with standalone_nic(LINE, law="hpcc", base_rtt_ns=100_000) as nic:
        prm = CcParams.defaults(Law.HPCC, LINE, 100_000)
        ref = ReferenceNic(LINE, prm)
        d = Driver(nic, ref, sport=51001)
        ts, qlen, tx = 1_000_000, 0, 0
        rates = []
        half = 120
        utils = [0.5 + 0.9 * i / half for i in range(half)]
        utils = utils + utils[::-1] + [0.3] * 100
        for i, u in enumerate(utils):
            ts += 30_000  # 30 us between ACKs, T = 100 us: several ACKs per RTT
            qlen = max(0, qlen + int((u - 1.0) * LINE / 8 * 30e-6))
            tx += 1500
            hops = [
                {
                    "node_id": 3,
                    "l1_ingress_port": 1,
                    "l1_egress_port": 2,
                    "hop_latency": 500,
                    "queue_id": 0,
                    "queue_occupancy": qlen,
                    "egress_ts": ts,
                    "tx_util": int(min(u, 1.0) * 1e6),
                },
            ]
            x, r = d.send(ack(d.sport, i, hops), tx, snd_nxt=i + 4)
            assert x == r, f"ACK {i}: XDP {x} vs reference {r}"
            cc = nic.get("xm_cc", d.key)
            assert int(cc.util) == ref.flows[d.ref_key()].util  # U moves on every ACK
            rates.append(x)
        assert min(rates) < 0.7 * LINE and rates[-1] > 10 * min(rates)
        assert nic.counter_values()["xdp_tita_update"] >= len(utils) - 1


def test_timely_rtt_regions_match_reference() -> None:
    with standalone_nic(LINE, law="timely") as nic:
        prm = CcParams.defaults(Law.TIMELY, LINE)
        t = prm.timely  # at 100 Mb/s: T_low 5 ms, T_high 50 ms, min RTT 2 ms
        assert (t.t_low_ns, t.t_high_ns, t.min_rtt_ns) == (5 * MS, 50 * MS, 2 * MS)
        ref = ReferenceNic(LINE, prm)
        d = Driver(nic, ref, sport=51002)
        # below T_low, a rising gradient, a falling one (HAI after 5), above T_high, a cut
        # to the minimum rate (gradient far above 1/beta), and recovery
        rtts = (
            [3 * MS] * 4
            + [6 * MS + i * 1_500_000 for i in range(8)]
            + [18 * MS - i * 800_000 for i in range(12)]
            + [80 * MS, 120 * MS, 60 * MS]
            + [10 * MS, 40 * MS, 12 * MS]
            + [2 * MS] * 10
            + [20 * MS] * 8
        )
        psn, tx, rates = 0, 0, []
        x, r = d.send(ack(d.sport, psn), tx, psn + 1)  # first feedback: line rate
        assert x == r == LINE
        for i, rtt in enumerate(rtts):
            d.set_probe(psn + 1, rtt)
            # an ACK that does not yet cover the probe: no sample
            x, r = d.send(ack(d.sport, psn), tx, psn + 8)
            assert x == r
            psn += 8
            tx += 8 * 1500
            x, r = d.send(ack(d.sport, psn), tx, psn + 1)  # covers it: one sample
            assert x == r, f"RTT {i} ({rtt} ns): XDP {x} vs reference {r}"
            x, r = d.send(ack(d.sport, psn), tx, psn + 1)  # the sample is taken once
            assert x == r
            rates.append(x)
        c = nic.counter_values()
        assert c["xdp_rtt_sample"] == len(rtts) and c["xdp_timely_first_rtt"] == 1
        assert c["xdp_timely_increase"] > 10 and c["xdp_timely_decrease"] >= 8
        assert min(rates) == prm.min_rate_bps  # the cut past 1/beta
        assert max(rates[-18:-8]) > min(rates[-18:-8])  # HAI recovery below T_low
        # CNPs are not TIMELY's signal
        x, r = d.send(cnp(d.sport), tx, psn + 1)
        assert x == r and c["xdp_cnp_ignored"] == 0
        assert nic.counter_values()["xdp_cnp_ignored"] == 1


def test_swift_target_hops_and_one_decrease_per_rtt_match_reference() -> None:
    # Times ten times the other tests': the steps below must come far faster than one RTT on
    # a loaded box too (the held decreases are counted), so the RTTs are hundreds of ms.
    base = 100 * MS
    with standalone_nic(LINE, law="swift", base_rtt_ns=base) as nic:
        prm = CcParams.defaults(Law.SWIFT, LINE, base)
        w = prm.swift  # target 100 ms + 25 ms per hop
        assert (w.base_target_ns, w.per_hop_ns, w.sender_ttl) == (base, base // 4, 64)
        ref = ReferenceNic(LINE, prm)
        d = Driver(nic, ref, sport=51003)
        psn, tx = 0, 0
        d.send(ack(d.sport, psn), tx, psn + 1)
        # (RTT, TTL of the ACK): 2 hops (target 150 ms), 3 hops (175 ms), 0 hops
        steps = (
            [(300 * MS, 62)] * 6
            + [(150 * MS, 61)] * 4
            + [(160 * MS, 62)] * 3
            + [(80 * MS, 64)] * 12
            + [(2000 * MS, 62)] * 3
        )
        rates = []
        for i, (rtt, ttl) in enumerate(steps):
            d.set_probe(psn + 1, rtt)
            psn += 4
            tx += 4 * 1500
            x, r = d.send(ack(d.sport, psn, ttl=ttl), tx, psn + 1)
            assert x == r, f"step {i} ({rtt} ns, TTL {ttl}): XDP {x} vs reference {r}"
            rates.append(x)
        c = nic.counter_values()
        # probes come faster than the RTT here (the test sets them at once): decreases
        # after the first of a burst wait for one RTT
        assert c["xdp_swift_decrease_held"] >= 3 and c["xdp_swift_decrease"] >= 1
        assert c["xdp_swift_increase"] >= 12
        assert rates[0] == pytest.approx(0.6 * LINE, rel=0.02)  # 1 - 0.8 x (300 - 150) / 300
        assert rates[9] > rates[6]  # below the 3-hop target: increases
        time.sleep(2.1)  # one 2 s RTT later a decrease is allowed again
        d.set_probe(psn + 1, 2000 * MS)
        psn += 4
        x, r = d.send(ack(d.sport, psn, ttl=62), tx, psn + 1)
        assert x == r and x < rates[-1]


def test_tc_rtt_probe_matches_reference() -> None:
    """tc starts a probe when XDP has taken the last one, and on a resend of its PSN."""
    with standalone_nic(LINE, law="timely") as nic:
        prm = CcParams.defaults(Law.TIMELY, LINE)
        ref = ReferenceNic(LINE, prm)
        sport = 51004
        key = FlowKey(A, B, 17, sport, 4791)
        d = Driver(nic, ref, sport)
        probe = RttProbe()
        cc: CcState | None = None

        def tc(psn: int) -> None:
            res = prog_test_run(nic.fd("tc"), data(sport, psn))
            assert res.retval == TC_ACT_OK
            st = nic.get("xm_flows", key)
            tc_rtt_probe(probe, cc, psn, int(st.last_ns))
            assert (int(st.rtt_probe_seq), int(st.rtt_probe_psn), int(st.rtt_probe_ns)) == (
                probe.seq,
                probe.psn,
                probe.sent_ns,
            ), f"data PSN {psn}"

        def xdp(psn: int) -> None:
            nonlocal cc
            st = nic.get("xm_flows", key)
            assert prog_test_run(nic.fd("xdp"), ack(sport, psn)).retval == XDP_PASS
            xcc = nic.get("xm_cc", key)
            ref.on_frame(
                ack(sport, psn),
                now_ns=int(xcc.last_fb_ns),
                tx_bytes=int(st.tx_bytes),
                snd_nxt_psn=int(st.snd_nxt_psn),
                rtt_probe=RttProbe(
                    int(st.rtt_probe_seq), int(st.rtt_probe_psn), int(st.rtt_probe_ns)
                ),
            )
            cc = ref.flows[d.ref_key()]
            assert int(xcc.rtt_done_seq) == cc.rtt_done_seq and int(xcc.rtt_ns) == cc.rtt_ns

        for psn in range(0, 4):
            tc(psn)  # no CC state yet: every packet restarts the probe
        assert probe.seq == 4 and probe.psn == 3
        xdp(1)  # creates the CC state; the pending probe (PSN 3) predates the law: taken
        for psn in range(4, 10):
            tc(psn)  # one new probe (PSN 4), then it stays pending
        assert probe.psn == 4
        xdp(3)  # does not cover it
        tc(10)
        assert probe.psn == 4
        xdp(6)  # covers PSN 4: the sample is taken, the next packet is the next probe
        assert cc is not None and cc.rtt_ns > 0
        tc(11)
        assert probe.psn == 11
        tc(8)  # go-back-N resends PSN 8 (before the probe): the probe restarts there
        assert probe.psn == 8
        assert nic.counter_values()["tc_rtt_probe"] == probe.seq
    # a law that takes no RTT samples: no probes
    with standalone_nic(LINE, law="tita") as nic:
        assert prog_test_run(nic.fd("tc"), data(sport, 1)).retval == TC_ACT_OK
        assert nic.counter_values()["tc_rtt_probe"] == 0


@pytest.mark.parametrize("int_enabled", [True, False])
def test_the_wire_stamps_the_probes_departure(int_enabled: bool) -> None:
    """Under HTB tc egress runs before the packet's wait in its class; tc_wire.c, at the
    wire's far end, makes the probe's send time its departure, once per probe, as the
    reference does (wire_stamp_rtt_probe), reading the frame as tc egress sent it (INT
    included), and the ACK's RTT sample counts from there."""
    with standalone_nic(
        LINE, law="timely", int_enabled=int_enabled, programs=("tc", "xdp", "wire")
    ) as nic:
        sport = 51005
        key = FlowKey(A, B, 17, sport, 4791)
        probe = RttProbe()

        def tc(psn: int) -> bytes:
            res = prog_test_run(nic.fd("tc"), data(sport, psn))
            assert res.retval == TC_ACT_OK
            st = nic.get("xm_flows", key)
            tc_rtt_probe(probe, None, psn, int(st.last_ns))  # no CC state yet
            return res.data_out

        def wire(frame: bytes, psn: int) -> tuple[int, int, int, int]:
            before = time.monotonic_ns()
            assert prog_test_run(nic.fd("wire"), frame).retval == TC_ACT_OK
            st = nic.get("xm_flows", key)
            got = (
                int(st.rtt_probe_seq),
                int(st.rtt_probe_psn),
                int(st.rtt_probe_ns),
                int(st.rtt_probe_wire_seq),
            )
            stamped = wire_stamp_rtt_probe(probe, psn, got[2])
            if stamped:
                assert before <= probe.sent_ns <= time.monotonic_ns()
            assert got == (probe.seq, probe.psn, probe.sent_ns, probe.wire_seq)
            return got

        sent = tc(0)  # the probe, stamped by tc at the class's enqueue
        assert (0x17 << 2 == IP(sent[14:]).tos & 0xFC) == int_enabled  # INT went in
        queued_at = probe.sent_ns
        bth = 14 + 20 + 8 + (16 if int_enabled else 0)
        later = sent[: bth + 9] + (1).to_bytes(3, "big") + sent[bth + 12 :]  # PSN 1
        time.sleep(0.005)  # its wait in the class
        wire(later, 1)
        assert probe.sent_ns == queued_at and probe.wire_seq == 0  # PSN 1 is not the probe
        seq, psn, ns, wire_seq = wire(sent, 0)
        assert psn == 0 and wire_seq == seq == 1 and ns >= queued_at + 5_000_000
        wire(sent, 0)  # a second departure of the same probe (a copy) changes nothing
        assert probe.sent_ns == ns
        assert prog_test_run(nic.fd("wire"), b"\x00" * 20).retval == TC_ACT_OK  # not a frame
        c = nic.counter_values()
        assert c["wire_rtt_stamp"] == 1 and c["wire_packets"] == 4
        # tc egress counted each frame once: the wire does not count them again
        assert c["tc_packets"] == 1 and c["tc_malformed"] == 0
