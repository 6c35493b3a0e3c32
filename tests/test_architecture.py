"""The package lines of docs/architecture.md, read from the code's imports (ast, nothing run).

Every import counts, module-level or inside a function (an import moved into a function to
dodge a cycle is still a cycle); only `if TYPE_CHECKING:` blocks are left out, since they never
run.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("controller", "testbed")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            if "_pb2" not in path.name:
                out[module_name(path)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (n for s in node.orelse for n in _imports_in(s))
            continue
        yield from _imports_in(node)


def _imports_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
        return
    if isinstance(node, ast.If) and _is_type_checking(node):
        yield from (n for s in node.orelse for n in _imports_in(s))
        return
    for child in ast.iter_child_nodes(node):
        yield from _imports_in(child)


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `name` imports (a `from pkg import sub` counts as pkg.sub)."""
    out: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in _imports(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_pkg else anchor[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        out.update(t for t in targets if t.split(".")[0] in PACKAGES and t in modules)
    out.discard(name)
    return out


@functools.lru_cache(maxsize=1)
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(rule: str, sources: tuple[str, ...], allowed: tuple[str, ...]) -> list[str]:
    return [
        f"{src} imports {dst} ({rule})"
        for src, dsts in sorted(graph().items())
        if under(src, *sources)
        for dst in sorted(dsts)
        if not under(dst, *allowed)
    ]


def test_the_graph_sees_the_imports() -> None:
    g = graph()
    assert "controller.wire.int_md" in g["controller.wire.telemetry_report"]
    assert "controller.nic.bpf.header" in g["controller.nic.bpf.loader"]
    assert "controller.common.logs" in g["controller.daemon"]  # a function-level import


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_cycle_finder_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_controller_never_imports_testbed() -> None:
    assert violations("controller -> testbed", ("controller",), ("controller",)) == []


def test_wire_imports_only_itself() -> None:
    assert violations("wire stands alone", ("controller.wire",), ("controller.wire",)) == []


def test_common_imports_only_itself() -> None:
    assert violations("common stands alone", ("controller.common",), ("controller.common",)) == []


def test_nic_reaches_the_controller_only_over_grpc() -> None:
    allowed = ("controller.nic", "controller.wire", "controller.common", "controller.proto")
    assert violations("nic", ("controller.nic",), allowed) == []


def test_controller_daemon_does_not_import_the_nic() -> None:
    daemon = tuple(n for n in graph() if n.startswith("controller.") and n.count(".") == 1)
    assert daemon, "no daemon modules found"
    bad = [
        f"{src} imports {dst}"
        for src in daemon
        for dst in graph()[src]
        if under(dst, "controller.nic")
    ]
    assert bad == []


# testbed/'s packages and top-level modules, in layers from the top down (docs/architecture.md):
# a module imports from its own package, its layer (not another engine) or a lower layer.
TESTBED_LAYERS: tuple[tuple[str, ...], ...] = (
    # the tools: the command line, benchmarks, replay, the collective library's CLI
    (
        "testbed.__main__",
        "testbed.main",
        "testbed.bench",
        "testbed.benchmarks",
        "testbed.replay",
        "testbed.sweep",
        "testbed.collective_cli",
        "testbed.p4build",
        "testbed.peer",
    ),
    # the engines, side by side: neither imports the other
    ("testbed.emu", "testbed.sim", "testbed.flow"),
    # the engine-neutral experiment layer: schemes, suite, report, plots
    ("testbed.experiment",),
    # the collective library: communicators, tuner, loss study (over any engine's runner)
    ("testbed.collective",),
    # what the hosts run: the transport, the jobs (flows, collective ranks), workloads
    ("testbed.traffic",),
    ("testbed.probes", "testbed.faults", "testbed.ctlconfig", "testbed.harness"),
    (
        "testbed.topo",
        "testbed.model",
        "testbed.p4files",
        "testbed.errors",
        "testbed.switch",
        "testbed.packets",
    ),
)
ENGINES = ("testbed.emu", "testbed.sim", "testbed.flow")


def unit_of(module: str) -> str | None:
    """The package or top-level module of testbed/ that `module` belongs to."""
    for layer in TESTBED_LAYERS:
        for unit in layer:
            if under(module, unit):
                return unit
    return None


def layer_of(unit: str) -> int:
    return next(i for i, layer in enumerate(TESTBED_LAYERS) if unit in layer)


def layer_violations(g: dict[str, set[str]]) -> list[str]:
    out = []
    for src, dsts in sorted(g.items()):
        a = unit_of(src)
        if a is None:
            continue
        for dst in sorted(dsts):
            b = unit_of(dst)
            if b is None or a == b:
                continue
            if layer_of(b) < layer_of(a):
                out.append(f"{src} imports {dst}: {b} is above {a}")
            elif a in ENGINES and b in ENGINES:
                out.append(f"{src} imports {dst}: one engine imports another")
    return out


def test_every_testbed_module_has_a_layer() -> None:
    unplaced = [m for m in graph() if under(m, "testbed") and m != "testbed" and unit_of(m) is None]
    assert unplaced == [], "add them to TESTBED_LAYERS (and to docs/architecture.md)"


def test_testbed_imports_run_down_its_layers() -> None:
    assert layer_violations(graph()) == []


def test_no_cycle_between_testbed_packages() -> None:
    units: dict[str, set[str]] = {}
    for src, dsts in graph().items():
        a = unit_of(src)
        if a is None:
            continue
        units.setdefault(a, set()).update(
            b for d in dsts if (b := unit_of(d)) is not None and b != a
        )
    assert cycles({u: units.get(u, set()) & set(units) for u in units}) == []


def test_layer_rule_finds_an_upward_import() -> None:
    g = {
        "testbed.traffic.jobs": {"testbed.collective.run"},
        "testbed.sim.fabric": {"testbed.emu.network"},
        "testbed.experiment.suite": {"testbed.traffic.jobs"},
    }
    assert layer_violations(g) == [
        "testbed.sim.fabric imports testbed.emu.network: one engine imports another",
        "testbed.traffic.jobs imports testbed.collective.run: testbed.collective is above "
        "testbed.traffic",
    ]
