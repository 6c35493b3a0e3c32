"""Queue rates and depths of the scaled switch model, on either target.

P4Runtime has no say over the traffic manager. The built-in switch takes queue settings over its
`SwitchAdmin` gRPC service (controller/proto/switch.proto, same port as P4Runtime); bmv2 takes
them over Thrift, through `simple_switch_CLI` (`set_queue_rate` in packets per second,
`set_queue_depth` in packets), which is how bmv2's own tools do it.

Every egress port of the model drains at its emulated speed (model speed / scale): that is
what makes queues build, and INT report real occupancy, when the offered load exceeds a link.
"""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
from dataclasses import dataclass

import grpc

from controller.config import Config, SwitchConfig
from controller.topology import Topology
from controller.wire.pfc import MIN_FRAME

log = logging.getLogger("xingmai.controller.queues")

# SwitchAdmin's limit on a queue's depth in packets (switch.proto's SetQueueRequest; the
# built-in switch's traffic manager checks it, tests/test_controller_queues.py that they agree)
MAX_DEPTH_PACKETS = 1 << 16


@dataclass(frozen=True)
class QueueSetting:
    port: int
    rate_bps: float
    depth_bytes: int
    depth_packets: int


def queue_settings(cfg: Config, topo: Topology, sw: SwitchConfig) -> list[QueueSetting]:
    """Each port's rate and depth. bmv2 counts packets only: its depth is the model's
    `queue_depth_packets` (the byte depth in full frames). The built-in switch counts bytes:
    its packet limit is the byte depth in the smallest frames, so that it never binds before
    the bytes do (a full-frame count would drop a queue of data interleaved with ACKs, CNPs
    and reports far below its byte depth, and under PFC, whose thresholds are sized in bytes
    against that depth, a lossless scheme would drop)."""
    m = cfg.model
    packets = m.queue_depth_packets
    if sw.kind != "bmv2":
        packets = max(packets, min(MAX_DEPTH_PACKETS, math.ceil(m.queue_depth_bytes / MIN_FRAME)))
    return [
        QueueSetting(p.port, topo.port_speed_bps(sw.name, p.port), m.queue_depth_bytes, packets)
        for p in sw.ports
    ]


def buffer_setting(cfg: Config, sw: SwitchConfig) -> tuple[int, float]:
    """The switch's shared buffer, bytes (0: static queue depths), and its alpha: its ports'
    shares of the model's buffer."""
    m = cfg.model
    return m.shared_buffer_bytes_per_port * len(sw.ports), m.buffer_alpha


class QueueError(RuntimeError):
    pass


async def apply_builtin(
    sw: SwitchConfig,
    settings: list[QueueSetting],
    credentials: grpc.ChannelCredentials | None,
    timeout: float,
    election_id: int,
    buffer: tuple[int, float] = (0, 1.0),
) -> None:
    """Through SwitchAdmin on the switch's gRPC address, as the primary controller (the
    switch takes queue changes from the P4Runtime primary's election id only): each port's
    queue, then the buffer (shared, or static depths)."""
    from controller.proto import switch_pb2, switch_pb2_grpc

    # A subchannel of this channel's own: gRPC shares subchannels process-wide, and the one
    # to a switch that just came back may still sit in its reconnect backoff from the
    # downtime, failing every call fast (the restarted switch was then left unqueued).
    options = [("grpc.use_local_subchannel_pool", 1)]
    if credentials is not None:
        channel = grpc.aio.secure_channel(sw.grpc_addr, credentials, options=options)
    else:
        channel = grpc.aio.insecure_channel(sw.grpc_addr, options=options)
    eid = switch_pb2.ElectionId(high=election_id >> 64, low=election_id & (2**64 - 1))
    try:
        stub = switch_pb2_grpc.SwitchAdminStub(channel)
        for s in settings:
            req = switch_pb2.SetQueueRequest(
                port=s.port,
                rate_bps=s.rate_bps,
                depth_bytes=s.depth_bytes,
                depth_packets=s.depth_packets,
                device_id=sw.device_id,
                election_id=eid,
            )
            try:
                await stub.SetQueue(req, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                raise QueueError(
                    f"{sw.name}: SwitchAdmin.SetQueue port {s.port}: "
                    f"{exc.code().name} {exc.details()}"
                ) from None
        shared, alpha = buffer
        breq = switch_pb2.SetBufferRequest(
            shared_bytes=shared, alpha=alpha, device_id=sw.device_id, election_id=eid
        )
        try:
            await stub.SetBuffer(breq, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise QueueError(
                f"{sw.name}: SwitchAdmin.SetBuffer: {exc.code().name} {exc.details()}"
            ) from None
    finally:
        await channel.close()


def bmv2_commands(settings: list[QueueSetting], mean_packet_bytes: int) -> str:
    """simple_switch_CLI input: rates in packets/s (bmv2's unit), depths in packets."""
    lines = []
    for s in settings:
        pps = max(1, round(s.rate_bps / (8 * mean_packet_bytes)))
        lines.append(f"set_queue_rate {pps} {s.port}")
        lines.append(f"set_queue_depth {s.depth_packets} {s.port}")
    return "\n".join(lines) + "\n"


async def apply_bmv2(
    sw: SwitchConfig, settings: list[QueueSetting], mean_packet_bytes: int, timeout: float
) -> None:
    cli = shutil.which("simple_switch_CLI")
    if cli is None:
        raise QueueError(
            f"{sw.name}: simple_switch_CLI is not on PATH (bmv2's queue rates are set over Thrift)"
        )
    host = sw.grpc_addr.rpartition(":")[0] or "127.0.0.1"
    proc = await asyncio.create_subprocess_exec(
        cli,
        "--thrift-ip",
        host,
        "--thrift-port",
        str(sw.thrift_port),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(
            proc.communicate(bmv2_commands(settings, mean_packet_bytes).encode()),
            timeout=max(timeout, 5.0),
        )
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise QueueError(f"{sw.name}: simple_switch_CLI did not finish") from None
    text = out.decode(errors="replace")
    if proc.returncode != 0 or "Error" in text or "Could not connect" in text:
        raise QueueError(f"{sw.name}: simple_switch_CLI failed: {text.strip()[-300:]}")


async def apply_queues(
    cfg: Config,
    topo: Topology,
    sw: SwitchConfig,
    credentials: grpc.ChannelCredentials | None = None,
) -> None:
    settings = queue_settings(cfg, topo, sw)
    timeout = cfg.controller.rpc_timeout_s
    buffer = buffer_setting(cfg, sw)
    if sw.kind == "bmv2":
        if buffer[0]:
            log.warning(
                "bmv2 has no shared buffer: its queues keep their static depths",
                extra={"switch": sw.name},
            )
        await apply_bmv2(sw, settings, cfg.model.mean_packet_bytes, timeout)
    else:
        await apply_builtin(sw, settings, credentials, timeout, cfg.controller.election_id, buffer)
    log.info("queues set", extra={"switch": sw.name, "ports": len(settings)})
