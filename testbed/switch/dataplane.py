"""Real-time packet I/O for the built-in switch: raw AF_PACKET sockets on interfaces.

One thread runs the data plane: it waits (poll) for packets on every port and for the next
departure time of the traffic manager, runs ingress on what arrives, and runs egress on what
the traffic manager releases. On the native pipeline the per-frame part (reading a port's
frames with their kernel times, the pipeline, the queues, sending) is C, one call per port
read and per service (`EmuHop`, testbed/switch/hop.py); Python keeps the poll, the control
plane and what the C hands back. Other threads (P4Runtime packet-out, tests) hand packets in with
`inject()`, which wakes the loop through an eventfd-like pipe.

The loop does not die: an error in one pass (a bug, or a setting no check foresaw) is logged,
counted in `loop_errors` with the last one kept in `last_error`, and the loop goes on with
the next packets; SwitchAdmin's GetStatus reports both and whether the loop runs.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import queue
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO

from controller.wire.pfc import is_mac_control
from controller.wire.stamp import stamp, unstamp
from testbed.switch.hop import HopLoop, SwitchHop, native_path
from testbed.switch.native.build import BuildError
from testbed.switch.native.hop import LINE_MAX_BYTES, RX_BATCH
from testbed.switch.native.lock import NativeLock
from testbed.switch.v1model import V1Switch

log = logging.getLogger("xingmai.switch.dataplane")

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
SO_TIMESTAMPNS = 35  # kernel receive time of each packet, as a struct timespec
_TIMESPEC = struct.Struct("@qq")
MAX_FRAME = 65535
IDLE_POLL_MS = 200.0  # the longest the loop sleeps: it also wakes for departures and inject()
ERROR_LOG_INTERVAL_S = 1.0  # a loop error is logged with its traceback at most this often
SOCKET_BUFFER_BYTES = LINE_MAX_BYTES  # each port's socket's, each way: what a line holds


PR_SET_TIMERSLACK = 29


def _precise_timers() -> None:
    """The calling thread's waits end when due, not up to the kernel's default timer slack
    (50 us) later: a delay line's frame leaves on time, and each hop's lateness adds up."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_TIMERSLACK)")
    except (OSError, AttributeError) as exc:
        log.warning("the packet loop keeps the kernel's timer slack: %s", exc)


class PcapWriter:
    """Minimal libpcap writer (Ethernet link type) for per-port captures."""

    def __init__(self, path: Path):
        self.f: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, MAX_FRAME, 1))

    def write(self, data: bytes) -> None:
        t = time.time()
        self.f.write(struct.pack("<IIII", int(t), int((t % 1) * 1e6), len(data), len(data)))
        self.f.write(data)
        self.f.flush()

    def close(self) -> None:
        self.f.close()


@dataclass(frozen=True)
class Wire:
    """A port's link in time, as the twin's wire has it (testbed/sim/fabric.py): a frame that
    leaves at t arrives whole at t + its length at `bps` + `delay_ns`. A veth delivers at
    once, so the switch holds each frame that long in a `DelayLine`: every frame it sends on
    the port, and with `ingress` every frame it reads from it too (the far end, a host, has
    no line of its own). `stamped`: the far end is a built-in switch of the fabric, and the
    line is the receiver's: a frame leaves at once carrying the time it is due whole (STAMP,
    after its bytes), and the far end holds it until then. So a sender's lateness (its loop
    woke late) does not move the frame's time, and its loop does not wake to send it. MAC
    Control frames (PFC's pauses) are sent at once, unstamped."""

    bps: float
    delay_ns: int
    ingress: bool = False
    stamped: bool = False

    def __post_init__(self) -> None:
        if not self.bps > 0 or self.delay_ns < 0 or (self.ingress and self.stamped):
            raise ValueError(
                f"a wire needs a rate above 0, a delay of at least 0 and one far end: {self}"
            )

    @property
    def ns_per_byte(self) -> float:
        return 8e9 / self.bps


