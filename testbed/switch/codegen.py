"""Compile a bmv2 JSON program into Python functions, once, at load time.

Every parser state, action, conditional, table application, checksum and hash input list
becomes a small Python function whose source is generated here and compiled with `exec`. The
per-packet path therefore runs straight-line Python over lists (`h[header][field]`) instead of
walking the JSON tree. The generated source is kept (`Compiled.source`) for debugging.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from testbed.switch import hashes
from testbed.switch.externs import CounterArray, MeterArray, RegisterArray, ValueSet
from testbed.switch.packet import (
    Packet,
    ParserError,
    PipelineAbort,
    div_trunc,
    mod_trunc,
    sat_cast,
    two_comp_mod,
    usat_cast,
)
from testbed.switch.program import HeaderType, Json, LoadError, Program, hexint
from testbed.switch.tables import ActionCall, ActionProfile, Entry, MatchTable

log = logging.getLogger("xingmai.switch.p4")

DROP_PORT = 511


@dataclass
class E:
    """A generated expression: Python source, its kind, and what is known statically."""

    code: str
    kind: str  # d(ata) b(ool) h(eader) s(tack) u(nion) us (union stack) str calc obj vec
    htype: HeaderType | None = None  # for header kinds
    width: int = 0  # for data that is a field load or constant of known width
    signed: bool = False
    lvalue: tuple[str, int, HeaderType] | None = None  # (header code, field index, type)
    const: int | None = None  # value of a constant


@dataclass
class Compiled:
    """A program ready to run: entry points plus its stateful objects."""

    program: Program
    source: str
    parse: Callable[[Packet, bytes], int]
    verify_checksums: Callable[[Packet], bool]
    update_checksums: Callable[[Packet], None]
    deparse: Callable[[Packet], bytes]
    ingress: Callable[[Packet], None]
    egress: Callable[[Packet], None]
    new_packet: Callable[[], Packet]
    tables: dict[str, MatchTable]
    profiles: dict[str, ActionProfile]
    counters: dict[str, CounterArray]
    meters: dict[str, MeterArray]
    registers: dict[str, RegisterArray]
    value_sets: dict[str, ValueSet]
    actions: dict[int, Callable[[Packet, tuple[int, ...]], None]]
    digests: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)


class _Src:
    """Accumulates generated source with indentation."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, line: str, indent: int = 0) -> None:
        self.lines.append("    " * indent + line)

    def extend(self, lines: list[str], indent: int) -> None:
        for ln in lines:
            self.add(ln, indent)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _mask(width: int) -> int:
    return (1 << width) - 1


