"""Write the C of a bmv2 JSON program: the native twin of testbed/switch/codegen.py.

The generated file is meant to be read: one function per parser state (`parse_<state>`),
action (`action_<name>`), table application (`table_<name>`), conditional (`cond_<name>`)
and action call, the deparser and the checksums, each named after its P4 object; a packet is a
struct of header structs (`p->hdr.<header>.<field>`, every field a `uint64_t`), validity
flags (`p->valid[HDR_<header>]`) and v1model's per-packet registers (`p->regs`).

Semantics are the reference's (see testbed/switch/packet.py): an expression's value is a
mathematical integer, truncated only when stored in a field. The C computes with `uint64_t`,
which is exact for `+ - * & | ^ ~ <<` modulo 2^64 and therefore for every store (a field is at
most 64 bits wide). Each expression carries the range its true value can take; where the true
value matters (a comparison, `>>`, `/`, `%`, a truth value, a table index) the generator
requires that range to be within [0, 2^64) and raises `Unsupported` otherwise. Every
construct it does not implement raises `Unsupported("what, where")` the same way: a program
either compiles to C that behaves as the reference, or it runs on the reference.

Signed (`int<w>`) fields hold their bits; a load sign-extends them (`xm_sext`): the value
is the reference's, and a table or transition key takes the bits, as the reference does.

Not implemented in this cut (each one `Unsupported`): fields wider than 64 bits, signed
fields in digests, header unions, shifting or copying header stacks (push, pop, stack
assignment, their size and last index: no test program exercises them), stacks of
variable-length headers, a header type with a variable-length field beside others, parser
value sets, meters, range
matches, log_msg, stateful or custom hash algorithms.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from testbed.switch.compiler import is_action_call
from testbed.switch.native.hop import cdef as hop_cdef
from testbed.switch.native.hop import source as hop_source
from testbed.switch.native.tm import source as tm_source
from testbed.switch.packet import CLOCK_NS, PKT_INSTANCE_TYPE_NORMAL, STD_FIELDS
from testbed.switch.program import HeaderType, Json, Program, hexint

# Part of the cache key of every build: bump it when the generated C changes meaning.
GENERATOR_VERSION = "2"

U64 = (1 << 64) - 1
I64_MIN = -(1 << 63)
DROP_PORT = 511
NO_ACTION = 0xFFFFFFFF  # a table entry or default that calls nothing
ABORT_PIPELINE = 1  # the reference raises PipelineAbort
ABORT_INDEX = 2  # the reference raises IndexError
# What the architecture's entry points (xm_receive, xm_depart) return besides a frame's
# length: the abort kinds above negated, and these
ARCH_DROP = -3  # the program dropped the packet (egress_spec is the drop port)
ARCH_PYTHON = -4  # a rare case (clone, digest, resubmit, recirculate, multicast): v1model.py
ARCH_DEPARSE_ERROR = -5  # updating the checksums or deparsing aborted
ARCH_ENQUEUE_PYTHON = -6  # v1model.py enqueues it (a bad priority, a port down, PFC: rare)
ARCH_QUEUE_FULL = -7  # the traffic manager dropped it (a full queue or buffer)
ARCH_NO_MEMORY = -8  # a queue could not grow
C_HASHES = ("csum16", "cksum16", "crc16", "crc32", "crcCCITT", "identity")
HASH_FN = {"cksum16": "csum16"}  # algorithms that are another's C function
PKT_REGS = (
    "plen",
    "ingress_len",
    "exit",
    "clone_session",
    "clone_field_list",
    "resubmit_fl",
    "recirc_fl",
    "learn_id",
    "truncate_len",
)


class Unsupported(Exception):
    """The native pipeline cannot run this program; the message says what and where."""


def c_ident(name: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in name).strip("_") or "x"
    return out if not out[0].isdigit() else "_" + out


def c_int(n: int) -> str:
    """A C constant of type uint64_t for n mod 2^64."""
    n &= U64
    return f"UINT64_C({n})" if n < 1 << 16 else f"UINT64_C({n:#x})"


def mask_of(width: int) -> int:
    return (1 << width) - 1


@dataclass
class X:
    """A generated C expression. Data (kind "d") is a uint64_t equal to the true value modulo
    2^64; `lo`/`hi` bound the true value when it is known to lie in [0, 2^64) (then the C value
    is the true value). Kind "b" is a C truth value, "h" a header (hidx), "obj" a named object."""

    code: str
    kind: str = "d"
    lo: int | None = None
    hi: int | None = None
    hidx: int = -1  # a header: its index; -1 with kind "h": an element chosen at run time
    lvalue: tuple[int, int] | None = None
    obj: str = ""
    htype: HeaderType | None = None  # a header's (or a stack's element's) type
    fwidth: int = 0  # a field load: the field's width ...
    ref: str = ""  # ... and the field itself: its bits, masked to the width, assignable

    @property
    def known(self) -> bool:
        """The C value stands for the true value: `exact` or `signed`."""
        return self.lo is not None and self.hi is not None

    @property
    def exact(self) -> bool:
        """The true value lies in [0, 2^64): the uint64_t is the value."""
        return self.lo is not None and self.hi is not None and 0 <= self.lo and self.hi <= U64

    @property
    def signed(self) -> bool:
        """The true value lies in [-2^63, 2^63): the uint64_t read as an int64_t is the value."""
        return (
            self.lo is not None
            and self.hi is not None
            and I64_MIN <= self.lo
            and self.hi < -I64_MIN
        )


def _exact(code: str, lo: int, hi: int) -> X:
    """An expression whose true value lies in [lo, hi]: known when a uint64_t or an int64_t
    holds every value of the range, else known only modulo 2^64."""
    if (0 <= lo and hi <= U64) or (I64_MIN <= lo and hi < -I64_MIN):
        return X(code, "d", lo, hi)
    return X(code, "d")


@dataclass
class TableInfo:
    """What the runtime needs to mirror one table natively."""

    name: str
    index: int
    kinds: list[str]
    widths: list[int]
    indirect: bool
    profile: str | None
    direct_counters: bool


@dataclass
class Generated:
    source: str
    tables: dict[str, TableInfo] = field(default_factory=dict)
    profiles: dict[str, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)  # indexed counters
    registers: dict[str, int] = field(default_factory=dict)
    header_slots: list[int] = field(default_factory=list)  # uint64 offset of each header
    nfields: int = 0
    max_params: int = 1
    max_out: int = 0  # bytes the deparser writes at most (headers; the payload comes after)
    nheaders: int = 0
    vl_bytes: int = 1
    arch: bool = False  # xm_receive and xm_depart exist (standard_metadata has every field)
    cdef: str = ""

    @property
    def digest(self) -> str:
        return hashlib.sha256((GENERATOR_VERSION + "\0" + self.source).encode()).hexdigest()


class CGen:
    """Generates the C source of one program."""

    def __init__(self, prog: Program):
        self.prog = prog
        self.where = "program"
        self.out: list[str] = []
        self.tmp = 0
        self.params: list[int] | None = None  # runtime data widths of the action being written
        self.parser = False
        self._check_program()
        self.hname = self._unique([c_ident(h.name) for h in prog.headers])
        self.tname = {
            t: n
            for t, n in zip(
                prog.header_types,
                self._unique([c_ident(t) for t in prog.header_types]),
                strict=True,
            )
        }
        self.fnames: dict[str, list[str]] = {
            t: self._unique([c_ident(f[0]) for f in ht.fields])
            for t, ht in prog.header_types.items()
        }
        self.slots: list[int] = []
        off = 0
        for h in prog.headers:
            self.slots.append(off)
            off += max(1, len(h.htype.fields))
        self.nfields = off
        self.vl_off: dict[int, int] = {}
        vl = 0
        for h in prog.headers:
            if h.htype.vl_index is not None:
                self.vl_off[h.index] = vl
                vl += int(h.htype.max_length or 0)
        self.vl_bytes = max(1, vl)
        std = prog.header_by_name.get("standard_metadata")
        self.std = std
        # object names
        self.action_fn: dict[int, str] = {}
        names = self._unique([c_ident(a.name) for a in prog.actions.values()])
        for (aid, _), n in zip(prog.actions.items(), names, strict=True):
            self.action_fn[aid] = f"action_{n}"
        self.counter_idx = {
            n: i
            for i, n in enumerate(
                n for n, c in prog.counter_arrays.items() if not c.get("is_direct")
            )
        }
        self.register_idx = {n: i for i, n in enumerate(prog.register_arrays)}
        self.profile_idx = {n: i for i, n in enumerate(prog.action_profiles)}
        self.table_idx: dict[str, int] = {}
        self.node_id: dict[str, str] = {}
        self.node_fn: dict[str, str] = {}
        self.calc_fn: dict[str, str] = {}
        self.max_params = max([len(a.params) for a in prog.actions.values()] + [1])

    # ---- checks on the whole program -------------------------------------------------------

    def _check_program(self) -> None:
        prog = self.prog
        if prog.union_stacks:
            raise Unsupported(f"header union stacks, in {next(iter(prog.union_stacks))}")
        for st in prog.stacks:
            if prog.header_types[st.htype_name].vl_index is not None:
                raise Unsupported(f"a stack of variable-length headers, in {st.name}")
        if prog.unions:
            raise Unsupported(f"header unions, in {prog.unions[0].name}")
        for t, ht in prog.header_types.items():
            for fname, w, _ in ht.fields:
                if w > 64:
                    raise Unsupported(f"field {t}.{fname} of {w} bits (wider than 64)")
            if ht.vl_index is not None and (len(ht.fields) != 1 or not ht.max_length):
                raise Unsupported(
                    f"variable-length field beside other fields or without a max length, in {t}"
                )
        for name, rj in prog.register_arrays.items():
            if int(rj["bitwidth"]) > 64:
                raise Unsupported(f"register {name} of {rj['bitwidth']} bits (wider than 64)")
        if prog.meter_arrays:
            raise Unsupported(f"meter {next(iter(prog.meter_arrays))}")
        refs = [r for fl in prog.field_lists.values() for r in fl]
        refs += [r for _, fl in prog.learn_lists.values() for r in fl]
        for _, fl in prog.learn_lists.values():
            for hidx, fidx in fl:
                if fidx >= 0 and prog.headers[hidx].htype.fields[fidx][2]:
                    # the architecture hands a digest's values to Python as they are stored
                    raise Unsupported(f"signed field in a digest, {prog.headers[hidx].name}")
        for hidx, fidx in refs:
            if fidx >= 0 and prog.headers[hidx].htype.vl_index == fidx:
                raise Unsupported(
                    f"variable-length field in a field list, {prog.headers[hidx].name}"
                )
        for pl in prog.pipelines:
            for t in pl["tables"]:
                if t.get("direct_meters"):
                    raise Unsupported(f"direct meter on table {t['name']}")
                for k in t["key"]:
                    if k["match_type"] not in ("exact", "lpm", "ternary", "optional", "valid"):
                        raise Unsupported(f"{k['match_type']} match in table {t['name']}")
            for ap in pl.get("action_profiles", []):
                sel = ap.get("selector")
                if sel and sel["algo"] not in C_HASHES:
                    raise Unsupported(f"selector hash {sel['algo']} of {ap['name']}")

    @staticmethod
    def _unique(names: list[str]) -> list[str]:
        seen: dict[str, int] = {}
        out = []
        for n in names:
            if n in seen:
                seen[n] += 1
                out.append(f"{n}_{seen[n]}")
            else:
                seen[n] = 0
                out.append(n)
        return out

    def fail(self, what: str) -> Unsupported:
        return Unsupported(f"{what}, in {self.where}")

    def fresh(self, prefix: str = "t") -> str:
        self.tmp += 1
        return f"{prefix}{self.tmp}"

    def emit(self, line: str = "", indent: int = 0) -> None:
        self.out.append("    " * indent + line if line else "")

    # ---- names ------------------------------------------------------------------------------

    def hid(self, hidx: int) -> str:
        return f"HDR_{self.hname[hidx]}"

    def fref(self, hidx: int, fidx: int) -> str:
        inst = self.prog.headers[hidx]
        return f"p->hdr.{self.hname[hidx]}.{self.fnames[inst.htype.name][fidx]}"

    def valid(self, hidx: int) -> str:
        return f"p->valid[{self.hid(hidx)}]"

    # ---- expressions ------------------------------------------------------------------------

    def field(self, hidx: int, fidx: int) -> X:
        if fidx < 0:
            return X(f"(uint64_t){self.valid(hidx)}", "d", 0, 1)
        ht = self.prog.headers[hidx].htype
        if ht.vl_index == fidx:
            raise self.fail(
                f"variable-length field {self.prog.headers[hidx].name} in an expression"
            )
        _, w, signed = ht.fields[fidx]
        return self._load(self.fref(hidx, fidx), w, signed, (hidx, fidx))

    @staticmethod
    def _load(ref: str, w: int, signed: bool, lvalue: tuple[int, int]) -> X:
        """A field's value: its bits, or for an int<w> field their two's complement value (the
        reference keeps a signed field's value, the C its bits)."""
        if signed:
            lo, hi = -(1 << (w - 1)), (1 << (w - 1)) - 1
            return X(f"xm_sext({ref}, {w})", "d", lo, hi, lvalue=lvalue, fwidth=w, ref=ref)
        return X(ref, "d", 0, mask_of(w), lvalue=lvalue, fwidth=w, ref=ref)

    def hdr(self, x: X) -> str:
        """A header expression's struct, as an lvalue."""
        if x.hidx >= 0:
            return f"p->hdr.{self.hname[x.hidx]}"
        assert x.htype is not None
        return f"(*XM_H({self.tname[x.htype.name]}, {x.code}))"

    def dyn_field(self, x: X, fidx: int) -> X:
        """Field fidx of a header chosen at run time (a stack element)."""
        if x.hidx >= 0:
            return self.field(x.hidx, fidx)
        assert x.htype is not None
        if fidx < 0:
            return X(f"(uint64_t)p->valid[{x.code}]", "d", 0, 1)
        _, w, signed = x.htype.fields[fidx]
        ref = f"XM_H({self.tname[x.htype.name]}, {x.code})->{self.fnames[x.htype.name][fidx]}"
        return self._load(ref, w, signed, (-1, fidx))

    def stack(self, name: str) -> X:
        st = self.prog.stack_by_name.get(name)
        if st is None:
            raise self.fail(f"unknown header stack {name}")
        return X(str(st.index), "s", hidx=st.index, htype=self.prog.header_types[st.htype_name])

    def ex(self, j: Json | None) -> X:
        if j is None:
            raise self.fail("missing operand")
        t = j.get("type")
        val: Any = j.get("value")
        if t == "expression":
            if isinstance(val, dict) and "op" in val:
                return self.op(val)
            return self.ex(val)
        if t == "field":
            return self.field(*self.prog.field_ref(val[0], val[1]))
        if t == "hexstr":
            n = hexint(val)
            if n > U64:
                raise self.fail(f"constant {val} wider than 64 bits")
            return _exact(c_int(n), n, n)
        if t == "bool":
            return X("1" if val else "0", "b")
        if t in ("header", "regular"):
            inst = self.prog.header(val)
            return X(self.hid(inst.index), "h", hidx=inst.index, htype=inst.htype)
        if t == "header_stack":
            return self.stack(val)
        if t == "stack_field":
            st = self.stack(val[0])
            assert st.htype is not None
            last = X(f"xm_stack_last(s, p, {st.hidx})", "h", htype=st.htype)
            return self.dyn_field(last, st.htype.field_index[val[1]])
        if t in ("local", "runtime_data"):
            i = int(val)
            if self.params is None or i >= len(self.params):
                raise self.fail(f"{t} {i} outside an action's parameters")
            return X(f"ad[{i}]", "d", 0, U64)
        if t == "register":
            reg = self._register(val[0])
            idx = self.need_exact(self.ex(val[1]), "register index")
            w = int(self.prog.register_arrays[val[0]]["bitwidth"])
            return X(f"xm_register_get(s, {reg}, {idx.code})", "d", 0, mask_of(w))
        if t == "calculation":
            return X("", "obj", obj=self._calculation(val))
        if t == "counter_array":
            if val not in self.counter_idx:
                raise self.fail(f"direct counter {val} used as an indexed counter")
            return X("", "obj", obj=f"CTR_{c_ident(val)}")
        if t == "register_array":
            return X("", "obj", obj=self._register(val))
        if t == "lookahead":
            if not self.parser:
                raise self.fail("lookahead outside a parser")
            w = int(val[1])
            if w > 64:
                raise self.fail(f"lookahead of {w} bits")
            return X(f"xm_peek(c, {int(val[0])}, {w})", "d", 0, mask_of(w))
        raise self.fail(f"expression type {t!r}")

    def need_exact(self, x: X, what: str) -> X:
        if x.kind == "b":
            return X(f"(uint64_t)({x.code})", "d", 0, 1)
        if x.kind != "d" or not x.exact:
            raise self.fail(f"{what} whose value may lie outside [0, 2^64)")
        return x

    def cond(self, j: Json) -> str:
        x = self.ex(j)
        if x.kind == "b":
            return x.code
        if x.kind != "d" or not x.known:
            raise self.fail("a truth value of an expression that may lie outside [-2^63, 2^64)")
        return f"({x.code} != 0)"

    def data(self, x: X) -> X:
        """A truth value used as data is 0 or 1."""
        if x.kind == "b":
            return X(f"(uint64_t)({x.code})", "d", 0, 1)
        if x.kind != "d":
            raise self.fail(f"a {x.kind} used as a value")
        return x

    def op(self, o: Json) -> X:
        op = o["op"]
        left: Any = o.get("left")
        right: Any = o.get("right")
        if op == "?":
            c = self.cond(o["cond"])
            lt, rt = self.ex(left), self.ex(right)
            if lt.kind == "b" and rt.kind == "b":
                return X(f"({c} ? {lt.code} : {rt.code})", "b")
            lt, rt = self.data(lt), self.data(rt)
            code = f"({c} ? {lt.code} : {rt.code})"
            if lt.known and rt.known:
                assert lt.lo is not None and rt.lo is not None and lt.hi is not None
                assert rt.hi is not None
                return _exact(code, min(lt.lo, rt.lo), max(lt.hi, rt.hi))
            return X(code, "d")
        if op in ("==", "!="):
            lt, rt = self.ex(left), self.ex(right)
            if lt.kind == "h" or rt.kind == "h":
                return self._header_eq(lt, rt, op)
            if lt.kind == "b" and rt.kind == "b":
                return X(f"(({lt.code}) {op} ({rt.code}))", "b")
            return self.compare(self.data(lt), self.data(rt), op)
        if op == "access_field":
            lt = self.ex(left)
            if lt.kind != "h":
                raise self.fail("access_field on a non-header")
            return self.dyn_field(lt, int(right))
        if op == "valid":
            rt = self.ex(right)
            if rt.kind != "h":
                raise self.fail("isValid of a non-header")
            return X(f"p->valid[{rt.code}]", "b")
        if op in ("dereference_header_stack", "dereference_stack"):
            lt = self.ex(left)
            if lt.kind != "s":
                raise self.fail("a stack index on a non-stack")
            i = self.need_exact(self.data(self.ex(right)), "a stack index")
            return X(f"xm_stack_elem(s, {lt.hidx}, {i.code})", "h", htype=lt.htype)
        if op in ("last_stack_index", "size_stack"):
            raise self.fail(f"{op} of a header stack")  # as push and pop: no test runs it
        if op == "not":
            return X(f"!{self.cond(right)}", "b")
        if op in ("and", "or"):
            sym = "&&" if op == "and" else "||"
            return X(f"({self.cond(left)} {sym} {self.cond(right)})", "b")
        if op == "d2b":
            return X(self.cond(right), "b")
        if op == "b2d":
            rt = self.ex(right)
            if rt.kind == "b":
                return X(f"(uint64_t)({rt.code})", "d", 0, 1)
            return rt
        if op == "~":
            rt = self.data(self.ex(right))
            if rt.known:
                assert rt.lo is not None and rt.hi is not None
                return _exact(f"(~{rt.code})", -rt.hi - 1, -rt.lo - 1)
            return X(f"(~{rt.code})", "d")
        if op in ("+", "-") and left is None:
            rt = self.data(self.ex(right))
            if op == "+":
                return rt
            if rt.known:
                assert rt.lo is not None and rt.hi is not None
                return _exact(f"(UINT64_C(0) - {rt.code})", -rt.hi, -rt.lo)
            return X(f"(UINT64_C(0) - {rt.code})", "d")
        lt, rt = self.data(self.ex(left)), self.data(self.ex(right))
        code = f"({lt.code} {op} {rt.code})"
        both = lt.known and rt.known
        a0, a1, b0, b1 = lt.lo or 0, lt.hi or 0, rt.lo or 0, rt.hi or 0
        if op == "+":
            return _exact(code, a0 + b0, a1 + b1) if both else X(code)
        if op == "-":
            return _exact(code, a0 - b1, a1 - b0) if both else X(code)
        if op == "*":
            if both:
                corners = (a0 * b0, a0 * b1, a1 * b0, a1 * b1)
                return _exact(code, min(corners), max(corners))
            return X(code)
        if op == "&":
            if lt.exact and rt.exact:
                return X(code, "d", 0, min(a1, b1))
            if lt.exact:
                return X(code, "d", 0, a1)
            if rt.exact:
                return X(code, "d", 0, b1)
            return X(code)
        if op in ("|", "^"):
            if lt.exact and rt.exact:
                return X(code, "d", 0, mask_of(max(a1, b1).bit_length()))
            return X(code)
        if op == "<<":
            n = self.need_exact(rt, "a shift amount")
            assert n.hi is not None
            if n.hi < 64:
                if lt.exact:
                    return _exact(code, a0 << b0, a1 << b1)
                return X(code)
            return X(f"({n.code} >= 64 ? UINT64_C(0) : {lt.code} << {n.code})")
        if op == ">>":
            a = self.need_exact(lt, "a right shift")
            n = self.need_exact(rt, "a shift amount")
            assert n.hi is not None
            if n.hi < 64:
                return X(code, "d", 0, a1)
            return X(f"({n.code} >= 64 ? UINT64_C(0) : {a.code} >> {n.code})", "d", 0, a1)
        if op in (">", "<", ">=", "<="):
            return self.compare(lt, rt, op)
        if op in ("/", "%"):
            self.need_exact(lt, "a division")
            self.need_exact(rt, "a division")
            fn = "xm_div" if op == "/" else "xm_mod"
            return X(f"{fn}(s, {lt.code}, {rt.code})", "d", 0, a1)
        if op == "two_comp_mod":
            w = self._const_width(rt, op)
            return X(f"xm_sext({lt.code}, {w})", "d", -(1 << (w - 1)), (1 << (w - 1)) - 1)
        if op == "sat_cast":
            w = self._const_width(rt, op)
            lo, hi = -(1 << (w - 1)), (1 << (w - 1)) - 1
            if not lt.signed:
                raise self.fail("a saturating cast whose value may lie outside [-2^63, 2^63)")
            assert lt.lo is not None and lt.hi is not None
            v = f"(int64_t){lt.code}"
            code = (
                f"({v} < INT64_C({lo}) ? (uint64_t)INT64_C({lo}) : "
                f"{v} > INT64_C({hi}) ? (uint64_t)INT64_C({hi}) : {lt.code})"
            )
            return X(code, "d", max(lt.lo, lo), min(lt.hi, hi))
        if op == "usat_cast":
            if rt.lo is None or rt.lo != rt.hi:
                raise self.fail("usat_cast to a width that is not a constant")
            top = mask_of(rt.lo)
            if lt.exact:
                if top >= U64:
                    return lt
                v = lt.code
                return X(f"({v} > {c_int(top)} ? {c_int(top)} : {v})", "d", 0, min(a1, top))
            if not lt.signed:
                raise self.fail("a saturating cast whose value may lie outside [-2^63, 2^64)")
            v = f"(int64_t){lt.code}"
            sat = f"({lt.code} > {c_int(top)} ? {c_int(top)} : {lt.code})" if top < U64 else lt.code
            return X(f"({v} < 0 ? UINT64_C(0) : {sat})", "d", 0, min(max(a1, 0), top))
        raise self.fail(f"operator {op!r}")

    def _const_width(self, x: X, op: str) -> int:
        if x.lo is None or x.lo != x.hi or not 1 <= x.lo <= 64:
            raise self.fail(f"{op} to a width that is not a constant in [1, 64]")
        return int(x.lo)

    def compare(self, a: X, b: X, op: str) -> X:
        """A comparison of true values: unsigned when both are in [0, 2^64), signed when both
        are in [-2^63, 2^63)."""
        if a.exact and b.exact:
            return X(f"({a.code} {op} {b.code})", "b")
        if a.signed and b.signed:
            return X(f"((int64_t){a.code} {op} (int64_t){b.code})", "b")
        raise self.fail("a comparison of values that may lie outside [0, 2^64)")

    def _header_eq(self, lt: X, rt: X, op: str) -> X:
        if lt.kind != "h" or rt.kind != "h":
            raise self.fail("a header compared with a non-header")
        if lt.htype is not rt.htype or lt.htype is None or lt.htype.vl_index is not None:
            raise self.fail("header comparison of different or variable-length types")
        code = (
            f"(p->valid[{lt.code}] && p->valid[{rt.code}] && "
            f"memcmp(&{self.hdr(lt)}, &{self.hdr(rt)}, sizeof(struct {self.tname[lt.htype.name]}))"
            " == 0)"
        )
        return X(code if op == "==" else f"!{code}", "b")

    # ---- stores -----------------------------------------------------------------------------

    def store(self, dst: X, value: X) -> list[str]:
        if dst.lvalue is None:
            raise self.fail(f"assignment to {dst.code}")
        w, target = dst.fwidth, dst.ref
        v = self.data(value)
        if v.exact and v.hi is not None and v.hi <= mask_of(w):
            return [f"{target} = {v.code};"]
        if w >= 64:
            return [f"{target} = {v.code};"]
        return [f"{target} = {v.code} & {c_int(mask_of(w))};"]

    def lval(self, j: Json) -> X:
        x = self.ex(j)
        if x.lvalue is None:
            raise self.fail(f"not an assignable field: {j!r}")
        return x

    # ---- named objects ----------------------------------------------------------------------

    def _register(self, name: str) -> str:
        if name not in self.register_idx:
            raise self.fail(f"unknown register {name}")
        return f"REG_{c_ident(name)}"

    def _calculation(self, name: str) -> str:
        if name not in self.calc_fn:
            algo = self.prog.calculations.get(name, {}).get("algo", "?")
            raise self.fail(f"hash algorithm {algo} (calculation {name})")
        return self.calc_fn[name]

    # ---- primitives -------------------------------------------------------------------------

    def prim(self, pj: Json) -> list[str]:
        op = pj["op"]
        ps = pj.get("parameters", [])

        def ex(i: int) -> X:
            return self.ex(ps[i])

        def exact(i: int, what: str) -> X:
            return self.need_exact(self.data(ex(i)), what)

        if op in ("assign", "modify_field"):
            dst = ex(0)
            if dst.kind == "h":
                return self._assign_header(dst, ex(1))
            return self.store(self.lval(ps[0]), ex(1))
        if op in ("assign_header", "copy_header"):
            return self._assign_header(ex(0), ex(1))
        if op == "assign_VL":
            d, sx = self.ex(ps[0]), self.ex(ps[1])  # field loads raise on varbit: resolve here
            raise self.fail(f"assign_VL ({d.code} = {sx.code})")
        if op in ("add_header", "add_header_fast", "remove_header"):
            h = ex(0)
            if h.kind != "h":
                raise self.fail(f"{op} of a non-header")
            if h.hidx < 0:
                return self._dyn_header_op(op, h)
            return self._header_op(op, h.hidx)
        if op in ("push", "pop", "assign_header_stack"):
            # (no test program of the corpus shifts or copies a stack: not generated untested)
            raise self.fail(f"{op} on a header stack")
        if op == "exit":
            return ["p->regs.exit = 1;"]
        if op in ("mark_to_drop", "drop"):
            std = self.std if op == "drop" else self.prog.header(ps[0]["value"])
            if std is None:
                raise self.fail("drop without standard_metadata")
            fi = std.htype.field_index
            lines = [f"{self.fref(std.index, fi['egress_spec'])} = {DROP_PORT};"]
            if "mcast_grp" in fi:
                lines.append(f"{self.fref(std.index, fi['mcast_grp'])} = 0;")
            return lines
        if op == "modify_field_with_hash_based_offset":
            base = self.data(ex(1))
            calc = ex(2)
            size = exact(3, "a hash size")
            t = self.fresh()
            val = X(f"({base.code} + {calc.obj}(s, p) % ({t} > 0 ? {t} : 1))")
            return [f"uint64_t {t} = {size.code};", *self.store(self.lval(ps[0]), val)]
        if op == "modify_field_rng_uniform":
            lo, hi = exact(1, "a random range"), exact(2, "a random range")
            t = self.fresh()
            dst = self.lval(ps[0])
            return [
                f"uint64_t {t}_lo = {lo.code}, {t}_hi = {hi.code};",
                f"if ({t}_lo <= {t}_hi) {{",
                *["    " + ln for ln in self.store(dst, X(f"xm_randint(s, {t}_lo, {t}_hi)"))],
                "}",
            ]
        if op == "generate_digest":
            return [f"p->regs.learn_id = (int64_t){self.small(exact(1, 'a digest id')).code};"]
        if op in ("clone_ingress_pkt_to_egress", "clone_egress_pkt_to_egress"):
            sess = self.data(ex(0))
            fl = self.small(exact(1, "a field list id"))
            return [
                f"p->regs.clone_session = (int64_t)({sess.code} & 0xffff);",
                f"p->regs.clone_field_list = (int64_t){fl.code};",
            ]
        if op in ("resubmit", "recirculate"):
            fl = self.small(exact(0, "a field list id"))
            reg = "resubmit_fl" if op == "resubmit" else "recirc_fl"
            return [f"p->regs.{reg} = (int64_t){fl.code};"]
        if op == "count":
            ctr = ex(0)
            idx = exact(1, "a counter index")
            return [f"xm_count(s, {ctr.obj}, {idx.code}, p);"]
        if op == "register_read":
            reg = ex(1).obj
            idx = exact(2, "a register index")
            t = self.fresh()
            dst = self.lval(ps[0])
            w = int(self.prog.register_arrays[ps[1]["value"]]["bitwidth"])
            val = X(f"s->registers[{reg}][{t}]", "d", 0, mask_of(w))
            return [
                f"uint64_t {t} = {idx.code};",
                f"if ({t} < s->register_size[{reg}]) {{",
                *["    " + ln for ln in self.store(dst, val)],
                "}",
            ]
        if op == "register_write":
            reg = ex(0).obj
            idx = exact(1, "a register index")
            val = self.data(ex(2))
            t = self.fresh()
            w = int(self.prog.register_arrays[ps[0]["value"]]["bitwidth"])
            masked = val.code if w >= 64 else f"{val.code} & {c_int(mask_of(w))}"
            return [
                f"uint64_t {t} = {idx.code};",
                f"if ({t} < s->register_size[{reg}]) s->registers[{reg}][{t}] = {masked};",
            ]
        if op == "truncate":
            n = self.small(exact(0, "a truncate length"))
            t = self.fresh()
            return [
                f"int64_t {t} = (int64_t){n.code};",
                f"p->regs.truncate_len = p->regs.truncate_len < 0 || {t} < p->regs.truncate_len"
                f" ? {t} : p->regs.truncate_len;",
            ]
        if op in ("assert", "assume"):
            return [f'if (!{self.cond(ps[0])}) xm_abort(s, {ABORT_PIPELINE}, "{op} failed");']
        if op == "no_op":
            return []
        if op in ("add_to_field", "subtract_from_field"):
            dst = self.lval(ps[0])
            sym = "+" if op == "add_to_field" else "-"
            return self.store(dst, X(f"({dst.code} {sym} {self.data(ex(1)).code})"))
        binops = {
            "add": "+",
            "subtract": "-",
            "bit_and": "&",
            "bit_or": "|",
            "bit_xor": "^",
            "shift_left": "<<",
            "shift_right": ">>",
        }
        if op in binops:
            val = self.op({"op": binops[op], "left": ps[1], "right": ps[2]})
            return self.store(self.lval(ps[0]), val)
        raise self.fail(f"primitive {op}")

    def small(self, x: X) -> X:
        """A value the reference keeps in a Python int register: it must fit an int64_t."""
        if x.hi is None or x.hi >= 1 << 63:
            raise self.fail("a per-packet register value that may not fit 63 bits")
        return x

    def _static(self, hidx: int) -> X:
        return X(self.hid(hidx), "h", hidx=hidx, htype=self.prog.headers[hidx].htype)

    def _dyn_header_op(self, op: str, h: X) -> list[str]:
        """add/remove_header of a stack element chosen at run time (a fixed-size type)."""
        assert h.htype is not None
        nb = h.htype.fixed_bits // 8
        t = self.fresh("e")
        lines = [f"int64_t {t} = {h.code};"]
        v = f"p->valid[{t}]"
        if op == "add_header_fast":
            return lines + [f"{v} = 1;"]
        if op == "add_header":
            tn = self.tname[h.htype.name]
            return lines + [
                f"if (!{v}) {{",
                f"    memset(XM_H({tn}, {t}), 0, sizeof(struct {tn}));",
                f"    {v} = 1;",
                f"    p->regs.plen += {nb};",
                "}",
            ]
        return lines + [f"if ({v}) {{", f"    {v} = 0;", f"    p->regs.plen -= {nb};", "}"]

    def _assign_header(self, dst: X, src: X) -> list[str]:
        if dst.kind != "h" or src.kind != "h":
            raise self.fail("header assignment of a non-header")
        if dst.htype is not src.htype or dst.htype is None:
            raise self.fail("assignment between different header types")
        if dst.hidx < 0 or src.hidx < 0:
            return [
                f"if (p->valid[{src.code}]) {{",
                f"    p->valid[{dst.code}] = 1;",
                f"    {self.hdr(dst)} = {self.hdr(src)};",
                "} else {",
                f"    p->valid[{dst.code}] = 0;",
                "}",
            ]
        a = self.prog.headers[dst.hidx]
        d, s = dst.hidx, src.hidx
        lines = [
            f"if ({self.valid(s)}) {{",
            f"    {self.valid(d)} = 1;",
            f"    p->hdr.{self.hname[d]} = p->hdr.{self.hname[s]};",
        ]
        if a.htype.vl_index is not None:
            n = int(a.htype.max_length or 0)
            lines += [
                f"    if (p->vl_bits[{self.hid(s)}] >= 0) {{",
                f"        p->vl_bits[{self.hid(d)}] = p->vl_bits[{self.hid(s)}];",
                f"        memcpy(p->vl + {self.vl_off[d]}, p->vl + {self.vl_off[s]}, {n});",
                "    }",
            ]
        lines += ["} else {", f"    {self.valid(d)} = 0;", "}"]
        return lines

    def _header_op(self, op: str, hidx: int) -> list[str]:
        ht = self.prog.headers[hidx].htype
        nb = ht.fixed_bits // 8
        hn = self.hname[hidx]
        if op == "add_header_fast":
            return [f"{self.valid(hidx)} = 1;"]
        if op == "add_header":
            lines = [
                f"if (!{self.valid(hidx)}) {{",
                f"    memset(&p->hdr.{hn}, 0, sizeof p->hdr.{hn});",
            ]
            if ht.vl_index is not None:
                lines.append(f"    p->vl_bits[{self.hid(hidx)}] = -1;")
            lines += [f"    {self.valid(hidx)} = 1;", f"    p->regs.plen += {nb};", "}"]
            return lines
        vl = f" + xm_vl_bytes(p, {self.hid(hidx)})" if ht.vl_index is not None else ""
        return [
            f"if ({self.valid(hidx)}) {{",
            f"    {self.valid(hidx)} = 0;",
            f"    p->regs.plen -= {nb}{vl};",
            "}",
        ]

    # ---- the whole file ---------------------------------------------------------------------

    def generate(self) -> Generated:
        prog = self.prog
        g = Generated(source="")
        self._preamble()
        self._types()
        self._state(g)
        self._stack_helpers()
        self._declarations()
        self._calculations()
        self.selectors()
        self._actions()
        self._parser()
        self._checksums()
        self._deparser(g)
        self._control(g)
        self._entry_points()
        g.arch = self._architecture(g)
        if g.arch:
            self.out += hop_source().splitlines()
        g.source = "\n".join(self.out) + "\n"
        g.header_slots = list(self.slots)
        g.nfields = self.nfields
        g.max_params = self.max_params
        g.nheaders = len(prog.headers)
        g.vl_bytes = self.vl_bytes
        g.counters = dict(self.counter_idx)
        g.registers = dict(self.register_idx)
        g.profiles = dict(self.profile_idx)
        g.cdef = self._cdef(g)
        if g.arch:
            g.cdef += _ARCH_CDEF + hop_cdef()
        return g

    def _preamble(self) -> None:
        self.out += [
            f"/* Generated by testbed/switch/native/cgen.py (version {GENERATOR_VERSION}) from a",
            " * bmv2 JSON program: do not edit. The Python pipeline (testbed/switch/codegen.py)",
            " * is the reference this code is tested against. */",
            "#define _GNU_SOURCE /* ppoll: the switch process's packet loop waits to the ns */",
            "#include <setjmp.h>",
            "#include <stddef.h>",
            "#include <stdint.h>",
            "#include <string.h>",
            "",
            "typedef unsigned __int128 xm_u128;",
            "",
        ]
        self.out += _HELPERS.splitlines()

    def _types(self) -> None:
        prog = self.prog
        self.emit("/* ---- header types: every field a uint64_t ---- */")
        for t, ht in prog.header_types.items():
            self.emit(f"struct {self.tname[t]} {{")
            if not ht.fields:
                self.emit("uint64_t _empty;", 1)
            for (fname, w, _), cname in zip(ht.fields, self.fnames[t], strict=True):
                width = "variable-length, bytes in p->vl" if w == 0 else f"{w} bits"
                self.emit(f"uint64_t {cname}; /* {fname}: {width} */", 1)
            self.emit("};")
        self.emit()
        self.emit("struct xm_headers {")
        for h in prog.headers:
            self.emit(f"struct {self.tname[h.htype.name]} {self.hname[h.index]};", 1)
        self.emit("};")
        self.emit(
            f"_Static_assert(sizeof(struct xm_headers) == {self.nfields} * sizeof(uint64_t),"
            ' "headers are a flat array of uint64_t");'
        )
        self.emit()
        self.emit("enum xm_header_id {")
        for h in prog.headers:
            self.emit(f"{self.hid(h.index)} = {h.index},", 1)
        self.emit("};")
        self.emit(f"#define NHEADERS {len(prog.headers)}")
        self.emit()
        self.emit("struct xm_regs {")
        for r in PKT_REGS:
            self.emit(f"int64_t {r};", 1)
        self.emit("};")
        self.emit()
        self.emit("typedef struct xm_packet {")
        self.emit("struct xm_headers hdr;", 1)
        self.emit("uint8_t valid[NHEADERS];", 1)
        self.emit("int32_t vl_bits[NHEADERS]; /* bits in a variable-length field; -1: none */", 1)
        self.emit(f"uint8_t vl[{self.vl_bytes}];", 1)
        self.emit("struct xm_regs regs;", 1)
        self.emit(f"int64_t sn[{max(1, len(self.prog.stacks))}]; /* each stack's next index */", 1)
        self.emit("const uint8_t *payload;", 1)
        self.emit("uint64_t payload_len;", 1)
        self.emit("} xm_packet;")
        self.emit()

    def _state(self, g: Generated) -> None:
        prog = self.prog
        self.emit("/* ---- the switch's state: tables, profiles, counters, registers ---- */")
        idx = 0
        for pl in prog.pipelines:
            for t in pl["tables"]:
                self.table_idx[t["name"]] = idx
                self.emit(f"#define TBL_{c_ident(t['name'])} {idx}")
                kinds = [k["match_type"] for k in t["key"]]
                widths = [1 if k["match_type"] == "valid" else self._key_width(k) for k in t["key"]]
                indirect = t.get("type", "simple") != "simple"
                g.tables[t["name"]] = TableInfo(
                    t["name"],
                    idx,
                    kinds,
                    widths,
                    indirect,
                    t.get("action_profile") if indirect else None,
                    bool(t.get("with_counters")),
                )
                idx += 1
        for name, i in self.profile_idx.items():
            self.emit(f"#define PROF_{c_ident(name)} {i}")
        for name, i in self.counter_idx.items():
            self.emit(f"#define CTR_{c_ident(name)} {i}")
        for name, i in self.register_idx.items():
            self.emit(f"#define REG_{c_ident(name)} {i}")
        self.ntables = max(1, idx)
        self.emit(
            _STATE.format(
                tail=_STATE_C_TAIL,
                ntables=self.ntables,
                nprofiles=max(1, len(self.profile_idx)),
                ncounters=max(1, len(self.counter_idx)),
                nregisters=max(1, len(self.register_idx)),
            )
        )

    def _stack_helpers(self) -> None:
        prog = self.prog
        if not prog.stacks:
            return
        slots = ", ".join(str(x) for x in self.slots)
        width = max(len(st.members) for st in prog.stacks)
        members = ", ".join(
            "{" + ", ".join(f"HDR_{self.hname[m]}" for m in st.members) + "}" for st in prog.stacks
        )
        sizes = ", ".join(str(len(st.members)) for st in prog.stacks)
        self.emit("/* ---- header stacks: " + ", ".join(st.name for st in prog.stacks) + " ---- */")
        self.emit(
            f"static const uint32_t xm_header_slot[NHEADERS] __attribute__((unused)) = {{{slots}}};"
        )
        self.emit(f"static const int xm_stack_member[{len(prog.stacks)}][{width}] = {{{members}}};")
        self.emit(f"static const int64_t xm_stack_size[{len(prog.stacks)}] = {{{sizes}}};")
        self.out += _STACK_HELPERS.splitlines()

    def _key_width(self, k: Json) -> int:
        hidx, fidx = self.prog.field_ref(k["target"][0], k["target"][1])
        return self.prog.field_width((hidx, fidx))

    def _declarations(self) -> None:
        self.emit(
            "static void run_action(xm_state *s, xm_packet *p, uint32_t id, const uint64_t *ad);"
        )
        self.emit()

    # ---- calculations -----------------------------------------------------------------------

    def _calculations(self) -> None:
        names = self._unique([c_ident(n) for n in self.prog.calculations])
        for (name, cj), cname in zip(self.prog.calculations.items(), names, strict=True):
            self.where = f"calculation {name}"
            if cj["algo"] not in C_HASHES:
                continue  # only an error where it is used
            fn = f"calc_{cname}"
            self._field_buffer(fn, cj["input"], cj["algo"], f"calculation {name}")
            self.calc_fn[name] = fn

    def _field_buffer(self, fn: str, inputs: list[Json], algo: str, what: str) -> None:
        """bmv2's BufBuilder as the reference writes it: fields bit-packed back to back (a
        header's fields skipped while it is invalid), constants, whole headers, the payload;
        then the hash of the bytes, zero-padded."""
        body: list[str] = []
        maxbits = 0
        aligned = True
        uses_payload = False
        group: list[tuple[int, str]] = []
        group_hidx = -1

        def close() -> None:
            nonlocal group, group_hidx, maxbits, aligned
            if not group:
                return
            inst = self.prog.headers[group_hidx]
            total = sum(w for w, _ in group)
            maxbits += total
            aligned = aligned and total % 8 == 0
            ind = "" if inst.metadata else "    "
            if not inst.metadata:
                body.append(f"if ({self.valid(group_hidx)}) {{")
            for w, code in group:
                body.append(f"{ind}xm_put_bits(buf, nb, {w}, {code}); nb += {w};")
            if not inst.metadata:
                body.append("}")
            group, group_hidx = [], -1

        for inp in inputs:
            t = inp["type"]
            if t == "field":
                hidx, fidx = self.prog.field_ref(inp["value"][0], inp["value"][1])
                inst = self.prog.headers[hidx]
                if fidx >= 0 and inst.htype.vl_index == fidx:
                    close()
                    mx = int(inst.htype.max_length or 0) * 8
                    maxbits += mx
                    guard = "" if inst.metadata else f"if ({self.valid(hidx)}) "
                    body.append(
                        f"{guard}{{ xm_put_bytes(buf, nb, p->vl + {self.vl_off[hidx]}, "
                        f"xm_vl_bytes(p, {self.hid(hidx)})); "
                        f"nb += 8 * xm_vl_bytes(p, {self.hid(hidx)}); }}"
                    )
                    continue
                if fidx < 0:
                    w, code = 1, f"(uint64_t){self.valid(hidx)}"
                else:
                    w, code = inst.htype.fields[fidx][1], self.fref(hidx, fidx)
                if hidx != group_hidx:
                    close()
                    group_hidx = hidx
                group.append((w, code))
                continue
            close()
            if t == "hexstr":
                w = int(inp["bitwidth"])
                if w > 64:
                    raise self.fail(f"a {w}-bit constant in {what}")
                body.append(
                    f"xm_put_bits(buf, nb, {w}, {c_int(hexint(inp['value']) & mask_of(w))}); "
                    f"nb += {w};"
                )
                maxbits += w
                aligned = aligned and w % 8 == 0
            elif t == "header":
                if not aligned:
                    raise self.fail(f"a whole header after a partial byte in {what}")
                inst = self.prog.header(inp["value"])
                maxbits += self._header_max_bytes(inst.index) * 8
                emit = self._emit_call(inst.index, "buf + nb / 8")
                body.append(f"if ({self.valid(inst.index)}) nb += 8 * {emit};")
            elif t == "payload":
                if not aligned:
                    raise self.fail(f"the payload after a partial byte in {what}")
                uses_payload = True
                body.append(
                    "memcpy(buf + nb / 8, p->payload, p->payload_len); nb += 8 * p->payload_len;"
                )
            else:
                raise self.fail(f"calculation input {t!r}")
        close()
        size = (maxbits + 7) // 8 + 1
        hash_fn = HASH_FN.get(algo, algo)
        self.emit(f"/* {what}: {algo} over the fields below */")
        self.emit(f"static uint64_t {fn}(xm_state *s, xm_packet *p)")
        self.emit("{")
        self.emit("(void)s; (void)p;", 1)
        if uses_payload:
            self.emit(f"uint8_t buf[{size} + p->payload_len];", 1)
            self.emit("memset(buf, 0, sizeof buf);", 1)
        else:
            self.emit(f"uint8_t buf[{size}] = {{0}};", 1)
        self.emit("uint64_t nb = 0;", 1)
        for ln in body:
            self.emit(ln, 1)
        self.emit(f"return xm_hash_{hash_fn}(buf, (nb + 7) / 8);", 1)
        self.emit("}")
        self.emit()

    # ---- actions ----------------------------------------------------------------------------

    def _actions(self) -> None:
        for aid, a in self.prog.actions.items():
            self.where = f"action {a.name}"
            self.params = [w for _, w in a.params]
            for _, w in a.params:
                if w > 64:
                    raise self.fail(f"a parameter of {w} bits")
            fn = self.action_fn[aid]
            params = ", ".join(f"{n}: ad[{i}]" for i, (n, _) in enumerate(a.params))
            self.emit(f"/* action {a.name} ({params or 'no parameters'}) */")
            self.emit(f"static void {fn}(xm_state *s, xm_packet *p, const uint64_t *ad)")
            self.emit("{")
            self.emit("(void)s; (void)p; (void)ad;", 1)
            prims = a.primitives
            jumps = any(pj["op"] in ("_jump", "_jump_if_zero") for pj in prims)
            if not jumps:
                for pj in prims:
                    self._block(self.prim(pj), 1)
            else:
                targets: set[int] = set()
                for pj in prims:
                    if pj["op"] == "_jump":
                        targets.add(self._jump_target(pj["parameters"][0], len(prims)))
                    elif pj["op"] == "_jump_if_zero":
                        targets.add(self._jump_target(pj["parameters"][1], len(prims)))
                for i, pj in enumerate(prims):
                    if i in targets:
                        self.emit(f"pc_{i}:;")
                    if pj["op"] == "_jump":
                        tgt = self._jump_target(pj["parameters"][0], len(prims))
                        self.emit(f"goto pc_{tgt};", 1)
                    elif pj["op"] == "_jump_if_zero":
                        tgt = self._jump_target(pj["parameters"][1], len(prims))
                        c = self.cond(pj["parameters"][0])
                        self.emit(f"if (!{c}) goto pc_{tgt};", 1)
                    else:
                        self._block(self.prim(pj), 1)
                if len(prims) in targets:
                    self.emit(f"pc_{len(prims)}:;")
            self.emit("}")
            self.emit()
            self.params = None
        self.emit(
            "static void run_action(xm_state *s, xm_packet *p, uint32_t id, const uint64_t *ad)"
        )
        self.emit("{")
        self.emit("(void)s; (void)p; (void)ad;", 1)
        self.emit("switch (id) {", 1)
        for aid in self.prog.actions:
            self.emit(f"case {aid}: {self.action_fn[aid]}(s, p, ad); break;", 1)
        self.emit("default: break;", 1)
        self.emit("}", 1)
        self.emit("}")
        self.emit()

    def _jump_target(self, j: Json, n: int) -> int:
        x = self.ex(j)
        if x.lo is None or x.lo != x.hi:
            raise self.fail("a jump to a computed target")
        return min(int(x.lo), n)

    def _block(self, lines: list[str], indent: int) -> None:
        """Statements of one primitive, in a block of their own when they declare locals."""
        if any(ln.startswith(("uint64_t ", "int64_t ")) for ln in lines):
            self.emit("{", indent)
            for ln in lines:
                self.emit(ln, indent + 1)
            self.emit("}", indent)
        else:
            for ln in lines:
                self.emit(ln, indent)

    # ---- header codecs and the parser -------------------------------------------------------

    def _header_max_bytes(self, hidx: int) -> int:
        ht = self.prog.headers[hidx].htype
        if ht.vl_index is not None:
            return int(ht.max_length or 0)
        return ht.fixed_bits // 8

    def _check_codec(self, hidx: int) -> None:
        ht = self.prog.headers[hidx].htype
        if ht.vl_index is None and ht.fixed_bits % 8:
            raise self.fail(f"header {self.prog.headers[hidx].name} of {ht.fixed_bits} bits")

    def _emit_call(self, hidx: int, dst: str) -> str:
        """Code writing header hidx at dst and giving its size in bytes."""
        self._check_codec(hidx)
        ht = self.prog.headers[hidx].htype
        if ht.vl_index is not None:
            return f"xm_emit_vl(p, {self.hid(hidx)}, {self.vl_off[hidx]}, {dst})"
        return f"emit_{self.tname[ht.name]}(&p->hdr.{self.hname[hidx]}, {dst})"

    def _codecs(self) -> None:
        for t, ht in self.prog.header_types.items():
            if ht.vl_index is not None or ht.fixed_bits % 8:
                continue
            tn = self.tname[t]
            nb = ht.fixed_bits // 8
            self.emit(f"static inline void extract_{tn}(struct {tn} *h, const uint8_t *b)")
            self.emit("{")
            self.emit("(void)h; (void)b;", 1)
            off = 0
            for (_, w, _), cn in zip(ht.fields, self.fnames[t], strict=True):
                self.emit(f"h->{cn} = xm_get_bits(b, {off}, {w});", 1)
                off += w
            self.emit("}")
            self.emit(f"static inline uint64_t emit_{tn}(const struct {tn} *h, uint8_t *b)")
            self.emit("{")
            self.emit("(void)h;", 1)
            self.emit(f"memset(b, 0, {nb});", 1)
            off = 0
            for (_, w, _), cn in zip(ht.fields, self.fnames[t], strict=True):
                self.emit(f"xm_put_bits(b, {off}, {w}, h->{cn});", 1)
                off += w
            self.emit(f"return {nb};", 1)
            self.emit("}")
        self.emit()

    def _parser(self) -> None:
        self._codecs()
        prog = self.prog
        pj = prog.parser("parser")
        err = prog.errors
        self.parser = True
        states = pj["parse_states"]
        sname = dict(
            zip(
                [s["name"] for s in states],
                self._unique([c_ident(s["name"]) for s in states]),
                strict=True,
            )
        )
        self.emit("enum xm_parse_state {")
        for i, s in enumerate(states):
            self.emit(f"STATE_{sname[s['name']]} = {i},", 1)
        self.emit("};")
        sig = "(xm_state *s, xm_packet *p, struct xm_parse_ctx *c)"
        for s in states:
            self.emit(f"static int parse_{sname[s['name']]}{sig};")
        self.emit()
        for s in states:
            self.where = f"parser state {s['name']}"
            self.emit(f"/* parser state {s['name']} */")
            self.emit(f"static int parse_{sname[s['name']]}{sig}")
            self.emit("{")
            self.emit("(void)s; (void)p; (void)c;", 1)
            for op in s["parser_ops"]:
                self._block(self._parser_op(op, err), 1)
            self._transition(s, sname)
            self.emit("}")
            self.emit()
        init = pj.get("init_state")
        self.emit(
            "static int64_t parse_packet(xm_state *s, xm_packet *p, const uint8_t *buf, uint64_t n)"
        )
        self.emit("{")
        self.emit("struct xm_parse_ctx c = {buf, n, 0, 0, 0};", 1)
        self.emit("(void)s; (void)p;", 1)
        first = f"STATE_{sname[init]}" if init in sname else "PARSE_DONE"
        self.emit(f"int st = {first};", 1)
        self.emit("while (st >= 0) {", 1)
        self.emit("switch (st) {", 2)
        for s in states:
            n = sname[s["name"]]
            self.emit(f"case STATE_{n}: st = parse_{n}(s, p, &c); break;", 2)
        self.emit("default: st = PARSE_DONE; break;", 2)
        self.emit("}", 2)
        self.emit("}", 1)
        self.emit("if (st == PARSE_ERROR) {", 1)
        self.emit("p->payload = buf + c.err_pos; p->payload_len = n - c.err_pos;", 2)
        self.emit("return c.err;", 2)
        self.emit("}", 1)
        self.emit("p->payload = buf + c.pos; p->payload_len = n - c.pos;", 1)
        self.emit(f"return {err['NoError']};", 1)
        self.emit("}")
        self.emit()
        self.parser = False

    def _extract(self, hidx: int, err: dict[str, int], vl: Json | None) -> list[str]:
        ht = self.prog.headers[hidx].htype
        hn = self.hname[hidx]
        if ht.vl_index is None:
            self._check_codec(hidx)
            if ht.fixed_bits == 0:
                return [f"{self.valid(hidx)} = 1;"]
            nb = ht.fixed_bits // 8
            return [
                f"if (c->n - c->pos < {nb}) XM_PARSER_ERROR({err['PacketTooShort']});",
                f"extract_{self.tname[ht.name]}(&p->hdr.{hn}, c->buf + c->pos);",
                f"{self.valid(hidx)} = 1;",
                f"c->pos += {nb};",
            ]
        if vl is None:
            raise self.fail(
                f"extract of variable-length {self.prog.headers[hidx].name} without a length"
            )
        bits = self.need_exact(self.data(self.ex(vl)), "a variable-length field's size")
        t = self.fresh("vb")
        maxb = int(ht.max_length or 0)
        return [
            f"uint64_t {t} = {bits.code};",
            f"if ({t} % 8) XM_PARSER_ERROR({err['ParserInvalidArgument']});",
            f"if (c->n - c->pos < {t} / 8) XM_PARSER_ERROR({err['PacketTooShort']});",
            f"if ({maxb} < {t} / 8) XM_PARSER_ERROR({err['HeaderTooShort']});",
            f"memcpy(p->vl + {self.vl_off[hidx]}, c->buf + c->pos, {t} / 8);",
            f"p->vl_bits[{self.hid(hidx)}] = (int32_t){t};",
            f"{self.valid(hidx)} = 1;",
            f"c->pos += {t} / 8;",
        ]

    def _extract_stack(self, name: str, err: dict[str, int]) -> list[str]:
        """extract(stack.next): the element at the stack's next index, then the index on."""
        st = self.stack(name)
        assert st.htype is not None
        self._check_codec(self.prog.stacks[st.hidx].members[0])
        tn = self.tname[st.htype.name]
        nb = st.htype.fixed_bits // 8
        size = len(self.prog.stacks[st.hidx].members)
        t = self.fresh("e")
        return [
            f"if (p->sn[{st.hidx}] >= {size}) XM_PARSER_ERROR({err['StackOutOfBounds']});",
            f"if (c->n - c->pos < {nb}) XM_PARSER_ERROR({err['PacketTooShort']});",
            f"int64_t {t} = xm_stack_member[{st.hidx}][p->sn[{st.hidx}]];",
            f"extract_{tn}(XM_H({tn}, {t}), c->buf + c->pos);",
            f"p->valid[{t}] = 1;",
            f"c->pos += {nb};",
            f"p->sn[{st.hidx}] += 1;",
        ]

    def _parser_op(self, op: Json, err: dict[str, int]) -> list[str]:
        kind = op["op"]
        ps = op["parameters"]
        if kind in ("extract", "extract_VL"):
            target = ps[0]
            if target["type"] == "stack":
                return self._extract_stack(target["value"], err)
            if target["type"] != "regular":
                raise self.fail(f"extract into a {target['type']}")
            inst = self.prog.header(target["value"])
            return self._extract(inst.index, err, ps[1] if kind == "extract_VL" else None)
        if kind == "set":
            dst = self.lval(ps[0])
            src = ps[1]
            lines = []
            if src["type"] == "lookahead":
                nbytes = (int(src["value"][1]) + 7) // 8
                lines.append(
                    f"if (c->n - c->pos < {nbytes}) XM_PARSER_ERROR({err['PacketTooShort']});"
                )
            return lines + self.store(dst, self.ex(src))
        if kind == "verify":
            code = self.need_exact(self.data(self.ex(ps[1])), "an error code")
            self.small(code)
            return [f"if (!{self.cond(ps[0])}) XM_PARSER_ERROR((int64_t){code.code});"]
        if kind in ("shift", "advance"):
            amount = self.need_exact(self.data(self.ex(ps[0])), "a parser advance")
            t = self.fresh()
            if kind == "shift":
                return [
                    f"uint64_t {t} = {amount.code};",
                    f"if (c->n - c->pos < {t}) XM_PARSER_ERROR({err['PacketTooShort']});",
                    f"c->pos += {t};",
                ]
            return [
                f"uint64_t {t} = {amount.code};",
                f"if ({t} % 8) XM_PARSER_ERROR({err['ParserInvalidArgument']});",
                f"if (c->n - c->pos < {t} / 8) XM_PARSER_ERROR({err['PacketTooShort']});",
                f"c->pos += {t} / 8;",
            ]
        if kind == "primitive":
            return self.prim(ps[0])
        raise self.fail(f"parser operation {kind}")

    def _transition(self, s: Json, sname: dict[str, str]) -> None:
        def target(name: str | None) -> str:
            if name is None:
                return "PARSE_DONE"
            if name not in sname:
                raise self.fail(f"transition to unknown state {name}")
            return f"STATE_{sname[name]}"

        def ttype_of(t: Json) -> str:
            ttype = str(t.get("type", "hexstr"))
            return "default" if ttype == "hexstr" and t.get("value") == "default" else ttype

        keys = s.get("transition_key", [])
        trans = s.get("transitions", [])
        default = "PARSE_DONE"
        for t in trans:
            if ttype_of(t) == "default":
                default = target(t.get("next_state"))
        if not keys:
            self.emit(f"return {default};", 1)
            return
        parts: list[tuple[X, int]] = []
        for k in keys:
            if k["type"] == "lookahead":
                w = int(k["value"][1])
                if w > 64:
                    raise self.fail(f"a {w}-bit lookahead key")
                parts.append((X(f"xm_peek(c, {int(k['value'][0])}, {w})", "d", 0, mask_of(w)), w))
            else:
                x = self.data(self.ex(k))
                # the reference's width of a key part: a field's, a constant's, else 1
                w = 1
                if x.lvalue is not None:
                    w = x.fwidth
                    x = X(x.ref, "d", 0, mask_of(w))  # a signed field's bits, as the reference
                elif k["type"] == "field":
                    w = 1  # $valid$
                elif k["type"] == "hexstr":
                    w = int(k.get("bitwidth", 0)) or 1
                parts.append((self.need_exact(x, "a transition key"), w))
        total = sum(8 * ((w + 7) // 8) for _, w in parts)
        terms = []
        hi = 0
        for x, w in parts:
            total -= 8 * ((w + 7) // 8)
            assert x.hi is not None
            hi |= x.hi << total
            terms.append(f"({x.code} << {total})" if total else x.code)
        if hi > U64:
            raise self.fail("a transition key wider than 64 bits")
        self.emit(f"uint64_t k = {' | '.join(terms)};", 1)
        for t in trans:
            ttype = ttype_of(t)
            if ttype == "default":
                continue
            nxt = target(t.get("next_state"))
            if ttype != "hexstr":
                raise self.fail(f"{ttype} transition")
            val = hexint(t["value"])
            mask = t.get("mask")
            if mask is None:
                if 0 <= val <= U64:
                    self.emit(f"if (k == {c_int(val)}) return {nxt};", 1)
            else:
                m = hexint(mask)
                want = val & m
                if 0 <= want <= U64:
                    self.emit(f"if ((k & {c_int(m)}) == {c_int(want)}) return {nxt};", 1)
        self.emit(f"return {default};", 1)

    # ---- checksums and the deparser ---------------------------------------------------------

    def _checksums(self) -> None:
        prog = self.prog
        verify: list[str] = []
        update: list[str] = []
        for ck in prog.checksums:
            self.where = f"checksum {ck['name']}"
            calc = prog.calculations.get(ck["calculation"])
            if calc is None:
                raise self.fail(f"unknown calculation {ck['calculation']}")
            if calc["algo"] not in C_HASHES:
                raise self.fail(f"hash algorithm {calc['algo']}")
            hidx, fidx = prog.field_ref(ck["target"][0], ck["target"][1])
            w = prog.headers[hidx].htype.fields[fidx][1]
            cond = self.cond(ck["if_cond"]) if ck.get("if_cond") else "1"
            fn = self.calc_fn[calc["name"]]
            fld = self.fref(hidx, fidx)
            m = c_int(mask_of(w))
            if ck.get("verify", True):
                verify.append(
                    f"if ({self.valid(hidx)} && {cond} && ({fn}(s, p) & {m}) != {fld}) bad = 1;"
                )
            if ck.get("update", True):
                update.append(f"if ({cond}) {fld} = {fn}(s, p) & {m};")
        self.emit("static int verify_checksums(xm_state *s, xm_packet *p)")
        self.emit("{")
        self.emit("int bad = 0;", 1)
        self.emit("(void)s; (void)p;", 1)
        for ln in verify:
            self.emit(ln, 1)
        self.emit("return bad;", 1)
        self.emit("}")
        self.emit()
        self.emit("static void update_checksums(xm_state *s, xm_packet *p)")
        self.emit("{")
        self.emit("(void)s; (void)p;", 1)
        for ln in update:
            self.emit(ln, 1)
        self.emit("}")
        self.emit()

    def _deparser(self, g: Generated) -> None:
        dj = self.prog.deparser("deparser")
        self.where = f"deparser {dj.get('name', '')}"
        self.emit("/* the deparser: valid headers in order; the caller appends the payload */")
        self.emit("static uint64_t deparse(xm_state *s, xm_packet *p, uint8_t *out)")
        self.emit("{")
        self.emit("uint64_t n = 0;", 1)
        self.emit("(void)s; (void)p; (void)out;", 1)
        for pj in dj.get("primitives", []):
            self._block(self.prim(pj), 1)
        total = 0
        for hname in dj["order"]:
            inst = self.prog.header(hname)
            total += self._header_max_bytes(inst.index)
            self.emit(
                f"if ({self.valid(inst.index)}) n += {self._emit_call(inst.index, 'out + n')};", 1
            )
        self.emit("return n;", 1)
        self.emit("}")
        self.emit()
        self.emit(
            "/* the frame's length; the payload is copied after the headers when it fits in cap */"
        )
        self.emit(
            "static uint64_t deparse_with_payload(xm_state *s, xm_packet *p, uint8_t *out, "
            "uint64_t cap)"
        )
        self.emit("{")
        self.emit("uint64_t n = deparse(s, p, out);", 1)
        self.emit("if (p->payload_len && n + p->payload_len <= cap)", 1)
        self.emit("memcpy(out + n, p->payload, p->payload_len);", 2)
        self.emit("return n + p->payload_len;", 1)
        self.emit("}")
        self.emit()
        g.max_out = total

    # ---- control flow -----------------------------------------------------------------------

    def _control(self, g: Generated) -> None:
        prog = self.prog
        names: list[tuple[str, str, str]] = []  # (node name, kind, C name)
        for pl in prog.pipelines:
            for t in pl["tables"]:
                names.append((t["name"], "table", c_ident(t["name"])))
            for c in pl.get("conditionals", []):
                names.append((c["name"], "cond", c_ident(c["name"])))
            for ac in pl.get("action_calls", []):
                names.append((ac["name"], "call", c_ident(ac["name"])))
        uniq = self._unique([n for _, _, n in names])
        self.emit("enum xm_node {")
        self.emit("NODE_NONE = -1,", 1)
        for i, ((name, kind, _), cn) in enumerate(zip(names, uniq, strict=True)):
            self.node_id[name] = f"NODE_{cn}"
            self.node_fn[name] = f"{kind}_{cn}"
            self.emit(f"NODE_{cn} = {i},", 1)
        self.emit("};")
        self.emit()

        def node(name: str | None) -> str:
            if name is None:
                return "NODE_NONE"
            if name not in self.node_id:
                raise self.fail(f"control flow to unknown node {name}")
            return self.node_id[name]

        for pl in prog.pipelines:
            for t in pl["tables"]:
                self.where = f"table {t['name']}"
                self._table(t, g.tables[t["name"]], node)
            for c in pl.get("conditionals", []):
                self.where = f"conditional {c['name']}"
                self.emit(f"/* conditional {c['name']} */")
                self.emit(f"static int {self.node_fn[c['name']]}(xm_state *s, xm_packet *p)")
                self.emit("{")
                self.emit("(void)s; (void)p;", 1)
                self.emit(
                    f"return {self.cond(c['expression'])} ? {node(c.get('true_next'))} "
                    f": {node(c.get('false_next'))};",
                    1,
                )
                self.emit("}")
                self.emit()
            for ac in pl.get("action_calls", []):
                self.where = f"action call {ac['name']}"
                self.emit(f"static int {self.node_fn[ac['name']]}(xm_state *s, xm_packet *p)")
                self.emit("{")
                self.emit(f"{self.action_fn[ac['action_id']]}(s, p, 0);", 1)
                self.emit(f"return {node(ac.get('next_node'))};", 1)
                self.emit("}")
                self.emit()
        self.emit("static int run_node(xm_state *s, xm_packet *p, int n)")
        self.emit("{")
        self.emit("(void)s; (void)p;", 1)
        self.emit("switch (n) {", 1)
        for name, _, _ in names:
            self.emit(f"case {self.node_id[name]}: return {self.node_fn[name]}(s, p);", 1)
        self.emit("default: return NODE_NONE;", 1)
        self.emit("}", 1)
        self.emit("}")
        self.emit()
        for pl in prog.pipelines:
            if pl["name"] not in ("ingress", "egress"):
                continue
            self.emit(f"static void pipeline_{c_ident(pl['name'])}(xm_state *s, xm_packet *p)")
            self.emit("{")
            self.emit(f"int n = {node(pl.get('init_table'))};", 1)
            self.emit("while (n != NODE_NONE && !p->regs.exit) n = run_node(s, p, n);", 1)
            self.emit("}")
            self.emit()

    def _table(self, t: Json, info: TableInfo, node: Any) -> None:
        prog = self.prog
        fn = self.node_fn[t["name"]]
        nxt = t.get("next_tables", {})
        hit_miss = "__HIT__" in nxt or "__MISS__" in nxt
        de = t.get("default_entry") or {}
        if is_action_call(t):
            # p4c's keyless table with a const default action: it always misses
            aid = de["action_id"]
            params = [hexint(x) for x in de.get("action_data", [])]
            follow = (
                nxt.get("__MISS__")
                if hit_miss
                else nxt.get(prog.actions[aid].name, t.get("base_default_next"))
            )
            self.emit(f"/* {t['name']}: calls {prog.actions[aid].name} */")
            self.emit(f"static int {fn}(xm_state *s, xm_packet *p)")
            self.emit("{")
            if any(x > U64 or x < 0 for x in params):
                raise self.fail("an action parameter wider than 64 bits")
            vals = ", ".join(c_int(x) for x in params) or "0"
            self.emit(f"static const uint64_t ad[] = {{{vals}}};", 1)
            self.emit(f"{self.action_fn[aid]}(s, p, ad);", 1)
            self.emit(f"return {node(follow)};", 1)
            self.emit("}")
            self.emit()
            return
        keys = []
        for k in t["key"]:
            if k["match_type"] == "valid":
                tgt = k["target"]
                hname = tgt if isinstance(tgt, str) else tgt[0]
                keys.append(f"(uint64_t){self.valid(prog.header(hname).index)}")
                continue
            x = self.field(*prog.field_ref(k["target"][0], k["target"][1]))
            code = x.ref or x.code  # a signed field's bits, as the reference's key
            if k.get("mask"):
                code = f"({code} & {c_int(hexint(k['mask']))})"
            keys.append(code)
        nk = len(keys)
        desc = ", ".join(
            f"{k['match_type']} "
            + (".".join(k["target"]) if isinstance(k["target"], list) else str(k["target"]))
            for k in t["key"]
        )
        self.emit(f"/* table {t['name']}: {desc or 'no key'} */")
        self.emit(f"static int {fn}(xm_state *s, xm_packet *p)")
        self.emit("{")
        self.emit(f"struct xm_table *t = &s->tables[TBL_{c_ident(t['name'])}];", 1)
        if nk:
            self.emit(f"const uint64_t key[{nk}] = {{{', '.join(keys)}}};", 1)
            self.emit(f"int64_t row = xm_lookup(t, key, {nk});", 1)
        else:
            self.emit("int64_t row = xm_lookup(t, 0, 0);", 1)
        self.emit("uint32_t action = t->default_action;", 1)
        self.emit("const uint64_t *ad = t->default_params;", 1)
        self.emit("int hit = row >= 0;", 1)
        self.emit("if (hit) {", 1)
        self.emit(f"const uint64_t *r = t->rows + (uint64_t)row * t->stride + {2 * nk};", 2)
        if info.direct_counters:
            self.emit("t->dc_packets[row] += 1;", 2)
            self.emit("t->dc_bytes[row] += (uint64_t)p->regs.ingress_len;", 2)
            self.emit("t->dc_touched = 1;", 2)
        if info.indirect:
            prof = t["action_profile"]
            apj = prog.action_profiles[prof]
            sel = apj.get("selector")
            hash_code = f"r[0] ? select_{c_ident(prof)}(s, p) : 0" if sel else "0"
            self.emit(f"uint64_t hash = {hash_code};", 2)
            self.emit(
                f"if (!xm_resolve(&s->profiles[PROF_{c_ident(prof)}], r, hash, &action, &ad)) {{",
                2,
            )
            self.emit("hit = 0; action = t->default_action; ad = t->default_params;", 3)
            self.emit("}", 2)
        else:
            self.emit("action = (uint32_t)r[0];", 2)
            self.emit("ad = r + 1;", 2)
        self.emit("}", 1)
        self.emit("if (action != XM_NO_ACTION) run_action(s, p, action, ad);", 1)
        if hit_miss:
            self.emit(f"return hit ? {node(nxt.get('__HIT__'))} : {node(nxt.get('__MISS__'))};", 1)
        else:
            self.emit("switch (action) {", 1)
            for aname, aid in zip(t["actions"], t["action_ids"], strict=True):
                self.emit(
                    f"case {aid}: return {node(nxt.get(aname, t.get('base_default_next')))};", 1
                )
            self.emit(f"default: return {node(t.get('base_default_next'))};", 1)
            self.emit("}", 1)
        self.emit("}")
        self.emit()

    def selectors(self) -> None:
        for name, apj in self.prog.action_profiles.items():
            sel = apj.get("selector")
            if sel:
                self.where = f"action selector {name}"
                fn = f"select_{c_ident(name)}"
                self._field_buffer(fn, sel["input"], sel["algo"], f"the selector of {name}")
                self.calc_fn[f"\0selector {name}"] = fn

    def _entry_points(self) -> None:
        prog = self.prog
        names = {pl["name"]: f"pipeline_{c_ident(pl['name'])}" for pl in prog.pipelines}
        meta = [h.index for h in prog.headers if h.metadata]
        self.emit("/* ---- entry points (each catches the pipeline's aborts) ---- */")
        self.emit("void xm_new_packet(xm_packet *p)")
        self.emit("{")
        self.emit("memset(p, 0, sizeof *p);", 1)
        for i in meta:
            self.emit(f"{self.valid(i)} = 1;", 1)
        self.emit("for (int i = 0; i < NHEADERS; i++) p->vl_bits[i] = -1;", 1)
        self.emit("p->regs.clone_session = -1;", 1)
        self.emit("p->regs.truncate_len = -1;", 1)
        self.emit("}")
        self.emit()
        # Each entry point catches the pipeline's aborts (xm_abort's longjmp); its arguments
        # are read through volatile copies after setjmp, which a longjmp cannot clobber.
        ing = f"{names['ingress']}(v_s, v_p); " if "ingress" in names else ""
        egr = f"{names['egress']}(v_s, v_p); " if "egress" in names else ""
        sp = [("xm_state *", "s"), ("xm_packet *", "p")]
        guarded: list[tuple[str, str, list[tuple[str, str]], str]] = [
            (
                "int64_t",
                "xm_parse",
                [*sp, ("const uint8_t *", "buf"), ("uint64_t ", "n")],
                "return parse_packet(v_s, v_p, v_buf, v_n);",
            ),
            ("int", "xm_verify_checksums", sp, "return verify_checksums(v_s, v_p);"),
            ("int", "xm_update_checksums", sp, "update_checksums(v_s, v_p); return 0;"),
            (
                "int64_t",
                "xm_deparse",
                [*sp, ("uint8_t *", "out"), ("uint64_t ", "cap")],
                "return (int64_t)deparse_with_payload(v_s, v_p, v_out, v_cap);",
            ),
            ("int", "xm_ingress", sp, f"{ing}return 0;"),
            ("int", "xm_egress", sp, f"{egr}return 0;"),
            (
                "int",
                "xm_run_action",
                [*sp, ("uint32_t ", "id"), ("const uint64_t *", "ad")],
                "run_action(v_s, v_p, v_id, v_ad); return 0;",
            ),
        ]
        for ret, name, args, body in guarded:
            self.emit(f"{ret} {name}({', '.join(t + n for t, n in args)})")
            self.emit("{")
            for t, n in args:
                self.emit(f"{t}volatile v_{n} = {n};", 1)
            self.emit(f"if (setjmp(s->jb)) return -({ret})v_s->abort_kind;", 1)
            self.emit(body, 1)
            self.emit("}")
            self.emit()
        self.emit("/* the hash algorithms by their index in C_HASHES (cgen.py), for the tests */")
        self.emit("uint64_t xm_hash(int algo, const uint8_t *b, uint64_t n)")
        self.emit("{")
        self.emit("switch (algo) {", 1)
        for i, algo in enumerate(C_HASHES):
            self.emit(f"case {i}: return xm_hash_{HASH_FN.get(algo, algo)}(b, n);", 1)
        self.emit("default: return 0;", 1)
        self.emit("}", 1)
        self.emit("}")
        self.emit()
        self.emit("/* the random extern's draw alone, for the tests */")
        self.emit("uint64_t xm_random_int(xm_state *s, uint64_t lo, uint64_t hi)")
        self.emit("{")
        self.emit("return xm_randint(s, lo, hi);", 1)
        self.emit("}")
        self.emit()
        self.emit("/* a table's lookup alone (the row, -1 for a miss), for the tests */")
        self.emit(
            "int64_t xm_table_lookup(xm_state *s, uint32_t table, const uint64_t *key, uint32_t nk)"
        )
        self.emit("{")
        self.emit("return xm_lookup(&s->tables[table], key, nk);", 1)
        self.emit("}")
        self.emit()
        self.emit("uint64_t xm_layout(uint64_t what)")
        self.emit("{")
        self.emit("switch (what) {", 1)
        self.emit("case 0: return sizeof(xm_packet);", 1)
        self.emit("case 1: return offsetof(xm_packet, valid);", 1)
        self.emit("case 2: return offsetof(xm_packet, regs);", 1)
        self.emit("case 3: return sizeof(xm_state);", 1)
        self.emit("case 4: return offsetof(xm_packet, payload);", 1)
        self.emit("default: return 0;", 1)
        self.emit("}", 1)
        self.emit("}")

    def _architecture(self, g: Generated) -> bool:
        """v1model's common path (v1model.py's receive, _run_ingress and _run_egress) for a
        packet that is not cloned, learnt, resubmitted, recirculated or multicast, one entry
        point each way: `xm_receive` (standard metadata, parser, checksums, ingress, the
        egress decision) and `xm_depart` (the dequeue's metadata, egress, checksums, deparser).
        A rare case returns ARCH_PYTHON after the stage, and v1model.py goes on with it. Not
        generated (False) when standard_metadata lacks a field the architecture sets."""
        std = self.std
        names = {pl["name"]: f"pipeline_{c_ident(pl['name'])}" for pl in self.prog.pipelines}
        if std is None or any(f not in std.htype.field_index for f in STD_FIELDS):
            return False
        fidx = std.htype.field_index

        def sm(name: str) -> str:
            return self.fref(std.index, fidx[name])

        def m(name: str) -> str:
            return c_int(mask_of(std.htype.fields[fidx[name]][1]))

        rare = (
            "p->regs.clone_session >= 0 || p->regs.learn_id > 0 || p->regs.resubmit_fl || "
            f"{sm('mcast_grp')} != 0"
        )
        ing = f"{names['ingress']}(s, p);" if "ingress" in names else "/* no ingress */"
        egr = f"{names['egress']}(s, p);" if "egress" in names else "/* no egress */"
        self.emit("/* ---- v1model's common path (v1model.py's receive and _run_ingress/egress) */")
        self.emit(f"#define ARCH_DROP ({ARCH_DROP})")
        self.emit(f"#define ARCH_PYTHON ({ARCH_PYTHON})")
        self.emit(f"#define ARCH_DEPARSE_ERROR ({ARCH_DEPARSE_ERROR})")
        self.emit(f"#define ARCH_ENQUEUE_PYTHON ({ARCH_ENQUEUE_PYTHON})")
        self.emit(f"#define ARCH_QUEUE_FULL ({ARCH_QUEUE_FULL})")
        self.emit(f"#define ARCH_NO_MEMORY ({ARCH_NO_MEMORY})")
        self.emit()
        self.emit("/* n bytes arrive on a port at t_us: 0 to enqueue them for egress_spec */")
        self.emit(
            "static int64_t v1model_receive(xm_state *s, xm_packet *p, const uint8_t *buf, "
            "uint64_t n, uint64_t port, uint64_t t_us, uint64_t drop_port)"
        )
        self.emit("{")
        for line in (
            "xm_new_packet(p);",
            "p->regs.ingress_len = (int64_t)n;",
            "p->regs.plen = (int64_t)n;",
            f"{sm('ingress_port')} = port & {m('ingress_port')};",
            f"{sm('packet_length')} = n;",
            f"{sm('instance_type')} = {PKT_INSTANCE_TYPE_NORMAL};",
            f"{sm('ingress_global_timestamp')} = t_us & {m('ingress_global_timestamp')};",
            f"{sm('parser_error')} = (uint64_t)parse_packet(s, p, buf, n);",
            f"{sm('checksum_error')} = verify_checksums(s, p) ? 1 : 0;",
            ing,
            "p->regs.exit = 0;",
            f"if ({rare}) return ARCH_PYTHON;",
            f"if ({sm('egress_spec')} == drop_port) return ARCH_DROP;",
            f"{sm('instance_type')} = {PKT_INSTANCE_TYPE_NORMAL};",
            "return 0;",
        ):
            self.emit(line, 1)
        self.emit("}")
        self.emit()
        self.emit("/* the packet leaves its queue: the dequeue's metadata, egress; 0 to deparse */")
        self.emit(
            "static int64_t v1model_egress(xm_state *s, xm_packet *p, uint64_t port, "
            "uint64_t prio, uint64_t now_us, uint64_t enq_us, uint64_t left, uint64_t drop_port)"
        )
        self.emit("{")
        for line in (
            f"{sm('egress_global_timestamp')} = now_us & {m('egress_global_timestamp')};",
            f"{sm('deq_timedelta')} = (now_us - enq_us) & {m('deq_timedelta')};",
            f"{sm('deq_qdepth')} = left < {m('deq_qdepth')} ? left : {m('deq_qdepth')};",
            f"{sm('qid')} = prio;",
            f"{sm('egress_port')} = port & {m('egress_port')};",
            f"{sm('egress_spec')} = (drop_port + 1) & {m('egress_spec')};",
            f"{sm('packet_length')} = (uint64_t)p->regs.plen & {m('packet_length')};",
            egr,
            "p->regs.exit = 0;",
            "if (p->regs.clone_session >= 0 || p->regs.recirc_fl) return ARCH_PYTHON;",
            f"if ({sm('egress_spec')} == drop_port) return ARCH_DROP;",
            "return 0;",
        ):
            self.emit(line, 1)
        self.emit("}")
        self.emit()
        self.emit("/* entry points: an abort, its kind negated (deparser: ARCH_DEPARSE_ERROR) */")
        self.emit(
            "int64_t xm_receive(xm_state *s, xm_packet *p, const uint8_t *buf, uint64_t n, "
            "uint64_t port, uint64_t t_us, uint64_t drop_port)"
        )
        self.emit("{")
        for line in (
            "xm_state *volatile v_s = s;",
            "xm_packet *volatile v_p = p;",
            "const uint8_t *volatile v_buf = buf;",
            "volatile uint64_t v_n = n, v_port = port, v_t_us = t_us, v_drop_port = drop_port;",
            "if (setjmp(s->jb)) return -(int64_t)v_s->abort_kind;",
            "return v1model_receive(v_s, v_p, v_buf, v_n, v_port, v_t_us, v_drop_port);",
        ):
            self.emit(line, 1)
        self.emit("}")
        self.emit()
        self.emit(
            "int64_t xm_depart(xm_state *s, xm_packet *p, uint64_t port, uint64_t prio, "
            "uint64_t now_us, uint64_t enq_us, uint64_t left, uint64_t drop_port, uint8_t *out, "
            "uint64_t cap)"
        )
        self.emit("{")
        for line in (
            "xm_state *volatile v_s = s;",
            "xm_packet *volatile v_p = p;",
            "uint8_t *volatile v_out = out;",
            "volatile uint64_t v_cap = cap;",
            "volatile int64_t rc;",
            "volatile uint64_t v_port = port, v_prio = prio, v_now_us = now_us, v_enq_us = enq_us;",
            "volatile uint64_t v_left = left, v_drop_port = drop_port;",
            "if (setjmp(s->jb)) return -(int64_t)v_s->abort_kind;",
            "rc = v1model_egress(v_s, v_p, v_port, v_prio, v_now_us, v_enq_us, v_left, "
            "v_drop_port);",
            "if (rc) return rc;",
            "if (setjmp(v_s->jb)) return ARCH_DEPARSE_ERROR;",
            "update_checksums(v_s, v_p);",
            "return (int64_t)deparse_with_payload(v_s, v_p, v_out, v_cap);",
        ):
            self.emit(line, 1)
        self.emit("}")
        self.emit()
        self.out += tm_source().splitlines()
        self.out += _DEPARTED.splitlines()
        self.emit()
        self.emit(
            "/* ---- the common path with the traffic manager (v1model.py: _enqueue, service) */"
        )
        self.emit(
            "/* a packet's depth in the unit enq_qdepth/deq_qdepth count (QDEPTH_UNITS' index) */"
        )
        self.emit(
            "static int64_t qdepth(int64_t unit, int64_t cell, int64_t packets, int64_t bytes)"
        )
        self.emit("{")
        self.emit("return unit == 0 ? packets : unit == 1 ? bytes : (bytes + cell - 1) / cell;", 1)
        self.emit("}")
        self.emit()
        self.emit(
            "/* after xm_receive's 0, into its queue (v1model.py's _enqueue): its port or a code */"
        )
        self.emit(
            "static int64_t v1model_enqueue(xm_packet *p, xm_tm *tm, uint64_t handle, "
            "int64_t t_ns, int64_t unit, int64_t cell)"
        )
        self.emit("{")
        for line in (
            f"uint64_t prio = {sm('priority')}, port = {sm('egress_spec')};",
            "if (prio >= (uint64_t)tm->nb_queues) return ARCH_ENQUEUE_PYTHON;",
            "if (tm->ports[port].exists && tm->ports[port].fault_down) return ARCH_ENQUEUE_PYTHON;",
            "int64_t found[2];",
            "/* PFC counts what came in from a port against it (a normal packet, here) */",
            f"int64_t in_port = (int64_t){sm('ingress_port')};",
            "int rc = xm_tm_enqueue(tm, (int64_t)port, (int64_t)prio, handle, "
            "(uint64_t)(uintptr_t)p, p->regs.plen, t_ns, in_port, found);",
            "if (rc < 0) return ARCH_NO_MEMORY;",
            "if (rc == 0) return ARCH_QUEUE_FULL;",
            "if (rc != 1) return ARCH_ENQUEUE_PYTHON; /* the watchdog's drop, a port to make */",
            f"{sm('enq_timestamp')} = ((uint64_t)t_ns / {CLOCK_NS}) & {m('enq_timestamp')};",
            "uint64_t depth = (uint64_t)qdepth(unit, cell, found[0], found[1]);",
            f"{sm('enq_qdepth')} = depth < {m('enq_qdepth')} ? depth : {m('enq_qdepth')};",
            "return (int64_t)port;",
        ):
            self.emit(line, 1)
        self.emit("}")
        self.emit()
        self.emit("/* the port the packet was for (after ARCH_QUEUE_FULL: the drop's port) */")
        self.emit("static int64_t v1model_egress_spec(xm_packet *p)")
        self.emit("{")
        self.emit(f"return (int64_t){sm('egress_spec')};", 1)
        self.emit("}")
        self.emit()
        self.emit(
            "/* a packet arrives and is queued: xm_receive, then v1model_enqueue after its 0 */"
        )
        self.emit(
            "int64_t xm_receive_enqueue(xm_state *s, xm_packet *p, const uint8_t *buf, uint64_t n, "
            "uint64_t port, uint64_t t_ns, uint64_t drop_port, uint64_t tm, uint64_t handle, "
            "int64_t unit, int64_t cell)"
        )
        self.emit("{")
        self.emit("/* the port it was queued for (>= 0), or a code (< 0) */", 1)
        self.emit(f"int64_t rc = xm_receive(s, p, buf, n, port, t_ns / {CLOCK_NS}, drop_port);", 1)
        self.emit(
            "return rc ? rc : v1model_enqueue(p, (xm_tm *)(uintptr_t)tm, handle, (int64_t)t_ns, "
            "unit, cell);",
            1,
        )
        self.emit("}")
        self.emit()
        for line in (
            "/* Departures i.. of a dequeue_ready, each its packet's xm_depart with the frame",
            " * into out at res->off: up to the first that v1model.py must go on with (returned",
            " * as the next index), or before a packet not of this pipeline (no xm_packet) or",
            " * one the buffer may not hold */",
        ):
            self.emit(line)
        self.emit(
            "int64_t xm_depart_batch(xm_state *s, uint64_t tmv, uint64_t depv, int64_t i, "
            "int64_t n, uint64_t drop_port, int64_t unit, int64_t cell, uint8_t *out, "
            "uint64_t cap, xm_departed *res)"
        )
        self.emit("{")
        for line in (
            "const xm_tm *tm = (const xm_tm *)(uintptr_t)tmv;",
            "const xm_tm_departure *deps = (const xm_tm_departure *)(uintptr_t)depv;",
            "uint64_t off = 0;",
            "for (; i < n; i++) {",
            "    const xm_tm_departure *d = &deps[i];",
            f"    if (!d->cpkt || off + {g.max_out} > cap) return i;",
            "    xm_packet *p = (xm_packet *)(uintptr_t)d->cpkt;",
            "    int64_t left = qdepth(unit, cell, d->left, tm->ports[d->port].qbytes[d->prio]);",
            "    res[i].booked = p->regs.plen;",
            "    res[i].off = (int64_t)off;",
            "    int64_t rc = xm_depart(s, p, (uint64_t)d->port, (uint64_t)d->prio, "
            f"(uint64_t)d->start / {CLOCK_NS},",
            f"                           (uint64_t)d->enq_ns / {CLOCK_NS}, (uint64_t)left, "
            "drop_port, "
            "out + off, cap - off);",
            "    res[i].rc = rc;",
            "    res[i].truncate = p->regs.truncate_len;",
            "    if (rc >= 0)",
            "        off += (uint64_t)rc <= cap - off ? (uint64_t)rc "
            ": (uint64_t)rc - p->payload_len;",
            "    else if (rc != ARCH_DROP)",
            "        return i + 1;",
            "}",
            "return n;",
        ):
            self.emit(line, 1)
        self.emit("}")
        self.emit()
        return True

    def _cdef(self, g: Generated) -> str:
        regs = " ".join(f"int64_t {r};" for r in PKT_REGS)
        state = _STATE_STRUCTS.format(
            tail="",
            ntables=self.ntables,
            nprofiles=max(1, len(self.profile_idx)),
            ncounters=max(1, len(self.counter_idx)),
            nregisters=max(1, len(self.register_idx)),
        )
        return _CDEF.format(
            nfields=self.nfields,
            nheaders=len(self.prog.headers),
            nstacks=max(1, len(self.prog.stacks)),
            vl=self.vl_bytes,
            regs=regs,
            state=state,
        )


def generate(prog: Program) -> Generated:
    """The C of `prog`, or `Unsupported` naming the first construct the generator lacks."""
    g = CGen(prog)
    try:
        return g.generate()
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise Unsupported(f"{type(exc).__name__} {exc}, in {g.where}") from exc


_HELPERS = r"""
#define XM_NO_ACTION 0xFFFFFFFFu
#define PARSE_DONE (-1)
#define PARSE_ERROR (-2)
#define XM_PARSER_ERROR(code) \
    do { c->err = (code); c->err_pos = c->pos; return PARSE_ERROR; } while (0)

/* bits [off, off + w) of b, big-endian, w <= 64 */
static inline uint64_t xm_get_bits(const uint8_t *b, uint64_t off, unsigned w)
{
    uint64_t first = off / 8, last = (off + w + 7) / 8;
    xm_u128 acc = 0;
    for (uint64_t i = first; i < last; i++) acc = (acc << 8) | b[i];
    acc >>= (unsigned)((last - first) * 8 - off % 8 - w);
    return w >= 64 ? (uint64_t)acc : (uint64_t)acc & ((UINT64_C(1) << w) - 1);
}

/* write the low w bits of v at bits [off, off + w) of b, big-endian, w <= 64 */
static inline void xm_put_bits(uint8_t *b, uint64_t off, unsigned w, uint64_t v)
{
    if (w == 0) return;
    uint64_t first = off / 8, last = (off + w + 7) / 8;
    unsigned shift = (unsigned)((last - first) * 8 - off % 8 - w);
    xm_u128 m = w >= 64 ? (xm_u128)UINT64_MAX : (xm_u128)((UINT64_C(1) << w) - 1);
    xm_u128 val = ((xm_u128)v & m) << shift;
    m <<= shift;
    for (uint64_t i = last; i-- > first;) {
        b[i] = (uint8_t)((b[i] & (uint8_t)~(uint8_t)m) | (uint8_t)val);
        val >>= 8;
        m >>= 8;
    }
}

/* the two's complement value of the low w bits of v (the reference's two_comp_mod) */
static inline uint64_t xm_sext(uint64_t v, unsigned w)
{
    if (w >= 64) return v;
    uint64_t sign = UINT64_C(1) << (w - 1);
    v &= (UINT64_C(1) << w) - 1;
    return (v ^ sign) - sign;
}

static inline void xm_put_bytes(uint8_t *b, uint64_t off, const uint8_t *src, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) xm_put_bits(b, off + 8 * i, 8, src[i]);
}

/* ---- hashes, as testbed/switch/hashes.py ---- */
static inline uint64_t xm_hash_csum16(const uint8_t *b, uint64_t n)
{
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i += 2) sum += ((uint64_t)b[i] << 8) | (i + 1 < n ? b[i + 1] : 0);
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    return ~sum & 0xffff;
}

static inline uint64_t xm_hash_crc16(const uint8_t *b, uint64_t n)
{
    uint32_t rem = 0;
    for (uint64_t i = 0; i < n; i++) {
        rem ^= b[i];
        for (int k = 0; k < 8; k++) rem = rem & 1 ? (rem >> 1) ^ 0xA001u : rem >> 1;
    }
    return rem;
}

static inline uint64_t xm_hash_crc32(const uint8_t *b, uint64_t n)
{
    uint32_t rem = 0xFFFFFFFFu;
    for (uint64_t i = 0; i < n; i++) {
        rem ^= b[i];
        for (int k = 0; k < 8; k++) rem = rem & 1 ? (rem >> 1) ^ 0xEDB88320u : rem >> 1;
    }
    return rem ^ 0xFFFFFFFFu;
}

static inline uint64_t xm_hash_crcCCITT(const uint8_t *b, uint64_t n)
{
    uint32_t rem = 0xFFFF;
    for (uint64_t i = 0; i < n; i++) {
        rem ^= (uint32_t)b[i] << 8;
        for (int k = 0; k < 8; k++)
            rem = rem & 0x8000 ? ((rem << 1) ^ 0x1021u) & 0xFFFF : (rem << 1) & 0xFFFF;
    }
    return rem;
}

static inline uint64_t xm_hash_identity(const uint8_t *b, uint64_t n)
{
    uint64_t v = 0;
    for (uint64_t i = 0; i < n && i < 8; i++) v = (v << 8) | b[i];
    return v;
}
"""

# The tables, profiles and switch state as C and cffi both see them (one declaration: the
# generated C gets the jmp_buf tail the Python side never touches; runtime.py allocates the
# C size, xm_layout(3)).
_STATE_STRUCTS = r"""
/* A table's entries as the runtime (runtime.py) writes them, one row of `stride` words each:
 * per key field a value, then per key field a mask (a row matches a key k when
 * k & mask == value; the first matching row wins, in the runtime's order: exact, longest
 * prefix first, or priority order), then the action id and its parameters, or for a table
 * with an action profile the member (0) or group (1) and its index.
 * A larger table is also indexed by mask (tuple space search): the rows sharing one mask
 * vector form a group (first row, slot count, offset into `slots`), in the order of their
 * first rows; a group's open-addressed slots hold, per masked value, 1 + the first row with
 * that value. */
struct xm_table {{
    uint64_t *rows;
    uint64_t n;
    uint64_t stride;
    uint32_t default_action;
    const uint64_t *default_params;
    uint64_t *dc_packets; /* direct counters: per row, what the runtime has not read yet */
    uint64_t *dc_bytes;
    uint64_t dc_touched;
    uint64_t *groups; /* 0 groups: the rows are scanned */
    uint64_t ngroups;
    uint64_t *slots;
}};

/* An action profile: members (action id and parameters, `mstride` words each) and groups
 * (first item, item count) over items (cumulative weight, member index). */
struct xm_profile {{
    uint64_t *members;
    uint64_t mstride;
    uint64_t *groups;
    uint64_t *items;
}};

typedef struct xm_state {{
    struct xm_table tables[{ntables}];
    struct xm_profile profiles[{nprofiles}];
    uint64_t *counter_packets[{ncounters}];
    uint64_t *counter_bytes[{ncounters}];
    uint64_t counter_size[{ncounters}];
    uint64_t *registers[{nregisters}];
    uint64_t register_size[{nregisters}];
    /* the program's random extern: CPython's Mersenne Twister (random.Random), its state
     * loaded and read by runtime.py's NativeRandom, so a draw here is the draw the reference
     * makes from its random.Random */
    uint32_t mt[624];
    uint32_t mti;
    int abort_kind;
    const char *abort_msg;
{tail}}} xm_state;
"""

_STATE_C_TAIL = "    jmp_buf jb; /* last: not declared to cffi */\n"

_STATE = (
    _STATE_STRUCTS
    + r"""
struct xm_parse_ctx {{
    const uint8_t *buf;
    uint64_t n;
    uint64_t pos;
    int64_t err;
    uint64_t err_pos;
}};

__attribute__((noreturn)) static inline void xm_abort(xm_state *s, int kind, const char *msg)
{{
    s->abort_kind = kind;
    s->abort_msg = msg;
    longjmp(s->jb, 1);
}}

/* CPython's genrand_uint32 (Modules/_randommodule.c): MT19937 */
static inline uint32_t xm_mt_next(xm_state *s)
{{
    static const uint32_t mag01[2] = {{0x0U, 0x9908b0dfU}};
    uint32_t *mt = s->mt;
    uint32_t y;
    if (s->mti >= 624) {{
        int kk;
        for (kk = 0; kk < 624 - 397; kk++) {{
            y = (mt[kk] & 0x80000000U) | (mt[kk + 1] & 0x7fffffffU);
            mt[kk] = mt[kk + 397] ^ (y >> 1) ^ mag01[y & 0x1U];
        }}
        for (; kk < 623; kk++) {{
            y = (mt[kk] & 0x80000000U) | (mt[kk + 1] & 0x7fffffffU);
            mt[kk] = mt[kk + 397 - 624] ^ (y >> 1) ^ mag01[y & 0x1U];
        }}
        y = (mt[623] & 0x80000000U) | (mt[0] & 0x7fffffffU);
        mt[623] = mt[396] ^ (y >> 1) ^ mag01[y & 0x1U];
        s->mti = 0;
    }}
    y = mt[s->mti++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= (y >> 18);
    return y;
}}

/* random.Random.getrandbits(k), 1 <= k <= 65 (words from the least significant up) */
static inline unsigned __int128 xm_mt_bits(xm_state *s, unsigned k)
{{
    if (k <= 32) return xm_mt_next(s) >> (32 - k);
    unsigned __int128 r = 0;
    for (unsigned shift = 0; k > 0; shift += 32) {{
        uint32_t w = xm_mt_next(s);
        if (k < 32) {{
            w >>= (32 - k);
            k = 0;
        }} else {{
            k -= 32;
        }}
        r |= (unsigned __int128)w << shift;
    }}
    return r;
}}

/* random.Random.randint(lo, hi) for lo <= hi: lo + _randbelow(hi - lo + 1), drawn by
 * rejection over the width's bit length */
static inline uint64_t xm_randint(xm_state *s, uint64_t lo, uint64_t hi)
{{
    unsigned __int128 n = (unsigned __int128)(hi - lo) + 1;
    unsigned k = 0;
    for (unsigned __int128 m = n; m; m >>= 1) k++;
    unsigned __int128 r = xm_mt_bits(s, k);
    while (r >= n) r = xm_mt_bits(s, k);
    return lo + (uint64_t)r;
}}

static inline uint64_t xm_div(xm_state *s, uint64_t a, uint64_t b)
{{
    if (b == 0) xm_abort(s, 1, "division by zero");
    return a / b;
}}

static inline uint64_t xm_mod(xm_state *s, uint64_t a, uint64_t b)
{{
    if (b == 0) xm_abort(s, 1, "modulo by zero");
    return a % b;
}}

static inline uint64_t xm_register_get(xm_state *s, int r, uint64_t i)
{{
    if (i >= s->register_size[r]) xm_abort(s, 2, "register index out of range");
    return s->registers[r][i];
}}

static inline void xm_count(xm_state *s, int c, uint64_t i, const xm_packet *p)
{{
    if (i < s->counter_size[c]) {{
        s->counter_packets[c][i] += 1;
        s->counter_bytes[c][i] += (uint64_t)p->regs.ingress_len;
    }}
}}

static inline uint64_t xm_vl_bytes(const xm_packet *p, int h)
{{
    return p->vl_bits[h] > 0 ? (uint64_t)p->vl_bits[h] / 8 : 0;
}}

static inline uint64_t xm_emit_vl(const xm_packet *p, int h, uint64_t off, uint8_t *out)
{{
    uint64_t n = xm_vl_bytes(p, h);
    memcpy(out, p->vl + off, n);
    return n;
}}

/* the reference's _peek: bits [offset, offset + w) from the parser's position, zero past the end */
static inline uint64_t xm_peek(const struct xm_parse_ctx *c, uint64_t offset, unsigned w)
{{
    uint8_t tmp[9] = {{0}};
    uint64_t start = c->pos * 8 + offset;
    uint64_t first = start / 8, last = (start + w + 7) / 8;
    for (uint64_t i = first; i < last; i++) tmp[i - first] = i < c->n ? c->buf[i] : 0;
    return xm_get_bits(tmp, start % 8, w);
}}

/* the first row whose masked key equals its value, by scanning */
static inline int64_t xm_scan(const struct xm_table *t, const uint64_t *key, unsigned nk)
{{
    for (uint64_t i = 0; i < t->n; i++) {{
        const uint64_t *r = t->rows + i * t->stride;
        unsigned j = 0;
        while (j < nk && (key[j] & r[nk + j]) == r[j]) j++;
        if (j == nk) return (int64_t)i;
    }}
    return -1;
}}

/* the slot hash of a key under a mask (runtime.py's slot_hash computes the same) */
static inline uint64_t xm_key_hash(const uint64_t *key, const uint64_t *mask, unsigned nk)
{{
    uint64_t h = 0;
    for (unsigned j = 0; j < nk; j++) h = (h ^ (key[j] & mask[j])) * UINT64_C(0x9E3779B97F4A7C15);
    return h >> 32;
}}

/* the same row as xm_scan, through the mask groups: the smallest first row with the key's
 * masked value over the groups, stopping at a group whose rows all come after the best */
static inline int64_t xm_lookup(const struct xm_table *t, const uint64_t *key, unsigned nk)
{{
    if (!t->ngroups) return xm_scan(t, key, nk);
    int64_t best = -1;
    for (uint64_t g = 0; g < t->ngroups; g++) {{
        const uint64_t *grp = t->groups + 3 * g;
        if (best >= 0 && grp[0] >= (uint64_t)best) break;
        const uint64_t *mask = t->rows + grp[0] * t->stride + nk;
        const uint64_t *slots = t->slots + grp[2];
        uint64_t i = xm_key_hash(key, mask, nk) & (grp[1] - 1);
        while (slots[i]) {{
            uint64_t row = slots[i] - 1;
            const uint64_t *r = t->rows + row * t->stride;
            unsigned j = 0;
            while (j < nk && (key[j] & mask[j]) == r[j]) j++;
            if (j == nk) {{
                if (best < 0 || row < (uint64_t)best) best = (int64_t)row;
                break;
            }}
            i = (i + 1) & (grp[1] - 1);
        }}
    }}
    return best;
}}

/* an entry of a table with an action profile: its member's action, or one member of its group
 * picked by the selector's hash; 0 for an empty group (the table then misses) */
static inline int xm_resolve(const struct xm_profile *pr, const uint64_t *r, uint64_t hash,
                             uint32_t *action, const uint64_t **ad)
{{
    uint64_t member;
    if (r[0] == 0) {{
        member = r[1];
    }} else {{
        const uint64_t *g = pr->groups + 2 * r[1];
        if (g[1] == 0) return 0;
        const uint64_t *items = pr->items + 2 * g[0];
        uint64_t h = hash % items[2 * (g[1] - 1)];
        uint64_t k = 0;
        while (items[2 * k] <= h) k++;
        member = items[2 * k + 1];
    }}
    *action = (uint32_t)pr->members[member * pr->mstride];
    *ad = pr->members + member * pr->mstride + 1;
    return 1;
}}
"""
)

_STACK_HELPERS = r"""
/* a stack's element `id` (a header id) as its type's struct */
#define XM_H(type, id) ((struct type *)((uint64_t *)&p->hdr + xm_header_slot[(id)]))

/* the reference's _last: the last valid element, an abort when there is none */
static inline int64_t xm_stack_last(xm_state *s, const xm_packet *p, int st)
{
    if (p->sn[st] <= 0) xm_abort(s, 1, "no valid element in a header stack");
    return xm_stack_member[st][p->sn[st] - 1];
}

/* the reference's _sidx: element i, an abort when out of bounds */
static inline int64_t xm_stack_elem(xm_state *s, int st, uint64_t i)
{
    if (i >= (uint64_t)xm_stack_size[st]) xm_abort(s, 1, "header stack index out of bounds");
    return xm_stack_member[st][i];
}
"""

# what xm_depart_batch reports of each departure: declared once, for the C and the cdef
_DEPARTED = """\
typedef struct {
    int64_t rc; /* xm_depart's: the frame's length, or what v1model.py does with it */
    int64_t off; /* where in out its frame starts */
    int64_t booked; /* the length the traffic manager booked the port for */
    int64_t truncate; /* its truncate register */
} xm_departed;
"""

_ARCH_CDEF = (
    _DEPARTED
    + """\
int64_t xm_receive_enqueue(xm_state *s, xm_packet *p, const uint8_t *buf, uint64_t n,
                           uint64_t port, uint64_t t_ns, uint64_t drop_port, uint64_t tm,
                           uint64_t handle, int64_t unit, int64_t cell);
int64_t xm_depart_batch(xm_state *s, uint64_t tm, uint64_t deps, int64_t i, int64_t n,
                        uint64_t drop_port, int64_t unit, int64_t cell, uint8_t *out,
                        uint64_t cap, xm_departed *res);
int64_t xm_receive(xm_state *s, xm_packet *p, const uint8_t *buf, uint64_t n, uint64_t port,
                   uint64_t t_us, uint64_t drop_port);
int64_t xm_depart(xm_state *s, xm_packet *p, uint64_t port, uint64_t prio, uint64_t now_us,
                  uint64_t enq_us, uint64_t left, uint64_t drop_port, uint8_t *out, uint64_t cap);
"""
)

_CDEF = """
typedef struct {{ {regs} }} xm_regs;
typedef struct {{
    uint64_t f[{nfields}];
    uint8_t valid[{nheaders}];
    int32_t vl_bits[{nheaders}];
    uint8_t vl[{vl}];
    xm_regs regs;
    int64_t sn[{nstacks}];
    const uint8_t *payload;
    uint64_t payload_len;
}} xm_packet;
{state}void xm_new_packet(xm_packet *p);
int64_t xm_parse(xm_state *s, xm_packet *p, const uint8_t *buf, uint64_t n);
int xm_verify_checksums(xm_state *s, xm_packet *p);
int xm_update_checksums(xm_state *s, xm_packet *p);
int64_t xm_deparse(xm_state *s, xm_packet *p, uint8_t *out, uint64_t cap);
int xm_ingress(xm_state *s, xm_packet *p);
int xm_egress(xm_state *s, xm_packet *p);
int xm_run_action(xm_state *s, xm_packet *p, uint32_t id, const uint64_t *ad);
uint64_t xm_layout(uint64_t what);
uint64_t xm_hash(int algo, const uint8_t *b, uint64_t n);
int64_t xm_table_lookup(xm_state *s, uint32_t table, const uint64_t *key, uint32_t nk);
uint64_t xm_random_int(xm_state *s, uint64_t lo, uint64_t hi);
"""
