"""Every measured table in the docs names the run it came from (issue 28).

Reads README.md and docs/*.md as text. A *table* is a Markdown pipe table (a row of ``|``
cells over a ``| --- |`` delimiter row, indented or not) or a fenced block that reads as one
(at least two lines with three or more numbers each: report outputs, nccl-tests-style tables,
bench outputs, transcripts of a run). Every table is *measured* unless it is listed in
``REFERENCE_TABLES`` below (parameter references, wire formats, field lists, the
architecture's layer table, metric definitions), by its page and its first line; a listed
table that is no longer there fails too, so the list stays true.

A measured table needs a *provenance line* beside it: the paragraph just above the table or
just below it (blank lines between are allowed, nothing else) starts with ``Run`` followed by a
space, a colon or a backtick, as the first line of ``xingmai-testbed report --markdown`` does
(``Run `runs/x` (sim, ...), commit abc1234, 2026-12-03T18:48:06+0000, AMD EPYC, 2 cores; ...``).
By convention it names the command, the commit, the date and the machine; where the run itself
was not recorded it says so and names the commit that first published the figures
(``Run not recorded: ...; first published in commit abc1234 (2026-12-01); machine not
recorded.``). The test requires of it:

- at least one ``commit <7-40 hex digits>``, and every commit so named is in the repository's
  history (``git cat-file --batch-check``; not looked up outside a git checkout or in a
  shallow clone);
- a date, ``YYYY-MM-DD``;
- where it names a ``runs/`` results path, the words "outside the repository" (run outputs are
  not committed: the path cannot be followed from a clone).

A failure names the page and the line of the table.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Tables that are not measurements: (page, the table's first line, spaces collapsed).
REFERENCE_TABLES = {
    ("README.md", "| folder | what is there |"),
    ("docs/architecture.md", "| box | folder | entry point |"),
    ("docs/baselines.md", "| profile | law | parameters (as the source gives them) | source |"),
    ("docs/fidelity.md", "| field | column | unit | range | definition |"),
    ("docs/fidelity.md", "| key | what |"),
    ("docs/fidelity.md", "| theirs | ours |"),
    ("docs/nic.md", "| file | hook | does |"),
    ("docs/wire-format.md", "| bytes | field |"),
}

FENCE = re.compile(r"^\s*(```|~~~)")
PIPE_ROW = re.compile(r"^\s*\|")
DELIMITER_ROW = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
# a number as tables print it: 12, 1,024, 3.5, -0.04, 49.5%, 1.26x, 64K, 2.5e+05, [0-4], (1.10)
NUMBER = re.compile(r"^[\[(]?[-+]?\d[\d.,:e+-]*(%|x|[kKMGT]i?B?|us|ms|s)?[\])]?[,;:]?$")
PROVENANCE = re.compile(r"^Run[\s:`]")
COMMIT = re.compile(r"\bcommit\s+([0-9a-f]{7,40})\b")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d(?!\d)")  # also 2026-12-03T18:48:06
RUNS_PATH = re.compile(r"(?<![\w/.-])runs/")
OUTSIDE = "outside the repository"


@dataclass
class Table:
    line: int  # 1-based, the table's first line (a fence's opening line)
    end: int  # 1-based, its last line (a fence's closing line)
    first: str  # its first row, spaces collapsed (a fence: its first line inside)


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _numeric_rows(lines: list[str]) -> int:
    return sum(1 for line in lines if sum(1 for t in line.split() if NUMBER.match(t)) >= 3)


def tables(lines: list[str]) -> list[Table]:
    """The page's pipe tables and the fenced blocks that read as tables."""
    found: list[Table] = []
    i = 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            j = i + 1
            while j < len(lines) and not FENCE.match(lines[j]):
                j += 1
            body = lines[i + 1 : j]
            if _numeric_rows(body) >= 2:
                found.append(Table(i + 1, min(j, len(lines) - 1) + 1, _collapse(body[0])))
            i = j + 1
            continue
        if PIPE_ROW.match(lines[i]) and i + 1 < len(lines) and DELIMITER_ROW.match(lines[i + 1]):
            j = i + 2
            while j < len(lines) and PIPE_ROW.match(lines[j]):
                j += 1
            found.append(Table(i + 1, j, _collapse(lines[i])))
            i = j
            continue
        i += 1
    return found


def _paragraph_above(lines: list[str], table: Table) -> str:
    k = table.line - 2  # 0-based index of the line above the table
    while k >= 0 and not lines[k].strip():
        k -= 1
    end = k
    while k >= 0 and lines[k].strip() and not FENCE.match(lines[k]):
        k -= 1
    return "\n".join(s.strip() for s in lines[k + 1 : end + 1])


def _paragraph_below(lines: list[str], table: Table) -> str:
    k = table.end  # 0-based index of the line below the table
    while k < len(lines) and not lines[k].strip():
        k += 1
    start = k
    while k < len(lines) and lines[k].strip() and not FENCE.match(lines[k]):
        k += 1
    return "\n".join(s.strip() for s in lines[start:k])


