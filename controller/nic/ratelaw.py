"""Pure-Python reference of the NIC's rate laws, in the same fixed point as the eBPF code.

`ebpf/xdp_ingress.c` runs these laws per feedback packet; this module does the same integer
operations in the same order, so tests can feed both the same packets and compare the rates
packet by packet, and the scale-out work can simulate many NICs without kernels. Change one,
change the other.

Units: rates in bit/s (of the frame as the transport hands it to the NIC), times in ns,
utilisation, eta, alpha and g as fractions scaled by UNIT = 2**20.

Defaults scale with the emulated line rate:
- TiTa (HPCC-like): eta = 0.95, W_AI = line rate * (1 - eta) / 100 (HPCC's W_init(1-eta)/N for
  N = 100 flows), max stage 0, R_min = line rate / 1000.
- DCQCN: the paper's values for 40 Gb/s (R_AI 40 Mb/s, R_HAI 10 x R_AI, byte counter 10 MB,
  timers K = T = 55 us, g = 1/256, F = 5) and the 4 us minimum interval between two cuts of
  the common NIC model, under time dilation by s = line rate / 40 Gb/s: rates times s, time
  intervals divided by s, byte counts unchanged. Every dimensionless ratio of the paper (events
  per packet, increase per event over the line rate) stays the same, and the emulated RTTs,
  already long in absolute terms, are of the same dilated order.
- HPCC (Li et al., SIGCOMM 2019) as published: TiTa's per-hop measurement, but U updated on
  every ACK (Algorithm 1's MeasureInflight) and maxStage = 5 additive stages before a
  multiplicative one; eta 0.95, W_AI as TiTa's.
- TIMELY (Mittal et al., SIGCOMM 2015), one update per RTT sample: the paper's 10 Gb/s values
  (EWMA alpha 0.875, beta 0.8, delta 10 Mb/s, T_low 50 us, T_high 500 us, min RTT 20 us, HAI
  after 5 gradient <= 0 steps) dilated by s = line rate / 10 Gb/s.
- Swift (Kumar et al., SIGCOMM 2020): delay target = base + per-hop scaling x hops (hops from
  the ACK's TTL), AIMD on the rate: + ai / RTT per RTT below target (the window's ai = one
  packet), x max(1 - beta (d - t)/d, 1 - max_mdf) at most once per RTT above it; beta 0.8,
  max_mdf 0.5. The target's base is T (the model's base RTT), T/4 per hop: the paper's
  values are for Google's fabric and do not scale by rate alone.

TIMELY and Swift need RTT samples: tc egress stamps one data packet per RTT (a probe: its PSN
and send time, `tc_rtt_probe`), XDP takes the sample from the first ACK that covers it.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from controller.wire.int_md import (
    BIT_EGRESS_TS,
    BIT_L1_PORTS,
    BIT_NODE_ID,
    BIT_QUEUE,
    BIT_TX_UTIL,
    HEADERS_LEN,
    HOP_ML_MAX,
    INT_TYPE_MD,
    INT_VERSION,
    MD_WORDS,
    SHIM_LEN,
    hop_ml_words,
    shim_total_len,
)
from controller.wire.roce import (
    AETH_ACK_MAX,
    AETH_LEN,
    BTH_LEN,
    BTH_PSN_OFFSET,
    ICRC_LEN,
    OP_ACK,
    OP_CNP,
    PSN_MASK,
    ROCE_UDP_PORT,
)

UNIT_SHIFT = 20
UNIT = 1 << UNIT_SHIFT
U_MAX = 64 << UNIT_SHIFT
MAX_HOPS = 8
NSEC = 1_000_000_000
ALL_ONES32 = 0xFFFFFFFF
NO_TS = 0xFFFFFFFFFFFFFFFF
U64 = (1 << 64) - 1
DCQCN_MAX_EVENTS = 4
DCQCN_BACKLOG = 64
# Largest line rate / hop speed (bit/s) and base RTT (ns) the 64-bit fixed point supports:
# (B / 8) * T must stay below 2**64.
MAX_SPEED_BPS = 10**12
MAX_BASE_RTT_NS = 10**8

DCQCN_REFERENCE_RATE_BPS = 40 * 10**9
TIMELY_REFERENCE_RATE_BPS = 10 * 10**9
HPCC_MAX_STAGE = 5
SWIFT_MTU_BYTES = 4154  # the testbed's full frame: 4096 B of payload + 58 B of headers
SWIFT_MAX_AI_BYTES = 1 << 20
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


def hpcc_defaults(line_rate_bps: int, base_rtt_ns: int = 100_000) -> TitaParams:
    """HPCC's parameters (`struct xm_tita_params`): TiTa's, with the paper's maxStage = 5."""
    return replace(TitaParams.defaults(line_rate_bps, base_rtt_ns), max_stage=HPCC_MAX_STAGE)


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
    def defaults(cls, line_rate_bps: int, base_rtt_ns: int = 100_000,
                 mtu_bytes: int = SWIFT_MTU_BYTES) -> SwiftParams:
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
    def defaults(
        cls, law: Law, line_rate_bps: int, base_rtt_ns: int = 100_000
    ) -> CcParams:
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
        h, t, w = self.hpcc, self.timely, self.swift
        if not 0 < h.base_rtt_ns <= MAX_BASE_RTT_NS or not 0 < h.eta <= UNIT:
            raise ValueError("HPCC: base RTT outside (0, 1e8] ns or eta outside (0, 1]")
        if not 0 <= h.wai_bps <= line_rate_bps or h.max_stage >= 2**32:
            raise ValueError("HPCC: W_AI must be within [0, line rate], max stage 32 bits")
        if not (0 <= t.alpha <= UNIT and 0 <= t.beta <= UNIT and 0 <= w.beta <= UNIT
                and 0 <= w.max_mdf <= UNIT):
            raise ValueError("TIMELY/Swift: alpha, beta and max_mdf must be in [0, 1]")
        for name, v in (("t_low_ns", t.t_low_ns), ("t_high_ns", t.t_high_ns),
                        ("min_rtt_ns", t.min_rtt_ns), ("base_target_ns", w.base_target_ns),
                        ("per_hop_ns", w.per_hop_ns)):
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


