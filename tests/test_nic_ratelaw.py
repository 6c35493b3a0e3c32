"""XDP rate laws vs the Python reference, packet by packet (BPF_PROG_TEST_RUN, root).

Synthetic ACKs with INT echoes and CNPs, built with the project's scapy layers, go through the
XDP program; after each one the rate XDP wrote to the rate map must equal the reference's
(controller/nic/ratelaw/, same fixed point) within 1 %. The reference is given what XDP read
from other maps (tc's tx bytes and next PSN, the control entry) and XDP's packet time (the
CC state's last_fb_ns).
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from controller.nic.bpf.loader import CTL_HAS_CAP, FlowKey, cc_params_to_c
from controller.nic.bpf.syscalls import prog_test_run
from controller.nic.ratelaw import CcParams, Law, ReferenceNic
from controller.nic.ratelaw.base import UNIT
from testbed.emu.nicrig import standalone_nic
from testbed.packets.int_md import IntHop, IntMD, IntShim
from testbed.packets.roce import AETH, BTH, CNP

pytestmark = [
    pytest.mark.root,
]

XDP_PASS = 2
LINE = 100_000_000
A, B = "10.0.1.1", "10.0.2.2"  # the data sender (this NIC) and the receiver


def ack(sport: int, psn: int, hops: list[dict[str, int]], bitmap: int = 0xF500) -> bytes:
    return bytes(
        Ether()
        / IP(src=B, dst=A)
        / UDP(sport=sport, dport=4791)
        / BTH(opcode=0x11, psn=psn)
        / AETH(syndrome=0)
        / IntShim()
        / IntMD(
            instruction_bitmap=bitmap,
            remaining_hop_cnt=8 - len(hops),
            hops=[IntHop(bitmap, **h) for h in hops],
        )
    )


def cnp(sport: int) -> bytes:
    return bytes(
        Ether() / IP(src=B, dst=A) / UDP(sport=sport, dport=4791) / BTH(opcode=0x81, dqpn=5) / CNP()
    )


class Driver:
    """Feeds frames to XDP and to the reference, with tc's view of the flow set alike."""

    def __init__(
        self,
        nic,
        ref: ReferenceNic,
        sport: int,
        cap: int | None = None,  # type: ignore[no-untyped-def]
        start: int | None = None,
    ):
        self.nic, self.ref, self.sport, self.cap = nic, ref, sport, cap
        self.key = FlowKey(A, B, 17, sport, 4791)
        self.tx_bytes = 0
        self.paced = start  # the rate map's entry before the next frame
        if start is not None:  # paced before its first feedback, as the agent's SetRate does
            nic.set_rate(self.key, start, time.monotonic_ns())
        if cap is not None:
            ctl = nic.new_value("xm_ctl")
            ctl.cap_bps, ctl.flags, ctl.weight = cap, CTL_HAS_CAP, 1
            nic.put("xm_ctl", self.key, ctl)

    def send(self, frame: bytes, tx_bytes: int, snd_nxt: int) -> tuple[int, int]:
        st = self.nic.new_value("xm_flows")
        st.tx_bytes, st.snd_nxt_psn, st.flags = tx_bytes, snd_nxt, 1
        self.nic.put("xm_flows", self.key, st)
        assert prog_test_run(self.nic.fd("xdp"), frame).retval == XDP_PASS
        cc = self.nic.get("xm_cc", self.key)
        xdp_rate = int(self.nic.get("xm_rates", self.key).rate_bps)
        ref_rate = self.ref.on_frame(
            frame,
            now_ns=int(cc.last_fb_ns),
            tx_bytes=tx_bytes,
            snd_nxt_psn=snd_nxt,
            cap_bps=self.cap,
            paced_bps=self.paced,
        )
        assert ref_rate is not None
        self.paced = xdp_rate
        return xdp_rate, ref_rate


def _util_ramp(n: int) -> list[float]:
    """Utilisation 0.5 -> 1.4 -> 0.5, then a light-load tail (the queue drains): crosses
    eta = 0.95 both ways."""
    half = n // 2
    up = [0.5 + 0.9 * i / half for i in range(half)]
    return up + up[::-1] + [0.3] * 100


