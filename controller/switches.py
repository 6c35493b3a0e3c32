"""One P4Runtime connection per switch, kept up with backoff, and the switch kept programmed.

A `SwitchSession` connects with finsy (asyncio), bids for mastership with the configured
election id (a second controller configured with a lower id stays a backup: it reads, never
writes, and takes over when the primary goes away), lets finsy push the pipeline only when the
switch's cookie differs, then reconciles the switch's state with the config (read back, diff,
write the difference: controller.reconcile), sets the queue rates and depths, and polls the
port counters for the collector. A switch that refuses, drops or never answers the connection
is retried with exponential backoff; nothing it does stops the other switches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import finsy as fy
import grpc

from controller import p4names as P
from controller import program
from controller.collector import Collector
from controller.config import Config, SwitchConfig, TlsConfig
from controller.queues import QueueError, apply_queues
from controller.reconcile import apply, diff, read_state
from controller.topology import Topology

log = logging.getLogger("xingmai.controller.switch")

BACKOFF_FIRST_S = 0.25
STABLE_AFTER_S = 5.0  # a connection that lasted this long resets the backoff


def tls_credentials(tls: TlsConfig | None) -> fy.GRPCCredentialsTLS | None:
    if tls is None:
        return None
    return fy.GRPCCredentialsTLS(cacert=tls.ca, cert=tls.cert, private_key=tls.key)


def qdepth_unit_bytes(status: Any, mean_packet_bytes: int) -> int:
    """Bytes per unit of a built-in switch's queue depth, from its SwitchAdmin GetStatus:
    bytes, cells of the size it reports, or packets (of the model's mean size)."""
    if status.queue_depth_unit == "bytes":
        return 1
    if status.queue_depth_unit == "cells" and status.queue_depth_cell_bytes:
        return int(status.queue_depth_cell_bytes)
    return mean_packet_bytes


@dataclass
class SwitchHealth:
    connected: bool = False
    primary: bool = False
    programmed: bool = False
    queues_set: bool = False
    connects: int = 0
    last_error: str = ""
    entries: int = 0
    written: int = 0
    write_failures: int = 0
    reconciles: int = 0
    last_reconcile: float = 0.0  # unix time
    last_plan: dict[str, int] = field(default_factory=dict)
    packet_ins: dict[int, int] = field(default_factory=dict)  # by reason


class SwitchSession:
    def __init__(self, cfg: Config, topo: Topology, sw: SwitchConfig, collector: Collector | None):
        self.cfg = cfg
        self.topo = topo
        self.sw = sw
        self.collector = collector
        self.health = SwitchHealth()
        self.switch: fy.Switch | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._down = asyncio.Event()
        self._qdepth_unit: int | None = None
        self._retry: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.sw.name

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"switch:{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _options(self) -> fy.SwitchOptions:
        c = self.cfg
        pipe = c.pipeline_of(self.sw)
        return fy.SwitchOptions(
            p4info=pipe.p4info,
            p4blob=pipe.bmv2_json,
            device_id=self.sw.device_id,
            initial_election_id=c.controller.election_id,
            channel_credentials=tls_credentials(c.controller.p4runtime_tls),
            ready_handler=self._on_ready,
        )

    # ---- connection loop ----

    async def _run(self) -> None:
        backoff = BACKOFF_FIRST_S
        while True:
            started = time.monotonic()
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one switch's failure must never stop the daemon
                self.health.last_error = f"{type(exc).__name__}: {exc}"[:500]
                log.warning(
                    "switch session ended",
                    extra={"switch": self.name, "error": self.health.last_error},
                )
            finally:
                # A switch that comes back may have restarted empty: until this controller
                # programs it again over the new session it is neither programmed nor queued.
                self.health.connected = False
                self.health.primary = False
                self.health.programmed = False
                self.health.queues_set = False
            if time.monotonic() - started >= STABLE_AFTER_S:
                backoff = BACKOFF_FIRST_S
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.cfg.controller.reconnect_max_s)

    async def _session(self) -> None:
        sw = fy.Switch(self.name, self.sw.grpc_addr, self._options())
        self._down = asyncio.Event()
        sw.ee.on(fy.SwitchEvent.CHANNEL_DOWN, lambda _sw: self._down.set())
        # A switch that accepts TCP but never answers must not hang the session forever.
        timeout = max(5.0, 4 * self.cfg.controller.rpc_timeout_s)
        # set before entering: finsy may call the ready handler before __aenter__ returns
        self.switch = sw
        try:
            async with asyncio.timeout(timeout):
                await sw.__aenter__()
        except TimeoutError:
            self.switch = None
            raise ConnectionError(f"no P4Runtime answer within {timeout:g} s") from None
        except BaseException:
            self.switch = None
            raise
        self.health.connected = True
        self.health.connects += 1
        log.info(
            "switch connected",
            extra={"switch": self.name, "primary": sw.is_primary, "addr": self.sw.grpc_addr},
        )
        helpers = [
            asyncio.create_task(self._poll_counters(sw), name=f"counters:{self.name}"),
            asyncio.create_task(self._packet_ins(sw), name=f"packet-in:{self.name}"),
        ]
        try:
            await self._down.wait()
            raise ConnectionError("P4Runtime channel went down")
        finally:
            if self._retry is not None:
                helpers.append(self._retry)
                self._retry = None
            for t in helpers:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            self.switch = None
            with contextlib.suppress(Exception):
                await sw.__aexit__(None, None, None)

    async def _on_ready(self, sw: fy.Switch) -> None:
        """finsy calls this when the pipeline is in place, and again on a mastership change."""
        self.health.primary = sw.is_primary
        if not sw.is_primary:
            log.info(
                "switch: backup (another controller is primary)",
                extra={"switch": self.name, "primary_id": sw.primary_id},
            )
            return
        if not await self._program():
            self._start_retry()

    async def _program(self) -> bool:
        """Entries, then queue settings. True when both are in place."""
        return await self.reconcile() and await self.set_queues()

    def _start_retry(self) -> None:
        """A switch that refused a write or a queue setting is tried again with backoff for
        as long as this session is up and primary, instead of staying half-programmed."""
        if self._retry is None or self._retry.done():
            self._retry = asyncio.create_task(self._retry_program(), name=f"program:{self.name}")

    async def _retry_program(self) -> None:
        backoff = BACKOFF_FIRST_S
        while self.switch is not None and self.switch.is_primary:
            await asyncio.sleep(backoff)
            if self.switch is None or not self.switch.is_primary or await self._program():
                return
            backoff = min(backoff * 2, self.cfg.controller.reconnect_max_s)

    # ---- programming ----

    async def _detect_qdepth_unit(self) -> int:
        """Bytes per unit of the target's queue depth."""
        if self.sw.kind == "bmv2":
            return self.cfg.model.mean_packet_bytes  # bmv2 counts packets
        from controller.proto import switch_pb2, switch_pb2_grpc

        creds = tls_credentials(self.cfg.controller.p4runtime_tls)
        channel = (
            grpc.aio.secure_channel(self.sw.grpc_addr, creds.to_client_credentials())
            if creds
            else grpc.aio.insecure_channel(self.sw.grpc_addr)
        )
        try:
            st = await switch_pb2_grpc.SwitchAdminStub(channel).GetStatus(
                switch_pb2.GetStatusRequest(), timeout=self.cfg.controller.rpc_timeout_s
            )
        finally:
            await channel.close()
        return qdepth_unit_bytes(st, self.cfg.model.mean_packet_bytes)

    async def reconcile(self) -> bool:
        """Bring the switch to the config. True when every write succeeded."""
        sw = self.switch
        if sw is None or not sw.is_primary:
            return False
        async with self._lock:
            timeout = max(30.0, 10 * self.cfg.controller.rpc_timeout_s)
            try:
                async with asyncio.timeout(timeout):
                    if self._qdepth_unit is None:
                        self._qdepth_unit = await self._detect_qdepth_unit()
                    state = await read_state(sw, [P.TBL_SWITCH_CONFIG, P.TBL_REPORT_COLLECTOR])
                    desired = program.build(
                        self.cfg, self.topo, self.sw, sw.p4info, state, self._qdepth_unit
                    )
                    plan = diff(desired.encode(sw.p4info), state.entities)
                    res = await apply(sw, plan) if not plan.empty else None
            except (TimeoutError, fy.P4ClientError, grpc.RpcError, ValueError) as exc:
                self.health.programmed = False
                self.health.last_error = f"reconcile: {type(exc).__name__}: {exc}"[:500]
                log.error(
                    "reconcile failed", extra={"switch": self.name, "error": self.health.last_error}
                )
                return False
            h = self.health
            h.reconciles += 1
            h.last_reconcile = time.time()
            h.entries = len(state.entities)
            h.last_plan = plan.summary()
            if res is not None:
                h.written += res.written
                h.write_failures += res.failed
                if res.errors:
                    h.last_error = "; ".join(res.errors[:3])[:500]
            h.programmed = res is None or res.failed == 0
            log.info(
                "reconciled",
                extra={"switch": self.name, **plan.summary(), "failed": res.failed if res else 0},
            )
            return h.programmed

    async def set_queues(self) -> bool:
        try:
            await apply_queues(
                self.cfg, self.topo, self.sw, _grpc_creds(self.cfg.controller.p4runtime_tls)
            )
            self.health.queues_set = True
        except (QueueError, OSError, grpc.RpcError) as exc:
            self.health.queues_set = False
            self.health.last_error = f"queues: {exc}"[:500]
            log.error("setting queues failed", extra={"switch": self.name, "error": str(exc)})
        return self.health.queues_set

    async def reload(self, cfg: Config, topo: Topology, sw: SwitchConfig) -> None:
        """A new config: reconnect if the switch's identity changed, else re-program the
        difference."""
        old = (
            self.sw.grpc_addr,
            self.sw.device_id,
            self.sw.kind,
            self.cfg.controller.election_id,
            self.cfg.pipeline_of(self.sw),
            self.cfg.controller.p4runtime_tls,
        )
        new = (
            sw.grpc_addr,
            sw.device_id,
            sw.kind,
            cfg.controller.election_id,
            cfg.pipeline_of(sw),
            cfg.controller.p4runtime_tls,
        )
        changed = old != new
        self.cfg, self.topo, self.sw = cfg, topo, sw
        self._qdepth_unit = None
        if changed:
            await self.stop()
            self.start()
            return
        if not await self._program():
            self._start_retry()

    # ---- packet-ins ----

    async def _packet_ins(self, sw: fy.Switch) -> None:
        """Packet-ins, counted by reason; INT packets a sink could not report go to the
        collector (only the primary receives packet-ins)."""
        async for pkt in sw.read_packets():
            try:
                reason = int(pkt[P.PKTIN_REASON])
                port = int(pkt[P.PKTIN_INGRESS_PORT])
            except (KeyError, TypeError, ValueError):
                reason, port = 0, 0  # not a packet-in header we know
            self.health.packet_ins[reason] = self.health.packet_ins.get(reason, 0) + 1
            if reason == program.PUNT_REPORT_UNSENT and self.collector is not None:
                self.collector.ingest_punted(self.sw.node_id, port, pkt.payload)

    # ---- counters ----

    async def _poll_counters(self, sw: fy.Switch) -> None:
        """Port tx byte counters → link utilisation in the collector (primary or backup)."""
        if self.collector is None:
            return
        ports = {p.port for p in self.sw.ports}
        if not ports:
            return  # no port of the switch's to read
        reader: Any = sw
        while True:
            await asyncio.sleep(self.cfg.controller.counter_poll_s)
            try:
                async with asyncio.timeout(max(2.0, self.cfg.controller.rpc_timeout_s)):
                    now = time.monotonic()
                    # the switch's ports only, not the counter's 512 cells
                    wanted = [fy.P4CounterEntry(P.CTR_PORT_TX, index=p) for p in sorted(ports)]
                    async for ent in reader.read(wanted):
                        if ent.index in ports and ent.data is not None:
                            self.collector.port_counter(
                                self.name, ent.index, ent.data.byte_count, now=now
                            )
            except (TimeoutError, fy.P4ClientError, grpc.RpcError) as exc:
                log.debug("counter poll failed", extra={"switch": self.name, "error": str(exc)})


def _grpc_creds(tls: TlsConfig | None) -> grpc.ChannelCredentials | None:
    c = tls_credentials(tls)
    return c.to_client_credentials() if c is not None else None
