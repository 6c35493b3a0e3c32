"""The docs stay true: every repository path and Python module they name exists.

Reads README.md and docs/*.md as text (no mkdocs, no imports of the project): the inline code
spans and the links that look like repository paths (``controller/``, ``testbed/``, ``tests/``,
``p4src/``, ``ebpf/``, ``docs/``, ``.ci/``, or a top-level file such as ``Makefile``) must name
a file or folder of the repository, and dotted module names (``testbed.sim.fabric``, with at
most a trailing attribute that the module defines) a module or package. Run outputs
(``runs/``, ``results/``) are not committed and are exempt. README.md stays short.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
PAGES = [README, *DOCS]

README_MAX_LINES = 250
README_MAX_LINE_CHARS = 200

PATH_PREFIXES = ("controller/", "testbed/", "tests/", "p4src/", "ebpf/", "docs/", ".ci/")
EXEMPT_PREFIXES = ("runs/", "results/")
TOP_LEVEL_FILES = {
    "Makefile",
    "pyproject.toml",
    "mkdocs.yml",
    "README.md",
    ".gitignore",
    "setup.py",
    "setup.cfg",
    "requirements.txt",
    "tox.ini",
    "LICENSE",
    "Dockerfile",
}
PACKAGES = ("controller", "testbed", "tests")
# a dotted word that ends like a file name is a file (controller.yaml), not a module
FILE_SUFFIXES = {
    "py", "yaml", "yml", "json", "csv", "txt", "png", "md", "toml", "proto", "p4", "h", "c",
    "service", "html", "pcap", "stf", "txtpb", "log",
}  # fmt: skip

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DOTTED = re.compile(r"^(?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+$")
RUN_MODULE = re.compile(r"-m\s+((?:" + "|".join(PACKAGES) + r")(?:\.\w+)*)")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # NAME, FILE, RUN_DIR in a path: tests/p4/NAME.p4
NOT_PLACEHOLDERS = {"README", "LICENSE", "CHANGELOG", "CONTRIBUTING"}


def _prose_lines(path: Path) -> list[tuple[int, str]]:
    """The lines of a page outside fenced code blocks (commands and outputs are not checked)."""
    lines, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((n, line))
    return lines


def _split_commas(token: str) -> list[str]:
    """Split on commas outside braces: `a/x.py,b/y.py` is two paths, `a/{x,y}.py` one."""
    parts, depth, cur = [], 0, ""
    for ch in token:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p]


def _expand_braces(token: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    out = []
    for alt in m.group(1).split(","):
        out.extend(_expand_braces(token[: m.start()] + alt + token[m.end() :]))
    return out


def _clean(token: str) -> str:
    token = token.strip("\"'()[]<>")
    token = token.split("::", 1)[0]  # tests/test_x.py::test_y
    token = re.sub(r":\d+$", "", token)  # file.py:12
    return token.rstrip(",;:.")


def _paragraphs(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of each run of non-blank prose lines: a code span may wrap a line."""
    paras: list[tuple[int, str]] = []
    prev = -1
    for n, line in _prose_lines(path):
        if not line.strip():
            prev = -1
            continue
        if prev == n - 1 and paras:
            paras[-1] = (paras[-1][0], paras[-1][1] + "\n" + line)
        else:
            paras.append((n, line))
        prev = n
    return paras


def _tokens(path: Path) -> list[tuple[int, str, str]]:
    """(line, kind, token) for each candidate in the page's inline code and links."""
    found = []
    for first, text in _paragraphs(path):
        for m in INLINE_CODE.finditer(text):
            n = first + text.count("\n", 0, m.start())
            for word in m.group(2).split():
                for part in _split_commas(word):
                    found.append((n, "code", _clean(part)))
        for m in LINK.finditer(text):
            found.append((first + text.count("\n", 0, m.start()), "link", m.group(1)))
    return found


