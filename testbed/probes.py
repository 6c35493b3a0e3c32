"""What the testbed measures while a scenario runs, without touching the traffic:

- `IntSampler`: queue occupancy over time at every switch egress port the traffic crosses,
  from the fabric's own INT. Every data packet arriving at a host carries one record per hop
  (the switch's node id, egress port, queue occupancy in bytes at dequeue and tx utilisation,
  p4src/README.md); a packet socket in each host's namespace (filtered in the kernel to
  incoming INT data packets, first 320 bytes) reads them. This works the same on bmv2 and on
  the built-in switch; it sees the queue each packet left behind, i.e. occupancy sampled at
  departures. The same packets give each flow's received throughput.
- `RateWatcher`: each flow's sending rate as the NIC sets it (the agents' `WatchRates`
  stream: every change of the rate map, as the rate law or the controller moves it).
- `port_counters()`: the kernel's packet and byte counters of every switch port (inside the
  switch namespaces): what each switch received and sent, so drops = received - sent (queue
  tail drops, and frames the switch process could not read in time), and what each link
  carried (utilisation).
"""

from __future__ import annotations

import ctypes
import json
import select
import socket
import struct
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from controller.common.netns import in_netns
from controller.wire.int_md import INT_DSCP_DEFAULT, decode_stack, int_stack_at
from controller.wire.roce import ROCE_UDP_PORT

ETH_P_ALL = 0x0003
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
SO_TIMESTAMPNS = 35  # also the SCM_TIMESTAMPNS control message type
_TIMESPEC = struct.Struct("qq")
SNAPLEN = 320
_libc = ctypes.CDLL(None, use_errno=True)

# classic BPF (linux/filter.h)
_LD_W_ABS, _LD_H_ABS, _LD_B_ABS, _LDX_B_MSH, _LD_H_IND = 0x20, 0x28, 0x30, 0xB1, 0x48
_JEQ_K, _RET_K, _ALU_AND_K = 0x15, 0x06, 0x54
_SKF_AD_PKTTYPE = (-0x1000 + 4) & 0xFFFFFFFF  # SKF_AD_OFF + SKF_AD_PKTTYPE
PACKET_OUTGOING = 4


def _int_filter(int_dscp: int, udp_port: int = ROCE_UDP_PORT) -> list[tuple[int, int, int, int]]:
    """Incoming IPv4 UDP to `udp_port` with the INT DSCP, first SNAPLEN bytes."""
    return [
        (_LD_W_ABS, 0, 0, _SKF_AD_PKTTYPE),  # 0: A <- packet type (ancillary load)
        (_JEQ_K, 11, 0, PACKET_OUTGOING),  # 1: our own transmissions: drop
        (_LD_H_ABS, 0, 0, 12),  # 2: ethertype
        (_JEQ_K, 0, 9, 0x0800),  # 3
        (_LD_B_ABS, 0, 0, 23),  # 4: IP protocol
        (_JEQ_K, 0, 7, 17),  # 5
        (_LD_B_ABS, 0, 0, 15),  # 6: TOS
        (_ALU_AND_K, 0, 0, 0xFC),  # 7
        (_JEQ_K, 0, 4, int_dscp << 2),  # 8
        (_LDX_B_MSH, 0, 0, 14),  # 9: X <- IP header length
        (_LD_H_IND, 0, 0, 16),  # 10: UDP destination port (14 + X + 2)
        (_JEQ_K, 0, 1, udp_port),  # 11
        (_RET_K, 0, 0, SNAPLEN),  # 12
        (_RET_K, 0, 0, 0),  # 13
    ]


def packet_socket_in(
    netns_path: str, ifname: str, bpf: list[tuple[int, int, int, int]] | None = None
) -> socket.socket:
    """An AF_PACKET socket on `ifname` of the network namespace at `netns_path`.

    A socket belongs to the namespace it was made in; a short-lived thread enters the
    namespace to make it, so no thread of the testbed stays there."""
    box: list[Any] = []

    def make() -> None:
        try:
            with in_netns(netns_path):
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            if bpf is not None:
                code = b"".join(
                    struct.pack("HBBI", c, jt, jf, k & 0xFFFFFFFF) for c, jt, jf, k in bpf
                )
                buf = ctypes.create_string_buffer(code)
                s.setsockopt(
                    socket.SOL_SOCKET,
                    SO_ATTACH_FILTER,
                    struct.pack("HL", len(bpf), ctypes.addressof(buf)),
                )
            s.bind((ifname, 0))
            # root may exceed net.core.rmem_max: a busy sampler thread reads in batches
            s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
            # the kernel's receive time of every frame: the thread reads late, not the clock
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            box.append(s)
        except BaseException as exc:  # handed to the caller
            box.append(exc)

    t = threading.Thread(target=make, name=f"netns-socket:{ifname}")
    t.start()
    t.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    sock: socket.socket = box[0]
    sock.setblocking(False)
    # what arrived before the filter was attached
    while True:
        try:
            sock.recv(65536)
        except BlockingIOError:
            break
    return sock


