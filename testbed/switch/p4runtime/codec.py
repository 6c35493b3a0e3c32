"""What every P4Runtime handler of the built-in switch shares: the error type (a gRPC status
name and a message), P4Runtime's canonical byte strings, and the server's bounds."""

from __future__ import annotations

from typing import Any

import grpc

API_VERSION = "1.4.1"
# Clone sessions with several replicas use a multicast group from this private range.
CLONE_MGID_BASE = 0x10000
# Bounds on what a client may make the switch hold (P4Runtime leaves them to the target).
MAX_REPLICAS = 1024  # per multicast group or clone session
MAX_CLONE_SESSIONS = 4096
MAX_RID = 0xFFFF  # v1model's egress_rid is 16 bits
MAX_COS = 7  # v1model's priority is 3 bits
MAX_METER_RATE = 1 << 50  # per second: far above 400G in bytes, and exact as a double
MAX_METER_BURST = (1 << 32) - 1  # bmv2's burst sizes are 32-bit
MAX_PACKET_OUT = 65535  # the largest frame a port sends
MAX_STREAM_BACKLOG = 4096  # packet-ins and digests queued for one slow stream

_CODES = {
    name: getattr(grpc.StatusCode, name)
    for name in (
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
    )
}


class RpcError(Exception):
    """A request the server refuses: `code` is a gRPC status name, as the spec gives it."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def grpc_code(name: str) -> grpc.StatusCode:
    return _CODES.get(name, grpc.StatusCode.UNKNOWN)


def code_int(name: str) -> int:
    return int(grpc_code(name).value[0])


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


def election(eid: Any) -> int:
    return (eid.high << 64) | eid.low


def meter_rates(cfg: Any) -> list[tuple[float, int]]:
    """A MeterConfig as the switch's meters take it: (rate per microsecond, burst), committed
    then peak. Refused when the target could not hold it or read it back exactly."""
    for name in ("cir", "cburst", "pir", "pburst"):
        if getattr(cfg, name) < 0:
            raise RpcError("INVALID_ARGUMENT", f"meter {name} must not be negative")
    for name in ("cir", "pir"):
        if getattr(cfg, name) > MAX_METER_RATE:
            raise RpcError(
                "OUT_OF_RANGE",
                f"meter {name} {getattr(cfg, name)} is over {MAX_METER_RATE} per second",
            )
    for name in ("cburst", "pburst"):
        if getattr(cfg, name) > MAX_METER_BURST:
            raise RpcError(
                "OUT_OF_RANGE", f"meter {name} {getattr(cfg, name)} is over {MAX_METER_BURST}"
            )
    if cfg.cir > cfg.pir:
        raise RpcError("INVALID_ARGUMENT", "meter cir must not exceed pir")
    # P4Runtime rates are per second; bmv2's per microsecond.
    return [(cfg.cir / 1e6, cfg.cburst), (cfg.pir / 1e6, cfg.pburst)]


def encode_meter(out: Any, rates: list[tuple[float, int]]) -> None:
    """The inverse of meter_rates, into a MeterConfig (rounded: a rate divided by 1e6 and
    multiplied back is not always the integer it was)."""
    (cir, cb), (pir, pb) = rates
    out.cir, out.cburst = round(cir * 1e6), cb
    out.pir, out.pburst = round(pir * 1e6), pb
