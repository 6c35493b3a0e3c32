"""The v1model architecture as bmv2's simple_switch runs it.

Parser -> verify checksum -> ingress -> (clone, digest, resubmit, multicast, drop, unicast) ->
traffic manager -> egress -> (clone, drop) -> compute checksum -> deparser -> (recirculate or
transmit), following `docs/simple_switch.md`'s after-ingress and after-egress pseudocode and
`targets/simple_switch/simple_switch.cpp`.

`V1Switch` is driven from outside: `receive()` hands it a packet from a port, `service()`
moves packets whose time has come out of the traffic manager through egress to `transmit`.
A real-time driver (`dataplane.py`) calls these from its loop; the STF runner and unit tests
call them directly with a virtual clock.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from controller.wire.pfc import decode_pfc, is_mac_control
from testbed.switch.codegen import DROP_PORT, Compiled
from testbed.switch.compiler import compile_program
from testbed.switch.drop_reports import DROP_REASONS, DropReporter
from testbed.switch.native import DEFAULT_PIPELINE, PIPELINES
from testbed.switch.native.build import BuildError
from testbed.switch.native.cgen import (
    ARCH_DEPARSE_ERROR,
    ARCH_DROP,
    ARCH_ENQUEUE_PYTHON,
    ARCH_NO_MEMORY,
    ARCH_PYTHON,
    ARCH_QUEUE_FULL,
    Unsupported,
)
from testbed.switch.native.lock import NativeLock
from testbed.switch.native.runtime import load_native
from testbed.switch.native.tm import NativeTrafficManager
from testbed.switch.packet import (
    CLOCK_NS,
    PKT_INSTANCE_TYPE_EGRESS_CLONE,
    PKT_INSTANCE_TYPE_INGRESS_CLONE,
    PKT_INSTANCE_TYPE_NORMAL,
    PKT_INSTANCE_TYPE_RECIRC,
    PKT_INSTANCE_TYPE_REPLICATION,
    PKT_INSTANCE_TYPE_RESUBMIT,
    STD_FIELDS,
    Packet,
    PipelineAbort,
)
from testbed.switch.pfc import PfcConfig, WatchdogConfig
from testbed.switch.program import LoadError, Program
from testbed.switch.traffic_manager import Clock, TrafficManager

log = logging.getLogger("xingmai.switch")

# A packet may be resubmitted / recirculated this many times in a row before it is dropped
# (bmv2 has no limit and would loop forever on a program that always recirculates).
MAX_REINJECT = 32


# What enq_qdepth / deq_qdepth count: packets (bmv2), bytes, or cells of CELL_BYTES (a
# switch ASIC's buffer unit, Tofino's 80 B): 19 bits of bytes read at most 512 KiB, of
# cells 40 MiB, deep enough for a shared buffer's queue. A packet's depth in cells is the
# queue's bytes rounded up to whole cells.
QDEPTH_UNITS = ("packets", "bytes", "cells")
CELL_BYTES = 80

TransmitFn = Callable[[int, bytes], None]
DigestFn = Callable[[int, str, tuple[int, ...]], None]


@functools.lru_cache(maxsize=4)
def parsed_config(raw: bytes) -> tuple[bytes, Any]:
    """A device config's bytes and its JSON, parsed once per process: the switches of a
    fabric share them (1.9 MB and 4.6 MB of objects for the project's program, per switch
    before). Nothing loading or running a program writes into its JSON (a test checks)."""
    return raw, json.loads(raw)


@dataclass
class CloneSession:
    port: int | None = None
    mgid: int | None = None
    truncate: int = 0  # bytes kept; 0: whole packet
    cos: int = 0


@dataclass
class Stats:
    rx: int = 0
    tx: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


_REQUIRED = ("ingress_port", "egress_spec", "egress_port", "instance_type", "packet_length")


class StdMeta:
    """Where v1model's standard_metadata lives in the header vector: field `x` of a packet is
    `p.h[std.h][std.x]`. Fields the program does not declare (some P4_14-era JSONs lack the
    queueing ones) get hidden slots, so the architecture code needs no per-field checks."""

    def __init__(self, prog: Program):
        inst = prog.header_by_name.get("standard_metadata")
        if inst is None:
            raise LoadError("the program has no standard_metadata header")
        for alias, (hdr, _fname) in prog.field_aliases.items():
            if alias.split(".", 1)[1] in STD_FIELDS and hdr != "standard_metadata":
                raise LoadError(f"field alias {alias} -> {hdr} is not supported")
        for name in _REQUIRED:
            if name not in inst.htype.field_index:
                raise LoadError(f"the program lacks standard_metadata.{name}")
        self.h = inst.index
        for name, width in STD_FIELDS.items():
            if name not in inst.htype.field_index:
                inst.htype.fields.append((name, width, False))
                inst.htype.field_index[name] = len(inst.htype.fields) - 1
            idx = inst.htype.field_index[name]
            setattr(self, name, idx)  # field index ...
            setattr(self, "m_" + name, (1 << inst.htype.fields[idx][1]) - 1)  # ... and its mask

    # field indexes and masks, set in __init__ (declared for type checkers)
    ingress_port: int
    egress_spec: int
    egress_port: int
    instance_type: int
    packet_length: int
    enq_timestamp: int
    enq_qdepth: int
    deq_timedelta: int
    deq_qdepth: int
    ingress_global_timestamp: int
    egress_global_timestamp: int
    mcast_grp: int
    egress_rid: int
    checksum_error: int
    parser_error: int
    priority: int
    qid: int
    m_ingress_port: int
    m_egress_spec: int
    m_egress_port: int
    m_instance_type: int
    m_packet_length: int
    m_enq_timestamp: int
    m_enq_qdepth: int
    m_deq_timedelta: int
    m_deq_qdepth: int
    m_ingress_global_timestamp: int
    m_egress_global_timestamp: int
    m_mcast_grp: int
    m_egress_rid: int
    m_checksum_error: int
    m_parser_error: int
    m_priority: int
    m_qid: int


class V1Switch:
    """One simple_switch instance: a loaded program, its PRE and its traffic manager."""

    def __init__(
        self,
        clock: Clock | None = None,
        device_id: int = 0,
        cpu_port: int | None = None,
        drop_port: int = DROP_PORT,
        nb_queues: int = 1,
        qdepth_unit: str = "packets",
        pipeline: str = DEFAULT_PIPELINE,
    ):
        if pipeline not in PIPELINES:
            raise ValueError(f"pipeline must be one of {PIPELINES}, got {pipeline!r}")
        self.clock = clock or Clock()
        # which pipeline runs the program: the Python reference, or the native one (C generated
        # from the same program, testbed/switch/native/) where it builds; `pipeline_in_use`
        # says which one a load got, and `native_reason` why not native when it was asked for
        self.pipeline = pipeline
        self.pipeline_in_use = "reference"
        self.native_reason = ""
        self.device_id = device_id
        self.cpu_port = cpu_port
        self.drop_port = drop_port
        if qdepth_unit not in QDEPTH_UNITS:
            raise ValueError(f"queue depth unit {qdepth_unit!r}: one of {', '.join(QDEPTH_UNITS)}")
        self.qdepth_unit = qdepth_unit  # what enq_qdepth / deq_qdepth count
        self.tm = self._traffic_manager(nb_queues)
        # PFC frames leave a port ahead of its queues (the MAC sends them), from the port's MAC
        self.tm.send_control = lambda port, frame: self._send_control(port, frame)
        self.tm.port_mac = self.port_mac
        self.pfc_frames_sent = 0
        # held while a packet runs or the control plane writes (the switch process's data plane
        # makes it a C mutex its packet loop in C takes: testbed/switch/native/lock.py)
        self.lock: threading.RLock | NativeLock = threading.RLock()
        self.compiled: Compiled | None = None
        self.json_bytes: bytes = b""
        self.std: StdMeta | None = None
        self.clone_sessions: dict[int, CloneSession] = {}
        self.mcast_groups: dict[int, list[tuple[int, int]]] = {}  # mgid -> [(port, rid)]
        self.stats = Stats()
        self.transmit: TransmitFn = lambda port, data: None
        # the time the frame being transmitted started to leave its port (None: a frame the
        # switch makes, sent at once): for a driver whose wire takes it from then (the
        # emulation's delay lines), however late its loop ran the departure
        self.departed_ns: int | None = None
        self.drop_reports = DropReporter(self)  # the traffic manager's drops, reported
        self.on_digest: DigestFn = lambda list_id, name, values: None
        self.log_fn: Callable[[str], None] = lambda msg: log.info("log_msg: %s", msg)
        self._uid = 0
        self._foreign_queued = False
        # told when what decides where the per-packet path runs changes (a program loaded,
        # packets of the previous one gone): a native loop's switch hop (testbed/sim)
        self.on_change: Callable[[], None] = lambda: None
        self._unit = QDEPTH_UNITS.index(qdepth_unit)
        self._meta: list[int] = []
        self._zeros: list[list[int]] = []

    def _traffic_manager(self, nb_queues: int) -> TrafficManager:
        """The reference traffic manager, or on the native pipeline the native one (the same
        class, its state and per-packet path in C: testbed/switch/native/tm.py) where it
        builds."""
        if self.pipeline == "native":
            try:
                return NativeTrafficManager(self.clock, nb_queues)
            except (BuildError, ValueError) as exc:
                log.warning("native traffic manager unavailable (%s): running the reference", exc)
        return TrafficManager(self.clock, nb_queues)

    # ---- program ----------------------------------------------------------------------------

    def load(self, json_doc: bytes | str | dict[str, Any]) -> None:
        """Load (or replace) the program; raises LoadError and keeps the old one on failure."""
        if isinstance(json_doc, dict):
            doc, raw = json_doc, json.dumps(json_doc).encode()
        else:
            raw = json_doc.encode() if isinstance(json_doc, str) else bytes(json_doc)
            try:
                raw, doc = parsed_config(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise LoadError(f"the device config is not valid JSON: {exc}") from exc
        prog = Program(doc)
        std = StdMeta(prog)  # before compiling: it may add hidden fields
        compiled, in_use, reason = self._compile(prog)
        with self.lock:
            self.pipeline_in_use, self.native_reason = in_use, reason
            self.compiled = compiled
            # packets queued by the program loaded before are not this native pipeline's:
            # they depart through v1model.py until the queues have emptied
            self._foreign_queued = isinstance(self.tm, NativeTrafficManager) and bool(
                self.tm._c.queued
            )
            self.json_bytes = raw
            self.std = std
            self._meta = [h.index for h in prog.headers if h.metadata]
            self._zeros = [[0] * len(h.htype.fields) for h in prog.headers]
            # a new pipeline starts with empty replication state, as bmv2 does on a swap
            self.clone_sessions.clear()
            self.mcast_groups.clear()
        self.on_change()
        log.info(
            "loaded program: %d tables, %d actions, %s pipeline",
            len(compiled.tables),
            len(compiled.actions),
            self.pipeline_in_use,
        )

    def _compile(self, prog: Program) -> tuple[Compiled, str, str]:
        """The program compiled for the chosen pipeline: (compiled, pipeline, why not native)."""
        log_fn: Callable[[str], None] = lambda m: self.log_fn(m)  # noqa: E731
        if self.pipeline == "native":
            try:
                return load_native(prog, self.clock.now_us, log_fn), "native", ""
            except (Unsupported, BuildError, LoadError) as exc:
                reason = str(exc)
                log.warning("native pipeline unavailable (%s): running the reference", reason)
                return compile_program(prog, self.clock.now_us, log_fn), "reference", reason
        return compile_program(prog, self.clock.now_us, log_fn), "reference", ""

    @property
    def ready(self) -> bool:
        return self.compiled is not None

    # ---- ingress --------------------------------------------------------------------------

    def receive(self, port: int, data: bytes, t_ns: int | None = None) -> None:
        """A packet arrives on `port` (at switch time `t_ns`, by default now): run ingress and
        hand the result to the traffic manager. A driver that reads packets late (a busy
        process) passes their kernel arrival times, so queues and timestamps follow the
        arrivals rather than the process's scheduling."""
        with self.lock:
            self.stats.rx += 1
            c, S = self.compiled, self.std
            if c is None or S is None:
                self.stats.drop("no_pipeline")
                return
            if port in self.tm.rx_faults:
                if self.tm.port_down(port):  # a link down delivers nothing
                    self.stats.drop("port_down")
                    return
                if self.tm.corrupted(port):  # a lossy link: the MAC drops a bad frame
                    self.stats.drop("rx_error")
                    return
            if is_mac_control(data):  # the MAC consumes it: PFC pauses, never forwarded
                self._mac_control(port, data)
                return
            if c.native is not None:
                self._receive_native(c, S, port, data, t_ns)
                return
            p = self._new(c, len(data))
            now = self.clock.now_ns()
            p.t_ns = now if t_ns is None or t_ns > now else t_ns
            sm = p.h[S.h]
            sm[S.ingress_port] = port & S.m_ingress_port
            sm[S.packet_length] = len(data)
            sm[S.instance_type] = PKT_INSTANCE_TYPE_NORMAL
            sm[S.ingress_global_timestamp] = (p.t_ns // CLOCK_NS) & S.m_ingress_global_timestamp
            self._run_ingress(c, S, p, bytes(data), port)

    def _receive_native(
        self, c: Compiled, S: StdMeta, port: int, data: bytes, t_ns: int | None
    ) -> None:
        """What `receive` and `_run_ingress` do, with the native pipeline's common path in C
        (one call: standard metadata, parser, checksums, ingress, the egress decision); a
        rare case goes on in `_after_ingress` as on the reference."""
        rt = c.native
        p = rt.blank_packet()
        self._uid += 1
        p.uid = self._uid
        now = self.clock.now_ns()
        p.t_ns = now if t_ns is None or t_ns > now else t_ns
        buf = bytes(data)
        tm = self.tm
        if isinstance(tm, NativeTrafficManager) and not self._foreign_queued:
            # one call: ingress and the traffic manager's enqueue, in C
            h = tm._register(p)
            rc = rt.receive_enqueue(
                p,
                buf,
                port & S.m_ingress_port,
                p.t_ns,
                self.drop_port,
                tm.address,
                h,
                self._unit,
                CELL_BYTES,
            )
            tm.send_pauses()  # what PFC decided on the way in
            if rc >= 0:  # queued for port rc
                if rc not in tm.ports:
                    tm.port(rc)
                return
            del tm.packets[h]
        else:
            rc = rt.receive(p, buf, port & S.m_ingress_port, p.t_ns // CLOCK_NS, self.drop_port)
            if rc == 0:
                self._enqueue(S, p.h[S.h][S.egress_spec], p)
                return
        self._not_queued(c, S, p, buf, port, rc)

    def _not_queued(
        self, c: Compiled, S: StdMeta, p: Packet, buf: bytes, port: int, rc: int
    ) -> None:
        """A packet after a native ingress that did not queue it (`rc` < 0): a full queue,
        a rare case going on in `_after_ingress` or `_enqueue`, a drop, or an abort raised as
        the reference's."""
        tm = self.tm
        if rc == ARCH_QUEUE_FULL:
            eport = p.h[S.h][S.egress_spec]
            if eport not in tm.ports:
                tm.port(eport)
            tm.last_drop = "queue_full"
            self._enqueue_failed(S, eport, p)
        elif rc == ARCH_ENQUEUE_PYTHON:
            self._enqueue(S, p.h[S.h][S.egress_spec], p)
        elif rc == ARCH_NO_MEMORY:
            raise MemoryError("the native traffic manager could not grow a queue")
        elif rc == ARCH_PYTHON:
            self._after_ingress(c, S, p, buf, port)
        elif rc == ARCH_DROP:
            self.stats.drop("ingress_drop")
        else:
            self._guarded("ingress", lambda: cast(Any, c.native).raise_abort("ingress"))

    def set_pfc(self, pfc: PfcConfig | None, watchdog: WatchdogConfig | None = None) -> None:
        """PFC on with these thresholds (and the watchdog) or off."""
        with self.lock:
            self.tm.set_pfc(pfc, watchdog)

    # ---- what a native loop's switch hop leaves here (testbed/switch/native/hop.py) -------

    def hop_not_queued(self, port: int, rc: int, packet: int, t_ns: int) -> None:
        """A packet the hop's C ran ingress on and did not queue (`rc`): `_not_queued`, the
        C packet (`packet`, its address) ours from now on."""
        c, S = self.compiled, self.std
        assert c is not None and S is not None and c.native is not None
        p, buf = c.native.adopt(packet)
        self._uid += 1
        p.uid = self._uid
        p.t_ns = t_ns
        self._not_queued(c, S, p, buf, port, rc)

    def hop_not_sent(self, d: Any, rc: int, booked: int) -> None:
        """A departure `d` whose egress the hop's C ran and sent nothing of (`rc`): its
        packet ours from now on."""
        c, S = self.compiled, self.std
        assert c is not None and S is not None
        p = cast(NativeTrafficManager, self.tm).take(d)
        p.t_ns = d.start
        self._egress_not_sent(c, S, d.port, p, rc, booked)

    def hop_pfc(self, tick: bool, now_ns: int) -> None:
        """The hop's C decided pauses (sent here), or (`tick`) one of PFC's timers is due."""
        tm = cast(NativeTrafficManager, self.tm)
        if tick:
            tm.pfc_tick(now_ns)
        tm.send_pauses()

    def hop_foreign(self, d: Any) -> None:
        """A departure `d` that is not the native pipeline's packet: the reference's egress."""
        c, S = self.compiled, self.std
        assert c is not None and S is not None
        p = cast(NativeTrafficManager, self.tm).take(d)
        p.t_ns = d.start
        self._run_egress(c, S, d.port, d.prio, p, d.enq_ns, d.left)

    def _mac_control(self, port: int, data: bytes) -> None:
        try:
            pause = decode_pfc(data)
        except ValueError:
            self.stats.drop("mac_control_unknown")
            return
        now = self.clock.now_ns()
        if not self.tm.receive_pause(port, pause, now):
            self.stats.drop("pfc_off")  # PFC is off on this switch: the pause is not honoured

    def drop_counts(self) -> dict[str, int]:
        """Every packet this switch dropped, by reason: the pipeline's and the ports' (see
        `stats.dropped`) and the traffic manager's (a full queue, a queue flushed when its
        port went down, the PFC watchdog)."""
        with self.lock:
            out = dict(self.stats.dropped)
            ports = self.tm.ports.values()
            for reason, n in (
                ("queue_full", sum(pq.dropped for pq in ports)),
                ("flushed_port_down", sum(pq.fault_drops for pq in ports)),
                ("pfc_watchdog", sum(pq.pfc.watchdog_drops for pq in ports)),
            ):
                if n:
                    out[reason] = n
            return out

    def port_mac(self, port: int) -> bytes:
        """The MAC address a port's MAC Control frames come from (locally administered, from
        the device id and the port)."""
        return (
            bytes([0x02, 0x58])
            + (self.device_id & 0xFFFF).to_bytes(2, "big")
            + (port & 0xFFFF).to_bytes(2, "big")
        )

    def _send_control(self, port: int, frame: bytes) -> None:
        self.pfc_frames_sent += 1
        self.departed_ns = None
        self.transmit(port, frame)

    def _new(self, c: Compiled, length: int) -> Packet:
        p = c.new_packet()
        p.ingress_len = length
        p.plen = length
        self._uid += 1
        p.uid = self._uid
        return p

    def _reset_metadata(self, p: Packet) -> None:
        for i in self._meta:
            z = self._zeros[i]
            p.h[i][0 : len(z)] = z  # bounds given: a native packet's header is a C pointer

    def _copy_field_list(self, c: Compiled, dst: Packet, src: Packet, fl_id: int) -> None:
        for hidx, fidx in c.program.field_lists.get(fl_id, []):
            if fidx >= 0:
                dst.h[hidx][fidx] = src.h[hidx][fidx]

    def _guarded(self, stage: str, fn: Callable[[], None]) -> bool:
        """Run a pipeline stage; a failure drops (and counts) the packet, never the switch."""
        try:
            fn()
            return True
        except PipelineAbort as exc:
            log.warning("%s aborted, packet dropped: %s", stage, exc)
            self.stats.drop(f"{stage}_abort")
        except (IndexError, KeyError, TypeError, ValueError) as exc:
            log.error("%s error, packet dropped: %r", stage, exc)
            self.stats.drop(f"{stage}_error")
        return False

    def _run_ingress(self, c: Compiled, S: StdMeta, p: Packet, buf: bytes, port: int) -> None:
        def stage() -> None:
            err = c.parse(p, buf)
            sm = p.h[S.h]
            sm[S.parser_error] = err
            sm[S.checksum_error] = 1 if c.verify_checksums(p) else 0
            c.ingress(p)

        if not self._guarded("ingress", stage):
            return
        self._after_ingress(c, S, p, buf, port)

    def _after_ingress(self, c: Compiled, S: StdMeta, p: Packet, buf: bytes, port: int) -> None:
        """After the ingress pipeline: clone, digest, resubmit, multicast, drop or unicast."""
        p.exit = False
        sm = p.h[S.h]
        egress_spec = sm[S.egress_spec]
        mgid = sm[S.mcast_grp]

        if p.clone_session >= 0:  # ingress-to-egress clone of the packet as it arrived
            session = self.clone_sessions.get(p.clone_session)
            fl = p.clone_field_list
            p.clone_session, p.clone_field_list = -1, 0
            if session is not None:
                cp = self._new(c, p.ingress_len)
                cp.t_ns = p.t_ns
                cp.h[S.h][S.ingress_port] = port
                c.parse(cp, buf)
                c.verify_checksums(cp)
                self._reset_metadata(cp)
                self._copy_field_list(c, cp, p, fl)
                cp.h[S.h][S.instance_type] = PKT_INSTANCE_TYPE_INGRESS_CLONE
                self._clone_out(c, S, cp, session)

        if p.learn_id > 0:
            self._digest(c, p)

        if p.resubmit_fl:
            if p.reinjects >= MAX_REINJECT:
                self.stats.drop("resubmit_loop")
                return
            rp = self._new(c, p.ingress_len)
            rp.reinjects = p.reinjects + 1
            rp.t_ns = p.t_ns
            self._copy_field_list(c, rp, p, p.resubmit_fl)
            rp.h[S.h][S.instance_type] = PKT_INSTANCE_TYPE_RESUBMIT
            rp.h[S.h][S.packet_length] = p.ingress_len
            self._run_ingress(c, S, rp, buf, port)
            return
        if mgid != 0:
            sm[S.instance_type] = PKT_INSTANCE_TYPE_REPLICATION
            self._multicast(c, S, p, mgid)
            return
        if egress_spec == self.drop_port:
            self.stats.drop("ingress_drop")
            return
        sm[S.instance_type] = PKT_INSTANCE_TYPE_NORMAL
        self._enqueue(S, egress_spec, p)

    def _digest(self, c: Compiled, p: Packet) -> None:
        entry = c.program.learn_lists.get(p.learn_id)
        if entry is None:
            return
        name, refs = entry
        values = tuple(p.h[hidx][fidx] if fidx >= 0 else int(p.v[hidx]) for hidx, fidx in refs)
        self.on_digest(p.learn_id, name, values)

    def _clone_out(self, c: Compiled, S: StdMeta, cp: Packet, session: CloneSession) -> None:
        if session.truncate:
            cp.truncate_len = session.truncate
        if session.mgid:
            self._multicast(c, S, cp, session.mgid)
        if session.port is not None:
            self._enqueue(S, session.port, cp)

    def _multicast(self, c: Compiled, S: StdMeta, p: Packet, mgid: int) -> None:
        replicas = self.mcast_groups.get(mgid)
        if not replicas:
            self.stats.drop("mcast_empty_group")
            return
        for port, rid in replicas:
            p.h[S.h][S.egress_rid] = rid & S.m_egress_rid
            cp = p.copy()
            cp.clear_registers()
            cp.truncate_len = p.truncate_len
            self._enqueue(S, port, cp)

    def _enqueue(self, S: StdMeta, port: int, p: Packet) -> None:
        sm = p.h[S.h]
        prio = sm[S.priority]
        if prio >= self.tm.nb_queues:
            self.stats.drop("bad_priority")
            return
        if self.tm.port_down(port):
            self.stats.drop("port_down")
            self.tm.ports[port].fault_drops += 1
            self._report_drop(S, port, p, "port_down")
            return
        now = p.t_ns
        itype = sm[S.instance_type]
        # PFC counts what came in from a port (not clones or recirculations) against it
        in_port = (
            sm[S.ingress_port]
            if itype in (PKT_INSTANCE_TYPE_NORMAL, PKT_INSTANCE_TYPE_REPLICATION)
            else -1
        )
        found = self.tm.enqueue(port, prio, p, p.plen, now, in_port)
        if found is None:
            self._enqueue_failed(S, port, p)
            return
        sm[S.enq_timestamp] = (now // CLOCK_NS) & S.m_enq_timestamp
        unit = self.qdepth_unit
        depth = (
            found[0]
            if unit == "packets"
            else found[1]
            if unit == "bytes"
            else -(-found[1] // CELL_BYTES)
        )
        # in bytes a shared buffer's queue may pass what 19 bits hold: the program sees the
        # largest value it can (saturated, not wrapped to a small depth)
        sm[S.enq_qdepth] = depth if depth < S.m_enq_qdepth else S.m_enq_qdepth

    def _enqueue_failed(self, S: StdMeta, port: int, p: Packet) -> None:
        """The traffic manager refused the packet (`last_drop` says why)."""
        self.stats.drop(self.tm.last_drop)
        if self.tm.last_drop in DROP_REASONS:
            self._report_drop(S, port, p, self.tm.last_drop)

    def _report_drop(self, S: StdMeta, port: int, p: Packet, why: str) -> None:
        c = self.compiled
        if c is None or self.tm.report_held(port, DROP_REASONS[why], p.t_ns):
            return
        try:
            frame = c.deparse(p)
        except (PipelineAbort, IndexError, KeyError, TypeError, ValueError):
            return  # not a packet the deparser can write: counted as dropped, not reported
        sm = p.h[S.h]
        self.drop_reports.dropped(
            sm[S.ingress_port],
            port,
            DROP_REASONS[why],
            frame,
            self.tm.ports[port].qbytes[sm[S.priority]],
            p.t_ns,
        )

    # ---- egress ---------------------------------------------------------------------------

    def service(self, until_ns: int | None = None) -> int:
        """Run egress for every queued packet whose port is free by `until_ns` (default now),
        each at its own departure time; returns how many."""
        done = 0
        while True:
            with self.lock:
                c, S = self.compiled, self.std
                limit = self.clock.now_ns()
                if until_ns is not None and until_ns < limit:
                    limit = until_ns
                self.tm.pfc_tick(limit)
                tm = self.tm
                if self._foreign_queued and not cast(NativeTrafficManager, tm).ports_busy():
                    self._foreign_queued = False
                    self.on_change()
                if (
                    c is not None
                    and S is not None
                    and c.native is not None
                    and isinstance(tm, NativeTrafficManager)
                    and not self._foreign_queued
                ):
                    registered = tm._handle
                    n = self._service_native(c, S, tm, limit)
                    done += n
                    # The next round would find nothing: the C dequeue ran until no port had
                    # a packet due by `limit`, so only a packet queued during this round (a
                    # clone, a recirculation: a new handle) or, on a real clock, time passing
                    # can make one due.
                    again = tm._handle != registered or not self.clock.virtual
                    if not n or not tm.ports_busy() or not again:
                        return done
                    continue
                ready = self.tm.dequeue_ready(limit)
                if not ready:
                    return done
                for port, prio, p, enq_ns, left, start in ready:
                    done += 1
                    p.t_ns = start
                    if c is None or S is None:
                        continue
                    if c.native is not None:
                        self._depart_native(c, S, port, prio, p, enq_ns, left)
                    else:
                        self._run_egress(c, S, port, prio, p, enq_ns, left)

    def _run_egress(
        self, c: Compiled, S: StdMeta, port: int, prio: int, p: Packet, enq_ns: int, left: int
    ) -> None:
        now = p.t_ns // CLOCK_NS
        booked = p.plen  # what the traffic manager booked the port's time for
        sm = p.h[S.h]
        sm[S.egress_global_timestamp] = now & S.m_egress_global_timestamp
        sm[S.deq_timedelta] = (now - enq_ns // CLOCK_NS) & S.m_deq_timedelta
        if self.qdepth_unit != "packets":
            left = self.tm.ports[port].qbytes[prio]
            if self.qdepth_unit == "cells":
                left = -(-left // CELL_BYTES)
        sm[S.deq_qdepth] = left if left < S.m_deq_qdepth else S.m_deq_qdepth  # saturated
        sm[S.qid] = prio
        sm[S.egress_port] = port & S.m_egress_port
        sm[S.egress_spec] = (self.drop_port + 1) & S.m_egress_spec
        sm[S.packet_length] = p.plen & S.m_packet_length
        if not self._guarded("egress", lambda: c.egress(p)):
            return
        self._after_egress(c, S, port, p, booked)

    def _service_native(self, c: Compiled, S: StdMeta, tm: NativeTrafficManager, limit: int) -> int:
        """One round of `service` on the native pipeline and traffic manager: the dequeue and
        then each departure's egress and deparser in C, in batches, the frames sent here in
        order; a departure v1model.py must go on with ends a batch and is handled before the
        next (as `_depart_native` does)."""
        rt = c.native
        n = tm.dequeue_native(limit)
        if not n:
            return 0
        deps = tm.departures
        pkts = [tm.take(deps[k]) for k in range(n)]
        i = 0
        while i < n:
            stop = rt.depart_batch(
                tm.address, tm.departures_address, i, n, self.drop_port, self._unit, CELL_BYTES
            )
            res = rt.departed
            for j in range(i, stop):
                r = res[j]
                rc, p = r.rc, pkts[j]
                if rc >= 0:
                    out = rt.batch_frame(p, r.off, rc)
                    if r.truncate >= 0:
                        out = out[: r.truncate]
                    port = deps[j].port
                    if len(out) != r.booked:
                        tm.ports[port].resize(r.booked, len(out))
                    self.stats.tx += 1
                    self.departed_ns = deps[j].start
                    self.transmit(port, out)
                    continue
                d = deps[j]
                p.t_ns = d.start
                self._egress_not_sent(c, S, d.port, p, rc, r.booked)
            if stop == i:  # not this pipeline's packet: v1model.py departs it
                d, p = deps[i], pkts[i]
                p.t_ns = d.start
                self._run_egress(c, S, d.port, d.prio, p, d.enq_ns, d.left)
                stop = i + 1
            i = stop
        return n

    def _depart_native(
        self, c: Compiled, S: StdMeta, port: int, prio: int, p: Packet, enq_ns: int, left: int
    ) -> None:
        """What `_run_egress` does, with the native pipeline's common path in C (one call: the
        dequeue's metadata, egress, checksums, deparser); a rare case goes on in
        `_after_egress` as on the reference."""
        rt = c.native
        booked = p.plen
        if self.qdepth_unit != "packets":
            left = self.tm.ports[port].qbytes[prio]
            if self.qdepth_unit == "cells":
                left = -(-left // CELL_BYTES)
        rc = rt.depart(p, port, prio, p.t_ns // CLOCK_NS, enq_ns // CLOCK_NS, left, self.drop_port)
        if rc >= 0:
            self._transmit_out(port, p, rt.frame(p, rc), booked)
        else:
            self._egress_not_sent(c, S, port, p, rc, booked)

    def _egress_not_sent(
        self, c: Compiled, S: StdMeta, port: int, p: Packet, rc: int, booked: int
    ) -> None:
        """A native egress that did not end in a frame (`rc` < 0): a rare case going on in
        `_after_egress`, a drop, a deparser error, or an abort raised as the reference's."""
        rt = c.native
        if rc == ARCH_PYTHON:
            self._after_egress(c, S, port, p, booked)
        elif rc == ARCH_DROP:
            self.stats.drop("egress_drop")
        elif rc == ARCH_DEPARSE_ERROR:
            log.error("deparser error, packet dropped: %r", rt.abort_error("deparser"))
            self.stats.drop("deparse_error")
        else:
            self._guarded("egress", lambda: rt.raise_abort("egress"))

    def _after_egress(self, c: Compiled, S: StdMeta, port: int, p: Packet, booked: int) -> None:
        """After the egress pipeline: clone, drop, deparse, recirculate or transmit."""
        p.exit = False
        sm = p.h[S.h]
        if p.clone_session >= 0:  # egress-to-egress clone: headers as they are now
            session = self.clone_sessions.get(p.clone_session)
            fl = p.clone_field_list
            p.clone_session, p.clone_field_list = -1, 0
            if session is not None:
                cp = p.copy()
                self._reset_metadata(cp)
                self._copy_field_list(c, cp, p, fl)
                cp.clear_registers()
                cp.truncate_len = -1
                cp.h[S.h][S.instance_type] = PKT_INSTANCE_TYPE_EGRESS_CLONE
                self._clone_out(c, S, cp, session)

        if sm[S.egress_spec] == self.drop_port:
            self.stats.drop("egress_drop")
            return
        try:
            c.update_checksums(p)
            out = c.deparse(p)
        except (PipelineAbort, IndexError, KeyError, TypeError, ValueError) as exc:
            log.error("deparser error, packet dropped: %r", exc)
            self.stats.drop("deparse_error")
            return

        if p.recirc_fl:
            if p.reinjects >= MAX_REINJECT:
                self.stats.drop("recirculate_loop")
                return
            rp = self._new(c, len(out))
            rp.reinjects = p.reinjects + 1
            rp.t_ns = p.t_ns
            self._copy_field_list(c, rp, p, p.recirc_fl)
            rp.h[S.h][S.instance_type] = PKT_INSTANCE_TYPE_RECIRC
            rp.h[S.h][S.packet_length] = len(out) & S.m_packet_length
            self._run_ingress(c, S, rp, out, 0)
            return
        self._transmit_out(port, p, out, booked)

    def _transmit_out(self, port: int, p: Packet, out: bytes, booked: int) -> None:
        if p.truncate_len >= 0:
            out = out[: p.truncate_len]
        if len(out) != booked:  # the port sends the frame as it left egress
            self.tm.ports[port].resize(booked, len(out))
        self.stats.tx += 1
        self.departed_ns = p.t_ns
        self.transmit(port, out)
