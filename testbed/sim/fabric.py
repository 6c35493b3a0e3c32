"""The twin's fabric: switches, links and hosts of a testbed.topo FabricSpec on one event loop.

- Switches are the built-in switch (testbed.switch.v1model.V1Switch) loading p4c's bmv2 JSON
  of p4src/, on a virtual clock that the loop advances, with queue depths in bytes as the
  testbed starts it. They are programmed as the controller programs them: the controller's
  config for this fabric (testbed.ctlconfig), the entries controller.program derives from
  it, diffed and ordered by controller.reconcile, written through the switch's own
  P4Runtime Write path (P4RuntimeService.write_updates), and the queue settings of
  controller.queues through its SwitchAdmin service.
- A link has a rate, a propagation delay and an MTU, per direction: a frame leaves when the
  traffic manager (or the NIC) starts sending it and arrives after its serialization at the
  link rate plus the delay. Queueing is the traffic manager's.
- Hosts are testbed.sim.nic.SimHost.

`run_job` runs one testbed.traffic.jobs job on the hosts, like the emulation's worker
processes do (testbed.traffic.runner.run_job), returning the same RunOutput.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, cast

import finsy as fy
from finsy.proto import p4r

from controller import config as ctlconfig
from controller import program
from controller.collector import Collector
from controller.common.gc_pause import gc_frozen, gc_paused
from controller.config import EcnConfig
from controller.nic.ratelaw import CcParams, Law
from controller.nic.ratelaw.profiles import DEFAULT_PROFILES, load_profile
from controller.proto import switch_pb2
from controller.queues import buffer_setting, queue_settings
from controller.reconcile import SwitchState, diff, ordered_updates
from controller.switches import qdepth_unit_bytes
from controller.topology import Topology
from controller.wire.pfc import is_mac_control
from testbed.ctlconfig import ControllerSetup, SwitchAccess, controller_config
from testbed.model import Scaling
from testbed.p4files import BMV2_JSON, P4INFO
from testbed.probes import Capture, PortCounters, RateEvent
from testbed.sim.engine import EventLoop
from testbed.sim.host_native import NativeSimHost
from testbed.sim.host_native import library as host_library
from testbed.sim.native_loop import NativeEventLoop
from testbed.sim.nic import SimHost
from testbed.sim.nic_native import library as nic_library
from testbed.sim.nic_programs import IntSource
from testbed.switch.admin import SwitchAdminService
from testbed.switch.dataplane import HopPortStats, PortStats  # the switch process's own
from testbed.switch.hop import SwitchHop, native_path
from testbed.switch.native.build import BuildError
from testbed.switch.p4runtime import P4RuntimeService, parse_p4info_text
from testbed.switch.pfc import (
    PfcConfig,
    WatchdogConfig,
    model_watchdog,
    pfc_request,
    pfc_thresholds,
)
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import DEFAULT_PIPELINE, PIPELINES, V1Switch
from testbed.topo import End, FabricSpec
from testbed.traffic.jobs import JOBS
from testbed.traffic.netns import Host
from testbed.traffic.runner import RunError, RunOutput
from testbed.traffic.transport_core import TransportConfig, port_seed
from testbed.traffic.transport_native import make_core
from testbed.traffic.workloads import base_rtt

CPU_PORT = 255  # testbed.emu.nodes.CPU_PORT (nodes imports Mininet)


class Wire:
    """One direction of a link (on the native loop: NativeWire, the same in C)."""

    def __init__(
        self,
        loop: EventLoop,
        rate_bps: float,
        delay_ns: int,
        mtu: int,
        deliver: Callable[[bytes], None],
    ):
        self.loop = loop
        self.ns_per_byte = 8e9 / rate_bps
        self.delay_ns = delay_ns
        self.max_frame = mtu + 14
        self.deliver = deliver
        self.too_big = 0
        self.frames = 0

    def send(self, frame: bytes, t_ns: int) -> bool:
        """`frame` starts leaving at `t_ns`; it arrives whole after serialization + delay.
        False (counted) for a frame larger than the link's MTU: it is not sent."""
        if len(frame) > self.max_frame:
            self.too_big += 1
            return False
        self.frames += 1
        self.loop.at(t_ns + int(len(frame) * self.ns_per_byte) + self.delay_ns, self.deliver, frame)
        return True


