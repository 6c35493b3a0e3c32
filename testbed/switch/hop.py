"""A V1Switch's common per-packet path in the hop loop's C (testbed/switch/native/hop.py),
Python's side: the loop's state, and what its C hands back to the switch (`SwitchHop`),
whose driver (the twin's SimSwitch, the emulation's Dataplane) adds its own part."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from testbed.switch.native.tm import NativeTrafficManager
from testbed.switch.v1model import CELL_BYTES, Stats, V1Switch


class HopLoop:
    """The C loop's state (xm_loop) for `switches` switches and `wires` wires, and its
    callbacks into each switch's `SwitchHop`: an exception in one is kept, the C stops after
    the event (or frame), and `raise_failed` raises it."""

    def __init__(self, ffi: Any, lib: Any, switches: int, wires: int = 0) -> None:
        self.ffi, self.lib = ffi, lib
        self._mem = ffi.new("xm_loop *")
        self._c = self._mem
        self._hops = ffi.new("xm_hop[]", max(1, switches))
        self._wires = ffi.new("xm_wire[]", max(1, wires))
        self._c.hops, self._c.nhops = self._hops, switches
        self._c.wires, self._c.nwires = self._wires, 0
        if lib.xm_loop_init(self._c):
            raise MemoryError("the native loop could not allocate its buffers")
        self._switches: list[SwitchHop | None] = [None] * switches
        self._error: BaseException | None = None
        self._callbacks = self._make_callbacks()

    def __del__(self) -> None:
        lib = getattr(self, "lib", None)
        if lib is not None:
            lib.xm_loop_free(self._c)

    @property
    def now_ns(self) -> int:
        return int(self._c.now)

    def raise_failed(self) -> None:
        """After the C stopped for a failed callback: raise what it raised."""
        c = self._c
        if not c.failed:
            return
        c.failed = 0
        err, self._error = self._error, None
        if err is None:
            raise MemoryError("the native loop ran out of memory")
        raise err

    def _hop(self, node: int, switch: SwitchHop) -> Any:
        self._switches[node] = switch
        h = self._hops[node]
        h.service_at = -1
        for p in range(len(h.wire)):
            h.wire[p] = -1
            h.fd[p] = -1
        return h

    def _make_callbacks(self) -> list[Any]:
        ffi, c, sw = self.ffi, self._c, self._switches
        buffer = ffi.buffer

        def failed(exc_type: Any, exc: BaseException, tb: Any) -> None:
            if self._error is None:
                self._error = exc.with_traceback(tb)
            c.failed = 1

        def cb(sig: str, fn: Callable[..., None]) -> Any:
            return ffi.callback(sig, fn, onerror=failed)

        def switch(node: int) -> SwitchHop:
            s = sw[node]
            assert s is not None
            return s

        frame_sig = "void(int64_t, int64_t, const uint8_t *, int64_t)"
        made = [
            (
                "receive",
                cb(frame_sig, lambda n, port, d, size: switch(n).receive(port, buffer(d, size)[:])),
            ),
            (
                "after_receive",
                cb(
                    "void(int64_t, int64_t, int64_t, uint64_t)",
                    lambda n, port, rc, p: switch(n).after_receive(port, rc, p),
                ),
            ),
            ("port_made", cb("void(int64_t, int64_t)", lambda n, p: switch(n).port_made(p))),
            ("service", cb("void(int64_t)", lambda n: switch(n).service())),
            ("schedule", cb("void(int64_t)", lambda n: switch(n).schedule())),
            (
                "transmit",
                cb(
                    frame_sig, lambda n, port, d, size: switch(n).transmit(port, buffer(d, size)[:])
                ),
            ),
            ("pfc", cb("void(int64_t, int64_t)", lambda n, tick: switch(n).pfc(tick))),
            ("release", cb("void(int64_t, uint64_t)", lambda n, h: switch(n).release(h))),
            ("not_sent", cb("void(int64_t, int64_t)", lambda n, k: switch(n).not_sent(k))),
            ("foreign", cb("void(int64_t, int64_t)", lambda n, k: switch(n).foreign(k))),
        ]
        for name, fn in made:
            setattr(c, name, fn)
        return [fn for _, fn in made]  # kept alive with the loop


def native_path(sw: V1Switch) -> bool:
    """Whether a switch's per-packet path can run in a hop's C now: the native pipeline with
    its common path, the native traffic manager, no packet of a program loaded before
    queued."""
    c, tm = sw.compiled, sw.tm
    return (
        c is not None
        and c.native is not None
        and bool(c.native.arch)
        and isinstance(tm, NativeTrafficManager)
        and not sw._foreign_queued
    )


class HopStats(Stats):
    """V1Switch's counters with the frames in and out its hop's, and the drops the hop
    handled alone, of a full queue or a corrupted frame (the C counts them)."""

    def __init__(self, hop: Any, old: Stats) -> None:  # noqa: D107
        self._hop = hop
        self._dropped: dict[str, int] = {}
        super().__init__(old.rx, old.tx, old.dropped)

    @property  # type: ignore[override]
    def dropped(self) -> dict[str, int]:
        out = dict(self._dropped)
        for reason in ("queue_full", "rx_error"):
            n = int(getattr(self._hop, reason))
            if n:
                out[reason] = out.get(reason, 0) + n
        return out

    @dropped.setter
    def dropped(self, value: dict[str, int]) -> None:
        self._dropped = dict(value)

    def drop(self, reason: str) -> None:
        self._dropped[reason] = self._dropped.get(reason, 0) + 1

    rx = property(  # type: ignore[assignment]
        lambda self: int(self._hop.rx), lambda self, v: setattr(self._hop, "rx", v)
    )
    tx = property(  # type: ignore[assignment]
        lambda self: int(self._hop.tx), lambda self, v: setattr(self._hop, "tx", v)
    )


class SwitchHop:
    """A V1Switch's common per-packet path in a HopLoop's C (node `node`), and what the C
    hands back: the switch's own part here, its driver's (the twin's SimSwitch, the
    emulation's Dataplane) in a subclass: `receive`, `service`, `schedule`, `transmit`."""

    def __init__(self, loop: HopLoop, node: int, sw: V1Switch) -> None:
        assert native_path(sw)
        c, S, tm = sw.compiled, sw.std, sw.tm
        assert c is not None and S is not None and isinstance(tm, NativeTrafficManager)
        rt = c.native
        self.loop, self.node, self.sw = loop, node, sw
        h = self.hop = loop._hop(node, self)
        self.rt = rt  # kept: the hop's C uses its state
        h.state = int(rt.ffi.cast("uintptr_t", rt.state))
        h.drop_port = sw.drop_port
        h.unit = sw._unit
        h.cell = CELL_BYTES
        h.port_mask = S.m_ingress_port
        sw.stats = HopStats(h, sw.stats)
        rt.dirty_flag = rt.ffi.addressof(h, "dirty")
        rt.dirty = rt.dirty
        h.tm = tm.address  # the switch keeps its traffic manager for its life
        for p in range(len(h.known)):
            h.known[p] = int(p in tm.ports)
        tm.adopt = lambda block: rt.adopt(block)[0]
        self.refresh()  # the driver has the switch tell it of changes (V1Switch.on_change)

    def refresh(self) -> None:
        """Tell the hop whether the per-packet path may run in C now: the switch's path is
        native and its program still the one this hop was made for."""
        c = self.sw.compiled
        self.hop.fast = int(native_path(self.sw) and c is not None and c.native is self.rt)

    # the switch's part of what the C hands back

    def after_receive(self, port: int, rc: int, packet: int) -> None:
        self.sw.hop_not_queued(port, rc, packet, self.loop.now_ns)

    def port_made(self, port: int) -> None:
        self.sw.tm.port(port)
        self.hop.known[port] = 1

    def pfc(self, tick: int) -> None:
        self.sw.hop_pfc(bool(tick), self.loop.now_ns)

    def release(self, handle: int) -> None:
        cast_tm(self.sw).packets.pop(handle)

    def not_sent(self, k: int) -> None:
        r = self.loop._c.res[k]
        self.sw.hop_not_sent(self._departure(k), int(r.rc), int(r.booked))

    def foreign(self, k: int) -> None:
        self.sw.hop_foreign(self._departure(k))

    def _departure(self, k: int) -> Any:
        """The hop's departure k (an xm_tm_departure, read through the traffic manager's
        cffi: the hop's C holds it as an address)."""
        tm = cast_tm(self.sw)
        address = int(self.loop.ffi.cast("uintptr_t", self.hop.deps))
        return tm.ffi.cast("xm_tm_departure *", address)[k]

    # the driver's

    def receive(self, port: int, frame: bytes) -> None:
        raise NotImplementedError

    def service(self) -> None:
        raise NotImplementedError

    def schedule(self) -> None:
        raise NotImplementedError

    def transmit(self, port: int, frame: bytes) -> None:
        raise NotImplementedError


def cast_tm(sw: V1Switch) -> NativeTrafficManager:
    tm = sw.tm
    assert isinstance(tm, NativeTrafficManager)
    return tm
