"""A built-in switch in process, its P4Runtime and SwitchAdmin services on a loopback port, and
a client that holds the primary's stream: what the switch's hardening tests and fuzzers drive.

    with SwitchRig(XINGMAI_P4INFO, XINGMAI_JSON) as rig:
        rig.write(update)            # raises grpc.RpcError, with the per-update errors
        entities = rig.read(entity)
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from finsy.proto import p4r, p4r_grpc, rpc_status

from controller.common.ports import free_port
from controller.proto import switch_pb2, switch_pb2_grpc
from testbed.switch.admin import SwitchAdminService
from testbed.switch.p4runtime import P4RuntimeService, parse_p4info_text, serve
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import V1Switch

REPO = Path(__file__).resolve().parent.parent
XINGMAI_P4INFO = REPO / "p4src" / "build" / "xingmai.p4info.txtpb"
XINGMAI_JSON = REPO / "p4src" / "build" / "xingmai.json"
FEATURES_P4INFO = REPO / "tests" / "p4" / "build" / "switch_features.p4info.txtpb"
FEATURES_JSON = REPO / "tests" / "p4" / "build" / "switch_features.json"
CPU_PORT = 255


class SwitchRig:
    def __init__(
        self,
        p4info: Path | None = None,
        json: Path | None = None,
        device_id: int = 1,
        election_id: int = 10,
        dataplane: Any = None,
    ):
        self.sw = V1Switch(Clock(virtual=dataplane is None), device_id=device_id, cpu_port=CPU_PORT)
        self.out: list[tuple[int, bytes]] = []
        if dataplane is None:
            self.sw.transmit = lambda port, data: self.out.append((port, data))
        self.device_id = device_id
        self.election_id = election_id
        self.service = P4RuntimeService(self.sw, device_id)
        self.admin_service = SwitchAdminService(self.sw, dataplane, self.service)
        self.info = None
        if p4info is not None and json is not None:
            self.info = parse_p4info_text(p4info.read_text())
            self.service.install(self.info, json.read_bytes(), 0)
        self.addr = f"127.0.0.1:{free_port()}"
        self.server = serve(
            self.service,
            self.addr,
            also=(
                lambda srv: switch_pb2_grpc.add_SwitchAdminServicer_to_server(
                    self.admin_service, srv
                ),
            ),
        )
        self.channel = grpc.insecure_channel(self.addr)
        self.stub = p4r_grpc.P4RuntimeStub(self.channel)
        self.admin = switch_pb2_grpc.SwitchAdminStub(self.channel)
        self._requests: queue.Queue[p4r.StreamMessageRequest | None] = queue.Queue()
        self.responses: queue.Queue[p4r.StreamMessageResponse] = queue.Queue()
        self._stream = self.stub.StreamChannel(self._iter())
        threading.Thread(target=self._pump, daemon=True).start()
        self.arbitrate(election_id)

    def _iter(self) -> Iterator[p4r.StreamMessageRequest]:
        while True:
            req = self._requests.get()
            if req is None:
                return
            yield req

    def _pump(self) -> None:
        try:
            for msg in self._stream:
                self.responses.put(msg)
        except grpc.RpcError:
            pass

    def arbitrate(self, election_id: int) -> p4r.StreamMessageResponse:
        req = p4r.StreamMessageRequest()
        req.arbitration.device_id = self.device_id
        req.arbitration.election_id.high = election_id >> 64
        req.arbitration.election_id.low = election_id & (2**64 - 1)
        self._requests.put(req)
        while True:
            msg = self.responses.get(timeout=5)
            if msg.WhichOneof("update") == "arbitration":
                return msg

    # ---- P4Runtime ----

    def write_request(self, *updates: p4r.Update) -> p4r.WriteRequest:
        req = p4r.WriteRequest(device_id=self.device_id, updates=list(updates))
        req.election_id.high = self.election_id >> 64
        req.election_id.low = self.election_id & (2**64 - 1)
        return req

    def write(self, *updates: p4r.Update, timeout: float = 10) -> None:
        self.stub.Write(self.write_request(*updates), timeout=timeout)

    def read(self, *entities: p4r.Entity, timeout: float = 10) -> list[p4r.Entity]:
        req = p4r.ReadRequest(device_id=self.device_id, entities=list(entities))
        return [e for resp in self.stub.Read(req, timeout=timeout) for e in resp.entities]

    def election(self) -> switch_pb2.ElectionId:
        return switch_pb2.ElectionId(
            high=self.election_id >> 64, low=self.election_id & (2**64 - 1)
        )

    def set_queue(self, **kw: Any) -> None:
        """SwitchAdmin.SetQueue as the primary."""
        self.admin.SetQueue(
            switch_pb2.SetQueueRequest(device_id=self.device_id, election_id=self.election(), **kw),
            timeout=10,
        )

    # ---- names ----

    def id_of(self, kind: str, name: str) -> int:
        assert self.info is not None
        for obj in getattr(self.info, kind):
            if obj.preamble.name == name or obj.preamble.alias == name:
                return int(obj.preamble.id)
        raise KeyError(f"{kind} {name}")

    def close(self) -> None:
        self._requests.put(None)
        self.channel.close()
        self.server.stop(0)

    def __enter__(self) -> SwitchRig:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def update_errors(exc: grpc.RpcError) -> list[tuple[int, str]]:
    """The per-update (canonical code, message) pairs of a failed Write."""
    for key, value in exc.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == "grpc-status-details-bin":
            status = rpc_status.Status.FromString(value)
            out = []
            for d in status.details:
                err = p4r.Error()
                d.Unpack(err)
                out.append((err.canonical_code, err.message))
            return out
    return []


def update(kind: str, entity: p4r.Entity) -> p4r.Update:
    return p4r.Update(type=getattr(p4r.Update, kind), entity=entity)
