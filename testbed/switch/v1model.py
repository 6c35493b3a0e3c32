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

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from testbed.switch.codegen import DROP_PORT, Compiled, compile_program
from testbed.switch.packet import (
    PKT_INSTANCE_TYPE_EGRESS_CLONE,
    PKT_INSTANCE_TYPE_INGRESS_CLONE,
    PKT_INSTANCE_TYPE_NORMAL,
    PKT_INSTANCE_TYPE_RECIRC,
    PKT_INSTANCE_TYPE_REPLICATION,
    PKT_INSTANCE_TYPE_RESUBMIT,
    Packet,
    PipelineAbort,
)
from testbed.switch.program import LoadError, Program
from testbed.switch.traffic_manager import Clock, TrafficManager

log = logging.getLogger("xingmai.switch")

# A packet may be resubmitted / recirculated this many times in a row before it is dropped
# (bmv2 has no limit and would loop forever on a program that always recirculates).
MAX_REINJECT = 32

TransmitFn = Callable[[int, bytes], None]
DigestFn = Callable[[int, str, tuple[int, ...]], None]


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


# standard_metadata fields the architecture reads or writes, by their bmv2 names.
_STD_FIELDS = {
    "ingress_port": "standard_metadata.ingress_port",
    "egress_spec": "standard_metadata.egress_spec",
    "egress_port": "standard_metadata.egress_port",
    "instance_type": "standard_metadata.instance_type",
    "packet_length": "standard_metadata.packet_length",
    "parser_error": "standard_metadata.parser_error",
    "checksum_error": "standard_metadata.checksum_error",
    "priority": "intrinsic_metadata.priority",
    "mcast_grp": "intrinsic_metadata.mcast_grp",
    "egress_rid": "intrinsic_metadata.egress_rid",
    "ingress_global_timestamp": "intrinsic_metadata.ingress_global_timestamp",
    "egress_global_timestamp": "intrinsic_metadata.egress_global_timestamp",
    "enq_timestamp": "queueing_metadata.enq_timestamp",
    "enq_qdepth": "queueing_metadata.enq_qdepth",
    "deq_timedelta": "queueing_metadata.deq_timedelta",
    "deq_qdepth": "queueing_metadata.deq_qdepth",
    "qid": "queueing_metadata.qid",
}


class _Fields:
    """(header, field, mask) of each architecture field the loaded program has."""

    def __init__(self, prog: Program):
        self.ref: dict[str, tuple[int, int, int]] = {}
        for key, dotted in _STD_FIELDS.items():
            r = prog.arch_field(dotted) or prog.arch_field("standard_metadata." + key)
            if r is not None:
                self.ref[key] = (r[0], r[1], (1 << prog.field_width(r)) - 1)

    def get(self, p: Packet, key: str, default: int = 0) -> int:
        r = self.ref.get(key)
        return default if r is None else p.h[r[0]][r[1]]

    def set(self, p: Packet, key: str, value: int) -> None:
        r = self.ref.get(key)
        if r is not None:
            p.h[r[0]][r[1]] = value & r[2]