class NativeWire(Wire):
    """A Wire whose frames are the native loop's (testbed/switch/native/hop.py): sent and
    counted in C, delivered to a switch there or to its Python target."""

    def __init__(self, loop: NativeEventLoop, index: int) -> None:  # noqa: D107
        self.native = loop
        self.index = index
        self._w = loop._wires[index]

    @property
    def max_frame(self) -> int:  # type: ignore[override]
        return int(self._w.max_frame)

    @property
    def ns_per_byte(self) -> float:  # type: ignore[override]
        return float(self._w.ns_per_byte)

    @property
    def delay_ns(self) -> int:  # type: ignore[override]
        return int(self._w.delay_ns)

    @property
    def frames(self) -> int:  # type: ignore[override]
        return int(self._w.frames)

    @property
    def too_big(self) -> int:  # type: ignore[override]
        return int(self._w.too_big)

    def send(self, frame: bytes, t_ns: int) -> bool:
        return self.native.send(self.index, frame, t_ns)


class HopClock(Clock):
    """A switch's virtual clock; on the native loop it is its hop's (`clock_ns`), which the
    C advances as Python does (to the time of the switch's latest event)."""

    def __init__(self) -> None:  # noqa: D107
        super().__init__(virtual=True)
        self.hop: Any = None

    def attach(self, hop: Any) -> None:
        hop.clock_ns = self._virtual_ns
        self.hop = hop

    def now_ns(self) -> int:
        return int(self.hop.clock_ns) if self.hop is not None else self._virtual_ns

    def now_us(self) -> int:
        return self.now_ns() // 1000

    def advance(self, ns: int) -> None:
        self.advance_to(self.now_ns() + ns)

    def advance_to(self, ns: int) -> None:
        if self.hop is None:
            super().advance_to(ns)
        elif ns > self.hop.clock_ns:
            self.hop.clock_ns = ns


class SimSwitch:
    """The built-in switch on the loop's clock."""

    def __init__(
        self,
        loop: EventLoop,
        name: str,
        device_id: int,
        qdepth_unit: str = "bytes",
        pipeline: str = DEFAULT_PIPELINE,
    ):
        self.loop: EventLoop | NativeEventLoop = loop
        self.name = name
        self.clock = HopClock()
        self.sw = V1Switch(
            self.clock,
            device_id=device_id,
            cpu_port=CPU_PORT,
            qdepth_unit=qdepth_unit,
            pipeline=pipeline,
        )
        self.sw.transmit = self._transmit
        self.p4rt = P4RuntimeService(self.sw, device_id)
        # in process the twin is the switch's only controller: no arbitration to check
        self.admin = SwitchAdminService(self.sw, None, None)
        self.wires: dict[int, Wire] = {}
        self.ports: dict[int, PortStats] = {}
        self.tx_unknown_port = 0
        self.pfc_rx = 0  # MAC Control frames, kept out of the ports' data counters
        self.pfc_tx = 0
        self._service_at: int | None = None
        # ports with no wire but a listener (the collector's): frame -> the listener
        self.local: dict[int, Callable[[bytes], None]] = {}
        # on the native loop: this switch's hop there
        self.native: SimHop | None = None

    # ---- on the native loop (testbed/sim/native_loop.py) ----

    def attach(self, loop: NativeEventLoop, node: int) -> None:
        """Run this switch's common per-packet path in the native loop's C, as node `node`
        (`native_path` must hold)."""
        self.native = SimHop(loop, node, self)
        self.loop = loop
        self.clock.attach(self.native.hop)
        self.sw.on_change = self.native.refresh

    def add_port(self, port: int) -> None:
        """Counters for a port with a link."""
        st = PortStats()
        self.ports[port] = st if self.native is None else HopPortStats(self.native.hop, port, st)

    def add_wire(self, port: int, wire: Wire) -> None:
        self.wires[port] = wire
        if self.native is not None:
            assert isinstance(wire, NativeWire)
            self.native.hop.wire[port] = wire.index

    def receive(self, port: int, frame: bytes) -> None:
        st = self.ports.get(port)
        if is_mac_control(frame):
            self.pfc_rx += 1
        elif st is not None:
            st.rx += 1
            st.rx_bytes += len(frame)
        self.clock.advance_to(self.loop.now_ns)
        self.sw.receive(port, frame)
        self._schedule()

    def _schedule(self) -> None:
        if self.native is not None:  # the hop's C keeps when its service is due
            self.native.schedule()
            return
        now = self.loop.now_ns
        at = self._service_at
        if at is not None and at <= now:
            return  # a service due now runs anyway, whatever the next departure is
        t = self.sw.tm.next_departure_ns()
        if t is None:
            return
        if t < now:
            t = now
        if at is not None and at <= t:
            return
        self._service_at = t
        self.loop.at(t, self._service, t)

    def _service(self, t: int) -> None:
        if t != self._service_at:
            return  # superseded by an earlier service time
        self._service_at = None
        self.clock.advance_to(self.loop.now_ns)
        self.sw.service()
        self._schedule()

    def _transmit(self, port: int, data: bytes) -> None:
        wire = self.wires.get(port)
        if wire is None:
            listener = self.local.get(port)
            if listener is not None:
                st = self.ports.get(port)
                if st is not None:
                    st.tx += 1
                    st.tx_bytes += len(data)
                listener(data)
                return
            self.tx_unknown_port += 1  # the CPU port: nothing listens
            return
        if is_mac_control(data):
            self.pfc_tx += 1
            wire.send(data, self.loop.now_ns)
            return
        if wire.send(data, self.loop.now_ns):  # over the MTU: received, not sent (a drop)
            st = self.ports[port]
            st.tx += 1
            st.tx_bytes += len(data)

    @property
    def dropped(self) -> int:
        return sum(self.sw.stats.dropped.values())


