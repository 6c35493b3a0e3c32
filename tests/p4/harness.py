"""Test fabrics of switches running p4src/build/xingmai.json, programmed over P4Runtime.

A test describes switches, the links between their ports, and named host ports; it programs
the switches with finsy, as the controller does, sends frames from hosts and reads what
reaches hosts, packet-ins and counters. Two targets stand behind the same interface:

- `BuiltinFabric`: built-in switches (testbed/switch) in this process on one virtual clock, so
  runs are deterministic; links deliver after a propagation delay; the traffic manager reports
  queue depths in bytes.
- `Bmv2Fabric` (tests/p4/bmv2.py): `simple_switch_grpc` processes in a private network
  namespace, links as veth pairs, host ports as veth pairs whose outer end the test uses (root
  only; skipped otherwise).

The finsy clients run on an asyncio loop in a background thread; the methods here block.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import finsy as fy

from controller.common.ports import free_port
from testbed.switch.p4runtime import P4RuntimeService, serve
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import V1Switch

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "p4src" / "build"
P4INFO = BUILD / "xingmai.p4info.txtpb"
BMV2_JSON = BUILD / "xingmai.json"
CPU_PORT = 255
REPORT_CLONE_SESSION = 256
CPU_CLONE_SESSION = 257

T = TypeVar("T")


@dataclass(frozen=True)
class Topology:
    """`switches` switches (device ids 1..n); links (sw, port, sw, port); hosts name -> (sw,
    port). Switch indexes are 0-based."""

    switches: int
    links: tuple[tuple[int, int, int, int], ...] = ()
    hosts: dict[str, tuple[int, int]] = field(default_factory=dict)

    def peer(self, sw: int, port: int) -> tuple[int, int] | None:
        for a, pa, b, pb in self.links:
            if (a, pa) == (sw, port):
                return b, pb
            if (b, pb) == (sw, port):
                return a, pa
        return None

    def host_at(self, sw: int, port: int) -> str | None:
        for name, where in self.hosts.items():
            if where == (sw, port):
                return name
        return None


class _Clients:
    """finsy switches on an event loop in a daemon thread; `call` runs a coroutine there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="finsy", daemon=True)
        self.thread.start()
        self.stack = contextlib.AsyncExitStack()
        self.switches: dict[int, fy.Switch] = {}
        self.packet_ins: dict[int, deque[fy.P4PacketIn]] = {}
        self._readers: list[asyncio.Task[None]] = []

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def connect(self, idx: int, address: str, device_id: int) -> None:
        async def go() -> None:
            opts = fy.SwitchOptions(
                p4info=P4INFO, p4blob=BMV2_JSON, device_id=device_id, p4force=True
            )
            sw = fy.Switch(f"s{idx + 1}", address, opts)
            await self.stack.enter_async_context(sw)
            self.switches[idx] = sw
            box: deque[fy.P4PacketIn] = deque()
            self.packet_ins[idx] = box

            async def read() -> None:
                async for pkt in sw.read_packets():
                    box.append(pkt)

            self._readers.append(asyncio.ensure_future(read()))

        self.call(go())

    def close(self) -> None:
        async def stop() -> None:
            for t in self._readers:
                t.cancel()
            await asyncio.gather(*self._readers, return_exceptions=True)
            await self.stack.aclose()

        try:
            self.call(stop(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


class Fabric:
    """What every target offers the tests."""

    name = "?"
    # Timestamps and timing are exact on a virtual clock, approximate on a real one.
    virtual_time = False

    def __init__(self, topo: Topology):
        self.topo = topo
        self.clients = _Clients()
        self.received: dict[str, list[bytes]] = {h: [] for h in topo.hosts}

    # ---- control plane (P4Runtime through finsy) ------------------------------------------

    def write(self, sw: int, updates: Iterable[Any]) -> None:
        self.clients.call(self.clients.switches[sw].write(list(updates)))

    def read(self, sw: int, entity: Any) -> list[Any]:
        async def go() -> list[Any]:
            reader: Any = self.clients.switches[sw].read(entity)  # an async iterator
            return [e async for e in reader]

        return self.clients.call(go())

    def counter(self, sw: int, name: str, index: int) -> tuple[int, int]:
        """(packets, bytes) of an indexed counter cell."""
        (entry,) = self.read(sw, fy.P4CounterEntry(name, index=index))
        data = entry.data
        return (data.packet_count, data.byte_count) if data is not None else (0, 0)

    def packet_out(self, sw: int, payload: bytes, egress_port: int) -> None:
        self.write(sw, [fy.P4PacketOut(payload, egress_port=egress_port)])

    def packet_ins(self, sw: int, wait: float = 0.0, count: int = 1) -> list[fy.P4PacketIn]:
        """Packet-ins received so far from switch `sw` (waiting up to `wait` s for `count`)."""
        box = self.clients.packet_ins[sw]
        deadline = time.monotonic() + wait
        while len(box) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        out = list(box)
        box.clear()
        return out

    def qdepth_unit_for(self, frame_bytes: int) -> int:
        """switch_config's qdepth_unit for a test that sends `frame_bytes` frames: 1 where the
        target counts queue depth in bytes."""
        return 1

    # ---- data plane -------------------------------------------------------------------------

    def send(self, host: str, frame: bytes) -> None:
        raise NotImplementedError

    def settle(self) -> None:
        """Run until no packet is in flight."""
        raise NotImplementedError

    def wait(self, ns: int) -> None:
        """Let `ns` nanoseconds pass (virtual time moves at once; a real clock sleeps)."""
        raise NotImplementedError

    def take(self, host: str) -> list[bytes]:
        """Frames that reached `host` since the last call."""
        out = self.received[host]
        self.received[host] = []
        return out

    def set_port_rate(self, sw: int, port: int, pps: float, frame_bytes: int) -> None:
        """Limit `port` of `sw` to `pps` frames of `frame_bytes` per second."""
        raise NotImplementedError

    def close(self) -> None:
        self.clients.close()


class BuiltinFabric(Fabric):
    """Built-in switches in process on one virtual clock."""

    name = "builtin"
    virtual_time = True
    LINK_DELAY_NS = 1_000

    def __init__(self, topo: Topology, pipeline: str = "reference"):
        super().__init__(topo)
        self.clock = Clock(virtual=True)
        self.switches: list[V1Switch] = []
        self.services: list[P4RuntimeService] = []
        self.servers: list[Any] = []
        self._events: list[tuple[int, int, int, int, bytes]] = []  # (due, seq, sw, port, data)
        self._seq = itertools.count()
        self._lock = threading.Lock()
        for i in range(topo.switches):
            sw = V1Switch(
                self.clock,
                device_id=i + 1,
                cpu_port=CPU_PORT,
                qdepth_unit="bytes",
                pipeline=pipeline,
            )
            svc = P4RuntimeService(sw, i + 1, inject=self._injector(i))
            sw.transmit = self._transmitter(i, svc)
            self.switches.append(sw)
            self.services.append(svc)
            server, port = self._serve(svc)
            self.servers.append(server)
            self.clients.connect(i, f"127.0.0.1:{port}", i + 1)

    @staticmethod
    def _serve(svc: P4RuntimeService) -> tuple[Any, int]:
        for _ in range(20):
            port = free_port()
            try:
                return serve(svc, f"127.0.0.1:{port}", max_workers=4), port
            except OSError:
                continue  # taken between probing and binding: try another
        raise OSError("no free local port for a P4Runtime server")

    def _injector(self, i: int) -> Callable[[int, bytes], None]:
        def inject(port: int, data: bytes) -> None:  # packet-out, from a gRPC thread
            with self._lock:
                self.switches[i].receive(port, data)

        return inject

    def _transmitter(self, i: int, svc: P4RuntimeService) -> Callable[[int, bytes], None]:
        def transmit(port: int, data: bytes) -> None:
            if port == CPU_PORT:
                svc.packet_in(data)
                return
            peer = self.topo.peer(i, port)
            if peer is not None:
                due = self.clock.now_ns() + self.LINK_DELAY_NS
                self._events.append((due, next(self._seq), peer[0], peer[1], data))
                return
            host = self.topo.host_at(i, port)
            if host is not None:
                self.received[host].append(data)

        return transmit

    def send(self, host: str, frame: bytes) -> None:
        sw, port = self.topo.hosts[host]
        with self._lock:
            self.switches[sw].receive(port, bytes(frame))

    def settle(self) -> None:
        with self._lock:
            while True:
                for sw in self.switches:
                    sw.service()
                now = self.clock.now_ns()
                due = [e for e in self._events if e[0] <= now]
                if due:
                    self._events = [e for e in self._events if e[0] > now]
                    for _, _, sw_i, port, data in sorted(due):
                        self.switches[sw_i].receive(port, data)
                    continue
                nexts = [e[0] for e in self._events]
                nexts += [t for sw in self.switches if (t := sw.tm.next_departure_ns()) is not None]
                if not nexts:
                    return
                self.clock.advance_to(max(min(nexts), now + 1))

    def wait(self, ns: int) -> None:
        self.settle()
        with self._lock:
            self.clock.advance(ns)
        self.settle()

    def wait_packet_outs(self, sw: int, count: int, timeout: float = 5.0) -> None:
        """Packet-outs arrive on the stream; wait until the switch has taken `count`."""
        deadline = time.monotonic() + timeout
        while self.services[sw].counters["packet_out"] < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"switch {sw} took {self.services[sw].counters} packet-outs")
            time.sleep(0.01)

    def packet_out(self, sw: int, payload: bytes, egress_port: int) -> None:
        before = self.services[sw].counters["packet_out"]
        super().packet_out(sw, payload, egress_port)
        self.wait_packet_outs(sw, before + 1)

    def set_port_rate(self, sw: int, port: int, pps: float, frame_bytes: int) -> None:
        with self._lock:
            self.switches[sw].tm.set_rate(port, bps=pps * frame_bytes * 8)

    def close(self) -> None:
        try:
            super().close()
        finally:
            for s in self.servers:
                s.stop(0)
