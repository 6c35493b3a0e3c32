"""The testbed's lifecycle: boot the fabric, start the controller and the agents, wait for
every component to be healthy, and stop exactly what was started.

    with Testbed(leafspine(2, 2, 4), TestbedOptions()) as tb:
        tb.hosts()            # traffic endpoints (testbed.traffic.netns.Host)
        tb.set_policy("dcqcn")

Order: Mininet builds the hosts and switch namespaces and the links between them; each switch
gets a management veth to the root namespace; the switches and the host agents start (the
agents compile their eBPF programs meanwhile); once every switch listens, the controller gets
its config (testbed.ctlconfig) and programs the fabric; the testbed waits until the controller
reports every switch programmed and reaches every agent. A component that does not come up
fails the start with its name and the tail of its log.

Teardown (on exit, error, Ctrl-C or SIGTERM) stops what was started, by PID, in reverse: agents
(SIGTERM: they detach their programs and remove their pins and classes), the controller, the
switches, then Mininet's links and host shells (`Mininet.stop()`, never `mn -c` or
`cleanup()`), the management veths and the collector's namespace name. `leftovers()` lists
anything of this run still on the machine (none after a clean stop).
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
import yaml
from mininet.link import Link
from mininet.net import Mininet

from controller.common.ports import free_port
from controller.config import EcnConfig
from testbed import faults
from testbed.ctlconfig import ControllerSetup, SwitchAccess, controller_config
from testbed.emu.nodes import REPO, FabricHost, P4Switch, SwitchRuntime, choose_switch
from testbed.emu.procs import Component, ComponentError, wait_all
from testbed.emu.prometheus import Prometheus, Target
from testbed.emu.prometheus import binary as prometheus_binary
from testbed.emu.topo import FabricTopo
from testbed.errors import UserError
from testbed.experiment.rundir import new_run_dir
from testbed.experiment.schemes import RATE_LAWS
from testbed.model import LINK_TIMES, Scaling
from testbed.p4files import BMV2_JSON, P4INFO
from testbed.switch.pfc import PfcConfig, model_watchdog, pfc_request, pfc_thresholds
from testbed.switch.v1model import DEFAULT_PIPELINE
from testbed.topo import COLLECTOR_NODE, End, FabricSpec
from testbed.traffic.netns import Host

AGENT_RUN_ROOT = Path("/run/xingmai/agents")
AGENT_BPFFS_ROOT = Path("/run/xingmai/bpffs")
# PFC headroom for what the emulation adds after a switch pauses its upstream: the frames a
# host has already handed its kernel (the transport's socket buffer of a queue pair,
# scenarios.transport_settings' 4 frames, and the one HTB is sending), and the reaction time
# of the software on a busy machine (the switch process sending the pause, the transport
# reading its NIC's record before its next send).
EMU_PFC_QUEUED_FRAMES = 5
EMU_PFC_REACTION_S = 0.005
LOCK_FILE = Path("/run/xingmai/testbed.lock")


class TestbedError(UserError):
    pass


@dataclass
class TestbedOptions:
    __test__ = False  # not a pytest test class
    switch: str = "auto"  # auto, bmv2, builtin
    scaling: Scaling = field(default_factory=Scaling)
    rate_law: str = "tita"  # the policy the controller starts with
    law_params: dict[str, float] = field(default_factory=dict)
    ecn: EcnConfig = field(default_factory=EcnConfig)
    controller_caps: bool = False  # the controller's slow-loop caps on top of the NIC's law
    probe_interval_s: float = 0.0  # the agents' active probers (controller.probe_interval_s)
    pcap: bool = False
    run_dir: Path | None = None
    switch_log_level: str = "info"
    agent_sync: str = "5ms"  # least time between two HTB re-rate passes of an agent
    # The switches forward in software: a switch process that waits for a CPU holds packets
    # back, and the backlog drains only as fast as the port's rate exceeds the offered load.
    # Their priority keeps such stalls short on a busy machine.
    switch_nice: int = -10
    pipeline: str = DEFAULT_PIPELINE  # the built-in switches' P4 pipeline: reference or native
    # the hosts' transports: the core's per-packet work in C, or the Python reference
    transport_pipeline: str = DEFAULT_PIPELINE
    # the links' time: "model", the built-in switches hold each frame for its link's
    # serialization and delay (Testbed.wires); "none", a veth's (at once: a base RTT of a
    # fraction of a millisecond, and the switches' CPU of one wake-up a frame)
    link_time: str = LINK_TIMES[0]
    boot_timeout_s: float = 180.0
    # a Prometheus server scraping every daemon, and the controller's fabric page (loopback)
    monitoring: bool = True
    progress: Callable[[str], None] | None = None


def _sh(*argv: str, check: bool = True) -> str:
    res = subprocess.run(argv, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise TestbedError(f"{' '.join(argv)}: {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout


class _Net(Mininet):  # type: ignore[misc]
    """Mininet without its machine-wide initialisation (`fixLimits` raises sysctls for the
    whole machine): the testbed leaves the machine's settings as it found them."""

    def __init__(self, **kw: Any):
        Mininet.inited = True  # skip Mininet.init(): root is checked by the testbed
        super().__init__(**kw)


