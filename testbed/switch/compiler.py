"""Compile a whole bmv2 JSON program: one step per part of the program, on a `Codegen`.

The steps follow the program's parts in the order the generated code needs them: the
stateful objects (counters, meters, registers, value sets), header codecs, calculations,
actions, the parser, checksums, the deparser, action-profile selectors, the control flow
(tables, conditionals, action calls: one node function each), then fresh packets; after the
source is compiled, the match tables are built and wired to the generated functions.
testbed/switch/codegen.py generates the code of each expression, primitive, action and parser
state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.switch import hashes
from testbed.switch.codegen import Codegen, Compiled, _mask
from testbed.switch.externs import CounterArray, MeterArray, RegisterArray, ValueSet
from testbed.switch.packet import Packet
from testbed.switch.program import Json, LoadError, Program, hexint
from testbed.switch.tables import ActionCall, ActionProfile, Entry, MatchTable


def compile_program(
    prog: Program, clock_us: Callable[[], int], log_fn: Callable[[str], None] | None = None
) -> Compiled:
    """Generate and compile the Python code for `prog`, with fresh stateful objects."""
    try:
        return _compile(prog, clock_us, log_fn)
    except LoadError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise LoadError(f"malformed bmv2 JSON: {type(exc).__name__}: {exc}") from exc


@dataclass
class _Externs:
    counters: dict[str, CounterArray]
    meters: dict[str, MeterArray]
    registers: dict[str, RegisterArray]
    value_sets: dict[str, ValueSet]


def _compile(
    prog: Program, clock_us: Callable[[], int], log_fn: Callable[[str], None] | None
) -> Compiled:
    g = Codegen(prog, clock_us, log_fn)
    ext = _externs(g, prog, clock_us)
    g.gen_header_codecs()
    _gen_calculations(g, prog)
    action_names = {aid: g.gen_action(aid, a.primitives) for aid, a in prog.actions.items()}
    parser_entry = g.gen_parser(prog.parser("parser"))
    _gen_checksums(g, prog)
    _gen_deparser(g, prog)
    _gen_selectors(g, prog)
    node_fn = _gen_control_flow(g, prog, action_names)
    _gen_new_packet(g, prog)

    ns = g.ns
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
            tables[t["name"]] = _build_table(prog, t, ns, profiles, ext.meters, actions, node_fn)

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
        counters=ext.counters,
        meters=ext.meters,
        registers=ext.registers,
        value_sets=ext.value_sets,
        actions=actions,
        random=ns["_rand"],
    )


def _externs(g: Codegen, prog: Program, clock_us: Callable[[], int]) -> _Externs:
    """The program's stateful objects, each bound in the generated code's namespace."""
    ns = g.ns
    ext = _Externs({}, {}, {}, {})
    for name, cj in prog.counter_arrays.items():
        # direct counters have no size: they live in the entries of the table they bind to
        c = CounterArray(
            name, int(cj.get("size", 0)), bool(cj.get("is_direct")), cj.get("binding", "")
        )
        ext.counters[name] = c
        ns[f"C_{g._ident(name)}"] = c
    for name, mj in prog.meter_arrays.items():
        m = MeterArray(
            name,
            int(mj.get("size", 0)),
            mj.get("type", "bytes"),
            clock_us,
            bool(mj.get("is_direct")),
            mj.get("binding", ""),
            int(mj.get("rate_count", 2)),
        )
        ext.meters[name] = m
        ns[f"M_{g._ident(name)}"] = m
    for name, rj in prog.register_arrays.items():
        r = RegisterArray(name, int(rj["size"]), int(rj["bitwidth"]))
        ext.registers[name] = r
        ns[f"R_{g._ident(name)}"] = r
    vset_widths = _vset_bitwidths(prog)
    for name, vj in prog.parse_vsets.items():
        widths = vset_widths.get(name) or [int(vj["compressed_bitwidth"])]
        vs = ValueSet(name, widths, int(vj.get("max_size", 0)))
        ext.value_sets[name] = vs
        ns[f"VS_{g._ident(name)}"] = vs
    return ext


def _gen_calculations(g: Codegen, prog: Program) -> None:
    """Calculations: a buffer builder plus the hash function."""
    for name, cj in prog.calculations.items():
        buf_fn = f"cb_{cj['id']}"
        g.gen_field_buffer(buf_fn, cj["input"])
        g.ns[f"_H_{cj['id']}"] = hashes.get_hash(cj["algo"])
        g.src.add(f"def CALC_{g._ident(name)}(p):")
        g.src.add(f"return _H_{cj['id']}({buf_fn}(p))", 1)
        g.ns[f"CALC_{g._ident(name)}"] = None  # defined by exec; reserve the name for lookups


def _gen_checksums(g: Codegen, prog: Program) -> None:
    """verify_checksums(p) and update_checksums(p)."""
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
            g.src.add(
                f"if v[{hidx}] and ({cond}) and ({fn}(p) & {_mask(w)}) != h[{hidx}][{fidx}]:", 1
            )
            g.src.add("bad = True", 2)
        if ck.get("update", True):
            upd.append(f"if {cond}: h[{hidx}][{fidx}] = {fn}(p) & {_mask(w)}")
    g.src.add("return bad", 1)
    g.src.add("def update_checksums(p):")
    g.src.add("h = p.h; v = p.v", 1)
    g.src.extend(upd or ["pass"], 1)


def _gen_deparser(g: Codegen, prog: Program) -> None:
    """deparse(p): the valid headers in the deparser's order, then the payload."""
    dj = prog.deparser("deparser")
    g.src.add("def deparse(p):")
    g.src.add("h = p.h; v = p.v; out = []", 1)
    for pj in dj.get("primitives", []):
        g.src.extend(g.prim(pj), 1)
    for hname in dj["order"]:
        inst = prog.header(hname)
        g.src.add(
            f"if v[{inst.index}]: out.append({g.deparse_expr(str(inst.index), inst.htype)})", 1
        )
    g.src.add("out.append(p.payload)", 1)
    g.src.add("return b''.join(out)", 1)


