"""What a run or a benchmark was measured on, and which code ran: every results file records
both beside its figures (the docs name the run, commit, date and machine of each table)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from pathlib import Path


def machine_description() -> dict[str, object]:
    """What the figures were measured on."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "load_avg": os.getloadavg(),
    }


def source_description() -> dict[str, object]:
    """Which code ran: the checkout's commit and whether it had uncommitted changes to tracked
    files, or, installed from a package, its version."""
    root = Path(__file__).resolve().parents[2]
    out: dict[str, object] = {}
    try:
        out["version"] = importlib.metadata.version("xingmai")
    except importlib.metadata.PackageNotFoundError:
        pass
    if (root / ".git").exists():
        try:
            git = ["git", "-C", str(root)]
            sha = subprocess.run(
                [*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            status = subprocess.run(
                [*git, "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            out.update(commit=sha, dirty=bool(status.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def provenance(
    command: str | None = None, machine_extra: dict[str, object] | None = None
) -> dict[str, object]:
    """When, where and with which code a results file was written (its `date`, `machine` and
    `source` keys, and `command` when given): what a table in the docs names of its run."""
    doc: dict[str, object] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {**machine_description(), **(machine_extra or {})},
        "source": source_description(),
    }
    if command is not None:
        doc["command"] = command
    return doc
