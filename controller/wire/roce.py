"""RoCEv2 transport headers (docs/wire-format.md): BTH, AETH, CNP, and the ICRC.

The one declaration of these formats in Python, with plain `struct` codecs for the transport's
per-packet path (building a scapy packet would cost more than sending it); the scapy layers in
testbed/packets are built from the same field tables, and tests/test_wire_sources.py holds
ebpf/xingmai.h against these values.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from controller.wire.layout import Fields, byte_size

ROCE_UDP_PORT = 4791
# A RoCEv2 source port carries a flow's entropy for ECMP: the transport and the prober draw
# it from the dynamic range with a 32-bit LCG (Numerical Recipes' constants)
ENTROPY_PORT_MIN = 49152
ENTROPY_PORTS = 16384


def next_entropy_port(state: int) -> tuple[int, int]:
    """One step of the entropy ports' generator: (its next state, the port it draws)."""
    state = (state * 1664525 + 1013904223) & 0xFFFFFFFF
    return state, ENTROPY_PORT_MIN + (state >> 16) % ENTROPY_PORTS


# BTH opcodes used by the transport (RC = reliable connection).
OP_SEND_FIRST = 0x00
OP_SEND_MIDDLE = 0x01
OP_SEND_LAST = 0x02
OP_SEND_ONLY = 0x04
OP_ACK = 0x11
OP_CNP = 0x81
# Data-carrying RC requests (the SEND and RDMA WRITE families) are 0x00..OP_RC_DATA_MAX: a NIC
# adds INT to them, never to feedback.
OP_RC_DATA_MAX = 0x0B
OPCODE_NAMES = {
    OP_SEND_FIRST: "RC_SEND_FIRST",
    OP_SEND_MIDDLE: "RC_SEND_MIDDLE",
    OP_SEND_LAST: "RC_SEND_LAST",
    OP_SEND_ONLY: "RC_SEND_ONLY",
    OP_ACK: "RC_ACKNOWLEDGE",
    OP_CNP: "CNP",
}
DATA_OPCODES = frozenset({OP_SEND_FIRST, OP_SEND_MIDDLE, OP_SEND_LAST, OP_SEND_ONLY})

# AETH syndromes: 0x00-0x1f are ACKs (low 5 bits: credit count, unused here),
# 0x60 is "NAK: PSN sequence error" (the receiver expects the PSN in the AETH's packet).
AETH_ACK = 0x00
AETH_ACK_MAX = 0x1F
AETH_NAK_PSN_SEQ_ERR = 0x60
# "NAK: PSN sequence error, selective": the project's use of a NAK code the IBTA spec reserves
# (0x65), for a receiver that keeps out-of-order packets (selective repeat, as IRN and the
# RoCE NICs with selective repeat do). Its BTH PSN is the first missing PSN, like 0x60's, and
# a SACK header follows the AETH naming the out-of-order PSN that made the NAK (received and
# kept: the sender need not resend it). A go-back-N sender may treat it as 0x60.
AETH_NAK_PSN_SEQ_ERR_SACK = 0x65

BTH_FIELDS: Fields = (
    ("opcode", 8),
    ("se", 1),
    ("migreq", 1),
    ("padcnt", 2),
    ("tver", 4),
    ("pkey", 16),
    ("fecn", 1),
    ("becn", 1),
    ("resv6", 6),
    ("dqpn", 24),
    ("ackreq", 1),
    ("resv7", 7),
    ("psn", 24),
)
AETH_FIELDS: Fields = (("syndrome", 8), ("msn", 24))
# after an AETH with syndrome AETH_NAK_PSN_SEQ_ERR_SACK (and nothing else: no INT echo)
SACK_FIELDS: Fields = (("resv", 8), ("psn", 24))
BTH_LEN = byte_size(BTH_FIELDS)
AETH_LEN = byte_size(AETH_FIELDS)
SACK_LEN = byte_size(SACK_FIELDS)
CNP_LEN = 16  # reserved bytes after a CNP's BTH
ICRC_LEN = 4
BTH_PSN_OFFSET = 9  # the PSN is the BTH's last 3 bytes
PSN_MASK = 0xFFFFFF
QPN_MASK = 0xFFFFFF
DEFAULT_PKEY = 0xFFFF

_BTH = struct.Struct("!BBHII")
_AETH = struct.Struct("!I")
_UDP_MASKED = struct.Struct("!HHHH")
ICRC_LRH = zlib.crc32(b"\xff" * 8)  # the pseudo LRH the CRC starts with
assert _BTH.size == BTH_LEN and _AETH.size == AETH_LEN == SACK_LEN


