"""Telemetry Report v2.0 over UDP (docs/wire-format.md): declarations and the fast decoder.

The group header, the individual report header and the report's own metadata (RepMdBits) are
declared here once. `decode()` is the collector's decoder: group header, each INT report's own
metadata, the inner packet's flow key and its INT stack split into hops, with `struct` and
per-bitmap precomputed plans, which is what lets one core keep up with the reports of a fabric
(testbed/benchmarks/collector.py measures it against the scapy layers; tests check that they
agree on the golden vectors). Anything malformed raises `ReportError` whose `reason` is a
short counter label.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.wire.int_md import (
    HOP_METADATA,
    HOP_ML_MAX,
    INT_DSCP_DEFAULT,
    INT_TYPE_MD,
    INT_VERSION,
    MD_FLAG_E,
    MD_FLAG_M,
    MD_LEN,
    MD_WORDS,
    SHIM_LEN,
    Unit,
    bitmap_bit,
    decode_units,
    encode_units,
)
from controller.wire.layout import Fields, byte_size, field_width

TELEMETRY_REPORT_PORT = 32766  # UDP port of the collector, and the sink's source port
REPORT_VERSION = 2
REPORT_TYPE_INT = 1
IN_TYPE_IPV4 = 4
REPORT_LEN_TO_END = 0xFF  # "extends to the end of the UDP payload"

GROUP_FIELDS: Fields = (("ver", 4), ("hw_id", 6), ("seq", 22), ("node_id", 32))
INDIVIDUAL_FIELDS: Fields = (
    ("rep_type", 4),
    ("in_type", 4),
    ("report_len", 8),  # words after this header's first word
    ("md_len", 8),  # words of the reporting node's own metadata
    ("d", 1),
    ("q", 1),
    ("f", 1),
    ("i", 1),
    ("rsvd", 4),
    ("rep_md_bits", 16),
    ("domain_id", 16),
    ("ds_md_bits", 16),
    ("ds_md_status", 16),
)
GROUP_LEN = byte_size(GROUP_FIELDS)
INDIVIDUAL_LEN = byte_size(INDIVIDUAL_FIELDS)
SEQ_BITS = field_width(GROUP_FIELDS, "seq")
HW_ID_BITS = field_width(GROUP_FIELDS, "hw_id")
# D/Q/F/I flags in the individual report's fourth byte
FLAG_D = 0x80
FLAG_Q = 0x40
FLAG_F = 0x20
FLAG_I = 0x10

# RepMdBits: the hop encodings, except bit 0 (node id is in the group header) is reserved and
# bit 15 is queue id + drop reason + padding.
REPORT_METADATA: dict[int, Unit] = {
    **{b: f for b, f in HOP_METADATA.items() if b not in (0, 15)},
    0: (("reserved_bit0", 32),),
    15: (("drop_queue_id", 8), ("drop_reason", 8), ("drop_padding", 16)),
}


# Drop reasons a report's bit-15 unit carries (D flag set). The switch's own drop reasons are
# the P4 program's DROP_* (p4src/include/define.p4); these come from the traffic manager and
# from a NIC sink, which see drops the pipeline does not.
DROP_REASON_TM_QUEUE_FULL = 0x80  # the egress queue was full (tail drop)
DROP_REASON_TM_PORT_DOWN = 0x81  # the egress port is down
DROP_REASON_TM_CORRUPTED = 0x82  # received corrupted (FCS error) and dropped before ingress
DROP_REASON_PSN_GAP = 0x90  # a NIC sink: packets of this flow before this one did not arrive


def nic_node_id(ip: str) -> int:
    """The node id a NIC sink reports with: its IPv4 address as a 32-bit number (a NIC has no
    configured node id; switches' ids are small numbers, far from any address used)."""
    a, b, c, d = (int(x) for x in ip.split("."))
    return (a << 24) | (b << 16) | (c << 8) | d


def encode_report(
    *,
    hw_id: int,
    seq: int,
    node_id: int,
    inner: bytes,
    rep_md_bits: int = 0,
    metadata: Mapping[str, int | None] | None = None,
    dropped: bool = False,
    congested: bool = False,
    tracked: bool = False,
    domain_id: int = 0,
) -> bytes:
    """One Telemetry Report datagram (the UDP payload): group header, one individual INT report
    with the reporter's own metadata (per RepMdBits), then the inner packet from its IPv4
    header (whole words: a sink truncates it)."""
    if len(inner) % 4:
        raise ValueError(f"inner packet of {len(inner)} bytes is not whole words")
    md = encode_report_metadata(rep_md_bits, metadata or {}) if rep_md_bits else b""
    words = (INDIVIDUAL_LEN - 4 + len(md) + len(inner)) // 4
    flags = (FLAG_D if dropped else 0) | (FLAG_Q if congested else 0) | (FLAG_F if tracked else 0)
    group = _GROUP.pack(
        (REPORT_VERSION << 28)
        | ((hw_id & ((1 << HW_ID_BITS) - 1)) << SEQ_BITS)
        | (seq & ((1 << SEQ_BITS) - 1)),
        node_id,
    )
    indiv = _INDIV.pack(
        (REPORT_TYPE_INT << 4) | IN_TYPE_IPV4,
        words if words < REPORT_LEN_TO_END else REPORT_LEN_TO_END,
        len(md) // 4,
        flags,
        rep_md_bits,
        domain_id,
        0,
        0,
    )
    return group + indiv + md + inner


def report_size(inner_len: int, rep_md_bits: int = 0) -> int:
    """The bytes of the datagram `encode_report` makes of an inner packet of `inner_len`
    bytes with `rep_md_bits`' metadata (known before making it)."""
    md = report_md_plan(rep_md_bits)[1] if rep_md_bits else 0
    return GROUP_LEN + INDIVIDUAL_LEN + md + inner_len


def decode_report_metadata(rep_md_bits: int, metadata: bytes) -> dict[str, int | None]:
    """A Telemetry Report's own metadata words (per RepMdBits) as a dict."""
    return decode_units(metadata, rep_md_bits, REPORT_METADATA)


def encode_report_metadata(rep_md_bits: int, values: Mapping[str, int | None]) -> bytes:
    return encode_units(values, rep_md_bits, REPORT_METADATA)


# ---- the collector's decoder ------------------------------------------------------------------

_GROUP = struct.Struct("!II")
_INDIV = struct.Struct("!BBBBHHHH")
assert _GROUP.size == GROUP_LEN and _INDIV.size == INDIVIDUAL_LEN

# fields the collector keeps, by wire name
_KEEP = {
    "node_id": "node_id",
    "l1_ingress_port": "in_port",
    "l1_egress_port": "out_port",
    "hop_latency": "latency_ns",
    "queue_id": "queue_id",
    "queue_occupancy": "qocc",
    "egress_ts": "egress_ts",
    "tx_util": "tx_util_ppm",
    "drop_reason": "drop_reason",
}


class ReportError(ValueError):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(slots=True)
class Hop:
    """One node's INT metadata (None: not requested or not available)."""

    node_id: int | None = None
    in_port: int | None = None
    out_port: int | None = None
    latency_ns: int | None = None
    queue_id: int | None = None
    qocc: int | None = None  # bytes
    egress_ts: int | None = None
    tx_util_ppm: int | None = None
    drop_reason: int | None = None  # reports only (RepMdBits bit 15)


@dataclass(slots=True)
class InnerFlow:
    """The 5-tuple of a report's inner packet."""

    src: str
    dst: str
    proto: int
    sport: int
    dport: int

    def astuple(self) -> tuple[str, str, int, int, int]:
        return (self.src, self.dst, self.proto, self.sport, self.dport)


@dataclass(slots=True)
class IntReport:
    """One individual INT report of a Telemetry Report datagram."""

    hw_id: int
    seq: int
    node_id: int
    dropped: bool  # D
    congested: bool  # Q
    tracked: bool  # F
    sink: Hop  # the reporting node's own metadata (RepMdBits), node id from the group
    flow: InnerFlow | None = None  # None when the inner packet is not IPv4 UDP/TCP
    hops: list[Hop] = field(default_factory=list)  # newest (the sink's upstream) first
    e_bit: bool = False
    m_bit: bool = False
    inner_len: int = 0  # IPv4 total length of the inner packet


@dataclass(slots=True)
class Datagram:
    hw_id: int
    seq: int
    node_id: int
    reports: list[IntReport]


# A plan is a list of units: (offset, size, ((attr, shift, mask), ...)).
Plan = tuple[tuple[int, int, tuple[tuple[str, int, int], ...]], ...]


def _plan(bitmap: int, table: Mapping[int, Unit]) -> tuple[Plan, int]:
    units = []
    off = 0
    for bit in range(16):
        if not bitmap & bitmap_bit(bit) or bit not in table:
            continue
        fields = table[bit]
        size = sum(w for _, w in fields) // 8
        shift = size * 8
        keep = []
        for name, width in fields:
            shift -= width
            if name in _KEEP:
                keep.append((_KEEP[name], shift, (1 << width) - 1))
        units.append((off, size, tuple(keep)))
        off += size
    return tuple(units), off


@functools.lru_cache(maxsize=1024)
def hop_plan(bitmap: int) -> tuple[Plan, int]:
    return _plan(bitmap, HOP_METADATA)


@functools.lru_cache(maxsize=1024)
def report_md_plan(bitmap: int) -> tuple[Plan, int]:
    return _plan(bitmap, REPORT_METADATA)


def _apply(plan: Plan, buf: bytes, base: int, hop: Hop) -> None:
    for off, size, keep in plan:
        start = base + off
        v = int.from_bytes(buf[start : start + size], "big")
        if v == (1 << (size * 8)) - 1:
            continue  # all-ones: not available
        for attr, shift, mask in keep:
            setattr(hop, attr, (v >> shift) & mask)


def _ip(b: bytes, off: int) -> str:
    return f"{b[off]}.{b[off + 1]}.{b[off + 2]}.{b[off + 3]}"


def decode_inner(inner: bytes, int_dscp: int | None, rep: IntReport) -> None:
    """Flow key and INT stack of the inner packet (from its IPv4 header) into `rep`."""
    if len(inner) < 20 or inner[0] >> 4 != 4:
        raise ReportError("inner_not_ipv4")
    ihl = (inner[0] & 0x0F) * 4
    if ihl < 20 or len(inner) < ihl:
        raise ReportError("inner_truncated", "IPv4 header")
    rep.inner_len = (inner[2] << 8) | inner[3]
    proto = inner[9]
    l4 = ihl
    if proto == 17:
        l4_len = 8
    elif proto == 6:
        if len(inner) < l4 + 13:
            raise ReportError("inner_truncated", "TCP header")
        l4_len = (inner[l4 + 12] >> 4) * 4
    else:
        rep.flow = InnerFlow(_ip(inner, 12), _ip(inner, 16), proto, 0, 0)
        return
    if len(inner) < l4 + 4:
        raise ReportError("inner_truncated", "L4 ports")
    sport = (inner[l4] << 8) | inner[l4 + 1]
    dport = (inner[l4 + 2] << 8) | inner[l4 + 3]
    rep.flow = InnerFlow(_ip(inner, 12), _ip(inner, 16), proto, sport, dport)
    if int_dscp is None or inner[1] >> 2 != int_dscp:
        return  # no INT on the inner packet (the sink already stripped it, or none)
    shim = l4 + l4_len
    if len(inner) < shim + SHIM_LEN + MD_LEN:
        raise ReportError("int_truncated", "shim + MD header")
    if inner[shim] >> 4 != INT_TYPE_MD:
        raise ReportError("int_bad_type", f"shim type {inner[shim] >> 4}")
    words = inner[shim + 1]
    md = shim + SHIM_LEN
    ver = inner[md] >> 4
    if ver != INT_VERSION:
        raise ReportError("int_bad_version", f"version {ver}")
    flags = inner[md]
    rep.e_bit = bool(flags & MD_FLAG_E)
    rep.m_bit = bool(flags & MD_FLAG_M)
    hop_ml = inner[md + 2] & HOP_ML_MAX
    bitmap = (inner[md + 4] << 8) | inner[md + 5]
    stack_len = (words - MD_WORDS) * 4
    if stack_len < 0:
        raise ReportError("int_bad_length", f"shim length {words} words")
    stack = md + MD_LEN
    if len(inner) < stack + stack_len:
        raise ReportError("int_truncated", "metadata stack")
    if stack_len == 0:
        return
    hop_len = hop_ml * 4
    plan, base = hop_plan(bitmap)
    if hop_len == 0 or hop_len < base or stack_len % hop_len:
        raise ReportError("int_bad_hop_ml", f"HopML {hop_ml}, stack {stack_len} bytes")
    hops = rep.hops
    for off in range(stack, stack + stack_len, hop_len):
        h = Hop()
        _apply(plan, inner, off, h)
        hops.append(h)


def decode(data: bytes, int_dscp: int | None = INT_DSCP_DEFAULT) -> Datagram:
    """Decode one Telemetry Report datagram (the UDP payload)."""
    if len(data) < GROUP_LEN + INDIVIDUAL_LEN:
        raise ReportError("short", f"{len(data)} bytes")
    w0, node_id = _GROUP.unpack_from(data, 0)
    ver = w0 >> 28
    if ver != REPORT_VERSION:
        raise ReportError("bad_version", f"group header version {ver}")
    hw_id = (w0 >> SEQ_BITS) & ((1 << HW_ID_BITS) - 1)
    seq = w0 & ((1 << SEQ_BITS) - 1)
    reports: list[IntReport] = []
    pos = GROUP_LEN
    while pos < len(data):
        if len(data) - pos < INDIVIDUAL_LEN:
            raise ReportError("truncated", "individual report header")
        b0, rep_len, md_len, flags, md_bits, _dom, _dsb, _dss = _INDIV.unpack_from(data, pos)
        rep_type, in_type = b0 >> 4, b0 & 0x0F
        if rep_len == REPORT_LEN_TO_END:
            end = len(data)
        else:
            end = pos + 4 + rep_len * 4
            if rep_len < 2 or end > len(data):
                raise ReportError("bad_report_length", f"{rep_len} words")
        md_start = pos + INDIVIDUAL_LEN
        md_end = md_start + md_len * 4
        if md_end > end:
            raise ReportError("bad_md_length", f"{md_len} words")
        if rep_type != REPORT_TYPE_INT:
            pos = end  # drop / flow reports carry no INT stack: skip (not ours to decode)
            continue
        plan, need = report_md_plan(md_bits)
        if need > md_len * 4:
            raise ReportError("bad_md_length", f"RepMdBits {md_bits:#06x} need {need} bytes")
        sink = Hop(node_id=node_id)
        _apply(plan, data, md_start, sink)
        rep = IntReport(
            hw_id,
            seq,
            node_id,
            bool(flags & FLAG_D),
            bool(flags & FLAG_Q),
            bool(flags & FLAG_F),
            sink,
        )
        if in_type == IN_TYPE_IPV4:
            decode_inner(data[md_end:end], int_dscp, rep)
        reports.append(rep)
        pos = end
    if not reports:
        raise ReportError("no_int_report")
    return Datagram(hw_id, seq, node_id, reports)
