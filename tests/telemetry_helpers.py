"""Telemetry Reports as a sink switch sends them (scapy layers), and the example fabric they fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scapy.layers.inet import IP

from controller.wire.telemetry_report import encode_report_metadata
from testbed.packets import TelemetryReportGroup, TelemetryReportIndividual, int_packet

EXAMPLE = Path(__file__).parents[1] / "controller" / "examples" / "leafspine-2x2.yaml"
BITMAP = 0xF500


def hop(
    node: int,
    inp: int,
    outp: int,
    qocc: int = 0,
    lat: int = 1000,
    util: int | None = 0,
    ts: int = 1_000_000,
) -> dict[str, Any]:
    return {
        "node_id": node,
        "l1_ingress_port": inp,
        "l1_egress_port": outp,
        "hop_latency": lat,
        "queue_id": 0,
        "queue_occupancy": qocc,
        "egress_ts": ts,
        "tx_util": util,
    }


def report(
    seq: int,
    node: int,
    hops: list[dict[str, Any]],
    *,
    src: str = "10.0.1.1",
    dst: str = "10.0.2.1",
    sport: int = 49152,
    sink_in: int = 5,
    sink_out: int = 1,
    sink_qocc: int = 0,
    hw_id: int = 0,
) -> bytes:
    """A Telemetry Report as a sink switch would send it (scapy layers)."""
    inner = int_packet(
        src_ip=src,
        dst_ip=dst,
        sport=sport,
        hops=hops,
        bitmap=BITMAP,
        payload=b"\x04" + b"\x00" * 15,
    )[IP]
    md = encode_report_metadata(
        0x7000,
        {
            "l1_ingress_port": sink_in,
            "l1_egress_port": sink_out,
            "hop_latency": 500,
            "queue_id": 0,
            "queue_occupancy": sink_qocc,
        },
    )
    return bytes(
        TelemetryReportGroup(seq=seq, node_id=node, hw_id=hw_id)
        / TelemetryReportIndividual(rep_md_bits=0x7000, metadata=md, inner=bytes(inner))
    )