def test_tita_ramp_across_eta_matches_reference() -> None:
    with standalone_nic(LINE, law="tita", base_rtt_ns=100_000) as nic:
        prm = CcParams.defaults(Law.TITA, LINE, 100_000)
        ref = ReferenceNic(LINE, prm)
        d = Driver(nic, ref, sport=50001)
        ts, qlen, tx = 1_000_000, 0, 0
        rates = []
        for i, u in enumerate(_util_ramp(240)):
            ts += 30_000  # 30 us between ACKs, T = 100 us
            qlen = max(0, qlen + int((u - 1.0) * LINE / 8 * 30e-6))  # the queue integrates
            tx += 1500
            hops = [
                {
                    "node_id": 3,
                    "l1_ingress_port": 1,
                    "l1_egress_port": 2,
                    "hop_latency": 500,
                    "queue_id": 0,
                    "queue_occupancy": 0,
                    "egress_ts": ts + 900,
                    "tx_util": int(0.4 * u * 1e6),
                },
                {
                    "node_id": 2,
                    "l1_ingress_port": 4,
                    "l1_egress_port": 5,
                    "hop_latency": 900,
                    "queue_id": 0,
                    "queue_occupancy": qlen,
                    "egress_ts": ts,
                    "tx_util": int(min(u, 1.0) * 1e6),
                },
            ]
            x, r = d.send(ack(d.sport, i, hops), tx, snd_nxt=i + 4)
            assert x == pytest.approx(r, rel=0.01), f"ACK {i}: XDP {x} vs reference {r}"
            rates.append(x)
        assert min(rates[100:140]) < 0.7 * LINE  # cut while U > eta
        # and recovered under light load (W_AI, 5 % of the line rate, is the floor of a cut)
        assert min(rates) < 0.1 * LINE and rates[-1] == LINE
        cc = nic.get("xm_cc", d.key)
        assert cc.feedback == 340 and cc.updates == 339


def test_tita_without_tx_utilisation_and_with_a_cap_matches_reference() -> None:
    bitmap = 0xD400  # node id, L1 ports, queue, egress timestamp: no bit 7
    with standalone_nic(LINE, law="tita", base_rtt_ns=200_000) as nic:
        ref = ReferenceNic(LINE, CcParams.defaults(Law.TITA, LINE, 200_000))
        d = Driver(nic, ref, sport=50002, cap=40_000_000)
        ts, tx = 0, 0
        for i in range(120):
            ts += 50_000
            tx += 1500 * (1 + i % 3)
            q = 3000 if 40 <= i < 80 else 0
            hops = [
                {
                    "node_id": 7,
                    "l1_ingress_port": 1,
                    "l1_egress_port": 9,
                    "queue_id": 1,
                    "queue_occupancy": q,
                    "egress_ts": ts,
                }
            ]
            x, r = d.send(ack(d.sport, i, hops, bitmap), tx, snd_nxt=i + 2)
            assert x == pytest.approx(r, rel=0.01), f"ACK {i}: XDP {x} vs reference {r}"
            assert x <= 40_000_000


@pytest.mark.parametrize("law", ["tita", "dcqcn"])
def test_a_flow_paced_before_its_first_feedback_starts_its_law_there(law: str) -> None:
    """The proactive start: the agent paces a new flow at a start rate (an application's
    hint, e.g. its share of an incast) before it sends; its law starts from that rate, not
    from the line rate, in XDP and in the reference alike."""
    start = LINE // 7
    with standalone_nic(LINE, law=law, base_rtt_ns=100_000) as nic:
        ref = ReferenceNic(LINE, CcParams.defaults(Law[law.upper()], LINE, 100_000))
        d = Driver(nic, ref, sport=50003, start=start)
        hops = [
            {
                "node_id": 2,
                "l1_ingress_port": 4,
                "l1_egress_port": 5,
                "hop_latency": 900,
                "queue_id": 0,
                "queue_occupancy": 0,
                "egress_ts": 1_000,
                "tx_util": 100_000,
            }
        ]
        frame = ack(d.sport, 0, hops) if law == "tita" else cnp(d.sport)
        x, r = d.send(frame, 1500, snd_nxt=4)
        assert x == r
        cc = nic.get("xm_cc", d.key)
        assert int(cc.ref_rate_bps) == start or law == "dcqcn"  # DCQCN's cut sets its target
        assert x <= start  # not the line rate: a plain flow's first feedback starts at LINE
        # a flow that was not paced before starts at the line rate, as before
        plain = Driver(
            nic, ReferenceNic(LINE, CcParams.defaults(Law[law.upper()], LINE, 100_000)), sport=50004
        )
        frame = ack(plain.sport, 0, hops) if law == "tita" else cnp(plain.sport)
        x2, r2 = plain.send(frame, 1500, snd_nxt=4)
        assert x2 == r2 and x2 > x


