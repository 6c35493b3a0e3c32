"""The twin's host with its per-packet loop in C (testbed/sim/host_native.c).

`NativeSimHost` is a `SimHost` (testbed/sim/nic.py, the reference) on the native event loop,
NIC and transport core whose kicks, timers and arriving frames run in C for a job that uses
only what the C does: one NIC, no PFC, no prober. Such a job's host runs no Python per packet
(the NIC's INT sink observes in the transport core's C; Python encodes and sends the reports it
decides): the C sends the feedback and the paced data packets, runs XDP's rate
law and the transport core on what arrives, and re-arms the NIC and the timer as
`SimHost._activity` does. It hands an event back to Python (`native_event`) where the job may
see something (a completion, a message, the job's wake-up time, a rate the law changed if the
job reads rates: then the job polls, as the reference's does after every event, the others
being no-ops by the jobs' contract, testbed/traffic/jobs.py) or where the run records (INT
frames, rate changes). Every other job runs SimHost's Python on the same state: the port's
and timer's fields are the C's, read and written through properties.

`SimFabric(host_pipeline="reference")` keeps the Python host over the same NICs and cores,
to bisect a difference; tests/test_native_twin.py holds the suites' records equal.
"""

from __future__ import annotations

import functools
import math
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controller.nic.ratelaw import CcParams, Law
from controller.wire import roce
from testbed.probes import RateEvent, record_int_frame
from testbed.sim.native_loop import NativeEventLoop
from testbed.sim.nic import FlowTx, NicPort, SimHost, flow_key
from testbed.sim.nic_native import NativeNic
from testbed.sim.nic_native import library as nic_library
from testbed.switch.native.build import BuildError, build_library, inline_headers
from testbed.traffic import transport_native
from testbed.traffic.jobs import Job
from testbed.traffic.transport_core import QueuePair, TransportCore
from testbed.traffic.transport_native import NativeTransportCore

SOURCE = Path(__file__).with_name("host_native.c")
HEADER = SOURCE.with_suffix(".h")

# what the C hands back (host_native.h's enum, checked when the library loads)
WHOLE, CAPTURE, RATE, TAKE, ACTIVITY, REPORT = 1, 2, 4, 8, 16, 32
NO_MEMORY, NOTHING_SENT = -1, -2


def _defines() -> str:
    """The constants the C uses: the transport core's, and the opcodes' bound."""
    return transport_native.defines() + f"#define OP_RC_DATA_MAX {roce.OP_RC_DATA_MAX}\n"


def cdef() -> str:
    return _defines() + transport_native.HEADER.read_text() + HEADER.read_text()


def source() -> str:
    """The C with both headers in place of their #includes, after the constants."""
    return _defines() + inline_headers(SOURCE, [transport_native.HEADER, HEADER])


@functools.lru_cache(maxsize=1)
def library() -> tuple[Any, Any]:
    """(ffi, lib), built once per process (and cached across them); BuildError if it cannot
    be built here."""
    if not SOURCE.is_file() or not HEADER.is_file():
        raise BuildError(f"{SOURCE.name} or {HEADER.name} is not beside {Path(__file__).name}")
    ffi, lib = build_library(source(), cdef(), "host")
    codes = (WHOLE, CAPTURE, RATE, TAKE, ACTIVITY, REPORT, NO_MEMORY, NOTHING_SENT)
    names = ("WHOLE", "CAPTURE", "RATE", "TAKE", "ACTIVITY", "REPORT", "NO_MEMORY", "NOTHING_SENT")
    got = tuple(getattr(lib, f"XM_HOST_{n}") for n in names)
    if got != codes:
        raise BuildError(f"{HEADER.name}'s codes are not host_native.py's: {got}")
    return ffi, lib


def _addr(ffi: Any, fn_lib: Any, name: str) -> int:
    return int(ffi.cast("uintptr_t", ffi.addressof(fn_lib, name)))


class CField:
    """An attribute kept in the host's C struct (the owner's `_h`, struct xm_host): `field`,
    read as `kind`; with `none_below_zero`, -1 in C is None (no time set)."""

    def __init__(self, field: str, kind: type = int, none_below_zero: bool = False) -> None:
        self.field, self.kind, self.none_below_zero = field, kind, none_below_zero

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        v = self.kind(getattr(obj._h, self.field))
        return None if self.none_below_zero and v < 0 else v

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj._h, self.field, -1 if value is None else value)


