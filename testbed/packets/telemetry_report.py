"""scapy layers of Telemetry Report v2.0, made from controller/wire/telemetry_report.py."""

from __future__ import annotations

from typing import Any

from scapy.fields import ByteField, StrLenField
from scapy.layers.inet import IP, UDP
from scapy.packet import Packet, Raw, bind_layers

from controller.wire.int_md import INT_DSCP_DEFAULT
from controller.wire.telemetry_report import (
    GROUP_FIELDS,
    IN_TYPE_IPV4,
    INDIVIDUAL_FIELDS,
    INDIVIDUAL_LEN,
    REPORT_LEN_TO_END,
    REPORT_TYPE_INT,
    REPORT_VERSION,
    TELEMETRY_REPORT_PORT,
    decode_report_metadata,
)
from testbed.packets.int_md import decode
from testbed.packets.layout import scapy_fields


class TelemetryReportGroup(Packet):
    """Telemetry Report v2.0 group header (8 B); individual reports follow."""

    name = "Telemetry Report group"
    fields_desc = scapy_fields(
        GROUP_FIELDS, {"ver": REPORT_VERSION}, hex_fields=frozenset({"node_id"})
    )

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return TelemetryReportIndividual


def _inner_len(rep: Packet) -> int:
    if rep.report_len == REPORT_LEN_TO_END:
        return 1 << 16  # more than any UDP payload: the rest of it
    return max(0, ((rep.report_len or 0) - 2) * 4 - (rep.md_len or 0) * 4)


def _byte(name: str, default: Any, _width: int) -> ByteField:
    return ByteField(name, default)


class TelemetryReportIndividual(Packet):
    """One individual report (RepType INT): header, own metadata, inner packet (from IPv4).

    `report_len` and `md_len` are computed if None (the inner packet is padded to whole words).
    """

    name = "Telemetry Report individual"
    fields_desc = [
        *scapy_fields(
            INDIVIDUAL_FIELDS,
            {
                "rep_type": REPORT_TYPE_INT,
                "in_type": IN_TYPE_IPV4,
                "report_len": None,
                "md_len": None,
            },
            hex_fields=frozenset({"rep_md_bits", "ds_md_bits", "ds_md_status"}),
            special={"report_len": _byte, "md_len": _byte},
        ),
        StrLenField("metadata", b"", length_from=lambda p: (p.md_len or 0) * 4),
        StrLenField("inner", b"", length_from=_inner_len),
    ]

    def post_build(self, p: bytes, pay: bytes) -> bytes:
        md = len(self.metadata)
        inner = len(self.inner)
        pad = (-inner) % 4
        p += b"\x00" * pad
        if self.md_len is None:
            p = p[:2] + bytes([md // 4]) + p[3:]
        if self.report_len is None:
            words = (INDIVIDUAL_LEN - 4 + md + inner + pad) // 4
            p = p[:1] + bytes([min(words, REPORT_LEN_TO_END)]) + p[2:]
        return p + pay

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return TelemetryReportIndividual if payload else Raw

    def metadata_dict(self) -> dict[str, int | None]:
        return decode_report_metadata(self.rep_md_bits, self.metadata)

    def inner_packet(self, int_dscp: int | None = INT_DSCP_DEFAULT) -> Packet:
        """The inner packet decoded from its IPv4 header (INT parsed per `int_dscp`)."""
        if self.in_type != IN_TYPE_IPV4:
            return Raw(self.inner)
        return decode(self.inner, int_dscp, first=IP)


bind_layers(UDP, TelemetryReportGroup, dport=TELEMETRY_REPORT_PORT)


def parse_report(data: bytes, int_dscp: int | None = INT_DSCP_DEFAULT) -> dict[str, Any]:
    """A Telemetry Report (UDP payload) as dicts: group fields and each individual report."""
    grp = TelemetryReportGroup(data)
    reports = []
    rep = grp.payload
    while isinstance(rep, TelemetryReportIndividual):
        reports.append(
            {
                "rep_type": rep.rep_type,
                "in_type": rep.in_type,
                "report_len_words": rep.report_len,
                "md_len_words": rep.md_len,
                "D": rep.d,
                "Q": rep.q,
                "F": rep.f,
                "I": rep.i,
                "rep_md_bits": rep.rep_md_bits,
                "domain_id": rep.domain_id,
                "ds_md_bits": rep.ds_md_bits,
                "ds_md_status": rep.ds_md_status,
                "metadata": rep.metadata,
                "inner": rep.inner,
            }
        )
        rep = rep.payload
    return {
        "ver": grp.ver,
        "hw_id": grp.hw_id,
        "seq": grp.seq,
        "node_id": grp.node_id,
        "reports": reports,
    }
