"""The switch process's per-frame path in C (`--io native`: testbed/switch/dataplane.py's
EmuHop over testbed/switch/native/hop.py) against the Python one around the same native
pipeline (`--io reference`): the same frames through a real switch process on veths (routed,
dropped for no route, malformed, at sizes up to the MTU) come out the same, in the same
order, with the same counters; GetStatus says which path ran. With `--wire` on both ports
(a host's frames held coming in, and going out) each frame arrives no earlier than its
two lines' serialization and delays, in order, on both paths; on stamped wires (between
two switches) each frame is taken at the due it carries and sent on with its own."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import finsy as fy
import grpc
import pytest

from controller.proto import switch_pb2, switch_pb2_grpc
from controller.wire.stamp import STAMP, STAMP_MAGIC
from testbed.benchmarks.switch import _writes
from testbed.p4files import BMV2_JSON, P4INFO
from testbed.switch.rig import SwitchRig

pytestmark = pytest.mark.root

# frames from h1: UDP to h2 at sizes up to 1500 bytes of IP, TTLs down to 1, one to an
# address with no route, truncated IPv4 headers
SENDER = """
import socket, struct, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
eth = bytes.fromhex("00000000fe01") + bytes.fromhex(sys.argv[2].replace(":", "")) + b"\\x08\\x00"
src, dst = socket.inet_aton(sys.argv[3]), socket.inet_aton(sys.argv[4])
def ip(dst, ttl, payload):
    n = 20 + 8 + len(payload)
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, n, 7, 0, ttl, 17, 0, src, dst)
    words = sum(struct.unpack("!10H", h))
    words = (words & 0xFFFF) + (words >> 16)
    h = h[:10] + struct.pack("!H", ~words & 0xFFFF) + h[12:]
    return h + struct.pack("!HHHH", 4000, 5000, 8 + len(payload), 0) + payload
for i, size in enumerate([18, 100, 500, 1000, 1472, 64, 1472, 3]):
    s.send(eth + ip(dst, 64 - i * 9 if i < 7 else 1, bytes([i]) * size))
    print(time.monotonic_ns(), flush=True)
s.send(eth + ip(socket.inet_aton("10.9.9.9"), 64, b"no route"))
for n in (0, 10, 19):
    s.send(eth + ip(dst, 64, b"x")[:n])
"""

RECEIVER = """
import socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind((sys.argv[1], 0))
s.settimeout(0.2)
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    try:
        data, addr = s.recvfrom(65535)
    except socket.timeout:
        continue
    if addr[2] != socket.PACKET_OUTGOING and data[12:14] == b"\\x08\\x00":
        print(data.hex(), time.monotonic_ns(), flush=True)
