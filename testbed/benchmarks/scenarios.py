"""The scenario comparison (a short `make run`): TiTa vs DCQCN vs no CC on the default fabric.

Boots the default leaf-spine (2 leaves, 2 spines, 8 hosts; `quick`: 2 leaves, 1 spine, 4 hosts
and the incast only), runs the short suite (testbed.experiment.suite.SuiteConfig.quick) once per
scheme, and returns per scheme and scenario the figures of the README's table, the verdict
lines, and the conditions (switch target, scale, base RTT). Runs only as root.
"""

from __future__ import annotations

import os
from typing import Any

from testbed.emu.suite import EmuSuite
from testbed.experiment.suite import SuiteConfig


def run(quick: bool) -> dict[str, Any]:
    if os.geteuid() != 0:
        return {"skipped": "needs root (network namespaces, veths, eBPF)"}
    from testbed.emu.network import Testbed, TestbedOptions
    from testbed.experiment.report import verdict
    from testbed.experiment.rundir import new_run_dir
    from testbed.topo import leafspine

    spec = leafspine(2, 1, 2) if quick else leafspine(2, 2, 4)
    base = SuiteConfig.quick()
    cfg = SuiteConfig(**{**base.__dict__, "scenarios": ("incast",)}) if quick else base
    run_dir = new_run_dir()
    tb = Testbed(spec, TestbedOptions(run_dir=run_dir, progress=lambda line: None))
    with tb, EmuSuite(tb, cfg) as suite:
        records = suite.run()
        figures: dict[str, Any] = {}
        for r in records:
            figures.setdefault(r.scenario, {})[r.scheme] = {
                "bottleneck": r.bottleneck,
                "queue_p99_kb": round(r.queue_p99_bytes / 1e3, 1),
                "queue_max_kb": round(r.queue_max_bytes / 1e3, 1),
                "drops": r.drops,
                "utilization": None if r.utilization is None else round(r.utilization, 3),
                "fct_slowdown_p50": r.fct_slowdown_p50,
                "fct_slowdown_p99": r.fct_slowdown_p99,
                "busbw_mbps": None if r.busbw_bps is None else round(r.busbw_bps / 1e6, 3),
                "completion_s": round(r.completion_s, 3),
            }
        return {
            "topology": spec.name,
            "switch": tb.switch_cls.kind,
            "scaling": tb.scaling.describe(),
            "base_rtt_ms": round(suite.base_rtt_s * 1e3, 3),
            "tita_base_rtt_ms": round(suite.tita_t_s * 1e3, 3),
            "suite": {k: v for k, v in cfg.__dict__.items()},
            "scenarios": figures,
            "verdict": verdict(records),
            "run_dir": str(run_dir),
        }
