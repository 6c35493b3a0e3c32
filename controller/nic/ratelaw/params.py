"""`struct xm_cc_params`: which law a flow runs, and each law's parameters with their defaults
(scaled with the emulated line rate: see controller/nic/ratelaw/tita.py and dcqcn.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from controller.nic.ratelaw.base import (
    MAX_BASE_RTT_NS,
    MAX_SPEED_BPS,
    UNIT,
    Law,
    to_fixed,
)

DCQCN_REFERENCE_RATE_BPS = 40 * 10**9  # the paper's line rate, which DcqcnParams.scaled() dilates
TIMELY_REFERENCE_RATE_BPS = 10 * 10**9  # TIMELY's paper's NICs
HPCC_MAX_STAGE = 5
# W_AI = line rate * (1 - eta) / N: HPCC's W_init (1 - eta) / N for N flows. HPCC as published
# takes N = 100. TiTa takes N = 1: HPCC's multiplicative steps keep the ratio of two flows'
# rates, and only W_AI evens them out; at N = 100 (0.05 % of the line rate per RTT) the twin's
# 7:1 incast kept a Jain index of 0.26 in its worst 10 T window and 81 % utilisation; at
# N = 1, 0.98 and 98 %, at the cost of a higher WebSearch p99 queue (110 -> 148 KB).
TITA_WAI_FLOWS = 1
HPCC_WAI_FLOWS = 100
SWIFT_MTU_BYTES = 4154  # the testbed's full frame: 4096 B of payload + 58 B of headers
SWIFT_MAX_AI_BYTES = 1 << 20


@dataclass(frozen=True)
class TitaParams:
    wai_bps: int
    eta: int = to_fixed(0.95)  # UNIT scale
    max_stage: int = 0
    base_rtt_ns: int = 100_000

    @classmethod
    def defaults(
        cls, line_rate_bps: int, base_rtt_ns: int = 100_000, wai_flows: int = TITA_WAI_FLOWS
    ) -> TitaParams:
        eta = 0.95
        return cls(
            wai_bps=int(line_rate_bps * (1 - eta) / wai_flows),
            eta=to_fixed(eta),
            max_stage=0,
            base_rtt_ns=base_rtt_ns,
        )


# XM_DCQCN_CLAMP_* of ebpf/xingmai.h: a DCQCN cut sets the target rate R_T to the current
# rate on every cut (the paper's), or only when the timer has raised the rate since the
# previous cut (ConnectX firmware's clamp_tgt_rate 0, clamp_tgt_rate_after_time_inc 1; HPCC's
# ns-3 simulator with EcnClampTgtRate 0)
DCQCN_CLAMP_ALWAYS = 1
DCQCN_CLAMP_AFTER_TIMER = 2


@dataclass(frozen=True)
class DcqcnParams:
    rai_bps: int
    rhai_bps: int
    byte_counter: int
    g: int
    alpha_timer_ns: int
    rate_timer_ns: int
    cut_interval_ns: int
    fast_recovery_steps: int
    # DCQCN_CLAMP_*: when a cut sets the target rate to the current rate (the paper: always)
    clamp_target: int = DCQCN_CLAMP_ALWAYS

    @classmethod
    def scaled(cls, line_rate_bps: int) -> DcqcnParams:
        s = line_rate_bps / DCQCN_REFERENCE_RATE_BPS
        rai = int(40e6 * s)
        return cls(
            rai_bps=max(1, rai),
            rhai_bps=max(1, 10 * rai),
            byte_counter=10 * 1024 * 1024,
            g=UNIT // 256,
            alpha_timer_ns=int(55_000 / s),
            rate_timer_ns=int(55_000 / s),
            cut_interval_ns=int(4_000 / s),
            fast_recovery_steps=5,
            clamp_target=DCQCN_CLAMP_ALWAYS,
        )


def hpcc_defaults(line_rate_bps: int, base_rtt_ns: int = 100_000) -> TitaParams:
    """HPCC's parameters (`struct xm_tita_params`): TiTa's, with the paper's maxStage = 5."""
    return replace(
        TitaParams.defaults(line_rate_bps, base_rtt_ns, HPCC_WAI_FLOWS), max_stage=HPCC_MAX_STAGE
    )


@dataclass(frozen=True)
class TimelyParams:
    alpha: int  # EWMA weight of a new RTT difference, UNIT scale
    beta: int  # multiplicative decrease factor, UNIT scale
    delta_bps: int  # additive increase step
    t_low_ns: int
    t_high_ns: int
    min_rtt_ns: int  # normalises the gradient
    hai_steps: int  # gradient <= 0 this many updates in a row: increase by hai_steps x delta

    @classmethod
    def scaled(cls, line_rate_bps: int) -> TimelyParams:
        s = line_rate_bps / TIMELY_REFERENCE_RATE_BPS
        return cls(
            alpha=to_fixed(0.875),
            beta=to_fixed(0.8),
            delta_bps=max(1, int(10e6 * s)),
            t_low_ns=int(50_000 / s),
            t_high_ns=int(500_000 / s),
            min_rtt_ns=max(1, int(20_000 / s)),
            hai_steps=5,
        )


