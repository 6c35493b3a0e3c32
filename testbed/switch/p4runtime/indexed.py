"""Indexed entities — counters, meters and registers — through one handler: the same id
lookup, the same index rule (one index, or every index when none is given; OUT_OF_RANGE
outside the array) and MODIFY-only writes. Only reading and writing one cell differ."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from finsy.proto import p4r

from testbed.switch.p4runtime.codec import (
    RpcError,
    encode_meter,
    meter_rates,
    to_bytes,
    to_int,
)

if TYPE_CHECKING:
    from testbed.switch.p4runtime.service import P4RuntimeService


@dataclass(frozen=True)
class _Kind:
    entity: str  # the Entity oneof name, e.g. "counter_entry"
    noun: str  # for messages
    id_field: str  # the message's id field, e.g. "counter_id"
    arrays: Callable[[P4RuntimeService], dict[int, Any]]
    # prepare(message) checks the request once and returns what write_cell needs
    prepare: Callable[[Any, Any], Any]
    write_cell: Callable[[Any, int, Any], None]
    read_cell: Callable[[Any, int, Any], None]  # (array, index, message to fill)


def _counter_prepare(ce: p4r.CounterEntry, arr: Any) -> tuple[int, int]:
    if ce.data.packet_count < 0 or ce.data.byte_count < 0:
        raise RpcError("INVALID_ARGUMENT", "counter data must not be negative")
    return ce.data.packet_count, ce.data.byte_count


def _counter_read(arr: Any, i: int, ce: p4r.CounterEntry) -> None:
    ce.data.packet_count, ce.data.byte_count = arr.packets[i], arr.bytes[i]


def _meter_prepare(me: p4r.MeterEntry, arr: Any) -> list[tuple[float, int]] | None:
    return meter_rates(me.config) if me.HasField("config") else None


def _meter_write(arr: Any, i: int, rates: list[tuple[float, int]] | None) -> None:
    if rates is None:
        arr.meters[i].reset()
    else:
        arr.meters[i].set_rates(rates)


def _meter_read(arr: Any, i: int, me: p4r.MeterEntry) -> None:
    rates = arr.meters[i].get_rates()
    if rates:
        encode_meter(me.config, rates)


def _register_prepare(re_: p4r.RegisterEntry, arr: Any) -> int:
    if re_.data.WhichOneof("data") != "bitstring":
        raise RpcError("INVALID_ARGUMENT", "register data must be a bitstring")
    return to_int(re_.data.bitstring, arr.bitwidth, arr.name)


def _register_read(arr: Any, i: int, re_: p4r.RegisterEntry) -> None:
    re_.data.bitstring = to_bytes(arr.values[i])


KINDS = {
    k.entity: k
    for k in (
        _Kind(
            "counter_entry",
            "counter",
            "counter_id",
            lambda s: s.idx.counters,
            _counter_prepare,
            lambda arr, i, v: arr.write(i, *v),
            _counter_read,
        ),
        _Kind(
            "meter_entry",
            "meter",
            "meter_id",
            lambda s: s.idx.meters,
            _meter_prepare,
            _meter_write,
            _meter_read,
        ),
        _Kind(
            "register_entry",
            "register",
            "register_id",
            lambda s: s.idx.registers,
            _register_prepare,
            lambda arr, i, v: arr.write(i, v),
            _register_read,
        ),
    )
}


class IndexedEntities:
    """The handler of one indexed kind (counters, meters or registers)."""

    def __init__(self, svc: P4RuntimeService, entity: str):
        self.svc = svc
        self.kind = KINDS[entity]

    def _array(self, oid: int) -> Any:
        arr = self.kind.arrays(self.svc).get(oid)
        if arr is None:
            raise RpcError("NOT_FOUND", f"no {self.kind.noun} with id {oid}")
        return arr

    @staticmethod
    def _indexes(msg: Any, arr: Any) -> range:
        if not msg.HasField("index"):
            return range(arr.size)
        i = msg.index.index
        if not 0 <= i < arr.size:
            raise RpcError("OUT_OF_RANGE", f"{arr.name}: index {i} out of range [0, {arr.size})")
        return range(i, i + 1)

    def write(self, utype: int, msg: Any) -> None:
        if utype != p4r.Update.MODIFY:
            raise RpcError("INVALID_ARGUMENT", f"{self.kind.noun}s can only be modified")
        arr = self._array(getattr(msg, self.kind.id_field))
        idxs = self._indexes(msg, arr)
        value = self.kind.prepare(msg, arr)
        for i in idxs:
            self.kind.write_cell(arr, i, value)

    def read(self, req: Any) -> list[p4r.Entity]:
        k = self.kind
        oid = getattr(req, k.id_field)
        ids = [oid] if oid else list(k.arrays(self.svc))
        out = []
        for aid in ids:
            arr = self._array(aid)
            for i in self._indexes(req, arr):
                msg = type(req)()
                setattr(msg, k.id_field, aid)
                msg.index.index = i
                k.read_cell(arr, i, msg)
                out.append(p4r.Entity(**{k.entity: msg}))
        return out
