"""Header layouts as field tables: (name, width in bits) in wire order, most significant first.

One table is the one declaration of a header: the byte codecs below, the scapy layers
(testbed/packets) and the tests that hold the C and P4 sources against these tables
(tests/test_wire_sources.py) all read it.
"""

from __future__ import annotations

from collections.abc import Mapping

Fields = tuple[tuple[str, int], ...]


def bit_size(fields: Fields) -> int:
    return sum(width for _, width in fields)


def byte_size(fields: Fields) -> int:
    """Bytes of a header; a layout that is not whole bytes is a declaration error."""
    bits = bit_size(fields)
    if bits % 8:
        raise ValueError(f"layout of {bits} bits is not a whole number of bytes")
    return bits // 8


def field_width(fields: Fields, name: str) -> int:
    for n, width in fields:
        if n == name:
            return width
    raise KeyError(name)


def unpack(fields: Fields, buf: bytes | bytearray | memoryview, offset: int = 0) -> dict[str, int]:
    """The header at `offset` as {name: value}; ValueError when the buffer is short."""
    size = byte_size(fields)
    if len(buf) - offset < size:
        raise ValueError(f"header needs {size} bytes, {len(buf) - offset} left")
    value = int.from_bytes(buf[offset : offset + size], "big")
    out = {}
    shift = size * 8
    for name, width in fields:
        shift -= width
        out[name] = (value >> shift) & ((1 << width) - 1)
    return out


def pack(fields: Fields, values: Mapping[str, int]) -> bytes:
    """The header's bytes; fields not given are 0, a value that does not fit is ValueError."""
    word = 0
    for name, width in fields:
        v = values.get(name, 0)
        if not 0 <= v < (1 << width):
            raise ValueError(f"{name}={v!r} does not fit {width} bits")
        word = (word << width) | v
    return word.to_bytes(byte_size(fields), "big")
