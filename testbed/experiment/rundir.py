"""Where a run writes its outputs: a new folder under `runs/` of the working directory (a
checkout's own runs/ when run from its root, as `make run` does; an installed package writes
beside where the user runs it, never into the package)."""

from __future__ import annotations

import time
from pathlib import Path

RUNS = Path("runs")


def new_run_dir(kind: str = "", base: Path = RUNS) -> Path:
    """`base/<date-time>[-kind]`, created; `-2`, `-3`, ... after it when that exists."""
    stem = time.strftime("%Y%m%d-%H%M%S") + (f"-{kind}" if kind else "")
    path, n = base / stem, 1
    while path.exists():
        n += 1
        path = base / f"{stem}-{n}"
    path.mkdir(parents=True)
    return path
