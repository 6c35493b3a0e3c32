"""Where the agent lives and what it hooks: network namespace, bpffs, interfaces, cgroup.

Attach/detach of the programs (XDP and tc clsact on each interface, sock_ops on a cgroup v2,
tc_wire.c at the far end of each interface's wire under HTB) and the small namespace helpers.
Everything here removes only what it added.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

from controller.common.netns import in_netns
from controller.nic.bpf import syscalls

log = logging.getLogger("xingmai.agent.netdev")

SO_NETNS_COOKIE = 71
XDP_FLAGS_SKB_MODE = 1 << 1
XDP_FLAGS_DRV_MODE = 1 << 2
TC_EGRESS_PARENT = 0xFFFFFFF3  # clsact egress hook
TC_INGRESS_PARENT = 0xFFFFFFF2  # clsact ingress hook
TC_PRIO = 0xC0DE & 0x7FFF  # our filter's priority on the clsact hook
TC_HANDLE = 1

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def netns_cookie() -> int:
    """The current network namespace's cookie (what bpf_get_netns_cookie() returns)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        raw = s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8)
    return int.from_bytes(raw, "little")


def _mounts() -> list[tuple[str, str]]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        mount_point = left.split()[4]
        fstype = right.split()[0]
        out.append((mount_point.replace("\\040", " "), fstype))
    return out


def is_bpffs(path: Path) -> bool:
    return any(mp == str(path) and fs == "bpf" for mp, fs in _mounts())


def mount_bpffs(path: Path) -> bool:
    """Make `path` a bpffs mount; True when this call mounted it (and so should unmount it)."""
    path.mkdir(parents=True, exist_ok=True)
    if is_bpffs(path):
        return False
    _check(_libc.mount(b"bpf", str(path).encode(), b"bpf", 0, None), f"mount bpffs {path}")
    return True


def umount(path: Path) -> None:
    _check(_libc.umount2(str(path).encode(), 0), f"umount {path}")


def cgroup2_root() -> Path | None:
    """The cgroup v2 mount (unified hierarchy) sock_ops attaches to, if any."""
    for mp, fs in _mounts():
        if fs == "cgroup2":
            return Path(mp)
    return None


# ---- XDP ------------------------------------------------------------------------------------


def _bcc_lib() -> Any:
    from bcc import lib  # libbcc's ctypes handle

    return lib


def attach_xdp(ifname: str, prog_fd: int) -> str:
    """Attach (or replace) XDP on an interface: native mode when the driver has it (veth
    does), else generic. Returns the mode."""
    lib = _bcc_lib()
    for mode, flags in (("native", XDP_FLAGS_DRV_MODE), ("generic", XDP_FLAGS_SKB_MODE)):
        if lib.bpf_attach_xdp(ifname.encode(), prog_fd, flags) == 0:
            return mode
    raise OSError(f"cannot attach XDP to {ifname} in native or generic mode")


def detach_xdp(ifname: str) -> None:
    lib = _bcc_lib()
    for flags in (XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE):
        lib.bpf_attach_xdp(ifname.encode(), -1, flags)


# ---- tc -------------------------------------------------------------------------------------


def attach_tc(
    ipr: Any, ifindex: int, prog_fd: int, name: str, parent: int = TC_EGRESS_PARENT
) -> bool:
    """Our filter on a clsact hook (egress unless `parent` says ingress; direct action),
    replacing a previous agent's. Returns True when this call created the clsact qdisc."""
    created = False
    try:
        ipr.tc("add", "clsact", ifindex)
        created = True
    except Exception as exc:
        if getattr(exc, "code", None) != errno.EEXIST:
            raise
    ipr.tc(
        "replace-filter",
        "bpf",
        ifindex,
        TC_HANDLE,
        fd=prog_fd,
        name=name,
        parent=parent,
        prio=TC_PRIO,
        protocol=0x0003,  # ETH_P_ALL
        classid=1,
        direct_action=True,
    )
    return created


def detach_tc(ipr: Any, ifindex: int, remove_clsact: bool, parent: int = TC_EGRESS_PARENT) -> None:
    try:
        ipr.tc(
            "del-filter",
            "bpf",
            ifindex,
            TC_HANDLE,
            parent=parent,
            prio=TC_PRIO,
            protocol=0x0003,
        )
    except Exception as exc:
        log.warning("tc filter on ifindex %d: %s", ifindex, exc)
    if remove_clsact:
        try:
            ipr.tc("del", "clsact", ifindex)
        except Exception as exc:
            log.warning("clsact on ifindex %d: %s", ifindex, exc)


def attach_wire(netns_path: str, ifname: str, prog_fd: int) -> tuple[int, bool]:
    """tc_wire.c on the clsact ingress of `ifname` in `netns_path`: the far end of the NIC's
    wire (on the emulation the host link's veth peer, in the switch's namespace). Returns its
    ifindex there and whether this call created the clsact qdisc."""
    from pyroute2 import IPRoute

    with in_netns(netns_path):
        ipr = IPRoute()  # its socket stays in that namespace
    with ipr:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            raise RuntimeError(f"no interface {ifname!r} in {netns_path}")
        idx = found[0]
        return idx, attach_tc(ipr, idx, prog_fd, "xm_tc_wire", TC_INGRESS_PARENT)


def detach_wire(netns_path: str, ifindex: int, remove_clsact: bool) -> None:
    """Undo attach_wire(); nothing to do once the namespace is gone (its switch stopped)."""
    from pyroute2 import IPRoute

    try:
        with in_netns(netns_path):
            ipr = IPRoute()
    except OSError:
        return  # the namespace is gone with its switch, and the filter with it
    with ipr:
        detach_tc(ipr, ifindex, remove_clsact, TC_INGRESS_PARENT)


# ---- sock_ops -------------------------------------------------------------------------------


def attach_sockops(cgroup: Path, prog_fd: int, previous_pin: Path | None) -> None:
    """Attach sock_ops to a cgroup (shared with other programs: BPF_F_ALLOW_MULTI), after
    detaching the program a previous agent pinned at `previous_pin`."""
    cg = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if previous_pin is not None and previous_pin.exists():
            old = syscalls.obj_get(str(previous_pin))
            try:
                syscalls.prog_detach(old, cg, syscalls.BPF_CGROUP_SOCK_OPS)
                log.info("detached the previous agent's sock_ops", extra={"pin": str(previous_pin)})
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise
            finally:
                os.close(old)
        syscalls.prog_attach(prog_fd, cg, syscalls.BPF_CGROUP_SOCK_OPS, syscalls.BPF_F_ALLOW_MULTI)
    finally:
        os.close(cg)


def detach_sockops(cgroup: Path, prog_fd: int) -> None:
    cg = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        syscalls.prog_detach(prog_fd, cg, syscalls.BPF_CGROUP_SOCK_OPS)
    finally:
        os.close(cg)


# ---- checksum offload -----------------------------------------------------------------------


def tx_checksum(ifname: str) -> bool | None:
    """Whether TX checksum offload is on (None: unknown)."""
    try:
        out = subprocess.run(
            ["ethtool", "-k", ifname], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    for line in out.splitlines():
        if line.strip().startswith("tx-checksumming:"):
            return "on" in line.split(":", 1)[1]
    return None


def set_tx_checksum(ifname: str, on: bool) -> None:
    """INT insertion needs checksums computed before tc (DESIGN.md: hosts behind a software
    switch run with TX checksum offload off)."""
    subprocess.run(
        ["ethtool", "-K", ifname, "tx", "on" if on else "off"],
        capture_output=True,
        check=True,
    )
