"""The object model of a bmv2 JSON program (p4c's `p4c-bm2-ss` output), with name resolution.

`Program` validates the JSON and answers questions the code generator, the architecture and the
control plane ask: which header instance has which id, where a field lives, what an action's
parameters are. It does not execute anything; see `codegen.py` for that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from testbed.switch.packet import CORE_ERRORS

Json = dict[str, Any]


class LoadError(Exception):
    """The JSON is not a program this switch can run; the message names what is wrong."""


def hexint(s: str) -> int:
    """bmv2 hexstr: big-endian hex, optionally negative ("-0x1f")."""
    try:
        return int(s, 16)
    except (TypeError, ValueError):
        raise LoadError(f"bad hexstr {s!r}") from None


@dataclass
class HeaderType:
    name: str
    fields: list[tuple[str, int, bool]]  # (name, bit width, signed); width 0 for a varbit field
    vl_index: int | None = None
    max_length: int | None = None  # bytes, for a header with a varbit field
    field_index: dict[str, int] = field(default_factory=dict)

    @property
    def fixed_bits(self) -> int:
        return sum(w for _, w, _ in self.fields)

    def width(self, idx: int) -> int:
        return self.fields[idx][1]


@dataclass
class HeaderInstance:
    name: str
    index: int  # position in the packet's header vector
    htype: HeaderType
    metadata: bool
    union: int | None = None  # index of the header union it belongs to


@dataclass
class Stack:
    name: str
    index: int
    htype_name: str
    members: list[int]  # header-vector indexes (or union indexes for union stacks)


@dataclass
class Union:
    name: str
    index: int
    members: list[int]  # header-vector indexes, in member order
    member_names: list[str]


@dataclass
class ActionInfo:
    name: str
    id: int
    params: list[tuple[str, int]]  # (name, bit width)
    primitives: list[Json]


class Program:
    """A loaded, validated bmv2 JSON program."""

    def __init__(self, doc: Json):
        if not isinstance(doc, dict):
            raise LoadError("the bmv2 JSON must be an object")
        self.doc = doc
        meta = doc.get("__meta__", {})
        version = meta.get("version", [2, 0])
        if not isinstance(version, list) or not version or version[0] != 2:
            raise LoadError(f"unsupported bmv2 JSON version {version!r} (need 2.x)")
        try:
            self._load()
        except LoadError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise LoadError(f"malformed bmv2 JSON: {type(exc).__name__}: {exc}") from exc

    # ---- loading ------------------------------------------------------------------------------

    def _load(self) -> None:
        doc = self.doc
        self.header_types: dict[str, HeaderType] = {}
        for ht in doc["header_types"]:
            fields: list[tuple[str, int, bool]] = []
            vl_index = None
            for i, f in enumerate(ht["fields"]):
                name, width = f[0], f[1]
                signed = bool(f[2]) if len(f) > 2 else False
                if width == "*":
                    vl_index = i
                    width = 0
                fields.append((name, int(width), signed))
            t = HeaderType(ht["name"], fields, vl_index, ht.get("max_length"))
            t.field_index = {n: i for i, (n, _, _) in enumerate(fields)}
            self.header_types[t.name] = t

        self.headers: list[HeaderInstance] = []
        self.header_by_name: dict[str, HeaderInstance] = {}
        json_id_to_index: dict[int, int] = {}
        for hj in doc["headers"]:
            htype = self.header_types.get(hj["header_type"])
            if htype is None:
                raise LoadError(f"header {hj['name']!r} has unknown type {hj['header_type']!r}")
            inst = HeaderInstance(hj["name"], len(self.headers), htype, bool(hj["metadata"]))
            self.headers.append(inst)
            self.header_by_name[inst.name] = inst
            json_id_to_index[hj["id"]] = inst.index

        self.unions: list[Union] = []
        self.union_by_name: dict[str, Union] = {}
        union_json_ids: dict[int, int] = {}
        union_types = {ut["name"]: ut for ut in doc.get("header_union_types", [])}
        for uj in doc.get("header_unions", []):
            members = [json_id_to_index[i] for i in uj["header_ids"]]
            ut = union_types.get(uj["union_type"], {"headers": []})
            names = [m[0] for m in ut["headers"]] or [self.headers[m].name for m in members]
            u = Union(uj["name"], len(self.unions), members, names)
            self.unions.append(u)
            self.union_by_name[u.name] = u
            union_json_ids[uj["id"]] = u.index
            for m in members:
                self.headers[m].union = u.index

        # Header stacks and header union stacks share one index space for their `next` counters.
        self.stacks: list[Stack] = []
        self.stack_by_name: dict[str, Stack] = {}
        for sj in doc.get("header_stacks", []):
            st = Stack(
                sj["name"],
                len(self.stacks),
                sj["header_type"],
                [json_id_to_index[i] for i in sj["header_ids"]],
            )
            self.stacks.append(st)
            self.stack_by_name[st.name] = st
        self.union_stacks: dict[str, Stack] = {}
        for sj in doc.get("header_union_stacks", []):
            st = Stack(
                sj["name"],
                len(self.stacks),
                sj["union_type"],
                [union_json_ids[i] for i in sj["header_union_ids"]],
            )
            self.stacks.append(st)
            self.union_stacks[st.name] = st

        self.errors: dict[str, int] = {name: value for name, value in doc.get("errors", [])}
        next_free = max(self.errors.values(), default=-1) + 1
        for name in CORE_ERRORS:
            if name not in self.errors:
                self.errors[name] = next_free
                next_free += 1

        self.field_aliases: dict[str, tuple[str, str]] = {
            alias: (target[0], target[1]) for alias, target in doc.get("field_aliases", [])
        }
        self.field_lists: dict[int, list[tuple[int, int]]] = {}
        for fl in doc.get("field_lists", []):
            refs = []
            for el in fl["elements"]:
                if el["type"] == "field":
                    refs.append(self.field_ref(el["value"][0], el["value"][1]))
            self.field_lists[fl["id"]] = refs
        self.learn_lists: dict[int, tuple[str, list[tuple[int, int]]]] = {}
        for ll in doc.get("learn_lists", []):
            refs = [
                self.field_ref(el["value"][0], el["value"][1])
                for el in ll["elements"]
                if el["type"] == "field"
            ]
            self.learn_lists[ll["id"]] = (ll["name"], refs)

        self.actions: dict[int, ActionInfo] = {}
        self.action_by_name: dict[str, ActionInfo] = {}
        for aj in doc["actions"]:
            a = ActionInfo(
                aj["name"],
                aj["id"],
                [(rd["name"], int(rd["bitwidth"])) for rd in aj["runtime_data"]],
                aj["primitives"],
            )
            self.actions[a.id] = a
            # Several actions may share a name (p4c disambiguates ids, not names).
            self.action_by_name.setdefault(a.name, a)

        self.parsers: list[Json] = doc["parsers"]
        self.deparsers: list[Json] = doc["deparsers"]
        self.pipelines: list[Json] = doc["pipelines"]
        self.tables: dict[str, Json] = {}
        self.action_profiles: dict[str, Json] = {}
        for pl in self.pipelines:
            for t in pl["tables"]:
                self.tables[t["name"]] = t
            for ap in pl.get("action_profiles", []):
                self.action_profiles[ap["name"]] = ap
        self.calculations: dict[str, Json] = {c["name"]: c for c in doc.get("calculations", [])}
        self.checksums: list[Json] = doc.get("checksums", [])
        self.counter_arrays: dict[str, Json] = {c["name"]: c for c in doc.get("counter_arrays", [])}
        self.meter_arrays: dict[str, Json] = {m["name"]: m for m in doc.get("meter_arrays", [])}
        self.register_arrays: dict[str, Json] = {
            r["name"]: r for r in doc.get("register_arrays", [])
        }
        self.parse_vsets: dict[str, Json] = {v["name"]: v for v in doc.get("parse_vsets", [])}
        self.extern_instances: dict[str, Json] = {
            e["name"]: e for e in doc.get("extern_instances", [])
        }

    # ---- name resolution ----------------------------------------------------------------------

    def header(self, name: str) -> HeaderInstance:
        try:
            return self.header_by_name[name]
        except KeyError:
            raise LoadError(f"unknown header instance {name!r}") from None

    def field_ref(self, header: str, fname: str) -> tuple[int, int]:
        """(header index, field index); field index -1 means the hidden `$valid$` field."""
        inst = self.header(header)
        if fname == "$valid$":
            return inst.index, -1
        try:
            return inst.index, inst.htype.field_index[fname]
        except KeyError:
            raise LoadError(f"header {header!r} has no field {fname!r}") from None

    def arch_field(self, dotted: str) -> tuple[int, int] | None:
        """Resolve a field the architecture needs (e.g. `standard_metadata.egress_spec` or
        `intrinsic_metadata.mcast_grp`), following field aliases; None when absent."""
        if dotted in self.field_aliases:
            hdr, fname = self.field_aliases[dotted]
        else:
            hdr, _, fname = dotted.partition(".")
        inst = self.header_by_name.get(hdr)
        if inst is None or fname not in inst.htype.field_index:
            return None
        return inst.index, inst.htype.field_index[fname]

    def field_width(self, ref: tuple[int, int]) -> int:
        hidx, fidx = ref
        return 1 if fidx < 0 else self.headers[hidx].htype.fields[fidx][1]

    def parser(self, name: str = "parser") -> Json:
        for p in self.parsers:
            if p["name"] == name:
                return p
        if self.parsers:
            return self.parsers[0]
        raise LoadError("the program has no parser")

    def deparser(self, name: str = "deparser") -> Json:
        for d in self.deparsers:
            if d["name"] == name:
                return d
        if self.deparsers:
            return self.deparsers[0]
        raise LoadError("the program has no deparser")

    def pipeline(self, name: str) -> Json:
        for pl in self.pipelines:
            if pl["name"] == name:
                return pl
        raise LoadError(f"the program has no pipeline {name!r}")

    def find_table(self, name: str) -> Json:
        """A table by full name, or by unique suffix (as p4c's STF runner resolves names)."""
        if name in self.tables:
            return self.tables[name]
        matches = [t for n, t in self.tables.items() if n.endswith("." + name) or n.endswith(name)]
        if len(matches) == 1:
            return matches[0]
        raise LoadError(f"no table {name!r}" if not matches else f"ambiguous table {name!r}")
