"""Hash and checksum algorithms, bit-exact with bmv2's `calculations.cpp`.

Each algorithm maps a byte string to an unsigned integer. The names are the `algo` strings
that appear in p4c's bmv2 JSON (`calculations`, action selectors).
"""

from __future__ import annotations

import binascii
import itertools
import random
from collections.abc import Callable

from controller.wire.ipv4 import checksum as ipv4_checksum

HashFn = Callable[[bytes], int]


def _crc_table(poly: int, width: int) -> list[int]:
    top = 1 << (width - 1)
    mask = (1 << width) - 1
    table = []
    for byte in range(256):
        rem = byte << (width - 8)
        for _ in range(8):
            rem = ((rem << 1) ^ poly) if rem & top else (rem << 1)
        table.append(rem & mask)
    return table


def _reflect(value: int, nbits: int) -> int:
    out = 0
    for i in range(nbits):
        if value >> i & 1:
            out |= 1 << (nbits - 1 - i)
    return out


_REFLECT8 = [_reflect(b, 8) for b in range(256)]


def make_crc(
    poly: int, width: int, init: int, xor_out: int, refl_in: bool, refl_out: bool
) -> HashFn:
    """A table-driven CRC of the Rocksoft model family (as bmv2's crc_custom)."""
    table = _crc_table(poly, width)
    mask = (1 << width) - 1
    shift = width - 8

    def crc(data: bytes) -> int:
        rem = init
        for b in data:
            idx = (_REFLECT8[b] if refl_in else b) ^ (rem >> shift)
            rem = (table[idx & 0xFF] ^ (rem << 8)) & mask
        if refl_out:
            rem = _reflect(rem, width)
        return rem ^ xor_out

    return crc


# CRC-16/ARC (bmv2 "crc16"): poly 0x8005, reflected, init 0. Reflected variants run faster with
# a reflected table, computed once here.
def _reflected_table(poly: int, width: int) -> list[int]:
    rpoly = _reflect(poly, width)
    table = []
    for byte in range(256):
        rem = byte
        for _ in range(8):
            rem = (rem >> 1) ^ rpoly if rem & 1 else rem >> 1
        table.append(rem)
    return table


_CRC16_RTABLE = _reflected_table(0x8005, 16)


def crc16(data: bytes) -> int:
    rem = 0
    for b in data:
        rem = _CRC16_RTABLE[(rem ^ b) & 0xFF] ^ (rem >> 8)
    return rem


def crc32(data: bytes) -> int:
    # bmv2's crc32 is the IEEE 802.3 CRC-32, which zlib/binascii computes.
    return binascii.crc32(data) & 0xFFFFFFFF


crcCCITT = make_crc(0x1021, 16, 0xFFFF, 0x0000, False, False)


# bmv2's "csum16" / "cksum16": RFC 1071's ones' complement checksum, the IPv4 header's
csum16 = ipv4_checksum


def _xor(width_bytes: int) -> HashFn:
    def xor_hash(data: bytes) -> int:
        acc = 0
        for i in range(0, len(data), width_bytes):
            chunk = data[i : i + width_bytes]
            acc ^= int.from_bytes(chunk.ljust(width_bytes, b"\x00"), "big")
        return acc

    return xor_hash


def identity(data: bytes) -> int:
    return int.from_bytes(data[:8], "big")


def _round_robin() -> HashFn:
    counter = itertools.count()
    return lambda data: next(counter)


def _round_robin_consistent() -> HashFn:
    seen: dict[bytes, int] = {}

    def rr(data: bytes) -> int:
        return seen.setdefault(bytes(data), len(seen))

    return rr


def _random_hash(data: bytes) -> int:
    return random.getrandbits(64)


# Custom CRCs with bmv2's default configurations (changeable at run time in bmv2 via Thrift;
# here the defaults).
_FACTORIES: dict[str, Callable[[], HashFn]] = {
    "crc16": lambda: crc16,
    "crc32": lambda: crc32,
    "crcCCITT": lambda: crcCCITT,
    "csum16": lambda: csum16,
    "cksum16": lambda: csum16,
    "identity": lambda: identity,
    "xor16": lambda: _xor(2),
    "xor32": lambda: _xor(4),
    "round_robin": _round_robin,
    "round_robin_consistent": _round_robin_consistent,
    "random": lambda: _random_hash,
    "crc8_custom": lambda: make_crc(0x07, 8, 0x00, 0x00, False, False),
    "crc16_custom": lambda: make_crc(0x8005, 16, 0x0000, 0x0000, True, True),
    "crc32_custom": lambda: make_crc(0x04C11DB7, 32, 0xFFFFFFFF, 0xFFFFFFFF, True, True),
    "crc64_custom": lambda: make_crc(0x1B, 64, 0, 0, True, True),
}


def get_hash(name: str) -> HashFn:
    """A fresh instance of the named algorithm (stateful ones, like round_robin, are per use)."""
    try:
        return _FACTORIES[name]()
    except KeyError:
        raise ValueError(f"unsupported hash algorithm {name!r}") from None


def supported() -> list[str]:
    return sorted(_FACTORIES)
