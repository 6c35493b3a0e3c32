"""scapy layers of INT-MD v2.1 over UDP, made from controller/wire/int_md.py's tables.

Layers: `IntShim` (4 B) / `IntMD` (12 B header + metadata stack of `IntHop`s, newest first) /
the original UDP payload. A hop record's fields depend on the instruction bitmap, so the hop
layers are classes made per (bitmap, Hop ML) by `int_hop_class()`.

INT presence is signalled by the IPv4 DSCP (0x17 by default), not by a UDP port, so it cannot be
a static scapy binding: `decode(frame, int_dscp=...)` dissects a frame with a given INT DSCP
(None = no INT), and plain `Ether(frame)` uses the default DSCP `INT_DSCP_DEFAULT`. What follows
the stack on a data packet is found by UDP destination port in `INT_PAYLOAD_BY_PORT`, which the
transport's layers fill (testbed/packets/roce.py), so this module does not import them.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from scapy.fields import ByteField, Field, PacketListField, StrFixedLenField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw

from controller.wire.int_md import (
    HOP_METADATA,
    INT_DSCP_DEFAULT,
    INT_TYPE_MD,
    INT_VERSION,
    MD_FIELDS,
    MD_LEN,
    SHIM_FIELDS,
    decode_stack,
    encode_stack,
    hop_ml_words,
    metadata_len,
    set_bits,
)
from controller.wire.roce import ROCE_UDP_PORT
from testbed.packets.layout import scapy_fields

# The layer of the original UDP payload after an INT stack, by UDP destination port.
INT_PAYLOAD_BY_PORT: dict[int, type[Packet]] = {}

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


class IntShim(Packet):
    """INT shim for TCP/UDP (4 B). `length` (MD header + stack, in words) is computed if None."""

    name = "INT shim"
    fields_desc = scapy_fields(
        SHIM_FIELDS,
        {"type": INT_TYPE_MD, "length": None},
        special={"length": lambda n, d, _w: ByteField(n, d)},
    )

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
    for bit in set_bits(bitmap):
        fields += scapy_fields(HOP_METADATA[bit])
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
        *scapy_fields(
            MD_FIELDS,
            {"ver": INT_VERSION, "hop_ml": None, "remaining_hop_cnt": 8},
            hex_fields=frozenset({"instruction_bitmap", "ds_instruction", "ds_flags"}),
        ),
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
        # payload follows (on the RoCE port, the BTH).
        if isinstance(shim, IntShim) and isinstance(shim.underlayer, UDP):
            return INT_PAYLOAD_BY_PORT.get(shim.underlayer.dport, Raw)
        return Raw


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
