"""The emulation's stamp (docs/wire-format.md): on a link between two built-in switches
(testbed/switch/dataplane.py's stamped `Wire`) a frame leaves at once and carries after its
bytes the time it is due whole at the far end, which holds it until then:

    due (64 bits, CLOCK_MONOTONIC ns: every switch process of the machine shares the clock) |
    magic 0x584D4454 ("XMDT")

both big-endian. It is the emulation's framing, never the model's traffic. The switch's C
(testbed/switch/native/hop.py) writes and reads the same bytes from these constants.
"""

from __future__ import annotations

import struct

from controller.wire.pfc import ETH_HEADER

STAMP = struct.Struct("!QI")
STAMP_MAGIC = 0x584D4454  # "XMDT"


def stamp(frame: bytes, due_ns: int) -> bytes:
    """The frame as a stamped wire carries it: its due (CLOCK_MONOTONIC ns) after its bytes."""
    return frame + STAMP.pack(due_ns, STAMP_MAGIC)


def unstamp(frame: bytes) -> tuple[bytes, int] | None:
    """A stamped wire's frame: its bytes and the due it carries; None: it carries none."""
    if len(frame) < ETH_HEADER + STAMP.size:  # an Ethernet header and its stamp at least
        return None
    due, magic = STAMP.unpack_from(frame, len(frame) - STAMP.size)
    if magic != STAMP_MAGIC:
        return None
    return frame[: -STAMP.size], due
