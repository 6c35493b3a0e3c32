"""Forwarding rate of the built-in switch (and of bmv2's simple_switch_grpc when installed).

bmv2 is measured as found: `$SIMPLE_SWITCH_GRPC` or `simple_switch_grpc` on PATH (a default
build), and, when `$SIMPLE_SWITCH_GRPC_FAST` names one, a build made for speed as bmv2's
docs/performance.md recommends (`--disable-logging-macros --disable-elogger`, -O3): the
built-in switch's rate is stated against each.

For a one-table L3 program and for a program with two tables and a register:
- `pipeline_pps`: ingress + traffic manager + egress + deparser in process, no I/O;
- `veth_pps`: 60-byte (64 with FCS) UDP frames offered as fast as one core can send them
  from a host namespace, the switch process pinned to the other core, counted at the receiving
  host: the rate the switch sustains, as bmv2's figure in the issue was measured.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BUILD = Path(__file__).resolve().parents[2] / "tests" / "p4" / "build"
PROGRAMS = ("bench_l3", "bench_two_tables")

SENDER = r"""
import socket, sys, time
iface, dmac, seconds = sys.argv[1], bytes.fromhex(sys.argv[2].replace(":", "")), float(sys.argv[3])
eth = dmac + bytes.fromhex("020000000001") + b"\x08\x00"
ip = bytes.fromhex("4500002e00000000401100000a0001010a000201")
frame = eth + ip + bytes.fromhex("0fa01388001a0000") + b"\x00" * 18
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
n, end = 0, time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(100):
        try:
            s.send(frame)
            n += 1
        except OSError:
            pass
print(n)
"""


def _rx_packets(netns: str, ifname: str) -> int:
    out = subprocess.run(
        ["ip", "netns", "exec", netns, "cat", f"/sys/class/net/{ifname}/statistics/rx_packets"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


def pipeline_pps(name: str, n: int) -> float:
    from testbed.switch.stf import StfRunner

    runner = StfRunner((BUILD / f"{name}.json").read_bytes())
    runner.command("add routes dst_addr:0x0a000200/24 set_nexthop(dmac:0x020000000002, port:2)")
    if name == "bench_two_tables":
        runner.command("add port_filter ingress_port:1 allow()")
    sw = runner.switch
    sent = 0
    sw.transmit = lambda port, data: None
    frame = (
        bytes.fromhex("0000000000010200000000010800")
        + bytes.fromhex("4500002e00000000401100000a0001010a000201")
        + bytes.fromhex("0fa01388001a0000")
        + bytes(18)
    )
    t0 = time.perf_counter()
    for _ in range(n):
        sw.receive(1, frame)
        sw.service()
        sent += 1
    return sent / (time.perf_counter() - t0)


def veth_pps(name: str, binary: str, seconds: float) -> dict[str, Any]:
    import finsy as fy

    from testbed.switch.rig import SwitchRig

    with SwitchRig(2) as rig:
        h1, h2 = rig.hosts
        rig.start_switch(None, binary=binary, cpu=0)

        async def program() -> None:
            opts = fy.SwitchOptions(
                p4info=BUILD / f"{name}.p4info.txtpb", p4blob=BUILD / f"{name}.json", device_id=1
            )
            async with fy.Switch("s1", rig.grpc_addr, opts) as s:
                writes = [
                    +fy.P4TableEntry(
                        "routes",
                        match=fy.P4TableMatch(dst_addr="10.0.2.0/24"),
                        action=fy.P4TableAction("set_nexthop", dmac=h2.mac, port=2),
                    )
                ]
                if name == "bench_two_tables":
                    writes.append(
                        +fy.P4TableEntry(
                            "port_filter",
                            match=fy.P4TableMatch(ingress_port=1),
                            action=fy.P4TableAction("allow"),
                        )
                    )
                await s.write(writes)

        asyncio.run(program())
        time.sleep(0.5)
        before = _rx_packets(h2.netns, h2.ifname)
        t0 = time.monotonic()
        sent = subprocess.run(
            [
                "taskset",
                "-c",
                "1",
                *h1.cmd(sys.executable, "-c", SENDER, h1.ifname, "00:00:00:00:fe:01", str(seconds)),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        time.sleep(1.0)  # let the switch drain what it queued
        elapsed = time.monotonic() - t0 - 1.0
        received = _rx_packets(h2.netns, h2.ifname) - before
        offered = int(sent.stdout.strip() or 0)
        return {
            "offered_pps": round(offered / seconds),
            "forwarded_pps": round(received / elapsed),
            "sent": offered,
            "received": received,
        }


def bmv2_builds() -> dict[str, str]:
    """The bmv2 binaries to measure, by name: the default build and the one built for speed."""
    found: dict[str, str] = {}
    default = os.environ.get("SIMPLE_SWITCH_GRPC") or shutil.which("simple_switch_grpc")
    if default:
        found["simple_switch_grpc"] = default
    fast = os.environ.get("SIMPLE_SWITCH_GRPC_FAST")
    if fast:
        if not os.access(fast, os.X_OK):
            raise FileNotFoundError(f"$SIMPLE_SWITCH_GRPC_FAST={fast} is not an executable")
        found["simple_switch_grpc_fast"] = fast
    return found


def run(quick: bool) -> dict[str, Any]:
    missing = [p for p in PROGRAMS if not (BUILD / f"{p}.json").exists()]
    if missing:
        raise FileNotFoundError(f"compiled benchmark programs missing: {missing} (make p4)")
    seconds = 3.0 if quick else 10.0
    out: dict[str, Any] = {
        "frame_bytes": 60,
        "conditions": (
            "sender pinned to CPU 1 (Python AF_PACKET loop), switch pinned to CPU 0; "
            "forwarded rate counted at the receiving host's interface"
        ),
    }
    for name in PROGRAMS:
        n = 5000 if quick else 30000
        entry: dict[str, Any] = {"pipeline_pps": round(pipeline_pps(name, n))}
        if os.geteuid() == 0:
            entry["xingmai_switch"] = veth_pps(name, "xingmai-switch", seconds)
            for build, exe in bmv2_builds().items():
                entry[build] = {"binary": exe, **veth_pps(name, exe, seconds)}
                entry[f"ratio_xingmai_to_{build}"] = round(
                    entry["xingmai_switch"]["forwarded_pps"]
                    / max(1, entry[build]["forwarded_pps"]),
                    2,
                )
        else:
            entry["veth"] = "skipped: needs root"
        out[name] = entry
    return out
