"""A bench rig: one switch process and N hosts in network namespaces, each host joined to a
switch port by a veth pair. Used by the switch's namespace tests and its benchmark; the full
testbed (Mininet topologies) lives elsewhere.

Everything the rig makes carries a unique prefix and `close()` removes exactly that: the
switch process (by PID), the host namespaces (their veths go with them).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from controller.common.ports import free_port


def run(*argv: str) -> str:
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip()}")
    return res.stdout


@dataclass
class RigHost:
    name: str
    netns: str
    ifname: str  # inside the namespace
    sw_ifname: str  # switch side, in the caller's namespace
    port: int
    ip: str
    mac: str

    def cmd(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def run(self, *argv: str) -> str:
        return run(*self.cmd(*argv))


class SwitchRig:
    """`n_hosts` hosts 10.0.<i>.1/24 on ports 1..n of one switch (router MAC 00:00:00:00:fe:<i>)."""

    def __init__(self, n_hosts: int, *, prefix: str | None = None):
        if os.geteuid() != 0:
            raise PermissionError("the rig needs root (namespaces, veths, raw sockets)")
        self.prefix = prefix or f"xr{uuid.uuid4().hex[:5]}"
        self.hosts: list[RigHost] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.grpc_addr = ""
        self.binary = ""
        self.log_path: Path | None = None
        try:
            for i in range(1, n_hosts + 1):
                self._add_host(i)
        except BaseException:
            self.close()
            raise

    def _add_host(self, i: int) -> None:
        ns = f"{self.prefix}h{i}"
        run("ip", "netns", "add", ns)
        host = RigHost(
            f"h{i}",
            ns,
            f"{self.prefix}e{i}",
            f"{self.prefix}s{i}",
            i,
            f"10.0.{i}.1",
            f"02:00:00:00:00:{i:02x}",
        )
        self.hosts.append(host)
        run("ip", "link", "add", host.sw_ifname, "type", "veth", "peer", "name", host.ifname)
        run("ip", "link", "set", host.ifname, "netns", ns)
        # Offloads off on both ends: a software switch sees the frames the wire would carry
        # (no partial checksums, no GSO super-frames).
        for argv in (
            ["ip", "link", "set", host.sw_ifname, "up"],
            [
                "ethtool",
                "-K",
                host.sw_ifname,
                "tx",
                "off",
                "tso",
                "off",
                "gso",
                "off",
                "gro",
                "off",
            ],
            ["sysctl", "-qw", f"net.ipv6.conf.{host.sw_ifname}.disable_ipv6=1"],
        ):
            subprocess.run(argv, capture_output=True)
        host.run("ip", "link", "set", "lo", "up")
        host.run("ip", "link", "set", host.ifname, "address", host.mac)
        host.run("ip", "addr", "add", f"{host.ip}/24", "dev", host.ifname)
        host.run("ip", "link", "set", host.ifname, "up")
        subprocess.run(
            host.cmd("ethtool", "-K", host.ifname, "tx", "off", "tso", "off", "gso", "off"),
            capture_output=True,
        )
        subprocess.run(
            host.cmd("sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"), capture_output=True
        )
        # Everything off-subnet goes to the switch, whose router MAC the host knows statically.
        router_ip = f"10.0.{i}.254"
        router_mac = f"00:00:00:00:fe:{i:02x}"
        host.run(
            "ip",
            "neigh",
            "add",
            router_ip,
            "lladdr",
            router_mac,
            "dev",
            host.ifname,
            "nud",
            "permanent",
        )
        host.run("ip", "route", "add", "10.0.0.0/8", "via", router_ip, "dev", host.ifname)

    def start_switch(
        self,
        program: Path | None = None,
        *,
        binary: str = "xingmai-switch",
        extra: list[str] | None = None,
        cpu: int | None = None,
        log_dir: Path | None = None,
    ) -> str:
        """Start the switch with every host's port; returns its gRPC address."""
        port = free_port()
        self.grpc_addr = f"127.0.0.1:{port}"
        self.binary = binary
        ifs = [a for h in self.hosts for a in ("-i", f"{h.port}@{h.sw_ifname}")]
        if binary == "xingmai-switch":
            argv = [sys.executable, "-m", "testbed.switch.main"]
        else:
            resolved = shutil.which(binary)
            if resolved is None:
                raise FileNotFoundError(binary)
            argv = [resolved]
        argv += [*ifs, "--device-id", "1"]
        argv += [str(program)] if program else ["--no-p4"]
        if binary != "xingmai-switch":
            argv += ["--", "--grpc-server-addr", self.grpc_addr, "--cpu-port", "255"]
        else:
            argv += ["--grpc-server-addr", self.grpc_addr, "--cpu-port", "255"]
        argv += extra or []
        if cpu is not None:
            argv = ["taskset", "-c", str(cpu), *argv]
        log_dir = log_dir or Path("/tmp")
        self.log_path = log_dir / f"{self.prefix}-switch.log"
        with open(self.log_path, "wb") as logf:
            self.proc = subprocess.Popen(
                argv, stdout=logf, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2]
            )
        self._wait_grpc(port)
        return self.grpc_addr

    def _wait_grpc(self, port: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"switch exited ({self.proc.returncode}): {self.log_tail()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"switch did not listen on {port}: {self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop_switch(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop_switch()
        for h in self.hosts:
            subprocess.run(["ip", "netns", "del", h.netns], capture_output=True)
            subprocess.run(["ip", "link", "del", h.sw_ifname], capture_output=True)
        self.hosts.clear()

    def __enter__(self) -> SwitchRig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
