"""RoCEv2-like transport headers: BTH, AETH, CNP, and the ICRC (docs/wire-format.md).

Two views of the same bytes:
- scapy layers (`BTH`, `AETH`, `CNP`) for tests, tools and captures;
- plain `struct` codecs (`pack_bth`, `unpack_bth`, ...) and `icrc()` for the transport's per-packet
  path, where building a scapy packet would cost more than sending it. tests/test_packets.py
  checks that both views agree byte for byte.

UDP destination port 4791 is bound to `BTH`. A data packet carrying INT (signalled by the DSCP,
not the port) has the INT shim between UDP and BTH: `BTH.dispatch_hook` hands such packets to
`IntShim` when the IPv4 DSCP equals the INT DSCP in force (see `testbed.packets.int_md.decode`).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, NamedTuple

from scapy.fields import (
    BitField,
    ByteEnumField,
    FCSField,
    StrFixedLenField,
    XByteField,
    XShortField,
)
from scapy.layers.inet import IP, UDP
from scapy.packet import Packet, Raw, bind_layers

ROCE_UDP_PORT = 4791

# BTH opcodes used by the transport (RC = reliable connection).
OP_SEND_FIRST = 0x00
OP_SEND_MIDDLE = 0x01
OP_SEND_LAST = 0x02
OP_SEND_ONLY = 0x04
OP_ACK = 0x11
OP_CNP = 0x81
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
AETH_NAK_PSN_SEQ_ERR = 0x60

BTH_LEN = 12
AETH_LEN = 4
CNP_LEN = 16
ICRC_LEN = 4
PSN_MASK = 0xFFFFFF
QPN_MASK = 0xFFFFFF
DEFAULT_PKEY = 0xFFFF

_BTH = struct.Struct("!BBHII")
_AETH = struct.Struct("!I")


class BTH(Packet):
    """InfiniBand Base Transport Header (12 B), plus the packet's trailing ICRC.

    The ICRC is the last 4 bytes of the *packet* (scapy trailer field): left at None it is
    computed on build from the IPv4/UDP underlayers (0 when there are none).
    """

    name = "BTH"
    fields_desc = [
        ByteEnumField("opcode", OP_SEND_ONLY, OPCODE_NAMES),
        BitField("se", 0, 1),
        BitField("migreq", 0, 1),
        BitField("padcnt", 0, 2),
        BitField("tver", 0, 4),
        XShortField("pkey", DEFAULT_PKEY),
        BitField("fecn", 0, 1),
        BitField("becn", 0, 1),
        BitField("resv6", 0, 6),
        BitField("dqpn", 0, 24),
        BitField("ackreq", 0, 1),
        BitField("resv7", 0, 7),
        BitField("psn", 0, 24),
        FCSField("icrc", None, fmt="<I"),
    ]

    @classmethod
    def dispatch_hook(cls, _pkt: bytes | None = None, *args: Any, **kargs: Any) -> type[Packet]:
        # INT presence is a property of the IPv4 header (DSCP), which this layer can only see
        # through the underlayer scapy passes while dissecting.
        under = kargs.get("_underlayer")
        if _pkt is not None and isinstance(under, UDP) and isinstance(under.underlayer, IP):
            from testbed.packets.int_md import IntShim, current_int_dscp

            int_dscp = current_int_dscp()
            if int_dscp is not None and under.underlayer.tos >> 2 == int_dscp:
                return IntShim
        return cls

    def post_build(self, p: bytes, pay: bytes) -> bytes:
        p += pay
        if self.icrc is None:
            p = p[:-ICRC_LEN] + _icrc_for_layer(self, p[:-ICRC_LEN])
        return p

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        if self.opcode == OP_ACK:
            return AETH
        if self.opcode == OP_CNP:
            return CNP
        return Raw


class AETH(Packet):
    """ACK Extended Transport Header (4 B): syndrome + MSN. An INT echo may follow it."""

    name = "AETH"
    fields_desc = [XByteField("syndrome", AETH_ACK), BitField("msn", 0, 24)]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        from testbed.packets.int_md import IntShim, looks_like_int_echo

        # The ICRC has already been taken off the end by BTH's trailer field.
        if looks_like_int_echo(payload):
            return IntShim
        return Raw


class CNP(Packet):
    """Congestion Notification Packet payload: 16 reserved bytes after a BTH with opcode 0x81."""

    name = "CNP"
    fields_desc = [StrFixedLenField("reserved", b"\x00" * CNP_LEN, CNP_LEN)]


bind_layers(UDP, BTH, dport=ROCE_UDP_PORT)


# ---- plain codecs for the transport's per-packet path -------------------------------------


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


def is_nak(syndrome: int) -> bool:
    return syndrome >> 5 == 0b011


# ---- ICRC ---------------------------------------------------------------------------------


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
    ihl = (ip_header[0] & 0x0F) * 4
    udp_len = 8 + len(transport) + ICRC_LEN
    masked_ip = (
        ip_header[:1]
        + b"\xff"
        + (ihl + udp_len).to_bytes(2, "big")
        + ip_header[4:8]
        + b"\xff"
        + ip_header[9:10]
        + b"\xff\xff"
        + ip_header[12:ihl]
    )
    udp = struct.pack("!HHHH", sport, dport, udp_len, 0xFFFF)
    crc = zlib.crc32(b"\xff" * 8)
    crc = zlib.crc32(masked_ip, crc)
    crc = zlib.crc32(udp, crc)
    crc = zlib.crc32(bytes(transport[:4]) + b"\xff" + bytes(transport[5:BTH_LEN]), crc)
    crc = zlib.crc32(transport[BTH_LEN:], crc)
    return crc.to_bytes(4, "little")


def verify_icrc(ip_header: bytes, sport: int, dport: int, transport_with_icrc: bytes) -> bool:
    """True when the last 4 bytes of `transport_with_icrc` are its ICRC (INT already removed)."""
    if len(transport_with_icrc) < BTH_LEN + ICRC_LEN:
        return False
    body = transport_with_icrc[:-ICRC_LEN]
    return icrc(ip_header, sport, dport, body) == transport_with_icrc[-ICRC_LEN:]


def _icrc_for_layer(bth: BTH, transport: bytes) -> bytes:
    udp = bth.underlayer
    while udp is not None and not isinstance(udp, UDP):
        udp = udp.underlayer
    if udp is None or not isinstance(udp.underlayer, IP):
        return b"\x00" * ICRC_LEN
    ip = udp.underlayer.copy()
    ip.remove_payload()
    ip.len = None
    ip.proto = 17  # scapy derives it from the payload, which the copy no longer has
    ip_header = bytes(ip)
    return icrc(ip_header, udp.sport, udp.dport, transport)
