"""The built-in switch on real interfaces: two hosts in network namespaces, one xingmai-switch
process, an LPM route installed over P4Runtime; ping and a scapy UDP packet cross it and the
counters read back over P4Runtime count them. Malformed frames are counted, not fatal."""

from __future__ import annotations

import asyncio
import ipaddress
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import finsy as fy
import grpc
import pytest

from controller.proto import switch_pb2, switch_pb2_grpc
from testbed.switch.rig import SwitchRig

BUILD = Path(__file__).parent / "p4" / "build"
P4INFO = BUILD / "switch_features.p4info.txtpb"
JSON = BUILD / "switch_features.json"

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not JSON.exists(), reason=f"{JSON} not built (make p4)"),
]


SWITCHES = ["xingmai-switch"] + (
    ["simple_switch_grpc"] if shutil.which("simple_switch_grpc") else []
)


@pytest.fixture(params=SWITCHES)
def rig(request: pytest.FixtureRequest) -> Iterator[SwitchRig]:
    """The same test on the built-in switch and, where installed, on bmv2."""
    with SwitchRig(2) as r:
        r.start_switch(None, binary=request.param)
        yield r


def prefix(lpm: tuple[int, int]) -> str:
    return f"{ipaddress.ip_address(lpm[0])}/{lpm[1]}"


def options() -> fy.SwitchOptions:
    return fy.SwitchOptions(p4info=P4INFO, p4blob=JSON, device_id=1)


def routes(rig: SwitchRig) -> list[fy.P4TableEntry]:
    return [
        +fy.P4TableEntry(
            "routes",
            match=fy.P4TableMatch(dst_addr=f"10.0.{h.port}.0/24"),
            action=fy.P4TableAction("routed_set_nexthop", dmac=h.mac, port=h.port),
        )
        for h in rig.hosts
    ]


SENDER = """
import sys
from scapy.all import Ether, IP, UDP, sendp
sendp(Ether(dst=sys.argv[2]) / IP(src=sys.argv[3], dst=sys.argv[4]) / UDP(sport=4000, dport=5000)
      / b"xingmai", iface=sys.argv[1], verbose=False)
"""

RECEIVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 5000))
s.settimeout(10)
data, addr = s.recvfrom(2048)
print(addr[0], data.decode())
"""


def test_ping_and_udp_cross_the_switch_and_are_counted(rig: SwitchRig) -> None:
    h1, h2 = rig.hosts

    async def program() -> None:
        async with fy.Switch("s1", rig.grpc_addr, options()) as s:
            await s.write(routes(rig))

    asyncio.run(program())

    ping = subprocess.run(
        h1.cmd("ping", "-c", "3", "-i", "0.2", "-W", "2", h2.ip), capture_output=True, text=True
    )
    assert ping.returncode == 0, ping.stdout + ping.stderr + rig.log_tail()

    receiver = subprocess.Popen(
        h2.cmd(sys.executable, "-c", RECEIVER), stdout=subprocess.PIPE, text=True
    )
    time.sleep(0.5)
    subprocess.run(
        h1.cmd(sys.executable, "-c", SENDER, h1.ifname, "00:00:00:00:fe:01", h1.ip, h2.ip),
        check=True,
    )
    out, _ = receiver.communicate(timeout=15)
    assert out.split() == [h1.ip, "xingmai"]

    async def counters() -> tuple[dict[str, int], int]:
        async with fy.Switch("s1", rig.grpc_addr, options()) as s:
            hits = {
                prefix(e.match["dst_addr"]): e.counter_data.packet_count
                async for e in s.read(fy.P4TableEntry("routes", counter_data=fy.P4CounterData()))
            }
            port_rx = [c async for c in s.read(fy.P4CounterEntry("port_rx", index=1))]
            return hits, port_rx[0].data.packet_count

    hits, rx1 = asyncio.run(counters())
    # 3 echo requests + 1 UDP to h2, 3 echo replies to h1
    assert hits == {"10.0.2.0/24": 4, "10.0.1.0/24": 3}, hits
    assert rx1 >= 4


def test_malformed_frames_are_counted_and_the_switch_keeps_serving(rig: SwitchRig) -> None:
    h1, h2 = rig.hosts

    async def program() -> None:
        async with fy.Switch("s1", rig.grpc_addr, options()) as s:
            await s.write(routes(rig))

    asyncio.run(program())
    junk = """
import socket, sys, os
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
eth = bytes.fromhex("00000000fe01020000000001") + b"\\x08\\x00"
for n in range(0, 40):            # truncated IPv4 headers of every length
    s.send(eth + bytes.fromhex("4500001c00010000401100000a0001010a000201")[:n])
for _ in range(50):               # random garbage frames
    s.send(os.urandom(60))
"""
    subprocess.run(h1.cmd(sys.executable, "-c", junk, h1.ifname), check=True)
    time.sleep(0.5)
    ping = subprocess.run(
        h1.cmd("ping", "-c", "2", "-i", "0.2", "-W", "2", h2.ip), capture_output=True, text=True
    )
    assert ping.returncode == 0, rig.log_tail()

    async def port_rx() -> int:
        async with fy.Switch("s1", rig.grpc_addr, options()) as s:
            entries = [c async for c in s.read(fy.P4CounterEntry("port_rx", index=1))]
            return entries[0].data.packet_count

    assert asyncio.run(port_rx()) >= 90  # 40 truncated + 50 garbage + the pings
    assert rig.proc is not None and rig.proc.poll() is None
    if rig.binary == "xingmai-switch":
        with grpc.insecure_channel(rig.grpc_addr) as ch:
            status = switch_pb2_grpc.SwitchAdminStub(ch).GetStatus(switch_pb2.GetStatusRequest())
        assert status.pipeline_loaded and status.rx_packets >= 90