class SimHop(SwitchHop):
    """A SimSwitch's hop in the native loop: what the C hands back to the twin's switch."""

    def __init__(self, loop: NativeEventLoop, node: int, sim: SimSwitch) -> None:  # noqa: D107
        self.sim, self.events = sim, loop
        super().__init__(loop, node, sim.sw)

    def receive(self, port: int, frame: bytes) -> None:
        self.sim.receive(port, frame)

    def service(self) -> None:
        self.sw.service()
        self.schedule()

    def schedule(self) -> None:
        """SimSwitch._schedule on the native loop: the C keeps when the service is due."""
        t = self.sw.tm.next_departure_ns()
        if t is not None:
            self.events.schedule_at(self.node, t)

    def transmit(self, port: int, frame: bytes) -> None:
        self.sim._transmit(port, frame)


def seed_random_extern(sw: V1Switch, seed: int) -> None:
    """Seed the program's `random` extern (ECN's marking draws, for one): the compiled
    program, on either pipeline, draws from its own random.Random (`Compiled.random`)."""
    assert sw.compiled is not None
    sw.compiled.random.seed(seed)


def controller_cfg(spec: FabricSpec, scaling: Scaling, ecn: EcnConfig) -> ctlconfig.Config:
    """The controller's config for this fabric, as the emulation writes it."""
    switches = {
        s.name: SwitchAccess(f"127.0.0.1:{50000 + i}", "builtin")
        for i, s in enumerate(spec.switches)
    }
    setup = ControllerSetup(grpc_addr="127.0.0.1:1", collector_netns=None, log_file="", ecn=ecn)
    doc = controller_config(spec, scaling, switches, {}, setup, str(P4INFO), str(BMV2_JSON))
    del doc["controller"]["log_file"]  # no controller process: nothing logs
    return ctlconfig.parse(doc)


