"""Hosts as network namespaces, and a small LAN of them for tests and benchmarks.

`Host` is what the runner needs to reach a host: where its network namespace is and its IPv4
address. The testbed (Mininet or its own topologies) makes hosts its way and passes `Host`s;
`NetnsLan` makes a switchless LAN for the transport's own tests: two namespaces joined by a
veth, or N namespaces on a Linux bridge in a namespace of its own. Every name carries a unique
prefix, and `close()` deletes exactly the namespaces it made (their veths go with them).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass

from controller.common.netns import netns_path


@dataclass(frozen=True)
class Host:
    """A host: display name, its network namespace (a name under /run/netns, a path such as
    /proc/<pid>/ns/net, or "" for the caller's own), its IPv4 address, and its interface."""

    name: str
    netns: str
    ip: str
    ifname: str = ""

    @property
    def netns_path(self) -> str:
        return netns_path(self.netns) if self.netns else ""

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host's network namespace (mount namespace untouched)."""
        if not self.netns:
            return argv
        return ["nsenter", f"--net={self.netns_path}", "--", *argv]


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


class NetnsLan:
    """N hosts in fresh namespaces: a direct veth for 2, a bridge namespace for more."""

    def __init__(
        self, n_hosts: int, *, subnet: str = "10.201.0", mtu: int = 1500, prefix: str | None = None
    ) -> None:
        if not 2 <= n_hosts <= 250:
            raise ValueError("n_hosts must be in 2..250")
        if os.geteuid() != 0:
            raise PermissionError("network namespaces need root")
        self.prefix = prefix or f"xmt{uuid.uuid4().hex[:6]}"
        self.namespaces: list[str] = []
        self.hosts: list[Host] = []
        self.bridge_ns: str | None = None
        try:
            self._build(n_hosts, subnet, mtu)
        except BaseException:
            self.close()
            raise

    def _netns(self, name: str) -> str:
        _run("ip", "netns", "add", name)
        self.namespaces.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def _build(self, n: int, subnet: str, mtu: int) -> None:
        p = self.prefix
        names = [self._netns(f"{p}h{i}") for i in range(n)]
        if n == 2:
            _run(
                "ip",
                "link",
                "add",
                f"{p}e0",
                "mtu",
                str(mtu),
                "netns",
                names[0],
                "type",
                "veth",
                "peer",
                "name",
                f"{p}e1",
                "mtu",
                str(mtu),
                "netns",
                names[1],
            )
            ifnames = [f"{p}e0", f"{p}e1"]
        else:
            self.bridge_ns = br = self._netns(f"{p}br")
            _run("ip", "-n", br, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", br, "link", "set", "br0", "up")
            ifnames = []
            for i, ns in enumerate(names):
                _run(
                    "ip",
                    "link",
                    "add",
                    f"{p}e{i}",
                    "mtu",
                    str(mtu),
                    "netns",
                    ns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    f"{p}p{i}",
                    "mtu",
                    str(mtu),
                    "netns",
                    br,
                )
                _run("ip", "-n", br, "link", "set", f"{p}p{i}", "master", "br0", "up")
                ifnames.append(f"{p}e{i}")
        for i, (ns, ifn) in enumerate(zip(names, ifnames, strict=True)):
            ip = f"{subnet}.{i + 1}"
            _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", ifn)
            _run("ip", "-n", ns, "link", "set", ifn, "up")
            self.hosts.append(Host(f"h{i}", ns, ip, ifn))

    def close(self) -> None:
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces.clear()

    def __enter__(self) -> NetnsLan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
