"""The built-in switch's drop reports: Telemetry Report v2.0 with the D flag for the packets
its traffic manager drops (a full egress queue, an egress port that is down), sent to the
collector the P4 program reports to.

The P4 program's sink reports what it sees; drops in the traffic manager happen below it, so
the target reports them, as a switch ASIC's drop reporting does (the program's
`report_collector` default action holds the collector's and this switch's addresses, its
`switch_config` the node id; the report leaves by the report clone session's port). Reports
use their own hardware id (`HW_ID_TM`), so their sequence numbers are a stream of their own at
the collector. A port reports at most one drop per reason every `REPORT_GAP_BYTES` at its
rate, 8 frames of 1500 bytes (an incast drops thousands of frames a second: the first of a
burst says where); the traffic manager keeps that pacing (`report_held`), in C on the native
one, so a drop held back costs no Python.
Frames that arrive corrupted are not reported: their headers cannot be trusted (the port's
receive-error counter counts them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controller.program import REPORT_CLONE_SESSION
from controller.wire.int_md import (
    BIT_L1_PORTS,
    BIT_QUEUE,
    INT_DSCP_DEFAULT,
    bitmap_bit,
    shim_total_len,
)
from controller.wire.ipv4 import ETHERTYPE_IPV4, udp_packet
from controller.wire.telemetry_report import (
    DROP_REASON_TM_PORT_DOWN,
    DROP_REASON_TM_QUEUE_FULL,
    SEQ_BITS,
    TELEMETRY_REPORT_PORT,
    encode_report,
)

if TYPE_CHECKING:
    from testbed.switch.v1model import V1Switch

HW_ID_TM = 63  # the traffic manager's report stream (the P4 sink's is the configured hw id)
REPORT_GAP_BYTES = 8 * 1500  # 8 frame times at the port's rate (a bound, not a size)
INNER_PAYLOAD_BYTES = 16
REP_MD = bitmap_bit(BIT_L1_PORTS) | bitmap_bit(BIT_QUEUE) | bitmap_bit(15)


class DropReporter:
    def __init__(self, sw: V1Switch):
        self.sw = sw
        self.seq = 0
        self.sent = 0
        self.unconfigured = 0  # drops with no collector configured

    @property
    def suppressed(self) -> int:
        """Drops not reported, within the gap after one that was (`report_held`)."""
        return self.sw.tm.reports_held

    def _config(self) -> tuple[tuple[int, ...], int, int] | None:
        """(collector action params, node id, report port), or None: no collector."""
        c = self.sw.compiled
        if c is None:
            return None
        collector = node = None
        for name, t in c.tables.items():
            if name.endswith(".report_collector") and t.default is not None:
                collector = t.default.params
            elif name.endswith(".switch_config") and t.default is not None:
                node = t.default.params
        session = self.sw.clone_sessions.get(REPORT_CLONE_SESSION)
        if collector is None or len(collector) != 5 or not node or session is None:
            return None
        if session.port is None:
            return None
        return collector, node[0], session.port

    def dropped(
        self, in_port: int, out_port: int, reason: int, frame: bytes, qocc: int, now_ns: int
    ) -> None:
        """The traffic manager dropped `frame` (an Ethernet frame, as the pipeline left it),
        outside the gap after the last drop reported for the port and reason (the caller asks
        the traffic manager's `report_held` first)."""
        cfg = self._config()
        if cfg is None:
            self.unconfigured += 1
            return
        (src_mac, dst_mac, src_ip, dst_ip, dport), node_id, report_port = cfg
        inner = _inner(frame)
        if inner is None:
            return
        self.sw.tm.drop_reported(out_port, reason, now_ns)
        payload = encode_report(
            hw_id=HW_ID_TM,
            seq=self.seq,
            node_id=node_id,
            inner=inner,
            rep_md_bits=REP_MD,
            metadata={
                "l1_ingress_port": in_port & 0xFFFF,
                "l1_egress_port": out_port & 0xFFFF,
                "queue_id": 0,
                "queue_occupancy": min(qocc, (1 << 24) - 1),
                "drop_queue_id": 0,
                "drop_reason": reason,
                "drop_padding": 0,
            },
            dropped=True,
        )
        self.seq = (self.seq + 1) % (1 << SEQ_BITS)
        ip = udp_packet(
            src_ip.to_bytes(4, "big"),
            dst_ip.to_bytes(4, "big"),
            TELEMETRY_REPORT_PORT,
            dport,
            payload,
        )
        eth = dst_mac.to_bytes(6, "big") + src_mac.to_bytes(6, "big") + ETHERTYPE_IPV4
        self.sent += 1
        self.sw.transmit(report_port, eth + ip)


DROP_REASONS = {"queue_full": DROP_REASON_TM_QUEUE_FULL, "port_down": DROP_REASON_TM_PORT_DOWN}


def _inner(frame: bytes) -> bytes | None:
    """The dropped packet from its IPv4 header to 16 bytes past its INT stack (or past its
    UDP header), whole words; None when it is not IPv4."""
    if len(frame) < 34 or frame[12:14] != ETHERTYPE_IPV4:
        return None
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    end = ihl + 8 + INNER_PAYLOAD_BYTES
    if ip[9] == 17 and ip[1] >> 2 == INT_DSCP_DEFAULT and len(ip) >= ihl + 10:
        end = ihl + 8 + shim_total_len(ip[ihl + 9]) + INNER_PAYLOAD_BYTES
    inner = ip[: min(end, len(ip))]
    return inner[: len(inner) & ~3]