# what follows PORT:BPS:DELAY_NS: the far end (none: a port whose frames in are not held)
WIRE_ENDS = {"": {}, "in": {"ingress": True}, "stamped": {"stamped": True}}


def parse_wire(text: str) -> tuple[int, Wire]:
    """`PORT:BPS:DELAY_NS[:in|:stamped]` (the switch's --wire)."""
    parts = text.split(":")
    try:
        far = parts[3] if len(parts) == 4 else ""
        if len(parts) not in (3, 4) or far not in WIRE_ENDS or (len(parts) == 4 and not far):
            raise ValueError
        return int(parts[0]), Wire(float(parts[1]), int(parts[2]), **WIRE_ENDS[far])
    except ValueError:
        raise ValueError(
            f"--wire {text!r}: expected PORT:BPS:DELAY_NS, PORT:BPS:DELAY_NS:in or "
            "PORT:BPS:DELAY_NS:stamped, with a rate above 0 and a delay of at least 0"
        ) from None


class DelayLine:
    """One direction of a port's wire: the frames on it, in order, each with the time it
    arrives whole (`Wire`). A frame goes on the wire when it is handed over or when the one
    ahead of it is all on it, whichever is later: a sender that bursts faster than the link
    (a host's HTB) is spaced at the link's rate, as a NIC's port would. What it holds is
    bounded (LINE_MAX_BYTES, its socket's buffer): a frame beyond is dropped and counted. The
    reference of the native loop's xm_line (hop.py)."""

    def __init__(self, wire: Wire) -> None:  # noqa: D107
        self.ns_per_byte, self.delay_ns = wire.ns_per_byte, wire.delay_ns
        self.frames: deque[tuple[int, int, bytes]] = deque()  # (due, seq, frame)
        self.bytes = 0
        self.free_at = 0  # when the last frame is all on the wire

    def due_of(self, t_ns: int, size: int) -> int:
        """When a frame of `size` bytes handed over at `t_ns` arrives whole: it goes on the
        wire after the one ahead of it (a stamped line's sender keeps only this)."""
        self.free_at = max(t_ns, self.free_at) + int(size * self.ns_per_byte)
        return self.free_at + self.delay_ns

    def put(self, t_ns: int, data: bytes, seq: int = 0) -> bool:
        """The frame leaves at `t_ns` (`seq`: the order it was held in, for ties in time
        with other ports' frames); False: dropped, the line is full."""
        if self.bytes + len(data) > LINE_MAX_BYTES:
            return False
        self._append(self.due_of(t_ns, len(data)), seq, data)
        return True

    def hold(self, due: int, data: bytes, seq: int = 0) -> bool:
        """A frame that carries its due (a stamped line's far end sent it), held until then,
        and no earlier than the frame ahead of it (a link keeps their order); False: dropped,
        the line is full."""
        if self.bytes + len(data) > LINE_MAX_BYTES:
            return False
        if self.frames and self.frames[-1][0] > due:
            due = self.frames[-1][0]
        self._append(due, seq, data)
        return True

    def holds_no_later(self) -> int:
        """The furthest ahead a frame on this line can be due: a full line's serialization
        and the delay (a stamp due later is not one its far end made)."""
        return self.delay_ns + int(LINE_MAX_BYTES * self.ns_per_byte)

    def _append(self, due: int, seq: int, data: bytes) -> None:
        self.frames.append((due, seq, data))
        self.bytes += len(data)

    def next_due(self) -> int | None:
        return self.frames[0][0] if self.frames else None

    def drop_all(self) -> int:
        """Every frame it holds, dropped: how many."""
        n = len(self.frames)
        self.frames.clear()
        self.bytes = 0
        return n

    def take_due(self, now_ns: int) -> list[tuple[int, int, bytes]]:
        """The frames that have arrived whole by `now_ns`, in order: (due, seq, frame)."""
        out = []
        while self.frames and self.frames[0][0] <= now_ns:
            frame = self.frames.popleft()
            self.bytes -= len(frame[2])
            out.append(frame)
        return out


