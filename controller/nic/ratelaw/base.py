"""What the rate laws share: the fixed point, the law codes, the per-flow state (as XDP keeps
it in `struct xm_cc_state`) and the small helpers both laws call.

Units: rates in bit/s (of the frame as the transport hands it to the NIC), times in ns,
utilisation, eta, alpha and g as fractions scaled by UNIT = 2**20.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from controller.wire.roce import PSN_MASK

UNIT_SHIFT = 20
UNIT = 1 << UNIT_SHIFT
U_MAX = 64 << UNIT_SHIFT
MAX_HOPS = 8
NSEC = 1_000_000_000
ALL_ONES32 = 0xFFFFFFFF
NO_TS = 0xFFFFFFFFFFFFFFFF
U64 = (1 << 64) - 1
# Largest line rate / hop speed (bit/s) and base RTT (ns) the 64-bit fixed point supports:
# (B / 8) * T must stay below 2**64.
MAX_SPEED_BPS = 10**12
MAX_BASE_RTT_NS = 10**8
RTT_MAX_NS = ALL_ONES32  # RTT samples are clamped to 32 bits of ns (4.3 s)


class Law(enum.IntEnum):
    """Values of `enum xm_law` in ebpf/xingmai.h."""

    NONE = 0
    TITA = 1
    DCQCN = 2
    HPCC = 3
    TIMELY = 4
    SWIFT = 5


def to_fixed(x: float) -> int:
    """A fraction as the eBPF code holds it (UNIT scale, rounded)."""
    return int(round(x * UNIT))


def from_fixed(v: int) -> float:
    return v / UNIT


HAVE_RECORDS = 1
PSN_VALID = 2
CUT_SEEN = 4
TIMER_INC = 8  # DCQCN: a timer increase event since the last cut


@dataclass
class HopRecord:
    node_id: int = 0
    qlen: int = 0
    egress_ts_ns: int = 0
    tx_util_ppm: int = 0


@dataclass
class CcState:
    """`struct xm_cc_state` (the fields the laws use)."""

    law: Law = Law.NONE
    rate_bps: int = 0
    ref_rate_bps: int = 0
    last_fb_ns: int = 0
    feedback: int = 0
    updates: int = 0
    prev_tx_bytes: int = 0
    util: int = 0
    inc_stage: int = 0
    last_update_psn: int = 0
    nhops: int = 0
    alpha: int = 0
    timer_count: int = 0
    byte_count: int = 0
    alpha_ts_ns: int = 0
    timer_ts_ns: int = 0
    bc_base_bytes: int = 0
    last_cut_ns: int = 0
    flags: int = 0
    # TIMELY, Swift
    rtt_ns: int = 0  # the last RTT sample (TIMELY: prev_rtt)
    rtt_diff_ns: int = 0  # TIMELY: EWMA of the RTT difference (signed)
    rtt_done_seq: int = 0  # the tc probe whose sample has been taken
    hops: list[HopRecord] = field(default_factory=lambda: [HopRecord() for _ in range(MAX_HOPS)])

    @classmethod
    def initial(
        cls, law: Law, ceil_bps: int, tx_bytes: int, now_ns: int, probe_seq: int = 0
    ) -> CcState:
        """xm_cc_init(): tc's pending RTT probe counts as taken (it may predate the law)."""
        return cls(
            law=law,
            rtt_done_seq=probe_seq,
            rate_bps=ceil_bps,
            ref_rate_bps=ceil_bps,
            util=UNIT,
            alpha=UNIT,
            alpha_ts_ns=now_ns,
            timer_ts_ns=now_ns,
            bc_base_bytes=tx_bytes,
            prev_tx_bytes=tx_bytes,
        )


def bound_rate(rate: int, min_rate: int, ceil: int) -> int:
    """xm_bound_rate(): [min_rate, ceil], the ceiling winning over min_rate."""
    rate = max(rate, min_rate)
    return min(rate, ceil)


def psn_ge(a: int, b: int) -> bool:
    return ((a - b) & PSN_MASK) < 0x800000


def scale_rate(rate: int, factor: int) -> int:
    """rate x factor / UNIT for a factor in [0, UNIT]."""
    return (rate * factor) >> UNIT_SHIFT