def _fenced_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for each `python -m MODULE` of the project in a fenced command block."""
    found, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif fenced:
            found += [(n, m.group(1)) for m in RUN_MODULE.finditer(line)]
    return found


def _is_repo_path(token: str) -> bool:
    return (
        token.startswith(PATH_PREFIXES)
        or token in TOP_LEVEL_FILES
        or re.match(r"^[A-Z][A-Z0-9_-]*\.md$", token) is not None  # DESIGN.md, CHANGELOG.md
    )


def _unplaceholder(component: str) -> str:
    stem, dot, suffix = component.partition(".")
    if PLACEHOLDER.match(stem) and stem not in NOT_PLACEHOLDERS:
        return "*" + dot + suffix
    return component


def _path_exists(token: str, base: Path = ROOT) -> bool:
    for candidate in _expand_braces(token):
        parts = [_unplaceholder(p) for p in candidate.split("/")]
        pattern = str(base / "/".join(parts))
        if any(ch in pattern for ch in "*?["):
            if not glob.glob(pattern):
                return False
        elif not (base / candidate).exists():
            return False
    return True


def _module_file(parts: list[str]) -> Path | None:
    p = ROOT.joinpath(*parts)
    if p.with_suffix(".py").is_file():
        return p.with_suffix(".py")
    if p.is_dir() and any(p.glob("*.py")):
        return p / "__init__.py"
    return None


def _config_key(name: str) -> bool:
    """`controller.web_addr` is the controller's config key, declared in its schema."""
    parts = name.split(".")
    schema = ROOT / "controller" / "config" / "schema.py"
    if parts[0] != "controller" or len(parts) != 2 or not schema.is_file():
        return False
    return re.search(rf"^\s+{parts[1]}\s*:", schema.read_text(), re.M) is not None


def _module_ok(name: str) -> bool:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        f = _module_file(parts[:k])
        if f is None:
            continue
        rest = parts[k:]
        if not rest:
            return True
        # a trailing attribute: the module (or package's __init__) must name it
        src = f.read_text(encoding="utf-8") if f.is_file() else ""
        if re.search(rf"\b{re.escape(rest[0])}\b", src):
            return True
        break
    return _config_key(name)


def _problems(path: Path) -> list[str]:
    rel = path.relative_to(ROOT)
    problems = []
    for n, kind, token in _tokens(path):
        where = f"{rel}:{n}"
        if not token or token.startswith(EXEMPT_PREFIXES):
            continue
        if kind == "link":
            if re.match(r"^[a-z][a-z0-9+.-]*:", token) or token.startswith("#"):
                continue  # http(s), mailto, an anchor on the same page
            target = token.split("#", 1)[0]
            resolved = (path.parent / target).resolve()
            if resolved.is_relative_to(ROOT / "runs") or resolved.is_relative_to(ROOT / "results"):
                continue
            if not resolved.exists():
                problems.append(f"{where}: link to {token}: no such file in the repository")
            continue
        if _is_repo_path(token):
            if not _path_exists(token):
                problems.append(f"{where}: `{token}`: no such file or folder in the repository")
        elif DOTTED.match(token) and token.rsplit(".", 1)[1] not in FILE_SUFFIXES:
            if not _module_ok(token):
                problems.append(f"{where}: `{token}`: no such module (or attribute of one)")
    for n, module in _fenced_modules(path):
        if _module_file(module.split(".")) is None:
            problems.append(f"{rel}:{n}: python -m {module}: no such module")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_named_paths_and_modules_exist(page: Path) -> None:
    problems = _problems(page)
    assert not problems, "\n".join(problems)


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    long = [n for n, line in enumerate(lines, 1) if len(line) > README_MAX_LINE_CHARS]
    assert not long, f"README.md lines over {README_MAX_LINE_CHARS} characters: {long}"


def test_the_checker_catches_stale_names(tmp_path: Path) -> None:
    """The checks above would fail on a stale path, module or attribute (not only pass)."""
    assert _path_exists("testbed/sim/")
    assert _path_exists("testbed/{topo,probes}.py")
    assert _path_exists("ebpf/lib/*.h")
    assert _path_exists("tests/p4/NAME.p4")
    assert not _path_exists("tests/p4/NAME.nosuch")
    assert not _path_exists("controller/nic/ratelaw.py")
    assert not _path_exists("testbed/transport/")
    assert not _path_exists("testbed/{topo,nosuch}.py")
    assert _module_ok("controller.nic.ratelaw")
    assert _module_ok("controller.nic.ratelaw.ReferenceNic")
    assert not _module_ok("controller.nic.ratelaw.NoSuchName")
    assert not _module_ok("testbed.transport")
    assert _module_ok("controller.web_addr")  # the config key
    page = tmp_path / "page.md"
    page.write_text(
        "see `controller/ratelaw.py` and [x](nosuch.md), `python -m\ntestbed.nosuch`\n"
        "```\ntestbed/nosuch\n```\n"
    )
    tokens = [(n, t) for n, _, t in _tokens(page)]
    assert tokens == [
        (1, "controller/ratelaw.py"),
        (1, "python"),
        (1, "-m"),
        (1, "testbed.nosuch"),
        (1, "nosuch.md"),
    ]
    assert not _module_ok("testbed.nosuch")
    page.write_text("```\n$ python -m testbed.switch.stf x.json\npython -m tests.nosuch\n```\n")
    assert _fenced_modules(page) == [(2, "testbed.switch.stf"), (3, "tests.nosuch")]
