"""StreamChannel: arbitration (the highest election id is primary; the others are backups and
may not write), packet-in / packet-out through the CPU port with the P4Info
`controller_packet_metadata`, and digests with acks (and the digest entities that configure
them)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
from finsy.proto import p4r, rpc_code

from testbed.switch.p4runtime.codec import (
    MAX_PACKET_OUT,
    MAX_STREAM_BACKLOG,
    RpcError,
    code_int,
    election,
    to_bytes,
    to_int,
)

if TYPE_CHECKING:
    from testbed.switch.p4runtime.service import P4RuntimeService

log = logging.getLogger("xingmai.switch.p4runtime")

U = p4r.Update
# Digest data sent and not yet acked, per digest: beyond it new data is dropped and counted
# (a controller that never acks must not make the switch remember every packet it saw).
MAX_PENDING_DIGESTS = 4096


@dataclass
class Client:
    stream_id: int
    queue: queue.Queue[p4r.StreamMessageResponse | None]
    election_id: int | None = None
    role: str = ""
    peer: str = ""
    # whether the stream has sent its MasterArbitrationUpdate: before it, the stream is told
    # nothing (its first arbitration message must answer its own update)
    arbitrated: bool = False
    # whether the stream's RPC is still open (its gRPC context's): a controller that closed
    # its stream is gone before this server's thread for it has ended
    active: Callable[[], bool] = lambda: True


@dataclass
class DigestState:
    config: Any
    pending: dict[tuple[int, ...], float] = field(default_factory=dict)  # data -> sent at
    lists: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)  # list id -> data


class Streams:
    def __init__(self, svc: P4RuntimeService, max_streams: int):
        self.svc = svc
        self.max_streams = max_streams
        self.clients: dict[int, Client] = {}
        self._next_stream = 1
        self.digests: dict[int, DigestState] = {}
        self._digest_list_id = 0

    # ---- arbitration ----

    def primary(self, role: str = "") -> Client | None:
        best = None
        for c in self.clients.values():
            if c.role == role and c.election_id is not None:
                if best is None or c.election_id > (best.election_id or 0):
                    best = c
        return best

    def check_primary(self, device_id: int, eid: Any, role: str = "") -> None:
        if device_id != self.svc.device_id:
            raise RpcError(
                "NOT_FOUND", f"device {device_id} unknown (this is {self.svc.device_id})"
            )
        with self.svc.lock:
            p = self.primary(role)
            if p is None or p.election_id != election(eid):
                raise RpcError("PERMISSION_DENIED", "not the primary controller for this device")

    def _arbitration_msg(self, client: Client, role: str) -> p4r.StreamMessageResponse:
        p = self.primary(role)
        msg = p4r.StreamMessageResponse()
        arb = msg.arbitration
        arb.device_id = self.svc.device_id
        if role:
            arb.role.name = role
        if p is not None and p.election_id is not None:
            arb.election_id.high = p.election_id >> 64
            arb.election_id.low = p.election_id & (2**64 - 1)
        if client is p:
            arb.status.code = rpc_code.OK
            arb.status.message = "is primary"
        else:
            arb.status.code = rpc_code.ALREADY_EXISTS
            arb.status.message = "is backup"
        return msg

    def _notify_all(self, role: str) -> None:
        for c in self.clients.values():
            if c.arbitrated and c.role == role:
                c.queue.put(self._arbitration_msg(c, role))

    def _arbitrate(self, client: Client, req: p4r.MasterArbitrationUpdate) -> None:
        if req.device_id != self.svc.device_id:
            raise RpcError("NOT_FOUND", f"device {req.device_id} unknown")
        role = req.role.name if req.HasField("role") else ""
        eid = election(req.election_id) if req.HasField("election_id") else None
        with self.svc.lock:
            for other in list(self.clients.values()):
                if (
                    other is not client
                    and other.role == role
                    and eid is not None
                    and other.election_id == eid
                ):
                    if other.active():
                        raise RpcError("INVALID_ARGUMENT", f"election id {eid} is already in use")
                    # a controller back on a new stream while its closed one is still being
                    # torn down: the closed one is gone, not a second holder of the id
                    self.clients.pop(other.stream_id, None)
                    other.queue.put(None)
            old_primary = self.primary(role)
            client.role, client.election_id, client.arbitrated = role, eid, True
            new_primary = self.primary(role)
            if new_primary is not old_primary:
                log.info(
                    "primary for role %r is now stream %s (election id %s)",
                    role,
                    new_primary.stream_id if new_primary else None,
                    eid,
                )
                self._notify_all(role)
            else:
                client.queue.put(self._arbitration_msg(client, role))

    def channel(
        self, request_iterator: Iterator[p4r.StreamMessageRequest], context: Any
    ) -> Iterator[p4r.StreamMessageResponse]:
        with self.svc.lock:
            if len(self.clients) >= self.max_streams:
                # each stream holds a server thread: beyond this many, Write and Read would
                # find none left
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"at most {self.max_streams} streams at once",
                )
            client = Client(
                self._next_stream, queue.Queue(), peer=context.peer(), active=context.is_active
            )
            self._next_stream += 1
            self.clients[client.stream_id] = client

        def reader() -> None:
            try:
                for req in request_iterator:
                    kind = req.WhichOneof("update")
                    try:
                        if kind == "arbitration":
                            self._arbitrate(client, req.arbitration)
                        elif client.election_id is None:
                            raise RpcError(
                                "FAILED_PRECONDITION", "send a MasterArbitrationUpdate first"
                            )
                        elif kind == "packet":
                            self._packet_out(client, req.packet)
                        elif kind == "digest_ack":
                            self._digest_ack(req.digest_ack)
                    except RpcError as exc:
                        err = p4r.StreamMessageResponse()
                        err.error.canonical_code = code_int(exc.code)
                        err.error.message = exc.message
                        if kind == "packet":
                            err.error.packet_out.packet_out.CopyFrom(req.packet)
                        client.queue.put(err)
                        if kind == "arbitration":
                            break
            except grpc.RpcError:
                pass
            except Exception:  # a bug here must end this stream only, said in the log
                log.exception("stream %d failed", client.stream_id)
            finally:
                client.queue.put(None)

        threading.Thread(target=reader, name=f"p4rt-stream-{client.stream_id}", daemon=True).start()
        try:
            while True:
                msg = client.queue.get()
                if msg is None:
                    break
                yield msg
        finally:
            self._close(client)

    def _close(self, client: Client) -> None:
        """A stream ended: if it was the primary, the others of its role hear who is now."""
        with self.svc.lock:
            was_primary = self.primary(client.role) is client
            self.clients.pop(client.stream_id, None)
            if was_primary:
                self._notify_all(client.role)

    # ---- packet I/O ----

    def _packet_out(self, client: Client, pkt: p4r.PacketOut) -> None:
        svc = self.svc
        counters = svc.counters
        with svc.lock:
            if self.primary(client.role) is not client:
                counters["packet_out_dropped"] += 1
                raise RpcError("PERMISSION_DENIED", "packet-out from a backup controller")
            idx = svc.index
        if idx is None:
            counters["packet_out_dropped"] += 1
            raise RpcError("FAILED_PRECONDITION", "no pipeline")
        if svc.switch.cpu_port is None:
            counters["packet_out_dropped"] += 1
            raise RpcError("FAILED_PRECONDITION", "the switch has no CPU port")
        if len(pkt.payload) > MAX_PACKET_OUT:
            counters["packet_out_dropped"] += 1
            raise RpcError("INVALID_ARGUMENT", f"packet-out over {MAX_PACKET_OUT} bytes")
        header = b""
        if idx.packet_out is not None:
            given = {m.metadata_id: m.value for m in pkt.metadata}
            value, nbits = 0, 0
            try:
                for mid, name, width in idx.packet_out.fields:
                    if mid not in given:
                        raise RpcError("INVALID_ARGUMENT", f"packet-out lacks metadata {name!r}")
                    value = (value << width) | to_int(given.pop(mid), width, f"metadata {name}")
                    nbits += width
                if given:
                    raise RpcError(
                        "INVALID_ARGUMENT", f"unknown packet-out metadata ids {list(given)}"
                    )
            except RpcError:
                counters["packet_out_dropped"] += 1
                raise
            pad = -nbits % 8
            header = (value << pad).to_bytes((nbits + pad) // 8, "big")
        counters["packet_out"] += 1
        svc.inject(svc.switch.cpu_port, header + bytes(pkt.payload))

    def _deliver(self, client: Client, msg: p4r.StreamMessageResponse, what: str) -> bool:
        """Queue data for a stream; a stream that does not read loses it, counted."""
        if client.queue.qsize() >= MAX_STREAM_BACKLOG:
            self.svc.counters[f"{what}_dropped"] += 1
            return False
        client.queue.put(msg)
        return True

    def packet_in(self, data: bytes) -> None:
        """A packet the pipeline sent to the CPU port: deliver it to the primary controller."""
        svc = self.svc
        idx = svc.index
        with svc.lock:
            primary = self.primary("")
        if primary is None or idx is None:
            svc.counters["packet_in_dropped"] += 1
            return
        msg = p4r.StreamMessageResponse()
        payload = data
        if idx.packet_in is not None:
            n = idx.packet_in.nbytes
            if len(data) < n:
                svc.counters["packet_in_dropped"] += 1
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
        if self._deliver(primary, msg, "packet_in"):
            svc.counters["packet_in"] += 1

    # ---- digests ----

    def on_digest(self, learn_id: int, name: str, values: tuple[int, ...]) -> None:
        svc = self.svc
        idx = svc.index
        if idx is None or learn_id not in idx.digest_by_learn:
            return
        did = idx.digest_by_learn[learn_id]
        with svc.lock:
            st = self.digests.get(did)
            primary = self.primary("")
            if st is None or primary is None:
                svc.counters["digests_dropped"] += 1
                return
            now = time.monotonic()
            ack_timeout = (st.config.ack_timeout_ns or 0) / 1e9
            sent_at = st.pending.get(values)
            if sent_at is not None and (ack_timeout == 0 or now - sent_at < ack_timeout):
                return  # not acked yet: the spec forbids sending the same data again
            if sent_at is None and len(st.pending) >= MAX_PENDING_DIGESTS:
                svc.counters["digests_dropped"] += 1
                return
            msg = p4r.StreamMessageResponse()
            self._digest_list_id += 1
            msg.digest.digest_id = did
            msg.digest.list_id = self._digest_list_id
            msg.digest.timestamp = time.time_ns()
            member = msg.digest.data.add()
            for v in values:
                member.struct.members.add().bitstring = to_bytes(v)
            if not self._deliver(primary, msg, "digests"):
                return
            st.pending[values] = now
            st.lists[self._digest_list_id] = [values]
            svc.counters["digests_sent"] += 1

    def _digest_ack(self, ack: p4r.DigestListAck) -> None:
        with self.svc.lock:
            st = self.digests.get(ack.digest_id)
            if st is None:
                return
            for values in st.lists.pop(ack.list_id, []):
                st.pending.pop(values, None)


class DigestEntries:
    def __init__(self, svc: P4RuntimeService, streams: Streams):
        self.svc = svc
        self.streams = streams

    def write(self, utype: int, de: p4r.DigestEntry) -> None:
        digests = self.streams.digests
        if de.digest_id not in self.svc.idx.digests:
            raise RpcError("NOT_FOUND", f"no digest with id {de.digest_id}")
        exists = de.digest_id in digests
        if utype == U.INSERT and exists:
            raise RpcError("ALREADY_EXISTS", "digest already configured")
        if utype != U.INSERT and not exists:
            raise RpcError("NOT_FOUND", "digest not configured")
        if utype == U.DELETE:
            del digests[de.digest_id]
            return
        c = de.config
        if c.max_timeout_ns < 0 or c.max_list_size < 0 or c.ack_timeout_ns < 0:
            raise RpcError("INVALID_ARGUMENT", "digest config values must not be negative")
        digests[de.digest_id] = DigestState(c)

    def read(self, req: p4r.DigestEntry) -> list[p4r.Entity]:
        out = []
        for did, st in sorted(self.streams.digests.items()):
            if req.digest_id and did != req.digest_id:
                continue
            de = p4r.DigestEntry(digest_id=did)
            de.config.CopyFrom(st.config)
            out.append(p4r.Entity(digest_entry=de))
        return out
