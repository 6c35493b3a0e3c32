"""The active prober's packets (docs/wire-format.md, controller/nic/prober.py).

A probe is a RoCEv2 RC SEND_ONLY to the probe queue pair `PROBE_QPN` of the peer's NIC, as
R-Pingmesh probes RDMA NICs with their own traffic class rather than ICMP: the same UDP port
(4791), so ECMP hashes it like the data (a probe's source port picks its path), and a data
opcode, so the sending NIC's INT source gives it an INT stack and the receiver learns the path
it took. Its payload after the BTH:

    magic "XP" | version 1 | kind (0: probe) | sequence number (32 bits, +1 per probe of
    the same source port) | send time (64 bits, ns on the sender's clock)

The receiver counts a probe flow's lost probes from the sequence numbers: no probe is resent.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

PROBE_QPN = 0xFFFFFE  # beyond any job's queue pair (testbed/traffic/queue_pairs.py)
PROBE_MAGIC = b"XP"
PROBE_VERSION = 1
KIND_PROBE = 0
_PAYLOAD = struct.Struct("!2sBBIQ")
PAYLOAD_LEN = _PAYLOAD.size
SEQ_MOD = 1 << 32


class ProbePayload(NamedTuple):
    kind: int
    seq: int
    sent_ns: int


def encode(seq: int, sent_ns: int, kind: int = KIND_PROBE) -> bytes:
    return _PAYLOAD.pack(PROBE_MAGIC, PROBE_VERSION, kind, seq % SEQ_MOD, sent_ns & ((1 << 64) - 1))


def decode(payload: bytes | memoryview) -> ProbePayload | None:
    """The probe in a SEND_ONLY's payload; None when it is not one of this version."""
    if len(payload) < PAYLOAD_LEN:
        return None
    magic, version, kind, seq, sent_ns = _PAYLOAD.unpack_from(payload, 0)
    if magic != PROBE_MAGIC or version != PROBE_VERSION:
        return None
    return ProbePayload(kind, seq, sent_ns)
