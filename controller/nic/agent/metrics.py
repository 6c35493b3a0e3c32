"""Prometheus metrics of the host agent, read from the agent and its maps at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from controller.nic.agent.pacer import HtbPacer

if TYPE_CHECKING:
    from controller.nic.agent.agent import Agent


class AgentMetrics:
    def __init__(self, agent: Agent):
        self.a = agent

    def collect(self) -> Iterator[Any]:
        a = self.a
        info = GaugeMetricFamily(
            "xingmai_agent_info",
            "agent identity and pacing mode",
            labels=["agent", "pacing_mode", "adopted_pins"],
        )
        info.add_metric([a.opts.name, a.mode.value, str(a.adopted).lower()], 1)
        yield info
        up = GaugeMetricFamily(
            "xingmai_agent_healthy", "programs attached and the rate thread running"
        )
        up.add_metric([], int(a.healthy))
        yield up
        if a.bpf is None:
            return
        pkts = CounterMetricFamily(
            "xingmai_nic_packets", "eBPF per-reason packet counters", labels=["reason"]
        )
        for name, v in a.bpf.counter_values().items():
            pkts.add_metric([name], v)
        yield pkts
        rate = GaugeMetricFamily(
            "xingmai_agent_flow_rate_bps",
            "pacing rate per flow (rate map)",
            labels=["flow", "origin"],
        )
        nflows = 0
        for key, r in a.bpf.items("xm_rates"):
            from controller.nic.bpf.loader import ORIGINS

            rate.add_metric([str(key), ORIGINS.get(int(r.origin), "?")], int(r.rate_bps))
            nflows += 1
        yield rate
        flows = GaugeMetricFamily("xingmai_agent_rated_flows", "flows with a rate map entry")
        flows.add_metric([], nflows)
        yield flows
        sync = CounterMetricFamily(
            "xingmai_agent_sync_runs", "wake-ups of the rate thread (datapath events, expiry)"
        )
        sync.add_metric([], a.sync_runs)
        yield sync
        sync_s = CounterMetricFamily("xingmai_agent_sync_seconds", "time spent handling them")
        sync_s.add_metric([], a.sync_seconds)
        yield sync_s
        errs = CounterMetricFamily("xingmai_agent_sync_errors", "failed wake-ups")
        errs.add_metric([], a.sync_errors)
        yield errs
        retired = CounterMetricFamily("xingmai_agent_flows_retired", "idle flows forgotten")
        retired.add_metric([], a.flows_retired)
        yield retired
        rpcs = CounterMetricFamily("xingmai_agent_rpc_calls", "gRPC calls", labels=["rpc"])
        for name, n in sorted(a.rpc_calls.items()):
            rpcs.add_metric([name], n)
        yield rpcs
        if a.probes is not None:  # the active prober (SetProbes)
            snap = a.probes.snapshot()
            probes = CounterMetricFamily(
                "xingmai_agent_probes",
                "probes sent (and refused by the kernel), and those received from peers: "
                "received, lost (from the sequence numbers), of them lost behind a full queue "
                "and while the agent's socket dropped (rx_dropped), malformed",
                labels=["what"],
            )
            flows = snap["flows"]
            for what, n in (
                ("sent", snap["sent"]),
                ("send_errors", snap["send_errors"]),
                ("received", sum(f.received for f in flows)),
                ("lost", sum(f.lost for f in flows)),
                ("lost_congested", sum(f.lost_congested for f in flows)),
                ("lost_local", sum(f.lost_local for f in flows)),
                ("rx_dropped", snap["rx_dropped"]),
                ("malformed", snap["malformed"]),
            ):
                probes.add_metric([what], n)
            yield probes
            pflows = GaugeMetricFamily("xingmai_agent_probe_flows", "probe flows received")
            pflows.add_metric([], len(flows))
            yield pflows
        if isinstance(a.pacer, HtbPacer):
            classes = GaugeMetricFamily("xingmai_agent_htb_classes", "per-flow HTB classes")
            classes.add_metric([], len(a.pacer.classes))
            yield classes
            rer = CounterMetricFamily("xingmai_agent_htb_rerates", "HTB class writes")
            rer.add_metric([], a.pacer.rerates)
            yield rer
            rer_s = CounterMetricFamily(
                "xingmai_agent_htb_rerate_seconds", "time spent in HTB netlink writes"
            )
            rer_s.add_metric([], a.pacer.rerate_seconds)
            yield rer_s
            with a.lock:  # the rate thread observes under it
                buckets, lag_sum = a.apply_lag.cumulative(), a.apply_lag.sum_s
            yield HistogramMetricFamily(
                "xingmai_agent_rate_apply_lag_seconds",
                "from a rate law's write of a flow's rate (the kernel's time) to its HTB class "
                "re-rated: the pacer's lag behind the law",
                buckets=buckets,
                sum_value=lag_sum,
            )
        if a.meter is not None:
            waits = CounterMetricFamily(
                "xingmai_agent_waiting_samples",
                "samples of what waits in the NIC (every 50 ms): taken, late (more than two "
                "periods after the last: the gap is not counted), failed",
                labels=["outcome"],
            )
            waits.add_metric(["taken"], a.meter.samples)
            waits.add_metric(["late"], a.meter.late)
            waits.add_metric(["failed"], a.waiting_errors)
            yield waits
            # what the controller's slow-NIC rule reads (GetNicCounters): a run's rule can be
            # replayed from Prometheus
            try:
                nic = a.nic_totals()
            except OSError:
                return  # the interfaces or the PFC map unreadable now: the next scrape tries
            for name, total, scale, what in (
                ("xingmai_agent_nic_sent_bytes", "tx_bytes", 1, "bytes the interfaces sent"),
                (
                    "xingmai_agent_nic_waiting_bits",
                    "waiting_bits",
                    1,
                    "the time integral of the rates of the flows waiting in the NIC",
                ),
                (
                    "xingmai_agent_nic_paused_seconds",
                    "paused_ns",
                    1e-9,
                    "time PFC pauses held the NIC",
                ),
            ):
                fam = CounterMetricFamily(name, what)
                fam.add_metric([], nic[total] * scale)
                yield fam


def registry_for(agent: Agent, reg: CollectorRegistry | None = None) -> CollectorRegistry:
    """The agent's metrics, in `reg` (a new registry if none)."""
    reg = CollectorRegistry() if reg is None else reg
    reg.register(AgentMetrics(agent))  # type: ignore[arg-type]
    return reg


def exposition(reg: CollectorRegistry) -> str:
    return generate_latest(reg).decode()