class NativeNicPort(NicPort):
    """NIC 0 of a NativeSimHost: its pacer fields are the C's (struct xm_host)."""

    busy_until = CField("busy_until")
    kick_at = CField("kick_at", none_below_zero=True)
    tx_bytes = CField("tx_bytes")

    def __init__(self, h: Any, addr: bytes, eth: bytes, send: Callable[[bytes, int], bool]):
        self._h = h
        super().__init__(addr, eth, send)


class NativeSimHost(SimHost):
    """A SimHost whose per-packet loop is C's for the jobs it can run; see the module's
    docstring. `wire`: the loop's index of its NIC's wire to the switch."""

    def __init__(
        self,
        loop: NativeEventLoop,
        name: str,
        ip: str,
        mac: str,
        gateway_mac: str,
        line_rate_bps: float,
        hop_speeds: dict[tuple[int, int], int],
        send: Callable[[bytes, int], bool],
        int_source: Any,
        links: dict[tuple[int, int], str],
        wire: int,
    ):
        ffi, lib = library()
        h = lib.xm_host_new()
        if h == ffi.NULL:
            raise MemoryError("the native host could not be allocated")
        self._ffi, self._lib = ffi, lib
        self._h = ffi.gc(h, lib.xm_host_free)
        self._cap: Any = None
        super().__init__(
            loop,
            name,
            ip,
            mac,
            gateway_mac,
            line_rate_bps,
            hop_speeds,
            send,
            int_source,
            links,
            "native",
        )
        port = self.ports[0]
        self.ports[0] = NativeNicPort(self._h, port.addr, port.eth, port.send)
        h = self._h
        ffi.memmove(h.addr, self.addr, 4)
        ffi.memmove(h.eth, self.eth, 14)
        h.line_rate_bps = self.line_rate_bps
        h.int_dscp = int_source.dscp
        h.wire = wire
        nic = self.nic
        assert isinstance(nic, NativeNic)
        tc, state, growth = nic.tc_entry()
        h.tc = ffi.cast(ffi.typeof(h.tc), tc)
        h.nic = ffi.cast("void *", state)
        h.growth = growth
        nffi, nlib = nic_library()
        h.xdp = ffi.cast(ffi.typeof(h.xdp), _addr(nffi, nlib, "xm_nic_host_rx"))
        state_addr, push, wire_send = loop.host_entry()
        h.loop = ffi.cast("void *", state_addr)
        h.push = ffi.cast(ffi.typeof(h.push), push)
        h.wire_send = ffi.cast(ffi.typeof(h.wire_send), wire_send)
        tffi, tlib = transport_native.library()
        for name_ in ("wants_to_send", "send_frame", "receive", "next_deadline", "expire"):
            field = f"tp_{name_}"
            fn = _addr(tffi, tlib, f"xm_tp_{name_}")
            setattr(h, field, ffi.cast(ffi.typeof(getattr(h, field)), fn))
        h.tp_ipv4_checksum = ffi.cast(
            ffi.typeof(h.tp_ipv4_checksum), _addr(tffi, tlib, "xm_tp_ipv4_checksum")
        )
        h.index = loop.add_host(
            self,
            int(ffi.cast("uintptr_t", h)),
            _addr(ffi, lib, "xm_host_rx"),
            _addr(ffi, lib, "xm_host_event"),
        )

    # ---- SimHost's fields that are the C's ----

    ns_per_byte = CField("ns_per_byte", float)
    _timer_at = CField("timer_at", none_below_zero=True)
    rx_dropped = CField("rx_dropped")
    tx_too_big = CField("tx_too_big")

    @property  # type: ignore[override]
    def capture(self) -> Any:
        return self._cap

    @capture.setter
    def capture(self, cap: Any) -> None:
        self._cap = cap
        self._h.capture = cap is not None

    @property  # type: ignore[override]
    def rate_events(self) -> list[RateEvent] | None:
        return self._rate_events

    @rate_events.setter
    def rate_events(self, events: list[RateEvent] | None) -> None:
        self._rate_events = events
        self._h.rate_events = events is not None

    @property  # type: ignore[override]
    def core(self) -> TransportCore | None:
        return self._core

    @core.setter
    def core(self, core: TransportCore | None) -> None:
        self._core = core
        if core is None:  # the job is over: the C forgets its core
            self._h.tp = self._ffi.NULL

    # ---- jobs ----

    def python_reason(self, core: TransportCore) -> str | None:
        """Why this job's host runs SimHost's Python (None: it runs in C)."""
        if not isinstance(core, NativeTransportCore):
            return "the reference transport core"
        if len(self.ports) > 1:
            return "more than one NIC"
        if self.pfc:
            return "PFC"
        if self.prober is not None:
            return "a prober"
        return None

    def start_job(self, core: TransportCore, job: Job, t0_ns: int) -> None:
        h = self._h
        h.active = 0
        self._lib.xm_host_reset(h)
        in_c = self.python_reason(core) is None
        h.active = in_c  # before the start rates: they go to its flows
        super().start_job(core, job, t0_ns)
        if in_c:
            assert isinstance(core, NativeTransportCore)
            h.tp = self._ffi.cast("struct xm_tp *", int(core._ffi.cast("uintptr_t", core._tp)))
            h.law = self.nic.params.law != Law.NONE
            h.done = 0
            h.job_wake = math.inf
            # a job that does not say reads the rates: polled after each change, as always
            h.rate_polls = getattr(job, "reads_nic_rates", True)
            h.reports = 0
            self._send_frame = None

    def _start_rate(self, qp: QueuePair, bps: int) -> None:
        if not self._h.active:
            super()._start_rate(qp, bps)
            return
        i = self._lib.xm_host_flow(self._h, qp.local_addr, qp.peer_addr, qp.sport, 1)
        if i < 0:
            raise MemoryError("the native host's flows")
        self._h.flows[i].rate_bps = bps
        self.nic.set_rate(flow_key(qp.local_addr, qp.peer_addr, qp.sport), bps)

    def _flow_of(self, qp: QueuePair) -> FlowTx | None:
        if not self._h.active:
            return super()._flow_of(qp)
        i = self._lib.xm_host_flow(self._h, qp.local_addr, qp.peer_addr, qp.sport, 0)
        return None if i < 0 else self._h.flows[i]  # its fields are FlowTx's

    def set_law(self, params: CcParams) -> None:
        super().set_law(params)
        h = self._h
        h.law = params.law != Law.NONE
        if h.active:
            for i in range(h.nflows):
                f = h.flows[i]
                f.rate_bps = 0
                self.nic.set_rate(flow_key(bytes(f.saddr), bytes(f.daddr), f.sport), 0)

    def _activity(self) -> None:
        h = self._h
        if not h.active:
            super()._activity()
            return
        core, job = self.core, self.job
        if core is None or job is None:
            return
        now = self.loop.now
        if not self.done and job.poll(now):
            self.done = True
            self.result = job.result(now)
            self.on_done()
        h.done = self.done
        h.job_wake = job.next_wake
        self._check(self._lib.xm_host_activity(h, self.loop.now_ns))

    def _request_kick(self, port: NicPort, t: int) -> None:
        if not self._h.active:
            super()._request_kick(port, t)
            return
        self._check(self._lib.xm_host_request_kick(self._h, t))

    def native_event(self, code: int, frame: bytes | None) -> None:
        """What the C left to Python of an event (the loop calls it): `code`'s bits."""
        self._check(code)
        if code & RATE and self.rate_events is not None:
            assert frame is not None
            ip = frame[14:]
            ihl = (ip[0] & 0x0F) * 4
            self.rate_events.append(
                RateEvent(
                    self.loop.now,
                    self.name,
                    (
                        socket.inet_ntoa(ip[16:20]),
                        socket.inet_ntoa(ip[12:16]),
                        int.from_bytes(ip[ihl : ihl + 2], "big"),
                    ),
                    int(self._h.rate_new),
                    "law",
                )
            )
        if code & CAPTURE and self.capture is not None:
            assert frame is not None
            record_int_frame(self.capture, frame, self.loop.now, self.links)
        core = self.core
        if code & TAKE:
            assert isinstance(core, NativeTransportCore)
            core._take()
            self._h.reports = len(core.reports)
        if code & ACTIVITY:
            self._activity()
        if code & REPORT:  # the kick's first step: a Telemetry Report from NIC 0
            assert core is not None
            port = self.ports[0]
            self._send_report(port, core.reports.popleft(), core.cfg.report_to, self.loop.now_ns)
            self._h.reports = len(core.reports)
            self._request_kick(port, port.busy_until)

    def _check(self, code: int) -> None:
        if code == NO_MEMORY:
            raise MemoryError(f"{self.name}: the native host ran out of memory")
        if code == NOTHING_SENT:
            raise RuntimeError(f"{self.name}: a queue pair the core named had no packet")


__all__ = ["NativeSimHost", "library"]
