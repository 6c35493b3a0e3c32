"""The bmv2 target of the P4 tests: `simple_switch_grpc` processes wired by veth pairs.

Everything the fabric creates is private to it: one network namespace (unique name) holds the
switches' interfaces, the links between them (veth pairs), and the host ports (veth pairs whose
other end the test sends and captures on, through AF_PACKET sockets made inside the
namespace), so no stray frame of a shared machine can reach a test. P4Runtime listens on a
Unix socket (reachable across namespaces); queue rates go through bmv2's Thrift CLI inside the
namespace. Only what was created is removed: the processes by PID, then the namespace.

bmv2 timestamps count from each process's start: the switches are started last-hop first, a
little apart, so that along a path the later switch's clock reads later.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tests.p4.harness import CPU_PORT, Fabric, Topology

ETH_P_ALL = 0x0003
# No frame for this long: nothing is in flight any more. bmv2 on a busy 2-core box was seen
# to deliver the last frames of a stream more than 0.3 s after the one before.
SETTLE_QUIET_S = 1.0
CLONE_NEWNET = 0x40000000


def unavailable() -> str:
    """Why the bmv2 target cannot run here ('' when it can)."""
    if shutil.which("simple_switch_grpc") is None:
        return "simple_switch_grpc is not on PATH"
    if shutil.which("simple_switch_CLI") is None:
        return "simple_switch_CLI (bmv2's Thrift CLI, for queue rates) is not on PATH"
    if os.geteuid() != 0:
        return "needs root for network namespaces and veth pairs"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    return ""


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def _packet_socket_in(ns: str, iface: str) -> socket.socket:
    """An AF_PACKET socket on `iface` of network namespace `ns`. A socket belongs to the
    namespace it was made in, and a thread can enter a namespace on its own (setns), so a
    short-lived thread makes it; the test's threads stay where they are."""
    box: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(f"/run/netns/{ns}") as f:
                if libc.setns(f.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns({ns})")
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.bind((iface, 0))
            box.append(s)
        except BaseException as exc:  # handed to the caller
            box.append(exc)

    t = threading.Thread(target=make)
    t.start()
    t.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


class Bmv2Fabric(Fabric):
    name = "bmv2"
    virtual_time = False

    def __init__(self, topo: Topology):
        self.ns = f"xmp4-{os.getpid()}-{secrets.token_hex(3)}"
        self.tmp = Path(tempfile.mkdtemp(prefix="xingmai-bmv2-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.host_ifaces: dict[str, str] = {}
        self.socks: dict[str, socket.socket] = {}
        self._stop = threading.Event()
        self._readers: list[threading.Thread] = []
        self._last_rx = time.monotonic()
        self.topo = topo
        try:
            self._build_network(topo)
            addresses = self._start_switches(topo)
            super().__init__(topo)
            for i, addr in enumerate(addresses):
                self.clients.connect(i, addr, i + 1)
            self._start_capture()
        except BaseException:
            self._teardown()
            raise

    # ---- network ------------------------------------------------------------------------

    def _ns(self, *cmd: str) -> None:
        _run("ip", "netns", "exec", self.ns, *cmd)

    def _build_network(self, topo: Topology) -> None:
        _run("ip", "netns", "add", self.ns)
        self._ns("ip", "link", "set", "lo", "up")
        for a, pa, b, pb in topo.links:
            _run(
                "ip",
                "link",
                "add",
                f"s{a}p{pa}",
                "netns",
                self.ns,
                "type",
                "veth",
                "peer",
                "name",
                f"s{b}p{pb}",
                "netns",
                self.ns,
            )
        for k, (host, (sw, port)) in enumerate(sorted(topo.hosts.items())):
            outer = f"h{k}"
            self._ns("ip", "link", "add", outer, "type", "veth", "peer", "name", f"s{sw}p{port}")
            self.host_ifaces[host] = outer
        for iface in [
            *self.host_ifaces.values(),
            *(f"s{sw}p{port}" for sw, port in self._switch_ports(topo)),
        ]:
            # no IPv6 (router solicitations, MLD): only test frames flow
            self._ns("sysctl", "-qw", f"net.ipv6.conf.{iface}.disable_ipv6=1")
            self._ns("ip", "link", "set", iface, "up")

    @staticmethod
    def _switch_ports(topo: Topology) -> list[tuple[int, int]]:
        ports = {(a, pa) for a, pa, _, _ in topo.links} | {(b, pb) for _, _, b, pb in topo.links}
        ports |= set(topo.hosts.values())
        return sorted(ports)

    def _start_switches(self, topo: Topology) -> list[str]:
        addresses = [""] * topo.switches
        ports = self._switch_ports(topo)
        for i in reversed(range(topo.switches)):
            sock = self.tmp / f"s{i}.sock"
            ifaces = [arg for sw, port in ports if sw == i for arg in ("-i", f"{port}@s{i}p{port}")]
            cmd = [
                "ip",
                "netns",
                "exec",
                self.ns,
                "simple_switch_grpc",
                "--device-id",
                str(i + 1),
                *ifaces,
                "--thrift-port",
                str(self._thrift_port(i)),
                "--log-file",
                str(self.tmp / f"s{i}"),
                "--log-level",
                "warn",
                "--no-p4",
                "--",
                "--grpc-server-addr",
                f"unix:{sock}",
                "--cpu-port",
                str(CPU_PORT),
            ]
            log = open(self.tmp / f"s{i}.out", "wb")  # noqa: SIM115 - owned by the process
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + 20
            while not sock.exists():
                if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"simple_switch_grpc s{i} did not start: "
                        f"{(self.tmp / f's{i}.out').read_text()[-2000:]}"
                    )
                time.sleep(0.05)
            addresses[i] = f"unix:{sock}"
            time.sleep(0.05)  # later hops' clocks run ahead of earlier hops'
        return addresses

    @staticmethod
    def _thrift_port(i: int) -> int:
        return 9090 + i  # inside the private namespace: no clash with anything else

    def _start_capture(self) -> None:
        for host, iface in self.host_ifaces.items():
            s = _packet_socket_in(self.ns, iface)
            s.settimeout(0.05)
            self.socks[host] = s
            t = threading.Thread(target=self._capture, args=(host, s), daemon=True)
            t.start()
            self._readers.append(t)

    def _capture(self, host: str, s: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                data, addr = s.recvfrom(65535)
            except (TimeoutError, OSError):
                continue
            if addr[2] == socket.PACKET_OUTGOING:
                continue
            self._last_rx = time.monotonic()
            self.received[host].append(data)

    # ---- Fabric ---------------------------------------------------------------------------

    def qdepth_unit_for(self, frame_bytes: int) -> int:
        return frame_bytes  # bmv2 counts packets

    def send(self, host: str, frame: bytes) -> None:
        self.socks[host].send(bytes(frame))
        self._last_rx = time.monotonic()

    def wait(self, ns: int) -> None:
        time.sleep(ns / 1e9)

    def settle(self) -> None:
        time.sleep(0.1)
        while time.monotonic() - self._last_rx < SETTLE_QUIET_S:
            time.sleep(0.05)

    def set_port_rate(self, sw: int, port: int, pps: float, frame_bytes: int) -> None:
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                self.ns,
                "simple_switch_CLI",
                "--thrift-port",
                str(self._thrift_port(sw)),
            ],
            input=f"set_queue_rate {int(pps)} {port}\n",
            check=True,
            capture_output=True,
            text=True,
        )

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._teardown()

    def _teardown(self) -> None:
        self._stop.set()
        for t in self._readers:
            t.join(1)
        for s in self.socks.values():
            s.close()
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)
