"""IPv4 as the project builds it in Python, once: the header checksum (RFC 791, RFC 1071) and
the IPv4/UDP encapsulation of the datagrams the NICs and switches originate (Telemetry
Reports to the collector)."""

from __future__ import annotations

import struct

ETHERTYPE_IPV4 = b"\x08\x00"


ECT0 = 0b10  # the ECN field of an ECN-capable packet (RFC 3168: ECT(0))


def checksum(data: bytes | bytearray) -> int:
    """RFC 1071's ones' complement checksum of `data` (padded to whole 16-bit words).

    The ones' complement sum of 16-bit words is the big-endian number they form taken modulo
    0xFFFF (2**16 = 1 mod 0xFFFF), with 0xFFFF instead of 0 for a non-zero input; one bignum
    modulo is much faster in Python than a loop over words.
    """
    if len(data) % 2:
        data = bytes(data) + b"\x00"
    n = int.from_bytes(data, "big")
    r = n % 0xFFFF
    if r == 0 and n:
        r = 0xFFFF
    return ~r & 0xFFFF


def with_checksum(pkt: bytes) -> bytes:
    """The IPv4 packet with its header checksum filled in (the kernel's job for IP_HDRINCL)."""
    ihl = (pkt[0] & 0x0F) * 4
    hdr = bytearray(pkt[:ihl])
    hdr[10:12] = b"\x00\x00"
    hdr[10:12] = checksum(hdr).to_bytes(2, "big")
    return bytes(hdr) + pkt[ihl:]


def udp_packet(src: bytes, dst: bytes, sport: int, dport: int, payload: bytes) -> bytes:
    """An IPv4/UDP packet (addresses as 4 bytes; don't fragment, TTL 64, no UDP checksum, as
    RFC 768 allows over IPv4) with its header checksum."""
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + len(payload), 0, 0x4000, 64, 17, 0, src, dst)
    return with_checksum(ip + udp + payload)
