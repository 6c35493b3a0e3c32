"""INT-MD v2.1 over UDP (docs/wire-format.md): the shim, the MD header, the hop metadata.

The one declaration of these formats in Python: the collector, the NIC's rate-law reference,
the probes, the transport and the scapy layers (testbed/packets) use it, and
tests/test_wire_sources.py holds p4src/include/*.p4 and ebpf/xingmai.h against it.

A hop record's fields depend on the instruction bitmap (bit 0 = MSB): `HOP_METADATA` maps each
bit to its metadata unit of 4 or 8 bytes; all-ones over a unit means "not available" (None in
the dicts of `decode_stack`). INT presence is one DSCP value of the INT domain.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from controller.wire.layout import Fields, byte_size, field_width

INT_DSCP_DEFAULT = 0x17
INT_TYPE_MD = 1
INT_VERSION = 2

SHIM_FIELDS: Fields = (
    ("type", 4),
    ("npt", 2),
    ("rsvd", 2),
    ("length", 8),  # MD header + stack, in 4-byte words (the shim not counted)
    ("rsvd2", 8),
    ("dscp", 6),  # the packet's original DSCP, restored by the sink
    ("rsvd3", 2),
)
MD_FIELDS: Fields = (
    ("ver", 4),
    ("d", 1),
    ("e", 1),
    ("m", 1),
    ("rsvd", 12),
    ("hop_ml", 5),
    ("remaining_hop_cnt", 8),
    ("instruction_bitmap", 16),
    ("domain_id", 16),
    ("ds_instruction", 16),
    ("ds_flags", 16),
)
SHIM_LEN = byte_size(SHIM_FIELDS)
MD_LEN = byte_size(MD_FIELDS)
MD_WORDS = MD_LEN // 4
HEADERS_LEN = SHIM_LEN + MD_LEN  # what a source inserts
HOP_ML_MAX = (1 << field_width(MD_FIELDS, "hop_ml")) - 1
SHIM_LENGTH_MAX = (1 << field_width(SHIM_FIELDS, "length")) - 1
# MD header flag bits in its first byte (ver:4 d e m rsvd...)
MD_FLAG_D = 0x08
MD_FLAG_E = 0x04
MD_FLAG_M = 0x02

Unit = tuple[tuple[str, int], ...]
# Per-hop metadata in instruction-bitmap order (bit 0 = MSB): one unit of fields per bit.
HOP_METADATA: dict[int, Unit] = {
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
# The bits this project's switches and NICs fill (the rest come out all-ones, or are skipped).
BIT_NODE_ID = 0
BIT_L1_PORTS = 1
BIT_HOP_LATENCY = 2
BIT_QUEUE = 3
BIT_INGRESS_TS = 4
BIT_EGRESS_TS = 5
BIT_TX_UTIL = 7


def bitmap_bit(bit: int) -> int:
    """The instruction-bitmap mask of bit `bit` (bit 0 is the MSB of the 16-bit field)."""
    return 0x8000 >> bit


def set_bits(bitmap: int, table: Mapping[int, Unit] = HOP_METADATA) -> list[int]:
    """The bitmap's set bits that `table` defines, in wire order."""
    return [b for b in range(16) if bitmap & bitmap_bit(b) and b in table]


def unit_len(unit: Unit) -> int:
    return sum(width for _, width in unit) // 8


def metadata_len(bitmap: int, table: Mapping[int, Unit] = HOP_METADATA) -> int:
    """Bytes of metadata one node adds for this bitmap (baseline only)."""
    return sum(size for _, size, _, _ in _plan_of(bitmap, table))


@functools.lru_cache(maxsize=4096)
def hop_ml_words(bitmap: int) -> int:
    """Hop ML (4-byte words per hop) for an instruction bitmap without domain metadata.

    Reserved bits 9-14 count one word each, as INT v2.1 asks of nodes that do not know them.
    """
    return metadata_len(bitmap & 0xFFFF) // 4


def unit_offsets(bitmap: int, table: Mapping[int, Unit] = HOP_METADATA) -> dict[int, int]:
    """Byte offset of each set bit's unit inside one hop record."""
    out = {}
    pos = 0
    for bit in set_bits(bitmap, table):
        out[bit] = pos
        pos += unit_len(table[bit])
    return out


# how to read one record's units: per set bit of the bitmap, in wire order, (bit, bytes, its
# all-ones value, ((field, shift, mask), ...))
_Plan = tuple[tuple[int, int, bytes, tuple[tuple[str, int, int], ...]], ...]


def _plan(bitmap: int, table: Mapping[int, Unit]) -> _Plan:
    out = []
    for bit in set_bits(bitmap, table):
        fields = table[bit]
        size = unit_len(fields)
        shift = size * 8
        reads = []
        for name, width in fields:
            shift -= width
            reads.append((name, shift, (1 << width) - 1))
        out.append((bit, size, b"\xff" * size, tuple(reads)))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _hop_plan(bitmap: int) -> _Plan:
    """The plan of a hop record (every INT packet's: computed once per bitmap)."""
    return _plan(bitmap, HOP_METADATA)


