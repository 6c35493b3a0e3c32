"""`struct xm_cc_params`: which law a flow runs, and each law's parameters with their defaults
(scaled with the emulated line rate: see controller/nic/ratelaw/tita.py and dcqcn.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from controller.nic.ratelaw.base import MAX_BASE_RTT_NS, MAX_SPEED_BPS, UNIT, Law, to_fixed

DCQCN_REFERENCE_RATE_BPS = 40 * 10**9  # the paper's line rate, which DcqcnParams.scaled() dilates


@dataclass(frozen=True)
class TitaParams:
    wai_bps: int
    eta: int = to_fixed(0.95)  # UNIT scale
    max_stage: int = 0
    base_rtt_ns: int = 100_000

    @classmethod
    def defaults(cls, line_rate_bps: int, base_rtt_ns: int = 100_000) -> TitaParams:
        eta = 0.95
        return cls(
            wai_bps=int(line_rate_bps * (1 - eta) / 100),
            eta=to_fixed(eta),
            max_stage=0,
            base_rtt_ns=base_rtt_ns,
        )


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
        )


@dataclass(frozen=True)
class CcParams:
    """`struct xm_cc_params`: the law and both laws' parameters."""

    law: Law
    min_rate_bps: int
    tita: TitaParams
    dcqcn: DcqcnParams

    @classmethod
    def defaults(cls, law: Law, line_rate_bps: int, base_rtt_ns: int = 100_000) -> CcParams:
        return cls(
            law=law,
            min_rate_bps=max(1, line_rate_bps // 1000),
            tita=TitaParams.defaults(line_rate_bps, base_rtt_ns),
            dcqcn=DcqcnParams.scaled(line_rate_bps),
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


def with_law(params: CcParams, law: Law) -> CcParams:
    return replace(params, law=law)
