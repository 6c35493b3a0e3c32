"""scapy layers and byte codecs shared by every component (docs/wire-format.md).

Importing this package registers the layers with scapy: UDP 4791 → BTH (→ INT shim when the
IPv4 DSCP is the INT DSCP), UDP 32766 → Telemetry Report.
"""

from testbed.packets.int_md import (
    INT_DSCP_DEFAULT,
    IntHop,
    IntMD,
    IntShim,
    TelemetryReportGroup,
    TelemetryReportIndividual,
    decode,
    decode_stack,
    encode_stack,
    int_hop_class,
    int_packet,
    parse_int,
    parse_report,
)
from testbed.packets.roce import AETH, BTH, CNP, ROCE_UDP_PORT, icrc, verify_icrc

__all__ = [
    "AETH",
    "BTH",
    "CNP",
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
