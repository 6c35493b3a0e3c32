"""v1model primitives on the built-in switch, checked against independent computations:
hash() with several algorithms, random(), truncate(), log_msg(), stack push/pop, parser
lookahead and verify() (tests/p4/primitives.p4)."""

from __future__ import annotations

import binascii
import struct
from pathlib import Path

import pytest

from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import V1Switch

JSON = Path(__file__).parent / "p4" / "build" / "primitives.json"
ETH = bytes.fromhex("0200000000020200000000011234")


def crc16_arc_bitwise(data: bytes) -> int:
    """CRC-16/ARC bit by bit (reflected poly 0xA001), independent of the table version."""
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return crc


@pytest.fixture
def sw() -> V1Switch:
    if not JSON.exists():
        pytest.skip(f"{JSON} not built")
    s = V1Switch(Clock(virtual=True))
    s.load(JSON.read_bytes())
    return s


def run(sw: V1Switch, frame: bytes) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    sw.transmit = lambda port, data: out.append((port, data))
    sw.receive(1, frame)
    sw.service()
    return out


def frame(a: int, b: int, tags: bytes = b"\x05\x00", eth: bytes = ETH) -> bytes:
    return eth + struct.pack("!II", a, b) + bytes(15) + tags  # results_t is 15 bytes


def test_hashes_random_lookahead_push(sw: V1Switch) -> None:
    logs: list[str] = []
    sw.log_fn = logs.append
    data = frame(0x01020304, 0x05060708)
    [(port, out)] = run(sw, data)
    assert port == 2
    crc16, crc32, csum, xor, ident, rnd, look, depth = struct.unpack("!HIHHHBBB", out[22:37])
    payload = bytes.fromhex("0102030405060708")
    assert crc16 == crc16_arc_bitwise(payload)
    assert crc32 == binascii.crc32(payload)
    assert csum == 0xFFFF - (0x0102 + 0x0304 + 0x0506 + 0x0708)
    assert xor == 0x0102 ^ 0x0304 ^ 0x0506 ^ 0x0708
    assert ident == 100 + 0x05060708 % 1000
    assert 10 <= rnd <= 20
    assert look == 0x01
    assert depth == len(data)
    assert out[37:] == b"\xee\x05\x00"  # push_front(1) then tags[0] = 0xee
    assert logs == [f"a={0x01020304} b={0x05060708}"]


def test_random_covers_its_range(sw: V1Switch) -> None:
    seen = {run(sw, frame(1, 2))[0][1][34] for _ in range(300)}
    assert seen == set(range(10, 21))


def test_truncate_pop_and_verify(sw: V1Switch) -> None:
    [(_, out)] = run(sw, frame(0xFFFFFFFF, 1))
    assert len(out) == 20  # truncate(20)
    [(_, out)] = run(sw, frame(1, 0x0BADF00D, tags=b"\x07\x09\x00"))
    # ingress pushed 0xee in front of 07 09 00; egress popped two
    assert out[37:] == b"\x09\x00"
    bad = ETH[:12] + b"\xde\xad"
    [(port, _)] = run(sw, frame(1, 2, eth=bad))
    assert port == 3  # verify() failed: parser_error == error.BadMagic
