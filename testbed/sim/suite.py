"""The scenario suite (testbed.experiment.suite.Suite) on the simulated twin.

The same scenarios, jobs, INT decoding and summaries as the emulation; the measurements come
from the twin's own ends: the INT stacks of the data packets the hosts receive, the rates the
NICs' rate law sets, and the switch ports' frame counters. Times are virtual seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controller.nic.ratelaw import CcParams
from controller.proto import switch_pb2
from testbed.experiment.suite import Suite, SuiteConfig
from testbed.faults import Fault
from testbed.probes import Capture, PortCounters, RateEvent
from testbed.sim.fabric import SimFabric
from testbed.sim.operations import SimOperations
from testbed.traffic.netns import Host
from testbed.traffic.runner import RunOutput


class SimSuite(Suite):
    reseed_repetitions = True  # deterministic: a repetition under the same seed is identical

    def __init__(self, fab: SimFabric, cfg: SuiteConfig, say: Callable[[str], None] | None = None):
        super().__init__(cfg, say or (lambda line: None))
        self.fab = fab
        self.spec = fab.spec
        self.scaling = fab.scaling
        self.hosts = fab.traffic_hosts()
        # timeouts are the emulation's at its scale, in the model's dilated time
        self.time_scale = min(1.0, fab.scaling.scale / 20_000)
        self.ops = SimOperations(fab, self.time_scale)
        self._ops: dict[str, Any] = {}
        self.events = 0  # events run on the fabrics of the runs before the current one
        self.simulated_s = 0.0  # their virtual time

    def runner(self, hosts: list[Host], spec: dict[str, Any]) -> RunOutput:
        """A job on the current run's fabric."""
        return self.fab.run_job(hosts, spec, on_start=self.ops.start)

    @property
    def total_events(self) -> int:
        """Events run so far, on every run's fabric."""
        return self.events + self.fab.loop.events

    @property
    def total_simulated_s(self) -> float:
        return self.simulated_s + self.fab.loop.now

    def _fresh(self) -> bool:
        self.events += self.fab.loop.events
        self.simulated_s += self.fab.loop.now
        self.fab = self.fab.fresh(self.cfg.seed)
        self.ops = SimOperations(self.fab, self.time_scale)
        return True

    def __enter__(self) -> SimSuite:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _measure_base_rtt(self) -> float:
        return self.fab.measure_base_rtt(self.scaling.transport_mtu)

    def _set_policy(self, scheme: str, cc: dict[str, CcParams]) -> int:
        return self.fab.set_params(cc)

    def _set_pfc(self, on: bool) -> None:
        self.fab.set_pfc(on, watchdog=self.cfg.pfc_watchdog)

    def _pfc_counters(self) -> dict[str, dict[str, int]]:
        return self.fab.pfc_counters()

    def _switch_drops(self) -> dict[str, int] | None:
        return self.fab.switch_drops()

    def _pfc_storm(self, host: int, seconds: float) -> None:
        fab = self.fab
        start = fab.loop.now_ns + 1000  # with the job (run_job starts it 1 us from now)
        end = start + round(seconds * 1e9)
        # a pause every quarter watchdog poll: the stuck NIC never lets its switch go
        period = max(1, fab.watchdog_config().poll_ns // 4)
        fab.hosts[self.hosts[host].name].pfc_storm(start, end, period)

    def _begin(self) -> None:
        self.fab.begin()
        self.ops.faults = self.faults
        self.ops.probe_interval_s = self.cfg.probe_interval_s
        self.ops.begin()

    def _end(self) -> tuple[Capture, list[RateEvent]]:
        applied, suspects = self.ops.end()
        self._ops = {
            "faults": applied,
            "suspects": suspects,
            "failovers": self.ops.failovers,
            "probes": self.ops.probe_summary(),
        }
        return self.fab.end()

    def _operations(self) -> dict[str, Any]:
        return self._ops

    def _now(self) -> float:
        return self.fab.loop.now

    def _counters(self) -> dict[str, PortCounters]:
        return self.fab.port_counters()

    def _port_busy_span(self, port: str) -> float:
        switch, p = port.split(":")
        pq = self.fab.switches[switch].sw.tm.ports.get(int(p))
        if pq is None or pq.first_tx_ns < 0:
            return 0.0
        return (pq.last_tx_end_ns - pq.first_tx_ns) / 1e9

    def _quiet_counters(self) -> dict[str, PortCounters]:
        return self.fab.port_counters()  # run_job drained the fabric

    def _apply_fault(self, f: Fault) -> None:
        self.ops.apply_now(f)

    def _begin_faults(self, faults: list[Fault]) -> None:
        self.ops.faults = faults
        self.ops.begin()

    def _end_faults(self) -> list[dict[str, Any]]:
        applied, _ = self.ops.end()
        return applied

    def _report_totals(self) -> dict[str, dict[str, int]]:
        return {
            n["name"]: {"received": n["received"], "lost": n["lost"]}
            for n in self.fab.collector.node_summary()
        }

    def _set_port_rate(self, switch: str, port: int, rate_bps: float) -> None:
        self.fab.switches[switch].admin.SetQueue(
            switch_pb2.SetQueueRequest(port=port, rate_bps=round(rate_bps)), None
        )
