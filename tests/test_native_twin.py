"""The twin with the native switch pipeline, the native NIC (the XDP program compiled), the
native transport core and the hosts' per-packet loops in C inside it gives what it gives with
the Python references (issue 29's proof at the scale of a suite, and issue 30's for the NIC,
the transport and the hosts): the same cells of the short suite on both, every record
identical, series included. A pipeline that drifted by one bit of a header, one ECN mark or
one INT field, a rate law by one bit/s, a transport by one ACK or a host by one kick, would
move a queue, a rate or a completion time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testbed.experiment.suite import RunRecord, SuiteConfig
from testbed.model import Scaling, model_with_buffer
from testbed.sim.fabric import SimFabric
from testbed.sim.nic_programs import ReferencePrograms
from testbed.sim.suite import SimSuite
from testbed.topo import leafspine

pytestmark = pytest.mark.slow

SPEC = leafspine(2, 2, 2)
CFG = SuiteConfig(
    **{
        **SuiteConfig.quick().__dict__,
        "schemes": ("dcqcn", "tita", "hpcc", "dcqcn+pfc"),
        "scenarios": ("incast", "websearch"),
        "incast_bytes": 200_000,
        "websearch_seconds": 0.5,
        # every flow from line rate: the incast's pauses and drops are paths too
        "proactive_start": False,
    }
)
# the proactive start's path (the NICs paced from a declared rate), one cell
HINTED = SuiteConfig(**{**CFG.__dict__, "schemes": ("tita",), "proactive_start": True})


def record(r: RunRecord) -> Any:
    d = {
        **r.summary(),
        "queue_series": r.queue_series,
        "rate_series": r.rate_series,
        "slowdowns": r.slowdowns,
        "flow_fcts": r.flow_fcts,
        "port_series": r.port_series,
    }
    return json.loads(json.dumps(d))


def run(
    pipeline: str, cfg: SuiteConfig = CFG
) -> tuple[dict[tuple[str, str], Any], tuple[str, str, str, str]]:
    # the static buffer: its drops and pauses are paths the pipelines must agree on too
    scaling = Scaling(
        model=model_with_buffer("static"), scale=1.0, max_hops=SPEC.longest_path_switches()
    )
    fab = SimFabric(SPEC, scaling, seed=5, pipeline=pipeline)
    records = {(r.scheme, r.scenario): record(r) for r in SimSuite(fab, cfg).run()}
    # the suite's fabrics share the record of the transport cores their jobs ran
    transport = "+".join(sorted(fab.transport_in_use))
    return records, (
        next(iter(fab.switches.values())).sw.pipeline_in_use,
        fab.nic_pipeline_in_use,
        transport,
        # the hosts' loops: in C but for dcqcn+pfc's jobs (PFC is SimHost's Python)
        "+".join(sorted(fab.host_in_use)),
    )


def test_the_twin_on_the_native_pipeline_matches_the_reference() -> None:
    native, in_use = run("native")
    if in_use != ("native", "native", "native", "native+reference"):
        pytest.skip("the native pipeline, NIC or transport does not build here (no C compiler)")
    reference, in_use = run("reference")
    assert in_use == ("reference", "reference", "reference", "reference")
    assert native.keys() == reference.keys() and len(native) == 8
    for cell, rec in reference.items():
        assert native[cell] == rec, f"{cell} differs between the pipelines"
    # the cells did something: packets marked, paused, queued
    assert any(r["queue_max_bytes"] > 0 for r in reference.values())
    assert reference[("dcqcn+pfc", "incast")]["pauses"] > 0
    assert all(r["rate_series"] for r in reference.values())  # the laws moved rates
    hinted, _ = run("native", HINTED)
    assert hinted == run("reference", HINTED)[0]
    assert hinted[("tita", "incast")]["start_hints"] > 0


def test_each_part_keeps_its_pipeline_in_a_fresh_fabric() -> None:
    """Every run of a suite is on a fabric built anew (`fresh`): the NICs stay on the pipeline
    asked for, whatever the switches run (a bisection of the two must not be undone by it)."""
    scaling = Scaling(scale=1.0, max_hops=SPEC.longest_path_switches())
    fab = SimFabric(
        SPEC, scaling, pipeline="native", nic_pipeline="reference", transport_pipeline="reference"
    ).fresh()
    assert fab.nic_pipeline_in_use == "reference"
    assert all(isinstance(h.nic, ReferencePrograms) for h in fab.hosts.values())
    assert fab.transport_pipeline == "reference"