@dataclass(frozen=True)
class SwiftParams:
    ai_bytes: int  # additive increase of the window per RTT below the target
    beta: int  # UNIT scale: the decrease is beta x (delay - target) / delay
    max_mdf: int  # UNIT scale: largest decrease in one step
    base_target_ns: int
    per_hop_ns: int  # topology scaling of the target
    sender_ttl: int  # the TTL feedback leaves its sender with: hops = sender_ttl - TTL

    @classmethod
    def defaults(
        cls, line_rate_bps: int, base_rtt_ns: int = 100_000, mtu_bytes: int = SWIFT_MTU_BYTES
    ) -> SwiftParams:
        return cls(
            ai_bytes=mtu_bytes,  # Swift's ai = 1 packet
            beta=to_fixed(0.8),
            max_mdf=to_fixed(0.5),
            base_target_ns=base_rtt_ns,
            per_hop_ns=base_rtt_ns // 4,
            sender_ttl=64,
        )


@dataclass(frozen=True)
class CcParams:
    """`struct xm_cc_params`: the law and every law's parameters."""

    law: Law
    min_rate_bps: int
    tita: TitaParams
    dcqcn: DcqcnParams
    hpcc: TitaParams
    timely: TimelyParams
    swift: SwiftParams

    @classmethod
    def defaults(cls, law: Law, line_rate_bps: int, base_rtt_ns: int = 100_000) -> CcParams:
        return cls(
            law=law,
            min_rate_bps=max(1, line_rate_bps // 1000),
            tita=TitaParams.defaults(line_rate_bps, base_rtt_ns),
            dcqcn=DcqcnParams.scaled(line_rate_bps),
            hpcc=hpcc_defaults(line_rate_bps, base_rtt_ns),
            timely=TimelyParams.scaled(line_rate_bps),
            swift=SwiftParams.defaults(line_rate_bps, base_rtt_ns),
        )

    def validate(self, line_rate_bps: int) -> None:
        """Raise ValueError for values the fixed point cannot carry."""
        if not 0 < line_rate_bps <= MAX_SPEED_BPS:
            raise ValueError(f"line rate {line_rate_bps} outside (0, {MAX_SPEED_BPS}] bit/s")
        if not 0 < self.tita.base_rtt_ns <= MAX_BASE_RTT_NS:
            raise ValueError(f"base RTT {self.tita.base_rtt_ns} ns outside (0, 1e8]")
        if not 0 < self.tita.eta <= UNIT:
            raise ValueError("eta must be in (0, 1]")
        if not 0 < self.dcqcn.g < UNIT:
            raise ValueError("g must be in (0, 1)")
        if not 0 <= self.min_rate_bps <= line_rate_bps:
            raise ValueError("min rate must be within [0, line rate]")
        for name in ("alpha_timer_ns", "rate_timer_ns", "cut_interval_ns"):
            if not 0 <= getattr(self.dcqcn, name) < 2**32:
                raise ValueError(f"{name} must fit 32 bits of ns")
        for name in ("wai_bps",):
            if not 0 <= getattr(self.tita, name) <= line_rate_bps:
                raise ValueError(f"{name} must be within [0, line rate]")
        for name in ("rai_bps", "rhai_bps"):
            if not 0 <= getattr(self.dcqcn, name) <= line_rate_bps:
                raise ValueError(f"{name} must be within [0, line rate]")
        if self.tita.max_stage >= 2**32 or self.dcqcn.fast_recovery_steps >= 2**32:
            raise ValueError("stage counts must fit 32 bits")
        if self.dcqcn.clamp_target & ~(DCQCN_CLAMP_ALWAYS | DCQCN_CLAMP_AFTER_TIMER):
            raise ValueError(
                f"DCQCN clamp_target {self.dcqcn.clamp_target}: 0 (never), "
                f"{DCQCN_CLAMP_ALWAYS} (every cut) or {DCQCN_CLAMP_AFTER_TIMER} (after a "
                "timer increase), or both"
            )
        h, t, w = self.hpcc, self.timely, self.swift
        if not 0 < h.base_rtt_ns <= MAX_BASE_RTT_NS or not 0 < h.eta <= UNIT:
            raise ValueError("HPCC: base RTT outside (0, 1e8] ns or eta outside (0, 1]")
        if not 0 <= h.wai_bps <= line_rate_bps or h.max_stage >= 2**32:
            raise ValueError("HPCC: W_AI must be within [0, line rate], max stage 32 bits")
        if not (
            0 <= t.alpha <= UNIT
            and 0 <= t.beta <= UNIT
            and 0 <= w.beta <= UNIT
            and 0 <= w.max_mdf <= UNIT
        ):
            raise ValueError("TIMELY/Swift: alpha, beta and max_mdf must be in [0, 1]")
        for name, v in (
            ("t_low_ns", t.t_low_ns),
            ("t_high_ns", t.t_high_ns),
            ("min_rtt_ns", t.min_rtt_ns),
            ("base_target_ns", w.base_target_ns),
            ("per_hop_ns", w.per_hop_ns),
        ):
            if not 0 <= v < 2**32:
                raise ValueError(f"{name} must fit 32 bits of ns")
        if t.min_rtt_ns == 0 or t.t_low_ns > t.t_high_ns:
            raise ValueError("TIMELY: min RTT must be > 0 and T_low <= T_high")
        if not 0 <= t.delta_bps <= line_rate_bps:
            raise ValueError("delta_bps must be within [0, line rate]")
        if not 0 <= w.ai_bytes <= SWIFT_MAX_AI_BYTES:
            raise ValueError(f"ai_bytes must be within [0, {SWIFT_MAX_AI_BYTES}]")
        if not 0 <= t.hai_steps < 2**32 or not 0 <= w.sender_ttl <= 255:
            raise ValueError("TIMELY hai_steps must fit 32 bits, Swift sender_ttl 8 bits")


def with_law(params: CcParams, law: Law) -> CcParams:
    return replace(params, law=law)
