"""Prometheus metrics of the controller, read from the daemon's state at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from controller.service import flow_label, list_flows

if TYPE_CHECKING:
    from controller.daemon import Daemon


class ControllerMetrics:
    def __init__(self, daemon: Daemon):
        self.d = daemon

    def collect(self) -> Iterator[Any]:
        d = self.d
        sw = ["switch"]
        conn = GaugeMetricFamily(
            "xingmai_controller_switch_connected", "P4Runtime channel up", labels=sw
        )
        prim = GaugeMetricFamily(
            "xingmai_controller_switch_primary", "this controller is primary", labels=sw
        )
        prog = GaugeMetricFamily(
            "xingmai_controller_switch_programmed", "last reconcile wrote everything", labels=sw
        )
        connects = CounterMetricFamily(
            "xingmai_controller_switch_connects", "P4Runtime channels opened", labels=sw
        )
        written = CounterMetricFamily(
            "xingmai_controller_switch_writes", "P4Runtime updates written", labels=sw
        )
        failed = CounterMetricFamily(
            "xingmai_controller_switch_write_failures", "P4Runtime updates refused", labels=sw
        )
        for name, s in d.sessions.items():
            h = s.health
            conn.add_metric([name], int(h.connected))
            prim.add_metric([name], int(h.primary))
            prog.add_metric([name], int(h.programmed))
            connects.add_metric([name], h.connects)
            written.add_metric([name], h.written)
            failed.add_metric([name], h.write_failures)
        yield from (conn, prim, prog, connects, written, failed)

        col = d.collector
        rx = CounterMetricFamily(
            "xingmai_controller_reports", "telemetry reports received", labels=sw
        )
        lost = GaugeMetricFamily(
            "xingmai_controller_reports_lost",
            "telemetry reports lost (sequence gaps; late ones un-count)",
            labels=sw,
        )
        for n in col.node_summary():
            rx.add_metric([n["name"]], n["received"])
            lost.add_metric([n["name"]], n["lost"])
        errs = CounterMetricFamily(
            "xingmai_controller_report_errors", "malformed report datagrams", labels=["reason"]
        )
        for reason, v in col.errors.items():
            errs.add_metric([reason], v)
        yield from (rx, lost, errs)

        lk = ["link"]
        q = GaugeMetricFamily(
            "xingmai_controller_link_queue_bytes", "queue occupancy (INT, last)", labels=lk
        )
        lat = GaugeMetricFamily(
            "xingmai_controller_link_hop_latency_ns", "hop latency (INT, last)", labels=lk
        )
        util = GaugeMetricFamily(
            "xingmai_controller_link_utilization",
            "tx utilisation, fraction of capacity",
            labels=lk + ["source"],
        )
        ldrops = CounterMetricFamily(
            "xingmai_controller_link_drops_reported",
            "drop reports of the link's egress (switches' TM)",
            labels=lk,
        )
        for name, lt in list(col.links.items()):
            if lt.drops_reported:
                ldrops.add_metric([name], lt.drops_reported)
            if lt.qocc_bytes is not None:
                q.add_metric([name], lt.qocc_bytes)
            if lt.latency_ns is not None:
                lat.add_metric([name], lt.latency_ns)
            if lt.util_int is not None:
                util.add_metric([name, "int"], lt.util_int)
            if lt.util_counter is not None:
                util.add_metric([name, "counter"], lt.util_counter)
        flows = GaugeMetricFamily("xingmai_controller_flows", "flows with a cap")
        flows.add_metric([], len(d.slowloop.caps))
        yield from (q, lat, util, flows, ldrops)

        # the active flows as ListFlows (and the fabric page) lists them
        fl = ["flow", "src_host", "dst_host"]
        rate = GaugeMetricFamily(
            "xingmai_controller_flow_rate_bps",
            "flow's NIC rate as its agent reported it (0: unknown)",
            labels=fl,
        )
        cap_g = GaugeMetricFamily(
            "xingmai_controller_flow_cap_bps", "flow's slow-loop cap (0: none)", labels=fl
        )
        fq = GaugeMetricFamily(
            "xingmai_controller_flow_max_qocc_bytes",
            "largest queue along the flow's path (INT, last report)",
            labels=fl,
        )
        for f in list_flows(d).flows:
            k = f.key
            labels = [
                flow_label((k.src_ip, k.dst_ip, k.protocol, k.src_port, k.dst_port)),
                f.src_host,
                f.dst_host,
            ]
            rate.add_metric(labels, f.rate_bps)
            cap_g.add_metric(labels, f.cap_bps)
            fq.add_metric(labels, f.max_qocc_bytes)
        yield from (rate, cap_g, fq)

        # the localizer's current suspects, as GetSuspects (and the fabric page) ranks them
        sus = GaugeMetricFamily(
            "xingmai_controller_suspect_score",
            "a current suspect's score in [0, 1] (fault localization)",
            labels=["element", "kind"],
        )
        for sp in list(d.operations.loc.ranked()):
            sus.add_metric([sp.element, sp.kind], sp.score)
        ops = d.operations
        dead = GaugeMetricFamily("xingmai_controller_dead_links", "links routed around (fail-over)")
        dead.add_metric([], len(ops.dead))
        routed = GaugeMetricFamily(
            "xingmai_controller_link_routed_around",
            "1 while the link is left out of the routes (fail-over)",
            labels=lk,
        )
        for name in sorted(ops.dead):
            routed.add_metric([name], 1)
        fo = CounterMetricFamily(
            "xingmai_controller_failovers", "fail-overs: routes re-computed and written"
        )
        fo.add_metric([], ops.failovers)
        rr = CounterMetricFamily(
            "xingmai_controller_reroutes",
            "links taken out of the routes or put back",
            labels=["change"],
        )
        rr.add_metric(["removed"], ops.links_removed)
        rr.add_metric(["restored"], ops.links_restored)
        took = GaugeMetricFamily(
            "xingmai_controller_failover_write_seconds", "how long the last fail-over's writes took"
        )
        if ops.failover_writes_s:
            took.add_metric([], ops.failover_writes_s[-1])
        late = CounterMetricFamily(
            "xingmai_controller_poll_rounds_late",
            "poll rounds that no switch answered whole in time and none refused (the controller "
            "or its box was late): skipped",
        )
        late.add_metric([], ops.rounds_late)
        nic_failed = CounterMetricFamily(
            "xingmai_controller_nic_polls_failed",
            "host agents' NIC counter reads (GetNicCounters) that failed or timed out",
        )
        nic_failed.add_metric([], ops.nic_polls_failed)
        probe_failed = CounterMetricFamily(
            "xingmai_controller_probe_polls_failed",
            "host agents' probe tally reads (GetProbes) that failed or timed out",
        )
        probe_failed.add_metric([], ops.probe_polls_failed)
        failed = CounterMetricFamily(
            "xingmai_controller_poll_rounds_failed",
            "operations rounds that raised (a defect: the log has its traceback)",
        )
        failed.add_metric([], ops.rounds_failed)
        rounds = CounterMetricFamily(
            "xingmai_controller_poll_rounds",
            "operations rounds run (polls, localization, fail-over), whatever their end",
        )
        rounds.add_metric([], ops.rounds)
        named = CounterMetricFamily(
            "xingmai_controller_suspects_named",
            "elements named as suspects since the start",
            labels=["kind"],
        )
        kinds: dict[str, int] = {}
        for sp in list(ops.loc.named.values()):
            kinds[sp.kind] = kinds.get(sp.kind, 0) + 1
        for kind, count in sorted(kinds.items()):
            named.add_metric([kind], count)
        yield from (
            sus, dead, routed, fo, rr, took, late, failed, rounds, nic_failed, probe_failed, named
        )  # fmt: skip
        loss = CounterMetricFamily(
            "xingmai_controller_flow_loss_reports",
            "NIC sinks' reports of a flow's packets lost before them",
        )
        loss.add_metric([], col.loss_reports)
        drops = CounterMetricFamily(
            "xingmai_controller_drop_reports", "telemetry reports with the D flag"
        )
        drops.add_metric([], col.drop_reports)
        yield from (loss, drops)

        host = ["host"]
        reach = GaugeMetricFamily(
            "xingmai_controller_agent_reachable",
            "the host agent answered the last call",
            labels=host,
        )
        afail = CounterMetricFamily(
            "xingmai_controller_agent_failures", "agent calls failed or timed out", labels=host
        )
        for host_name, st in d.slowloop.state.items():
            reach.add_metric([host_name], int(st.reachable))
            afail.add_metric([host_name], st.failures)
        runs = CounterMetricFamily("xingmai_controller_slowloop_runs", "slow loop steps")
        runs.add_metric([], d.slowloop.runs)
        reloads = CounterMetricFamily(
            "xingmai_controller_config_reloads", "SIGHUP reloads", labels=["result"]
        )
        reloads.add_metric(["ok"], d.reloads)
        reloads.add_metric(["failed"], d.reload_failures)
        yield from (reach, afail, runs, reloads)


def registry(daemon: Daemon) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(ControllerMetrics(daemon))  # type: ignore[arg-type]
    return reg
