"""The twin's event loop in C with its switch hops (testbed/sim/native_loop.py,
testbed/switch/native/hop.py) against the Python loop (testbed/sim/engine.py) over the same
native switches: the same events in the same order, and the same runs, where the hop's C
hands part of its work back to Python too (a link down and its fail-over's table writes, a
lossy link's receive faults, a slow switch, PFC, the collector's reports)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from testbed import faults
from testbed.experiment.suite import RunRecord, SuiteConfig
from testbed.model import Scaling
from testbed.sim.engine import EventLoop
from testbed.sim.fabric import SimFabric
from testbed.sim.native_loop import NativeEventLoop
from testbed.sim.suite import SimSuite
from testbed.topo import leafspine

SPEC = leafspine(2, 2, 2)


def native_loop() -> NativeEventLoop:
    fab = SimFabric(SPEC, Scaling(max_hops=SPEC.longest_path_switches()), pipeline="native")
    if fab.loop_in_use != "native":
        pytest.skip("the native pipeline does not build here (no C compiler)")
    lib = next(iter(fab.switches.values())).sw.compiled.native  # type: ignore[union-attr]
    return NativeEventLoop(lib.ffi, lib.lib, 0, 0)


@pytest.mark.parametrize("seed", range(5))
def test_python_events_run_in_the_same_order_on_both_loops(seed: int) -> None:
    """Random events, many due at the same nanosecond, some scheduling more (in the past
    too: not before now), run until a bound, then a stop, then to the end: the same order,
    clock and counts."""
    native = native_loop()

    def drive(loop: Any) -> list[Any]:
        rnd = random.Random(seed)
        seen: list[Any] = []

        def event(name: int) -> None:
            seen.append((name, loop.now_ns))
            for k in range(rnd.choice([0, 0, 1, 2])):
                loop.at(loop.now_ns + rnd.choice([-5, 0, 0, 1, 7, 100]), event, name * 10 + k)

        for i in range(200):
            loop.at(rnd.choice([0, 3, 3, 50, 1000, 4000]), event, i)
        seen.append(("until", loop.run(until_ns=1000), loop.now_ns, loop.pending))
        seen.append(("stop", loop.run(stop=lambda: len(seen) > 400), loop.now_ns))
        seen.append(("end", loop.run(), loop.now_ns, loop.events, loop.pending))
        seen.append(("past", loop.run(until_ns=10**6), loop.now_ns))
        return seen

    assert drive(native) == drive(EventLoop())


def test_an_event_that_raises_stops_the_run_with_its_exception() -> None:
    loop = native_loop()

    def boom() -> None:
        raise ValueError("from an event")

    loop.at(5, boom)
    loop.at(6, lambda: None)
    with pytest.raises(ValueError, match="from an event"):
        loop.run()
    assert loop.now_ns == 5 and loop.pending == 1
    assert loop.run() is False and loop.events == 2


def cells(loop: str, *fault_lines: str, scheme: str = "tita") -> list[Any]:
    fab = SimFabric(
        SPEC, Scaling(max_hops=SPEC.longest_path_switches()), seed=3, loop_pipeline=loop
    )
    cfg = SuiteConfig(
        **{
            **SuiteConfig.quick().__dict__,
            "schemes": (scheme,),
            "scenarios": ("websearch",),
            "websearch_seconds": 1.5,
        }
    )
    suite = SimSuite(fab, cfg)
    parsed = [faults.parse_command(SPEC, line) for line in fault_lines]
    suite.faults = [faults.Fault(f.target, f.kind, f.value, 0.3, f.count) for f in parsed]
    recs: list[RunRecord] = suite.run()
    out = []
    for r in recs:
        d = {
            **r.summary(),
            "queue_series": r.queue_series,
            "rate_series": r.rate_series,
            "flow_fcts": r.flow_fcts,
            "port_series": r.port_series,
            "suspects": r.suspects,
            "failovers": r.failovers,
        }
        out.append(json.loads(json.dumps(d)))
    return [fab.loop_in_use, out]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scheme", "fault"),
    [
        ("tita", "link leaf1:3 down"),  # drops, then the fail-over writes tables mid-run
        ("tita", "link leaf1:3 loss 2%"),  # receive faults: the draws in C and in Python
        ("tita", "switch spine2 kill"),  # a switch that stops: its queues and wires idle
        ("dcqcn+pfc", "link leaf1:3 rate 25%"),  # PFC: pauses and timers through Python
    ],
)
def test_the_native_loop_runs_what_the_python_loop_runs(scheme: str, fault: str) -> None:
    native = cells("native", fault, scheme=scheme)
    if native[0] != "native":
        pytest.skip("the native pipeline does not build here (no C compiler)")
    python = cells("reference", fault, scheme=scheme)
    assert python[0] == "reference"
    assert native[1] == python[1]
    [rec] = native[1]
    assert rec["flows_completed"] > 0
    assert rec["suspects"]  # the fault showed, so its paths ran


def test_the_loop_stays_as_asked_in_a_fresh_fabric() -> None:
    scaling = Scaling(max_hops=SPEC.longest_path_switches())
    fab = SimFabric(SPEC, scaling, pipeline="native", loop_pipeline="reference").fresh()
    assert fab.loop_in_use == "reference" and isinstance(fab.loop, EventLoop)
    fab = SimFabric(SPEC, scaling, pipeline="reference").fresh()
    assert fab.loop_in_use == "reference"  # no native switch: no native loop