def _gen_selectors(g: Codegen, prog: Program) -> None:
    """The member selection hash of each action profile that has a selector."""
    for apj in prog.action_profiles.values():
        sel = apj.get("selector")
        if sel:
            fn = f"sel_{apj['id']}"
            g.gen_field_buffer(f"{fn}_buf", sel["input"])
            g.ns[f"_SH_{apj['id']}"] = hashes.get_hash(sel["algo"])
            g.src.add(f"def {fn}(p):")
            g.src.add(f"return _SH_{apj['id']}({fn}_buf(p))", 1)


def _gen_control_flow(g: Codegen, prog: Program, action_names: dict[int, str]) -> dict[str, str]:
    """Tables, conditionals and action calls as node functions, and each pipeline's loop over
    them; returns the node function name of every node."""
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

    calls = _action_calls(prog, action_names)
    preds = _predecessor_counts(prog)

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
            tup = "(" + "".join(f"{c}, " for c in _table_key(g, prog, t)) + ")"
            g.src.add(f"return T_{t['id']}.apply(p, {tup}, p.ingress_len)", 1)
        for c in pl.get("conditionals", []):
            g.src.add(f"def c_{c['id']}(p):")
            g.src.add("h = p.h; v = p.v", 1)
            g.src.add(
                f"return {node_ref(c.get('true_next'))} if {g.cond(c['expression'])} "
                f"else {node_ref(c.get('false_next'))}",
                1,
            )
        for ac in pl.get("action_calls", []):
            g.src.add(f"def ac_{ac['id']}(p):")
            g.src.add(f"{action_names[ac['action_id']]}(p, ())", 1)
            g.src.add(f"return {node_ref(ac.get('next_node'))}", 1)
        g.src.add(f"def run_{pl['id']}(p):")
        g.src.add(f"n = {node_ref(pl.get('init_table'))}", 1)
        g.src.add("while n is not None and not p.exit:", 1)
        g.src.add("n = n(p)", 2)
    return node_fn


