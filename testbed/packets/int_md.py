"""INT-MD v2.1 over UDP and Telemetry Report v2.0 (docs/wire-format.md, shared/vectors).

Layers: `IntShim` (4 B) / `IntMD` (12 B header + metadata stack of `IntHop`s, newest first) /
the original UDP payload (here the BTH). A hop record's fields depend on the instruction
bitmap, so the hop layers are classes made per (bitmap, Hop ML) by `int_hop_class()`; the dict
functions `decode_stack()` / `encode_stack()` do the same with plain bytes for collectors and
tests. In dicts a value the node could not provide (all-ones on the wire) is `None`.

INT presence is signalled by the IPv4 DSCP (0x17 by default), not by a UDP port, so it cannot be
a static scapy binding: `decode(frame, int_dscp=...)` dissects a frame with a given INT DSCP
(None = no INT), and plain `Ether(frame)` uses the default DSCP `INT_DSCP_DEFAULT`.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from scapy.fields import (
    BitField,
    ByteField,
    Field,
    PacketListField,
    ShortField,
    StrFixedLenField,
    StrLenField,
    XBitField,
    XShortField,
)
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw, bind_layers

from testbed.packets.roce import AETH, BTH, ROCE_UDP_PORT

INT_DSCP_DEFAULT = 0x17
INT_TYPE_MD = 1
INT_VERSION = 2
SHIM_LEN = 4
MD_LEN = 12
TELEMETRY_REPORT_PORT = 32766
REPORT_GROUP_LEN = 8
REPORT_FIXED_LEN = 12  # individual report header: first word + RepMdBits..DSMdStatus
REPORT_TYPE_INT = 1
IN_TYPE_IPV4 = 4
REPORT_LEN_TO_END = 0xFF  # "extends to the end of the UDP payload"

# Per-hop metadata in instruction-bitmap order (bit 0 = MSB): (field name, width in bits).
# One instruction bit is one metadata unit of 4 or 8 bytes; all-ones over the unit = unavailable.
HOP_METADATA: dict[int, tuple[tuple[str, int], ...]] = {
    0: (("node_id", 32),),
    1: (("l1_ingress_port", 16), ("l1_egress_port", 16)),
    2: (("hop_latency", 32),),
    3: (("queue_id", 8), ("queue_occupancy", 24)),
    4: (("ingress_ts", 64),),
    5: (("egress_ts", 64),),
    6: (("l2_ingress_port", 32), ("l2_egress_port", 32)),
    7: (("tx_util", 32),),
    8: (("buffer_id", 8), ("buffer_occupancy", 24)),
    **{b: ((f"reserved_bit{b}", 32),) for b in range(9, 15)},
    15: (("checksum_complement", 32),),
}
# Telemetry Report RepMdBits: the same encodings, except bit 0 (node id is in the group header)
# is reserved and bit 15 is queue id + drop reason + padding.
REPORT_METADATA: dict[int, tuple[tuple[str, int], ...]] = {
    **{b: f for b, f in HOP_METADATA.items() if b not in (0, 15)},
    0: (("reserved_bit0", 32),),
    15: (("drop_queue_id", 8), ("drop_reason", 8), ("drop_padding", 16)),
}

_int_dscp: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "xingmai_int_dscp", default=INT_DSCP_DEFAULT
)


def current_int_dscp() -> int | None:
    """The DSCP that marks INT packets for the dissection under way (None: no INT)."""
    return _int_dscp.get()


@contextmanager
def int_dscp_in_force(int_dscp: int | None) -> Iterator[None]:
    """Dissect with this INT DSCP inside the block (None: never parse INT)."""
    token = _int_dscp.set(int_dscp)
    try:
        yield
    finally:
        _int_dscp.reset(token)


def decode(
    frame: bytes, int_dscp: int | None = INT_DSCP_DEFAULT, first: type[Packet] = Ether
) -> Packet:
    """Dissect `frame` (from layer `first`), parsing INT on UDP 4791 iff DSCP == `int_dscp`."""
    with int_dscp_in_force(int_dscp):
        return first(frame)


# ---- metadata units -------------------------------------------------------------------------


def _bits(bitmap: int, table: Mapping[int, tuple[tuple[str, int], ...]]) -> list[int]:
    """Set bits in bitmap order; a metadata unit the spec puts last (bit 15) stays last."""
    return [b for b in range(16) if bitmap & (0x8000 >> b) and b in table]


def metadata_len(
    bitmap: int, table: Mapping[int, tuple[tuple[str, int], ...]] = HOP_METADATA
) -> int:
    """Bytes of metadata one node adds for this bitmap (baseline only)."""
    return sum(w for b in _bits(bitmap, table) for _, w in table[b]) // 8


def hop_ml_words(bitmap: int) -> int:
    """Hop ML (in 4-byte words) for an instruction bitmap without domain-specific metadata."""
    return metadata_len(bitmap) // 4


def _decode_units(
    data: bytes, bitmap: int, table: Mapping[int, tuple[tuple[str, int], ...]]
) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    pos = 0
    for bit in _bits(bitmap, table):
        fields = table[bit]
        size = sum(w for _, w in fields) // 8
        unit = data[pos : pos + size]
        if len(unit) < size:
            raise ValueError(f"metadata for bitmap bit {bit} truncated")
        pos += size
        if unit == b"\xff" * size:
            out.update({name: None for name, _ in fields})
            continue
        value = int.from_bytes(unit, "big")
        shift = size * 8
        for name, width in fields:
            shift -= width
            out[name] = (value >> shift) & ((1 << width) - 1)
    return out


def _encode_units(
    values: Mapping[str, int | None], bitmap: int, table: Mapping[int, tuple[tuple[str, int], ...]]
) -> bytes:
    out = bytearray()
    for bit in _bits(bitmap, table):
        fields = table[bit]
        size = sum(w for _, w in fields) // 8
        missing = [name for name, _ in fields if name not in values]
        if missing:
            raise ValueError(f"metadata field(s) {missing} missing for bitmap bit {bit}")
        if all(values[name] is None for name, _ in fields):
            out += b"\xff" * size
            continue
        word = 0
        for name, width in fields:
            v = values[name]
            if v is None or not 0 <= v < (1 << width):
                raise ValueError(f"{name}={v!r} does not fit {width} bits")
            word = (word << width) | v
        out += word.to_bytes(size, "big")
    return bytes(out)


def decode_stack(stack: bytes, bitmap: int, hop_ml: int | None = None) -> list[dict[str, Any]]:
    """Split a metadata stack into hop dicts (newest first) for an instruction bitmap.

    Each hop is `hop_ml` words; bytes beyond the bitmap's baseline metadata (domain-specific
    metadata) are kept under "ds_metadata". Raises ValueError on a stack that does not divide
    into whole hops.
    """
    hop_len = 4 * (hop_ml if hop_ml is not None else hop_ml_words(bitmap))
    base = metadata_len(bitmap)
    if hop_len < base or hop_len == 0:
        if not stack:
            return []
        raise ValueError(f"Hop ML of {hop_len} bytes cannot hold {base} bytes of metadata")
    if len(stack) % hop_len:
        raise ValueError(
            f"stack of {len(stack)} bytes is not a whole number of {hop_len}-byte hops"
        )
    hops = []
    for off in range(0, len(stack), hop_len):
        hop: dict[str, Any] = dict(_decode_units(stack[off : off + base], bitmap, HOP_METADATA))
        if hop_len > base:
            hop["ds_metadata"] = stack[off + base : off + hop_len]
        hops.append(hop)
    return hops


def encode_stack(
    hops: Iterable[Mapping[str, Any]], bitmap: int, hop_ml: int | None = None
) -> bytes:
    """Inverse of `decode_stack`: hop dicts (newest first) to stack bytes."""
    hop_len = 4 * (hop_ml if hop_ml is not None else hop_ml_words(bitmap))
    base = metadata_len(bitmap)
    out = bytearray()
    for hop in hops:
        rec = _encode_units(hop, bitmap, HOP_METADATA)
        ds = bytes(hop.get("ds_metadata", b"\xff" * (hop_len - base)))
        if len(rec) + len(ds) != hop_len:
            raise ValueError(f"hop of {len(rec) + len(ds)} bytes, Hop ML says {hop_len}")
        out += rec + ds
    return bytes(out)


def decode_report_metadata(rep_md_bits: int, metadata: bytes) -> dict[str, int | None]:
    """A Telemetry Report's own metadata words (per RepMdBits) as a dict."""
    return _decode_units(metadata, rep_md_bits, REPORT_METADATA)