class Codegen:
    """Generates and compiles the Python code of one program."""

    def __init__(self, prog: Program, clock_us: Callable[[], int],
                 log_fn: Callable[[str], None] | None = None):
        self.prog = prog
        self.clock_us = clock_us
        self.src = _Src()
        self.tmp = 0
        self._idents: dict[str, str] = {}
        self.ns: dict[str, Any] = {
            "ParserError": ParserError,
            "PipelineAbort": PipelineAbort,
            "_tcm": two_comp_mod,
            "_usat": usat_cast,
            "_sat": sat_cast,
            "_div": div_trunc,
            "_mod": mod_trunc,
            "DROP_PORT": DROP_PORT,
            "_rand": random.Random(),
            "_log": log_fn or (lambda msg: log.info("%s", msg)),
        }
        # Stack slots: for each stack, per element, the header indexes that move with it.
        self.stack_slots: list[list[list[int]]] = []
        for st in prog.stacks:
            if st.name in prog.union_stacks:
                self.stack_slots.append([prog.unions[u].members for u in st.members])
            else:
                self.stack_slots.append([[m] for m in st.members])
        self.ns["STK"] = [st.members for st in prog.stacks]
        self.ns["SLOTS"] = self.stack_slots
        self.ns["UNIONS"] = [u.members for u in prog.unions]
        self.ns["UNION_OF"] = [hi.union for hi in prog.headers]
        self.ns["NFIELDS"] = [len(hi.htype.fields) for hi in prog.headers]
        self.ns["HNBYTES"] = [hi.htype.fixed_bits // 8 for hi in prog.headers]
        self._install_helpers()

    # ---- helpers available to generated code ---------------------------------------------

    def _install_helpers(self) -> None:
        ns = self.ns
        unions: list[list[int]] = ns["UNIONS"]
        union_of: list[int | None] = ns["UNION_OF"]
        stk: list[list[int]] = ns["STK"]
        slots = self.stack_slots
        nfields: list[int] = ns["NFIELDS"]

        def mkvalid(p: Packet, hidx: int) -> None:
            u = union_of[hidx]
            if u is not None:
                for m in unions[u]:
                    p.v[m] = False
            p.v[hidx] = True

        def last(p: Packet, sid: int) -> int:
            n = p.sn[sid]
            if n == 0:
                raise PipelineAbort(f"no valid element in stack {self.prog.stacks[sid].name}")
            return stk[sid][n - 1]

        def sidx(p: Packet, sid: int, i: int) -> int:
            members = stk[sid]
            if not 0 <= i < len(members):
                raise PipelineAbort(f"index {i} out of bounds of stack "
                                    f"{self.prog.stacks[sid].name}")
            return members[i]

        def swap(p: Packet, a: list[int], b: list[int]) -> None:
            h, v = p.h, p.v
            for x, y in zip(a, b, strict=True):
                h[x], h[y] = h[y], h[x]
                v[x], v[y] = v[y], v[x]
                if x in p.vlw or y in p.vlw:
                    wx, wy = p.vlw.pop(x, None), p.vlw.pop(y, None)
                    if wy is not None:
                        p.vlw[x] = wy
                    if wx is not None:
                        p.vlw[y] = wx

        def invalidate(p: Packet, hs: list[int]) -> None:
            for x in hs:
                p.v[x] = False

        def push(p: Packet, sid: int, num: int) -> None:
            # bmv2 StackP4_16::push_front
            if num <= 0:
                return
            el = slots[sid]
            size = len(el)
            p.sn[sid] = min(size, p.sn[sid] + num)
            for i in range(size - 1, num - 1, -1):
                swap(p, el[i], el[i - num])
            for i in range(min(size, num)):
                invalidate(p, el[i])

        def pop(p: Packet, sid: int, num: int) -> None:
            # bmv2 StackP4_16::pop_front
            if num <= 0:
                return
            el = slots[sid]
            size = len(el)
            p.sn[sid] -= min(p.sn[sid], num)
            i = 0
            if num < size:
                while i < size - num:
                    swap(p, el[i], el[i + num])
                    i += 1
            while i < size:
                invalidate(p, el[i])
                i += 1

        def heq(p: Packet, a: int, b: int) -> bool:
            return p.v[a] and p.v[b] and p.h[a] == p.h[b]

        def ueq(p: Packet, a: int, b: int) -> bool:
            ma, mb = unions[a], unions[b]
            for x, y in zip(ma, mb, strict=True):
                if p.v[x] != p.v[y] or (p.v[x] and p.h[x] != p.h[y]):
                    return False
            return True

        def uvalid(p: Packet, u: int) -> bool:
            return any(p.v[m] for m in unions[u])

        def assign_header(p: Packet, dst: int, src: int) -> None:
            if p.v[src]:
                mkvalid(p, dst)
                p.h[dst][:] = p.h[src]
                if src in p.vlw:
                    p.vlw[dst] = p.vlw[src]
            else:
                p.v[dst] = False

        def add_header(p: Packet, hidx: int) -> None:
            if not p.v[hidx]:
                p.h[hidx][:] = [0] * nfields[hidx]
                p.vlw.pop(hidx, None)
                mkvalid(p, hidx)
                p.plen += ns["HNBYTES"][hidx]

        def remove_header(p: Packet, hidx: int) -> None:
            if p.v[hidx]:
                p.v[hidx] = False
                p.plen -= ns["HNBYTES"][hidx] + p.vlw.get(hidx, 0) // 8

        def peek(buf: bytes, pos: int, offset: int, width: int) -> int:
            start = pos * 8 + offset
            first, last_b = start // 8, (start + width + 7) // 8
            chunk = buf[first:last_b].ljust(last_b - first, b"\x00")
            val = int.from_bytes(chunk, "big")
            return (val >> ((last_b - first) * 8 - (start % 8) - width)) & ((1 << width) - 1)

        def rng(lo: int, hi: int) -> int | None:
            return None if lo > hi else ns["_rand"].randint(lo, hi)

        def log_msg(fmt: str, values: list[int]) -> None:
            out, vals = [], iter(values)
            i = 0
            while i < len(fmt):
                if fmt.startswith("{}", i):
                    out.append(str(next(vals, "{}")))
                    i += 2
                else:
                    out.append(fmt[i])
                    i += 1
            ns["_log"]("".join(out).replace("\\{", "{").replace("\\}", "}"))

        ns.update(_mkvalid=mkvalid, _last=last, _sidx=sidx, _push=push, _pop=pop, _heq=heq,
                  _ueq=ueq, _uvalid=uvalid, _assign_header=assign_header,
                  _add_header=add_header, _remove_header=remove_header, _peek=peek, _rng=rng,
                  _log_msg=log_msg)

    def _plain(self, hidx: int) -> bool:
        """A header with fixed fields and no union: validity is a plain flag."""
        inst = self.prog.headers[hidx]
        return inst.union is None and inst.htype.vl_index is None

    def fresh(self, prefix: str = "_t") -> str:
        self.tmp += 1
        return f"{prefix}{self.tmp}"

    # ---- expressions -----------------------------------------------------------------------

    def field(self, hdr: str, fname: str) -> E:
        hidx, fidx = self.prog.field_ref(hdr, fname)
        if fidx < 0:
            return E(f"(1 if v[{hidx}] else 0)", "d", width=1)
        ht = self.prog.headers[hidx].htype
        _, w, s = ht.fields[fidx]
        return E(f"h[{hidx}][{fidx}]", "d", width=w, signed=s, lvalue=(str(hidx), fidx, ht))

    def ex(self, j: Json | None, parser: bool = False) -> E:
        if j is None:
            raise LoadError("missing expression operand")
        t = j.get("type")
        val: Any = j.get("value")
        if t == "expression":
            if isinstance(val, dict) and "op" in val:
                return self.op(val, parser)
            return self.ex(val, parser)
        if t == "field":
            return self.field(val[0], val[1])
        if t == "hexstr":
            n = hexint(val)
            return E(f"({n})" if n < 0 else str(n), "d", width=j.get("bitwidth", 0), const=n)
        if t == "bool":
            return E("True" if val else "False", "b")
        if t in ("header", "regular"):
            inst = self.prog.header(val)
            return E(str(inst.index), "h", htype=inst.htype)
        if t == "header_stack":
            st = self.prog.stack_by_name.get(val)
            if st is None:
                raise LoadError(f"unknown header stack {val!r}")
            return E(str(st.index), "s", htype=self.prog.header_types[st.htype_name])
        if t == "header_union":
            u = self.prog.union_by_name.get(val)
            if u is None:
                raise LoadError(f"unknown header union {val!r}")
            return E(str(u.index), "u")
        if t == "header_union_stack":
            st = self.prog.union_stacks.get(val)
            if st is None:
                raise LoadError(f"unknown header union stack {val!r}")
            return E(str(st.index), "us")
        if t == "stack_field":
            st = self.prog.stack_by_name.get(val[0])
            if st is None:
                raise LoadError(f"unknown header stack {val[0]!r}")
            ht = self.prog.header_types[st.htype_name]
            fidx = ht.field_index[val[1]]
            hcode = f"_last(p, {st.index})"
            _, w, s = ht.fields[fidx]
            return E(f"h[{hcode}][{fidx}]", "d", width=w, signed=s, lvalue=(hcode, fidx, ht))
        if t in ("local", "runtime_data"):
            return E(f"ad[{int(val)}]", "d")
        if t == "register":
            reg = self._register(val[0])
            idx = self.ex(val[1], parser).code
            return E(f"{reg}.values[{idx}]", "d")
        if t == "string":
            return E(repr(val), "str")
        if t == "calculation":
            return E(self._calculation(val), "calc")
        if t == "counter_array":
            return E(self._counter(val), "obj")
        if t == "meter_array":
            return E(self._meter(val), "obj")
        if t == "register_array":
            return E(self._register(val), "obj")
        if t == "lookahead":
            if not parser:
                raise LoadError("lookahead outside a parser")
            return E(f"_peek(buf, pos, {int(val[0])}, {int(val[1])})", "d", width=int(val[1]))
        if t == "parameters_vector":
            return E("[" + ", ".join(self.ex(x, parser).code for x in val) + "]", "vec")
        raise LoadError(f"unsupported expression type {t!r}")

    def cond(self, j: Json, parser: bool = False) -> str:
        e = self.ex(j, parser)
        return e.code if e.kind == "b" else f"({e.code} != 0)"

    def op(self, o: Json, parser: bool) -> E:
        op = o["op"]
        left: Any = o.get("left")
        right: Any = o.get("right")
        if op == "?":
            c = self.cond(o["cond"], parser)
            lt, rt = self.ex(left, parser), self.ex(right, parser)
            return E(f"({lt.code} if {c} else {rt.code})", lt.kind, lt.htype)
        if op in ("==", "!="):
            lt, rt = self.ex(left, parser), self.ex(right, parser)
            if lt.kind == "h":
                code = f"_heq(p, {lt.code}, {rt.code})"
            elif lt.kind == "u":
                code = f"_ueq(p, {lt.code}, {rt.code})"
            else:
                return E(f"({lt.code} {op} {rt.code})", "b")
            return E(code if op == "==" else f"(not {code})", "b")
        if op == "access_field":
            lt = self.ex(left, parser)
            if lt.kind != "h" or lt.htype is None:
                raise LoadError("access_field on a non-header")
            fidx = int(right)  # type: ignore[arg-type]
            _, w, s = lt.htype.fields[fidx]
            return E(f"h[{lt.code}][{fidx}]", "d", width=w, signed=s,
                     lvalue=(lt.code, fidx, lt.htype))
        if op == "access_union_header":
            lt = self.ex(left, parser)
            midx = int(right)  # type: ignore[arg-type]
            htype = None
            if lt.code.isdigit():
                htype = self.prog.headers[self.prog.unions[int(lt.code)].members[midx]].htype
            return E(f"UNIONS[{lt.code}][{midx}]", "h", htype=htype)
        if op in ("dereference_header_stack", "dereference_stack"):
            lt, rt = self.ex(left, parser), self.ex(right, parser)
            return E(f"_sidx(p, {lt.code}, {rt.code})", "h", htype=lt.htype)
        if op == "dereference_union_stack":
            lt, rt = self.ex(left, parser), self.ex(right, parser)
            sid = int(lt.code)
            return E(f"{self.prog.stacks[sid].members!r}[{rt.code}]", "u")
        if op == "last_stack_index":
            return E(f"(p.sn[{self.ex(right, parser).code}] - 1)", "d")
        if op == "size_stack":
            return E(f"p.sn[{self.ex(right, parser).code}]", "d")
        if op == "valid":
            rt = self.ex(right, parser)
            return E(f"v[{rt.code}]", "b")
        if op == "valid_union":
            return E(f"_uvalid(p, {self.ex(right, parser).code})", "b")
        if op == "not":
            return E(f"(not {self.cond(right, parser)})", "b")
        if op in ("and", "or"):
            return E(f"({self.cond(left, parser)} {op} {self.cond(right, parser)})", "b")
        if op == "d2b":
            rt = self.ex(right, parser)
            return E(rt.code if rt.kind == "b" else f"({rt.code} != 0)", "b")
        if op == "b2d":
            rt = self.ex(right, parser)
            return E(f"(1 if {rt.code} else 0)" if rt.kind == "b" else rt.code, "d", width=1)
        if op == "~":
            return E(f"(~{self.ex(right, parser).code})", "d")
        if op in ("+", "-") and left is None:
            return E(f"({op}{self.ex(right, parser).code})", "d")
        lt, rt = self.ex(left, parser), self.ex(right, parser)
        if op in ("+", "-", "*", "&", "|", "^", "<<", ">>"):
            return E(f"({lt.code} {op} {rt.code})", "d")
        if op in (">", "<", ">=", "<="):
            return E(f"({lt.code} {op} {rt.code})", "b")
        helpers = {"/": "_div", "%": "_mod", "two_comp_mod": "_tcm", "usat_cast": "_usat",
                   "sat_cast": "_sat"}
        if op in helpers:
            return E(f"{helpers[op]}({lt.code}, {rt.code})", "d")
        raise LoadError(f"unsupported expression operator {op!r}")

    # ---- stores ----------------------------------------------------------------------------

    def store(self, dst: E, value: E | str) -> list[str]:
        """Assign `value` to the field lvalue `dst`, truncated to the field as bmv2 does."""
        if dst.lvalue is None:
            raise LoadError(f"cannot assign to {dst.code}")
        hcode, fidx, ht = dst.lvalue
        name, w, signed = ht.fields[fidx]
        target = f"h[{hcode}][{fidx}]"
        if ht.vl_index == fidx:
            vcode = value.code if isinstance(value, E) else value
            return [f"{target} = {vcode}"]
        vcode = value.code if isinstance(value, E) else value
        if isinstance(value, E) and value.kind == "b":
            vcode = f"(1 if {vcode} else 0)"
        if isinstance(value, E) and value.width == w and value.signed == signed and value.width:
            return [f"{target} = {vcode}"]
        if isinstance(value, E) and value.const is not None:
            n = two_comp_mod(value.const, w) if signed else value.const & _mask(w)
            return [f"{target} = {n}"]
        if signed:
            return [f"{target} = _tcm({vcode}, {w})"]
        return [f"{target} = {vcode} & {_mask(w)}"]

    def lval(self, j: Json) -> E:
        e = self.ex(j)
        if e.lvalue is None:
            raise LoadError(f"not an assignable field: {j!r}")
        return e

    # ---- objects referenced by name ---------------------------------------------------------

    def _counter(self, name: str) -> str:
        key = f"C_{self._ident(name)}"
        if key not in self.ns:
            raise LoadError(f"unknown counter array {name!r}")
        return key

    def _meter(self, name: str) -> str:
        key = f"M_{self._ident(name)}"
        if key not in self.ns:
            raise LoadError(f"unknown meter array {name!r}")
        return key

    def _register(self, name: str) -> str:
        key = f"R_{self._ident(name)}"
        if key not in self.ns:
            raise LoadError(f"unknown register array {name!r}")
        return key

    def _calculation(self, name: str) -> str:
        key = f"CALC_{self._ident(name)}"
        if key not in self.ns:
            raise LoadError(f"unknown calculation {name!r}")
        return key

    def _ident(self, name: str) -> str:
        """A Python identifier for a P4 object name, unique within this program."""
        if name not in self._idents:
            self._idents[name] = f"{len(self._idents)}_" + "".join(
                c if c.isalnum() else "_" for c in name)
        return self._idents[name]

    # ---- primitives ------------------------------------------------------------------------

    def prim(self, pj: Json, parser: bool = False) -> list[str]:
        op = pj["op"]
        ps = pj.get("parameters", [])

        def ex(i: int) -> E:
            return self.ex(ps[i], parser)

        if op in ("assign", "modify_field"):
            dst = ex(0)
            if dst.kind == "h":
                return [f"_assign_header(p, {dst.code}, {ex(1).code})"]
            return self.store(self.lval(ps[0]), ex(1))
        if op == "assign_VL":
            dst, src = self.lval(ps[0]), self.lval(ps[1])
            assert dst.lvalue and src.lvalue
            return [f"h[{dst.lvalue[0]}][{dst.lvalue[1]}] = h[{src.lvalue[0]}][{src.lvalue[1]}]",
                    f"p.vlw[{dst.lvalue[0]}] = p.vlw.get({src.lvalue[0]}, 0)"]
        if op in ("assign_header", "copy_header"):
            return [f"_assign_header(p, {ex(0).code}, {ex(1).code})"]
        if op == "assign_union":
            d, s = int(ex(0).code), int(ex(1).code)
            return [f"_assign_header(p, {a}, {b})"
                    for a, b in zip(self.prog.unions[d].members, self.prog.unions[s].members,
                                    strict=True)]
        if op in ("assign_header_stack", "assign_union_stack"):
            d, s = int(ex(0).code), int(ex(1).code)
            lines = [f"p.sn[{d}] = p.sn[{s}]"]
            for da, sa in zip(self.stack_slots[d], self.stack_slots[s], strict=True):
                lines += [f"_assign_header(p, {a}, {b})" for a, b in zip(da, sa, strict=True)]
            return lines
        if op == "add_header":
            hdr = ex(0)
            if hdr.code.isdigit() and self._plain(int(hdr.code)):
                hi = int(hdr.code)  # inline: the common case, a fixed header in no union
                n = len(self.prog.headers[hi].htype.fields)
                return [f"if not v[{hi}]:",
                        f"    h[{hi}][:] = {[0] * n!r}; v[{hi}] = True; "
                        f"p.plen += {self.ns['HNBYTES'][hi]}"]
            return [f"_add_header(p, {hdr.code})"]
        if op == "add_header_fast":
            return [f"_mkvalid(p, {ex(0).code})"]
        if op == "remove_header":
            hdr = ex(0)
            if hdr.code.isdigit() and self._plain(int(hdr.code)):
                hi = int(hdr.code)
                return [f"if v[{hi}]: v[{hi}] = False; p.plen -= {self.ns['HNBYTES'][hi]}"]
            return [f"_remove_header(p, {hdr.code})"]
        if op in ("push", "pop"):
            return [f"_{op}(p, {ex(0).code}, {ex(1).code})"]
        if op == "exit":
            return ["p.exit = True"]
        if op in ("mark_to_drop", "drop"):
            std = self.prog.header_by_name.get("standard_metadata")
            if op == "mark_to_drop":
                std = self.prog.header(ps[0]["value"])
            if std is None:
                raise LoadError("drop needs standard_metadata")
            fi = std.htype.field_index
            lines = [f"h[{std.index}][{fi['egress_spec']}] = DROP_PORT"]
            if "mcast_grp" in fi:
                lines.append(f"h[{std.index}][{fi['mcast_grp']}] = 0")
            return lines
        if op == "modify_field_with_hash_based_offset":
            calc = ex(2).code
            base, size = ex(1).code, ex(3).code
            t = self.fresh()
            return [f"{t} = {size}",
                    *self.store(self.lval(ps[0]),
                                f"({base} + {calc}(p) % ({t} if {t} > 0 else 1))")]
        if op == "modify_field_rng_uniform":
            t = self.fresh()
            return [f"{t} = _rng({ex(1).code}, {ex(2).code})", f"if {t} is not None:",
                    *["    " + ln for ln in self.store(self.lval(ps[0]), t)]]
        if op == "generate_digest":
            return [f"p.learn_id = {ex(1).code}"]
        if op in ("clone_ingress_pkt_to_egress", "clone_egress_pkt_to_egress"):
            return [f"p.clone_session = {ex(0).code} & 0xffff",
                    f"p.clone_field_list = {ex(1).code}"]
        if op == "resubmit":
            return [f"p.resubmit_fl = {ex(0).code}"]
        if op == "recirculate":
            return [f"p.recirc_fl = {ex(0).code}"]
        if op == "count":
            return [f"{ex(0).code}.count({ex(1).code}, p.ingress_len)"]
        if op == "execute_meter":
            return self.store(self.lval(ps[2]), f"{ex(0).code}.execute({ex(1).code}, "
                              "p.ingress_len)")
        if op == "register_read":
            reg = ex(1).code
            t = self.fresh()
            return [f"{t} = {ex(2).code}", f"if 0 <= {t} < {reg}.size:",
                    *["    " + ln for ln in self.store(self.lval(ps[0]), f"{reg}.values[{t}]")]]
        if op == "register_write":
            reg = ex(0).code
            t = self.fresh()
            return [f"{t} = {ex(1).code}", f"if 0 <= {t} < {reg}.size:",
                    f"    {reg}.values[{t}] = ({ex(2).code}) & {reg}.mask"]
        if op == "truncate":
            t = self.fresh()
            return [f"{t} = {ex(0).code}",
                    f"p.truncate_len = {t} if p.truncate_len < 0 else min(p.truncate_len, {t})"]
        if op == "log_msg":
            return [f"_log_msg({ex(0).code}, {ex(1).code})"]
        if op in ("assert", "assume"):
            return [f"if not ({self.cond(ps[0], parser)}):",
                    f"    raise PipelineAbort({op + ' failed'!r})"]
        if op == "no_op":
            return ["pass"]
        if op in ("add_to_field", "subtract_from_field"):
            dst = self.lval(ps[0])
            sym = "+" if op == "add_to_field" else "-"
            return self.store(dst, f"({dst.code} {sym} {ex(1).code})")
        binops = {"add": "+", "subtract": "-", "bit_and": "&", "bit_or": "|", "bit_xor": "^",
                  "shift_left": "<<", "shift_right": ">>"}
        if op in binops:
            return self.store(self.lval(ps[0]), f"({ex(1).code} {binops[op]} {ex(2).code})")
        raise LoadError(f"unsupported primitive {op!r}")

    # ---- actions ---------------------------------------------------------------------------

    def gen_action(self, aid: int, prims: list[Json]) -> str:
        name = f"a_{aid}"
        self.src.add(f"def {name}(p, ad):")
        self.src.add("h = p.h; v = p.v", 1)
        jumps = any(pj["op"] in ("_jump", "_jump_if_zero") for pj in prims)
        if not jumps:
            body: list[str] = []
            for pj in prims:
                body += self.prim(pj)
            self.src.extend(body or ["pass"], 1)
            return name
        # Actions with if/else compile to jumps (p4c >= 2024): run them as a small state machine.
        n = len(prims)
        self.src.add("pc = 0", 1)
        self.src.add(f"while pc < {n}:", 1)
        for i, pj in enumerate(prims):
            self.src.add(f"{'if' if i == 0 else 'elif'} pc == {i}:", 2)
            if pj["op"] == "_jump":
                self.src.add(f"pc = {self.ex(pj['parameters'][0]).code}", 3)
            elif pj["op"] == "_jump_if_zero":
                c = self.ex(pj["parameters"][0])
                tgt = self.ex(pj["parameters"][1]).code
                test = f"not {c.code}" if c.kind == "b" else f"{c.code} == 0"
                self.src.add(f"pc = {tgt} if {test} else {i + 1}", 3)
            else:
                self.src.extend(self.prim(pj), 3)
                self.src.add(f"pc = {i + 1}", 3)
        self.src.add("else:", 2)
        self.src.add("break", 3)
        return name

    # ---- header extraction / emission ------------------------------------------------------

    def gen_header_codecs(self) -> None:
        for ti, ht in enumerate(self.prog.header_types.values()):
            if ht.vl_index is None and ht.fixed_bits % 8 == 0 and ht.fixed_bits > 0:
                self._gen_fixed_codec(ti, ht)
            elif ht.vl_index is not None:
                self._gen_vl_codec(ti, ht)
            self.ns.setdefault("_TYPEIDX", {})[ht.name] = ti

    def _gen_fixed_codec(self, ti: int, ht: HeaderType) -> None:
        nbytes = ht.fixed_bits // 8
        self.src.add(f"def _x_{ti}(f, buf, pos):")
        self.src.add(f"x = int.from_bytes(buf[pos:pos + {nbytes}], 'big')", 1)
        shift = ht.fixed_bits
        parts = []
        for i, (_, w, s) in enumerate(ht.fields):
            shift -= w
            raw = f"(x >> {shift})" if shift else "x"
            # the first field needs no mask: x has exactly fixed_bits bits
            val = raw if i == 0 else f"{raw} & {_mask(w)}"
            self.src.add(f"f[{i}] = _tcm({val}, {w})" if s else f"f[{i}] = {val}", 1)
            fld = f"(f[{i}] & {_mask(w)})"
            parts.append(f"({fld} << {shift})" if shift else fld)
        self.src.add(f"def _d_{ti}(f):")
        self.src.add(f"return ({' | '.join(parts)}).to_bytes({nbytes}, 'big')", 1)

    def _gen_vl_codec(self, ti: int, ht: HeaderType) -> None:
        # Header with one varbit field: extraction takes its width in bits.
        vi = ht.vl_index
        assert vi is not None
        self.src.add(f"def _x_{ti}(f, buf, pos, vbits):")
        total = f"({ht.fixed_bits} + vbits)"
        self.src.add(f"nb = {total} // 8", 1)
        self.src.add("x = int.from_bytes(buf[pos:pos + nb], 'big')", 1)
        self.src.add(f"shift = {total}", 1)
        parts = []
        for i, (_, w, s) in enumerate(ht.fields):
            wcode = "vbits" if i == vi else str(w)
            self.src.add(f"shift -= {wcode}", 1)
            val = f"(x >> shift) & ((1 << {wcode}) - 1)"
            self.src.add(f"f[{i}] = _tcm({val}, {w})" if s else f"f[{i}] = {val}", 1)
            parts.append((i, wcode))
        self.src.add(f"def _d_{ti}(f, vbits):")
        self.src.add("x = 0", 1)
        for i, wcode in parts:
            self.src.add(f"x = (x << {wcode}) | (f[{i}] & ((1 << {wcode}) - 1))", 1)
        self.src.add(f"return x.to_bytes(({ht.fixed_bits} + vbits) // 8, 'big')", 1)

    def _tidx(self, ht: HeaderType) -> int:
        return int(self.ns["_TYPEIDX"][ht.name])

    def deparse_expr(self, hcode: str, ht: HeaderType) -> str:
        ti = self._tidx(ht)
        if ht.vl_index is not None:
            return f"_d_{ti}(h[{hcode}], p.vlw.get({hcode}, 0))"
        if ht.fixed_bits == 0:
            return "b''"
        return f"_d_{ti}(h[{hcode}])"

    # ---- parsers ---------------------------------------------------------------------------

    def gen_parser(self, pj: Json) -> str:
        states = {s["name"]: s for s in pj["parse_states"]}
        err = self.prog.errors
        pfx = f"ps{pj['id']}_"
        fname = {name: f"{pfx}{s['id']}" for name, s in states.items()}
        for s in pj["parse_states"]:
            self.src.add(f"def {fname[s['name']]}(p, buf, pos):")
            self.src.add("h = p.h; v = p.v; n = len(buf)", 1)
            for op in s["parser_ops"]:
                self.src.extend(self._parser_op(op, err), 1)
            self._gen_transition(s, fname)
        entry = f"parse_{pj['id']}"
        init = pj.get("init_state")
        self.src.add(f"def {entry}(p, buf):")
        self.src.add("pos = 0", 1)
        self.src.add(f"st = {fname[init] if init in fname else 'None'}", 1)
        self.src.add("try:", 1)
        self.src.add("while st is not None:", 2)
        self.src.add("st, pos = st(p, buf, pos)", 3)
        self.src.add("except ParserError as e:", 1)
        self.src.add("p.payload = buf[e.pos:]", 2)
        self.src.add("return e.code", 2)
        self.src.add("p.payload = buf[pos:]", 1)
        self.src.add(f"return {err['NoError']}", 1)
        return entry

    def _extract_lines(self, hcode: str, ht: HeaderType, err: dict[str, int],
                       vl_expr: Json | None) -> list[str]:
        ti = self._tidx(ht)
        if ht.fixed_bits == 0 and ht.vl_index is None:
            return [f"_mkvalid(p, {hcode})"]
        if ht.vl_index is None or vl_expr is None:
            nb = ht.fixed_bits // 8
            return [f"if n - pos < {nb}: raise ParserError({err['PacketTooShort']}, pos)",
                    f"_x_{ti}(h[{hcode}], buf, pos)",
                    f"_mkvalid(p, {hcode})",
                    f"pos += {nb}"]
        t = self.fresh("_vb")
        maxb = ht.max_length or 0
        return [f"{t} = {self.ex(vl_expr, parser=True).code}",
                f"if {t} % 8: raise ParserError({err['ParserInvalidArgument']}, pos)",
                f"if n - pos < ({ht.fixed_bits} + {t}) // 8: "
                f"raise ParserError({err['PacketTooShort']}, pos)",
                *([f"if {maxb} < ({ht.fixed_bits} + {t}) // 8: "
                   f"raise ParserError({err['HeaderTooShort']}, pos)"] if maxb else []),
                f"_x_{ti}(h[{hcode}], buf, pos, {t})",
                f"p.vlw[{hcode}] = {t}",
                f"_mkvalid(p, {hcode})",
                f"pos += ({ht.fixed_bits} + {t}) // 8"]

    def _parser_op(self, op: Json, err: dict[str, int]) -> list[str]:
        kind = op["op"]
        ps = op["parameters"]
        if kind in ("extract", "extract_VL"):
            target = ps[0]
            vl = ps[1] if kind == "extract_VL" else None
            if target["type"] == "regular":
                inst = self.prog.header(target["value"])
                return self._extract_lines(str(inst.index), inst.htype, err, vl)
            if target["type"] == "stack":
                st = self.prog.stack_by_name[target["value"]]
                ht = self.prog.header_types[st.htype_name]
                t = self.fresh("_hs")
                return [f"if p.sn[{st.index}] >= {len(st.members)}: "
                        f"raise ParserError({err['StackOutOfBounds']}, pos)",
                        f"{t} = STK[{st.index}][p.sn[{st.index}]]",
                        *self._extract_lines(t, ht, err, vl),
                        f"p.sn[{st.index}] += 1"]
            if target["type"] == "union_stack":
                st = self.prog.union_stacks[target["value"][0]]
                t = self.fresh("_hs")
                # member index within the union, by member name
                first_union = self.prog.unions[st.members[0]]
                midx = first_union.member_names.index(target["value"][1])
                ht = self.prog.headers[first_union.members[midx]].htype
                return [f"if p.sn[{st.index}] >= {len(st.members)}: "
                        f"raise ParserError({err['StackOutOfBounds']}, pos)",
                        f"{t} = UNIONS[{st.members!r}[p.sn[{st.index}]]][{midx}]",
                        *self._extract_lines(t, ht, err, vl),
                        f"p.sn[{st.index}] += 1"]
            raise LoadError(f"unsupported extract target {target['type']!r}")
        if kind == "set":
            dst = self.lval(ps[0])
            src = ps[1]
            lines = []
            if src["type"] == "lookahead":
                nbytes = (int(src["value"][1]) + 7) // 8
                lines.append(f"if n - pos < {nbytes}: "
                             f"raise ParserError({err['PacketTooShort']}, pos)")
            return lines + self.store(dst, self.ex(src, parser=True))
        if kind == "verify":
            return [f"if not ({self.cond(ps[0], parser=True)}): "
                    f"raise ParserError({self.ex(ps[1], parser=True).code}, pos)"]
        if kind in ("shift", "advance"):
            amount = self.ex(ps[0], parser=True).code
            t = self.fresh()
            if kind == "shift":
                return [f"{t} = {amount}",
                        f"if n - pos < {t}: raise ParserError({err['PacketTooShort']}, pos)",
                        f"pos += {t}"]
            return [f"{t} = {amount}",
                    f"if {t} % 8: raise ParserError({err['ParserInvalidArgument']}, pos)",
                    f"if n - pos < {t} // 8: raise ParserError({err['PacketTooShort']}, pos)",
                    f"pos += {t} // 8"]
        if kind == "primitive":
            return self.prim(ps[0], parser=True)
        raise LoadError(f"unsupported parser operation {kind!r}")

    def _gen_transition(self, s: Json, fname: dict[str, str]) -> None:
        def target(name: str | None) -> str:
            if name is None:
                return "None"
            if name not in fname:
                raise LoadError(f"parser transition to unknown state {name!r}")
            return fname[name]

        keys = s.get("transition_key", [])
        trans = s.get("transitions", [])
        def ttype_of(t: Json) -> str:  # (bmv2's reading of older JSON: no type is hexstr)
            ttype = str(t.get("type", "hexstr"))
            return "default" if ttype == "hexstr" and t.get("value") == "default" else ttype

        # bmv2 tries the value cases in order and falls back to the state's default next state,
        # which is the last "default" transition listed, wherever the defaults stand: p4c emits
        # a keyset that matches everything (`0 &&& 0`) as a "default", so it loses to the value
        # cases after it and to a later default (P4 itself would take the first case).
        default = "None"
        for t in trans:
            if ttype_of(t) == "default":
                default = target(t.get("next_state"))
        if not keys:  # no key: bmv2 goes to the default next state
            self.src.add(f"return {default}, pos", 1)
            return
        parts: list[tuple[str, int]] = []
        for k in keys:
            if k["type"] == "lookahead":
                w = int(k["value"][1])
                parts.append((f"_peek(buf, pos, {int(k['value'][0])}, {w})", w))
            else:
                e = self.ex(k, parser=True)
                w = e.width or 1
                code = f"({e.code} & {_mask(w)})" if e.signed else e.code
                parts.append((code, w))
        total = sum(8 * ((w + 7) // 8) for _, w in parts)
        terms = []
        for code, w in parts:
            total -= 8 * ((w + 7) // 8)
            terms.append(f"({code} << {total})" if total else code)
        self.src.add(f"k = {' | '.join(terms)}", 1)
        for t in trans:
            ttype = ttype_of(t)
            nxt = target(t.get("next_state"))
            mask = t.get("mask")
            if ttype == "default":
                continue
            if ttype == "hexstr":
                val = hexint(t["value"])
                if mask is None:
                    self.src.add(f"if k == {val}: return {nxt}, pos", 1)
                else:
                    m = hexint(mask)
                    self.src.add(f"if k & {m} == {val & m}: return {nxt}, pos", 1)
            elif ttype == "parse_vset":
                vs = self._vset(t["value"])
                vmask = hexint(mask) if mask is not None else None
                self.src.add(f"if {vs}.contains(k, {vmask}): return {nxt}, pos", 1)
            else:
                raise LoadError(f"unsupported transition type {ttype!r}")
        self.src.add(f"return {default}, pos", 1)

    def _vset(self, name: str) -> str:
        key = f"VS_{self._ident(name)}"
        if key not in self.ns:
            raise LoadError(f"unknown parse value set {name!r}")
        return key

    # ---- calculations (checksums, hashes) ---------------------------------------------------

    def gen_field_buffer(self, fname: str, inputs: list[Json]) -> None:
        """A function building the byte string a calculation hashes, as bmv2's BufBuilder:
        fields bit-packed back to back (skipped when their header is invalid), constants,
        whole headers, then optionally the payload; zero padding at the end."""
        self.src.add(f"def {fname}(p):")
        self.src.add("h = p.h; v = p.v; acc = 0; nb = 0; parts = []", 1)
        flush = "if nb: parts.append(acc.to_bytes(nb // 8, 'big')); acc = 0; nb = 0"
        # Consecutive fixed-width fields of one header are packed by one guarded statement.
        group: list[tuple[int, str]] = []
        group_hidx = -1

        def close_group() -> None:
            nonlocal group, group_hidx
            if not group:
                return
            inst = self.prog.headers[group_hidx]
            total = sum(w for w, _ in group)
            shift, terms = total, []
            for w, code in group:
                shift -= w
                terms.append(f"({code} << {shift})" if shift else code)
            guard = "" if inst.metadata else f"if v[{group_hidx}]: "
            self.src.add(f"{guard}acc = (acc << {total}) | {' | '.join(terms)}; nb += {total}", 1)
            group, group_hidx = [], -1

        for inp in inputs:
            t = inp["type"]
            if t == "field":
                hidx, fidx = self.prog.field_ref(inp["value"][0], inp["value"][1])
                inst = self.prog.headers[hidx]
                if fidx >= 0 and inst.htype.vl_index == fidx:
                    # a varbit field contributes the bits it currently holds
                    close_group()
                    guard = "" if inst.metadata else f"if v[{hidx}]: "
                    self.src.add(f"{guard}w = p.vlw.get({hidx}, 0); "
                                 f"acc = (acc << w) | (h[{hidx}][{fidx}] & ((1 << w) - 1)); "
                                 "nb += w", 1)
                    continue
                if fidx < 0:
                    w, code = 1, f"(1 if v[{hidx}] else 0)"
                else:
                    w = inst.htype.fields[fidx][1]
                    code = f"(h[{hidx}][{fidx}] & {_mask(w)})"
                if hidx != group_hidx:
                    close_group()
                    group_hidx = hidx
                group.append((w, code))
                continue
            close_group()
            if t == "hexstr":
                w = int(inp["bitwidth"])
                self.src.add(f"acc = (acc << {w}) | {hexint(inp['value']) & _mask(w)}; "
                             f"nb += {w}", 1)
            elif t == "header":
                inst = self.prog.header(inp["value"])
                self.src.add(f"if v[{inst.index}]:", 1)
                self.src.add(flush, 2)
                self.src.add(f"parts.append({self.deparse_expr(str(inst.index), inst.htype)})", 2)
            elif t == "payload":
                self.src.add(flush, 1)
                self.src.add("parts.append(p.payload)", 1)
            else:
                raise LoadError(f"unsupported calculation input {t!r}")
        close_group()
        self.src.add("if nb:", 1)
        self.src.add("pad = -nb % 8", 2)
        self.src.add("parts.append((acc << pad).to_bytes((nb + pad) // 8, 'big'))", 2)
        self.src.add("return b''.join(parts)", 1)


def compile_program(prog: Program, clock_us: Callable[[], int],
                    log_fn: Callable[[str], None] | None = None) -> Compiled:
    """Generate and compile the Python code for `prog`, with fresh stateful objects."""
    try:
        return _compile(prog, clock_us, log_fn)
    except LoadError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise LoadError(f"malformed bmv2 JSON: {type(exc).__name__}: {exc}") from exc


def _compile(prog: Program, clock_us: Callable[[], int],
             log_fn: Callable[[str], None] | None) -> Compiled:
    g = Codegen(prog, clock_us, log_fn)
    ns = g.ns
    counters: dict[str, CounterArray] = {}
    meters: dict[str, MeterArray] = {}
    registers: dict[str, RegisterArray] = {}
    vsets: dict[str, ValueSet] = {}
    for name, cj in prog.counter_arrays.items():
        # direct counters have no size: they live in the entries of the table they bind to
        c = CounterArray(name, int(cj.get("size", 0)), bool(cj.get("is_direct")),
                         cj.get("binding", ""))
        counters[name] = c
        ns[f"C_{g._ident(name)}"] = c
    for name, mj in prog.meter_arrays.items():
        m = MeterArray(name, int(mj.get("size", 0)), mj.get("type", "bytes"), clock_us,
                       bool(mj.get("is_direct")), mj.get("binding", ""),
                       int(mj.get("rate_count", 2)))
        meters[name] = m
        ns[f"M_{g._ident(name)}"] = m
    for name, rj in prog.register_arrays.items():
        r = RegisterArray(name, int(rj["size"]), int(rj["bitwidth"]))
        registers[name] = r
        ns[f"R_{g._ident(name)}"] = r
    vset_widths = _vset_bitwidths(prog)
    for name, vj in prog.parse_vsets.items():
        widths = vset_widths.get(name) or [int(vj["compressed_bitwidth"])]
        vs = ValueSet(name, widths, int(vj.get("max_size", 0)))
        vsets[name] = vs
        ns[f"VS_{g._ident(name)}"] = vs

    g.gen_header_codecs()

    # Calculations: a buffer builder plus the hash function.
    for name, cj in prog.calculations.items():
        buf_fn = f"cb_{cj['id']}"
        g.gen_field_buffer(buf_fn, cj["input"])
        ns[f"_H_{cj['id']}"] = hashes.get_hash(cj["algo"])
        g.src.add(f"def CALC_{g._ident(name)}(p):")
        g.src.add(f"return _H_{cj['id']}({buf_fn}(p))", 1)
        ns[f"CALC_{g._ident(name)}"] = None  # defined by exec; reserve the name for lookups

    action_names: dict[int, str] = {}
    for aid, a in prog.actions.items():
        action_names[aid] = g.gen_action(aid, a.primitives)

    parser_entry = g.gen_parser(prog.parser("parser"))

    # Checksums.
    g.src.add("def verify_checksums(p):")
    g.src.add("h = p.h; v = p.v; bad = False", 1)
    upd: list[str] = []
    for ck in prog.checksums:
        calc = prog.calculations.get(ck["calculation"])
        if calc is None:
            raise LoadError(f"checksum {ck['name']!r}: unknown calculation {ck['calculation']!r}")
        hidx, fidx = prog.field_ref(ck["target"][0], ck["target"][1])
        w = prog.headers[hidx].htype.fields[fidx][1]
        cond = g.cond(ck["if_cond"]) if ck.get("if_cond") else "True"
        fn = f"CALC_{g._ident(calc['name'])}"
        if ck.get("verify", True):
            g.src.add(f"if v[{hidx}] and ({cond}) and ({fn}(p) & {_mask(w)}) != h[{hidx}][{fidx}]:",
                      1)
            g.src.add("bad = True", 2)
        if ck.get("update", True):
            upd.append(f"if {cond}: h[{hidx}][{fidx}] = {fn}(p) & {_mask(w)}")
    g.src.add("return bad", 1)
    g.src.add("def update_checksums(p):")
    g.src.add("h = p.h; v = p.v", 1)
    g.src.extend(upd or ["pass"], 1)

    # Deparser.
    dj = prog.deparser("deparser")
    g.src.add("def deparse(p):")
    g.src.add("h = p.h; v = p.v; out = []", 1)
    for pj in dj.get("primitives", []):
        g.src.extend(g.prim(pj), 1)
    for hname in dj["order"]:
        inst = prog.header(hname)
        g.src.add(f"if v[{inst.index}]: out.append({g.deparse_expr(str(inst.index), inst.htype)})",
                  1)
    g.src.add("out.append(p.payload)", 1)
    g.src.add("return b''.join(out)", 1)

    # Selectors of action profiles.
    for apj in prog.action_profiles.values():
        sel = apj.get("selector")
        if sel:
            fn = f"sel_{apj['id']}"
            g.gen_field_buffer(f"{fn}_buf", sel["input"])
            ns[f"_SH_{apj['id']}"] = hashes.get_hash(sel["algo"])
            g.src.add(f"def {fn}(p):")
            g.src.add(f"return _SH_{apj['id']}({fn}_buf(p))", 1)

    # Control flow: tables and conditionals become node functions.
    node_fn: dict[str, str] = {}
    for pl in prog.pipelines:
        for t in pl["tables"]:
            node_fn[t["name"]] = f"t_{t['id']}"
        for c in pl.get("conditionals", []):
            node_fn[c["name"]] = f"c_{c['id']}"
        for ac in pl.get("action_calls", []):
            node_fn[ac["name"]] = f"ac_{ac['id']}"

    def node_ref(name: str | None) -> str:
        if name is None:
            return "None"
        if name not in node_fn:
            raise LoadError(f"control flow refers to unknown node {name!r}")
        return node_fn[name]

    # Action-call tables (see _is_action_call) and what follows each; a run of them whose
    # members have a single predecessor is fused into one function, saving a call per node.
    calls: dict[str, tuple[str, tuple[int, ...], str | None]] = {}  # name -> (fn, params, next)
    for pl in prog.pipelines:
        for t in pl["tables"]:
            if _is_action_call(t):
                de = t["default_entry"]
                nxt = t.get("next_tables", {})
                if "__HIT__" in nxt or "__MISS__" in nxt:
                    follow = nxt.get("__MISS__")
                else:
                    follow = nxt.get(prog.actions[de["action_id"]].name, t.get("base_default_next"))
                calls[t["name"]] = (action_names[de["action_id"]],
                                    tuple(hexint(x) for x in de.get("action_data", [])), follow)
    preds: dict[str, int] = {}
    for pl in prog.pipelines:
        targets: list[str | None] = [pl.get("init_table")]
        for t in pl["tables"]:
            targets += list(t.get("next_tables", {}).values()) + [t.get("base_default_next")]
        for c in pl.get("conditionals", []):
            targets += [c.get("true_next"), c.get("false_next")]
        for ac in pl.get("action_calls", []):
            targets.append(ac.get("next_node"))
        for target in targets:
            if target is not None:
                preds[target] = preds.get(target, 0) + 1

    def call_run(name: str) -> list[str]:
        """Lines running the action call `name` and the calls fused after it."""
        lines: list[str] = []
        while True:
            fn, params, follow = calls[name]
            lines.append(f"{fn}(p, {params!r})")
            if follow is not None and follow in calls and preds.get(follow) == 1:
                lines.append("if p.exit: return None")
                name = follow
                continue
            lines.append(f"return {node_ref(follow)}")
            return lines

    for pl in prog.pipelines:
        for t in pl["tables"]:
            g.src.add(f"def t_{t['id']}(p):")
            if t["name"] in calls:
                # p4c turns every action called directly from a control into a keyless table
                # whose const default is that action: it always misses, so call the action.
                g.src.extend(call_run(t["name"]), 1)
                continue
            g.src.add("h = p.h; v = p.v", 1)
            key = []
            for k in t["key"]:
                if k["match_type"] == "valid":
                    tgt = k["target"]
                    hname = tgt if isinstance(tgt, str) else tgt[0]
                    key.append(f"(1 if v[{prog.header(hname).index}] else 0)")
                    continue
                e = g.field(k["target"][0], k["target"][1])
                code = f"({e.code} & {_mask(e.width)})" if e.signed else e.code
                if k.get("mask"):
                    code = f"({code} & {hexint(k['mask'])})"
                key.append(code)
            tup = "(" + "".join(f"{c}, " for c in key) + ")"
            g.src.add(f"return T_{t['id']}.apply(p, {tup}, p.ingress_len)", 1)
        for c in pl.get("conditionals", []):
            g.src.add(f"def c_{c['id']}(p):")
            g.src.add("h = p.h; v = p.v", 1)
            g.src.add(f"return {node_ref(c.get('true_next'))} if {g.cond(c['expression'])} "
                      f"else {node_ref(c.get('false_next'))}", 1)
        for ac in pl.get("action_calls", []):
            g.src.add(f"def ac_{ac['id']}(p):")
            g.src.add(f"{action_names[ac['action_id']]}(p, ())", 1)
            g.src.add(f"return {node_ref(ac.get('next_node'))}", 1)
        g.src.add(f"def run_{pl['id']}(p):")
        g.src.add(f"n = {node_ref(pl.get('init_table'))}", 1)
        g.src.add("while n is not None and not p.exit:", 1)
        g.src.add("n = n(p)", 2)

    # Fresh packets: all headers invalid and zero, metadata valid.
    nfields = [len(hi.htype.fields) for hi in prog.headers]
    valid0 = [hi.metadata for hi in prog.headers]
    nstacks = len(prog.stacks)
    ns["_NF"] = nfields
    ns["_V0"] = valid0
    ns["Packet"] = Packet
    g.src.add("def new_packet():")
    g.src.add(f"return Packet([[0] * n for n in _NF], list(_V0), [0] * {nstacks})", 1)

    source = g.src.text()
    try:
        bytecode = compile(source, "<bmv2-json>", "exec")
    except SyntaxError as exc:  # a generator bug, not a user error, but never crash the switch
        raise LoadError(f"internal error compiling the program: {exc}") from exc
    exec(bytecode, ns)

    # Stateful table objects, wired to the generated functions.
    profiles: dict[str, ActionProfile] = {}
    for name, apj in prog.action_profiles.items():
        sel_fn = ns.get(f"sel_{apj['id']}") if apj.get("selector") else None
        profiles[name] = ActionProfile(name, int(apj.get("max_size", 0)), sel_fn)
    actions = {aid: ns[fn] for aid, fn in action_names.items()}
    tables: dict[str, MatchTable] = {}
    for pl in prog.pipelines:
        for t in pl["tables"]:
            tables[t["name"]] = _build_table(prog, t, ns, profiles, meters, actions, node_fn)

    pipelines = {pl["name"]: ns[f"run_{pl['id']}"] for pl in prog.pipelines}
    return Compiled(
        program=prog,
        source=source,
        parse=ns[parser_entry],
        verify_checksums=ns["verify_checksums"],
        update_checksums=ns["update_checksums"],
        deparse=ns["deparse"],
        ingress=pipelines.get("ingress", lambda p: None),
        egress=pipelines.get("egress", lambda p: None),
        new_packet=ns["new_packet"],
        tables=tables,
        profiles=profiles,
        counters=counters,
        meters=meters,
        registers=registers,
        value_sets=vsets,
        actions=actions,
    )


def _is_action_call(t: Json) -> bool:
    """A keyless table with a const default action, no entries and no direct resources."""
    de = t.get("default_entry") or {}
    return (not t["key"] and t.get("type", "simple") == "simple" and bool(de.get("action_const"))
            and not t.get("entries") and not t.get("with_counters") and not t.get("direct_meters"))


def _build_table(prog: Program, t: Json, ns: dict[str, Any], profiles: dict[str, ActionProfile],
                 meters: dict[str, MeterArray], actions: dict[int, Any],
                 node_fn: dict[str, str]) -> MatchTable:
    kinds, widths = [], []
    for k in t["key"]:
        mt = k["match_type"]
        kinds.append(mt)
        if mt == "valid":
            widths.append(1)
        else:
            widths.append(prog.field_width(prog.field_ref(k["target"][0], k["target"][1])))
    profile = profiles.get(t["action_profile"]) if t.get("type", "simple") != "simple" else None
    if t.get("type", "simple") != "simple" and profile is None:
        raise LoadError(f"table {t['name']!r}: unknown action profile {t.get('action_profile')!r}")
    direct_meter = None
    meter_target = None
    if t.get("direct_meters"):
        direct_meter = meters.get(t["direct_meters"])
        mj = prog.meter_arrays.get(t["direct_meters"], {})
        if mj.get("result_target"):
            meter_target = prog.field_ref(mj["result_target"][0], mj["result_target"][1])
    table = MatchTable(t["name"], kinds, widths, int(t.get("max_size", 0)), profile,
                       bool(t.get("with_counters")), direct_meter, meter_target)
    ns[f"T_{t['id']}"] = table

    def fn_of(name: str | None) -> Any:
        return None if name is None else ns[node_fn[name]]

    nxt = t.get("next_tables", {})
    if "__HIT__" in nxt or "__MISS__" in nxt:
        table.next_hit = fn_of(nxt.get("__HIT__"))
        table.next_miss = fn_of(nxt.get("__MISS__"))
    else:
        by_action: dict[int, Any] = {}
        for aname, aid in zip(t["actions"], t["action_ids"], strict=True):
            by_action[aid] = fn_of(nxt.get(aname, t.get("base_default_next")))
        table.next_by_action = by_action
        table.next_default = fn_of(t.get("base_default_next"))

    de = t.get("default_entry")
    if de is not None:
        aid = de["action_id"]
        if aid not in actions:
            raise LoadError(f"table {t['name']!r}: default action id {aid} unknown")
        params = tuple(hexint(x) for x in de.get("action_data", []))
        table.default = ActionCall(aid, actions[aid], params)
        table.default_const = bool(de.get("action_const"))

    for ej in t.get("entries", []):
        spec: list[Any] = []
        for kind, mk in zip(kinds, ej["match_key"], strict=True):
            mt = mk["match_type"]
            if mt in ("exact", "valid"):
                spec.append(int(bool(mk["key"])) if mt == "valid" and isinstance(mk["key"], bool)
                            else hexint(mk["key"]))
            elif mt == "lpm":
                spec.append((hexint(mk["key"]), int(mk["prefix_length"])))
            elif mt in ("ternary", "optional"):
                spec.append((hexint(mk["key"]) & hexint(mk["mask"]), hexint(mk["mask"])))
            elif mt == "range":
                spec.append((hexint(mk["start"]), hexint(mk["end"])))
            else:
                raise LoadError(f"table {t['name']!r}: bad const entry match type {mt!r}")
            if kind == "optional" and mt == "exact":
                v = spec.pop()
                spec.append((v, (1 << widths[len(spec)]) - 1))
        ae = ej["action_entry"]
        call = ActionCall(ae["action_id"], actions[ae["action_id"]],
                          tuple(hexint(x) for x in ae.get("action_data", [])))
        # bmv2: a smaller JSON priority wins; P4Runtime (and this table): a larger one.
        table.add(Entry(tuple(spec), -int(ej.get("priority", 0)), call=call), const=True)
    if t.get("entries"):
        table.immutable = True
    return table


def _vset_bitwidths(prog: Program) -> dict[str, list[int]]:
    """The key field widths of each value set, from the transitions that use it (bmv2 pads
    value-set members per key field the same way)."""
    out: dict[str, list[int]] = {}
    for pj in prog.parsers:
        for s in pj["parse_states"]:
            widths = []
            for k in s.get("transition_key", []):
                if k["type"] == "lookahead":
                    widths.append(int(k["value"][1]))
                elif k["type"] == "field":
                    widths.append(prog.field_width(prog.field_ref(k["value"][0], k["value"][1])))
                elif k["type"] == "stack_field":
                    st = prog.stack_by_name[k["value"][0]]
                    ht = prog.header_types[st.htype_name]
                    widths.append(ht.fields[ht.field_index[k["value"][1]]][1])
            for tr in s.get("transitions", []):
                if tr.get("type") == "parse_vset":
                    out[tr["value"]] = widths
    return out
