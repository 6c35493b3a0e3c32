"""`make doctor`: every prerequisite of the testbed, what is missing and how to get it.

Kernel features are tried for real in a scratch network namespace (removed afterwards): veth
pairs, the clsact and HTB qdiscs, a BPF program attached as XDP to a veth. Nothing else on the
machine is touched.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import shutil
import socket
import struct
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KERNEL_HEADERS_CACHE = Path("/var/cache/xingmai/kernel-headers")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True)


def _tool(name: str, package: str, required: bool = True, why: str = "") -> Check:
    path = shutil.which(name)
    return Check(
        f"{name}",
        path is not None,
        path or "not on PATH" + (f" ({why})" if why else ""),
        f"apt-get install {package} (make install does)",
        required,
    )


def check_root() -> Check:
    ok = os.geteuid() == 0
    return Check(
        "root",
        ok,
        "running as root" if ok else f"uid {os.geteuid()}",
        "run as root (sudo make run): namespaces, veths and eBPF need it",
    )


def _xdp_pass_program() -> int:
    """Load `r0 = XDP_PASS; exit` through the bpf() syscall; returns its fd (or -errno)."""
    libc = ctypes.CDLL(None, use_errno=True)
    insns = struct.pack("<BBhi", 0xB7, 0, 0, 2) + struct.pack("<BBhi", 0x95, 0, 0, 0)
    buf = ctypes.create_string_buffer(insns)
    lic = ctypes.create_string_buffer(b"GPL")
    bpf_prog_type_xdp, bpf_prog_load, sys_bpf = 6, 5, 321
    attr = struct.pack(
        "<IIQQIIQ", bpf_prog_type_xdp, 2, ctypes.addressof(buf), ctypes.addressof(lic), 0, 0, 0
    ) + bytes(64)
    abuf = ctypes.create_string_buffer(attr)
    fd = libc.syscall(sys_bpf, bpf_prog_load, abuf, len(attr))
    return int(fd) if fd >= 0 else -ctypes.get_errno()


def check_kernel() -> list[Check]:
    out = []
    ns = f"xmdoc{uuid.uuid4().hex[:6]}"
    r = _run("ip", "netns", "add", ns)
    if r.returncode != 0:
        return [
            Check(
                "network namespaces",
                False,
                r.stderr.strip(),
                "a kernel with CONFIG_NET_NS (and root)",
            )
        ]
    try:
        out.append(Check("network namespaces", True, "ip netns add works"))
        ex = ["ip", "netns", "exec", ns]
        r = _run(*ex, "ip", "link", "add", "a0", "type", "veth", "peer", "name", "a1")
        out.append(
            Check("veth", r.returncode == 0, r.stderr.strip() or "veth pair created", "CONFIG_VETH")
        )
        _run(*ex, "ip", "link", "set", "a0", "up")
        _run(*ex, "ip", "link", "set", "a1", "up")
        for qdisc, args, fix in (
            ("clsact", ["clsact"], "CONFIG_NET_SCH_INGRESS (clsact)"),
            ("htb", ["root", "handle", "1:", "htb"], "CONFIG_NET_SCH_HTB"),
        ):
            r = _run(*ex, "tc", "qdisc", "add", "dev", "a0", *args)
            out.append(
                Check(f"qdisc {qdisc}", r.returncode == 0, r.stderr.strip() or "available", fix)
            )
            _run(*ex, "tc", "qdisc", "del", "dev", "a0", *args[:1])
        r = _run(*ex, "tc", "qdisc", "add", "dev", "a1", "root", "fq")
        out.append(
            Check(
                "qdisc fq",
                r.returncode == 0,
                "available: NIC pacing uses EDT"
                if r.returncode == 0
                else "absent: NIC pacing uses per-flow HTB classes (fine)",
                "",
                required=False,
            )
        )
        fd = _xdp_pass_program()
        if fd < 0:
            out.append(
                Check(
                    "BPF",
                    False,
                    f"bpf(BPF_PROG_LOAD) failed: {os.strerror(-fd)}",
                    "a kernel with CONFIG_BPF_SYSCALL, and root",
                )
            )
        else:
            out.append(Check("BPF", True, "bpf() loads programs"))
            try:
                from pyroute2 import NetNS

                with NetNS(ns) as ipr:
                    idx = ipr.link_lookup(ifname="a0")[0]
                    ipr.link("set", index=idx, xdp_fd=fd)
                    ipr.link("set", index=idx, xdp_fd=-1)
                out.append(Check("XDP on veth", True, "attached and detached"))
            except Exception as exc:
                out.append(Check("XDP on veth", False, str(exc), "Linux >= 4.19 (veth XDP)"))
            finally:
                os.close(fd)
    finally:
        _run("ip", "netns", "del", ns)
    return out


def check_bcc() -> list[Check]:
    out = []
    try:
        importlib.import_module("bcc")
        out.append(Check("bcc (python)", True, "import bcc works"))
    except Exception as exc:
        out.append(
            Check(
                "bcc (python)",
                False,
                str(exc),
                "apt-get install python3-bpfcc, then make install (links it into .venv)",
            )
        )
    release = os.uname().release
    build = Path(f"/lib/modules/{release}/build/include")
    if build.exists():
        out.append(Check("kernel headers", True, str(build.parent)))
    elif (KERNEL_HEADERS_CACHE / ".merged").exists():
        out.append(
            Check(
                "kernel headers",
                True,
                f"{KERNEL_HEADERS_CACHE} (Debian's, merged: "
                f"{(KERNEL_HEADERS_CACHE / '.merged').read_text().strip()})",
            )
        )
    else:
        out.append(
            Check(
                "kernel headers",
                False,
                f"none for {release}",
                "apt-get install linux-headers-amd64 && make kernel-headers",
            )
        )
    return out


def check_python() -> list[Check]:
    out = []
    for mod, why in (
        ("mininet.net", "Mininet (pip)"),
        ("finsy", "P4Runtime client"),
        ("grpc", "gRPC"),
        ("matplotlib", "plots"),
        ("numpy", "metrics"),
        ("scapy", "packets"),
        ("pyroute2", "netlink"),
    ):
        try:
            importlib.import_module(mod)
            out.append(Check(f"python: {mod.split('.')[0]}", True, why))
        except Exception as exc:
            out.append(
                Check(f"python: {mod.split('.')[0]}", False, f"{why}: {exc}", "make install")
            )
    stubs = sorted(REPO.glob("controller/proto/*.proto"))
    missing = [p.name for p in stubs if not p.with_name(p.stem + "_pb2.py").exists()]
    out.append(
        Check(
            "gRPC stubs",
            not missing,
            "generated" if not missing else f"missing for {', '.join(missing)}",
            "make proto",
        )
    )
    return out


def check_p4() -> list[Check]:
    out = []
    build = REPO / "p4src" / "build"
    arts = [build / "xingmai.json", build / "xingmai.p4info.txtpb"]
    missing = [str(a) for a in arts if not a.exists()]
    out.append(
        Check(
            "P4 program (bmv2 JSON + P4Info)",
            not missing,
            "p4src/build/" if not missing else f"missing: {missing}",
            "make p4 (needs p4c) or restore p4src/build from git",
        )
    )
    bmv2 = [shutil.which(x) for x in ("simple_switch_grpc", "simple_switch_CLI")]
    out.append(
        Check(
            "bmv2 (simple_switch_grpc + CLI)",
            all(bmv2),
            "on PATH: the testbed uses bmv2"
            if all(bmv2)
            else "not on PATH: the testbed uses the built-in switch (xingmai-switch)",
            "optional: build bmv2 + PI from p4lang's sources and put them on PATH",
            required=False,
        )
    )
    p4c = shutil.which("p4c-bm2-ss")
    out.append(
        Check(
            "p4c (p4c-bm2-ss)",
            p4c is not None,
            p4c or "not on PATH: the committed p4src/build is used as is",
            "optional: build p4c from p4lang's sources (make p4 recompiles)",
            required=False,
        )
    )
    return out


def check_network() -> list[Check]:
    out = []
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 0))
            ok, detail = (
                True,
                (
                    "the controller's gRPC port is picked free at start "
                    f"(e.g. {s.getsockname()[1]}); switches listen on 9559/9090 "
                    "inside their own namespaces, the collector on 32766 inside "
                    "its own: no fixed port of this machine is needed"
                ),
            )
        except OSError as exc:
            ok, detail = False, f"cannot bind a loopback port: {exc}"
    out.append(Check("ports", ok, detail, "free some loopback ports"))
    try:
        from testbed.emu.network import _free_linklocal_24

        net = _free_linklocal_24()
        out.append(Check("management addresses", True, f"a free link-local /24, e.g. {net}"))
    except Exception as exc:
        out.append(
            Check(
                "management addresses",
                False,
                str(exc),
                "free a 169.254.X.0/24 in the root namespace",
            )
        )
    return out


def check_machine() -> list[Check]:
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    busy = load > cores
    return [
        Check(
            "CPU",
            not busy,
            f"{cores} cores, load {load:.1f}",
            "a busy machine slows the software switches: results get noisier",
            required=False,
        )
    ]


def run_checks() -> list[Check]:
    checks = [check_root()]
    if checks[0].ok:
        checks += check_kernel()
    checks += check_bcc() + check_python() + check_p4()
    checks += [
        _tool("mnexec", "mininet", why="Mininet's node launcher"),
        _tool("ip", "iproute2"),
        _tool("tc", "iproute2"),
        _tool("ethtool", "ethtool"),
        _tool("nsenter", "util-linux"),
        _tool("ping", "iputils-ping"),
        _tool(
            "prometheus",
            "prometheus",
            required=False,
            why="the run's metrics server; without it the testbed starts none",
        ),
        _tool("chromium", "chromium", required=False, why="the fabric page's browser test"),
        _tool(
            "chromedriver", "chromium-driver", required=False, why="the fabric page's browser test"
        ),
    ]
    if checks[0].ok:
        checks += check_network()
    checks += check_machine()
    return checks


def report() -> int:
    checks = run_checks()
    width = max(len(c.name) for c in checks)
    bad = 0
    for c in checks:
        mark = "ok  " if c.ok else ("FAIL" if c.required else "note")
        print(f"{mark} {c.name:<{width}}  {c.detail}")
        if not c.ok and c.fix:
            print(f"     {'':<{width}}  -> {c.fix}")
        bad += int(not c.ok and c.required)
    print()
    print("ready: make run" if not bad else f"{bad} required prerequisite(s) missing")
    return 0 if not bad else 1