# ---- state ----------------------------------------------------------------------------------

HAVE_RECORDS = 1
PSN_VALID = 2
CUT_SEEN = 4


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
    def initial(cls, law: Law, ceil_bps: int, tx_bytes: int, now_ns: int,
                probe_seq: int = 0) -> CcState:
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


# ---- INT echo -------------------------------------------------------------------------------


HOP_ABSENT = 32  # XM_HOP_ABSENT: a word index past any hop, all-ones in XDP's hop buffer
HOP_BUF_WORDS = 65  # XM_HOP_BUF_WORDS


def _field_off(bitmap: int, b: int) -> int:
    before = bitmap & ((0xFFFF << (16 - b)) & 0xFFFF)
    return hop_ml_words(before) if (bitmap >> (15 - b)) & 1 else HOP_ABSENT


@dataclass(frozen=True)
class IntHopValues:
    """One hop's fields as XDP reads them (all-ones where not requested or not provided)."""

    node_id: int
    port: int
    qlen: int  # bytes, 0 when absent
    egress_ts_ns: int  # NO_TS when absent
    tx_util_ppm: int  # ALL_ONES32 when absent


class EchoError(enum.Enum):
    """Why an ACK's echo is not used (the XM_CNT_XDP_* counter it feeds)."""

    NO_INT = "XDP_ACK_NO_INT"
    BAD_HEADER = "XDP_INT_BAD_HEADER"
    BAD_LENGTH = "XDP_INT_BAD_LENGTH"
    TOO_MANY_HOPS = "XDP_INT_TOO_MANY_HOPS"


