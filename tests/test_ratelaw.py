"""controller/nic/ratelaw/: the reference rate laws (no kernel needed)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from controller.nic.ratelaw import (
    NO_TS,
    UNIT,
    CcParams,
    CcState,
    DcqcnParams,
    EchoError,
    IntHopValues,
    Law,
    ReferenceNic,
    TitaParams,
    dcqcn_on_feedback,
    fx_pow,
    parse_echo,
    psn_ge,
    tita_on_ack,
    to_fixed,
)
from controller.nic.ratelaw.dcqcn import DCQCN_BACKLOG
from controller.wire.int_md import hop_ml_words

VECTORS = Path(__file__).parent / "data" / "int_v21.json"
LINE = 100_000_000


def test_defaults_scale_with_the_line_rate() -> None:
    slow, fast = CcParams.defaults(Law.TITA, 100_000_000), CcParams.defaults(Law.TITA, 10**9)
    assert slow.tita.wai_bps == 5_000_000  # 100 Mb/s * (1 - 0.95): N = 1
    assert CcParams.defaults(Law.HPCC, 100_000_000).hpcc.wai_bps == 50_000  # HPCC's N = 100
    assert fast.tita.wai_bps == 10 * slow.tita.wai_bps
    assert slow.tita.eta == to_fixed(0.95) and slow.tita.max_stage == 0
    assert fast.min_rate_bps == 10 * slow.min_rate_bps == 1_000_000
    d40, d100m = DcqcnParams.scaled(40 * 10**9), DcqcnParams.scaled(100_000_000)
    # the paper's values at 40 Gb/s
    assert (d40.rai_bps, d40.byte_counter, d40.alpha_timer_ns, d40.g) == (
        40_000_000,
        10 * 1024 * 1024,
        55_000,
        UNIT // 256,
    )
    # time dilation by 400: rates / 400, intervals * 400, bytes unchanged
    assert d100m.rai_bps == 100_000 and d100m.rhai_bps == 1_000_000
    assert d100m.rate_timer_ns == 22_000_000 and d100m.cut_interval_ns == 1_600_000
    assert d100m.byte_counter == d40.byte_counter and d100m.fast_recovery_steps == 5


def test_params_validation_rejects_what_the_fixed_point_cannot_carry() -> None:
    ok = CcParams.defaults(Law.TITA, LINE)
    ok.validate(LINE)
    with pytest.raises(ValueError, match="base RTT"):
        CcParams.defaults(Law.TITA, LINE, base_rtt_ns=10**9).validate(LINE)
    with pytest.raises(ValueError, match="line rate"):
        ok.validate(10**13)
    d = CcParams.defaults(Law.DCQCN, LINE)
    with pytest.raises(ValueError, match="clamp_target 4"):
        replace(d, dcqcn=replace(d.dcqcn, clamp_target=4)).validate(LINE)


def test_int_words_and_golden_echo_parse() -> None:
    assert hop_ml_words(0xF500) == 7  # bits 0,1,2,3,5,7: 1+1+1+1+2+1
    assert hop_ml_words(0xFF00) == 11  # bits 4-6 are two words each
    doc = json.loads(VECTORS.read_text())
    vec = next(v for v in doc["vectors"] if v["name"] == "three_hops_newest_first")
    frame = bytes.fromhex(vec["hex"])
    # shim + MD + stack of a data packet is what an ACK echoes byte for byte
    int_part = frame[14 + 20 + 8 : -len(bytes.fromhex(vec["decoded"]["payload_hex"]))]
    hops = parse_echo(int_part)
    assert not isinstance(hops, EchoError)
    want = vec["decoded"]["hops"]
    assert [h.node_id for h in hops] == [w["node_id"] for w in want]
    assert [h.qlen for h in hops] == [w["queue_occupancy"] for w in want]
    assert [h.egress_ts_ns for h in hops] == [w["egress_ts"] for w in want]
    assert [h.tx_util_ppm for h in hops] == [w["tx_util"] for w in want]
    assert [h.port for h in hops] == [w["l1_egress_port"] for w in want]
    # not an echo / broken ones
    assert parse_echo(b"") is EchoError.NO_INT
    assert parse_echo(int_part[:-4]) is EchoError.NO_INT  # length disagrees with the shim
    bad_ver = int_part[:4] + bytes([0x10]) + int_part[5:]
    assert parse_echo(bad_ver) is EchoError.BAD_HEADER


def _hop(node: int, util_ppm: int, qlen: int, ts: int) -> IntHopValues:
    return IntHopValues(node, 1, qlen, ts, util_ppm)


def _tita(cc: CcState, prm: CcParams, util_ppm: int, ts: int, psn: int, qlen: int = 0) -> int:
    tita_on_ack(
        cc,
        prm,
        [_hop(2, util_ppm // 2, 0, ts), _hop(1, util_ppm, qlen, ts)],
        ack_psn=psn,
        snd_nxt_psn=psn + 1,
        tx_bytes=0,
        now_ns=ts,
        ceil_bps=LINE,
        weight=1,
        line_rate_bps=LINE,
    )
    return cc.rate_bps


def test_tita_cuts_above_eta_and_adds_w_ai_below() -> None:
    prm = CcParams.defaults(Law.TITA, LINE, base_rtt_ns=100_000)
    cc = CcState.initial(Law.TITA, LINE, 0, 0)
    assert _tita(cc, prm, 500_000, 1_000, 0) == LINE  # first ACK: records only
    # a full RTT of 2x overload (tau >= T): U = 2 -> R = R_ref * 0.95 / 2 + W_AI
    r = _tita(cc, prm, 2_000_000, 200_000, 1)
    assert r == pytest.approx(LINE * 0.95 / 2 + prm.tita.wai_bps, rel=1e-4)
    assert cc.ref_rate_bps == r and cc.util == pytest.approx(2 * UNIT, rel=1e-4)
    # an ACK inside the same RTT (PSN not past the last update) does not commit
    before_ref = cc.ref_rate_bps
    _tita(cc, prm, 2_000_000, 210_000, 1)
    assert cc.ref_rate_bps == before_ref
    # light load: U drifts down; once below eta with max_stage 1 the law adds W_AI per RTT
    prm1 = replace(prm, tita=TitaParams(prm.tita.wai_bps, prm.tita.eta, 1, prm.tita.base_rtt_ns))
    ts, psn = 400_000, 2
    rates = []
    for _ in range(20):
        rates.append(_tita(cc, prm1, 300_000, ts, psn))
        ts += 200_000
        psn += 1
    assert rates[-1] > rates[0]  # recovered
    assert max(rates) <= LINE


def test_tita_queue_term_and_fallback_without_tx_utilisation() -> None:
    prm = CcParams.defaults(Law.TITA, LINE, base_rtt_ns=100_000)
    cc = CcState.initial(Law.TITA, LINE, 0, 0)
    no_util = 0xFFFFFFFF
    bdp = LINE // 8 * 100_000 // 10**9  # 1250 bytes
    hops0 = [IntHopValues(1, 1, 4 * bdp, 0, no_util)]
    tita_on_ack(
        cc,
        prm,
        hops0,
        ack_psn=0,
        snd_nxt_psn=1,
        tx_bytes=0,
        now_ns=0,
        ceil_bps=LINE,
        weight=1,
        line_rate_bps=LINE,
    )
    hops1 = [IntHopValues(1, 1, 4 * bdp, 100_000, no_util)]
    tita_on_ack(
        cc,
        prm,
        hops1,
        ack_psn=1,
        snd_nxt_psn=2,
        tx_bytes=1000,
        now_ns=100_000,
        ceil_bps=LINE,
        weight=1,
        line_rate_bps=LINE,
    )
    # standing queue of 4 BDP: u = 4 (queue) + 1 (busy port)
    assert cc.util == pytest.approx(5 * UNIT, rel=1e-3)


def test_psn_serial_arithmetic() -> None:
    assert psn_ge(5, 5) and psn_ge(6, 5) and not psn_ge(4, 5)
    assert psn_ge(2, 0xFFFFFE)  # wrapped
    assert not psn_ge(0xFFFFFE, 2)


def test_fx_pow_tracks_float_pow() -> None:
    base = UNIT - UNIT // 256
    for n in (0, 1, 7, 100, 1000, 65535):
        assert fx_pow(base, n) / UNIT == pytest.approx((255 / 256) ** n, abs=2e-4)


def test_dcqcn_cut_alpha_and_recovery_stages() -> None:
    prm = CcParams.defaults(Law.DCQCN, LINE)
    d = prm.dcqcn
    cc = CcState.initial(Law.DCQCN, LINE, 0, 0)
    dcqcn_on_feedback(cc, prm, is_cnp=True, tx_bytes=0, now_ns=0, ceil_bps=LINE, weight=1)
    assert cc.rate_bps == LINE // 2 and cc.ref_rate_bps == LINE  # alpha starts at 1
    assert cc.alpha == UNIT  # (1 - g) * 1 + g
    # a second CNP within the cut interval is held
    held = dcqcn_on_feedback(
        cc, prm, is_cnp=True, tx_bytes=0, now_ns=d.cut_interval_ns // 2, ceil_bps=LINE, weight=1
    )
    assert "XDP_DCQCN_CUT_HELD" in held and cc.rate_bps == LINE // 2
    # fast recovery: F timer events halve the gap to the target each
    t = 0
    rates = []
    for _ in range(d.fast_recovery_steps):
        t += d.rate_timer_ns
        dcqcn_on_feedback(cc, prm, is_cnp=False, tx_bytes=0, now_ns=t, ceil_bps=LINE, weight=1)
        rates.append(cc.rate_bps)
    assert rates[0] == (LINE // 2 + LINE) // 2
    assert cc.ref_rate_bps == LINE and cc.timer_count == d.fast_recovery_steps
    # alpha decayed over the elapsed alpha periods
    assert cc.alpha < UNIT
    # a cut from below the line rate, then additive increase moves the target
    dcqcn_on_feedback(
        cc, prm, is_cnp=True, tx_bytes=0, now_ns=t + d.cut_interval_ns, ceil_bps=LINE, weight=1
    )
    target = cc.ref_rate_bps
    t += d.cut_interval_ns
    for _ in range(d.fast_recovery_steps + 1):
        t += d.rate_timer_ns
        dcqcn_on_feedback(cc, prm, is_cnp=False, tx_bytes=0, now_ns=t, ceil_bps=LINE, weight=1)
    assert cc.ref_rate_bps == target + d.rai_bps  # one additive step after F
    # byte counter events too: both counters past F -> hyper increase
    tx = 0
    for _ in range(d.fast_recovery_steps + 2):
        tx += d.byte_counter
        t += d.rate_timer_ns
        dcqcn_on_feedback(cc, prm, is_cnp=False, tx_bytes=tx, now_ns=t, ceil_bps=LINE, weight=1)
    assert cc.byte_count > d.fast_recovery_steps and cc.timer_count > d.fast_recovery_steps
    assert cc.ref_rate_bps == min(LINE, cc.ref_rate_bps)


def test_dcqcn_cut_sets_the_target_as_its_clamp_says() -> None:
    """`clamp_target` 1 (the paper): every cut sets R_T to the rate before it; 2 (ConnectX
    firmware's clamp_tgt_rate 0 after_time_inc 1, HPCC's ns-3 CLAMP_TARGET_RATE 0): only a cut
    after a timer increase since the previous cut; 0: never."""

    def run(clamp: int, byte_event: bool, timer_event: bool) -> tuple[int, int]:
        base = CcParams.defaults(Law.DCQCN, LINE)
        prm = replace(base, dcqcn=replace(base.dcqcn, clamp_target=clamp, byte_counter=1000))
        d = prm.dcqcn
        cc = CcState.initial(Law.DCQCN, LINE, 0, 0)
        dcqcn_on_feedback(cc, prm, is_cnp=True, tx_bytes=0, now_ns=0, ceil_bps=LINE, weight=1)
        first_target = cc.ref_rate_bps
        t, tx = d.cut_interval_ns, 0
        if byte_event:  # one byte-counter increase
            tx = 1000
            dcqcn_on_feedback(cc, prm, is_cnp=False, tx_bytes=tx, now_ns=t, ceil_bps=LINE, weight=1)
        if timer_event:  # one timer increase
            t = d.rate_timer_ns + 1
            dcqcn_on_feedback(cc, prm, is_cnp=False, tx_bytes=tx, now_ns=t, ceil_bps=LINE, weight=1)
        before = cc.rate_bps
        dcqcn_on_feedback(
            cc, prm, is_cnp=True, tx_bytes=tx, now_ns=t + d.cut_interval_ns, ceil_bps=LINE, weight=1
        )
        assert cc.rate_bps < before  # it cut
        return first_target, cc.ref_rate_bps if cc.ref_rate_bps != before else -before

    # the first cut, at the line rate: every rule leaves R_T at the line rate (where it starts)
    assert run(1, False, False)[0] == run(2, False, False)[0] == run(0, False, False)[0] == LINE
    # the second cut, after a byte-counter increase only: the paper's sets R_T to the rate
    # before the cut; the firmware's keeps the line rate
    assert run(1, True, False)[1] < 0  # -rate: R_T == the rate before the cut
    assert run(2, True, False)[1] == LINE and run(0, True, False)[1] == LINE
    # after a timer increase: the firmware's sets it too; "never" still keeps it
    assert run(2, True, True)[1] < 0 and run(2, False, True)[1] < 0
    assert run(0, False, True)[1] == LINE


def test_dcqcn_applies_every_elapsed_event_at_the_next_feedback_up_to_the_backlog() -> None:
    """A cut flow's ACKs come many timer periods apart; NICs run the timers in real time, so
    one feedback packet must apply them all (ebpf/lib/dcqcn.h has no smaller per-packet bound),
    up to the backlog."""
    prm = CcParams.defaults(Law.DCQCN, LINE)
    d = prm.dcqcn

    def cut() -> CcState:
        cc = CcState.initial(Law.DCQCN, LINE, 0, 0)
        dcqcn_on_feedback(cc, prm, is_cnp=True, tx_bytes=0, now_ns=0, ceil_bps=LINE, weight=1)
        return cc

    def feed(cc: CcState, now: int, tx: int) -> None:
        dcqcn_on_feedback(cc, prm, is_cnp=False, tx_bytes=tx, now_ns=now, ceil_bps=LINE, weight=1)

    periods = 40  # more than the 4 per packet the NIC once applied, fewer than the backlog
    assert 4 < periods < DCQCN_BACKLOG
    one, many = cut(), cut()
    feed(one, periods * d.rate_timer_ns, periods * d.byte_counter)
    for k in range(1, periods + 1):
        feed(many, k * d.rate_timer_ns, k * d.byte_counter)
    assert one.timer_count == one.byte_count == periods
    # the same events, applied timers first by the one packet, interleaved by the many
    fields = ("timer_count", "byte_count", "timer_ts_ns", "bc_base_bytes")
    assert [getattr(one, f) for f in fields] == [getattr(many, f) for f in fields]
    assert one.rate_bps > LINE // 2 + (LINE // 2) * 9 // 10  # recovered, not 4 steps of it
    # beyond the backlog the oldest periods are dropped and the clocks catch up
    late = cut()
    feed(late, 1000 * d.rate_timer_ns + 7, 1000 * d.byte_counter + 7)
    assert late.timer_count == late.byte_count == DCQCN_BACKLOG
    assert late.timer_ts_ns == 1000 * d.rate_timer_ns + 7
    assert late.bc_base_bytes == 1000 * d.byte_counter + 7


def test_reference_nic_ignores_what_is_not_feedback() -> None:
    nic = ReferenceNic(LINE, CcParams.defaults(Law.DCQCN, LINE))
    assert nic.on_frame(b"\x00" * 60, now_ns=0, tx_bytes=0, snd_nxt_psn=None) is None
    assert not nic.flows
    assert NO_TS == 2**64 - 1


# ---- the baselines: HPCC, TIMELY, Swift --------------------------------------------------------


def test_baseline_defaults_are_the_papers_scaled() -> None:
    from controller.nic.ratelaw import TimelyParams

    p = CcParams.defaults(Law.HPCC, LINE, 200_000)
    assert p.hpcc.max_stage == 5 and p.hpcc.eta == p.tita.eta and p.tita.max_stage == 0
    assert p.hpcc.wai_bps == p.tita.wai_bps // 100 and p.hpcc.base_rtt_ns == 200_000  # N 100 vs 1
    t10, t100m = TimelyParams.scaled(10 * 10**9), TimelyParams.scaled(LINE)
    assert (t10.delta_bps, t10.t_low_ns, t10.t_high_ns, t10.min_rtt_ns) == (
        10_000_000,
        50_000,
        500_000,
        20_000,
    )  # the paper's 10 Gb/s values
    assert (t100m.delta_bps, t100m.t_low_ns, t100m.t_high_ns) == (100_000, 5_000_000, 50_000_000)
    assert t10.alpha == to_fixed(0.875) and t10.beta == to_fixed(0.8) and t10.hai_steps == 5
    s = CcParams.defaults(Law.SWIFT, LINE, 20_000_000).swift
    assert s.base_target_ns == 20_000_000 and s.per_hop_ns == 5_000_000
    assert s.ai_bytes == 4154  # one full frame per RTT
    assert s.beta == to_fixed(0.8) and s.max_mdf == to_fixed(0.5)
    CcParams.defaults(Law.SWIFT, LINE, 100_000).validate(LINE)


def test_hpcc_commits_u_on_every_ack_where_tita_waits_for_the_rtt() -> None:
    """The one difference of the two measurements: under a step to U = 2 inside one RTT,
    HPCC's U has moved after the second ACK, TiTa's is still its committed 1.0."""
    from controller.nic.ratelaw import HPCC_MAX_STAGE

    states = {}
    for law in (Law.TITA, Law.HPCC):
        prm = CcParams.defaults(law, LINE, 100_000)
        cc = CcState.initial(law, LINE, 0, 0)
        for i, q in enumerate((0, 12_500, 12_500)):  # 12.5 kB = one B*T at 100 Mb/s
            hop = IntHopValues(
                node_id=1, port=1, qlen=q, egress_ts_ns=(i + 1) * 30_000, tx_util_ppm=1_000_000
            )
            tita_on_ack(
                cc,
                prm,
                [hop],
                ack_psn=0,
                snd_nxt_psn=10,
                tx_bytes=0,
                now_ns=(i + 1) * 30_000,
                ceil_bps=LINE,
                weight=1,
                line_rate_bps=LINE,
                hpcc=law == Law.HPCC,
            )
        states[law] = cc
    assert states[Law.TITA].util == UNIT
    assert states[Law.HPCC].util > UNIT + UNIT // 10
    assert HPCC_MAX_STAGE == 5


def test_timely_and_swift_on_rtt_samples() -> None:
    from controller.nic.ratelaw import RttProbe, swift_on_rtt, take_rtt_sample, timely_on_rtt

    prm = CcParams.defaults(Law.TIMELY, LINE)
    cc = CcState.initial(Law.TIMELY, LINE, 0, 0)
    assert timely_on_rtt(cc, prm, 3_000_000, LINE, 1) == "XDP_TIMELY_FIRST_RTT"
    assert cc.rate_bps == LINE
    cc.rate_bps = LINE // 2
    timely_on_rtt(cc, prm, 3_000_000, LINE, 1)  # below T_low (5 ms): + delta
    assert cc.rate_bps == LINE // 2 + prm.timely.delta_bps
    timely_on_rtt(cc, prm, 100_000_000, LINE, 1)  # above T_high: x (1 - 0.8 (1 - 50/100))
    assert cc.rate_bps == pytest.approx((LINE // 2 + 100_000) * 0.6, rel=1e-5)
    before = cc.rate_bps
    timely_on_rtt(cc, prm, 20_000_000, LINE, 1)  # falling gradient: + delta
    assert cc.rate_bps == before + prm.timely.delta_bps and cc.rtt_diff_ns < 0
    # one sample per probe, and only from an ACK that covers its PSN
    probe = RttProbe(seq=3, psn=100, sent_ns=1_000)
    assert take_rtt_sample(cc, probe, 99, 5_000) is None
    assert take_rtt_sample(cc, probe, 100, 5_000) == 4_000
    assert take_rtt_sample(cc, probe, 101, 6_000) is None

    prm = CcParams.defaults(Law.SWIFT, LINE, 10_000_000)
    cc = CcState.initial(Law.SWIFT, LINE // 2, 0, 0)
    # two hops (TTL 62): target 15 ms; 14 ms increases, 30 ms decreases once per RTT
    assert swift_on_rtt(cc, prm, 14_000_000, 62, 1, LINE, 1) == "XDP_SWIFT_INCREASE"
    assert cc.rate_bps == LINE // 2 + 4154 * 8 * 10**9 // 14_000_000  # one frame per RTT
    up = cc.rate_bps
    assert swift_on_rtt(cc, prm, 30_000_000, 62, 2, LINE, 1) == "XDP_SWIFT_DECREASE"
    assert cc.rate_bps == pytest.approx(up * 0.6, rel=1e-5)
    assert swift_on_rtt(cc, prm, 30_000_000, 62, 3, LINE, 1) == "XDP_SWIFT_DECREASE_HELD"
    assert swift_on_rtt(cc, prm, 300_000_000, 62, 400_000_000, LINE, 1) == "XDP_SWIFT_DECREASE"
    assert cc.rate_bps == pytest.approx(up * 0.6 * 0.5, rel=1e-5)  # max_mdf bounds the cut
