"""`struct xm_cc_params`: which law a flow runs and both laws' parameters."""

from __future__ import annotations

from dataclasses import dataclass, replace

from controller.nic.ratelaw.base import MAX_BASE_RTT_NS, MAX_SPEED_BPS, UNIT, Law
from controller.nic.ratelaw.dcqcn import DcqcnParams
from controller.nic.ratelaw.tita import TitaParams


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
