"""The twin's event loop in C, its switch hops with it (testbed/switch/native/hop.py).

`NativeEventLoop` is testbed/sim/engine.py's `EventLoop` with its heap in C: the same clock,
the same order ((time, sequence number), one sequence for every event), the same `at` and
`run`. The fabric's wires and its switches' common per-packet path are events of the C heap
that run without returning to Python; a frame for a host, and every event Python schedules,
come back to `run`, which calls them as EventLoop does. What the C leaves to Python runs
through the callbacks of each switch's `SwitchHop` (testbed/switch/hop.py).

A host whose per-packet loop runs in C (testbed/sim/host_native.py) is registered here
(`add_host`): its kicks and timers are events of the C heap, the frames its wire delivers go
to its C first, and what the C leaves to Python comes back from `run` to the host's
`native_event`.

`run`'s `stop` is asked after each Python event, not after each switch hop: what it reads
(the hosts' jobs) only Python events change. The loop is used when the switches run the
native pipeline with its common path (testbed.sim.fabric chooses; `--loop-pipeline
reference` keeps the Python loop over the same switches, to bisect a difference).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from testbed.switch.hop import HopLoop
from testbed.switch.native.hop import (
    RUN_DELIVER,
    RUN_EMPTY,
    RUN_FAILED,
    RUN_HOST,
    RUN_PYTHON,
    RUN_UNTIL,
)


class CHost(Protocol):
    """What the loop calls back on a host in C (testbed/sim/host_native.py)."""

    def native_event(self, code: int, frame: bytes | None) -> None: ...


class NativeEventLoop(HopLoop):
    def __init__(self, ffi: Any, lib: Any, switches: int, wires: int) -> None:
        super().__init__(ffi, lib, switches, wires)
        self._wire_cap = wires
        self._py: dict[int, tuple[Callable[..., None], tuple[Any, ...]]] = {}
        self._handle = 0
        self._targets: list[Callable[[bytes], None]] = []
        self._hosts: list[CHost] = []
        self._host_ptrs: Any = None  # void *[]: each C host's state

    def add_host(self, host: CHost, state: Any, rx: int, event: int) -> int:
        """A host in C: its state (struct xm_host *) and the addresses of its entry points
        (host_native.c's xm_host_rx, xm_host_event); its number in the loop."""
        i = len(self._hosts)
        self._hosts.append(host)
        ptrs = self.ffi.new("void *[]", i + 1)
        for j in range(i):
            ptrs[j] = self._host_ptrs[j]
        ptrs[i] = self.ffi.cast("void *", state)
        self._host_ptrs = ptrs
        c = self._c
        c.hosts, c.nhosts = ptrs, i + 1
        c.host_rx = self.ffi.cast("void *", rx)
        c.host_event = self.ffi.cast("void *", event)
        return i

    def host_entry(self) -> tuple[int, int, int]:
        """(the loop's state, xm_loop_push_host, xm_wire_send), as addresses, for a C host."""
        ffi, lib = self.ffi, self.lib
        return (
            int(ffi.cast("uintptr_t", self._c)),
            int(ffi.cast("uintptr_t", ffi.addressof(lib, "xm_loop_push_host"))),
            int(ffi.cast("uintptr_t", ffi.addressof(lib, "xm_wire_send"))),
        )

    # ---- EventLoop's interface ----

    @property
    def now(self) -> float:
        """Seconds (what the transport core and the jobs take)."""
        return int(self._c.now) / 1e9

    @property
    def events(self) -> int:
        return int(self._c.events)

    @property
    def pending(self) -> int:
        return int(self._c.n)

    def at(self, t_ns: int, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` at `t_ns` (not before now)."""
        self._handle += 1
        h = self._handle
        self._py[h] = (fn, args)
        if self.lib.xm_loop_at(self._c, t_ns, h):
            del self._py[h]
            raise MemoryError("the native event loop could not grow its heap")

    def run(self, until_ns: int | None = None, stop: Callable[[], bool] | None = None) -> bool:
        """As EventLoop.run; `stop` is asked after each Python event."""
        c = self._c
        step = self.lib.xm_loop_run
        py = self._py
        targets = self._targets
        hosts = self._hosts
        buffer = self.ffi.buffer
        until = -1 if until_ns is None else until_ns
        while True:
            k = step(c, until)
            if k == RUN_PYTHON:
                fn, args = py.pop(c.py_handle)
                fn(*args)
            elif k == RUN_DELIVER:
                targets[c.py_handle](buffer(c.py_data, c.py_len)[:])
            elif k == RUN_HOST:
                frame = buffer(c.py_data, c.py_len)[:] if c.py_len else None
                hosts[c.py_handle].native_event(int(c.py_code), frame)
            elif k == RUN_FAILED:
                self.raise_failed()
            else:
                assert k in (RUN_EMPTY, RUN_UNTIL)
                return False
            if stop is not None and stop():
                return True

    # ---- the fabric's links in C ----

    def wire(
        self,
        rate_bps: float,
        delay_ns: int,
        max_frame: int,
        to_switch: int | None,
        to: int | Callable[[bytes], None],
        host: int = -1,
    ) -> int:
        """A new wire delivering to a switch's port (`to_switch`, `to` its port) or, with
        `to_switch` None, to the Python target `to` (`host`: the C host, `add_host`'s number,
        whose C sees each frame first); its index."""
        i = int(self._c.nwires)
        if i >= self._wire_cap:
            raise ValueError(f"the native event loop was made for {self._wire_cap} wires")
        w = self._wires[i]
        w.ns_per_byte = 8e9 / rate_bps
        w.delay_ns = delay_ns
        w.max_frame = max_frame
        w.host = host
        if to_switch is None:
            assert callable(to)
            w.to_switch, w.to = -1, len(self._targets)
            self._targets.append(to)
        else:
            assert isinstance(to, int)
            w.to_switch, w.to = to_switch, to
        self._c.nwires = i + 1
        return i

    def send(self, wire: int, frame: bytes, t_ns: int) -> bool:
        rc = self.lib.xm_wire_send(self._c, wire, frame, len(frame), t_ns)
        if rc < 0:
            raise MemoryError("the native event loop could not hold a frame")
        return bool(rc)

    def schedule_at(self, node: int, t_ns: int) -> None:
        if self.lib.xm_hop_schedule_at(self._c, node, t_ns):
            raise MemoryError("the native event loop could not grow its heap")
