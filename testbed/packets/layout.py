"""scapy fields made from the wire package's field tables (controller/wire/layout.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from scapy.fields import BitField, Field, XBitField

from controller.wire.layout import Fields

FieldMaker = Callable[[str, Any, int], Field[Any, Any]]


def scapy_fields(
    table: Fields,
    defaults: Mapping[str, Any] | None = None,
    *,
    hex_fields: frozenset[str] = frozenset(),
    special: Mapping[str, FieldMaker] | None = None,
) -> list[Any]:
    """One scapy field per table row, same name and width; `special` makes the named ones
    (e.g. an enum field for an opcode), `hex_fields` print in hex."""
    defaults = defaults or {}
    special = special or {}
    out: list[Any] = []  # scapy types fields_desc as a list of fields and containers
    for name, width in table:
        default = defaults.get(name, 0)
        if name in special:
            out.append(special[name](name, default, width))
        elif name in hex_fields:
            out.append(XBitField(name, default, width))
        else:
            out.append(BitField(name, default, width))
    return out