"""


def options() -> fy.SwitchOptions:
    return fy.SwitchOptions(p4info=P4INFO, p4blob=BMV2_JSON, device_id=1)


@contextlib.contextmanager
def listening(
    n_hosts: int, io: str, wires: tuple[str, ...], seconds: str
) -> Iterator[tuple[SwitchRig, subprocess.Popen[str]]]:
    """A switch process on `io`'s loop with `wires`, the project's program routing to h2 (as
    a leaf does), and RECEIVER on h2 for `seconds`, ready."""
    with SwitchRig(n_hosts) as rig:
        rig.start_switch(None, extra=["--io", io, *(a for w in wires for a in ("--wire", w))])
        h2 = rig.hosts[1]

        async def program() -> None:
            async with fy.Switch("s1", rig.grpc_addr, options()) as s:
                await s.write(_writes("xingmai", h2.mac))

        asyncio.run(program())
        receiver = subprocess.Popen(
            h2.cmd(sys.executable, "-c", RECEIVER, h2.ifname, seconds),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert receiver.stdout is not None
        assert receiver.stdout.readline().strip() == "ready"
        yield rig, receiver


def through_switch(
    io: str, wires: tuple[str, ...], seconds: str, sender: str, *args: str
) -> tuple[list[str], list[str], Any]:
    """`sender` on h1 (given its interface, MAC and address, h2's address and `args`) through
    a switch process on `io`'s loop with `wires`: what it printed, what RECEIVER on h2
    printed, and the switch's GetStatus after."""
    with listening(2, io, wires, seconds) as (rig, receiver):
        h1, h2 = rig.hosts
        sent = subprocess.run(
            h1.cmd(sys.executable, "-c", sender, h1.ifname, h1.mac, h1.ip, h2.ip, *args),
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        ).stdout.split()
        out, _ = receiver.communicate(timeout=20)
        time.sleep(0.2)
        with grpc.insecure_channel(rig.grpc_addr) as ch:
            status = switch_pb2_grpc.SwitchAdminStub(ch).GetStatus(switch_pb2.GetStatusRequest())
    return sent, out.split(), status


def run(io: str, wires: tuple[str, ...] = ()) -> tuple[list[str], Any]:
    sent, out, status = through_switch(io, wires, "3", SENDER)
    frames = out[0::2]
    if wires:  # each frame's arrival from the first frame's send, in the frames' order
        arrived = [int(t) for t in out[1::2]]
        return [f"{f} {arrived[k] - int(sent[0])}" for k, f in enumerate(frames)], status
    return frames, status


def test_the_native_packet_loop_forwards_what_the_python_one_does() -> None:
    native, st_n = run("native")
    python, st_p = run("reference")
    assert st_n.dataplane_io == "native", st_n.dataplane_io
    assert st_p.dataplane_io.startswith("python"), st_p.dataplane_io
    assert st_n.dataplane_slack_ns == st_p.dataplane_slack_ns == 0  # no wires: none
    assert len(native) >= 7, native  # the routed UDP frames arrived
    assert native == python
    for st in (st_n, st_p):
        assert st.dataplane_errors == 0, st.dataplane_last_error
    assert (st_n.rx_packets, st_n.tx_packets, dict(st_n.drops)) == (
        st_p.rx_packets,
        st_p.tx_packets,
        dict(st_p.drops),
    )
    ports = [[(p.port, p.rx_packets, p.tx_packets) for p in st.ports] for st in (st_n, st_p)]
    assert ports[0] == ports[1]


def test_the_packet_loop_stays_native_with_pfc() -> None:
    """PFC's per-packet counting is in the traffic manager's C: turning it on and off keeps
    the switch's frames on the native path."""
    from testbed.switch.pfc import PfcConfig, pfc_request

    with SwitchRig(2) as rig:
        rig.start_switch(None)
        h1, h2 = rig.hosts
        seen: list[str] = []

        async def program() -> None:
            async with fy.Switch("s1", rig.grpc_addr, options()) as s:
                await s.write(_writes("xingmai", h2.mac))
                election = switch_pb2.ElectionId(high=0, low=int(s.election_id))
                with grpc.insecure_channel(rig.grpc_addr) as ch:
                    admin = switch_pb2_grpc.SwitchAdminStub(ch)

                    def status() -> None:
                        st = admin.GetStatus(switch_pb2.GetStatusRequest())
                        seen.append(st.dataplane_io)

                    status()
                    req = pfc_request(PfcConfig(6000, 2000, 3000, link_bps=1e10), None)
                    req.device_id = 1
                    req.election_id.CopyFrom(election)
                    admin.SetPfc(req)
                    status()
                    admin.SetPfc(switch_pb2.SetPfcRequest(device_id=1, election_id=election))
                    status()

        asyncio.run(program())
        assert seen == ["native"] * 3, seen


def test_a_wire_holds_each_frame_for_its_serialization_and_delay_on_both_loops() -> None:
    # h1's frames held coming in (1 Mb/s, 30 ms), and going out to h2 (8 Mb/s, 20 ms)
    wires = ("1:1000000:30000000:in", "2:8000000:20000000")
    native, st_n = run("native", wires)
    python, st_p = run("reference", wires)
    assert st_n.dataplane_io == "native" and st_p.dataplane_io.startswith("python")
    assert st_n.dataplane_slack_ns == st_p.dataplane_slack_ns == 1_000_000  # at most 1 ms
    for got in (native, python):
        frames = [line.split()[0] for line in got]
        assert frames == [line.split()[0] for line in native]  # the same frames, in order
        # the first seven, routed (a routed frame keeps its size); h1 sent them back to back:
        # each went on the 1 Mb/s wire after the ones ahead of it
        assert [bytes.fromhex(f)[-1] for f in frames] == list(range(7)), frames
        on_wire = 0.0
        for line in got:
            frame, took = line.split()
            n = len(bytes.fromhex(frame))
            on_wire += n * 8 * 1e9 / 1e6
            least = on_wire + 30e6 + n * 8 * 1e9 / 8e6 + 20e6
            assert least <= int(took) < least + 2e9, (n, took, least)
    assert (st_n.rx_packets, st_n.tx_packets) == (st_p.rx_packets, st_p.tx_packets)


def test_frames_on_a_wire_when_the_program_loads_are_dropped_and_counted() -> None:
    """Before a program loads the switch's Python loop holds a host's frames on the port's
    line; the native loop that takes over when one loads keeps lines of its own, so the
    frames still on the old ones are dropped and counted (GetStatus's line_drops), not kept
    for ever."""
    with SwitchRig(2) as rig:
        rig.start_switch(None, extra=["--wire", "1:1000000:5000000000:in"])
        h1, h2 = rig.hosts
        subprocess.run(
            h1.cmd(sys.executable, "-c", SENDER, h1.ifname, h1.mac, h1.ip, h2.ip),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        time.sleep(0.3)

        async def program() -> None:
            async with fy.Switch("s1", rig.grpc_addr, options()) as s:
                await s.write(_writes("xingmai", h2.mac))

        asyncio.run(program())
        time.sleep(0.3)
        with grpc.insecure_channel(rig.grpc_addr) as ch:
            st = switch_pb2_grpc.SwitchAdminStub(ch).GetStatus(switch_pb2.GetStatusRequest())
    [port1] = [p for p in st.ports if p.port == 1]
    assert st.dataplane_io == "native", st.dataplane_io
    assert port1.rx_packets == 12 and port1.line_drops == 12, port1
    assert st.dataplane_errors == 0, st.dataplane_last_error


# one frame from h3, then one from h1 0.3 ms later, both to h2: a process that opens a packet
# socket in each host's namespace (setns) so the two leave that close
TWO_SENDERS = """
import ctypes, os, socket, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def sock(netns, ifname):
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    assert libc.setns(fd, 0x40000000) == 0, ctypes.get_errno()  # CLONE_NEWNET
    os.close(fd)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((ifname, 0))
    return s
def frame(mac, src, dst, tag):
    payload = bytes([tag]) * 100
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 128, 7, 0, 64, 17, 0,
                    socket.inet_aton(src), socket.inet_aton(dst))
    words = sum(struct.unpack("!10H", h))
    words = (words & 0xFFFF) + (words >> 16)
    h = h[:10] + struct.pack("!H", ~words & 0xFFFF) + h[12:]
    eth = bytes.fromhex("00000000fe01") + bytes.fromhex(mac.replace(":", "")) + b"\\x08\\x00"
    return eth + h + struct.pack("!HHHH", 4000, 5000, 108, 0) + payload
ns1, if1, mac1, ip1, ns3, if3, mac3, ip3, dst = sys.argv[1:]
s3, s1 = sock(ns3, if3), sock(ns1, if1)
s3.send(frame(mac3, ip3, dst, 3))
time.sleep(0.0003)
s1.send(frame(mac1, ip1, dst, 1))
"""


def two_senders(io: str, wires: tuple[str, ...]) -> list[int]:
    """TWO_SENDERS through a switch process on `io`'s loop: the frames' tags at h2, in order."""
    with listening(3, io, wires, "2") as (rig, receiver):
        h1, h2, h3 = rig.hosts
        argv = [h1.netns, h1.ifname, h1.mac, h1.ip, h3.netns, h3.ifname, h3.mac, h3.ip]
        subprocess.run([sys.executable, "-c", TWO_SENDERS, *argv, h2.ip], check=True)
        out, _ = receiver.communicate(timeout=20)
    return [bytes.fromhex(f)[-1] for f in out.split()[0::2]]


def test_frames_from_two_ports_arrive_in_their_times_order_on_both_loops() -> None:
    """The loop takes what arrives up to its slack late (half the shortest wire's delay, at
    most 1 ms), so frames from two ports are taken together: they arrive in the order of
    their times, not of the ports. h3's frame, sent 0.3 ms before h1's (port 1, the loop's
    first), leaves towards h2 first, on both loops."""
    wires = ("1:1000000:30000000:in", "3:1000000:30000000:in", "2:1000000:20000000")
    for io in ("native", "reference"):
        assert two_senders(io, wires) == [3, 1], io


# frames from h1 as a switch upstream sends them on a stamped wire: each to h2 with its due
# after its bytes (h1's clock: CLOCK_MONOTONIC, as the switch's), due 40 ms on and 2 ms apart;
# then one with no stamp and one due an hour on, which no switch's line could make
STAMPED_SENDER = """
import socket, struct, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
eth = bytes.fromhex("00000000fe01") + bytes.fromhex(sys.argv[2].replace(":", "")) + b"\\x08\\x00"
src, dst = socket.inet_aton(sys.argv[3]), socket.inet_aton(sys.argv[4])
def ip(tag):
    payload = bytes([tag]) * 200
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 228, 7, 0, 64, 17, 0, src, dst)
    words = sum(struct.unpack("!10H", h))
    words = (words & 0xFFFF) + (words >> 16)
    h = h[:10] + struct.pack("!H", ~words & 0xFFFF) + h[12:]
    return h + struct.pack("!HHHH", 4000, 5000, 208, 0) + payload
stamp = struct.Struct("!QI")
t0 = time.monotonic_ns() + 40_000_000
for i in range(4):
    s.send(eth + ip(i) + stamp.pack(t0 + i * 2_000_000, int(sys.argv[5])))
    print(t0 + i * 2_000_000, flush=True)
s.send(eth + ip(9))
s.send(eth + ip(9) + stamp.pack(t0 + 3600 * 10**9, int(sys.argv[5])))
"""


def stamped(io: str) -> tuple[list[tuple[bytes, int, int]], list[int], Any]:
    """STAMPED_SENDER through a switch process on `io`'s loop whose ports to h1 and h2 are
    stamped wires (h1 and h2 stand for switches): what h2 read (the frame without its stamp,
    the due it carries, when it came), the dues h1 sent, and GetStatus."""
    wires = ("1:1000000:30000000:stamped", "2:8000000:20000000:stamped")
    sent, out, status = through_switch(io, wires, "1.5", STAMPED_SENDER, str(STAMP_MAGIC))
    got = []
    for data, t in zip(out[0::2], out[1::2], strict=True):
        frame = bytes.fromhex(data)
        due, magic = STAMP.unpack_from(frame, len(frame) - STAMP.size)
        assert magic == STAMP_MAGIC, frame.hex()
        got.append((frame[: -STAMP.size], due, int(t)))
    return got, [int(t) for t in sent], status


def test_a_stamped_wire_takes_each_frame_at_the_due_it_carries_on_both_loops() -> None:
    """Between two switches a frame leaves at once with its due, and the far end holds it
    until then: the switch forwards each of h1's frames no earlier than the due it carries,
    and the frame it sends h2 carries that due plus its serialization at port 2's rate and
    port 2's delay, exactly: however late either loop woke, the frame's time is the model's.
    It reaches h2 well before that due (h2's line would hold it). A frame with no due, or a
    due no line could make, is dropped and counted."""
    results = {io: stamped(io) for io in ("native", "reference")}
    for io, (got, dues, st) in results.items():
        assert st.dataplane_errors == 0, st.dataplane_last_error
        assert [f[-1] for f, _, _ in got] == [0, 1, 2, 3], io  # in order, the bad two not
        assert [f for f, _, _ in got] == [f for f, _, _ in results["native"][0]]
        for (frame, due, came), due_in in zip(got, dues, strict=True):
            assert due == due_in + round(len(frame) * 8e9 / 8e6) + 20_000_000, (io, due, due_in)
            assert due_in <= came < due - 10_000_000, (io, came, due_in, due)
        [p1] = [p for p in st.ports if p.port == 1]
        [p2] = [p for p in st.ports if p.port == 2]
        assert p1.line_unstamped == 2 and p1.rx_packets == 4, (io, p1)
        assert p2.tx_packets == 4 and p2.tx_bytes == sum(len(f) for f, _, _ in got), (io, p2)
        assert p2.line_late_ns == 0 and p1.line_late_ns == 0, io  # h1 sent them early