def _action_calls(
    prog: Program, action_names: dict[int, str]
) -> dict[str, tuple[str, tuple[int, ...], str | None]]:
    """Action-call tables (see is_action_call): name -> (action function, params, next node).

    A run of them whose members have a single predecessor is fused into one function, saving a
    call per node."""
    calls: dict[str, tuple[str, tuple[int, ...], str | None]] = {}
    for pl in prog.pipelines:
        for t in pl["tables"]:
            if is_action_call(t):
                de = t["default_entry"]
                nxt = t.get("next_tables", {})
                if "__HIT__" in nxt or "__MISS__" in nxt:
                    follow = nxt.get("__MISS__")
                else:
                    follow = nxt.get(prog.actions[de["action_id"]].name, t.get("base_default_next"))
                calls[t["name"]] = (
                    action_names[de["action_id"]],
                    tuple(hexint(x) for x in de.get("action_data", [])),
                    follow,
                )
    return calls


def _predecessor_counts(prog: Program) -> dict[str, int]:
    """How many control-flow edges lead to each node."""
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
    return preds


def _table_key(g: Codegen, prog: Program, t: Json) -> list[str]:
    """The code of each key field of a table application."""
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
    return key


def _gen_new_packet(g: Codegen, prog: Program) -> None:
    """new_packet(): all headers invalid and zero, metadata valid."""
    g.ns["_NF"] = [len(hi.htype.fields) for hi in prog.headers]
    g.ns["_V0"] = [hi.metadata for hi in prog.headers]
    g.ns["Packet"] = Packet
    g.src.add("def new_packet():")
    g.src.add(f"return Packet([[0] * n for n in _NF], list(_V0), [0] * {len(prog.stacks)})", 1)


def is_action_call(t: Json) -> bool:
    """A keyless table with a const default action, no entries and no direct resources."""
    de = t.get("default_entry") or {}
    return (
        not t["key"]
        and t.get("type", "simple") == "simple"
        and bool(de.get("action_const"))
        and not t.get("entries")
        and not t.get("with_counters")
        and not t.get("direct_meters")
    )


def _build_table(
    prog: Program,
    t: Json,
    ns: dict[str, Any],
    profiles: dict[str, ActionProfile],
    meters: dict[str, MeterArray],
    actions: dict[int, Any],
    node_fn: dict[str, str],
) -> MatchTable:
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
    table = MatchTable(
        t["name"],
        kinds,
        widths,
        int(t.get("max_size", 0)),
        profile,
        bool(t.get("with_counters")),
        direct_meter,
        meter_target,
    )
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

    load_const_state(table, t, kinds, widths, actions.get)
    return table


def load_const_state(
    table: MatchTable,
    t: Json,
    kinds: list[str],
    widths: list[int],
    action_fn: Callable[[int], Any],
) -> None:
    """The table's default action and const entries from the JSON, on either pipeline
    (`action_fn`: an action id's function, None when the program has no such action)."""

    def call_of(aid: int, data: list[Any]) -> ActionCall:
        fn = action_fn(aid)
        if fn is None:
            raise LoadError(f"table {t['name']!r}: action id {aid} unknown")
        return ActionCall(aid, fn, tuple(hexint(x) for x in data))

    de = t.get("default_entry")
    if de is not None:
        table.default = call_of(de["action_id"], de.get("action_data", []))
        table.default_const = bool(de.get("action_const"))
    for ej in t.get("entries", []):
        spec: list[Any] = []
        for kind, mk in zip(kinds, ej["match_key"], strict=True):
            mt = mk["match_type"]
            if mt in ("exact", "valid"):
                spec.append(
                    int(bool(mk["key"]))
                    if mt == "valid" and isinstance(mk["key"], bool)
                    else hexint(mk["key"])
                )
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
        call = call_of(ae["action_id"], ae.get("action_data", []))
        # bmv2: a smaller JSON priority wins; P4Runtime (and this table): a larger one.
        table.add(Entry(tuple(spec), -int(ej.get("priority", 0)), call=call), const=True)
    if t.get("entries"):
        table.immutable = True


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