def _plan_of(bitmap: int, table: Mapping[int, Unit]) -> _Plan:
    return _hop_plan(bitmap) if table is HOP_METADATA else _plan(bitmap, table)


_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


@functools.lru_cache(maxsize=4096)
def _hop_reader(
    bitmap: int,
) -> tuple[struct.Struct, tuple[tuple[int, tuple[tuple[str, int, int], ...]], ...]] | None:
    """A hop record of this bitmap read in one unpack: the record's struct and, per unit, its
    all-ones value and fields (None where a unit has no struct code)."""
    plan = _hop_plan(bitmap)
    if any(size not in _CODES for _, size, _, _ in plan):
        return None
    fmt = "!" + "".join(_CODES[size] for _, size, _, _ in plan)
    return struct.Struct(fmt), tuple(((1 << (8 * size)) - 1, reads) for _, size, _, reads in plan)


def decode_units(
    data: bytes | bytearray | memoryview, bitmap: int, table: Mapping[int, Unit] = HOP_METADATA
) -> dict[str, int | None]:
    """The metadata units of one record as {field: value}, None where a unit is all-ones."""
    out: dict[str, int | None] = {}
    reader = _hop_reader(bitmap) if table is HOP_METADATA else None
    if reader is not None and len(data) >= reader[0].size:  # a hop record, whole: one unpack
        for word, (all_ones, fields) in zip(reader[0].unpack_from(data), reader[1], strict=True):
            if word == all_ones:
                for name, _, _ in fields:
                    out[name] = None
            else:
                for name, shift, mask in fields:
                    out[name] = (word >> shift) & mask
        return out
    pos = 0
    for bit, size, ones, reads in _plan_of(bitmap, table):
        unit = bytes(data[pos : pos + size])
        if len(unit) < size:
            raise ValueError(f"metadata for bitmap bit {bit} truncated")
        pos += size
        if unit == ones:
            for name, _, _ in reads:
                out[name] = None
            continue
        value = int.from_bytes(unit, "big")
        for name, shift, mask in reads:
            out[name] = (value >> shift) & mask
    return out


def encode_units(
    values: Mapping[str, int | None], bitmap: int, table: Mapping[int, Unit] = HOP_METADATA
) -> bytes:
    """Inverse of `decode_units`: a unit whose fields are all None is written all-ones."""
    out = bytearray()
    for bit in set_bits(bitmap, table):
        fields = table[bit]
        size = unit_len(fields)
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
        hop: dict[str, Any] = dict(decode_units(stack[off : off + base], bitmap))
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
        rec = encode_units(hop, bitmap)
        ds = bytes(hop.get("ds_metadata", b"\xff" * (hop_len - base)))
        if len(rec) + len(ds) != hop_len:
            raise ValueError(f"hop of {len(rec) + len(ds)} bytes, Hop ML says {hop_len}")
        out += rec + ds
    return bytes(out)


def shim_total_len(shim_length_words: int) -> int:
    """Bytes of shim + MD header + stack for a shim length field (which omits the shim)."""
    return SHIM_LEN + 4 * shim_length_words


def looks_like_int_echo(rest: bytes | bytearray | memoryview) -> bool:
    """An ACK's bytes after the AETH (ICRC excluded) are an INT echo (docs/wire-format.md)."""
    return (
        len(rest) >= HEADERS_LEN
        and rest[0] >> 4 == INT_TYPE_MD
        and shim_total_len(rest[1]) == len(rest)
    )


def int_stack_at(frame: bytes | bytearray | memoryview, shim: int) -> tuple[int, int, bytes]:
    """(instruction bitmap, Hop ML, metadata stack) of the INT headers at offset `shim`.

    Raises ValueError when the shim is not INT-MD or the frame ends inside the headers or stack.
    """
    if len(frame) < shim + HEADERS_LEN:
        raise ValueError("frame ends inside the INT headers")
    if frame[shim] >> 4 != INT_TYPE_MD:
        raise ValueError(f"INT shim type {frame[shim] >> 4} is not INT-MD")
    md = shim + SHIM_LEN
    hop_ml = frame[md + 2] & HOP_ML_MAX
    bitmap = (frame[md + 4] << 8) | frame[md + 5]
    stack_len = 4 * (frame[shim + 1] - MD_WORDS)
    if stack_len < 0:
        raise ValueError(f"shim length {frame[shim + 1]} words is shorter than the MD header")
    stack = bytes(frame[md + MD_LEN : md + MD_LEN + stack_len])
    if len(stack) != stack_len:
        raise ValueError("frame ends inside the INT stack")
    return bitmap, hop_ml, stack
