"""Forwarding rate of the built-in switch (and of bmv2's simple_switch_grpc when installed).

bmv2 is measured as found: `$SIMPLE_SWITCH_GRPC` or `simple_switch_grpc` on PATH (a default
build), and, when `$SIMPLE_SWITCH_GRPC_FAST` names one, a build made for speed as bmv2's
docs/performance.md recommends (`--disable-logging-macros --disable-elogger`, -O3): the
built-in switch's rate is stated against each.

For a one-table L3 program, a program with two tables and a register, and the project's own
program (`xingmai`, configured as the controller configures a leaf: its route through an
ECMP group):
- `pipeline_pps`: ingress + traffic manager + egress + deparser in process, no I/O, on the
  reference pipeline (`pipeline_pps_native`: the native one, testbed/switch/native/);
- `veth_pps`: 60-byte (64 with FCS) UDP frames offered as fast as one core can send them
  from a host namespace, the switch process pinned to the other core, counted at the receiving
  host: the rate the switch sustains, as bmv2's figure in the issue was measured; for the
  built-in switch with its packet loop's per-frame part in C (the default) and in Python
  (`--io reference`, `xingmai_switch_python_io`).
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
# the IPv4 header checksum right (63be): the xingmai program verifies it
ip = bytes.fromhex("4500002e00000000401163be0a0001010a000201")
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


def pipeline_pps(name: str, n: int, pipeline: str = "reference") -> float:
    from testbed.switch.stf import StfRunner

    runner = StfRunner((BUILD / f"{name}.json").read_bytes(), pipeline)
    if runner.switch.pipeline_in_use != pipeline:
        raise RuntimeError(f"{name}: no {pipeline} pipeline ({runner.switch.native_reason})")
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


def xingmai_switch(pipeline: str) -> Any:
    """A built-in switch on `pipeline` running the xingmai program, configured as the
    controller configures a leaf: switch and port config, four /24 routes, each through an
    ECMP group (action selector) of one next hop."""
    from testbed.p4files import BMV2_JSON
    from testbed.switch.tables import ActionCall, Entry
    from testbed.switch.traffic_manager import Clock
    from testbed.switch.v1model import V1Switch

    sw = V1Switch(Clock(virtual=True), qdepth_unit="bytes", pipeline=pipeline)
    sw.load(BMV2_JSON.read_bytes())
    if sw.pipeline_in_use != pipeline:
        raise RuntimeError(f"xingmai: no {pipeline} pipeline ({sw.native_reason})")
    c = sw.compiled
    assert c is not None
    prog = c.program

    def call(action: str, *params: int) -> ActionCall:
        a = next(a for a in prog.actions.values() if a.name.endswith("." + action))
        return ActionCall(a.id, c.actions[a.id], params)

    tables = {name.rsplit(".", 1)[-1]: t for name, t in c.tables.items()}
    tables["switch_config"].set_default(call("set_switch_config", 1, 0, 1, 20))
    selector = next(iter(c.profiles.values()))
    for n in range(1, 5):
        tables["port_config"].add(Entry((n,), 0, call=call("set_port_config", 5243, 9000)))
        tables["ipv4_routes"].add(
            Entry(((0x0A000000 | n << 8, 24),), 0, call=call("set_next_id", n))
        )
        selector.add_member(n, call("route", n, 0x0200000000A0, 0x020000000000 | n))
        selector.set_group(n, [(n, 1)], create=True)
        tables["next_hops"].add(Entry((n,), 0, group=n))
    return sw


def xingmai_frames(count: int = 64) -> list[bytes]:
    """UDP frames of 100 bytes from 10.0.1.1 to 10.0.2.2 over `count` source ports (flows)."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    return [
        bytes(
            Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:a0")
            / IP(src="10.0.1.1", dst="10.0.2.2", tos=0x02)
            / UDP(sport=49152 + i, dport=4791)
            / (b"\x00" * 58)
        )
        for i in range(count)
    ]


def xingmai_pps(pipeline: str, n: int) -> float:
    """Packets/s through ingress, traffic manager, egress and deparser, in process, virtual
    time (1 us between packets): the pipeline's cost, no I/O."""
    sw = xingmai_switch(pipeline)
    out = [0]

    def transmit(port: int, data: bytes) -> None:
        out[0] += 1

    sw.transmit = transmit
    frames = xingmai_frames()
    t0 = time.perf_counter()
    for i in range(n):
        sw.clock.advance(1000)
        sw.receive(1, frames[i % len(frames)])
        sw.service()
    dt = time.perf_counter() - t0
    if out[0] != n:
        raise RuntimeError(f"xingmai {pipeline}: {out[0]} of {n} packets forwarded")
    return n / dt


