"""The fuzzed surfaces by name (each made when its run starts: some need root or files)."""

from __future__ import annotations

from collections.abc import Callable

from tests.fuzz.harness import Surface


def _p4runtime() -> Surface:
    from tests.fuzz.p4runtime import P4RuntimeSurface

    return P4RuntimeSurface()


def _switch_admin() -> Surface:
    from tests.fuzz.p4runtime import SwitchAdminSurface

    return SwitchAdminSurface()


def _collector() -> Surface:
    from tests.fuzz.telemetry import CollectorSurface

    return CollectorSurface()


def _agent() -> Surface:
    from tests.fuzz.agent import AgentSurface

    return AgentSurface()


def _packets() -> Surface:
    from tests.fuzz.packets import PacketPathSurface

    return PacketPathSurface()


def _transport() -> Surface:
    from tests.fuzz.transport import TransportSurface

    return TransportSurface()


SURFACES: dict[str, Callable[[], Surface]] = {
    "p4runtime": _p4runtime,
    "switch_admin": _switch_admin,
    "report_decoder_and_collector": _collector,
    "agent_api": _agent,
    "switch_packet_path": _packets,
    "transport_packet_handler": _transport,
}


def unavailable(name: str) -> str | None:
    if name == "agent_api":
        from tests.fuzz.agent import available

        return available()
    return None