# The longest the loop leaves frames in its ports' sockets: their buffers (SOCKET_BUFFER_BYTES)
# fill in 3.4 ms at 10 Gb/s, and the kernel drops what comes after, where no counter of the
# switch sees it.
LOOP_SLACK_MAX_NS = 1_000_000


def loop_slack_ns(wires: dict[int, Wire]) -> int:
    """How late the loop may take what arrives (`wait_plan`): half the shortest wire's
    delay, so what a frame leads to still goes on its line before it is due there, and at
    most LOOP_SLACK_MAX_NS; 0 (each frame taken when it comes) without wires, or with a wire
    of no delay. A port without a wire (the collector's) then sends up to this late."""
    return min(min((w.delay_ns for w in wires.values()), default=0) // 2, LOOP_SLACK_MAX_NS)


def wait_plan(
    hard: int | None, soft: int | None, slack_ns: int, now: int
) -> tuple[int | None, bool]:
    """When the loop wakes next (None: nothing is due) and whether it polls the ports until
    then. A frame leaving on a line must leave when due (`hard`); a frame a line brings in,
    a departure (`soft`) and a frame read from a socket may be taken up to `slack_ns` late:
    each leads at most to a frame on a line, due a link's delay or more after it. So the loop
    wakes at the hard time or `slack_ns` after the soft one, whichever is first, and a wait
    that ends within `slack_ns` does not wake for a socket's frame: it reads the ports' frames
    when it ends (one wake for many frames: the switches' CPU is their wake-ups). The reference
    of the native loop's xm_emu_plan (hop.py)."""
    wake = None if soft is None else soft + slack_ns
    if hard is not None and (wake is None or hard < wake):
        wake = hard
    if wake is None:
        return None, True
    return wake, not (slack_ns > 0 and wake - now <= slack_ns)


@dataclass
class PortStats:
    rx: int = 0
    tx: int = 0
    tx_errors: int = 0
    rx_down: int = 0  # reads that found the interface down (ENETDOWN: a teardown, ip link)
    rx_bytes: int = 0
    tx_bytes: int = 0
    line_drops: int = 0  # frames the port's delay line could not hold (LINE_MAX_BYTES)
    # how much later than due its frames left their line out (the loop's); on a stamped
    # line, how much later than due its frames came in (their sender's)
    line_late_ns: int = 0
    line_unstamped: int = 0  # frames read on a stamped line that carried no due, dropped


def _port_counter(name: str) -> property:
    def get(self: HopPortStats) -> int:
        return int(getattr(self._hop, name)[self._port])

    def put(self: HopPortStats, value: int) -> None:
        getattr(self._hop, name)[self._port] = value

    return property(get, put)


class HopPortStats(PortStats):
    """A port's counters kept by a native hop's C (testbed/switch/hop.py), which counts
    what it receives and sends there."""

    def __init__(self, hop: Any, port: int, old: PortStats) -> None:  # noqa: D107
        self._hop, self._port = hop, port
        hop.counted[port] = 1
        super().__init__(**{f.name: getattr(old, f.name) for f in fields(PortStats)})

    rx = _port_counter("port_rx")  # type: ignore[assignment]
    tx = _port_counter("port_tx")  # type: ignore[assignment]
    tx_errors = _port_counter("port_tx_errors")  # type: ignore[assignment]
    rx_down = _port_counter("port_rx_down")  # type: ignore[assignment]
    rx_bytes = _port_counter("port_rx_bytes")  # type: ignore[assignment]
    tx_bytes = _port_counter("port_tx_bytes")  # type: ignore[assignment]
    line_drops = _port_counter("port_line_drops")  # type: ignore[assignment]
    line_late_ns = _port_counter("port_line_late_ns")  # type: ignore[assignment]
    line_unstamped = _port_counter("port_line_unstamped")  # type: ignore[assignment]


class Port:
    def __init__(
        self, number: int, iface: str, pcap_dir: Path | None = None, wire: Wire | None = None
    ):
        self.number = number
        self.iface = iface
        self.stats = PortStats()
        self.wire = wire
        # the reference loop's lines (out, in); the native loop keeps its own (EmuHop)
        self.line_out = DelayLine(wire) if wire is not None else None
        self.line_in = (
            DelayLine(wire) if wire is not None and (wire.ingress or wire.stamped) else None
        )
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        # Our own transmissions must not come back as input: the kernel filters them when it
        # can (Linux >= 4.20), else recv_batch looks at each packet's direction.
        try:
            self.sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            self.kernel_filters_outgoing = True
        except OSError:
            self.kernel_filters_outgoing = False
            log.warning("%s: kernel lacks PACKET_IGNORE_OUTGOING; filtering in user space", iface)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.sock.bind((iface, 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        self.pcap_in = self.pcap_out = None
        if pcap_dir is not None:
            self.pcap_in = PcapWriter(pcap_dir / f"port{number}_{iface}_in.pcap")
            self.pcap_out = PcapWriter(pcap_dir / f"port{number}_{iface}_out.pcap")

    def recv_batch(self) -> list[tuple[bytes, int]]:
        """Up to RX_BATCH waiting frames with their kernel receive times (ns, CLOCK_REALTIME;
        0 when the kernel gave none)."""
        out = []
        recvmsg, flags = self.sock.recvmsg, socket.MSG_DONTWAIT
        space = socket.CMSG_SPACE(_TIMESPEC.size)
        for _ in range(RX_BATCH):
            try:
                data, anc, _flags, addr = recvmsg(MAX_FRAME, space, flags)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno != errno.ENETDOWN:
                    raise
                # the interface went down under the socket (the kernel reports it once):
                # no frame to read, as on a cable pulled, not a fault of the switch
                self.stats.rx_down += 1
                log.debug("%s: receive: the interface is down", self.iface)
                break
            if not self.kernel_filters_outgoing and addr[2] == socket.PACKET_OUTGOING:
                continue
            t = 0
            for level, kind, blob in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack(blob[: _TIMESPEC.size])
                    t = sec * 1_000_000_000 + nsec
            out.append((data, t))
        return out

    def send(self, data: bytes, due_mono_ns: int | None = None) -> None:
        """The frame out of the port's socket, counted; with its due after it (`stamp`) on a
        stamped wire."""
        try:
            if due_mono_ns is None:
                self.sock.send(data)
            else:
                self.sock.send(stamp(data, due_mono_ns))
            self.stats.tx += 1
            self.stats.tx_bytes += len(data)
            if self.pcap_out:
                self.pcap_out.write(data)
        except OSError as exc:
            self.stats.tx_errors += 1
            log.debug("%s: send failed: %s", self.iface, exc)

    def close(self) -> None:
        self.sock.close()
        for w in (self.pcap_in, self.pcap_out):
            if w:
                w.close()


class EmuHop(SwitchHop):
    """The switch process's hop: its ports' sockets read and written in C, and what the C
    hands back done as Dataplane does it."""

    def __init__(self, dp: Dataplane) -> None:  # noqa: D107
        sw = dp.switch
        assert sw.compiled is not None and sw.compiled.native is not None
        rt = sw.compiled.native
        self.dp = dp
        loop = HopLoop(rt.ffi, rt.lib, 1)
        loop._c.real_time = 1
        super().__init__(loop, 0, sw)
        for number, port in dp.ports.items():
            self.hop.fd[number] = port.sock.fileno()
            port.stats = HopPortStats(self.hop, number, port.stats)
        self.ports = loop.ffi.new("int64_t[]", list(dp.ports))  # in the order the loop polls
        wired = [(n, p.wire) for n, p in dp.ports.items() if p.wire is not None]
        self.lines = loop.ffi.new("xm_line[]", max(1, len(wired)))  # kept: the hop's
        for i, (number, wire) in enumerate(wired):
            line = self.lines[i]
            line.ns_per_byte, line.delay_ns = wire.ns_per_byte, wire.delay_ns
            line.ingress, line.stamped, line.port = int(wire.ingress), int(wire.stamped), number
            self.hop.line_of[number] = i + 1
        self.hop.lines, self.hop.nlines = self.lines, len(wired)
        self.hop.slack_ns = dp.slack_ns
        self.hop.start_ns = sw.clock.start_ns

    def drop_lines(self) -> int:
        """The frames its lines hold, dropped and counted (a new hop takes over)."""
        return int(self.loop.lib.xm_emu_lines_drop(self.loop._c, 0))

    def line_put(self, port: int, ingress: bool, t_ns: int, data: bytes) -> bool:
        """A frame onto the port's line in C; False: dropped (counted there)."""
        rc = self.loop.lib.xm_emu_line_put(
            self.loop._c, 0, port, int(ingress), data, len(data), t_ns
        )
        if rc == -1:
            raise MemoryError("the switch's delay line could not hold a frame")
        return rc == 1

    def dues(self) -> tuple[int | None, int | None]:
        """`Dataplane._dues` from the C's lines."""
        held = self.loop.ffi.new("int64_t *")
        due = [
            int(held[0]) if self.loop.lib.xm_emu_next_due(self.loop._c, 0, way, held) else None
            for way in (0, 1)
        ]
        soft = self.sw.tm.next_departure_ns()
        if due[1] is not None and (soft is None or due[1] < soft):
            soft = due[1]
        return due[0], soft

    def ready(self) -> bool:
        """Whether the next batch may run in C (`refresh` keeps it: the switch's program is
        the hop's, and its per-packet path native)."""
        return bool(self.hop.fast)

    def receive(self, port: int, frame: bytes) -> None:
        t = self.loop.now_ns  # the frame's arrival, as `_read_port` takes it
        sw = self.sw
        due = sw.tm.next_departure_ns()
        if due is not None and due <= t:
            sw.service(until_ns=t)
        sw.receive(port, frame, t)

    def service(self) -> None:
        self.sw.service()

    def schedule(self) -> None:
        pass  # the loop polls for the next departure itself

    def transmit(self, port: int, frame: bytes) -> None:
        self.dp._transmit(port, frame)


class Dataplane:
    def __init__(
        self,
        switch: V1Switch,
        interfaces: dict[int, str],
        pcap_dir: Path | None = None,
        io: str = "native",
        wires: dict[int, Wire] | None = None,
    ):
        wires = wires or {}
        if set(wires) - set(interfaces):
            raise ValueError(
                f"--wire on ports with no interface (-i): {sorted(set(wires) - set(interfaces))}"
            )
        self.switch = switch
        self.ports: dict[int, Port] = {}
        self.cpu_handler: Callable[[bytes], None] | None = None
        self.tx_unknown_port = 0
        self.loop_errors = 0
        self.last_error = ""
        self._last_error_log = 0.0
        self._inbox: queue.SimpleQueue[tuple[int, bytes]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.slack_ns = loop_slack_ns(wires)
        self._held = itertools.count()  # the order frames are held in (DelayLine's seq)
        # the reference loop's frames read and not yet arrived: (time, seq, port, frame)
        self._arrived: list[tuple[int, int, Port, bytes]] = []
        if pcap_dir is not None:
            pcap_dir.mkdir(parents=True, exist_ok=True)
        try:
            for number, iface in interfaces.items():
                self.ports[number] = Port(number, iface, pcap_dir, wires.get(number))
        except OSError:
            self.close()
            raise
        switch.transmit = self._transmit
        # the per-frame part in C where it can run: the native pipeline, no capture, and a
        # kernel that keeps our own transmissions out of our reads
        self.native_io = ""
        if io != "native":
            self.native_io = "python: asked for (--io)"
        elif pcap_dir is not None:
            self.native_io = "python: capturing to pcap"
        elif not all(p.kernel_filters_outgoing for p in self.ports.values()):
            self.native_io = "python: the kernel lacks PACKET_IGNORE_OUTGOING"
        self.hop: EmuHop | None = None
        # The C loop takes the switch's lock itself: a C mutex, swapped in here, before the
        # control plane runs (main.py makes the data plane first). Without a C compiler the
        # switch keeps its RLock and the loop calls the C per port read and per service.
        self.c_lock: NativeLock | None = None
        if not self.native_io:
            try:
                self.c_lock = NativeLock()
            except BuildError as exc:
                log.warning("the packet loop's wait stays in Python: %s", exc)
            else:
                switch.lock = self.c_lock
        switch.on_change = self._pipeline_changed
        self._pipeline_changed()

    def _pipeline_changed(self) -> None:
        """A program loaded (or the last packet of the one before left): the hop follows."""
        sw = self.switch
        if self.hop is not None:
            self.hop.refresh()
        if self.native_io or not native_path(sw):
            return
        c = sw.compiled
        assert c is not None
        if self.hop is None or c.native is not self.hop.rt:
            dropped = self.hop.drop_lines() if self.hop is not None else self._drop_lines()
            if dropped:
                log.warning("%d frames on the wires dropped: the native loop takes over", dropped)
            self.hop = EmuHop(self)
            log.info("the per-frame path runs in C")

    def _drop_lines(self) -> int:
        """The frames the ports' own lines hold, dropped and counted (the native loop, which
        keeps its own, takes over when a program loads)."""
        n = 0
        for p in self.ports.values():
            for line in (p.line_out, p.line_in):
                if line is not None:
                    k = line.drop_all()
                    p.stats.line_drops += k
                    n += k
        return n

    def io_path(self) -> str:
        """Where the per-frame part runs now: "native", or "python: " and why."""
        sw = self.switch
        if self.native_io:
            return self.native_io
        if self.hop is not None and self.hop.ready():
            return "native"
        c = sw.compiled
        if c is None:
            return "python: no program loaded"
        if c.native is None or not c.native.arch:
            return f"python: the {sw.pipeline_in_use} pipeline"
        if not native_path(sw):
            return "python: packets of the program before queued"
        return "python"

    def _transmit(self, port: int, data: bytes) -> None:
        p = self.ports.get(port)
        if p is not None and p.wire is not None and not is_mac_control(data):  # pauses: at once
            t = self.switch.departed_ns  # the departure's time: the loop's lateness aside
            self._line_put(p, False, self.switch.clock.now_ns() if t is None else t, data)
        elif p is not None:
            p.send(data)
        elif port == self.switch.cpu_port and self.cpu_handler is not None:
            self.cpu_handler(data)
        else:
            self.tx_unknown_port += 1

    def _line_put(self, p: Port, ingress: bool, t_ns: int, data: bytes) -> None:
        """A frame onto one of the port's lines: the native loop's when it has a hop (one
        set of lines per process), else the port's own."""
        if self.hop is not None:
            with self.switch.lock:
                self.hop.line_put(p.number, ingress, t_ns, data)
            return
        line = p.line_in if ingress else p.line_out
        assert line is not None and p.wire is not None
        if not ingress and p.wire.stamped:  # the far end holds it until its due
            p.send(data, line.due_of(t_ns, len(data)) + self.switch.clock.start_ns)
        elif not line.put(t_ns, data, next(self._held)):
            p.stats.line_drops += 1

    def _dues(self) -> tuple[int | None, int | None]:
        """On the switch's clock: the next frame due to leave on a line (hard: it leaves
        then), and the next departure or frame a line brings in (soft: `wait_plan`)."""
        if self.hop is not None:
            return self.hop.dues()
        hard, soft = None, self.switch.tm.next_departure_ns()
        for p in self.ports.values():
            for line, hold in ((p.line_out, False), (p.line_in, True)):
                held = line.next_due() if line is not None else None
                if held is None:
                    continue
                if hold and (soft is None or held < soft):
                    soft = held
                elif not hold and (hard is None or held < hard):
                    hard = held
        return hard, soft

    def _service(self) -> None:
        """After each poll: the frames read and those the lines bring in by now arrive, all
        ports' in the order of their times (each after the departures due before it), then
        every departure due by now, then the frames the lines deliver by now leave. In C
        (xm_emu_service) with a hop."""
        sw = self.switch
        hop = self.hop
        if hop is not None:
            with sw.lock:
                hop.loop.lib.xm_emu_service(hop.loop._c, 0, sw.clock.start_ns)
            hop.loop.raise_failed()
            return
        now = sw.clock.now_ns()
        batch, self._arrived = self._arrived, []
        for p in self.ports.values():
            if p.line_in is not None:
                batch.extend((due, seq, p, data) for due, seq, data in p.line_in.take_due(now))
        batch.sort(key=lambda f: (f[0], f[1]))
        for t, _seq, p, data in batch:
            self._arrive(p, data, t)
        sw.service(until_ns=now)
        for p in self.ports.values():
            if p.line_out is not None:
                for due, _seq, data in p.line_out.take_due(now):
                    p.stats.line_late_ns += now - due
                    p.send(data)

    def _arrive(self, p: Port, data: bytes, t: int) -> None:
        """A frame at its arrival time: the departures due before it first."""
        sw = self.switch
        try:
            due = sw.tm.next_departure_ns()
            if due is not None and due <= t:
                sw.service(until_ns=t)
            sw.receive(p.number, data, t)
        except Exception as exc:  # this packet is lost; the batch goes on
            self._survive(exc)

    def inject(self, port: int, data: bytes) -> None:
        """Hand a packet to ingress from any thread (e.g. a P4Runtime packet-out)."""
        self._inbox.put((port, data))
        try:
            os.write(self._wake_w, b"\x01")
        except BlockingIOError:
            pass  # the loop is already due to wake up

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dataplane", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        _precise_timers()
        try:
            self._loop()
        except BaseException as exc:  # only what the loop cannot survive: said loudly
            self.last_error = f"loop stopped: {type(exc).__name__}: {exc}"
            log.critical("dataplane loop stopped", exc_info=True)
            raise

    def _survive(self, exc: Exception) -> None:
        """One pass failed: count it, log it (not a traceback per packet), go on."""
        self.loop_errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:500]
        now = time.monotonic()
        if now - self._last_error_log >= ERROR_LOG_INTERVAL_S:
            self._last_error_log = now
            log.error(
                "dataplane error (%d so far), forwarding goes on", self.loop_errors, exc_info=exc
            )

    def stop(self) -> None:
        self._stop.set()
        try:
            os.write(self._wake_w, b"\x00")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.close()

    def close(self) -> None:
        for p in self.ports.values():
            p.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _loop(self) -> None:
        poller = select.poll()  # the ports and the wake pipe
        by_fd = {p.sock.fileno(): p for p in self.ports.values()}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        waker = select.poll()  # the wake pipe alone: a wait that reads the ports when it ends
        waker.register(self._wake_r, select.POLLIN)
        sw = self.switch
        clock = sw.clock
        # kernel timestamps are wall-clock time: map them onto the switch's clock
        offset = time.time_ns() - time.monotonic_ns() + clock.start_ns
        refreshed = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() - refreshed > 1.0:
                offset = time.time_ns() - time.monotonic_ns() + clock.start_ns
                refreshed = time.monotonic()
            hop = self.hop
            if hop is not None and self.c_lock is not None and hop.ready():
                try:
                    self._c_passes(hop, offset)
                except Exception as exc:
                    self._survive(exc)
                continue
            try:
                now = clock.now_ns()
                nxt, polled = wait_plan(*self._dues(), self.slack_ns, now)
                timeout_ms = (
                    IDLE_POLL_MS if nxt is None else min(IDLE_POLL_MS, max(0.0, (nxt - now) / 1e6))
                )
                events = (poller if polled else waker).poll(timeout_ms)
                if not polled:  # one look at every port says which to read
                    events = poller.poll(0)
            except InterruptedError:
                continue
            except Exception as exc:
                self._survive(exc)
                self._stop.wait(0.001)  # an error that repeats must not spin a core
                continue
            for fd, _ev in events:
                try:
                    if fd == self._wake_r:
                        self._drain_inbox()
                    else:
                        p = by_fd.get(fd)
                        if p is not None:
                            self._read_port(p, offset)
                except Exception as exc:
                    self._survive(exc)
            try:
                self._service()
            except Exception as exc:
                self._survive(exc)

    def _c_passes(self, hop: EmuHop, offset: int) -> None:
        """The loop's passes in C (`xm_emu_loop`) until it returns: the wake pipe had
        something (handed in here), IDLE_POLL_MS went by (the loop's housekeeping: the
        clocks' offset, the stop), or the switch's path left the hop."""
        assert self.c_lock is not None
        until = time.monotonic_ns() + int(IDLE_POLL_MS * 1e6)
        lp = hop.loop
        rc = lp.lib.xm_emu_loop(
            lp._c,
            0,
            self.c_lock.address,
            hop.ports,
            len(self.ports),
            self._wake_r,
            self.switch.clock.start_ns,
            offset,
            until,
        )
        lp.raise_failed()
        if rc < 0:
            p = self.ports.get(int(lp._c.py_handle))
            where = p.iface if p is not None else "poll"
            raise OSError(-rc, f"{where}: {os.strerror(-rc)}")
        self._drain_inbox()

    def _drain_inbox(self) -> None:
        try:
            os.read(self._wake_r, 4096)
        except BlockingIOError:
            pass
        while True:
            try:
                port, data = self._inbox.get_nowait()
            except queue.Empty:
                break
            try:
                self.switch.receive(port, data)
            except Exception as exc:
                self._survive(exc)

    def _read_port(self, p: Port, offset: int) -> None:
        sw = self.switch
        hop = self.hop
        if hop is not None and hop.ready():
            with sw.lock:
                n = hop.loop.lib.xm_emu_read(
                    hop.loop._c, 0, p.number, RX_BATCH, sw.clock.start_ns, offset
                )
            hop.loop.raise_failed()
            if n < 0:
                raise OSError(-n, f"{p.iface}: receive: {os.strerror(-n)}")
            return
        for data, t_real in p.recv_batch():
            # A packet read late still arrived when the kernel says: it arrives at that
            # time, after the departures due before it (or goes on the port's wire then).
            t = t_real - offset if t_real else sw.clock.now_ns()
            if p.wire is not None and p.wire.stamped and not is_mac_control(data):
                self._read_stamped(p, data, t)
                continue
            p.stats.rx += 1
            p.stats.rx_bytes += len(data)
            if p.pcap_in:
                p.pcap_in.write(data)
            if p.wire is not None and p.wire.ingress:
                self._line_put(p, True, t, data)
            else:  # arrives in _service, in time order with the other ports' frames
                self._arrived.append((t, next(self._held), p, data))

    def _read_stamped(self, p: Port, data: bytes, t: int) -> None:
        """A frame read at `t` on a stamped wire: held on the port's line until the due it
        carries (xm_emu_read's, in C)."""
        line = p.line_in
        assert line is not None
        got = unstamp(data)
        if got is None:
            p.stats.line_unstamped += 1
            return
        frame, due = got[0], got[1] - self.switch.clock.start_ns
        if due - t > line.holds_no_later():  # not a due its far end could make
            p.stats.line_unstamped += 1
            return
        p.stats.rx += 1
        p.stats.rx_bytes += len(frame)
        if p.pcap_in:
            p.pcap_in.write(frame)
        if t > due:
            p.stats.line_late_ns += t - due
        if not line.hold(due, frame, next(self._held)):
            p.stats.line_drops += 1
