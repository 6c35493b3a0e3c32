"""A Prometheus server (Debian's `prometheus`) scraping every daemon a run started: the
controller, each built-in switch and each host agent.

    prom = Prometheus(run_dir, [Target("controller", "127.0.0.1:9464", {}), ...])
    prom.start(); prom.wait_ready(30)
    prom.targets()      # [{"job": ..., "instance": ..., "health": "up", ...}]
    prom.query("xingmai_controller_link_utilization")

The config and the time-series database live in the run directory (`prometheus/`), so a run's
metrics stay with its logs; the server listens on loopback only, and scrapes only the
addresses given (loopback, or the switches' management addresses, which only this machine
reaches).
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.emu.procs import Component

# the emulation's events last seconds: Prometheus' default of a minute would miss them
# (a queue that fills in 40 ms and drains in a second shows in two scrapes at least)
SCRAPE_INTERVAL_S = 0.5


@dataclass(frozen=True)
class Target:
    job: str  # controller, switch, agent
    addr: str  # HOST:PORT of its /metrics
    labels: dict[str, str] = field(default_factory=dict)  # e.g. {"node": "leaf1"}


def binary() -> str | None:
    return shutil.which("prometheus")


def scrape_config(targets: list[Target], interval_s: float = SCRAPE_INTERVAL_S) -> dict[str, Any]:
    """prometheus.yml: one job per kind of daemon, one static target per daemon, labelled with
    its node's name."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    for t in targets:
        jobs.setdefault(t.job, []).append({"targets": [t.addr], "labels": dict(t.labels)})
    interval = f"{round(interval_s * 1000)}ms"
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        },
        "scrape_configs": [
            {"job_name": job, "static_configs": static} for job, static in jobs.items()
        ],
    }


class Prometheus:
    def __init__(
        self,
        run_dir: Path,
        targets: list[Target],
        listen: str,
        interval_s: float = SCRAPE_INTERVAL_S,
    ):
        self.dir = run_dir / "prometheus"
        self.targets_wanted = list(targets)
        self.listen = listen
        self.url = f"http://{listen}"
        self.interval_s = interval_s
        self.component: Component | None = None

    def start(self) -> Component:
        exe = binary()
        if exe is None:
            raise FileNotFoundError("prometheus is not installed (apt-get install prometheus)")
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "prometheus.yml"
        cfg.write_text(
            yaml.safe_dump(scrape_config(self.targets_wanted, self.interval_s), sort_keys=False)
        )
        self.component = Component(
            "prometheus",
            [
                exe,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address={self.listen}",
                "--storage.tsdb.retention.time=7d",
                "--log.level=warn",
            ],
            self.dir / "prometheus.log",
        )
        return self.component

    def wait_ready(self, timeout: float) -> None:
        assert self.component is not None
        self.component.wait_until(self._ready, timeout, "ready")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def _api(self, path: str, **params: str) -> Any:
        q = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{q}", timeout=5) as resp:
            doc = json.loads(resp.read())
        if doc.get("status") != "success":
            raise RuntimeError(f"prometheus {path}: {doc.get('error', doc)}")
        return doc["data"]

    def targets(self) -> list[dict[str, Any]]:
        """The active targets: job, instance, the node label, health (up/down/unknown), error."""
        return [
            {
                "job": t["labels"].get("job", ""),
                "instance": t["labels"].get("instance", ""),
                "node": t["labels"].get("node", ""),
                "health": t["health"],
                "error": t.get("lastError", ""),
            }
            for t in self._api("targets", state="active")["activeTargets"]
        ]

    def all_up(self) -> bool:
        ts = self.targets()
        return len(ts) == len(self.targets_wanted) and all(t["health"] == "up" for t in ts)

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: (labels, value) per series."""
        data = self._api("query", query=expr)
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def stop(self) -> None:
        if self.component is not None:
            self.component.stop(timeout=10)
