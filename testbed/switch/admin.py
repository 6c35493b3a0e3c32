"""The SwitchAdmin gRPC service (controller/proto/switch.proto) and Prometheus metrics of the
built-in switch."""

from __future__ import annotations

from typing import Any

import grpc
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from controller.proto import switch_pb2, switch_pb2_grpc
from testbed.switch.dataplane import Dataplane
from testbed.switch.p4runtime import P4RuntimeService, RpcError
from testbed.switch.p4runtime.codec import grpc_code
from testbed.switch.pfc import PfcConfig, WatchdogConfig
from testbed.switch.traffic_manager import SharedBuffer, check_fault_setting, check_queue_setting
from testbed.switch.v1model import CELL_BYTES, V1Switch


class SwitchAdminService(switch_pb2_grpc.SwitchAdminServicer):  # type: ignore[misc]
    def __init__(
        self, switch: V1Switch, dataplane: Dataplane | None, p4rt: P4RuntimeService | None
    ):
        self.switch = switch
        self.dataplane = dataplane
        self.p4rt = p4rt

    def _check_primary(self, r: Any, context: Any) -> None:
        """The same rule as a P4Runtime Write: only the primary controller changes the switch."""
        if self.p4rt is None:
            return
        try:
            self.p4rt.streams.check_primary(r.device_id, r.election_id, r.role)
        except RpcError as exc:
            context.abort(grpc_code(exc.code), exc.message)

    def SetQueue(self, request: Any, context: Any) -> Any:
        r = request
        port = None if r.all_ports else r.port
        pkts = r.depth_packets if r.HasField("depth_packets") else None
        nbytes = r.depth_bytes if r.HasField("depth_bytes") else None
        pps = r.rate_pps if r.HasField("rate_pps") else None
        bps = r.rate_bps if r.HasField("rate_bps") else None
        self._check_primary(r, context)
        try:
            # all of it is checked before any of it is applied
            check_queue_setting(port, pps, bps, pkts, nbytes)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        tm = self.switch.tm
        with self.switch.lock:
            tm.set_depth(port, pkts, nbytes)
            tm.set_rate(port, pps, bps)
        return switch_pb2.SetQueueResponse()

    def SetFault(self, request: Any, context: Any) -> Any:
        r = request
        port = None if r.all_ports else r.port
        down = r.down if r.HasField("down") else None
        loss = r.loss if r.HasField("loss") else None
        delay = r.delay_ns if r.HasField("delay_ns") else None
        factor = r.rate_factor if r.HasField("rate_factor") else None
        silent = r.silent if r.HasField("silent") else None
        self._check_primary(r, context)
        try:
            check_fault_setting(port, loss, delay, factor)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        with self.switch.lock:
            if port is None and self.dataplane is not None:
                for num in self.dataplane.ports:  # every port of the switch, seen or not
                    self.switch.tm.port(num)
            self.switch.tm.set_fault(port, down, loss, delay, factor, silent)
        return switch_pb2.SetFaultResponse()

    def SetPfc(self, request: Any, context: Any) -> Any:
        r = request
        self._check_primary(r, context)
        pfc: PfcConfig | None = None
        wd: WatchdogConfig | None = None
        if r.enable:
            mask = r.priority_mask or 1
            try:
                pfc = PfcConfig(
                    r.xoff_bytes,
                    r.xon_bytes,
                    r.headroom_bytes,
                    r.quanta or 0xFFFF,
                    frozenset(p for p in range(16) if mask >> p & 1),
                    r.link_bps,
                    r.alpha,
                    r.pool_bytes,
                    r.reserve_bytes,
                    r.resume_offset_bytes,
                )
                if r.watchdog_poll_ns:
                    wd = WatchdogConfig(
                        r.watchdog_poll_ns,
                        r.detect_polls or 2,
                        r.restore_polls or 2,
                        r.watchdog_action or "drop",
                    )
            except ValueError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self.switch.set_pfc(pfc, wd)
        return switch_pb2.SetPfcResponse()

    def SetBuffer(self, request: Any, context: Any) -> Any:
        r = request
        self._check_primary(r, context)
        buffer: SharedBuffer | None = None
        if r.shared_bytes:
            try:
                buffer = SharedBuffer(r.shared_bytes, r.alpha)
            except ValueError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        with self.switch.lock:
            self.switch.tm.set_buffer(buffer)
        return switch_pb2.SetBufferResponse()

    def GetQueues(self, request: Any, context: Any) -> Any:
        resp = switch_pb2.GetQueuesResponse()
        with self.switch.lock:
            now = self.switch.clock.now_ns()
            for port, pq in sorted(self.switch.tm.ports.items()):
                n, b = pq.total()
                c = pq.pfc
                resp.queues.add(
                    port=port,
                    depth_packets=pq.depth_pkts,
                    depth_bytes=pq.depth_bytes,
                    rate_pps=pq.rate_pps,
                    rate_bps=pq.rate_bps,
                    occupancy_packets=n,
                    occupancy_bytes=b,
                    max_occupancy_packets=pq.max_depth_pkts,
                    max_occupancy_bytes=pq.max_depth_bytes,
                    enqueued=pq.enqueued,
                    dequeued=pq.dequeued,
                    dropped=pq.dropped,
                    down=pq.fault.down,
                    loss=pq.fault.loss,
                    delay_ns=pq.fault.delay_ns,
                    rate_factor=pq.fault.rate_factor,
                    fault_drops=pq.fault_drops,
                    rx_errors=pq.rx_errors,
                    departures=pq.departures,
                    wait_ns=pq.wait_ns,
                    expected_wait_ns=pq.expected_wait_ns,
                    pfc_xoff_sent=c.xoff_sent,
                    pfc_xon_sent=c.xon_sent,
                    pfc_pauses_received=c.pauses_received,
                    pfc_resumes_received=c.resumes_received,
                    pfc_paused_ns=c.paused_ns(now),
                    pfc_storms=c.storms,
                    pfc_restored=c.restored,
                    pfc_watchdog_drops=c.watchdog_drops,
                    pfc_ingress_bytes=sum(st.ingress_bytes for st in c.per_prio.values()),
                    pfc_pausing=any(st.pausing for st in c.per_prio.values()),
                )
        return resp

    def GetHealth(self, request: Any, context: Any) -> Any:
        return switch_pb2.GetHealthResponse(
            status=self.GetStatus(switch_pb2.GetStatusRequest(), context),
            queues=self.GetQueues(switch_pb2.GetQueuesRequest(), context),
        )

    def GetStatus(self, request: Any, context: Any) -> Any:
        sw = self.switch
        resp = switch_pb2.GetStatusResponse(
            device_id=sw.device_id,
            pipeline_loaded=sw.ready,
            rx_packets=sw.stats.rx,
            tx_packets=sw.stats.tx,
            uptime_us=sw.clock.now_us(),
            queue_depth_unit=sw.qdepth_unit,
            queue_depth_cell_bytes=CELL_BYTES if sw.qdepth_unit == "cells" else 0,
            pfc_enabled=sw.tm.pfc is not None,
        )
        for reason, n in sw.drop_counts().items():
            resp.drops[reason] = n
        if self.dataplane is not None:
            dp = self.dataplane
            resp.drops["tx_unknown_port"] = dp.tx_unknown_port
            resp.dataplane_running = dp.running
            resp.dataplane_errors = dp.loop_errors
            resp.dataplane_last_error = dp.last_error
            resp.dataplane_io = dp.io_path()
            resp.dataplane_slack_ns = dp.slack_ns
            for num, p in sorted(self.dataplane.ports.items()):
                resp.ports.add(
                    port=num,
                    interface=p.iface,
                    rx_packets=p.stats.rx,
                    tx_packets=p.stats.tx,
                    rx_bytes=p.stats.rx_bytes,
                    tx_bytes=p.stats.tx_bytes,
                    tx_errors=p.stats.tx_errors,
                    line_drops=p.stats.line_drops,
                    line_late_ns=p.stats.line_late_ns,
                    line_unstamped=p.stats.line_unstamped,
                    down=sw.tm.port_down(num),
                    rx_errors=sw.tm.ports[num].rx_errors if num in sw.tm.ports else 0,
                )
        if self.p4rt is not None:
            for k, v in self.p4rt.counters.items():
                resp.p4runtime[k] = v
        return resp


