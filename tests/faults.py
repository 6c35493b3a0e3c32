"""Figures of the daemon fault tests (`-m fault`): each test records what it measured under
its name; `make faults` collects them in results/faults.json (XM_FAULT_FIGURES names the
file; unset, nothing is written)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def record(test: str, **figures: Any) -> None:
    path = os.environ.get("XM_FAULT_FIGURES")
    if not path:
        return
    p = Path(path)
    doc = json.loads(p.read_text()) if p.exists() and p.stat().st_size else {}
    doc[test] = figures
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
