"""What a run or a benchmark was measured on: every results file records it beside its
figures (the docs name the machine of each table)."""

from __future__ import annotations

import os
import platform
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