class V1Switch:
    """One simple_switch instance: a loaded program, its PRE and its traffic manager."""

    def __init__(self, clock: Clock | None = None, device_id: int = 0, cpu_port: int | None = None,
                 drop_port: int = DROP_PORT, nb_queues: int = 1, qdepth_unit: str = "packets"):
        self.clock = clock or Clock()
        self.device_id = device_id
        self.cpu_port = cpu_port
        self.drop_port = drop_port
        self.qdepth_unit = qdepth_unit  # what enq_qdepth / deq_qdepth count: packets or bytes
        self.tm = TrafficManager(self.clock, nb_queues)
        self.lock = threading.RLock()  # held while a packet runs or the control plane writes
        self.compiled: Compiled | None = None
        self.json_bytes: bytes = b""
        self.fields: _Fields | None = None
        self.clone_sessions: dict[int, CloneSession] = {}
        self.mcast_groups: dict[int, list[tuple[int, int]]] = {}  # mgid -> [(port, rid)]
        self.stats = Stats()
        self.transmit: TransmitFn = lambda port, data: None
        self.on_digest: DigestFn = lambda list_id, name, values: None
        self.log_fn: Callable[[str], None] = lambda msg: log.info("log_msg: %s", msg)
        self._uid = 0
        self._meta: list[int] = []
        self._zeros: list[list[int]] = []

    # ---- program ----------------------------------------------------------------------------

    def load(self, json_doc: bytes | str | dict[str, Any]) -> None:
        """Load (or replace) the program; raises LoadError and keeps the old one on failure."""
        if isinstance(json_doc, dict):
            doc, raw = json_doc, json.dumps(json_doc).encode()
        else:
            raw = json_doc.encode() if isinstance(json_doc, str) else bytes(json_doc)
            try:
                doc = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise LoadError(f"the device config is not valid JSON: {exc}") from exc
        prog = Program(doc)
        compiled = compile_program(prog, self.clock.now_us, lambda m: self.log_fn(m))
        fields = _Fields(prog)
        for required in ("ingress_port", "egress_spec", "egress_port", "instance_type",
                         "packet_length"):
            if required not in fields.ref:
                raise LoadError(f"the program lacks standard_metadata.{required}")
        with self.lock:
            self.compiled = compiled
            self.json_bytes = raw
            self.fields = fields
            self._meta = [h.index for h in prog.headers if h.metadata]
            self._zeros = [[0] * len(h.htype.fields) for h in prog.headers]
            # a new pipeline starts with empty replication state, as bmv2 does on a swap
            self.clone_sessions.clear()
            self.mcast_groups.clear()
        log.info("loaded program: %d tables, %d actions", len(compiled.tables),
                 len(compiled.actions))

    @property
    def ready(self) -> bool:
        return self.compiled is not None

    # ---- ingress --------------------------------------------------------------------------

    def receive(self, port: int, data: bytes) -> None:
        """A packet arrives on `port`: run ingress and hand the result to the traffic manager."""
        with self.lock:
            self.stats.rx += 1
            c, f = self.compiled, self.fields
            if c is None or f is None:
                self.stats.drop("no_pipeline")
                return
            p = self._new(c, len(data))
            f.set(p, "ingress_port", port)
            f.set(p, "packet_length", len(data))
            f.set(p, "instance_type", PKT_INSTANCE_TYPE_NORMAL)
            f.set(p, "ingress_global_timestamp", self.clock.now_us())
            self._run_ingress(c, f, p, bytes(data), port)

    def _new(self, c: Compiled, length: int) -> Packet:
        p = c.new_packet()
        p.ingress_len = length
        p.plen = length
        self._uid += 1
        p.uid = self._uid
        return p

    def _reset_metadata(self, p: Packet) -> None:
        for i in self._meta:
            p.h[i][:] = self._zeros[i]

    def _copy_field_list(self, c: Compiled, dst: Packet, src: Packet, fl_id: int) -> None:
        for hidx, fidx in c.program.field_lists.get(fl_id, []):
            if fidx >= 0:
                dst.h[hidx][fidx] = src.h[hidx][fidx]

    def _run_ingress(self, c: Compiled, f: _Fields, p: Packet, buf: bytes, port: int) -> None:
        try:
            err = c.parse(p, buf)
            f.set(p, "parser_error", err)
            f.set(p, "checksum_error", 1 if c.verify_checksums(p) else 0)
            c.ingress(p)
        except PipelineAbort as exc:
            log.warning("ingress aborted, packet dropped: %s", exc)
            self.stats.drop("ingress_abort")
            return
        except (IndexError, KeyError, TypeError, ValueError) as exc:
            log.error("ingress error, packet dropped: %r", exc)
            self.stats.drop("ingress_error")
            return
        p.exit = False
        egress_spec = f.get(p, "egress_spec")
        mgid = f.get(p, "mcast_grp")

        if p.clone_session >= 0:  # ingress-to-egress clone of the packet as it arrived
            session = self.clone_sessions.get(p.clone_session)
            fl = p.clone_field_list
            p.clone_session, p.clone_field_list = -1, 0
            if session is not None:
                cp = self._new(c, p.ingress_len)
                f.set(cp, "ingress_port", port)
                c.parse(cp, buf)
                c.verify_checksums(cp)
                self._reset_metadata(cp)
                self._copy_field_list(c, cp, p, fl)
                f.set(cp, "instance_type", PKT_INSTANCE_TYPE_INGRESS_CLONE)
                self._clone_out(c, f, cp, session)

        if p.learn_id > 0:
            self._digest(c, p)

        if p.resubmit_fl:
            if p.reinjects >= MAX_REINJECT:
                self.stats.drop("resubmit_loop")
                return
            rp = self._new(c, p.ingress_len)
            rp.reinjects = p.reinjects + 1
            self._copy_field_list(c, rp, p, p.resubmit_fl)
            f.set(rp, "instance_type", PKT_INSTANCE_TYPE_RESUBMIT)
            f.set(rp, "packet_length", p.ingress_len)
            self._run_ingress(c, f, rp, buf, port)
            return
        if mgid != 0:
            f.set(p, "instance_type", PKT_INSTANCE_TYPE_REPLICATION)
            self._multicast(c, f, p, mgid)
            return
        if egress_spec == self.drop_port:
            self.stats.drop("ingress_drop")
            return
        f.set(p, "instance_type", PKT_INSTANCE_TYPE_NORMAL)
        self._enqueue(f, egress_spec, p)

    def _digest(self, c: Compiled, p: Packet) -> None:
        entry = c.program.learn_lists.get(p.learn_id)
        if entry is None:
            return
        name, refs = entry
        values = tuple(p.h[hidx][fidx] if fidx >= 0 else int(p.v[hidx]) for hidx, fidx in refs)
        self.on_digest(p.learn_id, name, values)

    def _clone_out(self, c: Compiled, f: _Fields, cp: Packet, session: CloneSession) -> None:
        if session.truncate:
            cp.truncate_len = session.truncate
        if session.mgid:
            self._multicast(c, f, cp, session.mgid)
        if session.port is not None:
            self._enqueue(f, session.port, cp)

    def _multicast(self, c: Compiled, f: _Fields, p: Packet, mgid: int) -> None:
        replicas = self.mcast_groups.get(mgid)
        if not replicas:
            self.stats.drop("mcast_empty_group")
            return
        for port, rid in replicas:
            f.set(p, "egress_rid", rid)
            cp = p.copy()
            cp.clear_registers()
            cp.truncate_len = p.truncate_len
            self._enqueue(f, port, cp)

    def _enqueue(self, f: _Fields, port: int, p: Packet) -> None:
        prio = f.get(p, "priority")
        if prio >= self.tm.nb_queues:
            self.stats.drop("bad_priority")
            return
        pkts, nbytes = self.tm.occupancy(port, prio)
        f.set(p, "enq_timestamp", self.clock.now_us())
        f.set(p, "enq_qdepth", nbytes if self.qdepth_unit == "bytes" else pkts)
        if not self.tm.enqueue(port, prio, p, p.plen):
            self.stats.drop("queue_full")

    # ---- egress ---------------------------------------------------------------------------

    def service(self) -> int:
        """Run egress for every queued packet whose port is free now; returns how many."""
        done = 0
        while True:
            with self.lock:
                c, f = self.compiled, self.fields
                ready = self.tm.dequeue_ready(self.clock.now_ns())
                if not ready:
                    return done
                for port, prio, item in ready:
                    done += 1
                    if c is None or f is None:
                        continue
                    self._run_egress(c, f, port, prio, item.pkt)

    def _run_egress(self, c: Compiled, f: _Fields, port: int, prio: int, p: Packet) -> None:
        now = self.clock.now_us()
        f.set(p, "egress_global_timestamp", now)
        f.set(p, "deq_timedelta", now - f.get(p, "enq_timestamp"))
        pkts, nbytes = self.tm.occupancy(port, prio)
        f.set(p, "deq_qdepth", nbytes if self.qdepth_unit == "bytes" else pkts)
        f.set(p, "qid", prio)
        f.set(p, "egress_port", port)
        f.set(p, "egress_spec", self.drop_port + 1)
        f.set(p, "packet_length", p.plen)
        try:
            c.egress(p)
        except PipelineAbort as exc:
            log.warning("egress aborted, packet dropped: %s", exc)
            self.stats.drop("egress_abort")
            return
        except (IndexError, KeyError, TypeError, ValueError) as exc:
            log.error("egress error, packet dropped: %r", exc)
            self.stats.drop("egress_error")
            return
        p.exit = False

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
                f.set(cp, "instance_type", PKT_INSTANCE_TYPE_EGRESS_CLONE)
                self._clone_out(c, f, cp, session)

        if f.get(p, "egress_spec") == self.drop_port:
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
            self._copy_field_list(c, rp, p, p.recirc_fl)
            f.set(rp, "instance_type", PKT_INSTANCE_TYPE_RECIRC)
            f.set(rp, "packet_length", len(out))
            self._run_ingress(c, f, rp, out, 0)
            return
        if p.truncate_len >= 0:
            out = out[: p.truncate_len]
        self.stats.tx += 1
        self.transmit(port, out)
