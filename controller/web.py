"""The controller's fabric page: the fabric drawn as a graph (links coloured by utilisation and
queue), the active flows, the switches' health and the suspects, served over HTTP.

    GET /             the page (controller/fabric_page.html; it polls the JSON below)
    GET /api/fabric   the page's data

The data is the controller's gRPC API, not a second view of the daemon: `/api/fabric` calls the
`Controller` service's own handlers (GetTopology, GetTelemetry, ListFlows, ListSwitches,
GetStatus, GetSuspects) in
process and returns their answers as JSON (protobuf field names), so what the page shows is
exactly what a gRPC client reads. Every number the page draws is also a Prometheus metric of
the controller (`controller.metrics`; the page's legend names them).

The server is a small asyncio HTTP/1.1 responder (GET and HEAD, one request per connection,
bounded request size and time): the page needs no framework, and it runs in the daemon's event
loop, so it reads the daemon's state without locks. Bind it to a loopback or management
address (`controller.web_addr`): it has no authentication.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf.json_format import MessageToDict

from controller.proto import controller_pb2 as pb

if TYPE_CHECKING:
    from controller.daemon import Daemon

log = logging.getLogger("xingmai.controller.web")

PAGE = Path(__file__).with_name("fabric_page.html")
MAX_REQUEST_BYTES = 8192
REQUEST_TIMEOUT_S = 5.0


def _dict(msg: Any) -> dict[str, Any]:
    return MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


async def fabric_state(daemon: Daemon) -> dict[str, Any]:
    """The page's data: the gRPC API's answers, plus the scales the colours are drawn on."""
    from controller.service import ControllerService

    svc = ControllerService(daemon)
    cfg = daemon.cfg
    return {
        "t_unix": time.time(),
        "controller": cfg.controller.name,
        "topology": _dict(await svc.GetTopology(pb.GetTopologyRequest(), None)),
        "telemetry": _dict(await svc.GetTelemetry(pb.GetTelemetryRequest(max_points=0), None)),
        "flows": _dict(await svc.ListFlows(pb.ListFlowsRequest(), None))["flows"],
        "switches": _dict(await svc.ListSwitches(pb.ListSwitchesRequest(), None))["switches"],
        "status": _dict(await svc.GetStatus(pb.GetStatusRequest(), None)),
        # the localizer's current suspects, ranked, and the links failed over
        **{
            k: v
            for k, v in _dict(await svc.GetSuspects(pb.GetSuspectsRequest(), None)).items()
            if k in ("suspects", "dead_links")
        },
        # queue colours: below ECN's kmin green, at kmax and above red (the config's marking)
        "scales": {"queue_kmin_bytes": cfg.ecn.kmin_bytes, "queue_kmax_bytes": cfg.ecn.kmax_bytes},
    }


class WebServer:
    """The page and its data on HOST:PORT, in the running event loop."""

    def __init__(self, daemon: Daemon):
        self.daemon = daemon
        self.requests = 0
        self.errors = 0
        self._server: asyncio.Server | None = None

    async def start(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        self._server = await asyncio.start_server(
            self._serve, host or "127.0.0.1", int(port), limit=MAX_REQUEST_BYTES
        )

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = b""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            status, ctype, body = await self._answer(head)
        except (asyncio.LimitOverrunError, ValueError):
            self.errors += 1
            status, ctype, body = (
                "431 Request Header Fields Too Large",
                "text/plain",
                b"request too large\n",
            )
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            self.errors += 1
            writer.close()
            return
        method = head.split(b" ", 1)[0]
        self.requests += 1
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n".encode()
        )
        if method != b"HEAD":
            writer.write(body)
        try:
            await writer.drain()
        except ConnectionError:
            self.errors += 1
        writer.close()

    async def _answer(self, head: bytes) -> tuple[str, str, bytes]:
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return "400 Bad Request", "text/plain", b"bad request line\n"
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return "405 Method Not Allowed", "text/plain", b"GET or HEAD only\n"
        if target in (b"/", b"/index.html"):
            return "200 OK", "text/html; charset=utf-8", PAGE.read_bytes()
        if target == b"/api/fabric":
            try:
                state = await fabric_state(self.daemon)
            except Exception as exc:  # the page must not take the daemon down
                log.exception("fabric state failed")
                self.errors += 1
                return "500 Internal Server Error", "text/plain", f"{exc!r}\n".encode()
            return "200 OK", "application/json", json.dumps(state).encode()
        return "404 Not Found", "text/plain", b"not found\n"