def provenance(lines: list[str], table: Table) -> str | None:
    """The provenance paragraph beside a table, or None."""
    for para in (_paragraph_above(lines, table), _paragraph_below(lines, table)):
        if PROVENANCE.match(para):
            return para
    return None


def missing_commits(commits: set[str]) -> set[str]:
    """The commits of ``commits`` that are not in the repository's history."""
    if not commits:
        return set()
    names = sorted(commits)
    out = subprocess.run(
        ["git", "cat-file", "--batch-check"],
        input="".join(f"{c}^{{commit}}\n" for c in names),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=30,
    ).stdout.splitlines()
    return {c for c, answer in zip(names, out, strict=True) if answer.endswith(" missing")}


def problems(rel: str, text: str, check_commits: bool = True) -> list[str]:
    """What is wrong with the page's measured tables, each as ``page:line: why``."""
    lines = text.splitlines()
    found: list[tuple[int, str]] = []  # (line, why)
    named: dict[int, list[str]] = {}
    for table in tables(lines):
        if (rel, table.first) in REFERENCE_TABLES:
            continue
        where = table.line
        para = provenance(lines, table)
        if para is None:
            found.append((where, "measured table without a provenance line ('Run ...') beside it"))
            continue
        flat = _collapse(para)
        commits = COMMIT.findall(flat)
        if not commits:
            found.append((where, "its provenance line names no commit ('commit abc1234')"))
        named[where] = commits
        if not DATE.search(flat):
            found.append((where, "its provenance line names no date (YYYY-MM-DD)"))
        if RUNS_PATH.search(flat) and OUTSIDE not in flat:
            found.append((where, f"its provenance line names a runs/ path without '{OUTSIDE}'"))
    if check_commits:
        unknown = missing_commits({c for cs in named.values() for c in cs})
        for where, commits in named.items():
            for c in commits:
                if c in unknown:
                    found.append((where, f"its provenance line names commit {c}, not in history"))
    return [f"{rel}:{n}: {why}" for n, why in sorted(found)]


def _git_answers(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", *args], capture_output=True, text=True, cwd=ROOT, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


GIT = _git_answers("--is-inside-work-tree") == "true"
# a shallow clone lacks the older commits: their lookup is skipped there, not failed
HISTORY = GIT and _git_answers("--is-shallow-repository") == "false"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_measured_table_names_its_run(page: Path) -> None:
    rel = str(page.relative_to(ROOT))
    found = problems(rel, page.read_text(encoding="utf-8"), check_commits=HISTORY)
    assert not found, "\n".join(found)


def test_reference_tables_are_still_there() -> None:
    """Each table listed as not measured exists, so the list does not hide a stale entry."""
    present = set()
    for page in PAGES:
        rel = str(page.relative_to(ROOT))
        present |= {(rel, t.first) for t in tables(page.read_text(encoding="utf-8").splitlines())}
    assert not REFERENCE_TABLES - present, sorted(REFERENCE_TABLES - present)


@pytest.mark.skipif(not GIT, reason="not a git checkout: commits cannot be looked up")
def test_the_checker_catches_a_table_without_its_run() -> None:
    """The rule fails (not only passes): no line, a made-up commit, an unmarked runs/ path."""
    real = subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    table = "| scheme | p99 queue KB |\n| --- | ---: |\n| tita | 311.0 |\n"
    fence = "```\nincast tita 311.0 0 96\nincast dcqcn 495.6 302 38\n```\n"
    assert problems("p.md", f"Intro:\n\n{table}") == [
        "p.md:3: measured table without a provenance line ('Run ...') beside it"
    ]
    assert problems("p.md", f"{fence}\nRun: `make sim`, commit {real}, 2026-12-03, a box.\n") == []
    assert problems("p.md", f"Run: `make sim`, commit {real}, 2026-12-03, a box.\n\n{table}") == []
    assert problems("p.md", f"Run: `make sim`, commit 0000000, 2026-12-03.\n\n{table}") == [
        "p.md:3: its provenance line names commit 0000000, not in history"
    ]
    assert problems("p.md", f"Run: runs/x, commit {real}, 2026-12-03.\n\n{fence}") == [
        f"p.md:3: its provenance line names a runs/ path without '{OUTSIDE}'"
    ]
    text = f"Run: runs/x ({OUTSIDE}), commit {real}, 2026-12-03.\n\n{fence}"
    assert problems("p.md", text) == []
    assert problems("p.md", f"Run not recorded.\n\n{table}") == [
        "p.md:3: its provenance line names no commit ('commit abc1234')",
        "p.md:3: its provenance line names no date (YYYY-MM-DD)",
    ]
    # a command block is not a table; prose between the line and the table breaks adjacency
    assert problems("p.md", "```\nmake run RUN_ARGS=--quick\n```\n") == []
    text = f"Run: `make sim`, commit {real}, 2026-12-03.\n\nWhat it shows.\n\n{table}"
    assert problems("p.md", text) == [
        "p.md:5: measured table without a provenance line ('Run ...') beside it"
    ]
