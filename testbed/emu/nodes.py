"""Mininet node classes of the testbed: hosts with the fabric's addressing, and the P4 switch
launchers (bmv2's `simple_switch_grpc` when it is on PATH, else the built-in `xingmai-switch`).

Every switch runs in a network namespace of its own (Mininet `inNamespace`): its ports are
veths inside it, so no interface name of a run can collide with another run on the same
machine. The switch's P4Runtime (and bmv2's Thrift) server listens on a management veth whose
other end is in the root namespace with a link-local /30: only this machine can reach it
(bmv2's Thrift server binds every address of its namespace). The switch process is started
with `nsenter --net=` into that namespace, logs to the run directory and is stopped by PID.
"""

from __future__ import annotations

import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mininet.node import Host, Switch

from controller.wire.stamp import STAMP
from testbed.emu.procs import Component
from testbed.switch.dataplane import parse_wire
from testbed.switch.v1model import DEFAULT_PIPELINE

REPO = Path(__file__).resolve().parents[2]
GRPC_PORT = 9559  # P4Runtime (+ SwitchAdmin on the built-in switch), in the switch's netns
THRIFT_PORT = 9090  # bmv2
METRICS_PORT = 9560  # Prometheus metrics of the built-in switch, on its management address
CPU_PORT = 255


def _quiet_intf(node: Any, ifname: str, mtu: int) -> None:
    """What a software switch's link needs: no offloads (the switch sees and forwards the
    frames as they are: checksums filled in, no GSO super-frames), the jumbo MTU, no IPv6
    chatter (router solicitations would be counted as drops by the P4 program)."""
    node.cmd(f"ip link set dev {ifname} mtu {mtu}")
    node.cmd(f"ethtool -K {ifname} tx off tso off gso off gro off >/dev/null 2>&1")
    node.cmd(f"sysctl -qw net.ipv6.conf.{ifname}.disable_ipv6=1")


class FabricHost(Host):
    """A host of the fabric: its NICs get their address (/32), MAC and MTU; everything is
    routed through the switch each NIC hangs off (a gateway address with a permanent
    neighbour entry for the switch's router MAC)."""

    def config(
        self,
        nics: tuple[dict[str, str], ...] = (),
        mtu: int = 9000,  # type: ignore[override]
        collector: bool = False,
        **params: Any,
    ) -> dict[str, Any]:
        r: dict[str, Any] = super().config(**params)
        self.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1")
        self.nics = nics
        for i, nic in enumerate(nics):
            ifn = f"{self.name}-eth{i}"
            intf = self.intf(ifn)
            intf.setMAC(nic["mac"])
            _quiet_intf(self, ifn, mtu)
            self.cmd(f"ip addr flush dev {ifn}")
            self.cmd(f"ip addr add {nic['ip']}/32 dev {ifn}")
            intf.ip, intf.prefixLen = nic["ip"], 32
            self.cmd(f"ip link set {ifn} up")
            gw = nic["gateway"]
            self.cmd(f"ip route add {gw} dev {ifn} scope link")
            self.cmd(f"ip neigh replace {gw} lladdr {nic['router_mac']} dev {ifn} nud permanent")
            if i == 0:
                self.cmd(f"ip route add default via {gw} dev {ifn} src {nic['ip']}")
            else:
                self.cmd(f"ip route add {nic['subnet']} via {gw} dev {ifn} src {nic['ip']}")
        return r

    @property
    def netns_path(self) -> str:
        return f"/proc/{self.pid}/ns/net"


@dataclass
class SwitchRuntime:
    """Where the testbed put a switch: its run files and management address."""

    run_dir: Path
    mgmt_ip: str
    mtu: int
    pcap: bool = False
    log_level: str = "info"
    nice: int = 0  # scheduling priority of the switch process
    qdepth_unit: str = "bytes"  # cells where a shared buffer's queues pass 19 bits of bytes
    pipeline: str = DEFAULT_PIPELINE  # the P4 pipeline: the Python reference or native code
    wires: tuple[str, ...] = ()  # the built-in switch's --wire: its links' time


