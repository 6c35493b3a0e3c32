"""The shipped Grafana dashboard's panels and queries, as Grafana sends them to Prometheus."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "xingmai-fabric.json"
# what Grafana substitutes before it queries Prometheus (All for the multi-value variables)
VARIABLES = {"$__rate_interval": "1m", "$link": ".*", "$node": ".*"}
METRIC = re.compile(r"\bxingmai_[a-z_]+")


def panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def queries(prefix: str) -> list[str]:
    """Every panel query whose metrics start with `prefix`, as Grafana sends it."""
    out = []
    for p in panels():
        for t in p["targets"]:
            expr = t["expr"]
            for k, v in VARIABLES.items():
                expr = expr.replace(k, v)
            if all(m.startswith(prefix) for m in METRIC.findall(expr)):
                out.append(expr)
    return out
