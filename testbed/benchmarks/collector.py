"""The collector's decoding rate: the hand-written Telemetry Report decoder against the
project's scapy layers, on the same reports (3 INT hops, bitmap 0xF500), and the full
collector path (decode + sequence accounting + link and flow series) in process and over a
loopback UDP socket.

Figures are reports per second on one core, measured back to back in one run; the ratio is
the robust figure on a noisy machine.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

from scapy.layers.inet import IP

from controller.collector import Collector, serve_udp
from controller.wire.telemetry_report import decode, encode_report_metadata
from testbed.packets import (
    TelemetryReportGroup,
    TelemetryReportIndividual,
    int_packet,
    parse_int,
    parse_report,
)
from testbed.packets import decode as scapy_decode


def make_reports(n: int) -> list[bytes]:
    hops = [
        {
            "node_id": node,
            "l1_ingress_port": 1,
            "l1_egress_port": 2,
            "hop_latency": 1000,
            "queue_id": 0,
            "queue_occupancy": 1500 * node,
            "egress_ts": 10**6 + node,
            "tx_util": 500_000,
        }
        for node in (3, 2, 1)
    ]
    md = encode_report_metadata(
        0x7000,
        {
            "l1_ingress_port": 5,
            "l1_egress_port": 1,
            "hop_latency": 500,
            "queue_id": 0,
            "queue_occupancy": 0,
        },
    )
    out = []
    for i in range(n):
        inner = int_packet(
            src_ip="10.0.1.1",
            dst_ip="10.0.2.1",
            sport=49152 + i % 64,
            hops=hops,
            bitmap=0xF500,
            payload=b"\x04" + b"\x00" * 15,
        )[IP]
        out.append(
            bytes(
                TelemetryReportGroup(seq=i + 1, node_id=4)
                / TelemetryReportIndividual(rep_md_bits=0x7000, metadata=md, inner=bytes(inner))
            )
        )
    return out


def _rate(fn: Any, items: list[bytes], min_s: float) -> float:
    done = 0
    t0 = time.perf_counter()
    while True:
        for it in items:
            fn(it)
        done += len(items)
        el = time.perf_counter() - t0
        if el >= min_s:
            return done / el


def scapy_full(data: bytes) -> None:
    """What the collector needs, the scapy way: group, report, inner packet, INT hops."""
    rep = parse_report(data)
    for r in rep["reports"]:
        parse_int(scapy_decode(r["inner"], first=IP))


async def _udp_rate(reports: list[bytes], count: int) -> dict[str, Any]:
    """Closed loop over loopback: a burst of reports, wait until the server took them, repeat
    (one process plays both sides, so an open-loop sender would only measure its own speed)."""
    col = Collector(None)
    transport = await serve_udp(col, "127.0.0.1:0")
    port = transport.get_extra_info("sockname")[1]
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    burst = 128
    t0 = time.perf_counter()
    sent = 0
    while sent < count:
        for r in reports[:burst]:
            tx.sendto(r, ("127.0.0.1", port))
        sent += min(burst, len(reports))
        deadline = time.perf_counter() + 1.0
        while col.datagrams < sent and time.perf_counter() < deadline:
            await asyncio.sleep(0)
    el = time.perf_counter() - t0
    transport.close()
    tx.close()
    return {
        "sent": sent,
        "received": col.datagrams,
        "reports_per_s": round(col.datagrams / el),
        "kernel_drops": sent - col.datagrams,
    }


def run(quick: bool) -> dict[str, Any]:
    reports = make_reports(64)
    min_s = 0.5 if quick else 2.0
    assert decode(reports[0]).reports[0].hops[0].node_id == 3
    fast = _rate(decode, reports, min_s)
    slow = _rate(scapy_full, reports, min_s / 2)
    col = Collector(None)
    ingest = _rate(col.ingest, reports, min_s)
    udp = asyncio.run(_udp_rate(reports, 20_000 if quick else 100_000))
    return {
        "conditions": {
            "report_bytes": len(reports[0]),
            "hops": 3,
            "bitmap": "0xF500",
            "load_avg_before": os.getloadavg()[0],
        },
        "fast_decoder_reports_per_s": round(fast),
        "scapy_reports_per_s": round(slow),
        "speedup_fast_over_scapy": round(fast / slow, 1),
        "collector_ingest_reports_per_s": round(ingest),
        "udp_loopback": udp,
    }
