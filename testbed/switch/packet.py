"""Per-packet state of the built-in switch and the helpers the generated pipeline code calls.

A packet's header vector is kept as plain Python lists so that the code generated from the bmv2
JSON can index it directly: `h[header_id][field_index]` for field values and `v[header_id]`
for validity. Metadata headers are always valid. Arithmetic follows bmv2: expressions are
computed with unbounded integers and truncated (two's complement) only when stored in a field.
"""

from __future__ import annotations

# Instance types of v1model's standard_metadata.instance_type (simple_switch.h).
PKT_INSTANCE_TYPE_NORMAL = 0
PKT_INSTANCE_TYPE_INGRESS_CLONE = 1
PKT_INSTANCE_TYPE_EGRESS_CLONE = 2
PKT_INSTANCE_TYPE_COALESCED = 3
PKT_INSTANCE_TYPE_RECIRC = 4
PKT_INSTANCE_TYPE_REPLICATION = 5
PKT_INSTANCE_TYPE_RESUBMIT = 6

# standard_metadata fields the architecture reads or writes, with their v1model widths.
STD_FIELDS = {
    "ingress_port": 9,
    "egress_spec": 9,
    "egress_port": 9,
    "instance_type": 32,
    "packet_length": 32,
    "enq_timestamp": 32,
    "enq_qdepth": 19,
    "deq_timedelta": 32,
    "deq_qdepth": 19,
    "ingress_global_timestamp": 48,
    "egress_global_timestamp": 48,
    "mcast_grp": 16,
    "egress_rid": 16,
    "checksum_error": 1,
    "parser_error": 32,
    "priority": 3,
    "qid": 8,
}

# v1model's clocks (the global timestamps, enq_timestamp, deq_timedelta) count microseconds,
# as bmv2's simple_switch does; the program turns them into ns (xingmai.p4: x 1000), so a switch
# running it sees time in steps of this many ns whatever the link speed.
CLOCK_NS = 1000

# bmv2's core parser errors, used when the JSON does not declare them.
CORE_ERRORS = (
    "NoError",
    "PacketTooShort",
    "NoMatch",
    "StackOutOfBounds",
    "HeaderTooShort",
    "ParserTimeout",
    "ParserInvalidArgument",
)


class ParserError(Exception):
    """Raised by generated parser code; `pos` is where the failing operation started."""

    def __init__(self, code: int, pos: int):
        super().__init__(code, pos)
        self.code = code
        self.pos = pos


class PipelineAbort(Exception):
    """A packet the pipeline cannot continue with (assert/assume failure, bad stack index...).

    bmv2 aborts the whole process in these cases; the built-in switch drops the packet, counts
    it and keeps running.
    """


class Packet:
    """One packet in flight: header vector, unparsed payload, and v1model per-packet registers."""

    __slots__ = (
        "h",
        "v",
        "sn",
        "vlw",
        "payload",
        "exit",
        "ingress_len",
        "plen",
        "clone_session",
        "clone_field_list",
        "resubmit_fl",
        "recirc_fl",
        "learn_id",
        "truncate_len",
        "uid",
        "reinjects",
        "t_ns",
    )

    def __init__(self, h: list[list[int]], v: list[bool], sn: list[int]):
        self.h = h
        self.v = v
        self.sn = sn  # next index of each header stack / header union stack
        self.vlw: dict[int, int] = {}  # bit width of the variable-length field, per header id
        self.payload = b""
        self.exit = False
        self.ingress_len = 0
        self.plen = 0  # packet length register, updated by add_header / remove_header
        self.clear_registers()
        self.uid = 0
        self.reinjects = 0  # resubmit / recirculate generations, bounded by the switch
        self.t_ns = 0  # the switch's time for this packet: arrival, then departure

    def clear_registers(self) -> None:
        self.clone_session = -1
        self.clone_field_list = 0
        self.resubmit_fl = 0
        self.recirc_fl = 0
        self.learn_id = 0
        self.truncate_len = -1

    def copy(self) -> Packet:
        """A full copy (header vector included), as bmv2's clone_with_phv."""
        p = Packet([list(f) for f in self.h], list(self.v), list(self.sn))
        p.vlw = dict(self.vlw)
        p.payload = self.payload
        p.ingress_len = self.ingress_len
        p.plen = self.plen
        p.truncate_len = self.truncate_len
        p.uid = self.uid
        p.reinjects = self.reinjects
        p.t_ns = self.t_ns
        return p


# ---- arithmetic helpers (bmv2 Data semantics) -------------------------------------------------


def two_comp_mod(value: int, width: int) -> int:
    """Signed value of `value` seen as a `width`-bit two's complement number."""
    if width <= 0:
        return 0
    value &= (1 << width) - 1
    return value - (1 << width) if value >> (width - 1) else value


def usat_cast(value: int, width: int) -> int:
    hi = (1 << width) - 1
    return 0 if value < 0 else hi if value > hi else value


def sat_cast(value: int, width: int) -> int:
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    return lo if value < lo else hi if value > hi else value


def div_trunc(a: int, b: int) -> int:
    if b == 0:
        raise PipelineAbort("division by zero")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def mod_trunc(a: int, b: int) -> int:
    if b == 0:
        raise PipelineAbort("modulo by zero")
    return a - b * div_trunc(a, b)
