"""The Grafana dashboard shipped for users (docs/grafana/xingmai-fabric.json): a dashboard
Grafana imports (unique panel ids, every panel on the Prometheus datasource variable, inside the
24-column grid), whose every query names a metric the project exports. That each query returns
data from a running fabric is checked where a Prometheus server runs: the controller's queries
in tests/test_fabric_page.py, the switches' and agents' in tests/test_testbed_monitoring.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.grafana_helpers import DASHBOARD, METRIC, panels, queries

REPO = Path(__file__).resolve().parent.parent


def _exported_names() -> set[str]:
    """Metric family names declared by the exporters (with the _total of counters, the
    _bucket, _sum and _count of histograms)."""
    names = set()
    for src in (
        "controller/metrics.py",
        "testbed/switch/admin.py",
        "controller/nic/agent/metrics.py",
    ):
        text = (REPO / src).read_text()
        for kind, name in re.findall(
            r'(Counter|Gauge|Histogram)MetricFamily\(\s*"(xingmai_[a-z_]+)"', text
        ):
            if kind == "Histogram":
                names.update(name + end for end in ("_bucket", "_sum", "_count"))
            else:
                names.add(name + ("_total" if kind == "Counter" else ""))
    return names


def test_dashboard_is_importable_and_queries_exported_metrics() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "xingmai-fabric" and doc["schemaVersion"] >= 36
    ds = [v for v in doc["templating"]["list"] if v["type"] == "datasource"]
    assert [v["query"] for v in ds] == ["prometheus"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    exported = _exported_names()
    used = set()
    for p in panels():
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            names = METRIC.findall(t["expr"])
            assert names, (p["title"], t["expr"])
            used.update(names)
    assert used <= exported, sorted(used - exported)
    # every kind of daemon is on it
    assert {n.split("_")[1] for n in used} >= {"controller", "switch", "agent", "nic"}
    assert len(queries("xingmai_controller_")) >= 8
    assert queries("xingmai_switch_") and queries("xingmai_agent_")
