"""No test module is another's library: what tests share lives in helper modules (tests/*_rig.py,
tests/*_helpers.py, tests/p4/, ...), never in a tests/test_*.py that others import."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# an import statement in a script the tests run in a subprocess (python -c "...")
SCRIPT_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+tests\.test_\w*[ \t]+import\b"
    r"|import[ \t]+(?:[\w.]+[ \t]*,[ \t]*)*tests\.test_"
    r"|from[ \t]+tests[ \t]+import\b[^\n]*\btest_)",
    re.MULTILINE,
)


def is_test_module(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[0] == "tests" and parts[1].startswith("test_")


def imports_of_test_modules(path: Path) -> list[tuple[int, str]]:
    """The `tests.test_*` modules `path` imports, at any depth, with the line of each."""
    package = ["tests", *path.relative_to(TESTS).parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{a.name}" for a in node.names]
            found += [(node.lineno, n) for n in names if is_test_module(n)][:1]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", ""))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and is_test_module(node.args[0].value)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def test_no_test_module_is_imported_by_another_file() -> None:
    offences: dict[tuple[str, int], str] = {}
    for path in sorted(TESTS.rglob("*.py")):
        rel = str(path.relative_to(TESTS.parent))
        # scripts in string literals, run by a subprocess (and plain imports: named below)
        text = path.read_text()
        for m in SCRIPT_IMPORT.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            offences[(rel, line)] = m.group().strip() + " ..."
        for line, name in imports_of_test_modules(path):
            offences[(rel, line)] = f"imports {name}"
    assert not offences, "move what tests share into a helper module:\n" + "\n".join(
        f"{rel}:{line}: {what}" for (rel, line), what in sorted(offences.items())
    )
