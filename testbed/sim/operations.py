"""The operations loop on the twin: the scenario's faults injected at their times (the same
traffic-manager settings as on the emulation, testbed/faults.py), the controller's localizer
(controller/health.py) fed every poll with the numbers the daemon reads from the switches
(P4 port counters, port status, the ports' latency monitors) and from the hosts' agents
(their NICs' counters, and with `probe` set their active probers' tallies: testbed/traffic/
prober.py), and fail-over: the routes re-computed without the dead links and written as the
daemon writes them (the difference).

Times: a fault's `at` and the localizer's windows are emulated seconds, stretched by the
suite's time scale like the scenarios' timeouts, so one faults file means the same instants
of the workloads on both engines.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import finsy as fy
from finsy.proto import p4r

from controller import p4names as P
from controller import program
from controller.health import (
    Localizer,
    NicSample,
    PortSample,
    ProbeTally,
    SwitchSample,
    Thresholds,
    probe_congested_bytes,
    probe_tallies,
)
from controller.nic.backlog import WAITING_SAMPLE_S
from controller.nic.prober import ProbeConfig, Prober
from controller.reconcile import SwitchState, diff, ordered_updates
from controller.topology import Topology, probe_peers
from testbed import faults
from testbed.p4files import P4INFO
from testbed.sim.fabric import SimFabric

POLL_S = 0.1  # the daemon's poll interval (controller.health_poll_s), emulated seconds


@dataclass
class Applied:
    fault: faults.Fault
    applied_at: float  # seconds from the scenario's start, emulated

    def to_dict(self) -> dict[str, Any]:
        return {**self.fault.to_dict(), "applied_at": round(self.applied_at, 4)}


class SimOperations:
    def __init__(self, fab: SimFabric, time_scale: float = 1.0):
        self.fab = fab
        self.k = time_scale
        self.faults: list[faults.Fault] = []
        self._schema: Any = None
        self._entities: dict[str, list[p4r.Entity]] = {}
        self._active = False
        self._started = False
        self.failovers: list[dict[str, Any]] = []
        # the hosts' active probers: a probe flow's interval in emulated seconds (None: off)
        self.probe_interval_s: float | None = None
        self.probers: dict[str, Prober] = {}

    # ---- scenario lifecycle ----

    def begin(self) -> None:
        th = Thresholds()
        th = replace(
            th,
            window_s=th.window_s * self.k,
            vote_window_s=th.vote_window_s * self.k,
            dead_after_s=th.dead_after_s * self.k,
            silent_after_s=th.silent_after_s * self.k,
            hold_s=th.hold_s * self.k,
        )
        self.loc = Localizer(self.fab.topo, self.fab.scaling.transport_mtu + 58, th)
        self.t0 = self.fab.loop.now  # until the traffic starts (`start`)
        self._started = False
        self.applied: list[Applied] = []
        self.killed: set[str] = set()
        self.dead: frozenset[str] = frozenset()
        self.failovers = []
        # the collector's loss events so far belong to earlier scenarios
        self._losses_seen = self.fab.collector.loss_reports
        self._active = True
        loop = self.fab.loop
        loop.at(loop.now_ns + round(POLL_S * self.k * 1e9), self._tick)
        for h in self.fab.hosts.values():
            h.meter.period_s = WAITING_SAMPLE_S * self.k
        loop.at(loop.now_ns + round(WAITING_SAMPLE_S * self.k * 1e9), self._sample_nics)
        self._start_probers(th)

    def _start_probers(self, th: Thresholds) -> None:
        """A prober on every host, fresh for the scenario, each sending its first probe at
        its own offset into the round."""
        self.probers = {}
        if self.probe_interval_s is None:
            return
        fab = self.fab
        leaves = fab.topo.leaves()
        cfg = ProbeConfig(
            self.probe_interval_s * self.k,
            congested_bytes=probe_congested_bytes(fab.cfg.model.queue_depth_bytes, th),
        )
        ip = {h.name: h.nics[0].ip for h in fab.spec.hosts}
        self._host_of_ip = {v: k for k, v in ip.items()}
        for i, h in enumerate(fab.spec.hosts):
            peers = [ip[p] for p in probe_peers(h.name, leaves)]
            prober = Prober(ip[h.name], peers, cfg, seed=i + 1)
            if not prober.targets:
                continue
            self.probers[h.name] = prober
            fab.hosts[h.name].prober = prober
            first = fab.loop.now_ns + round(prober.gap_s * 1e9 * i / len(fab.spec.hosts))
            fab.loop.at(first, self._probe, h.name)

    def _probe(self, name: str) -> None:
        """One probe from `name`, and the next after its gap, while any job runs."""
        if not self._active or not any(h.core is not None for h in self.fab.hosts.values()):
            return
        host = self.fab.hosts[name]
        host.send_probe()
        gap_ns = max(1, round(self.probers[name].gap_s * 1e9))
        self.fab.loop.at(self.fab.loop.now_ns + gap_ns, self._probe, name)

    def probe_tallies(self, now: float) -> list[ProbeTally]:
        """Every probe flow's counts as its receiver has them (the agents' GetProbes)."""
        path_links = self.fab.collector.path_links
        return [
            t
            for name, prober in self.probers.items()
            for t in probe_tallies(now, name, prober.flows.values(), self._host_of_ip, path_links)
        ]

    def probe_summary(self) -> dict[str, Any]:
        """The scenario's probes: sent, and received and lost as the receivers counted them."""
        if not self.probers:
            return {}
        flows = [f for p in self.probers.values() for f in p.flows.values()]
        return {
            "interval_s": self.probe_interval_s,
            "flows": len(flows),
            "sent": sum(p.sent for p in self.probers.values()),
            "received": sum(f.received for f in flows),
            "lost": sum(f.lost for f in flows),
            "lost_congested": sum(f.lost_congested for f in flows),
            "lost_local": sum(f.lost_local for f in flows),
            "malformed": sum(p.malformed for p in self.probers.values()),
        }

    def start(self, t: float) -> None:
        """The scenario's first job starts at virtual time `t` (the runner's `on_start`): the
        faults' times and what the localizer named count from then, as on the emulation.
        Later jobs of the scenario change nothing."""
        if self._started or not self._active:
            return
        self._started = True
        self.t0 = t
        for f in faults.expand(self.faults):
            self.fab.loop.at(round((t + f.at * self.k) * 1e9), self._apply, f)

    def end(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Heal every fault, restore the routes; the faults applied and every suspect named
        (times from the scenario's start, emulated seconds)."""
        self._active = False
        self.killed.clear()  # healed below with every other port
        for ps in faults.heal_all(self.fab.spec):
            self._set(ps)
        for h in self.fab.hosts.values():
            h.ns_per_byte = 8e9 / h.line_rate_bps
        if self.dead:
            self._failover(frozenset())
        suspects = [
            {
                "element": s.element,
                "kind": s.kind,
                "score": round(s.score, 3),
                "first_named": round((s.first_named - self.t0) / self.k, 4),
                "evidence": s.evidence,
            }
            for s in sorted(self.loc.named.values(), key=lambda s: (-s.score, s.first_named))
        ]
        return [a.to_dict() for a in self.applied], suspects

    # ---- faults ----

    def _apply(self, f: faults.Fault) -> None:
        if not self._active and f.kind != "up":
            return  # the scenario ended before its time came
        self.applied.append(Applied(f, (self.fab.loop.now - self.t0) / self.k))
        if f.kind == "kill":  # no process in the twin: the switch stops answering, its
            self.killed.add(f.target)  # links carry nothing
            self._set(faults.PortSetting(f.target, None, down=True))
            return
        if f.kind == "up" and f.target in self.killed:
            self.killed.discard(f.target)
            self._set(faults.healthy(f.target, None))
            return
        if faults.target_class(self.fab.spec, f.target) == "nic" and f.kind in ("rate", "up"):
            h = self.fab.hosts[f.target]  # the NIC serializes at a fraction of its rate
            factor = 1.0 if f.kind == "up" else (f.value or 1.0)
            h.ns_per_byte = 8e9 / (h.line_rate_bps * factor)
        for ps in faults.port_settings(self.fab.spec, f):
            self._set(ps)

    def apply_now(self, f: faults.Fault) -> None:
        """Set one link or switch fault's port settings now, outside a scenario's schedule
        (a sweep's loss on every link)."""
        for ps in faults.port_settings(self.fab.spec, f):
            self._set(ps)

    def _set(self, ps: faults.PortSetting) -> None:
        sim = self.fab.switches[ps.switch]
        tm = sim.sw.tm
        if ps.port is None:
            for p in self.fab.spec.switch_ports(ps.switch):
                tm.port(p)  # every port of the switch, used or not
        with sim.sw.lock:
            tm.set_fault(ps.port, ps.down, ps.loss, ps.delay_ns, ps.rate_factor, ps.silent)

    # ---- the controller's loop ----

    def _tick(self) -> None:
        if not self._active or not any(h.core is not None for h in self.fab.hosts.values()):
            return  # the job is over: nothing keeps the event loop alive
        now = self.fab.loop.now
        for name in self.fab.switches:
            if name in self.killed:
                self.loc.unreachable(name, now)
                continue
            self.loc.observe(self.sample(name, now))
        for name, h in self.fab.hosts.items():
            tx, waiting, paused = h.nic_counters()
            self.loc.nic(NicSample(name, now, tx, waiting, h.meter.line_rate_bps, paused))
        losses, self._losses_seen = self.fab.collector.losses_since(self._losses_seen)
        for loss in losses:
            self.loc.path_loss(loss)
        if self.fab.cfg.controller.int_latency_monitor:
            self.loc.int_waits(now, self.fab.collector.int_waits())
        if self.probers:
            self.loc.probes(self.probe_tallies(now))
        self.loc.evaluate(now)
        dead = frozenset(self.loc.dead_links())
        if dead != self.dead:
            self._failover(dead)
        self.fab.loop.at(self.fab.loop.now_ns + round(POLL_S * self.k * 1e9), self._tick)

    def _sample_nics(self) -> None:
        """What waits in every busy host's NIC, every WAITING_SAMPLE_S (the agents' sampler)."""
        if not self._active or not any(h.core is not None for h in self.fab.hosts.values()):
            return
        for h in self.fab.hosts.values():
            if h.core is not None:
                h.sample_waiting()
        loop = self.fab.loop
        loop.at(loop.now_ns + round(WAITING_SAMPLE_S * self.k * 1e9), self._sample_nics)

    def sample(self, name: str, now: float) -> SwitchSample:
        """What the daemon polls from a switch: port status, P4 port counters, the ports'
        latency monitors (SwitchAdmin GetQueues)."""
        sw = self.fab.switches[name].sw
        assert sw.compiled is not None
        tx = sw.compiled.counters[P.CTR_PORT_TX]
        rx = sw.compiled.counters[P.CTR_PORT_RX]
        ports = {}
        now_ns = self.fab.loop.now_ns
        for p in self.fab.spec.switch_ports(name):
            pq = sw.tm.ports.get(p)
            ports[p] = PortSample(
                p,
                up=not sw.tm.port_down(p),
                tx_packets=tx.read(p)[0],
                rx_packets=rx.read(p)[0],
                rx_errors=pq.rx_errors if pq else 0,
                departures=pq.departures if pq else 0,
                wait_ns=pq.wait_ns if pq else 0,
                expected_wait_ns=pq.expected_wait_ns if pq else 0,
                paused_ns=pq.pfc.paused_ns(now_ns) if pq else 0,
            )
        return SwitchSample(name, now, ports)

    def _failover(self, dead: frozenset[str]) -> None:
        """Routes without the dead links, written to every live switch as the daemon
        writes them: the difference from what the switch holds."""
        fab = self.fab
        if self._schema is None:
            self._schema = fy.P4Schema(P4INFO)
        schema = self._schema
        topo = Topology(fab.cfg, down=dead)
        written = 0
        for swc in fab.cfg.switches:
            sim = fab.switches[swc.name]
            cur = self._entities.get(swc.name)
            if cur is None:  # what SimFabric._program wrote
                cur = program.build(fab.cfg, fab.topo, swc, schema, SwitchState([]), 1).encode(
                    schema
                )
            new = program.build(fab.cfg, topo, swc, schema, SwitchState(cur), 1).encode(schema)
            plan = diff(new, cur)
            updates = [
                p4r.Update(type=t, entity=e)  # type: ignore[arg-type]
                for t, e in ordered_updates(plan)
            ]
            errors = [e for e in sim.p4rt.write_updates(updates) if e is not None]
            if errors:
                raise RuntimeError(f"fail-over on {swc.name}: {errors[0].code} {errors[0].message}")
            written += len(updates)
            self._entities[swc.name] = new
        self.failovers.append(
            {
                "t": round((fab.loop.now - self.t0) / self.k, 4),
                "dead_links": sorted(dead),
                "writes": written,
            }
        )
        self.dead = dead
