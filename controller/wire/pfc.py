"""IEEE 802.1Qbb Priority-based Flow Control (PFC) pause frames (docs/wire-format.md).

The one declaration of the frame in the project: the built-in switch's traffic manager sends
and honours it, the twin's NICs honour and (in a storm) send it, and the NIC's XDP program
reads it (ebpf/xingmai.h's XM_ETH_P_MAC_CONTROL and XM_PFC_OPCODE, held against these values
by tests/test_wire_sources.py).

A PFC frame is a MAC Control frame (EtherType 0x8808) to the reserved multicast address
01:80:C2:00:00:01, opcode 0x0101, then a 16-bit class-enable vector (bit i: priority i; the
high byte is reserved, zero) and eight 16-bit pause times, priority 0 first, each in quanta
of 512 bit times at the link's speed; padded to the 60-byte minimum frame (before the FCS).
A time of 0 on an enabled priority resumes it at once (XON).
"""

from __future__ import annotations

from typing import NamedTuple

from controller.wire.layout import Fields, byte_size, pack, unpack

ETH_P_MAC_CONTROL = 0x8808
PFC_OPCODE = 0x0101
PFC_DST_MAC = bytes.fromhex("0180c2000001")
PRIORITIES = 8
QUANTUM_BITS = 512  # one pause quantum: 512 bit times at the link's speed
MAX_QUANTA = 0xFFFF
MIN_FRAME = 60  # Ethernet's minimum frame without its FCS: the pause is padded to it

PFC_FIELDS: Fields = (
    ("opcode", 16),
    ("reserved", 8),
    ("class_enable", 8),
    *((f"quanta{i}", 16) for i in range(PRIORITIES)),
)
PFC_BYTES = byte_size(PFC_FIELDS)  # 20: after the Ethernet header
ETH_HEADER = 14


class PfcPause(NamedTuple):
    """A decoded pause: which priorities it names and the quanta of each (0 on the others)."""

    class_enable: int
    quanta: tuple[int, ...]

    def priorities(self) -> list[int]:
        return [p for p in range(PRIORITIES) if self.class_enable >> p & 1]


def pause_ns(quanta: int, link_bps: float) -> int:
    """How long `quanta` pause a link of `link_bps` (b/s, taken as a whole number), in whole
    ns, rounded down: the NIC's XDP computes it so in 64-bit integers (ebpf/lib/pfc.h)."""
    rate = round(link_bps)
    if rate <= 0:
        raise ValueError(f"a pause needs the link's speed, got {link_bps}")
    return quanta * QUANTUM_BITS * 1_000_000_000 // rate


def pfc_frame(src_mac: bytes, quanta: dict[int, int]) -> bytes:
    """The PFC frame that pauses each priority in `quanta` for its time (0: resume it)."""
    if len(src_mac) != 6:
        raise ValueError(f"a MAC address is 6 bytes, got {len(src_mac)}")
    values = {"opcode": PFC_OPCODE, "class_enable": 0}
    for prio, q in quanta.items():
        if not 0 <= prio < PRIORITIES:
            raise ValueError(f"priority {prio} is not in [0, {PRIORITIES - 1}]")
        if not 0 <= q <= MAX_QUANTA:
            raise ValueError(f"quanta {q} not in [0, {MAX_QUANTA}]")
        values["class_enable"] |= 1 << prio
        values[f"quanta{prio}"] = q
    frame = PFC_DST_MAC + src_mac + ETH_P_MAC_CONTROL.to_bytes(2, "big") + pack(PFC_FIELDS, values)
    return frame + bytes(MIN_FRAME - len(frame))


_MAC_CONTROL_TYPE = ETH_P_MAC_CONTROL.to_bytes(2, "big")


def is_mac_control(frame: bytes | bytearray | memoryview) -> bool:
    """Whether a frame is a MAC Control frame (consumed by the MAC, never forwarded)."""
    return frame[12:14] == _MAC_CONTROL_TYPE and len(frame) >= ETH_HEADER


def decode_pfc(frame: bytes | bytearray | memoryview) -> PfcPause:
    """The pause a MAC Control frame carries; ValueError when it is not a well-formed PFC
    frame (short, another opcode such as 802.3x PAUSE 0x0001, reserved bits set)."""
    if not is_mac_control(frame):
        raise ValueError("not a MAC Control frame (EtherType 0x8808)")
    f = unpack(PFC_FIELDS, frame, ETH_HEADER)
    if f["opcode"] != PFC_OPCODE:
        raise ValueError(f"MAC Control opcode {f['opcode']:#06x} is not PFC ({PFC_OPCODE:#06x})")
    if f["reserved"]:
        raise ValueError("PFC class-enable vector has reserved bits set")
    return PfcPause(f["class_enable"], tuple(f[f"quanta{i}"] for i in range(PRIORITIES)))
