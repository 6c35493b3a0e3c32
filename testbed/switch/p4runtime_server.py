"""P4Runtime v1 server of the built-in switch (what PI gives `simple_switch_grpc`).

Pipeline config (bmv2 JSON in `p4_device_config`), Write/Read of table entries, action
profile members and groups, counters, direct counters, meters, registers, value sets, the
packet replication engine (multicast groups, clone sessions) and digest configs;
StreamChannel with arbitration (highest election id is primary; others get ALREADY_EXISTS and
may not write), packet-in / packet-out through the CPU port using the P4Info
`controller_packet_metadata`, and digests with acks. Errors are gRPC statuses with the
P4Runtime spec's codes; a failed update in a batch is reported per update in the status
details, as the spec prescribes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from finsy.proto import p4i, p4r, p4r_grpc, rpc_code, rpc_status
from google.protobuf import any_pb2, text_format

from testbed.switch.p4info import P4InfoError, P4InfoIndex, TableInfo
from testbed.switch.program import LoadError
from testbed.switch.tables import ActionCall, Entry, TableError
from testbed.switch.v1model import CloneSession, V1Switch

log = logging.getLogger("xingmai.switch.p4runtime")

API_VERSION = "1.4.1"
# Clone sessions with several replicas use a multicast group from this private range.
CLONE_MGID_BASE = 0x10000

_CODES = {name: getattr(grpc.StatusCode, name) for name in (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE")}


class RpcError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _grpc_code(name: str) -> grpc.StatusCode:
    return _CODES.get(name, grpc.StatusCode.UNKNOWN)


def _code_int(name: str) -> int:
    return int(_grpc_code(name).value[0])


def to_int(data: bytes, bitwidth: int, what: str) -> int:
    if not data:
        raise RpcError("INVALID_ARGUMENT", f"{what}: empty bytes")
    value = int.from_bytes(data, "big")
    if bitwidth and value >> bitwidth:
        raise RpcError("OUT_OF_RANGE", f"{what}: {value:#x} does not fit {bitwidth} bits")
    return value


def to_bytes(value: int) -> bytes:
    """P4Runtime canonical binary string: big-endian, no leading zero bytes, at least one."""
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def _election(eid: Any) -> int:
    return (eid.high << 64) | eid.low


@dataclass
class Client:
    stream_id: int
    queue: queue.Queue[p4r.StreamMessageResponse | None]
    election_id: int | None = None
    role: str = ""
    peer: str = ""


@dataclass
class DigestState:
    config: Any
    pending: dict[tuple[int, ...], float] = field(default_factory=dict)  # data -> sent at
    lists: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)  # list id -> data


class P4RuntimeService(p4r_grpc.P4RuntimeServicer):  # type: ignore[misc]
    """The P4Runtime server state machine, independent of the transport (testable in process)."""

    def __init__(self, switch: V1Switch, device_id: int = 0,
                 inject: Callable[[int, bytes], None] | None = None):
        self.switch = switch
        self.device_id = device_id
        self.inject = inject or self._inject_inline
        self.lock = threading.RLock()
        self.index: P4InfoIndex | None = None
        self.p4info: p4i.P4Info | None = None
        self.cookie = 0
        self.saved: tuple[p4i.P4Info, bytes, int] | None = None
        self.initial_defaults: dict[str, ActionCall | None] = {}
        self.clients: dict[int, Client] = {}
        self._next_stream = 1
        self.digests: dict[int, DigestState] = {}
        self._digest_list_id = 0
        self.counters = {"packet_in": 0, "packet_in_dropped": 0, "packet_out": 0,
                         "packet_out_dropped": 0, "digests_sent": 0, "digests_dropped": 0,
                         "write_errors": 0}
        switch.on_digest = self._on_digest

    def _inject_inline(self, port: int, data: bytes) -> None:
        self.switch.receive(port, data)
        self.switch.service()

    # ---- arbitration ------------------------------------------------------------------------

    def primary(self, role: str = "") -> Client | None:
        best = None
        for c in self.clients.values():
            if c.role == role and c.election_id is not None:
                if best is None or c.election_id > (best.election_id or 0):
                    best = c
        return best

    def _check_primary(self, device_id: int, eid: Any, role: str = "") -> None:
        if device_id != self.device_id:
            raise RpcError("NOT_FOUND", f"device {device_id} unknown (this is {self.device_id})")
        p = self.primary(role)
        if p is None or p.election_id != _election(eid):
            raise RpcError("PERMISSION_DENIED", "not the primary controller for this device")

    def _notify_arbitration(self, role: str) -> None:
        p = self.primary(role)
        for c in self.clients.values():
            if c.role != role:
                continue
            msg = p4r.StreamMessageResponse()
            arb = msg.arbitration
            arb.device_id = self.device_id
            if role:
                arb.role.name = role
            if p is not None and p.election_id is not None:
                arb.election_id.high = p.election_id >> 64
                arb.election_id.low = p.election_id & (2**64 - 1)
            if c is p:
                arb.status.code = rpc_code.OK
                arb.status.message = "is primary"
            else:
                arb.status.code = rpc_code.ALREADY_EXISTS
                arb.status.message = "is backup"
            c.queue.put(msg)

    def _arbitrate(self, client: Client, req: Any) -> None:
        if req.device_id != self.device_id:
            raise RpcError("NOT_FOUND", f"device {req.device_id} unknown")
        role = req.role.name if req.HasField("role") else ""
        eid = _election(req.election_id) if req.HasField("election_id") else None
        with self.lock:
            for other in self.clients.values():
                if other is not client and other.role == role and eid is not None \
                        and other.election_id == eid:
                    raise RpcError("INVALID_ARGUMENT", f"election id {eid} is already in use")
            old_primary = self.primary(role)
            client.role, client.election_id = role, eid
            new_primary = self.primary(role)
            if new_primary is not old_primary:
                log.info("primary for role %r is now stream %s (election id %s)", role,
                         new_primary.stream_id if new_primary else None, eid)
                self._notify_arbitration(role)
            else:
                self._notify_one(client, role)

    def _notify_one(self, client: Client, role: str) -> None:
        p = self.primary(role)
        msg = p4r.StreamMessageResponse()
        msg.arbitration.device_id = self.device_id
        if p is not None and p.election_id is not None:
            msg.arbitration.election_id.high = p.election_id >> 64
            msg.arbitration.election_id.low = p.election_id & (2**64 - 1)
        ok = client is p
        msg.arbitration.status.code = rpc_code.OK if ok else rpc_code.ALREADY_EXISTS
        msg.arbitration.status.message = "is primary" if ok else "is backup"
        client.queue.put(msg)

    def StreamChannel(self, request_iterator: Iterator[Any], context: Any) -> Iterator[Any]:
        with self.lock:
            client = Client(self._next_stream, queue.Queue(), peer=context.peer())
            self._next_stream += 1
            self.clients[client.stream_id] = client

        def reader() -> None:
            try:
                for req in request_iterator:
                    kind = req.WhichOneof("update")
                    try:
                        if kind == "arbitration":
                            self._arbitrate(client, req.arbitration)
                        elif client.election_id is None and kind != "arbitration":
                            raise RpcError("FAILED_PRECONDITION",
                                           "send a MasterArbitrationUpdate first")
                        elif kind == "packet":
                            self._packet_out(client, req.packet)
                        elif kind == "digest_ack":
                            self._digest_ack(req.digest_ack)
                    except RpcError as exc:
                        err = p4r.StreamMessageResponse()
                        err.error.canonical_code = _code_int(exc.code)
                        err.error.message = exc.message
                        if kind == "packet":
                            err.error.packet_out.packet_out.CopyFrom(req.packet)
                        client.queue.put(err)
                        if kind == "arbitration":
                            break
            except grpc.RpcError:
                pass
            finally:
                client.queue.put(None)

        threading.Thread(target=reader, name=f"p4rt-stream-{client.stream_id}",
                         daemon=True).start()
        try:
            while True:
                msg = client.queue.get()
                if msg is None:
                    break
                yield msg
        finally:
            with self.lock:
                was_primary = self.primary(client.role) is client
                self.clients.pop(client.stream_id, None)
                if was_primary:
                    self._notify_arbitration(client.role)

    # ---- packet I/O -------------------------------------------------------------------------

    def _packet_out(self, client: Client, pkt: Any) -> None:
        with self.lock:
            if self.primary(client.role) is not client:
                self.counters["packet_out_dropped"] += 1
                raise RpcError("PERMISSION_DENIED", "packet-out from a backup controller")
            idx = self.index
        if idx is None:
            self.counters["packet_out_dropped"] += 1
            raise RpcError("FAILED_PRECONDITION", "no pipeline")
        if self.switch.cpu_port is None:
            self.counters["packet_out_dropped"] += 1
            raise RpcError("FAILED_PRECONDITION", "the switch has no CPU port")
        header = b""
        if idx.packet_out is not None:
            given = {m.metadata_id: m.value for m in pkt.metadata}
            value, nbits = 0, 0
            for mid, name, width in idx.packet_out.fields:
                if mid not in given:
                    self.counters["packet_out_dropped"] += 1
                    raise RpcError("INVALID_ARGUMENT", f"packet-out lacks metadata {name!r}")
                value = (value << width) | to_int(given.pop(mid), width, f"metadata {name}")
                nbits += width
            if given:
                self.counters["packet_out_dropped"] += 1
                raise RpcError("INVALID_ARGUMENT", f"unknown packet-out metadata ids {list(given)}")
            pad = -nbits % 8
            header = (value << pad).to_bytes((nbits + pad) // 8, "big")
        self.counters["packet_out"] += 1
        self.inject(self.switch.cpu_port, header + bytes(pkt.payload))

    def packet_in(self, data: bytes) -> None:
        """A packet the pipeline sent to the CPU port: deliver it to the primary controller."""
        idx = self.index
        with self.lock:
            primary = self.primary("")
        if primary is None or idx is None:
            self.counters["packet_in_dropped"] += 1
            return
        msg = p4r.StreamMessageResponse()
        payload = data
        if idx.packet_in is not None:
            n = idx.packet_in.nbytes
            if len(data) < n:
                self.counters["packet_in_dropped"] += 1
                return
            total = sum(w for _, _, w in idx.packet_in.fields)
            value = int.from_bytes(data[:n], "big") >> (n * 8 - total)
            shift = total
            for mid, _name, width in idx.packet_in.fields:
                shift -= width
                md = msg.packet.metadata.add()
                md.metadata_id = mid
                md.value = to_bytes((value >> shift) & ((1 << width) - 1))
            payload = data[n:]
        msg.packet.payload = payload
        self.counters["packet_in"] += 1
        primary.queue.put(msg)

    # ---- digests ----------------------------------------------------------------------------

    def _on_digest(self, learn_id: int, name: str, values: tuple[int, ...]) -> None:
        idx = self.index
        if idx is None or learn_id not in idx.digest_by_learn:
            return
        did = idx.digest_by_learn[learn_id]
        with self.lock:
            st = self.digests.get(did)
            primary = self.primary("")
            if st is None or primary is None:
                self.counters["digests_dropped"] += 1
                return
            now = time.monotonic()
            ack_timeout = (st.config.ack_timeout_ns or 0) / 1e9
            sent_at = st.pending.get(values)
            if sent_at is not None and (ack_timeout == 0 or now - sent_at < ack_timeout):
                return  # not acked yet: the spec forbids sending the same data again
            st.pending[values] = now
            self._digest_list_id += 1
            st.lists[self._digest_list_id] = [values]
            msg = p4r.StreamMessageResponse()
            msg.digest.digest_id = did
            msg.digest.list_id = self._digest_list_id
            msg.digest.timestamp = time.time_ns()
            member = msg.digest.data.add()
            for v in values:
                member.struct.members.add().bitstring = to_bytes(v)
            self.counters["digests_sent"] += 1
            primary.queue.put(msg)

    def _digest_ack(self, ack: Any) -> None:
        with self.lock:
            st = self.digests.get(ack.digest_id)
            if st is None:
                return
            for values in st.lists.pop(ack.list_id, []):
                st.pending.pop(values, None)

    # ---- pipeline config --------------------------------------------------------------------

    def SetForwardingPipelineConfig(self, request: Any, context: Any) -> Any:
        return self._call(context, self._set_pipeline, request)

    def _set_pipeline(self, request: Any) -> Any:
        A = p4r.SetForwardingPipelineConfigRequest
        self._check_primary(request.device_id, request.election_id,
                            request.role if isinstance(request.role, str) else "")
        action = request.action
        cfg = request.config
        if action == A.COMMIT:
            if self.saved is None:
                raise RpcError("FAILED_PRECONDITION", "COMMIT without a saved config")
            info, device_config, cookie = self.saved
            self.install(info, device_config, cookie)
            self.saved = None
            return p4r.SetForwardingPipelineConfigResponse()
        if not cfg.p4_device_config:
            raise RpcError("INVALID_ARGUMENT", "the config has no p4_device_config (bmv2 JSON)")
        cookie = cfg.cookie.cookie if cfg.HasField("cookie") else 0
        if action == A.RECONCILE_AND_COMMIT and self.index is not None and \
                self.switch.json_bytes == cfg.p4_device_config and self.p4info == cfg.p4info:
            self.cookie = cookie  # same program: keep every entry, as a restarted controller needs
            return p4r.SetForwardingPipelineConfigResponse()
        self._verify(cfg.p4info, cfg.p4_device_config)
        if action in (A.VERIFY_AND_COMMIT, A.RECONCILE_AND_COMMIT):
            self.install(cfg.p4info, cfg.p4_device_config, cookie)
        elif action == A.VERIFY_AND_SAVE:
            self.saved = (cfg.p4info, cfg.p4_device_config, cookie)
        elif action != A.VERIFY:
            raise RpcError("INVALID_ARGUMENT", f"unsupported action {action}")
        return p4r.SetForwardingPipelineConfigResponse()

    def _verify(self, info: Any, device_config: bytes) -> None:
        import json

        from testbed.switch.codegen import compile_program
        from testbed.switch.program import Program
        try:
            compiled = compile_program(Program(json.loads(device_config)), lambda: 0)
            P4InfoIndex(info, compiled)
        except (LoadError, P4InfoError, ValueError, UnicodeDecodeError) as exc:
            raise RpcError("INVALID_ARGUMENT", f"bad pipeline config: {exc}") from exc

    def install(self, info: Any, device_config: bytes, cookie: int) -> None:
        with self.lock:
            try:
                self.switch.load(device_config)
                assert self.switch.compiled is not None
                index = P4InfoIndex(info, self.switch.compiled)
            except (LoadError, P4InfoError) as exc:
                raise RpcError("INVALID_ARGUMENT", f"bad pipeline config: {exc}") from exc
            self.index = index
            self.p4info = p4i.P4Info()
            self.p4info.CopyFrom(info)
            self.cookie = cookie
            self.digests.clear()
            self.initial_defaults = {n: t.default for n, t in self.switch.compiled.tables.items()}
        log.info("pipeline installed (cookie %#x)", cookie)

    def GetForwardingPipelineConfig(self, request: Any, context: Any) -> Any:
        return self._call(context, self._get_pipeline, request)

    def _get_pipeline(self, request: Any) -> Any:
        if request.device_id != self.device_id:
            raise RpcError("NOT_FOUND", f"device {request.device_id} unknown")
        resp = p4r.GetForwardingPipelineConfigResponse()
        if self.index is None or self.p4info is None:
            return resp  # no pipeline yet: an empty config, as PI answers
        R = p4r.GetForwardingPipelineConfigRequest
        rt = request.response_type
        resp.config.cookie.cookie = self.cookie
        if rt in (R.ALL, R.P4INFO_AND_COOKIE):
            resp.config.p4info.CopyFrom(self.p4info)
        if rt in (R.ALL, R.DEVICE_CONFIG_AND_COOKIE):
            resp.config.p4_device_config = self.switch.json_bytes
        return resp

    def Capabilities(self, request: Any, context: Any) -> Any:
        return p4r.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    # ---- Write --------------------------------------------------------------------------------

    def _call(self, context: Any, fn: Callable[[Any], Any], request: Any) -> Any:
        try:
            with self.switch.lock, self.lock:
                return fn(request)
        except RpcError as exc:
            context.abort(_grpc_code(exc.code), exc.message)
        except (KeyError, IndexError, ValueError, TypeError, AttributeError) as exc:
            log.exception("internal error in %s", fn.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    def Write(self, request: Any, context: Any) -> Any:
        try:
            self._check_primary(request.device_id, request.election_id, request.role)
            if self.index is None:
                raise RpcError("FAILED_PRECONDITION", "no pipeline configured")
        except RpcError as exc:
            context.abort(_grpc_code(exc.code), exc.message)
        errors = self.write_updates(list(request.updates))
        if any(e is not None for e in errors):
            self.counters["write_errors"] += 1
            status = rpc_status.Status(code=rpc_code.UNKNOWN, message="write failed")
            for e in errors:
                err = p4r.Error(canonical_code=rpc_code.OK if e is None else _code_int(e.code),
                                message="" if e is None else e.message)
                packed = any_pb2.Any()
                packed.Pack(err)
                status.details.append(packed)
            context.set_trailing_metadata(
                (("grpc-status-details-bin", status.SerializeToString()),))
            first = next(e for e in errors if e is not None)
            context.abort(grpc.StatusCode.UNKNOWN, first.message)
        return p4r.WriteResponse()

    def write_updates(self, updates: list[Any]) -> list[RpcError | None]:
        """Apply updates in order; one error (or None) per update."""
        out: list[RpcError | None] = []
        with self.switch.lock, self.lock:
            for upd in updates:
                try:
                    self._write_one(upd.type, upd.entity)
                    out.append(None)
                except RpcError as exc:
                    out.append(exc)
                except TableError as exc:
                    out.append(RpcError(exc.code, str(exc)))
                except (KeyError, IndexError, ValueError) as exc:
                    out.append(RpcError("INVALID_ARGUMENT", f"{type(exc).__name__}: {exc}"))
        return out

    def _write_one(self, utype: int, entity: Any) -> None:
        kind = entity.WhichOneof("entity")
        U = p4r.Update
        if utype not in (U.INSERT, U.MODIFY, U.DELETE):
            raise RpcError("INVALID_ARGUMENT", "update type must be INSERT, MODIFY or DELETE")
        handler = getattr(self, f"_write_{kind}", None)
        if handler is None:
            raise RpcError("UNIMPLEMENTED", f"writing {kind} is not supported")
        handler(utype, getattr(entity, kind))

    # tables ---------------------------------------------------------------------------------

    def _table(self, table_id: int) -> TableInfo:
        assert self.index is not None
        ti = self.index.tables.get(table_id)
        if ti is None:
            raise RpcError("NOT_FOUND", f"no table with id {table_id}")
        return ti

    def _spec(self, ti: TableInfo, matches: Any) -> tuple[Any, ...]:
        M = p4i.MatchField
        spec: list[Any] = [None] * len(ti.fields)
        for fm in matches:
            mf = ti.fields_by_id.get(fm.field_id)
            if mf is None:
                raise RpcError("INVALID_ARGUMENT", f"{ti.name}: no match field {fm.field_id}")
            if spec[mf.position] is not None:
                raise RpcError("INVALID_ARGUMENT", f"{ti.name}: field {mf.name} given twice")
            which = fm.WhichOneof("field_match_type")
            kinds: dict[int, str] = {M.EXACT: "exact", M.LPM: "lpm", M.TERNARY: "ternary",
                                     M.RANGE: "range", M.OPTIONAL: "optional"}
            expected = kinds.get(mf.match_type)
            if which != expected:
                raise RpcError("INVALID_ARGUMENT",
                               f"{ti.name}: field {mf.name} is {expected}, got {which}")
            w = mf.bitwidth
            if which == "exact":
                spec[mf.position] = to_int(fm.exact.value, w, mf.name)
            elif which == "lpm":
                if fm.lpm.prefix_len <= 0:
                    raise RpcError("INVALID_ARGUMENT", f"{mf.name}: omit a /0 prefix")
                spec[mf.position] = (to_int(fm.lpm.value, w, mf.name), fm.lpm.prefix_len)
            elif which == "ternary":
                mask = to_int(fm.ternary.mask, w, mf.name)
                if mask == 0:
                    raise RpcError("INVALID_ARGUMENT", f"{mf.name}: omit a zero ternary mask")
                spec[mf.position] = (to_int(fm.ternary.value, w, mf.name), mask)
            elif which == "range":
                lo, hi = to_int(fm.range.low, w, mf.name), to_int(fm.range.high, w, mf.name)
                if lo > hi:
                    raise RpcError("INVALID_ARGUMENT", f"{mf.name}: low > high")
                spec[mf.position] = (lo, hi)
            else:
                spec[mf.position] = (to_int(fm.optional.value, w, mf.name), (1 << w) - 1)
        for mf in ti.fields:
            if spec[mf.position] is None:
                if mf.match_type == M.EXACT:
                    raise RpcError("INVALID_ARGUMENT", f"{ti.name}: exact field {mf.name} missing")
                spec[mf.position] = (0, (1 << mf.bitwidth) - 1) if mf.match_type == M.RANGE \
                    else (0, 0)
        return tuple(spec)

    def _action_call(self, ti: TableInfo | None, action: Any, default: bool = False) -> ActionCall:
        assert self.index is not None and self.switch.compiled is not None
        ai = self.index.actions.get(action.action_id)
        if ai is None:
            raise RpcError("NOT_FOUND", f"no action with id {action.action_id}")
        if ti is not None:
            if ai.id not in ti.action_ids:
                raise RpcError("INVALID_ARGUMENT", f"{ti.name} has no action {ai.name}")
            if default and ai.id in ti.table_only:
                raise RpcError("INVALID_ARGUMENT", f"{ai.name} cannot be a default action")
            if not default and ai.id in ti.default_only:
                raise RpcError("INVALID_ARGUMENT", f"{ai.name} is a default-only action")
        given = {p.param_id: p.value for p in action.params}
        params = []
        for pi in ai.params:
            if pi.id not in given:
                raise RpcError("INVALID_ARGUMENT", f"{ai.name}: parameter {pi.name} missing")
            params.append(to_int(given.pop(pi.id), pi.bitwidth, f"{ai.name}.{pi.name}"))
        if given:
            raise RpcError("INVALID_ARGUMENT", f"{ai.name}: unknown parameter ids {list(given)}")
        return ActionCall(ai.json_id, self.switch.compiled.actions[ai.json_id], tuple(params))

    def _entry(self, ti: TableInfo, te: Any) -> Entry:
        entry = Entry(self._spec(ti, te.match), te.priority)
        which = te.action.WhichOneof("type")
        if ti.profile_id:
            if which == "action_profile_member_id":
                entry.member = te.action.action_profile_member_id
            elif which == "action_profile_group_id":
                entry.group = te.action.action_profile_group_id
            else:
                raise RpcError("INVALID_ARGUMENT",
                               f"{ti.name} is indirect: give a member or a group")
        else:
            if which != "action":
                raise RpcError("INVALID_ARGUMENT", f"{ti.name} needs a direct action")
            entry.call = self._action_call(ti, te.action.action)
        entry.idle_timeout_ns = te.idle_timeout_ns
        entry.metadata = te.metadata
        return entry

    def _write_table_entry(self, utype: int, te: Any) -> None:
        U = p4r.Update
        ti = self._table(te.table_id)
        table = ti.table
        if ti.is_const and not te.is_default_action:
            raise RpcError("PERMISSION_DENIED", f"{ti.name} is a const table")
        if te.is_default_action:
            if utype != U.MODIFY:
                raise RpcError("INVALID_ARGUMENT", "the default entry can only be modified")
            if len(te.match):
                raise RpcError("INVALID_ARGUMENT", "the default entry has no match")
            if te.HasField("action"):
                if te.action.WhichOneof("type") != "action":
                    raise RpcError("UNIMPLEMENTED", "indirect default actions")
                table.set_default(self._action_call(ti, te.action.action, default=True))
            else:  # reset to the program's default
                table.set_default(self.initial_defaults.get(ti.name))
            return
        if table.needs_priority:
            if te.priority <= 0:
                raise RpcError("INVALID_ARGUMENT", f"{ti.name} needs a priority > 0")
        elif te.priority != 0:
            raise RpcError("INVALID_ARGUMENT", f"{ti.name} takes no priority")
        if utype == U.DELETE:
            table.delete(self._spec(ti, te.match), te.priority)
            return
        entry = self._entry(ti, te)
        if utype == U.INSERT:
            e = table.add(entry, strict=True)
        else:
            e = table.modify(entry.spec, entry.priority, entry)
        if te.HasField("counter_data"):
            e.packet_count, e.byte_count = te.counter_data.packet_count, te.counter_data.byte_count
        if te.HasField("meter_config") and e.meter is not None:
            e.meter.set_rates(self._meter_rates(te.meter_config))

    @staticmethod
    def _meter_rates(cfg: Any) -> list[tuple[float, int]]:
        # P4Runtime rates are per second; bmv2's per microsecond.
        if cfg.cir > cfg.pir:
            raise RpcError("INVALID_ARGUMENT", "meter cir must not exceed pir")
        return [(cfg.cir / 1e6, cfg.cburst), (cfg.pir / 1e6, cfg.pburst)]

    # action profiles ---------------------------------------------------------------------------

    def _profile(self, pid: int) -> Any:
        assert self.index is not None
        prof = self.index.profiles.get(pid)
        if prof is None:
            raise RpcError("NOT_FOUND", f"no action profile with id {pid}")
        return prof

    def _profile_table(self, pid: int) -> TableInfo | None:
        assert self.index is not None
        return next((t for t in self.index.tables.values() if t.profile_id == pid), None)

    def _write_action_profile_member(self, utype: int, m: Any) -> None:
        U = p4r.Update
        prof = self._profile(m.action_profile_id)
        if utype == U.DELETE:
            prof.delete_member(m.member_id)
            return
        call = self._action_call(self._profile_table(m.action_profile_id), m.action)
        (prof.add_member if utype == U.INSERT else prof.modify_member)(m.member_id, call)

    def _write_action_profile_group(self, utype: int, g: Any) -> None:
        U = p4r.Update
        prof = self._profile(g.action_profile_id)
        if utype == U.DELETE:
            if self._group_in_use(g.action_profile_id, g.group_id):
                raise RpcError("FAILED_PRECONDITION", f"group {g.group_id} is used by entries")
            prof.delete_group(g.group_id)
            return
        members = [(mm.member_id, mm.weight or 1) for mm in g.members]
        prof.set_group(g.group_id, members, g.max_size, create=utype == U.INSERT)

    def _group_in_use(self, pid: int, gid: int) -> bool:
        ti = self._profile_table(pid)
        return ti is not None and any(e.group == gid for e in ti.table.entries.values())

    # counters, meters, registers ---------------------------------------------------------------

    def _write_counter_entry(self, utype: int, ce: Any) -> None:
        if utype != p4r.Update.MODIFY:
            raise RpcError("INVALID_ARGUMENT", "counters can only be modified")
        assert self.index is not None
        arr = self.index.counters.get(ce.counter_id)
        if arr is None:
            raise RpcError("NOT_FOUND", f"no counter with id {ce.counter_id}")
        idxs = [ce.index.index] if ce.HasField("index") else range(arr.size)
        for i in idxs:
            if not 0 <= i < arr.size:
                raise RpcError("OUT_OF_RANGE", f"{arr.name}: index {i} out of range")
            arr.write(i, ce.data.packet_count, ce.data.byte_count)

    def _write_direct_counter_entry(self, utype: int, dce: Any) -> None:
        if utype != p4r.Update.MODIFY:
            raise RpcError("INVALID_ARGUMENT", "direct counters can only be modified")
        ti = self._table(dce.table_entry.table_id)
        e = ti.table.find(self._spec(ti, dce.table_entry.match), dce.table_entry.priority)
        if e is None:
            raise RpcError("NOT_FOUND", f"{ti.name}: no such entry")
        e.packet_count, e.byte_count = dce.data.packet_count, dce.data.byte_count

    def _write_meter_entry(self, utype: int, me: Any) -> None:
        if utype != p4r.Update.MODIFY:
            raise RpcError("INVALID_ARGUMENT", "meters can only be modified")
        assert self.index is not None
        arr = self.index.meters.get(me.meter_id)
        if arr is None:
            raise RpcError("NOT_FOUND", f"no meter with id {me.meter_id}")
        idxs = [me.index.index] if me.HasField("index") else range(arr.size)
        for i in idxs:
            if not 0 <= i < arr.size:
                raise RpcError("OUT_OF_RANGE", f"{arr.name}: index {i} out of range")
            if me.HasField("config"):
                arr.meters[i].set_rates(self._meter_rates(me.config))
            else:
                arr.meters[i].reset()

    def _write_direct_meter_entry(self, utype: int, dme: Any) -> None:
        if utype != p4r.Update.MODIFY:
            raise RpcError("INVALID_ARGUMENT", "direct meters can only be modified")
        ti = self._table(dme.table_entry.table_id)
        e = ti.table.find(self._spec(ti, dme.table_entry.match), dme.table_entry.priority)
        if e is None or e.meter is None:
            raise RpcError("NOT_FOUND", f"{ti.name}: no such metered entry")
        if dme.HasField("config"):
            e.meter.set_rates(self._meter_rates(dme.config))
        else:
            e.meter.reset()

    def _write_register_entry(self, utype: int, re_: Any) -> None:
        if utype != p4r.Update.MODIFY:
            raise RpcError("INVALID_ARGUMENT", "registers can only be modified")
        assert self.index is not None
        arr = self.index.registers.get(re_.register_id)
        if arr is None:
            raise RpcError("NOT_FOUND", f"no register with id {re_.register_id}")
        if re_.data.WhichOneof("data") != "bitstring":
            raise RpcError("INVALID_ARGUMENT", "register data must be a bitstring")
        value = to_int(re_.data.bitstring, arr.bitwidth, arr.name)
        idxs = [re_.index.index] if re_.HasField("index") else range(arr.size)
        for i in idxs:
            if not 0 <= i < arr.size:
                raise RpcError("OUT_OF_RANGE", f"{arr.name}: index {i} out of range")
            arr.write(i, value)

    def _write_value_set_entry(self, utype: int, vse: Any) -> None:
        if utype != p4r.Update.MODIFY:
            raise RpcError("INVALID_ARGUMENT", "value sets can only be modified")
        assert self.index is not None
        vs = self.index.value_sets.get(vse.value_set_id)
        info = self.index.value_set_info.get(vse.value_set_id)
        if vs is None or info is None:
            raise RpcError("NOT_FOUND", f"no value set with id {vse.value_set_id}")
        if info.size and len(vse.members) > info.size:
            raise RpcError("RESOURCE_EXHAUSTED", f"{vs.name}: at most {info.size} members")
        values = set()
        for member in vse.members:
            fields = {fm.field_id: fm for fm in member.match}
            value, widths = 0, []
            for mf in info.match:
                fm = fields.get(mf.id)
                if fm is None or fm.WhichOneof("field_match_type") != "exact":
                    raise RpcError("INVALID_ARGUMENT", f"{vs.name}: needs an exact {mf.name}")
                value = (value << mf.bitwidth) | to_int(fm.exact.value, mf.bitwidth, mf.name)
                widths.append(mf.bitwidth)
            values.add(vs.padded(value))
        vs.values = values

    def _write_packet_replication_engine_entry(self, utype: int, pre: Any) -> None:
        U = p4r.Update
        which = pre.WhichOneof("type")
        sw = self.switch
        if which == "multicast_group_entry":
            g = pre.multicast_group_entry
            gid = g.multicast_group_id
            if gid == 0 or gid >= CLONE_MGID_BASE:
                raise RpcError("OUT_OF_RANGE", f"multicast group id {gid} not in [1, 65535]")
            exists = gid in sw.mcast_groups
            if utype == U.INSERT and exists:
                raise RpcError("ALREADY_EXISTS", f"multicast group {gid} exists")
            if utype != U.INSERT and not exists:
                raise RpcError("NOT_FOUND", f"no multicast group {gid}")
            if utype == U.DELETE:
                del sw.mcast_groups[gid]
            else:
                sw.mcast_groups[gid] = [(self._replica_port(r), r.instance) for r in g.replicas]
        elif which == "clone_session_entry":
            c = pre.clone_session_entry
            sid = c.session_id
            exists = sid in sw.clone_sessions
            if utype == U.INSERT and exists:
                raise RpcError("ALREADY_EXISTS", f"clone session {sid} exists")
            if utype != U.INSERT and not exists:
                raise RpcError("NOT_FOUND", f"no clone session {sid}")
            mgid = CLONE_MGID_BASE + sid
            sw.mcast_groups.pop(mgid, None)
            if utype == U.DELETE:
                del sw.clone_sessions[sid]
                return
            replicas = [(self._replica_port(r), r.instance) for r in c.replicas]
            session = CloneSession(truncate=c.packet_length_bytes, cos=c.class_of_service)
            if len(replicas) == 1:
                session.port = replicas[0][0]
            elif replicas:
                sw.mcast_groups[mgid] = replicas
                session.mgid = mgid
            sw.clone_sessions[sid] = session
        else:
            raise RpcError("INVALID_ARGUMENT", "empty packet replication engine entry")

    @staticmethod
    def _replica_port(r: Any) -> int:
        if r.WhichOneof("port_kind") == "port":
            return int.from_bytes(r.port, "big")
        return int(r.egress_port)

    def _write_digest_entry(self, utype: int, de: Any) -> None:
        U = p4r.Update
        assert self.index is not None
        if de.digest_id not in self.index.digests:
            raise RpcError("NOT_FOUND", f"no digest with id {de.digest_id}")
        exists = de.digest_id in self.digests
        if utype == U.INSERT and exists:
            raise RpcError("ALREADY_EXISTS", "digest already configured")
        if utype != U.INSERT and not exists:
            raise RpcError("NOT_FOUND", "digest not configured")
        if utype == U.DELETE:
            del self.digests[de.digest_id]
        else:
            self.digests[de.digest_id] = DigestState(de.config)

    # ---- Read -------------------------------------------------------------------------------

    def Read(self, request: Any, context: Any) -> Iterator[Any]:
        try:
            if request.device_id != self.device_id:
                raise RpcError("NOT_FOUND", f"device {request.device_id} unknown")
            if self.index is None:
                raise RpcError("FAILED_PRECONDITION", "no pipeline configured")
            with self.switch.lock, self.lock:
                entities = [e for ent in request.entities for e in self.read_entity(ent)]
        except RpcError as exc:
            context.abort(_grpc_code(exc.code), exc.message)
        except TableError as exc:
            context.abort(_grpc_code(exc.code), str(exc))
        for i in range(0, len(entities), 500):
            yield p4r.ReadResponse(entities=entities[i:i + 500])

    def read_entity(self, ent: Any) -> list[Any]:
        kind = ent.WhichOneof("entity")
        handler = getattr(self, f"_read_{kind}", None)
        if handler is None:
            raise RpcError("UNIMPLEMENTED", f"reading {kind} is not supported")
        return handler(getattr(ent, kind))

    def _encode_entry(self, ti: TableInfo, e: Entry, with_counters: bool,
                      with_meter: bool) -> Any:
        M = p4i.MatchField
        te = p4r.TableEntry(table_id=ti.id, priority=e.priority if ti.table.needs_priority else 0)
        for mf in ti.fields:
            s = e.spec[mf.position]
            if mf.match_type == M.EXACT:
                te.match.add(field_id=mf.id).exact.value = to_bytes(s)
            elif mf.match_type == M.LPM:
                if s[1]:
                    fm = te.match.add(field_id=mf.id)
                    fm.lpm.value, fm.lpm.prefix_len = to_bytes(s[0]), s[1]
            elif mf.match_type == M.TERNARY:
                if s[1]:
                    fm = te.match.add(field_id=mf.id)
                    fm.ternary.value, fm.ternary.mask = to_bytes(s[0]), to_bytes(s[1])
            elif mf.match_type == M.RANGE:
                if s != (0, (1 << mf.bitwidth) - 1):
                    fm = te.match.add(field_id=mf.id)
                    fm.range.low, fm.range.high = to_bytes(s[0]), to_bytes(s[1])
            elif mf.match_type == M.OPTIONAL:
                if s[1]:
                    te.match.add(field_id=mf.id).optional.value = to_bytes(s[0])
        if e.member is not None:
            te.action.action_profile_member_id = e.member
        elif e.group is not None:
            te.action.action_profile_group_id = e.group
        elif e.call is not None:
            self._encode_action(te.action.action, e.call)
        if with_counters and ti.direct_counter_id:
            te.counter_data.packet_count, te.counter_data.byte_count = e.packet_count, e.byte_count
        if with_meter and e.meter is not None and e.meter.configured:
            (cir, cb), (pir, pb) = e.meter.get_rates()
            te.meter_config.cir, te.meter_config.cburst = int(cir * 1e6), cb
            te.meter_config.pir, te.meter_config.pburst = int(pir * 1e6), pb
        te.idle_timeout_ns = e.idle_timeout_ns
        te.metadata = e.metadata
        te.is_const = ti.is_const
        return te

    def _encode_action(self, out: Any, call: ActionCall) -> None:
        assert self.index is not None
        ai = next(a for a in self.index.actions.values() if a.json_id == call.action_id)
        out.action_id = ai.id
        for pi, v in zip(ai.params, call.params, strict=True):
            out.params.add(param_id=pi.id, value=to_bytes(v))

    def _read_table_entry(self, req: Any) -> list[Any]:
        assert self.index is not None
        tables = [self._table(req.table_id)] if req.table_id else list(self.index.tables.values())
        with_counters = req.HasField("counter_data")
        with_meter = req.HasField("meter_config")
        out = []
        for ti in tables:
            if req.is_default_action:
                te = p4r.TableEntry(table_id=ti.id, is_default_action=True)
                if ti.table.default is not None:
                    self._encode_action(te.action.action, ti.table.default)
                out.append(p4r.Entity(table_entry=te))
                continue
            if len(req.match):
                e = ti.table.find(self._spec(ti, req.match), req.priority)
                entries = [e] if e is not None else []
            else:
                entries = list(ti.table.entries.values())
            for e in entries:
                out.append(p4r.Entity(table_entry=self._encode_entry(ti, e, with_counters,
                                                                     with_meter)))
        return out

    def _read_action_profile_member(self, req: Any) -> list[Any]:
        assert self.index is not None
        pids = [req.action_profile_id] if req.action_profile_id else list(self.index.profiles)
        out = []
        for pid in pids:
            prof = self._profile(pid)
            for mid, call in sorted(prof.members.items()):
                if req.member_id and mid != req.member_id:
                    continue
                m = p4r.ActionProfileMember(action_profile_id=pid, member_id=mid)
                self._encode_action(m.action, call)
                out.append(p4r.Entity(action_profile_member=m))
        return out

    def _read_action_profile_group(self, req: Any) -> list[Any]:
        assert self.index is not None
        pids = [req.action_profile_id] if req.action_profile_id else list(self.index.profiles)
        out = []
        for pid in pids:
            prof = self._profile(pid)
            for gid, grp in sorted(prof.groups.items()):
                if req.group_id and gid != req.group_id:
                    continue
                g = p4r.ActionProfileGroup(action_profile_id=pid, group_id=gid,
                                           max_size=grp.max_size)
                for mid, w in grp.weights.items():
                    g.members.add(member_id=mid, weight=w)
                out.append(p4r.Entity(action_profile_group=g))
        return out

    def _read_counter_entry(self, req: Any) -> list[Any]:
        assert self.index is not None
        ids = [req.counter_id] if req.counter_id else list(self.index.counters)
        out = []
        for cid in ids:
            arr = self.index.counters.get(cid)
            if arr is None:
                raise RpcError("NOT_FOUND", f"no counter with id {cid}")
            idxs = [req.index.index] if req.HasField("index") else range(arr.size)
            for i in idxs:
                if not 0 <= i < arr.size:
                    raise RpcError("OUT_OF_RANGE", f"{arr.name}: index {i} out of range")
                ce = p4r.CounterEntry(counter_id=cid)
                ce.index.index = i
                ce.data.packet_count, ce.data.byte_count = arr.packets[i], arr.bytes[i]
                out.append(p4r.Entity(counter_entry=ce))
        return out

    def _read_direct_counter_entry(self, req: Any) -> list[Any]:
        assert self.index is not None
        tid = req.table_entry.table_id
        tables = [self._table(tid)] if tid else [t for t in self.index.tables.values()
                                                 if t.direct_counter_id]
        out = []
        for ti in tables:
            if len(req.table_entry.match):
                e = ti.table.find(self._spec(ti, req.table_entry.match), req.table_entry.priority)
                entries = [e] if e else []
            else:
                entries = list(ti.table.entries.values())
            for e in entries:
                dce = p4r.DirectCounterEntry()
                dce.table_entry.CopyFrom(self._encode_entry(ti, e, False, False))
                dce.data.packet_count, dce.data.byte_count = e.packet_count, e.byte_count
                out.append(p4r.Entity(direct_counter_entry=dce))
        return out

    def _read_meter_entry(self, req: Any) -> list[Any]:
        assert self.index is not None
        ids = [req.meter_id] if req.meter_id else list(self.index.meters)
        out = []
        for mid in ids:
            arr = self.index.meters.get(mid)
            if arr is None:
                raise RpcError("NOT_FOUND", f"no meter with id {mid}")
            idxs = [req.index.index] if req.HasField("index") else range(arr.size)
            for i in idxs:
                me = p4r.MeterEntry(meter_id=mid)
                me.index.index = i
                rates = arr.meter(i).get_rates()
                if rates:
                    (cir, cb), (pir, pb) = rates
                    me.config.cir, me.config.cburst = int(cir * 1e6), cb
                    me.config.pir, me.config.pburst = int(pir * 1e6), pb
                out.append(p4r.Entity(meter_entry=me))
        return out

    def _read_register_entry(self, req: Any) -> list[Any]:
        assert self.index is not None
        ids = [req.register_id] if req.register_id else list(self.index.registers)
        out = []
        for rid in ids:
            arr = self.index.registers.get(rid)
            if arr is None:
                raise RpcError("NOT_FOUND", f"no register with id {rid}")
            idxs = [req.index.index] if req.HasField("index") else range(arr.size)
            for i in idxs:
                if not 0 <= i < arr.size:
                    raise RpcError("OUT_OF_RANGE", f"{arr.name}: index {i} out of range")
                re_ = p4r.RegisterEntry(register_id=rid)
                re_.index.index = i
                re_.data.bitstring = to_bytes(arr.values[i])
                out.append(p4r.Entity(register_entry=re_))
        return out

    def _read_value_set_entry(self, req: Any) -> list[Any]:
        assert self.index is not None
        out = []
        ids = [req.value_set_id] if req.value_set_id else list(self.index.value_sets)
        for vid in ids:
            vs = self.index.value_sets.get(vid)
            info = self.index.value_set_info.get(vid)
            if vs is None or info is None:
                raise RpcError("NOT_FOUND", f"no value set with id {vid}")
            vse = p4r.ValueSetEntry(value_set_id=vid)
            widths = [mf.bitwidth for mf in info.match]
            for padded in sorted(vs.values):
                member = vse.members.add()
                shift = sum(8 * ((w + 7) // 8) for w in widths)
                for mf, w in zip(info.match, widths, strict=True):
                    shift -= 8 * ((w + 7) // 8)
                    member.match.add(field_id=mf.id).exact.value = to_bytes(
                        (padded >> shift) & ((1 << w) - 1))
            out.append(p4r.Entity(value_set_entry=vse))
        return out

    def _read_packet_replication_engine_entry(self, req: Any) -> list[Any]:
        out = []
        sw = self.switch
        which = req.WhichOneof("type")
        if which in (None, "multicast_group_entry"):
            want = req.multicast_group_entry.multicast_group_id if which else 0
            for gid, replicas in sorted(sw.mcast_groups.items()):
                if gid >= CLONE_MGID_BASE or (want and gid != want):
                    continue
                pre = p4r.PacketReplicationEngineEntry()
                pre.multicast_group_entry.multicast_group_id = gid
                for port, rid in replicas:
                    pre.multicast_group_entry.replicas.add(egress_port=port, instance=rid)
                out.append(p4r.Entity(packet_replication_engine_entry=pre))
        if which in (None, "clone_session_entry"):
            want = req.clone_session_entry.session_id if which else 0
            for sid, s in sorted(sw.clone_sessions.items()):
                if want and sid != want:
                    continue
                pre = p4r.PacketReplicationEngineEntry()
                c = pre.clone_session_entry
                c.session_id, c.class_of_service, c.packet_length_bytes = sid, s.cos, s.truncate
                if s.port is not None:
                    c.replicas.add(egress_port=s.port, instance=0)
                for port, rid in sw.mcast_groups.get(s.mgid or -1, []):
                    c.replicas.add(egress_port=port, instance=rid)
                out.append(p4r.Entity(packet_replication_engine_entry=pre))
        return out

    def _read_digest_entry(self, req: Any) -> list[Any]:
        out = []
        for did, st in sorted(self.digests.items()):
            if req.digest_id and did != req.digest_id:
                continue
            de = p4r.DigestEntry(digest_id=did)
            de.config.CopyFrom(st.config)
            out.append(p4r.Entity(digest_entry=de))
        return out


def serve(service: P4RuntimeService, address: str, max_workers: int = 16,
          also: tuple[Callable[[grpc.Server], None], ...] = ()) -> grpc.Server:
    """Start a gRPC server for `service` on `address` (host:port); `also` registers more
    services on the same server before it starts."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers,
                                                    thread_name_prefix="p4rt"),
                         options=[("grpc.max_receive_message_length", 64 * 2**20),
                                  ("grpc.max_send_message_length", 64 * 2**20)])
    p4r_grpc.add_P4RuntimeServicer_to_server(service, server)
    for register in also:
        register(server)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server


def parse_p4info_text(text: str) -> p4i.P4Info:
    return text_format.Parse(text, p4i.P4Info())
