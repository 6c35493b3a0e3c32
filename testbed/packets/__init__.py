"""scapy layers of the project's wire formats, made from the tables of controller/wire.

Importing this package registers the layers with scapy: UDP 4791 → BTH (→ INT shim when the
IPv4 DSCP is the INT DSCP), UDP 32766 → Telemetry Report. The byte codecs without scapy
(stacks, report metadata, BTH/AETH, ICRC) are controller.wire's.
"""

from controller.wire.int_md import INT_DSCP_DEFAULT, decode_stack, encode_stack
from controller.wire.roce import ROCE_UDP_PORT, icrc, verify_icrc
from testbed.packets.int_md import (
    IntHop,
    IntMD,
    IntShim,
    decode,
    int_hop_class,
    int_packet,
    parse_int,
)
from testbed.packets.roce import AETH, BTH, CNP, SACK
from testbed.packets.telemetry_report import (
    TelemetryReportGroup,
    TelemetryReportIndividual,
    parse_report,
)

__all__ = [
    "AETH",
    "BTH",
    "CNP",
    "SACK",
    "INT_DSCP_DEFAULT",
    "ROCE_UDP_PORT",
    "IntHop",
    "IntMD",
    "IntShim",
    "TelemetryReportGroup",
    "TelemetryReportIndividual",
    "decode",
    "decode_stack",
    "encode_stack",
    "icrc",
    "int_hop_class",
    "int_packet",
    "parse_int",
    "parse_report",
    "verify_icrc",
]
