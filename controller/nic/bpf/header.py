"""Read constants out of ebpf/xingmai.h, so Python takes them from the one C declaration.

Only the simple forms the header uses: `#define NAME <integer>` (with U/L suffixes, or a
parenthesised `(1ULL << N)`-style shift of integers), `enum name { A = 0, B, ... };`, the
`BPF_TABLE_PINNED(..., name, ...)` and `XM_RINGBUF_PINNED(name, ...)` map declarations, and
structs of scalar fields (`__u8` to `__u64`), for a reader without bcc.
"""

from __future__ import annotations

import functools
import re
import struct
from pathlib import Path

# the NIC's C: ebpf/ in a clone, or the copy an installed package carries (setup.py)
_CLONE_EBPF = Path(__file__).resolve().parents[3] / "ebpf"
_PACKAGED_EBPF = Path(__file__).resolve().parents[1] / "_ebpf"
EBPF_DIR = _CLONE_EBPF if _CLONE_EBPF.is_dir() else _PACKAGED_EBPF
HEADER = EBPF_DIR / "xingmai.h"  # constants, enums and structs shared with Python
MAPS_HEADER = EBPF_DIR / "lib" / "maps.h"  # the map declarations

_INT = r"(?:0[xX][0-9a-fA-F]+|\d+)[uUlL]*"
_TERM = rf"(?:{_INT}|XM_\w+)"
_DEFINE = re.compile(
    rf"^#define\s+(XM_\w+)\s+\(?({_TERM})(?:\s*<<\s*({_TERM}))?\)?\s*(?:/\*.*)?$", re.M
)


def _int(literal: str, known: dict[str, int] | None = None) -> int:
    if known is not None and literal in known:
        return known[literal]
    return int(literal.rstrip("uUlL"), 0)


@functools.lru_cache(maxsize=4)
def _text(path: Path = HEADER) -> str:
    return path.read_text()


def headers() -> list[Path]:
    """xingmai.h and every ebpf/lib/*.h: where the NIC's constants are declared."""
    return [HEADER, *sorted((EBPF_DIR / "lib").glob("*.h"))]


def defines(paths: list[Path] | None = None) -> dict[str, int]:
    """Every integer `#define XM_*` of the NIC's headers (a name defined twice is an error)."""
    out: dict[str, int] = {}
    for path in paths if paths is not None else headers():
        for name, value, shift in _DEFINE.findall(_text(path)):
            if name in out:
                raise ValueError(f"{name} is defined twice in the NIC's headers ({path})")
            out[name] = _int(value, out) << (_int(shift, out) if shift else 0)
    return out


def enum(name: str, path: Path = HEADER) -> dict[str, int]:
    """The members of `enum <name>` in order, with their values."""
    m = re.search(rf"enum\s+{name}\s*\{{(.*?)\}};", _text(path), re.S)
    if m is None:
        raise KeyError(f"enum {name} not in {path}")
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    out: dict[str, int] = {}
    value = 0
    for item in body.split(","):
        item = item.strip()
        if not item:
            continue
        member, _, explicit = item.partition("=")
        if explicit.strip():
            value = _int(explicit.strip())
        out[member.strip()] = value
        value += 1
    return out


_TABLE = r"BPF_TABLE_PINNED\(\s*\"\w+\"\s*,[^;]*?,\s*(xm_\w+)\s*,"
_RINGBUF = r"XM_RINGBUF_PINNED\(\s*(xm_\w+)\s*,"


def pinned_maps(path: Path = MAPS_HEADER) -> tuple[str, ...]:
    """Names of the maps the header declares (tables and ring buffers), in declaration
    order."""
    found = re.finditer(f"{_TABLE}|{_RINGBUF}", _text(path), re.S)
    return tuple(m.group(1) or m.group(2) for m in found)


def ring_buffers(path: Path = MAPS_HEADER) -> tuple[str, ...]:
    """Names of the ring buffers the header declares (XM_RINGBUF_PINNED)."""
    return tuple(re.findall(_RINGBUF, _text(path)))


_SCALARS = {"__u8": "B", "__u16": "H", "__u32": "I", "__u64": "Q", "__s32": "i", "__s64": "q"}


def struct_layout(name: str, path: Path = HEADER) -> tuple[tuple[str, ...], struct.Struct]:
    """`struct <name>`'s field names and its bytes as the compiler lays them out (each field
    at its natural alignment, the whole padded to the largest), for a struct of scalars."""
    names, _, fmt = _layout(name, path)
    return names, struct.Struct(fmt)


def struct_offsets(name: str, path: Path = HEADER) -> dict[str, tuple[int, int]]:
    """Each field of `struct <name>` (as `struct_layout` lays it out): (offset, size)."""
    names, offsets, fmt = _layout(name, path)
    sizes = [struct.calcsize("<" + c) for c in fmt[1:] if c != "x"]
    return {n: (o, s) for n, o, s in zip(names, offsets, sizes, strict=True)}


def _layout(name: str, path: Path) -> tuple[tuple[str, ...], tuple[int, ...], str]:
    """(field names, their offsets, the struct module's format) of `struct <name>`."""
    m = re.search(rf"struct\s+{name}\s*\{{(.*?)\}};", _text(path), re.S)
    if m is None:
        raise KeyError(f"struct {name} not in {path}")
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    names: list[str] = []
    offsets: list[int] = []
    fmt, offset, align = "<", 0, 1
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        f = re.fullmatch(r"(__[us]\d+)\s+(\w+)", decl)
        if f is None or f.group(1) not in _SCALARS:
            raise ValueError(f"struct {name}: {decl!r} is not a scalar field")
        code = _SCALARS[f.group(1)]
        size = struct.calcsize("<" + code)
        pad = -offset % size
        fmt += "x" * pad + code
        offsets.append(offset + pad)
        offset += pad + size
        align = max(align, size)
        names.append(f.group(2))
    fmt += "x" * (-offset % align)
    return tuple(names), tuple(offsets), fmt