def test_dcqcn_cnp_burst_and_recovery_matches_reference() -> None:
    base = CcParams.defaults(Law.DCQCN, LINE)
    # timers short enough for a test: 2 ms increase timer and alpha period, 20 ms between
    # cuts (longer than a burst takes here), 100 kB byte counter
    prm = replace(
        base,
        dcqcn=replace(
            base.dcqcn,
            rate_timer_ns=2_000_000,
            alpha_timer_ns=2_000_000,
            cut_interval_ns=20_000_000,
            byte_counter=100_000,
        ),
    )
    with standalone_nic(LINE, law="dcqcn") as nic:
        cfg = nic.config()
        cc_params_to_c(prm, cfg.cc)
        nic.write_config(cfg)
        ref = ReferenceNic(LINE, prm)
        d = Driver(nic, ref, sport=50003)
        tx, psn = 0, 0
        t0 = time.monotonic()
        x, r = d.send(ack(d.sport, psn, []), tx, 1)  # first feedback: state at line rate
        assert x == r == LINE
        seen: list[int] = []
        t1 = t0
        for _burst in range(3):  # three bursts of 6 back-to-back CNPs, 25 ms apart
            for _ in range(6):
                x, r = d.send(cnp(d.sport), tx, psn + 1)
                if not seen:
                    t1 = time.monotonic()
                assert x == pytest.approx(r, rel=0.01)
                seen.append(x)
            time.sleep(0.025)
        # the first CNP cuts to LINE * (1 - alpha / 2): alpha starts at 1 and decays by (1 - g)
        # per alpha period (2 ms) that passed between the first ACK and that CNP, which a busy
        # machine stretches (to 74 ms once: a cut to 57 %); bounded by the time measured
        periods = int((t1 - t0) / 0.002) + 1
        alpha_min = (1 - prm.dcqcn.g / UNIT) ** periods
        assert seen[0] <= LINE * (1 - alpha_min / 2) * 1.01, (seen[0], t1 - t0)
        counters = nic.counter_values()
        assert counters["xdp_dcqcn_cut"] >= 3 and counters["xdp_dcqcn_cut_held"] >= 10
        x, r = d.send(cnp(d.sport), tx, psn + 1)  # one more cut, then recovery
        assert x == pytest.approx(r, rel=0.01) and x < 0.9 * LINE
        low = x
        for i in range(60):  # recovery: ACKs every ~1 ms, 40 kB sent between them
            time.sleep(0.001)
            tx += 40_000
            psn += 25
            x, r = d.send(ack(d.sport, psn, []), tx, psn + 1)
            assert x == pytest.approx(r, rel=0.01), f"ACK {i}: XDP {x} vs reference {r}"
        assert x > low + (LINE - low) / 2  # recovered most of the way
        cc = nic.get("xm_cc", d.key)
        assert cc.timer_count > 0 and cc.byte_count > 0


def test_dcqcn_applies_every_elapsed_period_at_the_next_ack() -> None:
    """ACKs many timer periods apart (a deeply cut flow's): XDP applies all the periods that
    elapsed, as the reference does, not a few per packet."""
    base = CcParams.defaults(Law.DCQCN, LINE)
    # a 200 us increase timer and ACKs about 3 ms apart: about 15 periods per ACK
    prm = replace(
        base,
        dcqcn=replace(
            base.dcqcn, rate_timer_ns=200_000, cut_interval_ns=1_000_000, byte_counter=10_000
        ),
    )
    with standalone_nic(LINE, law="dcqcn") as nic:
        cfg = nic.config()
        cc_params_to_c(prm, cfg.cc)
        nic.write_config(cfg)
        d = Driver(nic, ReferenceNic(LINE, prm), sport=50004)
        tx, psn = 0, 0
        d.send(ack(d.sport, psn, []), tx, 1)
        x, r = d.send(cnp(d.sport), tx, psn + 1)
        assert x == r < 0.6 * LINE
        counts = []
        for i in range(4):
            time.sleep(0.003)
            tx += 12 * 10_000  # 12 byte-counter periods between ACKs
            psn += 80
            x, r = d.send(ack(d.sport, psn, []), tx, psn + 1)
            assert x == r, f"ACK {i}: XDP {x} vs reference {r}"
            cc = nic.get("xm_cc", d.key)
            counts.append((int(cc.timer_count), int(cc.byte_count)))
        assert counts[0][0] >= 10 and counts[0][1] == 12, counts  # more than 4 of each
        assert counts[-1][1] == 48
