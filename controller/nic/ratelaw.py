"""Pure-Python reference of the NIC's two rate laws, in the same fixed point as the eBPF code.

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


class Law(enum.IntEnum):
    """Values of `enum xm_law` in ebpf/xingmai.h."""

    NONE = 0
    TITA = 1
    DCQCN = 2


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


@dataclass(frozen=True)
class CcParams:
    """`struct xm_cc_params`: the law and both laws' parameters."""

    law: Law
    min_rate_bps: int
    tita: TitaParams
    dcqcn: DcqcnParams

    @classmethod
    def defaults(
        cls, law: Law, line_rate_bps: int, base_rtt_ns: int = 100_000
    ) -> CcParams:
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
    hops: list[HopRecord] = field(default_factory=lambda: [HopRecord() for _ in range(MAX_HOPS)])

    @classmethod
    def initial(cls, law: Law, ceil_bps: int, tx_bytes: int, now_ns: int) -> CcState:
        """xm_cc_init()."""
        return cls(
            law=law,
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
) -> TitaOutcome:
    """xm_tita_on_ack() after the echo parsed into `hops`."""
    nh = len(hops)
    T = prm.tita.base_rtt_ns or 1
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
    eta = prm.tita.eta
    wai = prm.tita.wai_bps * weight
    if U >= eta or cc.inc_stage >= prm.tita.max_stage:
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


# ---- whole feedback packets, as XDP sees them -------------------------------------------------


@dataclass(frozen=True)
class Feedback:
    """A parsed ACK or CNP (xm_parse_feedback()): the key is the data flow's."""

    key: tuple[int, int, int, int, int]  # saddr, daddr (network-order ints), sport, dport, proto
    psn: int
    is_cnp: bool
    echo: bytes


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
        return Feedback(key, psn, False, echo)
    if opcode == OP_CNP:
        return Feedback(key, psn, True, b"")
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
    ) -> int | None:
        """Process one received frame; returns the flow's rate after it (None: not feedback)."""
        fb = parse_feedback(frame)
        if fb is None:
            return None
        prm = params or self.params
        if prm.law not in (Law.TITA, Law.DCQCN) or (prm.law == Law.TITA and fb.is_cnp):
            return self.flows[fb.key].rate_bps if fb.key in self.flows else None
        ceil = self.line_rate_bps if cap_bps is None else min(self.line_rate_bps, cap_bps)
        cc = self.flows.get(fb.key)
        if cc is None or cc.law != prm.law:
            cc = CcState.initial(prm.law, ceil, tx_bytes, now_ns)
            self.flows[fb.key] = cc
        if prm.law == Law.TITA:
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
                        weight=weight or 1,
                        line_rate_bps=self.line_rate_bps,
                        hop_speed=self.hop_speed,
                    )
        else:
            dcqcn_on_feedback(
                cc, prm, is_cnp=fb.is_cnp, tx_bytes=tx_bytes, now_ns=now_ns, ceil_bps=ceil,
                weight=weight or 1,
            )
        cc.last_fb_ns = now_ns
        cc.feedback += 1
        return cc.rate_bps


def with_law(params: CcParams, law: Law) -> CcParams:
    return replace(params, law=law)