class Bth(NamedTuple):
    opcode: int
    dqpn: int
    psn: int
    ackreq: bool
    fecn: bool = False
    becn: bool = False
    pkey: int = DEFAULT_PKEY


def pack_bth(
    opcode: int, dqpn: int, psn: int, ackreq: bool = False, *, pkey: int = DEFAULT_PKEY
) -> bytes:
    return _BTH.pack(opcode, 0, pkey, dqpn & QPN_MASK, (int(ackreq) << 31) | (psn & PSN_MASK))


def unpack_bth(buf: bytes | memoryview, offset: int = 0) -> Bth:
    """Decode a BTH; raises ValueError on a short buffer."""
    if len(buf) - offset < BTH_LEN:
        raise ValueError(f"BTH needs {BTH_LEN} bytes, {len(buf) - offset} left")
    opcode, _flags, pkey, fq, ap = _BTH.unpack_from(buf, offset)
    return Bth(
        opcode=opcode,
        dqpn=fq & QPN_MASK,
        psn=ap & PSN_MASK,
        ackreq=bool(ap >> 31),
        fecn=bool(fq >> 31),
        becn=bool((fq >> 30) & 1),
        pkey=pkey,
    )


def pack_aeth(syndrome: int, msn: int) -> bytes:
    return _AETH.pack(((syndrome & 0xFF) << 24) | (msn & 0xFFFFFF))


def unpack_aeth(buf: bytes | memoryview, offset: int = 0) -> tuple[int, int]:
    """(syndrome, msn); raises ValueError on a short buffer."""
    if len(buf) - offset < AETH_LEN:
        raise ValueError(f"AETH needs {AETH_LEN} bytes, {len(buf) - offset} left")
    (word,) = _AETH.unpack_from(buf, offset)
    return word >> 24, word & 0xFFFFFF


def pack_sack(psn: int) -> bytes:
    return _AETH.pack(psn & PSN_MASK)


def unpack_sack(buf: bytes | memoryview, offset: int = 0) -> int:
    """The SACK header's PSN; raises ValueError on a short buffer."""
    if len(buf) - offset < SACK_LEN:
        raise ValueError(f"SACK needs {SACK_LEN} bytes, {len(buf) - offset} left")
    (word,) = _AETH.unpack_from(buf, offset)
    return int(word) & PSN_MASK


def is_ack(syndrome: int) -> bool:
    return syndrome <= AETH_ACK_MAX


def is_nak(syndrome: int) -> bool:
    return syndrome >> 5 == AETH_NAK_PSN_SEQ_ERR >> 5


def icrc(
    ip_header: bytes | bytearray, sport: int, dport: int, transport: bytes | memoryview
) -> bytes:
    """The 4-byte ICRC of a RoCEv2 packet, as Wireshark checks it.

    `ip_header` is the IPv4 header (options included), `transport` the bytes from the BTH to
    the end of the payload (ICRC excluded). CRC-32 over 8 bytes of 0xff (the pseudo LRH), the
    IPv4 header with TOS, TTL and checksum set to all-ones, the UDP header with its checksum set
    to all-ones, and the BTH with FECN/BECN/reserved set to all-ones; stored little-endian.
    The IPv4 total length and UDP length are those of the packet *without* INT: INT is inserted
    and grown on the path, so the ICRC covers the packet as the transport sent it.
    """
    if len(transport) < BTH_LEN:
        raise ValueError(f"the ICRC covers a BTH: {len(transport)} bytes of transport")
    ihl = (ip_header[0] & 0x0F) * 4
    udp_len = 8 + len(transport) + ICRC_LEN
    # the masked headers in one buffer, one CRC call over them and one over the payload
    head = bytearray(ip_header[:ihl])
    head[1] = 0xFF  # TOS
    head[2:4] = (ihl + udp_len).to_bytes(2, "big")
    head[8] = 0xFF  # TTL
    head[10:12] = b"\xff\xff"  # header checksum
    head += _UDP_MASKED.pack(sport, dport, udp_len, 0xFFFF)
    head += transport[:BTH_LEN]
    head[ihl + 12] = 0xFF  # FECN, BECN, reserved
    crc = zlib.crc32(head, ICRC_LRH)
    crc = zlib.crc32(transport[BTH_LEN:], crc)
    return crc.to_bytes(4, "little")


def verify_icrc(ip_header: bytes, sport: int, dport: int, transport_with_icrc: bytes) -> bool:
    """True when the last 4 bytes of `transport_with_icrc` are its ICRC (INT already removed)."""
    if len(transport_with_icrc) < BTH_LEN + ICRC_LEN:
        return False
    body = transport_with_icrc[:-ICRC_LEN]
    return icrc(ip_header, sport, dport, body) == transport_with_icrc[-ICRC_LEN:]