class P4Switch(Switch):
    """A P4 target in its own network namespace. Subclasses give the command line."""

    kind = ""

    def __init__(
        self, name: str, device_id: int = 1, node_id: int = 1, router_mac: str = "", **params: Any
    ):
        params["inNamespace"] = True
        super().__init__(name, **params)
        self.controlIntf = None  # no Mininet control network: P4Runtime over the mgmt veth
        self.device_id = device_id
        self.node_id = node_id
        self.router_mac = router_mac
        self.runtime: SwitchRuntime | None = None
        self.component: Component | None = None

    @property
    def netns_path(self) -> str:
        return f"/proc/{self.pid}/ns/net"

    @property
    def grpc_addr(self) -> str:
        assert self.runtime is not None
        return f"{self.runtime.mgmt_ip}:{GRPC_PORT}"

    @property
    def thrift_port(self) -> int | None:
        return None

    @property
    def metrics_addr(self) -> str | None:
        """Where the switch serves Prometheus metrics (None: the target has none)."""
        return None

    def port_map(self) -> dict[int, str]:
        """port number -> interface name (Mininet's numbering is the P4 port number)."""
        return {p: str(i) for p, i in self.intfs.items() if str(i) != "lo"}

    def log_path(self) -> Path:
        """The switch's own log (its console output)."""
        assert self.runtime is not None
        return self.runtime.run_dir / "logs" / f"switch-{self.name}.log"

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self, controllers: list[Any]) -> None:
        rt = self.runtime
        if rt is None:
            raise RuntimeError(f"{self.name}: the testbed sets the switch's runtime first")
        # a stamped wire's frames carry their due after their bytes (STAMP): room for it
        stamped = {port for port, w in map(parse_wire, rt.wires) if w.stamped}
        for port, ifn in self.port_map().items():
            _quiet_intf(self, ifn, rt.mtu + (STAMP.size if port in stamped else 0))
        if rt.pcap:
            (rt.run_dir / "pcap" / self.name).mkdir(parents=True, exist_ok=True)
        self.component = Component(
            f"switch {self.name} ({self.kind})",
            ["nsenter", f"--net={self.netns_path}", "--", *self.argv()],
            self.log_path(),
            cwd=REPO,
            nice=rt.nice,
        )

    def listening(self) -> bool:
        assert self.runtime is not None
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex((self.runtime.mgmt_ip, GRPC_PORT)) == 0

    def stop(self, deleteIntfs: bool = False) -> None:  # noqa: N803 - Mininet's name
        if self.component is not None:
            self.component.stop()
        super().stop(deleteIntfs)

    def connected(self) -> bool:
        return self.component is not None and self.component.alive() and self.listening()


class BuiltinSwitch(P4Switch):
    """`xingmai-switch` (testbed.switch): the project's own target, queue depth in bytes."""

    kind = "builtin"

    @property
    def metrics_addr(self) -> str | None:
        assert self.runtime is not None
        return f"{self.runtime.mgmt_ip}:{METRICS_PORT}"

    def argv(self) -> list[str]:
        rt = self.runtime
        assert rt is not None
        argv = [sys.executable, "-m", "testbed.switch.main"]
        for port, ifn in sorted(self.port_map().items()):
            argv += ["-i", f"{port}@{ifn}"]
        for wire in rt.wires:
            argv += ["--wire", wire]
        argv += [
            "--device-id",
            str(self.device_id),
            "--no-p4",
            "--name",
            self.name,
            "--queue-depth-unit",
            rt.qdepth_unit,
            "--pipeline",
            rt.pipeline,
            "-L",
            rt.log_level,
            "--metrics-addr",
            str(self.metrics_addr),
        ]
        if rt.pcap:
            argv += ["--pcap", str(rt.run_dir / "pcap" / self.name)]
        return argv + ["--", "--grpc-server-addr", self.grpc_addr, "--cpu-port", str(CPU_PORT)]


class Bmv2Switch(P4Switch):
    """bmv2's `simple_switch_grpc`; queue rates go over Thrift (simple_switch_CLI)."""

    kind = "bmv2"

    @property
    def thrift_port(self) -> int | None:
        return THRIFT_PORT

    def argv(self) -> list[str]:
        rt = self.runtime
        assert rt is not None
        exe = shutil.which("simple_switch_grpc")
        if exe is None:
            raise RuntimeError("simple_switch_grpc is not on PATH")
        argv = [exe, "--device-id", str(self.device_id)]
        for port, ifn in sorted(self.port_map().items()):
            argv += ["-i", f"{port}@{ifn}"]
        argv += [
            "--thrift-port",
            str(THRIFT_PORT),
            "--no-p4",
            "--log-console",
            "--log-level",
            rt.log_level,
        ]
        if rt.pcap:
            argv += ["--pcap", str(rt.run_dir / "pcap" / self.name)]
        return argv + ["--", "--grpc-server-addr", self.grpc_addr, "--cpu-port", str(CPU_PORT)]


SWITCH_CLASSES: dict[str, type[P4Switch]] = {"builtin": BuiltinSwitch, "bmv2": Bmv2Switch}


def bmv2_available() -> str:
    """Why bmv2 cannot be used ('' when it can)."""
    for exe in ("simple_switch_grpc", "simple_switch_CLI"):
        if shutil.which(exe) is None:
            return f"{exe} is not on PATH"
    return ""


def choose_switch(choice: str) -> type[P4Switch]:
    """`auto`: bmv2 when simple_switch_grpc (and its CLI, for queue rates) is on PATH, else
    the built-in switch."""
    if choice == "auto":
        return Bmv2Switch if not bmv2_available() else BuiltinSwitch
    if choice == "bmv2" and (why := bmv2_available()):
        raise RuntimeError(f"--switch bmv2: {why}")
    if choice not in SWITCH_CLASSES:
        raise ValueError(f"--switch: expected auto, bmv2 or builtin, got {choice!r}")
    return SWITCH_CLASSES[choice]