class SwitchCollector:
    """Prometheus view of the switch, read at scrape time."""

    def __init__(self, switch: V1Switch, dataplane: Dataplane | None, name: str):
        self.switch = switch
        self.dataplane = dataplane
        self.name = name

    def collect(self) -> Any:
        sw = self.switch
        lbl = ["switch"]
        rx = CounterMetricFamily("xingmai_switch_rx_packets", "packets received", labels=lbl)
        rx.add_metric([self.name], sw.stats.rx)
        tx = CounterMetricFamily("xingmai_switch_tx_packets", "packets sent", labels=lbl)
        tx.add_metric([self.name], sw.stats.tx)
        drops = CounterMetricFamily(
            "xingmai_switch_drops", "packets dropped, by reason", labels=lbl + ["reason"]
        )
        for reason, n in sw.stats.dropped.items():
            drops.add_metric([self.name, reason], n)
        occ = GaugeMetricFamily(
            "xingmai_switch_queue_bytes", "egress queue occupancy", labels=lbl + ["port"]
        )
        qdrop = CounterMetricFamily(
            "xingmai_switch_queue_drops", "tail drops per port", labels=lbl + ["port"]
        )
        pl = lbl + ["port"]
        sent = CounterMetricFamily(
            "xingmai_switch_pfc_pauses_sent",
            "PFC pause frames sent to the port's upstream (XOFF)",
            labels=pl,
        )
        resumed = CounterMetricFamily(
            "xingmai_switch_pfc_resumes_sent", "PFC resume frames sent (XON, time 0)", labels=pl
        )
        received = CounterMetricFamily(
            "xingmai_switch_pfc_pauses_received",
            "PFC pause frames received from the port's downstream",
            labels=pl,
        )
        paused = CounterMetricFamily(
            "xingmai_switch_pfc_paused_seconds",
            "time the port's egress was held by received pauses",
            labels=pl,
        )
        storms = CounterMetricFamily(
            "xingmai_switch_pfc_storms", "PFC storms the watchdog detected on the port", labels=pl
        )
        wdrops = CounterMetricFamily(
            "xingmai_switch_pfc_watchdog_drops",
            "packets the PFC watchdog dropped on the port",
            labels=pl,
        )
        # the port's latency monitor (SwitchAdmin GetQueues, the controller's slow-link rule):
        # what its departures waited against what the bytes queued ahead explain at its rate
        deps = CounterMetricFamily(
            "xingmai_switch_port_departures", "frames the port's egress sent", labels=pl
        )
        waited = CounterMetricFamily(
            "xingmai_switch_port_wait_seconds",
            "time the port's departures waited in its queue, summed",
            labels=pl,
        )
        explained = CounterMetricFamily(
            "xingmai_switch_port_expected_wait_seconds",
            "what the bytes queued ahead of each departure explain at the port's rate, summed",
            labels=pl,
        )
        now = sw.clock.now_ns()
        for port, pq in list(sw.tm.ports.items()):
            lv = [self.name, str(port)]
            occ.add_metric(lv, pq.total()[1])
            qdrop.add_metric(lv, pq.dropped)
            deps.add_metric(lv, pq.departures)
            waited.add_metric(lv, pq.wait_ns / 1e9)
            explained.add_metric(lv, pq.expected_wait_ns / 1e9)
            c = pq.pfc
            sent.add_metric(lv, c.xoff_sent)
            resumed.add_metric(lv, c.xon_sent)
            received.add_metric(lv, c.pauses_received)
            paused.add_metric(lv, c.paused_ns(now) / 1e9)
            storms.add_metric(lv, c.storms)
            wdrops.add_metric(lv, c.watchdog_drops)
        yield from (rx, tx, drops, occ, qdrop, sent, resumed, received, paused, storms, wdrops)
        yield from (deps, waited, explained)
        if self.dataplane is not None:
            running = GaugeMetricFamily(
                "xingmai_switch_dataplane_running", "1 while the packet loop runs", labels=lbl
            )
            running.add_metric([self.name], float(self.dataplane.running))
            errors = CounterMetricFamily(
                "xingmai_switch_dataplane_errors", "errors the packet loop survived", labels=lbl
            )
            errors.add_metric([self.name], self.dataplane.loop_errors)
            yield from (running, errors)
            # the links' time (--wire): how late the delay lines' frames left, what they dropped
            late = CounterMetricFamily(
                "xingmai_switch_line_late_seconds",
                "how much later than due the port's frames left its delay line (on a stamped "
                "wire: came in), summed",
                labels=pl,
            )
            ldrops = CounterMetricFamily(
                "xingmai_switch_line_drops",
                "frames the port's delay lines could not hold, dropped",
                labels=pl,
            )
            unstamped = CounterMetricFamily(
                "xingmai_switch_line_unstamped",
                "frames read on the port's stamped wire without their due, dropped",
                labels=pl,
            )
            for num, dport in sorted(self.dataplane.ports.items()):
                if dport.wire is not None:
                    late.add_metric([self.name, str(num)], dport.stats.line_late_ns / 1e9)
                    ldrops.add_metric([self.name, str(num)], dport.stats.line_drops)
                if dport.wire is not None and dport.wire.stamped:
                    unstamped.add_metric([self.name, str(num)], dport.stats.line_unstamped)
            yield from (late, ldrops, unstamped)


def metrics_registry(switch: V1Switch, dataplane: Dataplane | None, name: str) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(SwitchCollector(switch, dataplane, name))  # type: ignore[arg-type]
    return reg