def parse_echo(echo: bytes) -> list[IntHopValues] | EchoError:
    """The INT echo after an ACK's AETH (ICRC excluded), as xm_tita_on_ack() parses it."""
    if (
        len(echo) < HEADERS_LEN
        or echo[0] >> 4 != INT_TYPE_MD
        or shim_total_len(echo[1]) != len(echo)
    ):
        return EchoError.NO_INT
    md = echo[SHIM_LEN:HEADERS_LEN]
    if md[0] >> 4 != INT_VERSION:
        return EchoError.BAD_HEADER
    hop_ml = md[2] & HOP_ML_MAX
    bitmap = (md[4] << 8) | md[5]
    if hop_ml == 0 or hop_ml_words(bitmap) != hop_ml:
        return EchoError.BAD_HEADER
    stack_words = echo[1] - MD_WORDS
    if stack_words % hop_ml:
        return EchoError.BAD_LENGTH
    nh = stack_words // hop_ml
    if nh == 0:
        return EchoError.NO_INT
    if nh > MAX_HOPS:
        return EchoError.TOO_MANY_HOPS
    offs = {
        b: _field_off(bitmap, b)
        for b in (BIT_NODE_ID, BIT_L1_PORTS, BIT_QUEUE, BIT_EGRESS_TS, BIT_TX_UTIL)
    }
    hops = []
    for i in range(nh):
        base = HEADERS_LEN + i * hop_ml * 4
        words = list(struct.unpack(f"!{hop_ml}I", echo[base : base + hop_ml * 4]))
        words += [ALL_ONES32] * (HOP_BUF_WORDS - len(words))

        def word(idx: int, words: list[int] = words) -> int:
            return words[idx & 63]

        q = word(offs[BIT_QUEUE])
        ts = offs[BIT_EGRESS_TS]
        hops.append(
            IntHopValues(
                node_id=word(offs[BIT_NODE_ID]),
                port=word(offs[BIT_L1_PORTS]) & 0xFFFF,
                qlen=0 if q == ALL_ONES32 else q & 0xFFFFFF,
                egress_ts_ns=(word(ts) << 32) | word(ts + 1),
                tx_util_ppm=word(offs[BIT_TX_UTIL]),
            )
        )
    return hops


# ---- TiTa -----------------------------------------------------------------------------------

HopSpeed = Callable[[int, int], int]  # (node id, port) -> bit/s, 0 for unknown


@dataclass(frozen=True)
class TitaOutcome:
    counter: str  # XM_CNT_* name (without the prefix) the step counted
    ref_updated: bool = False


def psn_ge(a: int, b: int) -> bool:
    return ((a - b) & PSN_MASK) < 0x800000


