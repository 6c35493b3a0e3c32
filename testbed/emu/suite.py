"""The scenario suite (testbed.experiment.suite.Suite) on the emulation: a booted Testbed.

Worker processes run the jobs on the hosts' namespaces, INT records are sampled from the
hosts' interfaces, the NICs' rates come from the agents' WatchRates streams and the ports'
counters from the kernel. The emulation runs on real clocks and kernels: its runs share the
fabric, so a run starts where the previous one left the switches and NICs (the twin builds
a fresh fabric for every run; docs/fidelity.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from controller.nic.ratelaw import CcParams
from controller.nic.ratelaw.profiles import policy_params
from controller.wire.pfc import MIN_FRAME as PFC_FRAME_BYTES
from controller.wire.stamp import STAMP
from testbed.emu.network import Testbed
from testbed.emu.operations import EmuOperations
from testbed.experiment.schemes import scheme_law
from testbed.experiment.suite import Suite, SuiteConfig
from testbed.faults import Fault
from testbed.probes import (
    Capture,
    IntSampler,
    PortCounters,
    RateEvent,
    RateWatcher,
    port_counters,
    wait_quiet,
)
from testbed.switch.dataplane import parse_wire
from testbed.traffic import workloads as wl
from testbed.traffic.netns import Host
from testbed.traffic.runner import RunOutput

# the base RTT: messages measured, and how long they may take (the model's RTT is 20 ms at the
# default scale; its RTO 1 s or more)
BASE_RTT_SAMPLES = 5
BASE_RTT_TIMEOUT_S = 30.0
# The least RTO of the emulation's transports (Suite.rto_floor_s), wall time: they share the
# box's cores with the switches and agents, and in the all-reduce at 1 Gb/s per port one
# stood still up to 91 ms (63 ms at once in the run queue), its peer's timer of 56 ms firing
# meanwhile on a window that was not lost (docs/main-job.md, the higher port rates). A NIC
# ACKs without a CPU; this keeps the timers above twice what the CPU held back. On the default
# fabric it binds above about 280 Mb/s per port only (the deepest queue's term, 2.8 s at
# 20 Mb/s, falls below it there).
EMU_RTO_FLOOR_S = 0.2


def without_stamps(k: PortCounters) -> PortCounters:
    """A stamped wire's port counters (its MAC Control frames already out) without the due
    each frame carried after its bytes: the link's traffic as the twin counts it."""
    return PortCounters(
        k.rx_packets,
        k.tx_packets,
        k.rx_bytes - k.rx_packets * STAMP.size,
        k.tx_bytes - k.tx_packets * STAMP.size,
    )


