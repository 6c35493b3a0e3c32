"""The P4Runtime service: each RPC, and the entity handlers Write and Read dispatch to.

Errors are gRPC statuses with the P4Runtime spec's codes; a failed update in a batch is
reported per update in the status details, as the spec prescribes. A request the handlers did
not foresee is answered INTERNAL and logged, never left to gRPC's UNKNOWN.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, Protocol

import grpc
from finsy.proto import p4i, p4r, p4r_grpc, rpc_code, rpc_status
from google.protobuf import any_pb2, text_format

from testbed.switch.p4info import P4InfoIndex
from testbed.switch.p4runtime.codec import API_VERSION, RpcError, code_int, grpc_code
from testbed.switch.p4runtime.indexed import KINDS, IndexedEntities
from testbed.switch.p4runtime.pipeline import Pipeline
from testbed.switch.p4runtime.profiles import ActionProfileGroups, ActionProfileMembers
from testbed.switch.p4runtime.replication import Replication
from testbed.switch.p4runtime.stream import DigestEntries, Streams
from testbed.switch.p4runtime.table_entries import DirectCounters, DirectMeters, TableEntries
from testbed.switch.p4runtime.value_sets import ValueSets
from testbed.switch.tables import ActionCall, TableError
from testbed.switch.v1model import V1Switch

log = logging.getLogger("xingmai.switch.p4runtime")

DEFAULT_WORKERS = 16
READ_CHUNK = 500  # entities per ReadResponse


class EntityHandler(Protocol):
    def write(self, utype: int, msg: Any) -> None: ...

    def read(self, msg: Any) -> list[p4r.Entity]: ...


class P4RuntimeService(p4r_grpc.P4RuntimeServicer):  # type: ignore[misc]
    """The P4Runtime server state machine, independent of the transport (testable in process).
    `max_streams` bounds the open StreamChannels: each holds one of the server's threads."""

    def __init__(
        self,
        switch: V1Switch,
        device_id: int = 0,
        inject: Callable[[int, bytes], None] | None = None,
        max_streams: int = DEFAULT_WORKERS // 2,
    ):
        self.switch = switch
        self.device_id = device_id
        self.inject = inject or self._inject_inline
        self.lock = threading.RLock()
        self.index: P4InfoIndex | None = None
        self.p4info: p4i.P4Info | None = None
        self.cookie = 0
        self.initial_defaults: dict[str, ActionCall | None] = {}
        self.counters = {
            "packet_in": 0,
            "packet_in_dropped": 0,
            "packet_out": 0,
            "packet_out_dropped": 0,
            "digests_sent": 0,
            "digests_dropped": 0,
            "write_errors": 0,
            "internal_errors": 0,
        }
        self.streams = Streams(self, max_streams)
        self.pipeline = Pipeline(self)
        tables = TableEntries(self)
        self.handlers: dict[str, EntityHandler] = {
            "table_entry": tables,
            "direct_counter_entry": DirectCounters(self, tables),
            "direct_meter_entry": DirectMeters(self, tables),
            "action_profile_member": ActionProfileMembers(self, tables),
            "action_profile_group": ActionProfileGroups(self, tables),
            "packet_replication_engine_entry": Replication(self),
            "value_set_entry": ValueSets(self),
            "digest_entry": DigestEntries(self, self.streams),
            **{kind: IndexedEntities(self, kind) for kind in KINDS},
        }
        switch.on_digest = self.streams.on_digest

    @property
    def idx(self) -> P4InfoIndex:
        """The pipeline's index; the RPCs check that there is one before any handler runs."""
        assert self.index is not None
        return self.index

    def _inject_inline(self, port: int, data: bytes) -> None:
        self.switch.receive(port, data)
        self.switch.service()

    # kept as methods: the switch's launcher, the admin service and tests use them
    def primary(self, role: str = "") -> Any:
        return self.streams.primary(role)

    def packet_in(self, data: bytes) -> None:
        self.streams.packet_in(data)

    def install(self, info: p4i.P4Info, device_config: bytes, cookie: int) -> None:
        self.pipeline.install(info, device_config, cookie)

    def _internal(self, context: Any, what: str, exc: Exception) -> None:
        self.counters["internal_errors"] += 1
        log.exception("internal error in %s", what)
        context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    # ---- StreamChannel ----

    def StreamChannel(
        self, request_iterator: Iterator[p4r.StreamMessageRequest], context: Any
    ) -> Iterator[p4r.StreamMessageResponse]:
        return self.streams.channel(request_iterator, context)

    # ---- pipeline, capabilities ----

    def SetForwardingPipelineConfig(
        self, request: p4r.SetForwardingPipelineConfigRequest, context: Any
    ) -> p4r.SetForwardingPipelineConfigResponse:
        try:
            self.pipeline.set(request)
        except RpcError as exc:
            context.abort(grpc_code(exc.code), exc.message)
        except Exception as exc:
            self._internal(context, "SetForwardingPipelineConfig", exc)
        return p4r.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(
        self, request: p4r.GetForwardingPipelineConfigRequest, context: Any
    ) -> p4r.GetForwardingPipelineConfigResponse:
        try:
            return self.pipeline.get(request)
        except RpcError as exc:
            context.abort(grpc_code(exc.code), exc.message)
        raise AssertionError("unreachable")

    def Capabilities(
        self, request: p4r.CapabilitiesRequest, context: Any
    ) -> p4r.CapabilitiesResponse:
        return p4r.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    # ---- Write ----

    def Write(self, request: p4r.WriteRequest, context: Any) -> p4r.WriteResponse:
        try:
            self.streams.check_primary(request.device_id, request.election_id, request.role)
            if self.index is None:
                raise RpcError("FAILED_PRECONDITION", "no pipeline configured")
            if request.atomicity != p4r.WriteRequest.CONTINUE_ON_ERROR:
                raise RpcError("UNIMPLEMENTED", "only CONTINUE_ON_ERROR atomicity")
        except RpcError as exc:
            context.abort(grpc_code(exc.code), exc.message)
        errors = self.write_updates(list(request.updates))
        if any(e is not None for e in errors):
            self.counters["write_errors"] += 1
            status = rpc_status.Status(code=rpc_code.UNKNOWN, message="write failed")
            for e in errors:
                err = p4r.Error(
                    canonical_code=rpc_code.OK if e is None else code_int(e.code),
                    message="" if e is None else e.message,
                )
                packed = any_pb2.Any()
                packed.Pack(err)
                status.details.append(packed)
            context.set_trailing_metadata(
                (("grpc-status-details-bin", status.SerializeToString()),)
            )
            first = next(e for e in errors if e is not None)
            context.abort(grpc.StatusCode.UNKNOWN, first.message)
        return p4r.WriteResponse()

    def write_updates(self, updates: list[p4r.Update]) -> list[RpcError | None]:
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
                except Exception as exc:  # a case no handler foresaw: the update fails alone
                    self.counters["internal_errors"] += 1
                    log.exception("internal error writing %s", upd.entity.WhichOneof("entity"))
                    out.append(RpcError("INTERNAL", f"{type(exc).__name__}: {exc}"))
        return out

    def _write_one(self, utype: int, entity: p4r.Entity) -> None:
        U = p4r.Update
        if utype not in (U.INSERT, U.MODIFY, U.DELETE):
            raise RpcError("INVALID_ARGUMENT", "update type must be INSERT, MODIFY or DELETE")
        kind = entity.WhichOneof("entity")
        handler = self.handlers.get(kind) if kind is not None else None
        if kind is None or handler is None:
            raise RpcError("UNIMPLEMENTED", f"writing {kind} is not supported")
        handler.write(utype, getattr(entity, kind))

    # ---- Read ----

    def Read(self, request: p4r.ReadRequest, context: Any) -> Iterator[p4r.ReadResponse]:
        entities: list[p4r.Entity] = []
        try:
            if request.device_id != self.device_id:
                raise RpcError("NOT_FOUND", f"device {request.device_id} unknown")
            if self.index is None:
                raise RpcError("FAILED_PRECONDITION", "no pipeline configured")
            with self.switch.lock, self.lock:
                entities = [e for ent in request.entities for e in self.read_entity(ent)]
        except RpcError as exc:
            context.abort(grpc_code(exc.code), exc.message)
        except TableError as exc:
            context.abort(grpc_code(exc.code), str(exc))
        except Exception as exc:
            self._internal(context, "Read", exc)
        for i in range(0, len(entities), READ_CHUNK):
            yield p4r.ReadResponse(entities=entities[i : i + READ_CHUNK])

    def read_entity(self, ent: p4r.Entity) -> list[p4r.Entity]:
        kind = ent.WhichOneof("entity")
        handler = self.handlers.get(kind) if kind is not None else None
        if kind is None or handler is None:
            raise RpcError("UNIMPLEMENTED", f"reading {kind} is not supported")
        return handler.read(getattr(ent, kind))


def serve(
    service: P4RuntimeService,
    address: str,
    max_workers: int = DEFAULT_WORKERS,
    also: tuple[Callable[[grpc.Server], None], ...] = (),
) -> grpc.Server:
    """Start a gRPC server for `service` on `address` (host:port); `also` registers more
    services on the same server before it starts. The port is this server's alone: gRPC's
    default SO_REUSEPORT would let a second switch bind it and take some of the clients."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="p4rt"),
        options=[
            ("grpc.max_receive_message_length", 64 * 2**20),
            ("grpc.max_send_message_length", 64 * 2**20),
            ("grpc.so_reuseport", 0),
        ],
    )
    p4r_grpc.add_P4RuntimeServicer_to_server(service, server)
    for register in also:
        register(server)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address}: {exc}") from exc
    if bound == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server


def parse_p4info_text(text: str) -> p4i.P4Info:
    return text_format.Parse(text, p4i.P4Info())
