"""scapy layers of the RoCEv2 headers (BTH, AETH, CNP), made from controller/wire/roce.py.

UDP destination port 4791 is bound to `BTH`. A data packet carrying INT (signalled by the DSCP,
not the port) has the INT shim between UDP and BTH: `BTH.dispatch_hook` hands such packets to
`IntShim` when the IPv4 DSCP equals the INT DSCP in force (see `testbed.packets.int_md.decode`),
and an ACK's AETH is followed by the INT echo when its bytes look like one. The plain byte
codecs of the same headers are controller.wire.roce's; tests/test_packets.py checks that both
agree byte for byte.
"""

from __future__ import annotations

from typing import Any

from scapy.fields import ByteEnumField, FCSField, StrFixedLenField
from scapy.layers.inet import IP, UDP
from scapy.packet import Packet, Raw, bind_layers

from controller.wire.int_md import looks_like_int_echo
from controller.wire.roce import (
    AETH_ACK,
    AETH_FIELDS,
    AETH_NAK_PSN_SEQ_ERR_SACK,
    BTH_FIELDS,
    CNP_LEN,
    DEFAULT_PKEY,
    ICRC_LEN,
    OP_ACK,
    OP_CNP,
    OP_SEND_ONLY,
    OPCODE_NAMES,
    ROCE_UDP_PORT,
    SACK_FIELDS,
    icrc,
)
from testbed.packets.int_md import INT_PAYLOAD_BY_PORT, IntShim, current_int_dscp
from testbed.packets.layout import scapy_fields


class BTH(Packet):
    """InfiniBand Base Transport Header (12 B), plus the packet's trailing ICRC.

    The ICRC is the last 4 bytes of the *packet* (scapy trailer field): left at None it is
    computed on build from the IPv4/UDP underlayers (0 when there are none).
    """

    name = "BTH"
    fields_desc = [
        *scapy_fields(
            BTH_FIELDS,
            {"opcode": OP_SEND_ONLY, "pkey": DEFAULT_PKEY},
            hex_fields=frozenset({"pkey"}),
            special={"opcode": lambda n, d, _w: ByteEnumField(n, d, OPCODE_NAMES)},
        ),
        FCSField("icrc", None, fmt="<I"),
    ]

    @classmethod
    def dispatch_hook(cls, _pkt: bytes | None = None, *args: Any, **kargs: Any) -> type[Packet]:
        # INT presence is a property of the IPv4 header (DSCP), which this layer can only see
        # through the underlayer scapy passes while dissecting.
        under = kargs.get("_underlayer")
        if _pkt is not None and isinstance(under, UDP) and isinstance(under.underlayer, IP):
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
    fields_desc = scapy_fields(
        AETH_FIELDS, {"syndrome": AETH_ACK}, hex_fields=frozenset({"syndrome"})
    )

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        # The ICRC has already been taken off the end by BTH's trailer field.
        if self.syndrome == AETH_NAK_PSN_SEQ_ERR_SACK:
            return SACK
        if looks_like_int_echo(payload):
            return IntShim
        return Raw


class SACK(Packet):
    """The SACK header (4 B) after a selective NAK's AETH: the out-of-order PSN the receiver
    kept (controller.wire.roce.AETH_NAK_PSN_SEQ_ERR_SACK)."""

    name = "SACK"
    fields_desc = scapy_fields(SACK_FIELDS, {})


class CNP(Packet):
    """Congestion Notification Packet payload: 16 reserved bytes after a BTH with opcode 0x81."""

    name = "CNP"
    fields_desc = [StrFixedLenField("reserved", b"\x00" * CNP_LEN, CNP_LEN)]


bind_layers(UDP, BTH, dport=ROCE_UDP_PORT)
# AETH → IntShim (echo) is decided in AETH.guess_payload_class; declared for scapy's layer graph
# and for building AETH()/IntShim() without an explicit binding.
bind_layers(AETH, IntShim)
bind_layers(AETH, SACK, syndrome=AETH_NAK_PSN_SEQ_ERR_SACK)
INT_PAYLOAD_BY_PORT[ROCE_UDP_PORT] = BTH


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