def xingmai_stages_pps(pipeline: str, n: int) -> float:
    """Packets/s through the program alone (parser, checksum, ingress, egress, deparser
    called directly, no traffic manager or architecture around them)."""
    sw = xingmai_switch(pipeline)
    c, S = sw.compiled, sw.std
    assert c is not None and S is not None
    frames = xingmai_frames()
    t0 = time.perf_counter()
    for i in range(n):
        p = c.new_packet()
        data = frames[i % len(frames)]
        p.ingress_len = p.plen = len(data)
        sm = p.h[S.h]
        sm[S.ingress_port] = 1
        sm[S.packet_length] = len(data)
        sm[S.parser_error] = c.parse(p, data)
        sm[S.checksum_error] = int(c.verify_checksums(p))
        c.ingress(p)
        sm[S.egress_port] = sm[S.egress_spec]
        c.egress(p)
        c.update_checksums(p)
        c.deparse(p)
    return n / (time.perf_counter() - t0)


def _program_files(name: str) -> tuple[Path, Path]:
    """(P4Info, bmv2 JSON) of a benchmark program, or of the project's own ("xingmai")."""
    if name == "xingmai":
        from testbed.p4files import BMV2_JSON, P4INFO

        return P4INFO, BMV2_JSON
    return BUILD / f"{name}.p4info.txtpb", BUILD / f"{name}.json"


def _writes(name: str, mac: str) -> list[Any]:
    """The entries that send 10.0.2.0/24 out of port 2 to `mac`: the benchmark programs' route
    (and filter), or the xingmai program configured as the controller configures a leaf
    (switch and port config, the route through an ECMP group of one next hop)."""
    import finsy as fy

    if name != "xingmai":
        writes = [
            +fy.P4TableEntry(
                "routes",
                match=fy.P4TableMatch(dst_addr="10.0.2.0/24"),
                action=fy.P4TableAction("set_nexthop", dmac=mac, port=2),
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
        return writes
    config = fy.P4TableAction(
        "set_switch_config", node_id=1, hw_id=0, qdepth_unit=1, tx_util_shift=20
    )
    return [
        ~fy.P4TableEntry("switch_config", action=config, is_default_action=True),
        *(
            +fy.P4TableEntry(
                "port_config",
                match=fy.P4TableMatch(port=p),
                action=fy.P4TableAction("set_port_config", tx_util_mult=5243, mtu=9000),
            )
            for p in (1, 2)
        ),
        +fy.P4ActionProfileMember(
            "ecmp_selector",
            member_id=2,
            action=fy.P4TableAction("route", port=2, smac="00:00:00:00:fe:02", dmac=mac),
        ),
        +fy.P4ActionProfileGroup("ecmp_selector", group_id=2, members=[fy.P4Member(2, weight=1)]),
        +fy.P4TableEntry(
            "next_hops",
            match=fy.P4TableMatch(next_id=2),
            action=fy.P4IndirectAction(group_id=2),
        ),
        +fy.P4TableEntry(
            "ipv4_routes",
            match=fy.P4TableMatch(ipv4_dst="10.0.2.0/24"),
            action=fy.P4TableAction("set_next_id", next_id=2),
        ),
    ]


def veth_pps(
    name: str, binary: str, seconds: float, extra: list[str] | None = None
) -> dict[str, Any]:
    import finsy as fy

    from testbed.switch.rig import SwitchRig

    p4info, p4blob = _program_files(name)
    with SwitchRig(2) as rig:
        h1, h2 = rig.hosts
        rig.start_switch(None, binary=binary, cpu=0, extra=extra)

        async def program() -> None:
            opts = fy.SwitchOptions(p4info=p4info, p4blob=p4blob, device_id=1)
            async with fy.Switch("s1", rig.grpc_addr, opts) as s:
                await s.write(_writes(name, h2.mac))

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


def _native(measure: Any) -> Any:
    """A native pipeline's rate, or why there is none (no compiler, an unsupported program)."""
    try:
        return round(measure())
    except RuntimeError as exc:
        return f"skipped: {exc}"


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
    n = 5000 if quick else 30000
    for name in (*PROGRAMS, "xingmai"):
        if name == "xingmai":
            entry: dict[str, Any] = {
                "pipeline_pps": round(xingmai_pps("reference", n)),
                "pipeline_pps_native": _native(lambda: xingmai_pps("native", n)),
            }
        else:
            entry = {
                "pipeline_pps": round(pipeline_pps(name, n)),
                "pipeline_pps_native": _native(
                    lambda: pipeline_pps(name, n, "native")  # noqa: B023
                ),
            }
        if os.geteuid() == 0:
            entry["xingmai_switch"] = veth_pps(name, "xingmai-switch", seconds)
            # the packet loop's per-frame part in Python around the same pipeline
            entry["xingmai_switch_python_io"] = veth_pps(
                name, "xingmai-switch", seconds, ["--io", "reference"]
            )
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