def encode_report_metadata(rep_md_bits: int, values: Mapping[str, int | None]) -> bytes:
    return _encode_units(values, rep_md_bits, REPORT_METADATA)


# ---- scapy layers -----------------------------------------------------------------------


class IntShim(Packet):
    """INT shim for TCP/UDP (4 B). `length` (MD header + stack, in words) is computed if None."""

    name = "INT shim"
    fields_desc = [
        BitField("type", INT_TYPE_MD, 4),
        BitField("npt", 0, 2),
        BitField("rsvd", 0, 2),
        ByteField("length", None),
        ByteField("rsvd2", 0),
        BitField("dscp", 0, 6),  # original DSCP, restored by the sink
        BitField("rsvd3", 0, 2),
    ]

    def post_build(self, p: bytes, pay: bytes) -> bytes:
        if self.length is None:
            md_bytes = len(self.payload.self_build()) if isinstance(self.payload, IntMD) else 0
            p = p[:1] + bytes([md_bytes // 4]) + p[2:]
        return p + pay

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return IntMD if self.type == INT_TYPE_MD else Raw


def _stack_len(md: Packet) -> int:
    shim = md.underlayer
    if isinstance(shim, IntShim) and shim.length is not None:
        return max(0, shim.length * 4 - MD_LEN)
    return 0


class _IntHopBase(Packet):
    bitmap = 0
    hop_len = 0

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s

    def to_dict(self) -> dict[str, Any]:
        return decode_stack(bytes(self), self.bitmap, self.hop_len // 4)[0]


@functools.lru_cache(maxsize=256)
def int_hop_class(bitmap: int, hop_ml: int | None = None) -> type[Packet]:
    """The scapy layer of one hop record for this bitmap (and Hop ML, if it adds DS metadata)."""
    hop_len = 4 * (hop_ml if hop_ml is not None else hop_ml_words(bitmap))
    fields: list[Field[Any, Any]] = []
    for bit in _bits(bitmap, HOP_METADATA):
        for name, width in HOP_METADATA[bit]:
            fields.append(BitField(name, 0, width))
    ds = hop_len - metadata_len(bitmap)
    if ds > 0:
        fields.append(StrFixedLenField("ds_metadata", b"\xff" * ds, ds))
    return type(
        f"IntHop_{bitmap:04x}_{hop_len // 4}",
        (_IntHopBase,),
        {
            "name": f"INT hop (bitmap {bitmap:#06x})",
            "fields_desc": fields,
            "bitmap": bitmap,
            "hop_len": hop_len,
        },
    )


def IntHop(bitmap: int, hop_ml: int | None = None, **fields: Any) -> Packet:  # noqa: N802
    """One hop record; `None` for a field = not available (all-ones over its metadata unit)."""
    cls = int_hop_class(bitmap, hop_ml)
    raw = encode_stack([fields], bitmap, hop_ml) if fields else None
    return cls(raw) if raw is not None else cls()


def _next_hop_class(
    md: Packet, lst: list[Any], cur: Packet | None, remain: bytes
) -> type[Packet] | None:
    cls = int_hop_class(md.instruction_bitmap, md.hop_ml)
    hop_len = md.hop_ml * 4
    if not remain or hop_len == 0:
        return None
    return cls if len(remain) >= hop_len else Raw


class IntMD(Packet):
    """INT-MD metadata header (12 B) followed by its metadata stack (newest hop first)."""

    name = "INT-MD"
    fields_desc = [
        BitField("ver", INT_VERSION, 4),
        BitField("d", 0, 1),
        BitField("e", 0, 1),
        BitField("m", 0, 1),
        BitField("rsvd", 0, 12),
        BitField("hop_ml", None, 5),
        ByteField("remaining_hop_cnt", 8),
        XShortField("instruction_bitmap", 0),
        ShortField("domain_id", 0),
        XShortField("ds_instruction", 0),
        XShortField("ds_flags", 0),
        PacketListField("hops", [], next_cls_cb=_next_hop_class, length_from=_stack_len),
    ]

    def post_build(self, p: bytes, pay: bytes) -> bytes:
        if self.hop_ml is None:
            word = int.from_bytes(p[:3], "big") | hop_ml_words(self.instruction_bitmap)
            p = word.to_bytes(3, "big") + p[3:]
        return p + pay

    def stack_bytes(self) -> bytes:
        return b"".join(bytes(h) for h in self.hops)

    def hop_dicts(self) -> list[dict[str, Any]]:
        hop_ml = self.hop_ml if self.hop_ml is not None else hop_ml_words(self.instruction_bitmap)
        return decode_stack(self.stack_bytes(), self.instruction_bitmap, hop_ml)

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        shim = self.underlayer
        # An INT echo in an ACK ends the transport payload; on a data packet the original UDP
        # payload follows, which on the RoCE port is the BTH.
        if isinstance(shim, IntShim) and isinstance(shim.underlayer, UDP):
            if shim.underlayer.dport == ROCE_UDP_PORT:
                return BTH
        return Raw


def looks_like_int_echo(rest: bytes) -> bool:
    """An ACK's bytes after the AETH (ICRC excluded) are an INT echo (docs/wire-format.md)."""
    return (
        len(rest) >= SHIM_LEN + MD_LEN
        and rest[0] >> 4 == INT_TYPE_MD
        and 4 * (rest[1] + 1) == len(rest)
    )


class TelemetryReportGroup(Packet):
    """Telemetry Report v2.0 group header (8 B); individual reports follow."""

    name = "Telemetry Report group"
    fields_desc = [
        BitField("ver", 2, 4),
        BitField("hw_id", 0, 6),
        BitField("seq", 0, 22),
        XBitField("node_id", 0, 32),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return TelemetryReportIndividual


def _inner_len(rep: Packet) -> int:
    if rep.report_len == REPORT_LEN_TO_END:
        return 1 << 16  # more than any UDP payload: the rest of it
    return max(0, ((rep.report_len or 0) - 2) * 4 - (rep.md_len or 0) * 4)


class TelemetryReportIndividual(Packet):
    """One individual report (RepType INT): header, own metadata, inner packet (from IPv4).

    `report_len` and `md_len` are computed if None (the inner packet is padded to whole words).
    """

    name = "Telemetry Report individual"
    fields_desc = [
        BitField("rep_type", REPORT_TYPE_INT, 4),
        BitField("in_type", IN_TYPE_IPV4, 4),
        ByteField("report_len", None),
        ByteField("md_len", None),
        BitField("d", 0, 1),
        BitField("q", 0, 1),
        BitField("f", 0, 1),
        BitField("i", 0, 1),
        BitField("rsvd", 0, 4),
        XShortField("rep_md_bits", 0),
        ShortField("domain_id", 0),
        XShortField("ds_md_bits", 0),
        XShortField("ds_md_status", 0),
        StrLenField("metadata", b"", length_from=lambda p: (p.md_len or 0) * 4),
        StrLenField("inner", b"", length_from=_inner_len),
    ]

    def post_build(self, p: bytes, pay: bytes) -> bytes:
        md = len(self.metadata)
        inner = len(self.inner)
        pad = (-inner) % 4
        p += b"\x00" * pad
        if self.md_len is None:
            p = p[:2] + bytes([md // 4]) + p[3:]
        if self.report_len is None:
            words = (REPORT_FIXED_LEN - 4 + md + inner + pad) // 4
            p = p[:1] + bytes([min(words, REPORT_LEN_TO_END)]) + p[2:]
        return p + pay

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return TelemetryReportIndividual if payload else Raw

    def metadata_dict(self) -> dict[str, int | None]:
        return decode_report_metadata(self.rep_md_bits, self.metadata)

    def inner_packet(self, int_dscp: int | None = INT_DSCP_DEFAULT) -> Packet:
        """The inner packet decoded from its IPv4 header (INT parsed per `int_dscp`)."""
        if self.in_type != IN_TYPE_IPV4:
            return Raw(self.inner)
        return decode(self.inner, int_dscp, first=IP)


bind_layers(UDP, TelemetryReportGroup, dport=TELEMETRY_REPORT_PORT)
# AETH → IntShim (echo) is decided in AETH.guess_payload_class; declared here for scapy's
# layer graph and for building AETH()/IntShim() without an explicit binding.
bind_layers(AETH, IntShim)


# ---- helpers --------------------------------------------------------------------------------


def int_packet(
    *,
    src_ip: str,
    dst_ip: str,
    sport: int,
    hops: Iterable[Mapping[str, Any]] = (),
    bitmap: int = 0xF500,
    remaining_hop_cnt: int = 8,
    payload: Packet | bytes = b"",
    dport: int = ROCE_UDP_PORT,
    src_mac: str = "02:00:00:00:00:01",
    dst_mac: str = "02:00:00:00:00:02",
    int_dscp: int = INT_DSCP_DEFAULT,
    ecn: int = 0b10,
    orig_dscp: int = 0,
    ttl: int = 64,
    ip_id: int = 1,
    ip_flags: str = "DF",
    d: int = 0,
    e: int = 0,
    m: int = 0,
    domain_id: int = 0,
    ds_instruction: int = 0,
    ds_flags: int = 0,
    hop_ml: int | None = None,
) -> Packet:
    """Ether/IPv4(INT DSCP)/UDP(checksum 0)/IntShim/IntMD(+stack)/payload.

    `hops` are hop dicts (newest first, see `decode_stack`); `payload` is usually a BTH packet
    (its ICRC is computed over the packet without INT).
    """
    ml = hop_ml if hop_ml is not None else hop_ml_words(bitmap)
    stack = encode_stack(hops, bitmap, ml)
    hop_cls = int_hop_class(bitmap, ml)
    hop_pkts = [hop_cls(stack[i : i + ml * 4]) for i in range(0, len(stack), ml * 4)]
    md = IntMD(
        d=d,
        e=e,
        m=m,
        hop_ml=ml,
        remaining_hop_cnt=remaining_hop_cnt,
        instruction_bitmap=bitmap,
        domain_id=domain_id,
        ds_instruction=ds_instruction,
        ds_flags=ds_flags,
        hops=hop_pkts,
    )
    pay = payload if isinstance(payload, Packet) else Raw(payload)
    return (
        Ether(src=src_mac, dst=dst_mac)
        / IP(src=src_ip, dst=dst_ip, tos=(int_dscp << 2) | ecn, ttl=ttl, id=ip_id, flags=ip_flags)
        / UDP(sport=sport, dport=dport, chksum=0)
        / IntShim(dscp=orig_dscp)
        / md
        / pay
    )


def parse_int(pkt: Packet) -> dict[str, Any] | None:
    """The INT of a dissected packet as dicts (shim, md, hops, payload bytes); None if absent.

    The payload is what follows the stack (the original UDP payload, BTH and ICRC included).
    """
    if IntShim not in pkt:
        return None
    shim = pkt[IntShim]
    if not isinstance(shim.payload, IntMD):
        raise ValueError(f"INT shim type {shim.type} is not INT-MD")
    md = shim.payload
    return {
        "shim": {"type": shim.type, "npt": shim.npt, "length": shim.length, "dscp": shim.dscp},
        "md": {
            "ver": md.ver,
            "D": md.d,
            "E": md.e,
            "M": md.m,
            "hop_ml": md.hop_ml,
            "remaining_hop_cnt": md.remaining_hop_cnt,
            "bitmap": md.instruction_bitmap,
            "domain_id": md.domain_id,
            "ds_instruction": md.ds_instruction,
            "ds_flags": md.ds_flags,
        },
        "hops": md.hop_dicts(),
        "payload": bytes(md.payload),
    }


def parse_report(data: bytes, int_dscp: int | None = INT_DSCP_DEFAULT) -> dict[str, Any]:
    """A Telemetry Report (UDP payload) as dicts: group fields and each individual report."""
    grp = TelemetryReportGroup(data)
    reports = []
    rep = grp.payload
    while isinstance(rep, TelemetryReportIndividual):
        reports.append(
            {
                "rep_type": rep.rep_type,
                "in_type": rep.in_type,
                "report_len_words": rep.report_len,
                "md_len_words": rep.md_len,
                "D": rep.d,
                "Q": rep.q,
                "F": rep.f,
                "I": rep.i,
                "rep_md_bits": rep.rep_md_bits,
                "domain_id": rep.domain_id,
                "ds_md_bits": rep.ds_md_bits,
                "ds_md_status": rep.ds_md_status,
                "metadata": rep.metadata,
                "inner": rep.inner,
            }
        )
        rep = rep.payload
    return {
        "ver": grp.ver,
        "hw_id": grp.hw_id,
        "seq": grp.seq,
        "node_id": grp.node_id,
        "reports": reports,
    }
