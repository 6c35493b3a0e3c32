"""Queue rates and depths of the scaled model: through SwitchAdmin on a built-in switch (in
process), and as simple_switch_CLI commands for bmv2 (a stand-in CLI records them)."""

from __future__ import annotations

import asyncio
import dataclasses
import stat
from pathlib import Path

import pytest

from controller.common.ports import free_port
from controller.config import load
from controller.proto import switch_pb2_grpc
from controller.queues import (
    MAX_DEPTH_PACKETS,
    QueueError,
    apply_queues,
    bmv2_commands,
    queue_settings,
)
from controller.topology import Topology
from testbed.switch.admin import SwitchAdminService
from testbed.switch.p4runtime import P4RuntimeService, serve
from testbed.switch.traffic_manager import MAX_DEPTH_PACKETS as TM_MAX_DEPTH_PACKETS
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import V1Switch

EXAMPLE = Path(__file__).parents[1] / "controller" / "examples" / "leafspine-2x2.yaml"


def test_settings_follow_the_scaled_model() -> None:
    cfg = load(EXAMPLE)
    topo = Topology(cfg)
    bmv2 = dataclasses.replace(cfg.switch("spine1"), kind="bmv2")
    s = queue_settings(cfg, topo, bmv2)
    assert [(q.port, q.rate_bps, q.depth_bytes, q.depth_packets) for q in s] == [
        (1, 100e6, 150_000, 128),
        (2, 100e6, 150_000, 128),
    ]
    assert bmv2_commands(s, 1000) == (
        "set_queue_rate 12500 1\nset_queue_depth 128 1\n"
        "set_queue_rate 12500 2\nset_queue_depth 128 2\n"
    )


def test_builtin_switch_packet_limit_never_binds_before_its_bytes() -> None:
    """The built-in switch counts bytes: its packet limit is the byte depth in 60-byte
    frames (150,000 / 60 = 2,500), so a queue of small frames is not full before its bytes
    are; bmv2's stays the model's full-frame count (above)."""
    cfg = load(EXAMPLE)
    s = queue_settings(cfg, Topology(cfg), cfg.switch("spine1"))
    assert cfg.switch("spine1").kind == "builtin"
    assert [q.depth_packets for q in s] == [2_500, 2_500]
    huge = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, queue_depth_bytes=1 << 30))
    deep = queue_settings(huge, Topology(huge), huge.switch("spine1"))
    assert {q.depth_packets for q in deep} == {MAX_DEPTH_PACKETS}
    assert MAX_DEPTH_PACKETS == TM_MAX_DEPTH_PACKETS  # the switch accepts what it is given


def test_builtin_switch_gets_rates_and_depths_over_switch_admin() -> None:
    cfg = load(EXAMPLE)
    sw = V1Switch(Clock(virtual=True), device_id=1, cpu_port=255)
    addr = f"127.0.0.1:{free_port()}"
    server = serve(P4RuntimeService(sw, 1), addr)
    switch_pb2_grpc.add_SwitchAdminServicer_to_server(SwitchAdminService(sw, None, None), server)
    try:
        spine = dataclasses.replace(cfg.switch("spine1"), grpc_addr=addr)
        asyncio.run(apply_queues(cfg, Topology(cfg), spine))
        for port in (1, 2):
            pq = sw.tm.ports[port]
            assert (pq.rate_bps, pq.depth_bytes, pq.depth_pkts) == (100e6, 150_000, 2_500)
    finally:
        server.stop(0)
    with pytest.raises(QueueError, match="SwitchAdmin.SetQueue port 1: UNAVAILABLE"):
        asyncio.run(apply_queues(cfg, Topology(cfg), spine))


def test_bmv2_switch_gets_simple_switch_cli_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    cfg = load(EXAMPLE)
    spine = dataclasses.replace(cfg.switch("spine1"), kind="bmv2", thrift_port=9091)
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there yet
    with pytest.raises(QueueError, match="simple_switch_CLI is not on PATH"):
        asyncio.run(apply_queues(cfg, Topology(cfg), spine))
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    cli = tmp_path / "simple_switch_CLI"
    rec = tmp_path / "recorded"
    cli.write_text(f"#!/bin/sh\necho \"$@\" > {rec}\ncat >> {rec}\necho 'RuntimeCmd: '\n")
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    asyncio.run(apply_queues(cfg, Topology(cfg), spine))
    lines = rec.read_text().splitlines()
    assert lines[0] == "--thrift-ip 127.0.0.1 --thrift-port 9091"
    assert lines[1:] == [
        "set_queue_rate 12500 1",
        "set_queue_depth 128 1",
        "set_queue_rate 12500 2",
        "set_queue_depth 128 2",
    ]
    cli.write_text("#!/bin/sh\ncat > /dev/null\necho 'Could not connect to thrift client'\n")
    with pytest.raises(QueueError, match="Could not connect"):
        asyncio.run(apply_queues(cfg, Topology(cfg), spine))
