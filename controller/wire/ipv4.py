"""The IPv4 header checksum (RFC 791, RFC 1071), once: the NICs' and switches' packets the
project builds in Python carry it."""

from __future__ import annotations

ETHERTYPE_IPV4 = b"\x08\x00"


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