@dataclass
class AgentHandle:
    host: str
    name: str
    component: Component
    metrics_addr: str  # Prometheus, on loopback of the root namespace

    @property
    def socket(self) -> Path:
        return AGENT_RUN_ROOT / self.name / "agent.sock"

    @property
    def target(self) -> str:
        return f"unix://{self.socket}"

    def stub(self) -> Any:
        from controller.proto import agent_pb2_grpc

        return agent_pb2_grpc.HostAgentStub(grpc.insecure_channel(self.target))


class Testbed:
    __test__ = False  # not a pytest test class

    def __init__(self, spec: FabricSpec, opts: TestbedOptions | None = None):
        self.spec = spec
        self.opts = opts or TestbedOptions()
        if self.opts.link_time not in LINK_TIMES:
            raise ValueError(f"link time {self.opts.link_time!r}: one of {', '.join(LINK_TIMES)}")
        if self.opts.rate_law not in RATE_LAWS:
            raise ValueError(f"rate law {self.opts.rate_law!r}: one of {', '.join(RATE_LAWS)}")
        self.scaling = self.opts.scaling
        self.prefix = f"xm{secrets.token_hex(2)}"
        self.run_dir = self.opts.run_dir or new_run_dir()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.switch_cls: type[P4Switch] = choose_switch(self.opts.switch)
        delayed = [f"{lk.a}-{lk.b}" for lk in spec.links if lk.delay_ns]
        if delayed and not self.wired:
            # a veth delays nothing, this kernel has no netem, and bmv2 no delay line
            raise TestbedError(
                f"links {', '.join(delayed)} have a delay of their own: only the built-in "
                "switch gives the emulation's links their time (--switch builtin, --link-time "
                "model); the twin models it too (--engine sim)"
            )
        self.net: Any = None
        self._slowed_nics: set[str] = set()  # hosts whose NIC port a fault slowed
        self.mgmt_links: list[str] = []  # root-side management veths
        self.collector_netns: str | None = None
        self.agents: dict[str, AgentHandle] = {}
        self.controller: Component | None = None
        self.controller_addr = ""
        self.controller_metrics_addr = ""
        self.web_url = ""  # the controller's fabric page
        self.prometheus: Prometheus | None = None
        self.config_path = self.run_dir / "controller.yaml"
        self._channels: list[grpc.Channel] = []
        self._t0 = time.monotonic()
        self._closed = False
        self._teardown_left: list[str] = []  # what the agents left in the hosts (seen once)
        self.started = False
        self.pfc_on = False  # SetPfc turned PFC on in the switches (a lossless scheme)

    # ---- progress -------------------------------------------------------------------------

    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self._t0:6.1f}s] {msg}"
        if self.opts.progress is not None:
            self.opts.progress(line)
        else:
            print(line, flush=True)

    # ---- start ----------------------------------------------------------------------------

    def start(self) -> Testbed:
        if os.geteuid() != 0:
            raise TestbedError("the testbed needs root (network namespaces, veths, eBPF)")
        for p in (P4INFO, BMV2_JSON):
            if not p.is_file():
                raise TestbedError(f"{p} is missing: the P4 program is not built (make p4)")
        s = self.scaling
        self.say(s.describe())
        self.say(
            f"topology {self.spec.name}: {len(self.spec.switches)} switches "
            f"({self.switch_cls.kind}), {len(self.spec.hosts)} hosts; run directory "
            f"{self.run_dir}"
        )
        (self.run_dir / "topology.yaml").write_text(_dump_spec(self.spec))
        try:
            self._build()
            self._start_components()
        except BaseException:
            self.close()
            raise
        self.started = True
        return self

    def _build(self) -> None:
        topo = FabricTopo(spec=self.spec, mtu=self.scaling.link_mtu)
        self.net = _Net(
            topo=topo,
            switch=self.switch_cls,
            host=FabricHost,
            controller=None,
            link=Link,
            build=False,
        )
        # the host shells and switch namespaces exist from here on: close() removes them
        self.net.build()
        self._add_management()
        col = self._node(COLLECTOR_NODE) if self.spec.collector is not None else None
        if col is not None:
            name = f"{self.prefix}col"
            _sh("ip", "netns", "attach", name, str(col.pid))
            self.collector_netns = name
        self.say("network built: namespaces, links, management addresses")

    def _node(self, name: str) -> Any:
        return self.net.nameToNode[name]

    def switches(self) -> list[P4Switch]:
        return [s for s in self.net.switches if isinstance(s, P4Switch)]

    @property
    def wired(self) -> bool:
        """Whether the links take the model's time (serialization and delay): the built-in
        switches hold each frame on a delay line (their --wire) unless told not to
        (`link_time` "none"); bmv2's send at once."""
        return self.switch_cls.kind == "builtin" and self.opts.link_time == "model"

    @property
    def link_delay_s(self) -> float:
        """The links' propagation delay the switches add (those with none of their own)."""
        return self.scaling.link_delay_ns() / 1e9 if self.wired else 0.0

    def wires(self, switch: str) -> list[str]:
        """The switch's --wire arguments: every port linked in the topology, at its link's
        rate and delay, frames coming in from a host held too, and a link between two switches
        stamped: its frames carry their due and the receiving switch holds them, so that a
        sender's lateness does not move them (testbed/switch/dataplane.py's Wire); none where
        the switches cannot hold them or are told not to."""
        if not self.wired:
            return []
        s, out = self.scaling, []
        for port in self.spec.switch_ports(switch):
            end = End(switch, port)
            lk, peer = self.spec.link_at(end), self.spec.peer(end)
            if lk is None or peer is None:
                continue  # the collector's port: its reports are not the model's traffic
            bps = s.emulated_bps(lk.gbps)
            far = ":stamped" if self.spec.is_switch(peer.node) else ":in"
            out.append(f"{port}:{bps!r}:{s.link_delay_ns(lk.delay_ns)}{far}")
        return out

    def _add_management(self) -> None:
        """A veth per switch, root side 169.254.X.(4i+1)/30, switch side .(4i+2)/30."""
        LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK_FILE, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two runs must not pick the same /24
            base = _free_linklocal_24()
            for i, sw in enumerate(self.switches()):
                net = ipaddress.IPv4Network(f"{base.network_address + 4 * i}/30")
                root_ip, sw_ip = str(net.network_address + 1), str(net.network_address + 2)
                root_if = f"{self.prefix}m{i}"
                _sh(
                    "ip",
                    "link",
                    "add",
                    root_if,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "mgmt0",
                    "netns",
                    str(sw.pid),
                )
                self.mgmt_links.append(root_if)
                _sh("sysctl", "-qw", f"net.ipv6.conf.{root_if}.disable_ipv6=1", check=False)
                _sh("ip", "addr", "add", f"{root_ip}/30", "dev", root_if)
                _sh("ip", "link", "set", root_if, "up")
                sw.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1")
                sw.cmd("ip link set lo up")
                sw.cmd(f"ip addr add {sw_ip}/30 dev mgmt0")
                sw.cmd("ip link set mgmt0 up")
                sw.runtime = SwitchRuntime(
                    self.run_dir,
                    sw_ip,
                    self.scaling.link_mtu,
                    pcap=self.opts.pcap,
                    log_level=self.opts.switch_log_level,
                    nice=self.opts.switch_nice,
                    qdepth_unit=self.scaling.model.qdepth_unit,
                    pipeline=self.opts.pipeline,
                    wires=tuple(self.wires(sw.name)),
                )

    def _start_components(self) -> None:
        o = self.opts
        self.net.start()  # starts every switch process
        self._start_agents()
        self.say(
            f"started {len(self.switches())} switches and {len(self.agents)} agents "
            "(the agents compile their eBPF programs)"
        )
        wait_all(
            [s.component for s in self.switches() if s.component is not None],
            lambda c: self._switch_of(c).listening(),
            60,
            "listening for P4Runtime",
        )
        self.say("switches listening")
        self._start_controller()
        if o.monitoring:  # its own start (seconds) overlaps the agents' compiling
            self._launch_prometheus()
        self._wait_controller_healthy(o.boot_timeout_s)
        self.say("controller: every switch programmed")
        wait_all(
            [a.component for a in self.agents.values()],
            lambda c: self._agent_healthy(c),
            o.boot_timeout_s,
            "healthy",
        )
        self.say("agents healthy")
        self._wait_agents_reached(60)
        self.say("controller reaches every agent: the fabric is up")
        if o.monitoring:
            self._wait_prometheus()

    def _switch_of(self, c: Component) -> P4Switch:
        return next(s for s in self.switches() if s.component is c)

    # ---- agents ---------------------------------------------------------------------------

    def nic_line_rate(self, host: str) -> float:
        """The host's NIC line rate: its link's (its first: a host's NICs share one rate)."""
        s = self.scaling
        link = self.spec.link_at(self.spec.attachment(host, 0))
        return s.nic_rate(s.emulated_bps(None if link is None else link.gbps))

    def _start_agents(self) -> None:
        s = self.scaling
        for h in self.spec.hosts:
            node = self._node(h.name)
            name = f"{self.prefix}-{h.name}"
            metrics = f"127.0.0.1:{free_port()}"
            line_rate = self.nic_line_rate(h.name)
            argv = [
                sys.executable,
                "-m",
                "controller.nic.agent.main",
                "--name",
                name,
                "--netns",
                node.netns_path,
                "--line-rate",
                str(int(line_rate)),
                "--rate-law",
                self.opts.rate_law,
                "--mtu",
                str(s.link_mtu),
                # TiTa's T: the model's base RTT, dilated like every time of the model
                "--base-rtt",
                f"{round(s.base_rtt_s * 1e9)}ns",
                "--no-sockops",
                "--sync-interval",
                self.opts.agent_sync,
                "--idle-timeout",
                "10",
                "--metrics-addr",
                metrics,
            ]
            for i in range(len(h.nics)):
                argv += ["--interface", h.ifname(i)]
                peer = _wire_peer(node, h.ifname(i))
                if peer is not None:  # where the agent stamps its RTT probes' departures
                    argv += ["--wire-peer", f"{h.ifname(i)}={peer[0]}:{peer[1]}"]
            comp = Component(
                f"agent {h.name}", argv, self.run_dir / "logs" / f"agent-{h.name}.log", cwd=REPO
            )
            self.agents[h.name] = AgentHandle(h.name, name, comp, metrics)

    def _agent_healthy(self, c: Component) -> bool:
        from controller.proto import agent_pb2

        a = next(a for a in self.agents.values() if a.component is c)
        if not a.socket.exists():
            return False
        try:
            st = self.agent_stub(a.host).GetStatus(agent_pb2.GetStatusRequest(), timeout=2)
        except grpc.RpcError:
            return False
        return bool(st.healthy)

    def agent_stub(self, host: str) -> Any:
        from controller.proto import agent_pb2_grpc

        ch = grpc.insecure_channel(self.agents[host].target)
        self._channels.append(ch)
        return agent_pb2_grpc.HostAgentStub(ch)

    # ---- controller -----------------------------------------------------------------------

    def _start_controller(self) -> None:
        port = free_port()
        self.controller_addr = f"127.0.0.1:{port}"
        web_addr = None
        if self.opts.monitoring:
            self.controller_metrics_addr = f"127.0.0.1:{free_port()}"
            web_addr = f"127.0.0.1:{free_port()}"
            self.web_url = f"http://{web_addr}/"
        access = {s.name: SwitchAccess(s.grpc_addr, s.kind, s.thrift_port) for s in self.switches()}
        agents = {h: a.target for h, a in self.agents.items()}
        setup = ControllerSetup(
            grpc_addr=self.controller_addr,
            collector_netns=self.collector_netns,
            log_file="",
            rate_law=self.opts.rate_law,
            law_params=self.opts.law_params,
            ecn=self.opts.ecn,
            caps=self.opts.controller_caps,
            metrics_addr=self.controller_metrics_addr or None,
            web_addr=web_addr,
            int_latency_monitor=False,  # software switches' hop latency: see ControllerSetup
            probe_interval_s=self.opts.probe_interval_s,
        )
        doc = controller_config(
            self.spec, self.scaling, access, agents, setup, str(P4INFO), str(BMV2_JSON)
        )
        doc["controller"].pop("log_file")  # the log is the process's output
        self.config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.controller = Component(
            "controller",
            [sys.executable, "-m", "controller.daemon", "--config", str(self.config_path)],
            self.run_dir / "logs" / "controller.log",
            cwd=REPO,
        )

    # ---- monitoring -----------------------------------------------------------------------

    def scrape_targets(self) -> list[Target]:
        """Every daemon's metrics endpoint: the controller, each switch that has one (the
        built-in switch; bmv2 has none), each agent."""
        out = [Target("controller", self.controller_metrics_addr, {"node": "controller"})]
        out += [
            Target("switch", s.metrics_addr, {"node": s.name})
            for s in self.switches()
            if s.metrics_addr
        ]
        out += [Target("agent", a.metrics_addr, {"node": h}) for h, a in self.agents.items()]
        return out

    def _launch_prometheus(self) -> None:
        """The metrics server, started once every daemon's address is known (it scrapes the
        ones not up yet as down until they are)."""
        if prometheus_binary() is None:
            return
        prom = Prometheus(self.run_dir, self.scrape_targets(), f"127.0.0.1:{free_port()}")
        self.prometheus = prom
        prom.start()

    def _wait_prometheus(self) -> None:
        """Until the metrics server scrapes every daemon."""
        prom = self.prometheus
        if prom is None:
            self.say(
                "prometheus is not installed (make install): no metrics server; fabric "
                f"page {self.web_url}"
            )
            return
        prom.wait_ready(60)
        assert prom.component is not None
        try:
            prom.component.wait_until(prom.all_up, 30, "scraping every daemon", poll=0.5)
        except ComponentError:
            down = [
                f"{t['job']} {t['node']} ({t['error']})"
                for t in prom.targets()
                if t["health"] != "up"
            ]
            raise ComponentError(
                "prometheus", f"targets not up: {', '.join(down)}", prom.component.log
            ) from None
        self.say(
            f"prometheus {prom.url}/ scraping {len(prom.targets_wanted)} daemons; "
            f"fabric page {self.web_url}"
        )

    def controller_stub(self) -> Any:
        from controller.proto import controller_pb2_grpc

        ch = grpc.insecure_channel(self.controller_addr)
        self._channels.append(ch)
        return controller_pb2_grpc.ControllerStub(ch)

    def _wait_controller_healthy(self, timeout: float) -> None:
        from controller.proto import controller_pb2 as pb

        assert self.controller is not None
        stub = self.controller_stub()
        last: list[Any] = [None]

        def healthy() -> bool:
            try:
                last[0] = stub.GetStatus(pb.GetStatusRequest(), timeout=2)
            except grpc.RpcError:
                return False
            return bool(last[0].healthy)

        try:
            self.controller.wait_until(healthy, timeout, "healthy (every switch programmed)")
        except ComponentError as exc:
            raise ComponentError(
                exc.component,
                f"{exc.args[0].splitlines()[0]}; switches: {self._switch_health(stub)}",
                self.controller.log,
            ) from None

    def _switch_health(self, stub: Any) -> str:
        from controller.proto import controller_pb2 as pb

        try:
            resp = stub.ListSwitches(pb.ListSwitchesRequest(), timeout=3)
        except grpc.RpcError as exc:
            return f"(ListSwitches failed: {exc.code().name})"
        bad = [
            f"{s.name}: connected={s.connected} programmed={s.programmed} {s.last_error}"
            for s in resp.switches
            if not (s.connected and s.programmed)
        ]
        return "; ".join(bad) or "all programmed"

    def _wait_agents_reached(self, timeout: float) -> None:
        from controller.proto import controller_pb2 as pb

        assert self.controller is not None
        stub = self.controller_stub()
        n = len(self.agents)

        def reached() -> bool:
            st = stub.GetStatus(pb.GetStatusRequest(), timeout=2)
            return int(st.agents_reachable) >= n

        try:
            self.controller.wait_until(reached, timeout, f"reaching all {n} agents", poll=0.3)
        except grpc.RpcError as exc:
            raise ComponentError(
                "controller", f"GetStatus failed: {exc.code().name}", self.controller.log
            ) from None

    def set_policy(
        self, rate_law: str, params: dict[str, float] | None = None, host: str = ""
    ) -> list[str]:
        """The rate law (and parameters) of every host (`host`: of that one), through the
        controller, which pushes it to the agents. Returns the hosts that accepted it;
        raises if any did not."""
        from controller.proto import controller_pb2 as pb

        if rate_law not in RATE_LAWS:
            raise ValueError(f"rate law {rate_law!r}: one of {', '.join(RATE_LAWS)}")
        resp = self.controller_stub().SetPolicy(
            pb.SetPolicyRequest(
                host=host, policy=pb.Policy(rate_law=rate_law, params=params or {})
            ),
            timeout=10,
        )
        if resp.failed:
            raise TestbedError(
                f"policy {rate_law}: agents of {list(resp.failed)} did not "
                "accept it (see the controller's log)"
            )
        return list(resp.pushed_to)

    def set_queue_rate(self, switch: str, port: int, rate_bps: float) -> None:
        """A port's drain rate, as the controller sets the model's (SwitchAdmin on the
        built-in switch, simple_switch_CLI over Thrift on bmv2)."""
        sw = self.switch_node(switch)
        if port not in sw.port_map():
            raise TestbedError(f"{switch} has no port {port}")
        if sw.kind == "bmv2":
            cli = shutil.which("simple_switch_CLI")
            if cli is None:
                raise TestbedError("simple_switch_CLI is not on PATH")
            pps = max(1, round(rate_bps / (8 * self.scaling.frame_bytes)))
            assert sw.runtime is not None and sw.thrift_port is not None
            out = subprocess.run(
                [cli, "--thrift-ip", sw.runtime.mgmt_ip, "--thrift-port", str(sw.thrift_port)],
                input=f"set_queue_rate {pps} {port}\n",
                capture_output=True,
                text=True,
                timeout=30,
            )
            if out.returncode != 0 or "Error" in out.stdout:
                raise TestbedError(f"simple_switch_CLI: {out.stdout.strip()[-300:]}")
            return
        from controller.proto import switch_pb2

        self._switch_admin(sw, "SetQueue", switch_pb2.SetQueueRequest(port=port, rate_bps=rate_bps))

    def _switch_admin(self, sw: P4Switch, method: str, request: Any) -> Any:
        """A SwitchAdmin write to a built-in switch. Its settings are the primary controller's:
        ask with its device and election id (the testbed's controller runs with the config's
        default)."""
        from controller.config import ControllerSection
        from controller.proto import switch_pb2, switch_pb2_grpc

        eid = ControllerSection.election_id
        request.device_id = sw.device_id
        request.election_id.CopyFrom(switch_pb2.ElectionId(high=eid >> 64, low=eid & (2**64 - 1)))
        with grpc.insecure_channel(sw.grpc_addr) as ch:
            try:
                return getattr(switch_pb2_grpc.SwitchAdminStub(ch), method)(request, timeout=5)
            except grpc.RpcError as exc:
                raise TestbedError(
                    f"{sw.name}: {method}: {exc.code().name} {exc.details()}"
                ) from None

    # ---- faults (testbed/faults.py) -------------------------------------------------------

    def apply_fault(self, f: faults.Fault) -> None:
        """Inject or remove one fault: port settings through SwitchAdmin's SetFault, a
        switch's process killed (SIGKILL, by the PID this testbed started) or restarted."""
        faults.check(self.spec, f)
        if f.kind == "kill":
            node = self.switch_node(f.target)
            if node.component is not None and node.component.alive():
                node.component.proc.kill()
                node.component.proc.wait()
            return
        if f.kind == "up" and faults.target_class(self.spec, f.target) == "switch":
            node = self.switch_node(f.target)
            if node.component is not None and not node.component.alive():
                node.start([])  # a killed switch comes back: the controller reprograms it
                node.component.wait_until(node.listening, 30, "listening")  # type: ignore[union-attr]
                return
        if faults.target_class(self.spec, f.target) == "nic" and f.kind in ("rate", "up"):
            # the NIC's port sends at a fraction of its line rate (its agent's HTB port
            # class), its rate laws unaware, as on the twin
            rate = 0 if f.kind == "up" else round(self.nic_line_rate(f.target) * (f.value or 1.0))
            self._set_port_rate(f.target, rate)
            if rate:
                self._slowed_nics.add(f.target)
            else:
                self._slowed_nics.discard(f.target)
        for ps in faults.port_settings(self.spec, f):
            self._set_fault(ps)

    def heal(self) -> None:
        """Every switch port back to healthy, killed switches restarted."""
        restarted = set()
        for sw in self.spec.switches:
            node = self.switch_node(sw.name)
            if node.component is not None and not node.component.alive():
                self.apply_fault(faults.Fault(sw.name, "up"))
                restarted.add(sw.name)  # a new process: no fault (and no primary yet)
        for ps in faults.heal_all(self.spec):
            if ps.switch not in restarted:
                self._set_fault(ps)
        for host in sorted(self._slowed_nics):
            self._set_port_rate(host, 0)
        self._slowed_nics.clear()

    def _set_port_rate(self, host: str, rate_bps: int) -> None:
        from controller.proto import agent_pb2

        self.agent_stub(host).SetPortRate(
            agent_pb2.SetPortRateRequest(rate_bps=rate_bps), timeout=10
        )

    def _set_fault(self, ps: faults.PortSetting) -> None:
        from controller.proto import switch_pb2

        sw = self.switch_node(ps.switch)
        if sw.kind != "builtin":
            raise TestbedError(
                f"{ps.switch}: faults need the built-in switch's traffic "
                f"manager (this is {sw.kind})"
            )
        self._switch_admin(sw, "SetFault", switch_pb2.SetFaultRequest(**faults.request_fields(ps)))

    # ---- PFC (lossless schemes) ------------------------------------------------------------

    def pfc_config(self, switch: str) -> PfcConfig:
        """A switch's PFC thresholds: its buffer shared by its ports, as the twin's (veths add
        no propagation delay), with headroom for what the emulation adds after a pause: the
        frames an upstream host already handed its kernel (its socket buffers) and the
        software's reaction time on a busy machine."""
        s = self.scaling
        frame = s.wire_frame_bytes  # the largest the hosts send (the links allow jumbo frames)
        queued_s = EMU_PFC_QUEUED_FRAMES * frame * 8 / s.link_bps
        ports = len(self.spec.switch_ports(switch))
        buffer, alpha = s.model.pfc_buffer(ports)
        return pfc_thresholds(
            s.link_bps,
            0,
            frame,
            buffer,
            ports,
            response_ns=round((queued_s + EMU_PFC_REACTION_S) * 1e9),
            alpha=alpha,
        )

    def set_pfc(self, on: bool, watchdog: bool = True) -> None:
        """PFC on (or off) in every switch (SwitchAdmin SetPfc, with the PFC watchdog) and NIC
        (the runs' transports hold while their NIC's `xm_pfc` says paused: `pfc_pins`)."""
        from controller.proto import switch_pb2

        if not on and not self.pfc_on:
            return
        for sw in self.switches():
            if sw.kind != "builtin":
                raise TestbedError(
                    f"{sw.name}: PFC needs the built-in switch's traffic "
                    f"manager ({sw.kind} has no PFC)"
                )
            wd = model_watchdog(self.scaling.scale) if watchdog else None
            req = pfc_request(self.pfc_config(sw.name), wd) if on else switch_pb2.SetPfcRequest()
            self._switch_admin(sw, "SetPfc", req)
        self.pfc_on = on

    def pfc_pins(self) -> dict[str, str]:
        """Each host's pinned `xm_pfc` (its agent's), where its NIC records the pauses."""
        return {h: str(AGENT_BPFFS_ROOT / a.name / "xm_pfc") for h, a in self.agents.items()}

    def pfc_counters(self) -> dict[str, dict[str, int]]:
        """Per switch port and host NIC ("switch:port", "host:0"): PFC frames sent and
        received, paused time (ns) and what the watchdog did; only where something happened
        (the twin's SimFabric.pfc_counters, from SwitchAdmin and the NICs' `xm_pfc`)."""
        from controller.nic.pfc import PinnedPfc

        out = self.switch_pfc_counters()
        now = time.monotonic_ns()
        for host, pin in self.pfc_pins().items():
            if not Path(pin).exists():
                continue
            reader = PinnedPfc(pin)
            try:
                st = reader.state(0)
            finally:
                reader.close()
            d = {
                "pauses_received": st.pauses,
                "resumes_received": st.resumes,
                "paused_ns": st.held_ns(now),
            }
            if any(d.values()):
                out[f"{host}:0"] = d
        return out

    def switch_drops(self) -> dict[str, int] | None:
        """Every built-in switch's own drop counters (GetStatus), by reason, summed; None
        when a switch cannot say (bmv2, or one that does not answer)."""
        from controller.proto import switch_pb2, switch_pb2_grpc

        out: dict[str, int] = {}
        for sw in self.switches():
            if sw.kind != "builtin":
                return None
            try:
                with grpc.insecure_channel(sw.grpc_addr) as ch:
                    st = switch_pb2_grpc.SwitchAdminStub(ch).GetStatus(
                        switch_pb2.GetStatusRequest(), timeout=5
                    )
            except grpc.RpcError:
                return None
            for reason, n in st.drops.items():
                out[reason] = out.get(reason, 0) + n
        return out

    def switch_pfc_counters(self) -> dict[str, dict[str, int]]:
        """The switch ports' part of `pfc_counters` (SwitchAdmin GetQueues)."""
        from controller.proto import switch_pb2, switch_pb2_grpc

        out: dict[str, dict[str, int]] = {}
        for sw in self.switches():
            if sw.kind != "builtin":
                continue
            try:
                with grpc.insecure_channel(sw.grpc_addr) as ch:
                    queues = (
                        switch_pb2_grpc.SwitchAdminStub(ch)
                        .GetQueues(switch_pb2.GetQueuesRequest(), timeout=5)
                        .queues
                    )
            except grpc.RpcError:
                continue  # a switch down (a `kill` fault) has nothing to say
            for q in queues:
                d = {
                    "xoff_sent": q.pfc_xoff_sent,
                    "xon_sent": q.pfc_xon_sent,
                    "pauses_received": q.pfc_pauses_received,
                    "resumes_received": q.pfc_resumes_received,
                    "paused_ns": q.pfc_paused_ns,
                    "storms": q.pfc_storms,
                    "restored": q.pfc_restored,
                    "watchdog_drops": q.pfc_watchdog_drops,
                }
                if any(d.values()):
                    out[f"{sw.name}:{q.port}"] = d
        return out

    # ---- what the traffic and the probes need -------------------------------------------

    def hosts(self, nic: int = 0) -> list[Host]:
        """Traffic endpoints, one per host (NIC `nic`), in topology order."""
        out = []
        for h in self.spec.hosts:
            node = self._node(h.name)
            out.append(Host(h.name, node.netns_path, h.nics[nic].ip, h.ifname(nic)))
        return out

    def node(self, name: str) -> Any:
        return self._node(name)

    def switch_node(self, name: str) -> P4Switch:
        node = self._node(name)
        assert isinstance(node, P4Switch)
        return node

    # ---- stop -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop exactly what this testbed started (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for ch in self._channels:
            ch.close()
        errors: list[str] = []
        if self.prometheus is not None:
            self.prometheus.stop()  # first: the daemons it scrapes are going away
        for a in self.agents.values():
            rc = a.component.stop(timeout=15)
            if rc not in (0, None):
                errors.append(f"agent {a.host} exited with {rc}")
            self._remove_agent_leftovers(a)
        if self.net is not None:
            self._teardown_left += self._qdisc_leftovers()
        if self.controller is not None:
            self.controller.stop(timeout=15)
        if self.net is not None:
            try:
                self.net.stop()  # switches (processes, then shells), links, host shells
            except Exception as exc:  # keep going: the rest must still be removed
                errors.append(f"Mininet stop: {exc}")
        for s in self.switches() if self.net is not None else []:
            if s.component is not None:
                s.component.stop()
        for ifn in self.mgmt_links:
            _sh("ip", "link", "del", ifn, check=False)
        if self.collector_netns:
            _sh("ip", "netns", "del", self.collector_netns, check=False)
        if errors:
            self.say("teardown: " + "; ".join(errors))

    def _qdisc_leftovers(self) -> list[str]:
        """HTB classes or clsact/XDP the agents left on the hosts' NICs (their namespaces go
        away with the hosts: this is the last look)."""
        out = []
        for h in self.spec.hosts:
            node = self.net.nameToNode.get(h.name)
            if node is None or node.shell is None:
                continue
            for i in range(len(h.nics)):
                ifn = h.ifname(i)
                classes = node.cmd(f"tc class show dev {ifn}").strip()
                qdiscs = node.cmd(f"tc qdisc show dev {ifn}")
                link = node.cmd(f"ip -d link show dev {ifn}")
                if classes:
                    out.append(f"HTB classes on {h.name}:{ifn}")
                if "htb" in qdiscs or "clsact" in qdiscs:
                    out.append(f"qdisc on {h.name}:{ifn}")
                if "prog/xdp" in link or " xdp " in link:
                    out.append(f"XDP program on {h.name}:{ifn}")
        return out

    def _remove_agent_leftovers(self, a: AgentHandle) -> None:
        """An agent that did not exit cleanly leaves its pins (a bpffs mount) and run files:
        remove this run's, and only this run's."""
        pins = AGENT_BPFFS_ROOT / a.name
        if pins.is_dir():
            if os.path.ismount(pins):
                _sh("umount", str(pins), check=False)
            for p in pins.glob("*"):
                p.unlink(missing_ok=True)
            pins.rmdir()
        run = AGENT_RUN_ROOT / a.name
        if run.is_dir():
            for p in run.glob("*"):
                p.unlink(missing_ok=True)
            run.rmdir()

    def leftovers(self) -> list[str]:
        """Anything of this run still on the machine: processes, namespaces, links, pins."""
        out = list(self._teardown_left)
        comps = [a.component for a in self.agents.values()]
        comps += [c for c in [self.controller] if c is not None]
        if self.prometheus is not None and self.prometheus.component is not None:
            comps.append(self.prometheus.component)
        comps += [s.component for s in (self.switches() if self.net else []) if s.component]
        out += [f"process {c.name} (pid {c.pid})" for c in comps if c.alive()]
        if self.net is not None:
            for n in self.net.hosts + self.net.switches:
                if n.shell is not None and n.shell.poll() is None:
                    out.append(f"Mininet shell of {n.name} (pid {n.pid})")
        links = _sh("ip", "-o", "link", "show", check=False)
        out += [
            f"link {ifn}" for ifn in self.mgmt_links if f" {ifn}@" in links or f" {ifn}:" in links
        ]
        if self.collector_netns and (Path("/run/netns") / self.collector_netns).exists():
            out.append(f"netns {self.collector_netns}")
        for root in (AGENT_BPFFS_ROOT, AGENT_RUN_ROOT):
            out += [f"{root / a.name}" for a in self.agents.values() if (root / a.name).exists()]
        return out

    def __enter__(self) -> Testbed:
        if not self.started:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wire_peer(node: Any, ifname: str) -> tuple[str, str] | None:
    """The far end of a host interface's veth: its namespace's path and its name, where the
    node there is in a namespace of its own (the switches)."""
    intf = node.intf(ifname)
    link = getattr(intf, "link", None)
    if link is None:
        return None
    other = link.intf2 if link.intf1 is intf else link.intf1
    path = getattr(other.node, "netns_path", None)
    return (path, other.name) if path else None