class EmuSuite(Suite):
    """The suite on the emulation: a started Testbed."""

    util_by_departures = True  # its switches are processes: arrivals carry their wake-ups
    rto_floor_s = EMU_RTO_FLOOR_S

    def __init__(self, tb: Testbed, cfg: SuiteConfig, say: Callable[[str], None] | None = None):
        super().__init__(cfg, say or tb.say)
        self.tb = tb
        self.spec = tb.spec
        self.scaling = tb.scaling
        self.hosts = tb.hosts()
        self.links: dict[tuple[int, int], str] = {}
        self.port_ifs: dict[str, dict[int, str]] = {}
        for sw in tb.switches():
            ports = sw.port_map()
            self.port_ifs[sw.name] = ports
            for p in ports:
                self.links[(sw.node_id, p)] = f"{sw.name}:{p}"
        self.sampler: IntSampler | None = None
        self.watcher: RateWatcher | None = None
        self.ops = EmuOperations(tb)
        self._ops: dict[str, Any] = {}
        self.agents: dict[str, Any] = {}  # every host's agent stub (on entering)
        self._probes_before: dict[str, int] = {}

    # ---- lifecycle ----

    def __enter__(self) -> EmuSuite:
        endpoints = [
            (self.tb.node(h.name).netns_path, h.ifname(i))
            for h in self.tb.spec.hosts
            for i in range(len(h.nics))
        ]
        self.sampler = IntSampler(endpoints, self.links)
        self.agents = {h.name: self.tb.agent_stub(h.name) for h in self.hosts}
        self.watcher = RateWatcher(self.agents)
        self._pause_probes(True)  # until the first run's workload
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sampler is not None:
            self.sampler.close()
        if self.watcher is not None:
            self.watcher.close()

    # ---- engine hooks ----

    def _fresh(self) -> bool:
        """The fabric lives on from run to run, but its NICs forget the last run's flows: the
        next run's flows reuse their 5-tuples (its seed's ports), and would otherwise start
        from the last run's rates and CC state, not from their own first packet."""
        from controller.proto import agent_pb2

        for stub in self.agents.values():
            stub.ClearFlows(agent_pb2.ClearFlowsRequest(), timeout=10)
        return False

    def _measure_base_rtt(self) -> float:
        """As the twin measures it (testbed.traffic.workloads.base_rtt): the median of five
        messages and their ACKs, the hosts' transports and NICs included."""
        mtu = self.scaling.transport_mtu
        rtt = wl.base_rtt(self.hosts, mtu, self.runner, BASE_RTT_TIMEOUT_S, BASE_RTT_SAMPLES)
        if rtt is None:
            raise RuntimeError(
                f"the fabric does not carry a message {self.hosts[0].name} -> "
                f"{self.hosts[-1].name} within {BASE_RTT_TIMEOUT_S:g} s"
            )
        return rtt

    def _set_policy(self, scheme: str, cc: dict[str, CcParams]) -> int:
        # every parameter of the law, as the profile resolved them for each agent's line
        # rate: one policy for all where the hosts' NICs run at one rate, else one per host,
        # under every scheme (a law whose values are alike at every rate too: a host's own
        # policy outranks the default, so the last scheme's would stay in force)
        law, params = scheme_law(scheme), {h: policy_params(p) for h, p in cc.items()}
        if len(set(self.nic_rates().values())) == 1:
            hosts = self.tb.set_policy(law, next(iter(params.values())))
        else:
            hosts = [h for name, p in params.items() for h in self.tb.set_policy(law, p, name)]
        time.sleep(0.5)
        return len(hosts)

    def _begin(self) -> None:
        assert self.sampler is not None and self.watcher is not None
        self.sampler.begin()
        self.watcher.begin()
        self.ops.faults = self.faults
        self.ops.begin()
        self._probes_before = self._probe_totals()
        self._pause_probes(False)

    def _end(self) -> tuple[Capture, list[RateEvent]]:
        assert self.sampler is not None and self.watcher is not None
        self._pause_probes(True)
        out = self.sampler.end(), self.watcher.end()
        self._ops = dict(self.ops.end())
        after = self._probe_totals()
        if after:
            before = self._probes_before
            self._ops["probes"] = {
                "interval_s": self.tb.opts.probe_interval_s,
                **{k: v - before.get(k, 0) for k, v in after.items() if k != "flows"},
                "flows": after["flows"],
            }
        return out

    def _probe_totals(self) -> dict[str, int]:
        """The agents' probe counts so far, summed (as the twin's record has them per run):
        probes sent, received, lost, lost behind a full queue, malformed; probe flows."""
        if not self.tb.opts.probe_interval_s:
            return {}
        from controller.proto import agent_pb2

        keys = ("flows", "sent", "received", "lost", "lost_congested", "lost_local", "malformed")
        out = dict.fromkeys(keys, 0)
        for stub in self.agents.values():
            t = stub.GetProbes(agent_pb2.GetProbesRequest(), timeout=10)
            out["sent"] += t.sent
            out["malformed"] += t.malformed
            out["flows"] += len(t.flows)
            for f in t.flows:
                out["received"] += f.received
                out["lost"] += f.lost
                out["lost_congested"] += f.lost_congested
                out["lost_local"] += f.lost_local
        return out

    def _pause_probes(self, paused: bool) -> None:
        """The NICs' probers (`--probes`) send only while a run's workload runs, as the
        twin's do: between runs the fabric falls quiet and its counters are read whole."""
        if not self.tb.opts.probe_interval_s:
            return
        from controller.proto import agent_pb2

        for stub in self.agents.values():
            stub.PauseProbes(agent_pb2.PauseProbesRequest(paused=paused), timeout=10)

    def _operations(self) -> dict[str, Any]:
        return self._ops

    def _begin_faults(self, faults: list[Fault]) -> None:
        self.ops.faults = faults
        self.ops.begin()

    def _end_faults(self) -> list[dict[str, Any]]:
        return self.ops.end()["faults"]

    def _now(self) -> float:
        return time.monotonic()

    def runner(self, hosts: list[Host], spec: dict[str, Any]) -> RunOutput:
        """Every job of the suite: with PFC on, each host's transport holds its sends while
        its NIC's `xm_pfc` says its switch paused it; each host's transport tells its agent
        of its flows before they send (DeclareFlows: a pacing class each from the first
        packet) and of their start rates where the job declares them."""
        if self.tb.pfc_on:
            spec = {**spec, "pfc_pins": self.tb.pfc_pins()}
        if self.tb.agents:
            spec = {**spec, "agents": {h: a.target for h, a in self.tb.agents.items()}}
        spec = {**spec, "transport_pipeline": self.tb.opts.transport_pipeline}
        return wl.run_job(hosts, spec, on_start=self.ops.start)

    def _set_pfc(self, on: bool) -> None:
        self.tb.set_pfc(on, watchdog=self.cfg.pfc_watchdog)

    def _pfc_counters(self) -> dict[str, dict[str, int]]:
        return self.tb.pfc_counters() if self.tb.pfc_on else {}

    def _load_avg(self) -> float | None:
        return round(os.getloadavg()[0], 2)

    def _counters(self) -> dict[str, PortCounters]:
        out: dict[str, PortCounters] = {}
        for sw in self.tb.switches():
            ifs = self.port_ifs[sw.name]
            port_of = {ifn: p for p, ifn in ifs.items()}
            for ifn, c in port_counters(sw.netns_path, ifs.values()).items():
                out[f"{sw.name}:{port_of[ifn]}"] = c
        if self.tb.pfc_on:
            # the switches' own MAC Control frames (pauses they sent and consumed) are not
            # traffic: out of the ports' counters, as the twin keeps them
            for port, pfc in self.tb.switch_pfc_counters().items():
                k = out.get(port)
                if k is None:
                    continue
                sent = pfc["xoff_sent"] + pfc["xon_sent"]
                got = pfc["pauses_received"] + pfc["resumes_received"]
                out[port] = PortCounters(
                    k.rx_packets - got,
                    k.tx_packets - sent,
                    k.rx_bytes - got * PFC_FRAME_BYTES,
                    k.tx_bytes - sent * PFC_FRAME_BYTES,
                )
        # between two switches every other frame carries its due (a stamped wire): the
        # link's bytes are the frames' own, as the twin counts them
        for sw in self.tb.switches():
            for number, wire in map(parse_wire, self.tb.wires(sw.name)):
                name = f"{sw.name}:{number}"
                k = out.get(name)
                if k is None or not wire.stamped:
                    continue
                out[name] = without_stamps(k)
        return out

    def _quiet_counters(self) -> dict[str, PortCounters]:
        return wait_quiet(self._counters)

    def _set_port_rate(self, switch: str, port: int, rate_bps: float) -> None:
        self.tb.set_queue_rate(switch, port, rate_bps)

    def _apply_fault(self, f: Fault) -> None:
        self.tb.apply_fault(f)

    def _switch_drops(self) -> dict[str, int] | None:
        return self.tb.switch_drops()

    def _report_totals(self) -> dict[str, dict[str, int]]:
        import grpc

        from controller.proto import controller_pb2 as pb

        try:
            snap = self.tb.controller_stub().GetTelemetry(pb.GetTelemetryRequest(), timeout=5)
        except grpc.RpcError:
            return {}
        return {n.switch: {"received": n.received, "lost": n.lost} for n in snap.switches}