class SimFabric:
    def __init__(
        self,
        spec: FabricSpec,
        scaling: Scaling,
        ecn: EcnConfig | None = None,
        link_delay_ns: int | None = None,
        seed: int = 1,
        pipeline: str = DEFAULT_PIPELINE,
        nic_pipeline: str | None = None,
        loop_pipeline: str | None = None,
        transport_pipeline: str | None = None,
        host_pipeline: str | None = None,
    ):
        self.spec = spec
        self.seed = seed
        self.pipeline = pipeline  # the switches' P4 pipeline: reference or native
        # the NICs' rate laws: the XDP program compiled, or its Python reference (None: as
        # the switches); where the native one cannot be built, the reason, and the reference
        self.nic_pipeline = nic_pipeline or pipeline
        if self.nic_pipeline not in PIPELINES:
            raise ValueError(f"nic_pipeline must be one of {PIPELINES}, got {nic_pipeline!r}")
        self.nic_pipeline_in_use, self.nic_native_reason = self.nic_pipeline, ""
        if self.nic_pipeline == "native":
            try:
                nic_library()
            except BuildError as exc:
                self.nic_pipeline_in_use, self.nic_native_reason = "reference", str(exc)
        # the event loop and the switches' hops: in C (testbed/sim/native_loop.py) or the
        # Python loop (None: as the switches)
        self.loop_pipeline = loop_pipeline or pipeline
        if self.loop_pipeline not in PIPELINES:
            raise ValueError(f"loop_pipeline must be one of {PIPELINES}, got {loop_pipeline!r}")
        # the hosts' transport cores: their per-packet work in C
        # (testbed/traffic/transport_native.py) or the Python reference (None: as the
        # switches); a job whose transport the C does not run (selective repeat) or where it
        # cannot be built runs the reference, its reason kept here
        self.transport_pipeline = transport_pipeline or pipeline
        if self.transport_pipeline not in PIPELINES:
            raise ValueError(
                f"transport_pipeline must be one of {PIPELINES}, got {transport_pipeline!r}"
            )
        self.transport_in_use: set[str] = set()
        self.transport_native_reasons: set[str] = set()
        # the hosts' per-packet loops: in C (testbed/sim/host_native.py) where the event loop,
        # the NICs and the job's transport core are native and the job needs nothing the C
        # lacks, else SimHost's Python (None: as the switches); per job, as the transport
        self.host_pipeline = host_pipeline or pipeline
        if self.host_pipeline not in PIPELINES:
            raise ValueError(f"host_pipeline must be one of {PIPELINES}, got {host_pipeline!r}")
        self.host_in_use: set[str] = set()
        self.host_native_reasons: set[str] = set()
        self.scaling = scaling
        self.ecn = ecn or EcnConfig()
        self.loop: EventLoop | NativeEventLoop = EventLoop()
        self.cfg = controller_cfg(spec, scaling, self.ecn)
        self.topo = Topology(self.cfg)
        self.delay_ns = link_delay_ns if link_delay_ns is not None else scaling.link_delay_ns()
        unit = scaling.model.qdepth_unit
        self.switches = {
            s.name: SimSwitch(self.loop, s.name, s.device_id, unit, pipeline) for s in spec.switches
        }
        self.link_names = {
            (s.node_id, p): f"{s.name}:{p}"
            for s in spec.switches
            for p in spec.switch_ports(s.name)
        }
        self.hosts: dict[str, SimHost] = {}
        self.law = Law.NONE
        # the controller's collector, where the collector's switch port delivers (the
        # twin's times: virtual seconds for both its clocks)
        self.collector = Collector(self.topo, self.cfg.int.dscp)
        self.collector_not_reports = 0  # frames to the collector that are not reports
        if spec.collector is not None:
            self.switches[spec.collector.node].local[spec.collector.index] = self._to_collector
        self._program()
        self.loop_in_use = self._native_loop() if self.loop_pipeline == "native" else "reference"
        self._build()

    def fresh(self, seed: int | None = None) -> SimFabric:
        """The same fabric built anew: switches, NICs, hosts, the clock at 0 and every random
        stream seeded (with `seed`, default this fabric's), nothing of what ran on this one
        but the record of which transport cores its jobs ran (the run's, shared)."""
        new = SimFabric(
            self.spec,
            self.scaling,
            self.ecn,
            self.delay_ns,
            self.seed if seed is None else seed,
            self.pipeline,
            self.nic_pipeline,
            self.loop_pipeline,
            self.transport_pipeline,
            self.host_pipeline,
        )
        new.transport_in_use = self.transport_in_use
        new.transport_native_reasons = self.transport_native_reasons
        new.host_in_use = self.host_in_use
        new.host_native_reasons = self.host_native_reasons
        return new

    # ---- construction ----

    def _native_loop(self) -> str:
        """The event loop in C with every switch's hop there, when every switch runs the
        native pipeline's common path from one library (the same program): "native", else
        "reference" (the Python loop, as a switch that could not be native is)."""
        sims = list(self.switches.values())
        if not sims or not all(native_path(s.sw) for s in sims):
            return "reference"
        libs = {id(cast(Any, s.sw.compiled).native.lib) for s in sims}
        if len(libs) != 1:
            return "reference"
        rt = cast(Any, sims[0].sw.compiled).native
        assert self.loop.pending == 0 and self.loop.now_ns == 0
        wires = sum(len(h.nics) for h in self.spec.hosts) + 2 * len(self.spec.links)
        self.loop = NativeEventLoop(rt.ffi, rt.lib, len(sims), wires)
        for node, sim in enumerate(sims):
            sim.attach(self.loop, node)
        return "native"

    def _program(self) -> None:
        info = parse_p4info_text(P4INFO.read_text())
        device_config = BMV2_JSON.read_bytes()
        schema = fy.P4Schema(P4INFO)
        for swc in self.cfg.switches:
            sim = self.switches[swc.name]
            sim.p4rt.install(info, device_config, 0)
            seed_random_extern(sim.sw, self.seed * 1_000_003 + swc.device_id)
            sim.sw.tm.rng.seed(self.seed * 1_000_033 + swc.device_id)  # `loss` faults' draws
            st = sim.admin.GetStatus(switch_pb2.GetStatusRequest(), None)
            unit = qdepth_unit_bytes(st, self.cfg.model.mean_packet_bytes)  # as the controller
            desired = program.build(self.cfg, self.topo, swc, schema, SwitchState([]), unit)
            plan = diff(desired.encode(schema), [])
            updates = [
                p4r.Update(type=t, entity=e)  # type: ignore[arg-type]
                for t, e in ordered_updates(plan)
            ]
            errors = [e for e in sim.p4rt.write_updates(updates) if e is not None]
            if errors:
                raise RuntimeError(
                    f"{swc.name}: {len(errors)} of {len(updates)} writes "
                    f"failed, first: {errors[0].code} {errors[0].message}"
                )
            for q in queue_settings(self.cfg, self.topo, swc):
                sim.admin.SetQueue(
                    switch_pb2.SetQueueRequest(
                        port=q.port,
                        rate_bps=q.rate_bps,
                        depth_bytes=q.depth_bytes,
                        depth_packets=q.depth_packets,
                    ),
                    None,
                )
            shared, alpha = buffer_setting(self.cfg, swc)
            sim.admin.SetBuffer(switch_pb2.SetBufferRequest(shared_bytes=shared, alpha=alpha), None)

    def _build(self) -> None:
        s = self.scaling
        icfg = self.cfg.int
        int_source = IntSource(
            True, icfg.dscp, icfg.instruction_bitmap, icfg.hop_budget, s.link_mtu + 14
        )

        # every switch port's speed, as the agent writes them to xm_hop_speed
        hop_speeds = {
            (sw.node_id, p): round(self.topo.port_speed_bps(sw.name, p))
            for sw in self.spec.switches
            for p in self.spec.switch_ports(sw.name)
        }

        for sw in self.switches.values():
            for p in self.spec.switch_ports(sw.name):
                sw.add_port(p)
        native_hosts = self._native_hosts()
        for h in self.spec.hosts:
            nic = h.nics[0]
            att = self.spec.attachment(h.name, 0)
            gw = self.spec.switch(att.node).router_mac
            wire = self._wire(End(h.name, 0), att)
            # the NIC's line rate is its link's (its first: a host's NICs share one rate)
            args = (h.name, nic.ip, nic.mac, gw, s.nic_rate(self.link_bps(att)))
            more = (hop_speeds, wire.send, int_source, self.link_names)
            if native_hosts:
                assert isinstance(self.loop, NativeEventLoop) and isinstance(wire, NativeWire)
                self.hosts[h.name] = NativeSimHost(self.loop, *args, *more, wire.index)
            else:
                self.hosts[h.name] = SimHost(self.loop, *args, *more, self.nic_pipeline_in_use)
            for i, extra in enumerate(h.nics[1:], start=1):  # the rails of a multi-NIC host
                att = self.spec.attachment(h.name, i)
                wire = self._wire(End(h.name, i), att)
                self.hosts[h.name].add_nic(
                    extra.ip, extra.mac, self.spec.switch(att.node).router_mac, wire.send
                )
        for lk in self.spec.links:
            for a, b in ((lk.a, lk.b), (lk.b, lk.a)):
                if self.spec.is_switch(a.node):
                    self.switches[a.node].add_wire(a.index, self._wire(a, b))

    def _native_hosts(self) -> bool:
        """Whether the hosts can run their per-packet loops in C: asked for, on the native
        loop and NICs, and the C built (else the reason is kept, and SimHost runs)."""
        if self.host_pipeline != "native":
            return False
        why = ""
        if not isinstance(self.loop, NativeEventLoop):
            why = "the event loop is the reference's"
        elif self.nic_pipeline_in_use != "native":
            why = "the NICs are the reference's"
        else:
            try:
                host_library()
            except BuildError as exc:
                why = str(exc)
        if why:
            self.host_native_reasons.add(why)
        return not why

    def link_bps(self, end: End) -> float:
        """The emulated rate of the link at `end` (its own, or the switch model's)."""
        lk = self.spec.link_at(end)
        return self.scaling.emulated_bps(None if lk is None else lk.gbps)

    def link_delay_ns(self, end: End) -> int:
        """The propagation delay of the link at `end` (its own, dilated by the scale, or the
        fabric's)."""
        lk = self.spec.link_at(end)
        if lk is None or lk.delay_ns is None:
            return self.delay_ns
        return self.scaling.link_delay_ns(lk.delay_ns)

    def _wire(self, src: End, dst: End) -> Wire:
        """The direction src -> dst of their link, at the link's rate and delay."""
        if isinstance(self.loop, NativeEventLoop):
            hop = self.switches[dst.node].native if self.spec.is_switch(dst.node) else None
            host = self.hosts.get(dst.node)
            i = self.loop.wire(
                self.link_bps(src),
                self.link_delay_ns(src),
                self.scaling.link_mtu + 14,
                None if hop is None else hop.node,
                self._to(dst) if hop is None else dst.index,
                # a host in C sees the frames to its first NIC first
                int(host._h.index) if isinstance(host, NativeSimHost) and dst.index == 0 else -1,
            )
            return NativeWire(self.loop, i)
        return Wire(
            self.loop,
            self.link_bps(src),
            self.link_delay_ns(src),
            self.scaling.link_mtu,
            self._to(dst),
        )

    def _to(self, end: End) -> Callable[[bytes], None]:
        """Where frames sent towards `end` go: a switch port, or a host (any of its NICs:
        the host takes what is addressed to one of them; MAC Control frames act on the NIC
        they arrive at)."""
        # partial, not a lambda: a frame's delivery costs no Python frame of its own
        if self.spec.is_switch(end.node):
            return partial(self.switches[end.node].receive, end.index)
        return partial(self._to_host, end.node, end.index)

    def _to_host(self, node: str, nic: int, frame: bytes) -> None:
        self.hosts[node].receive(frame, nic)

    def _to_collector(self, frame: bytes) -> None:
        """A frame the fabric delivered to the collector: its UDP payload, if it is a
        report to the collector's port (the collector's socket would see only those)."""
        ip = frame[14:]
        port = self.cfg.int.collector.udp_port
        if (
            frame[12:14] != b"\x08\x00"
            or len(ip) < 28
            or ip[9] != 17
            or int.from_bytes(ip[22:24], "big") != port
        ):
            self.collector_not_reports += 1
            return
        ihl = (ip[0] & 0x0F) * 4
        end = int.from_bytes(ip[2:4], "big")
        self.collector.ingest(ip[ihl + 8 : end], now=self.loop.now, wall=self.loop.now)

    # ---- control ----

    def set_law(self, law: Law, base_rtt_ns: int, profile: str | None = None) -> int:
        """SetRateLaw on every host (what the controller's policy does through the agents):
        the law's named CC profile (default: the law's default profile) for each host's line
        rate, T = `base_rtt_ns` and the model's dilation (the scale)."""
        prof = load_profile(profile or DEFAULT_PROFILES[law])
        if prof.law is not law:
            raise ValueError(f"cc profile {prof.name!r} is not for {law.name.lower()}")
        self.law = law
        for h in self.hosts.values():
            h.set_law(prof.cc_params(h.line_rate_bps, base_rtt_ns, self.scaling.scale))
        return len(self.hosts)

    def set_params(self, params: dict[str, CcParams]) -> int:
        """SetRateLaw on every host, with the parameters `params` has for it (each NIC's
        own: resolved at its line rate)."""
        missing = sorted(set(self.hosts) - set(params))
        if missing:
            raise ValueError(f"no rate-law parameters for host(s) {', '.join(missing)}")
        for name, h in self.hosts.items():
            h.set_law(params[name])
        self.law = next((p.law for p in params.values()), self.law)
        return len(self.hosts)

    def pfc_config(self, switch: str) -> PfcConfig:
        """A switch's PFC thresholds: its buffer (shared, with a dynamic XOFF; or one egress
        queue's depth, which no queue can then exceed) shared by its ports, headroom for the
        links' rate and delay."""
        s = self.scaling
        ports = [End(switch, p) for p in self.spec.switch_ports(switch)]
        buffer, alpha = s.model.pfc_buffer(len(ports))
        return pfc_thresholds(  # headroom for its fastest, longest link
            max((self.link_bps(e) for e in ports), default=s.link_bps),
            max((self.link_delay_ns(e) for e in ports), default=self.delay_ns),
            s.link_mtu + 14,
            buffer,
            len(ports),
            alpha=alpha,
        )

    def watchdog_config(self, action: str = "drop") -> WatchdogConfig:
        return model_watchdog(self.scaling.scale, action)

    def set_pfc(self, on: bool, watchdog: bool = True, action: str = "drop") -> None:
        """PFC on (or off) in every switch and NIC, with the PFC watchdog in the switches."""
        for name, sw in self.switches.items():
            sw.clock.advance_to(self.loop.now_ns)
            wd = self.watchdog_config(action) if on and watchdog else None
            req = pfc_request(self.pfc_config(name), wd) if on else switch_pb2.SetPfcRequest()
            sw.admin.SetPfc(req, None)  # as a controller sets it, through SwitchAdmin
        for h in self.hosts.values():
            h.pfc = on
            if not on:
                h.release_pauses()

    def switch_drops(self) -> dict[str, int]:
        """Every switch's own drop counters (its SwitchAdmin GetStatus), by reason, summed."""
        out: dict[str, int] = {}
        for sw in self.switches.values():
            st = sw.admin.GetStatus(switch_pb2.GetStatusRequest(), None)
            for reason, n in st.drops.items():
                out[reason] = out.get(reason, 0) + n
        return out

    def pfc_counters(self) -> dict[str, dict[str, int]]:
        """Per switch port and host NIC ("switch:port", "host:nic"): PFC frames sent and
        received, paused time (ns) and what the watchdog did; only where something happened."""
        out: dict[str, dict[str, int]] = {}
        now = self.loop.now_ns
        for sw in self.switches.values():
            for port, pq in sorted(sw.sw.tm.ports.items()):
                c = pq.pfc
                d = {
                    "xoff_sent": c.xoff_sent,
                    "xon_sent": c.xon_sent,
                    "pauses_received": c.pauses_received,
                    "paused_ns": c.paused_ns(now),
                    "storms": c.storms,
                    "restored": c.restored,
                    "watchdog_drops": c.watchdog_drops,
                }
                if any(d.values()):
                    out[f"{sw.name}:{port}"] = d
        for h in self.hosts.values():
            for i, nic in enumerate(h.ports):
                d = {
                    "xoff_sent": nic.pfc_sent,
                    "pauses_received": nic.pfc.prio[0].pauses,
                    "paused_ns": nic.pfc.prio[0].held_ns(now),
                }
                if any(d.values()):
                    out[f"{h.name}:{i}"] = d
        return out

    # ---- measuring ----

    def begin(self) -> None:
        cap = Capture()
        events: list[RateEvent] = []
        for h in self.hosts.values():
            h.capture, h.rate_events = cap, events
        self._cap, self._events = cap, events

    def end(self) -> tuple[Capture, list[RateEvent]]:
        for h in self.hosts.values():
            h.capture = h.rate_events = None
        return self._cap, sorted(self._events, key=lambda e: e.t)

    def port_counters(self) -> dict[str, PortCounters]:
        """Per switch port ("switch:port"): frames in and out. Frames a switch received and
        did not send (queue tail drops, pipeline drops) show as rx - tx, as the emulation's
        kernel counters show them."""
        out = {}
        for sw in self.switches.values():
            for p, st in sw.ports.items():
                out[f"{sw.name}:{p}"] = PortCounters(st.rx, st.tx, st.rx_bytes, st.tx_bytes)
        return out

    # ---- running jobs ----

    def run_job(
        self,
        hosts: list[Host],
        spec: dict[str, Any],
        on_start: Callable[[float], None] | None = None,
    ) -> RunOutput:
        """The job on `hosts` from a common start, until every host's part is done (or the
        spec's timeout in virtual seconds); like testbed.traffic.runner.run_job, whose
        `on_start` it calls with the start's virtual time before the loop runs."""
        if len(hosts) < 2:
            raise ValueError("a run needs at least two hosts")
        spec = dict(spec, hosts=[{"name": h.name, "ip": h.ip} for h in hosts])
        timeout_ns = round(float(spec.setdefault("timeout", 60.0)) * 1e9)
        sims = [self.hosts[h.name] for h in hosts]
        t0 = self.loop.now_ns + 1000
        left = [len(sims)]

        def one_done() -> None:
            left[0] -= 1

        # the jobs (a queue pair per peer and rank) made with the collector off, then left out
        # of its collections while the run lasts: they live until its end
        # (controller.common.gc_pause; it changes no result)
        with gc_paused():
            for i, h in enumerate(sims):
                h.on_done = one_done
                tcfg = TransportConfig(local_ip=h.ip, **spec.get("transport", {}))
                core, why = make_core(
                    tcfg, port_seed(int(spec.get("seed", 1)), i), self.transport_pipeline
                )
                self.transport_in_use.add(core.pipeline)
                if why:
                    self.transport_native_reasons.add(why)
                job = JOBS[spec["kind"]](core, spec, i)
                h.start_job(core, job, t0)
                host_why = h.python_reason(core) if isinstance(h, NativeSimHost) else None
                in_c = isinstance(h, NativeSimHost) and host_why is None
                self.host_in_use.add("native" if in_c else "reference")
                if host_why:
                    self.host_native_reasons.add(host_why)
        if on_start is not None:
            on_start(t0 / 1e9)
        with gc_frozen():
            finished = self.loop.run(until_ns=t0 + timeout_ns, stop=lambda: left[0] == 0)
        if not finished:
            for h in sims:
                if not h.done and h.job is not None:
                    try:
                        h.result = h.job.result(self.loop.now)
                    except TimeoutError as exc:
                        # the hosts leave this job, as a worker that gives up exits: the next
                        # job starts on a clean fabric
                        for other in sims:
                            other.core = other.job = None
                        self.loop.run()
                        raise RunError(f"{h.name}: {exc}") from None
        results = []
        for h in sims:
            assert h.result is not None
            results.append(h.result)
        counters = [h.core.counters() if h.core else {} for h in sims]
        for h in sims:
            h.core = h.job = None
        self.loop.run()  # what is still in flight (last ACKs) drains before the next job
        return RunOutput(spec, results, counters)

    def measure_base_rtt(self, size: int) -> float:
        """The round trip of one `size`-byte message from the first host to the last (the
        longest path of the standard topologies) and its ACK, on the idle fabric."""
        timeout = 10.0 + 1e-3 * self.scaling.scale
        fct = base_rtt(self.traffic_hosts(), size, self.run_job, timeout)
        if fct is None:
            raise RuntimeError("the twin's fabric does not carry a message first -> last host")
        return fct

    def traffic_hosts(self) -> list[Host]:
        return [Host(h.name, "", h.nics[0].ip, h.ifname(0)) for h in self.spec.hosts]