@dataclass
class HopSample:
    t: float  # time.monotonic() at receipt
    link: str  # the hop's egress port, "switch:port"
    qocc_bytes: int
    tx_util_ppm: int | None
    latency_ns: int | None  # the hop's egress - ingress time
    egress_ns: int | None  # the hop's egress timestamp (its own clock)


@dataclass
class Capture:
    """What the sampler saw during one scenario."""

    hops: list[HopSample] = field(default_factory=list)
    # flow (src ip, dst ip, UDP source port) -> [(t, frame bytes)] as received
    flows: dict[tuple[str, str, int], list[tuple[float, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # flow -> the last hop's INT egress timestamp (ns, that switch's clock) of each frame in
    # `flows`, in the same order (None: the stack carried none)
    last_hop_egress_ns: dict[tuple[str, str, int], list[int | None]] = field(
        default_factory=lambda: defaultdict(list)
    )
    packets: int = 0
    undecodable: int = 0
    max_hops: int = 0

    def series(self, link: str) -> tuple[list[float], list[int]]:
        ts = [h.t for h in self.hops if h.link == link]
        qs = [h.qocc_bytes for h in self.hops if h.link == link]
        return ts, qs

    def links(self) -> list[str]:
        return sorted({h.link for h in self.hops})


class IntSampler:
    """Reads the INT stack of every data packet arriving at the given host interfaces."""

    def __init__(
        self,
        endpoints: Iterable[tuple[str, str]],
        links: dict[tuple[int, int], str],
        int_dscp: int = INT_DSCP_DEFAULT,
    ):
        """`endpoints`: (netns path, interface); `links`: (node id, egress port) -> name."""
        self.links = links
        self.socks = [packet_socket_in(ns, ifn, _int_filter(int_dscp)) for ns, ifn in endpoints]
        self._capture: Capture | None = None
        # the newest INT packet seen per destination address: (time, flow, hops newest first)
        self.last: dict[str, tuple[float, tuple[str, str, int], list[HopSample]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="int-sampler", daemon=True)
        self._thread.start()

    def begin(self) -> None:
        with self._lock:
            self._capture = Capture()

    def end(self) -> Capture:
        with self._lock:
            cap, self._capture = self._capture, None
        return cap or Capture()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for s in self.socks:
            s.close()

    def _loop(self) -> None:
        socks = self.socks
        cmsg_space = socket.CMSG_SPACE(_TIMESPEC.size)
        while not self._stop.is_set():
            ready, _, _ = select.select(socks, [], [], 0.1)
            # kernel timestamps are CLOCK_REALTIME; the testbed's times are CLOCK_MONOTONIC
            offset = time.monotonic() - time.time()
            for s in ready:
                while True:
                    try:
                        frame, anc, _flags, _addr = s.recvmsg(SNAPLEN, cmsg_space)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        break
                    now = time.monotonic()
                    for level, kind, data in anc:
                        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                            sec, nsec = _TIMESPEC.unpack(data[: _TIMESPEC.size])
                            now = sec + nsec * 1e-9 + offset
                    self._parse(self._capture, frame, now)

    def _parse(self, cap: Capture | None, frame: bytes, now: float) -> None:
        """Decode one frame into `cap` (None: only remember it as the newest)."""
        got = record_int_frame(cap, frame, now, self.links)
        if got is not None:
            self.last[got[0][1]] = (now, got[0], got[1])


def record_int_frame(
    cap: Capture | None, frame: bytes, now: float, links: dict[tuple[int, int], str]
) -> tuple[tuple[str, str, int], list[HopSample]] | None:
    """Decode the INT stack of one Ethernet frame (an INT data packet arriving at a host) into
    `cap`; returns (flow, hop samples), None when it does not decode (counted). Both engines
    read INT with this: the emulation's packet sockets and the simulated twin's hosts."""
    if cap is not None:
        cap.packets += 1
    try:
        ihl = (frame[14] & 0x0F) * 4
        total_len = struct.unpack_from("!H", frame, 16)[0]
        src = socket.inet_ntoa(frame[26:30])
        dst = socket.inet_ntoa(frame[30:34])
        udp = 14 + ihl
        sport = struct.unpack_from("!H", frame, udp)[0]
        bitmap, hop_ml, stack = int_stack_at(frame, udp + 8)
        hops = decode_stack(stack, bitmap, hop_ml)
    except (IndexError, ValueError, struct.error):
        if cap is not None:
            cap.undecodable += 1
        return None
    samples = []
    for hop in hops:
        node, port = hop.get("node_id"), hop.get("l1_egress_port")
        occ = hop.get("queue_occupancy")
        if node is None or port is None or occ is None:
            continue
        link = links.get((node, port), f"node{node}:{port}")
        samples.append(
            HopSample(
                now,
                link,
                int(occ),
                hop.get("tx_util"),
                hop.get("hop_latency"),
                hop.get("egress_ts"),
            )
        )
    flow = (src, dst, sport)
    if cap is not None:
        cap.flows[flow].append((now, total_len + 14))
        cap.last_hop_egress_ns[flow].append(hops[0].get("egress_ts") if hops else None)
        cap.max_hops = max(cap.max_hops, len(hops))
        cap.hops.extend(samples)
    return flow, samples


@dataclass
class RateEvent:
    t: float  # time.monotonic()
    host: str
    flow: tuple[str, str, int]  # src ip, dst ip, UDP source port
    rate_bps: int
    origin: str


class RateWatcher:
    """Subscribes to every agent's WatchRates stream; `begin()`/`end()` bracket a scenario."""

    def __init__(self, stubs: dict[str, Any]):
        from controller.proto import agent_pb2

        self._events: list[RateEvent] | None = None
        self._lock = threading.Lock()
        self._calls: list[Any] = []
        self.errors: list[str] = []
        self._threads = []
        # CLOCK_MONOTONIC is shared by every namespace: the agent's time_ns and ours agree
        for host, stub in stubs.items():
            call = stub.WatchRates(agent_pb2.WatchRatesRequest())
            self._calls.append(call)
            t = threading.Thread(
                target=self._consume, args=(host, call), name=f"rates:{host}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def _consume(self, host: str, call: Any) -> None:
        import grpc

        try:
            for ev in call:
                k = ev.flow
                if k.protocol != 17 or k.dst_port != ROCE_UDP_PORT:
                    continue
                e = RateEvent(
                    ev.time_ns / 1e9,
                    host,
                    (k.src_ip, k.dst_ip, k.src_port),
                    int(ev.rate_bps),
                    ev.origin,
                )
                with self._lock:
                    if self._events is not None:
                        self._events.append(e)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.errors.append(f"{host}: {exc.code().name}")

    def begin(self) -> None:
        with self._lock:
            self._events = []

    def end(self) -> list[RateEvent]:
        with self._lock:
            ev, self._events = self._events, None
        return ev or []

    def close(self) -> None:
        for c in self._calls:
            c.cancel()
        for t in self._threads:
            t.join(timeout=2)


@dataclass(frozen=True)
class PortCounters:
    rx_packets: int
    tx_packets: int
    rx_bytes: int
    tx_bytes: int


def port_counters(netns_path: str, ifnames: Iterable[str]) -> dict[str, PortCounters]:
    """Kernel counters of the given interfaces of one namespace (`ip -s -j link`)."""
    out = subprocess.run(
        ["nsenter", f"--net={netns_path}", "ip", "-s", "-j", "link", "show"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    wanted = set(ifnames)
    res = {}
    for link in json.loads(out):
        name = link.get("ifname")
        if name in wanted:
            st = link["stats64"]
            # the switch's view: what it received came in on rx, what it sent went out on tx
            res[name] = PortCounters(
                st["rx"]["packets"], st["tx"]["packets"], st["rx"]["bytes"], st["tx"]["bytes"]
            )
    return res


def counters_delta(
    before: dict[str, PortCounters], after: dict[str, PortCounters]
) -> dict[str, PortCounters]:
    return {
        k: PortCounters(
            *(
                a - b
                for a, b in zip(
                    (
                        after[k].rx_packets,
                        after[k].tx_packets,
                        after[k].rx_bytes,
                        after[k].tx_bytes,
                    ),
                    (
                        before[k].rx_packets,
                        before[k].tx_packets,
                        before[k].rx_bytes,
                        before[k].tx_bytes,
                    ),
                    strict=True,
                )
            )
        )
        for k in after
        if k in before
    }


def wait_quiet(
    read: Callable[[], dict[str, PortCounters]], quiet_s: float = 0.3, timeout: float = 5.0
) -> dict[str, PortCounters]:
    """Counters once nothing moved for `quiet_s` (every queued packet has left)."""
    deadline = time.monotonic() + timeout
    last = read()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        cur = read()
        if cur == last:
            return cur
        last = cur
    return last