def tita_on_ack(
    cc: CcState,
    prm: CcParams,
    hops: list[IntHopValues],
    *,
    ack_psn: int,
    snd_nxt_psn: int | None,
    tx_bytes: int,
    now_ns: int,
    ceil_bps: int,
    weight: int,
    line_rate_bps: int,
    hop_speed: HopSpeed | None = None,
    hpcc: bool = False,
) -> TitaOutcome:
    """xm_tita_on_ack() after the echo parsed into `hops`.

    With `hpcc`, HPCC as published: its parameters (prm.hpcc) and U committed on every ACK
    (MeasureInflight), R_ref and the stage once per RTT; TiTa commits U with R_ref only."""
    tp = prm.hpcc if hpcc else prm.tita
    nh = len(hops)
    T = tp.base_rtt_ns or 1
    local_dt = now_ns - cc.last_fb_ns if now_ns > cc.last_fb_ns else 0
    sent = min((tx_bytes - cc.prev_tx_bytes) & U64, 1 << 30)
    comparable = bool(cc.flags & HAVE_RECORDS) and cc.nhops == nh
    u_max = tau = 0
    for i, h in enumerate(hops):
        prev = cc.hops[i]
        if prev.node_id != h.node_id:
            comparable = False
        B = (hop_speed(h.node_id, h.port) if hop_speed else 0) or line_rate_bps
        dt = local_dt
        ts, pts = h.egress_ts_ns, prev.egress_ts_ns
        if ts != NO_TS and pts != NO_TS and ts > pts:
            dt = h.egress_ts_ns - prev.egress_ts_ns
        qmin = min(h.qlen, prev.qlen)
        bdp = (B // 8) * T // NSEC or 1
        u = (qmin << UNIT_SHIFT) // bdp
        if h.tx_util_ppm != ALL_ONES32:
            u += (h.tx_util_ppm << UNIT_SHIFT) // 1_000_000
        elif qmin > 0:
            u += UNIT
        elif dt > 0:
            own = min(sent * 8 * NSEC // dt, B)
            u += (own << UNIT_SHIFT) // B
        u = min(u, U_MAX)
        if i == 0 or u > u_max:
            u_max, tau = u, dt
        cc.hops[i] = HopRecord(h.node_id, h.qlen, h.egress_ts_ns, h.tx_util_ppm)
    cc.prev_tx_bytes = tx_bytes
    snd_nxt = snd_nxt_psn if snd_nxt_psn is not None else ack_psn

    if not comparable:
        counter = "XDP_TITA_PATH_CHANGE" if cc.flags & HAVE_RECORDS else "XDP_TITA_FIRST_RECORD"
        cc.flags |= HAVE_RECORDS | PSN_VALID
        cc.nhops = nh
        cc.last_update_psn = snd_nxt
        return TitaOutcome(counter)

    tau = min(tau, T)
    U = ((T - tau) * cc.util + tau * u_max) // T
    if hpcc:
        cc.util = U
    eta = tp.eta
    wai = tp.wai_bps * weight
    if U >= eta or cc.inc_stage >= tp.max_stage:
        R = cc.ref_rate_bps * eta // (U or 1) + wai
        stage = 0
    else:
        R = cc.ref_rate_bps + wai
        stage = cc.inc_stage + 1
    R = bound_rate(R, prm.min_rate_bps, ceil_bps)
    cc.rate_bps = R
    cc.updates += 1
    updated = psn_ge(ack_psn, cc.last_update_psn)
    if updated:
        cc.util = U
        cc.ref_rate_bps = R
        cc.inc_stage = stage
        cc.last_update_psn = snd_nxt
    return TitaOutcome("XDP_TITA_UPDATE", ref_updated=updated)


# ---- DCQCN ----------------------------------------------------------------------------------


def fx_pow(base: int, n: int) -> int:
    """xm_fx_pow(): (base/UNIT)**n, truncating after every product, n < 2**16."""
    r = UNIT
    for i in range(16):
        if (n >> i) & 1:
            r = (r * base) >> UNIT_SHIFT
        base = (base * base) >> UNIT_SHIFT
    return r


def _dcqcn_increase(cc: CcState, prm: CcParams, ceil_bps: int, weight: int) -> None:
    F = prm.dcqcn.fast_recovery_steps
    mx = max(cc.timer_count, cc.byte_count)
    mn = min(cc.timer_count, cc.byte_count)
    target = cc.ref_rate_bps
    if mn > F:
        target += (mn - F) * prm.dcqcn.rhai_bps * weight
    elif mx > F:
        target += prm.dcqcn.rai_bps * weight
    target = min(target, ceil_bps)
    cc.ref_rate_bps = target
    cc.rate_bps = (cc.rate_bps + target) // 2


def dcqcn_on_feedback(
    cc: CcState,
    prm: CcParams,
    *,
    is_cnp: bool,
    tx_bytes: int,
    now_ns: int,
    ceil_bps: int,
    weight: int,
) -> list[str]:
    """xm_dcqcn_on_feedback(); returns the counters (XM_CNT_* names) it bumped."""
    d = prm.dcqcn
    counters: list[str] = []
    if d.alpha_timer_ns and now_ns > cc.alpha_ts_ns:
        n = (now_ns - cc.alpha_ts_ns) // d.alpha_timer_ns
        if n > 0xFFFF:
            n = 0xFFFF
            cc.alpha_ts_ns = now_ns
        else:
            cc.alpha_ts_ns += n * d.alpha_timer_ns
        if n:
            cc.alpha = (cc.alpha * fx_pow(UNIT - d.g, n)) >> UNIT_SHIFT

    if cc.flags & CUT_SEEN:
        nt = nb = 0
        if d.rate_timer_ns and now_ns > cc.timer_ts_ns:
            nt = (now_ns - cc.timer_ts_ns) // d.rate_timer_ns
            if nt > DCQCN_BACKLOG:
                cc.timer_ts_ns = now_ns - DCQCN_BACKLOG * d.rate_timer_ns
                nt = DCQCN_BACKLOG
            nt = min(nt, DCQCN_MAX_EVENTS)
            cc.timer_ts_ns += nt * d.rate_timer_ns
        if d.byte_counter and tx_bytes > cc.bc_base_bytes:
            nb = (tx_bytes - cc.bc_base_bytes) // d.byte_counter
            if nb > DCQCN_BACKLOG:
                cc.bc_base_bytes = tx_bytes - DCQCN_BACKLOG * d.byte_counter
                nb = DCQCN_BACKLOG
            nb = min(nb, DCQCN_MAX_EVENTS)
            cc.bc_base_bytes += nb * d.byte_counter
        for e in range(nt + nb):
            if e < nt:
                cc.timer_count += 1
            else:
                cc.byte_count += 1
            _dcqcn_increase(cc, prm, ceil_bps, weight)
        if nt + nb:
            counters.append("XDP_DCQCN_INCREASE")

    if is_cnp:
        if cc.flags & CUT_SEEN and ((now_ns - cc.last_cut_ns) & U64) < d.cut_interval_ns:
            counters.append("XDP_DCQCN_CUT_HELD")
        else:
            cc.ref_rate_bps = cc.rate_bps
            cc.rate_bps = (cc.rate_bps * (UNIT - cc.alpha // 2)) >> UNIT_SHIFT
            cc.alpha = min((((UNIT - d.g) * cc.alpha) >> UNIT_SHIFT) + d.g, UNIT)
            cc.timer_count = cc.byte_count = 0
            cc.timer_ts_ns = cc.alpha_ts_ns = now_ns
            cc.bc_base_bytes = tx_bytes
            cc.last_cut_ns = now_ns
            cc.flags |= CUT_SEEN
            counters.append("XDP_DCQCN_CUT")
    cc.rate_bps = bound_rate(cc.rate_bps, prm.min_rate_bps, ceil_bps)
    cc.ref_rate_bps = bound_rate(cc.ref_rate_bps, prm.min_rate_bps, ceil_bps)
    cc.updates += 1
    return counters


# ---- RTT samples (TIMELY, Swift) ------------------------------------------------------------


@dataclass
class RttProbe:
    """tc's RTT probe of a flow (xm_flow_stats): one data packet per RTT, its PSN and send
    time; `seq` counts probes, so XDP knows which one it has taken (cc.rtt_done_seq)."""

    seq: int = 0
    psn: int = 0
    sent_ns: int = 0


RTT_LAWS = (Law.TIMELY, Law.SWIFT)  # the laws tc probes RTTs for


def tc_rtt_probe(probe: RttProbe, cc: CcState | None, psn: int, now_ns: int) -> None:
    """What tc egress does for every data packet of a flow under an RTT law: start a new
    probe when the last one was taken (or the flow has no CC state), or when this packet
    resends the probe's PSN or an earlier one (go-back-N: the probe's ACK would time the
    recovery too). The probe's ACK must not wait for the next packet (a coalescing receiver
    adds that wait to the RTT): the suite runs these laws with an ACK per packet."""
    if cc is None or cc.rtt_done_seq == probe.seq or psn_ge(probe.psn, psn):
        probe.seq = (probe.seq + 1) & ALL_ONES32
        probe.psn = psn
        probe.sent_ns = now_ns


def take_rtt_sample(cc: CcState, probe: RttProbe | None, ack_psn: int, now_ns: int) -> int | None:
    """xm_rtt_sample(): the RTT of tc's pending probe when this ACK covers it, else None."""
    if probe is None or probe.seq == cc.rtt_done_seq or not psn_ge(ack_psn, probe.psn):
        return None
    cc.rtt_done_seq = probe.seq
    rtt = now_ns - probe.sent_ns if now_ns > probe.sent_ns else 0
    return min(rtt, RTT_MAX_NS)


def _scale(rate: int, factor: int) -> int:
    """rate x factor / UNIT for a factor in [0, UNIT]."""
    return (rate * factor) >> UNIT_SHIFT


def timely_on_rtt(cc: CcState, prm: CcParams, rtt: int, ceil_bps: int, weight: int) -> str:
    """xm_timely_on_rtt(): TIMELY's Algorithm 1 on one RTT sample; returns the counter."""
    t = prm.timely
    if cc.rtt_ns == 0:
        cc.rtt_ns = rtt
        return "XDP_TIMELY_FIRST_RTT"
    new_diff = rtt - cc.rtt_ns
    cc.rtt_ns = rtt
    cc.rtt_diff_ns = ((UNIT - t.alpha) * cc.rtt_diff_ns + t.alpha * new_diff) >> UNIT_SHIFT
    delta = t.delta_bps * weight
    if rtt < t.t_low_ns:
        rate = cc.rate_bps + delta
        counter = "XDP_TIMELY_INCREASE"
    elif rtt > t.t_high_ns:
        dec = (t.beta * (UNIT - (t.t_high_ns << UNIT_SHIFT) // rtt)) >> UNIT_SHIFT
        rate = _scale(cc.rate_bps, UNIT - dec)
        cc.inc_stage = 0
        counter = "XDP_TIMELY_DECREASE"
    elif cc.rtt_diff_ns <= 0:
        cc.inc_stage += 1
        n = t.hai_steps if cc.inc_stage >= t.hai_steps else 1
        rate = cc.rate_bps + n * delta
        counter = "XDP_TIMELY_INCREASE"
    else:
        g = min((cc.rtt_diff_ns << UNIT_SHIFT) // (t.min_rtt_ns or 1), 2 * UNIT)
        dec = (t.beta * g) >> UNIT_SHIFT
        rate = _scale(cc.rate_bps, UNIT - dec) if dec < UNIT else 0
        cc.inc_stage = 0
        counter = "XDP_TIMELY_DECREASE"
    cc.rate_bps = bound_rate(rate, prm.min_rate_bps, ceil_bps)
    cc.ref_rate_bps = cc.rate_bps
    cc.updates += 1
    return counter


def swift_on_rtt(cc: CcState, prm: CcParams, rtt: int, ttl: int, now_ns: int, ceil_bps: int,
                 weight: int) -> str:
    """xm_swift_on_rtt(): Swift's AIMD on one RTT sample against its scaled target."""
    w = prm.swift
    hops = min(w.sender_ttl - ttl if w.sender_ttl > ttl else 0, MAX_HOPS)
    target = w.base_target_ns + hops * w.per_hop_ns
    cc.rtt_ns = rtt
    if rtt < target:
        # the window grows by ai per RTT: as a rate, ai over this RTT
        rate = cc.rate_bps + (w.ai_bytes * 8 * NSEC // (rtt or 1)) * weight
        counter = "XDP_SWIFT_INCREASE"
    elif cc.flags & CUT_SEEN and ((now_ns - cc.last_cut_ns) & U64) < rtt:
        return "XDP_SWIFT_DECREASE_HELD"  # at most one decrease per RTT
    else:
        dec = min((w.beta * (((rtt - target) << UNIT_SHIFT) // (rtt or 1))) >> UNIT_SHIFT,
                  w.max_mdf)
        rate = _scale(cc.rate_bps, UNIT - dec)
        cc.last_cut_ns = now_ns
        cc.flags |= CUT_SEEN
        counter = "XDP_SWIFT_DECREASE"
    cc.rate_bps = bound_rate(rate, prm.min_rate_bps, ceil_bps)
    cc.ref_rate_bps = cc.rate_bps
    cc.updates += 1
    return counter


# ---- whole feedback packets, as XDP sees them -------------------------------------------------


@dataclass(frozen=True)
class Feedback:
    """A parsed ACK or CNP (xm_parse_feedback()): the key is the data flow's."""

    key: tuple[int, int, int, int, int]  # saddr, daddr (network-order ints), sport, dport, proto
    psn: int
    is_cnp: bool
    echo: bytes
    ttl: int = 64


def parse_feedback(frame: bytes) -> Feedback | None:
    """Ethernet/IPv4/UDP 4791/BTH ACK (ACK syndrome) or CNP; None for anything else."""
    if len(frame) < 14 + 20 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    if ip[0] >> 4 != 4 or ip[0] & 0xF < 5:
        return None
    ihl = (ip[0] & 0xF) * 4
    tot_len = int.from_bytes(ip[2:4], "big")
    if tot_len < ihl or 14 + tot_len > len(frame) or len(ip) < ihl:
        return None
    if ip[9] != 17 or int.from_bytes(ip[6:8], "big") & 0x3FFF:
        return None
    udp = ip[ihl:]
    if len(udp) < 8 or int.from_bytes(udp[2:4], "big") != ROCE_UDP_PORT:
        return None
    udp_len = int.from_bytes(udp[4:6], "big")
    if udp_len < 8 + BTH_LEN or udp_len > tot_len - ihl or len(udp) < 8 + BTH_LEN:
        return None
    bth = udp[8 : 8 + BTH_LEN]
    opcode = bth[0]
    psn = int.from_bytes(bth[BTH_PSN_OFFSET:BTH_LEN], "big")
    saddr = int.from_bytes(ip[12:16], "big")
    daddr = int.from_bytes(ip[16:20], "big")
    sport = int.from_bytes(udp[0:2], "big")
    key = (daddr, saddr, sport, ROCE_UDP_PORT, 17)
    aeth = 8 + BTH_LEN
    if opcode == OP_ACK:
        if udp_len < aeth + AETH_LEN + ICRC_LEN or len(udp) < aeth + AETH_LEN:
            return None
        if udp[aeth] > AETH_ACK_MAX:
            return None
        echo = bytes(udp[aeth + AETH_LEN : udp_len - ICRC_LEN])
        return Feedback(key, psn, False, echo, ip[8])
    if opcode == OP_CNP:
        return Feedback(key, psn, True, b"", ip[8])
    return None


@dataclass
class ReferenceNic:
    """The XDP program's per-flow behaviour for one host, driven packet by packet.

    The caller provides what XDP reads from other maps: the flow's tx bytes and next PSN
    (tc's xm_flows), its control entry (cap, weight, per-flow params) and the packet's
    arrival time (XDP's bpf_ktime_get_ns()).
    """

    line_rate_bps: int
    params: CcParams
    hop_speed: HopSpeed | None = None
    flows: dict[tuple[int, int, int, int, int], CcState] = field(default_factory=dict)

    def on_frame(
        self,
        frame: bytes,
        *,
        now_ns: int,
        tx_bytes: int,
        snd_nxt_psn: int | None,
        cap_bps: int | None = None,
        weight: int = 1,
        params: CcParams | None = None,
        rtt_probe: RttProbe | None = None,
    ) -> int | None:
        """Process one received frame; returns the flow's rate after it (None: not feedback).
        `rtt_probe` is tc's probe of the flow (TIMELY and Swift take their samples from it)."""
        fb = parse_feedback(frame)
        if fb is None:
            return None
        prm = params or self.params
        if prm.law == Law.NONE or (prm.law != Law.DCQCN and fb.is_cnp):
            return self.flows[fb.key].rate_bps if fb.key in self.flows else None
        ceil = self.line_rate_bps if cap_bps is None else min(self.line_rate_bps, cap_bps)
        weight = weight or 1
        cc = self.flows.get(fb.key)
        if cc is None or cc.law != prm.law:
            cc = CcState.initial(prm.law, ceil, tx_bytes, now_ns,
                                 rtt_probe.seq if rtt_probe else 0)
            self.flows[fb.key] = cc
        if prm.law in (Law.TITA, Law.HPCC):
            if fb.echo:
                hops = parse_echo(fb.echo)
                if not isinstance(hops, EchoError):
                    tita_on_ack(
                        cc,
                        prm,
                        hops,
                        ack_psn=fb.psn,
                        snd_nxt_psn=snd_nxt_psn,
                        tx_bytes=tx_bytes,
                        now_ns=now_ns,
                        ceil_bps=ceil,
                        weight=weight,
                        line_rate_bps=self.line_rate_bps,
                        hop_speed=self.hop_speed,
                        hpcc=prm.law == Law.HPCC,
                    )
        elif prm.law == Law.DCQCN:
            dcqcn_on_feedback(
                cc, prm, is_cnp=fb.is_cnp, tx_bytes=tx_bytes, now_ns=now_ns, ceil_bps=ceil,
                weight=weight,
            )
        else:
            rtt = take_rtt_sample(cc, rtt_probe, fb.psn, now_ns)
            if rtt is not None:
                if prm.law == Law.TIMELY:
                    timely_on_rtt(cc, prm, rtt, ceil, weight)
                else:
                    swift_on_rtt(cc, prm, rtt, fb.ttl, now_ns, ceil, weight)
        cc.last_fb_ns = now_ns
        cc.feedback += 1
        return cc.rate_bps


def with_law(params: CcParams, law: Law) -> CcParams:
    return replace(params, law=law)
