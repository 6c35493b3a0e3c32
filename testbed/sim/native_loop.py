"""The twin's event loop in C, its switch hops with it (testbed/switch/native/hop.py).

`NativeEventLoop` is testbed/sim/engine.py's `EventLoop` with its heap in C: the same clock,
the same order ((time, sequence number), one sequence for every event), the same `at` and
`run`. The fabric's wires and its switches' common per-packet path are events of the C heap
that run without returning to Python; a frame for a host, and every event Python schedules,
come back to `run`, which calls them as EventLoop does. What the C leaves to Python runs
through the callbacks `SimSwitch` gives (`HopCallbacks`).

`run`'s `stop` is asked after each Python event, not after each switch hop: what it reads
(the hosts' jobs) only Python events change. The loop is used when the switches run the
native pipeline with its common path (testbed.sim.fabric chooses; `loop="reference"` keeps
the Python loop over the same switches, to bisect a difference).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from testbed.switch.native.hop import (
    RUN_DELIVER,
    RUN_EMPTY,
    RUN_FAILED,
    RUN_PYTHON,
    RUN_UNTIL,
)


class HopCallbacks(Protocol):
    """What a switch does in Python for its hop's C (SimSwitch implements it)."""

    def receive_python(self, port: int, frame: bytes) -> None: ...
    def after_receive(self, port: int, rc: int, packet: int) -> None: ...
    def port_made(self, port: int) -> None: ...
    def service_python(self) -> None: ...
    def schedule_python(self) -> None: ...
    def transmit_python(self, port: int, frame: bytes) -> None: ...
    def release(self, handle: int) -> None: ...
    def not_sent(self, k: int, packet: int) -> None: ...
    def foreign(self, k: int) -> None: ...


class NativeEventLoop:
    def __init__(self, ffi: Any, lib: Any, switches: int, wires: int) -> None:
        self.ffi, self.lib = ffi, lib
        self._mem = ffi.new("xm_loop *")
        self._c = self._mem
        self._hops = ffi.new("xm_hop[]", max(1, switches))
        self._wires = ffi.new("xm_wire[]", max(1, wires))
        self._c.hops, self._c.nhops = self._hops, switches
        self._c.wires, self._c.nwires = self._wires, 0
        self._wire_cap = wires
        if lib.xm_loop_init(self._c):
            raise MemoryError("the native event loop could not allocate its heap")
        self._py: dict[int, tuple[Callable[..., None], tuple[Any, ...]]] = {}
        self._handle = 0
        self._targets: list[Callable[[bytes], None]] = []
        self._switches: list[HopCallbacks | None] = [None] * switches
        self._error: BaseException | None = None
        self._callbacks = self._make_callbacks()

    def __del__(self) -> None:
        lib = getattr(self, "lib", None)
        if lib is not None:
            lib.xm_loop_free(self._c)

    # ---- EventLoop's interface ----

    @property
    def now_ns(self) -> int:
        return int(self._c.now)

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
        buffer = self.ffi.buffer
        until = -1 if until_ns is None else until_ns
        while True:
            k = step(c, until)
            if k == RUN_PYTHON:
                fn, args = py.pop(c.py_handle)
                fn(*args)
            elif k == RUN_DELIVER:
                targets[c.py_handle](buffer(c.py_data, c.py_len)[:])
            elif k == RUN_FAILED:
                c.failed = 0
                err, self._error = self._error, None
                if err is None:
                    raise MemoryError("the native event loop ran out of memory")
                raise err
            else:
                assert k in (RUN_EMPTY, RUN_UNTIL)
                return False
            if stop is not None and stop():
                return True

    # ---- the fabric's parts in C ----

    def wire(
        self,
        rate_bps: float,
        delay_ns: int,
        max_frame: int,
        to_switch: int | None,
        to: int | Callable[[bytes], None],
    ) -> int:
        """A new wire delivering to a switch's port (`to_switch`, `to` its port) or, with
        `to_switch` None, to the Python target `to`; its index."""
        i = int(self._c.nwires)
        if i >= self._wire_cap:
            raise ValueError(f"the native event loop was made for {self._wire_cap} wires")
        w = self._wires[i]
        w.ns_per_byte = 8e9 / rate_bps
        w.delay_ns = delay_ns
        w.max_frame = max_frame
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

    def hop(self, node: int, switch: HopCallbacks) -> Any:
        """Switch `node`'s C state (xm_hop), its callbacks `switch`'s."""
        self._switches[node] = switch
        h = self._hops[node]
        h.service_at = -1
        for p in range(len(h.wire)):
            h.wire[p] = -1
        return h

    def schedule_at(self, node: int, t_ns: int) -> None:
        if self.lib.xm_hop_schedule_at(self._c, node, t_ns):
            raise MemoryError("the native event loop could not grow its heap")

    def free_packet(self) -> Any:
        return self.lib.xm_hop_free_packet

    def _make_callbacks(self) -> list[Any]:
        """The C's callbacks into the switches: an exception is kept, the loop stops after
        the event, and `run` raises it."""
        ffi, c, sw = self.ffi, self._c, self._switches
        buffer = ffi.buffer

        def failed(exc_type: Any, exc: BaseException, tb: Any) -> None:
            if self._error is None:
                self._error = exc.with_traceback(tb)
            c.failed = 1

        def cb(sig: str, fn: Callable[..., None]) -> Any:
            return ffi.callback(sig, fn, onerror=failed)

        def switch(node: int) -> HopCallbacks:
            s = sw[node]
            assert s is not None
            return s

        made = [
            (
                "receive",
                cb(
                    "void(int64_t, int64_t, const uint8_t *, int64_t)",
                    lambda n, port, data, size: switch(n).receive_python(
                        port, buffer(data, size)[:]
                    ),
                ),
            ),
            (
                "after_receive",
                cb(
                    "void(int64_t, int64_t, int64_t, uint64_t)",
                    lambda n, port, rc, p: switch(n).after_receive(port, rc, p),
                ),
            ),
            (
                "port_made",
                cb("void(int64_t, int64_t)", lambda n, port: switch(n).port_made(port)),
            ),
            ("service", cb("void(int64_t)", lambda n: switch(n).service_python())),
            ("schedule", cb("void(int64_t)", lambda n: switch(n).schedule_python())),
            (
                "transmit",
                cb(
                    "void(int64_t, int64_t, const uint8_t *, int64_t)",
                    lambda n, port, data, size: switch(n).transmit_python(
                        port, buffer(data, size)[:]
                    ),
                ),
            ),
            ("release", cb("void(int64_t, uint64_t)", lambda n, h: switch(n).release(h))),
            (
                "not_sent",
                cb(
                    "void(int64_t, int64_t, uint64_t)",
                    lambda n, k, p: switch(n).not_sent(k, p),
                ),
            ),
            ("foreign", cb("void(int64_t, int64_t)", lambda n, k: switch(n).foreign(k))),
        ]
        for name, fn in made:
            setattr(c, name, fn)
        return [fn for _, fn in made]  # kept alive with the loop
