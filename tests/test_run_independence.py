"""A twin run's result depends only on its scenario, scheme, parameters and seed: every run
starts on a fresh fabric (switches, NICs, transports, the clock and every random stream as
built), whatever ran before it in the process. The same cells alone, inside a suite and in
another order give identical records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testbed.experiment.suite import RunRecord, SuiteConfig
from testbed.model import Scaling
from testbed.sim.fabric import SimFabric
from testbed.sim.suite import SimSuite
from testbed.topo import leafspine

pytestmark = pytest.mark.slow

SPEC = leafspine(2, 2, 2)
CFG = SuiteConfig(
    **{
        **SuiteConfig.quick().__dict__,
        "schemes": ("dcqcn", "tita", "dcqcn+pfc"),
        "scenarios": ("incast", "alltoall", "websearch"),
        "incast_bytes": 100_000,
        "alltoall_bytes": 64 << 10,
        "websearch_seconds": 0.5,
    }
)


def run(schemes: tuple[str, ...], scenarios: tuple[str, ...]) -> dict[tuple[str, str], Any]:
    cfg = SuiteConfig(**{**CFG.__dict__, "schemes": schemes, "scenarios": scenarios})
    fab = SimFabric(SPEC, Scaling(scale=1.0, max_hops=SPEC.longest_path_switches()), seed=3)
    return {(r.scheme, r.scenario): record(r) for r in SimSuite(fab, cfg).run()}


def record(r: RunRecord) -> Any:
    """Everything a run recorded, series included (as the results file keeps it)."""
    d = {
        **r.summary(),
        "queue_series": r.queue_series,
        "rate_series": r.rate_series,
        "slowdowns": r.slowdowns,
        "flow_fcts": r.flow_fcts,
        "port_series": r.port_series,
    }
    return json.loads(json.dumps(d))


def test_cells_alone_in_a_suite_and_in_another_order_are_identical() -> None:
    suite = run(CFG.schemes, CFG.scenarios)
    reverse = run(tuple(reversed(CFG.schemes)), tuple(reversed(CFG.scenarios)))
    assert suite.keys() == reverse.keys()
    for cell, rec in suite.items():
        assert rec == reverse[cell], f"{cell} differs when the suite runs in another order"
    for scheme, scenario in [("tita", "incast"), ("dcqcn+pfc", "websearch"), ("dcqcn", "alltoall")]:
        alone = run((scheme,), (scenario,))
        assert alone[(scheme, scenario)] == suite[(scheme, scenario)], (
            f"{scheme} / {scenario} alone differs from the same cell in the suite"
        )
    # and the cells differ from each other: the comparison can fail
    assert suite[("tita", "incast")] != suite[("dcqcn", "incast")]


def test_the_two_job_cell_measures_the_jobs_together_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two-job cell runs each job alone afterwards, for its slowdown; its queues,
    utilisation and counters are the together run's, so they do not change when the alone runs
    are left out (nor with the RTO, whose last timer the twin waits out before them)."""
    from testbed.collective.run import Together

    def cell() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        fig = run(("none",), ("twojob",))[("none", "twojob")]
        jobs = fig.pop("jobs")
        return fig, jobs

    with_alone, jobs = cell()
    assert all("slowdown" in j for j in jobs)
    monkeypatch.setattr(Together, "run_alone", lambda self: None)
    without, jobs_without = cell()
    assert all("slowdown" not in j for j in jobs_without)
    assert with_alone == without
