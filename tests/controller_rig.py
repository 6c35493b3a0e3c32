"""The controller tests' rig (no tests here): a small leaf-spine fabric, hosts in network
namespaces, one built-in switch process per switch, veth pairs for every link, the collector's
dataplane end in a namespace of its own; and the controller daemon as a subprocess on a config
written for it.

Everything carries a unique prefix; `close()` removes exactly what was made (processes by PID,
namespaces and root-side veths by name). This is the tests' rig, not the testbed (issue 7).
The program is p4src/build's; XM_TEST_P4INFO / XM_TEST_JSON point the tests at another build.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from controller.common.ports import free_port

REPO = Path(__file__).resolve().parents[1]
P4INFO = Path(os.environ.get("XM_TEST_P4INFO", REPO / "p4src" / "build" / "xingmai.p4info.txtpb"))
BMV2_JSON = Path(os.environ.get("XM_TEST_JSON", REPO / "p4src" / "build" / "xingmai.json"))
COLLECTOR_IP = "10.0.100.1"
COLLECTOR_MAC = "02:00:00:00:64:01"


def sh(*argv: str, check: bool = True) -> str:
    res = subprocess.run(argv, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip()}")
    return res.stdout


@dataclass
class FabricHost:
    name: str
    netns: str
    ip: str
    mac: str
    leaf: str
    port: int

    def cmd(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclass
class FabricSwitch:
    name: str
    short: str
    device_id: int
    router_mac: str
    grpc_port: int
    ports: dict[int, str] = field(default_factory=dict)  # port -> root-side interface
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


class Fabric:
    """`leaves` x `spines` leaf-spine, `per_leaf` hosts per leaf, collector on leaf1."""

    def __init__(
        self,
        tmp: Path,
        leaves: int = 2,
        spines: int = 2,
        per_leaf: int = 2,
        int_mode: str = "switch",
    ):
        if os.geteuid() != 0:
            raise PermissionError("the fabric needs root (namespaces, veths, raw sockets)")
        self.tmp = tmp
        self.prefix = f"xc{uuid.uuid4().hex[:4]}"
        self.hosts: list[FabricHost] = []
        self.switches: dict[str, FabricSwitch] = {}
        self.links: list[list[str]] = []
        self.netns: list[str] = []
        self.root_ifs: list[str] = []
        self.controller: subprocess.Popen[bytes] | None = None
        self.ctl_log = tmp / "controller.log"
        self.ctl_port = free_port()
        self.collector_port = free_port(socket.SOCK_DGRAM)
        self.collector_ns = f"{self.prefix}col"
        self.int_mode = int_mode
        try:
            self._build(leaves, spines, per_leaf)
        except BaseException:
            self.close()
            raise

    # ---- construction ----

    def _ns(self, name: str) -> str:
        sh("ip", "netns", "add", name)
        self.netns.append(name)
        sh("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
        subprocess.run(
            ["ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"],
            capture_output=True,
        )
        return name

    def _quiet(self, ifname: str, netns: str | None = None) -> None:
        pre = ["ip", "netns", "exec", netns] if netns else []
        # a software switch must see the frames the wire carries: no offloads
        subprocess.run(
            [*pre, "ethtool", "-K", ifname, "tx", "off", "tso", "off", "gso", "off", "gro", "off"],
            capture_output=True,
        )
        subprocess.run(
            [*pre, "sysctl", "-qw", f"net.ipv6.conf.{ifname}.disable_ipv6=1"], capture_output=True
        )

    def _port_if(self, sw: FabricSwitch, port: int) -> str:
        name = f"{self.prefix}{sw.short}p{port}"
        sw.ports[port] = name
        return name

    def _build(self, leaves: int, spines: int, per_leaf: int) -> None:
        n = 0
        for i in range(1, leaves + 1):
            n += 1
            self.switches[f"leaf{i}"] = FabricSwitch(
                f"leaf{i}", f"l{i}", n, f"00:00:00:00:fe:{n:02x}", free_port()
            )
        for i in range(1, spines + 1):
            n += 1
            self.switches[f"spine{i}"] = FabricSwitch(
                f"spine{i}", f"s{i}", n, f"00:00:00:00:fe:{n:02x}", free_port()
            )
        hidx = 0
        for li in range(1, leaves + 1):
            leaf = self.switches[f"leaf{li}"]
            for k in range(1, per_leaf + 1):
                hidx += 1
                host = FabricHost(
                    f"h{hidx}",
                    self._ns(f"{self.prefix}h{hidx}"),
                    f"10.0.{li}.{k}",
                    f"02:00:00:00:{li:02x}:{k:02x}",
                    leaf.name,
                    k,
                )
                self.hosts.append(host)
                sw_if = self._port_if(leaf, k)
                h_if = f"{self.prefix}h{hidx}e"
                sh("ip", "link", "add", sw_if, "type", "veth", "peer", "name", h_if)
                self.root_ifs.append(sw_if)
                sh("ip", "link", "set", h_if, "netns", host.netns)
                sh("ip", "link", "set", sw_if, "up")
                self._quiet(sw_if)
                run = host.cmd
                sh(*run("ip", "link", "set", h_if, "name", "eth0"))
                sh(*run("ip", "link", "set", "eth0", "address", host.mac))
                sh(*run("ip", "addr", "add", f"{host.ip}/32", "dev", "eth0"))
                sh(*run("ip", "link", "set", "eth0", "up"))
                self._quiet("eth0", host.netns)
                # everything goes to the leaf, whose router MAC the host knows statically
                gw = f"10.0.{li}.254"
                sh(
                    *run(
                        "ip",
                        "neigh",
                        "add",
                        gw,
                        "lladdr",
                        leaf.router_mac,
                        "dev",
                        "eth0",
                        "nud",
                        "permanent",
                    )
                )
                sh(*run("ip", "route", "add", gw, "dev", "eth0", "scope", "link"))
                sh(*run("ip", "route", "add", "10.0.0.0/8", "via", gw, "dev", "eth0"))
                self.links.append([f"{host.name}:eth0", f"{leaf.name}:{k}"])
        for li in range(1, leaves + 1):
            leaf = self.switches[f"leaf{li}"]
            for si in range(1, spines + 1):
                spine = self.switches[f"spine{si}"]
                lp, sp = per_leaf + si, li
                a, b = self._port_if(leaf, lp), self._port_if(spine, sp)
                sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
                self.root_ifs += [a, b]
                for ifn in (a, b):
                    sh("ip", "link", "set", ifn, "up")
                    self._quiet(ifn)
                self.links.append([f"{leaf.name}:{lp}", f"{spine.name}:{sp}"])
        # the collector's dataplane end: its own namespace, on leaf1's last port
        leaf1 = self.switches["leaf1"]
        cport = per_leaf + spines + 1
        sw_if = self._port_if(leaf1, cport)
        c_if = f"{self.prefix}ce"
        ns = self._ns(self.collector_ns)
        sh("ip", "link", "add", sw_if, "type", "veth", "peer", "name", c_if)
        self.root_ifs.append(sw_if)
        sh("ip", "link", "set", c_if, "netns", ns)
        sh("ip", "link", "set", sw_if, "up")
        self._quiet(sw_if)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", c_if, "address", COLLECTOR_MAC)
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{COLLECTOR_IP}/24", "dev", c_if)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", c_if, "up")
        self._quiet(c_if, ns)
        self.collector_if = c_if
        self.links.append([f"{leaf1.name}:{cport}", "collector"])

    # ---- switches ----

    def start_switches(self) -> None:
        for sw in self.switches.values():
            self.start_switch(sw)
        for sw in self.switches.values():
            self._wait_tcp(sw.grpc_port, sw)

    def start_switch(self, sw: FabricSwitch) -> None:
        argv = [sys.executable, "-m", "testbed.switch.main"]
        for port, ifn in sorted(sw.ports.items()):
            argv += ["-i", f"{port}@{ifn}"]
        argv += [
            "--device-id",
            str(sw.device_id),
            "--no-p4",
            "--cpu-port",
            "255",
            "--grpc-server-addr",
            sw.addr,
            "--queue-depth-unit",
            "bytes",
            "--name",
            sw.name,
        ]
        sw.log = self.tmp / f"{sw.name}.log"
        with open(sw.log, "ab") as logf:
            sw.proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, cwd=REPO)

    def _wait_tcp(self, port: int, sw: FabricSwitch, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sw.proc is not None and sw.proc.poll() is not None:
                raise RuntimeError(f"{sw.name} exited: {self.tail(sw.log)}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"{sw.name} not listening: {self.tail(sw.log)}")

    # ---- the controller ----

    def config(self, **overrides: Any) -> dict[str, Any]:
        switches = []
        for i, sw in enumerate(self.switches.values()):
            switches.append(
                {
                    "name": sw.name,
                    "grpc_addr": sw.addr,
                    "device_id": sw.device_id,
                    "node_id": i + 1,
                    "router_mac": sw.router_mac,
                    "ports": sorted(sw.ports),
                }
            )
        doc: dict[str, Any] = {
            "controller": {
                "name": "test",
                "grpc_addr": f"127.0.0.1:{self.ctl_port}",
                "counter_poll_s": 0.5,
                "rpc_timeout_s": 1.0,
                "reconnect_max_s": 2.0,
            },
            "pipeline": {"p4info": str(P4INFO), "bmv2_json": str(BMV2_JSON)},
            "model": {
                "port_speed_gbps": 400,
                "scale": 4000,
                "queue_depth_bytes": 200000,
                "queue_depth_packets": 256,
            },
            "int": {
                "collector": {
                    "listen": f"0.0.0.0:{self.collector_port}",
                    "netns": self.collector_ns,
                    "ip": COLLECTOR_IP,
                    "mac": COLLECTOR_MAC,
                    "udp_port": self.collector_port,
                }
            },
            "switches": switches,
            "hosts": [
                {
                    "name": h.name,
                    "int": self.int_mode,
                    "nics": [{"name": "eth0", "ip": h.ip, "mac": h.mac}],
                }
                for h in self.hosts
            ],
            "links": self.links,
            "policy": {"interval_s": 0.5},
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(doc.get(key), dict):
                doc[key] = {**doc[key], **value}
            else:
                doc[key] = value
        return doc

    def write_config(self, doc: dict[str, Any] | None = None) -> Path:
        path = self.tmp / "controller.yaml"
        path.write_text(yaml.safe_dump(doc if doc is not None else self.config()))
        return path

    def start_controller(self, config: Path | None = None, *extra: str) -> None:
        config = config or self.write_config()
        argv = [
            sys.executable,
            "-m",
            "controller.daemon",
            "--config",
            str(config),
            "--log-file",
            str(self.ctl_log),
            *extra,
        ]
        self.controller = subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def stub(self) -> Any:
        from controller.proto import controller_pb2_grpc

        channel = grpc.insecure_channel(f"127.0.0.1:{self.ctl_port}")
        return controller_pb2_grpc.ControllerStub(channel)

    def wait_healthy(self, timeout: float = 60.0) -> Any:
        from controller.proto import controller_pb2 as pb

        stub = self.stub()
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.controller is not None and self.controller.poll() is not None:
                err = self.controller.stderr.read().decode() if self.controller.stderr else ""
                raise RuntimeError(
                    f"controller exited {self.controller.returncode}: {err}"
                    f"{self.tail(self.ctl_log)}"
                )
            try:
                last = stub.GetStatus(pb.GetStatusRequest(), timeout=1.0)
                if last.healthy:
                    return last
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"controller not healthy: {last}\n{self.tail(self.ctl_log, 40)}")

    def stop_controller(self, sig: int = signal.SIGTERM) -> int:
        proc, self.controller = self.controller, None
        if proc is None or proc.poll() is not None:
            return proc.returncode if proc else 0
        proc.send_signal(sig)
        try:
            return proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return -9

    # ---- helpers ----

    @staticmethod
    def tail(path: Path | None, n: int = 20) -> str:
        if path is None or not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])

    def host(self, name: str) -> FabricHost:
        return next(h for h in self.hosts if h.name == name)

    def close(self) -> None:
        self.stop_controller()
        for sw in self.switches.values():
            if sw.proc is not None and sw.proc.poll() is None:
                sw.proc.terminate()
                try:
                    sw.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    sw.proc.kill()
                    sw.proc.wait()
        for ns in self.netns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for ifn in self.root_ifs:
            subprocess.run(["ip", "link", "del", ifn], capture_output=True)
        self.netns.clear()
        self.root_ifs.clear()

    def __enter__(self) -> Fabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def kill(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


class FakeHostAgent:
    """A HostAgent gRPC servicer in this process (no eBPF): records what the controller sets.

    `hang` makes every call block until the call's deadline; `flows` is what ListFlows
    returns (besides the caps set on them)."""

    def __init__(self, name: str):
        import threading
        from concurrent import futures

        from controller.proto import agent_pb2_grpc

        self.name = name
        self.caps: dict[tuple[str, str, int, int, int], int] = {}
        self.law: Any = None
        self.int: Any = None
        self.hop_speeds: list[Any] = []
        self.calls: list[str] = []
        self.hang = threading.Event()
        self.flows: list[tuple[tuple[str, str, int, int, int], int]] = []
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        agent_pb2_grpc.add_HostAgentServicer_to_server(self._servicer(), self.server)
        self.server.add_insecure_port(self.addr)
        self.server.start()

    def _servicer(self) -> Any:
        from controller.proto import agent_pb2 as pb
        from controller.proto import agent_pb2_grpc

        agent = self

        def key(k: Any) -> tuple[str, str, int, int, int]:
            return (k.src_ip, k.dst_ip, k.protocol, k.src_port, k.dst_port)

        class Servicer(agent_pb2_grpc.HostAgentServicer):  # type: ignore[misc]
            def _enter(self, what: str, context: Any) -> None:
                agent.calls.append(what)
                if agent.hang.is_set():
                    while context.is_active():
                        time.sleep(0.05)

            def SetCaps(self, request: Any, context: Any) -> Any:
                self._enter("SetCaps", context)
                for c in request.caps:
                    agent.caps[key(c.flow)] = c.cap_bps
                return pb.SetCapsResponse(applied=len(request.caps))

            def ClearCaps(self, request: Any, context: Any) -> Any:
                self._enter("ClearCaps", context)
                for f in request.flows:
                    agent.caps.pop(key(f), None)
                return pb.ClearCapsResponse(cleared=len(request.flows))

            def SetRateLaw(self, request: Any, context: Any) -> Any:
                self._enter("SetRateLaw", context)
                agent.law = request.config
                return pb.SetRateLawResponse(effective=request.config)

            def SetInt(self, request: Any, context: Any) -> Any:
                self._enter("SetInt", context)
                agent.int = request
                return pb.SetIntResponse()

            def SetHopSpeeds(self, request: Any, context: Any) -> Any:
                self._enter("SetHopSpeeds", context)
                agent.hop_speeds = list(request.speeds)
                return pb.SetHopSpeedsResponse()

            def GetStatus(self, request: Any, context: Any) -> Any:
                self._enter("GetStatus", context)
                st = pb.Status(name=agent.name, healthy=True)
                if agent.law is not None:
                    st.host_law.CopyFrom(agent.law)
                return st

            def ListFlows(self, request: Any, context: Any) -> Any:
                self._enter("ListFlows", context)
                resp = pb.ListFlowsResponse()
                for k, rate in agent.flows:
                    resp.flows.add(
                        flow=pb.FlowKey(
                            src_ip=k[0], dst_ip=k[1], protocol=k[2], src_port=k[3], dst_port=k[4]
                        ),
                        rate_bps=rate,
                        cap_bps=agent.caps.get(k, 0),
                        weight=1,
                    )
                return resp

            def GetNicCounters(self, request: Any, context: Any) -> Any:
                # an idle NIC: nothing sent, nothing waited (the slow-NIC rule names nothing)
                self._enter("GetNicCounters", context)
                return pb.NicCounters(time_ns=time.monotonic_ns(), line_rate_bps=100_000_000)

        return Servicer()

    def close(self) -> None:
        self.hang.clear()
        self.server.stop(0)


SENDER = r"""
import socket, sys, time
dst, dport, sport, pps, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    float(sys.argv[4]), float(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", sport))
n = 0
t0 = time.monotonic()
while True:
    t = time.monotonic() - t0
    if t >= seconds:
        break
    s.sendto(n.to_bytes(4, "big") + b"x" * 60, (dst, dport))
    n += 1
    time.sleep(max(0.0, n / pps - (time.monotonic() - t0)))
print(n)
"""

RECEIVER = r"""
import json, socket, sys, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", port))
s.settimeout(0.2)
print("ready", flush=True)
flows = {}
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        data, addr = s.recvfrom(2048)
    except socket.timeout:
        continue
    now = time.monotonic()
    f = flows.setdefault(f"{addr[0]}:{addr[1]}", {"n": 0, "last": now, "max_gap": 0.0,
                                                   "first": now})
    f["n"] += 1
    f["max_gap"] = max(f["max_gap"], now - f["last"])
    f["last"] = now
print(json.dumps(flows))
"""


class Traffic:
    """UDP senders and a receiver in host namespaces (plain sockets, the switch adds INT)."""

    def __init__(self, fabric: Fabric):
        self.fabric = fabric
        self.procs: list[subprocess.Popen[str]] = []
        self.receivers: list[subprocess.Popen[str]] = []

    def receiver(self, host: str, port: int, seconds: float) -> subprocess.Popen[str]:
        h = self.fabric.host(host)
        p = subprocess.Popen(
            h.cmd(sys.executable, "-c", RECEIVER, str(port), str(seconds)),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        self.receivers.append(p)
        return p

    def sender(
        self, host: str, dst: str, dport: int, sport: int, pps: float, seconds: float
    ) -> subprocess.Popen[str]:
        h = self.fabric.host(host)
        p = subprocess.Popen(
            h.cmd(
                sys.executable, "-c", SENDER, dst, str(dport), str(sport), str(pps), str(seconds)
            ),
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        return p

    @staticmethod
    def result(p: subprocess.Popen[str], timeout: float = 60) -> str:
        out, _ = p.communicate(timeout=timeout)
        return out.strip().splitlines()[-1] if out.strip() else ""

    def close(self) -> None:
        for p in self.procs + self.receivers:
            if p.poll() is None:
                p.kill()
                p.wait()


ECHO = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
while True:
    data, addr = s.recvfrom(2048)
    s.sendto(data, addr)
"""

PROBE = r"""
import json, socket, sys, time
port, targets = int(sys.argv[1]), sys.argv[2:]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(0.3)
ok = {}
for t in targets:
    ok[t] = False
    for attempt in range(5):
        s.sendto(t.encode(), (t, port))
        try:
            while True:
                data, addr = s.recvfrom(2048)
                if data == t.encode():
                    ok[t] = True
                    break
        except socket.timeout:
            pass
        if ok[t]:
            break
print(json.dumps(ok))
"""


def reachability(fabric: Fabric, port: int = 9009) -> dict[tuple[str, str], bool]:
    """UDP echo from every host to every other (both directions cross the fabric)."""
    import json

    servers = []
    try:
        for h in fabric.hosts:
            p = subprocess.Popen(
                h.cmd(sys.executable, "-c", ECHO, str(port)), stdout=subprocess.PIPE, text=True
            )
            servers.append(p)
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        out: dict[tuple[str, str], bool] = {}
        for h in fabric.hosts:
            others = [o for o in fabric.hosts if o is not h]
            res = subprocess.run(
                h.cmd(sys.executable, "-c", PROBE, str(port), *[o.ip for o in others]),
                capture_output=True,
                text=True,
                timeout=60,
            )
            got = json.loads(res.stdout)
            for o in others:
                out[(h.name, o.name)] = got[o.ip]
        return out
    finally:
        for p in servers:
            p.kill()
            p.wait()