def _dump_spec(spec: FabricSpec) -> str:
    from testbed.topo import dump

    return dump(spec)


def _free_linklocal_24() -> ipaddress.IPv4Network:
    """A 169.254.X.0/24 with no address or route of the root namespace in it."""
    used: list[ipaddress.IPv4Network] = []
    for cmd in (["ip", "-4", "-j", "addr"], ["ip", "-4", "-j", "route", "show", "table", "all"]):
        try:
            doc = json.loads(_sh(*cmd) or "[]")
        except (TestbedError, ValueError):
            continue
        for entry in doc:
            for a in entry.get("addr_info", []):
                used.append(ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
            dst = entry.get("dst")
            if dst and dst != "default":
                try:
                    net = ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False)
                except ValueError:
                    continue
                if net.prefixlen >= 17:  # the zeroconf /16 route does not count
                    used.append(net)
    candidates = [x for x in range(1, 255) if x != 169]
    random.shuffle(candidates)
    for x in candidates:
        net = ipaddress.IPv4Network(f"169.254.{x}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise TestbedError("no free 169.254.X.0/24 for the management links")


def install_signal_handlers(exc: type[BaseException] = KeyboardInterrupt) -> None:
    """SIGTERM raises `exc` (Ctrl-C's KeyboardInterrupt by default; the CLI, which catches
    that one, uses SystemExit): the `with Testbed(...)` block unwinds and tears down."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise exc(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
