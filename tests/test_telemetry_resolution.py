"""Whether the switches' INT resolves the base RTT at a scale (testbed/ctlconfig.py).

The program's tx utilisation windows are 2^shift ns (shift 10 and up: 1.02 us, about one base
RTT at 400G; before, 2^20 ns and up, a thousand RTTs at the model's own speed, where INT read
a utilisation of 0) and v1model's clock counts microseconds: at the model's own speed (--scale
1, a 1 us base RTT) the window resolves T, the clock does not. The check says so (and from
which scale both resolve); the twin shows that the busy port's utilisation reaches the NICs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import controller.nic.ratelaw.reference as reference
from controller.nic.ratelaw.base import ALL_ONES32
from testbed.ctlconfig import (
    TelemetryResolution,
    smallest_resolving_scale,
    telemetry_resolution,
)
from testbed.experiment.report import telemetry_notes
from testbed.main import main
from testbed.model import Scaling
from testbed.topo import leafspine


def _scaling(spec: Any, scale: float) -> Scaling:
    return Scaling(scale=scale, max_hops=spec.longest_path_switches())


def test_the_model_speed_resolves_the_window_not_the_clock() -> None:
    spec = leafspine(2, 2, 4)
    at1 = telemetry_resolution(spec, _scaling(spec, 1))
    assert at1.tx_window_s == pytest.approx(2**10 * 1e-9)  # 8 frames at 400G: 665 ns
    assert at1.clock_s == pytest.approx(1e-6) and at1.base_rtt_s == pytest.approx(1e-6)
    # the window is about T, but it holds one or two steps of the clock, and the step is T
    problems = at1.problems()
    assert len(problems) == 2 and "holds 1 steps of the switch clock" in problems[0], problems
    assert "clock counts 1 us, 1 base RTTs" in problems[1]
    for scale in (20, 500, 1000, 20000):
        assert telemetry_resolution(spec, _scaling(spec, scale)).resolves, scale
    # at 1/10 a window of 2^13 ns holds 8 clock steps
    assert not telemetry_resolution(spec, _scaling(spec, 10)).resolves
    assert smallest_resolving_scale(spec, _scaling(spec, 1)) == 20
    # the window the controller programs at the emulation's scale, 2^24 ns (0.84 T)
    assert telemetry_resolution(spec, _scaling(spec, 20000)).tx_window_s == pytest.approx(
        2**24 * 1e-9
    )


def test_the_slowest_link_sets_the_window() -> None:
    """The controller sizes a switch's window to hold 8 frames at its slowest port: 200G host
    links at 1/1000 (200 Mb/s) get 2.1 ms windows, longer than two base RTTs of 1 ms; at
    100G, 8 frames take 2.7 model us, more than two base RTTs at any scale."""

    def hosts_at(gbps: float) -> Any:
        spec = leafspine(2, 2, 4)
        hosts = {h.name for h in spec.hosts}
        links = tuple(
            replace(lk, gbps=gbps) if hosts & {lk.a.node, lk.b.node} else lk for lk in spec.links
        )
        return replace(spec, links=links)

    spec = hosts_at(200)
    res = telemetry_resolution(spec, _scaling(spec, 1000))
    assert res.tx_window_s == pytest.approx(2**21 * 1e-9) and not res.resolves
    assert smallest_resolving_scale(spec, _scaling(spec, 1)) == 20  # 32.8 us windows, T 20 us
    spec = hosts_at(100)
    assert smallest_resolving_scale(spec, _scaling(spec, 1)) is None
    # a measured base RTT longer than the model's is what the laws run on: 65.5 us windows
    # at 1/20 are more than two model RTTs of 20 us, not two of 40 us
    assert not telemetry_resolution(spec, _scaling(spec, 20)).resolves
    assert telemetry_resolution(spec, _scaling(spec, 20), base_rtt_s=40e-6).resolves


def test_a_window_of_few_clock_steps_is_named() -> None:
    """A window of 2^13 ns holds 8 or 9 of v1model's microsecond steps: a busy port reads 98 %
    or 110 % of its load from one window to the next."""
    res = TelemetryResolution(tx_window_s=2**13 * 1e-9, clock_s=1e-6, base_rtt_s=20e-6)
    (problem,) = res.problems()
    assert "holds 8.2 steps of the switch clock" in problem
    assert TelemetryResolution(2**14 * 1e-9, 1e-6, 20e-6).resolves


def test_the_notes_name_the_problems_and_the_scale() -> None:
    spec = leafspine(2, 2, 4)
    res = telemetry_resolution(spec, _scaling(spec, 1))
    notes = telemetry_notes({"telemetry": res.record(20)})
    assert len(notes) == 3 and notes[-1].endswith("from --scale 20 (docs/fidelity.md)")
    ok = telemetry_resolution(spec, _scaling(spec, 20000))
    assert telemetry_notes({"telemetry": ok.record(None)}) == []
    assert telemetry_notes({}) == []  # a results file from before the check


@pytest.mark.slow
def test_the_twin_reads_the_utilisation_at_the_model_speed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the check stands for, on the twin: TiTa's NICs read the bottleneck's tx
    utilisation from INT, at the model's own speed as at 1/1000 (with 2^20 ns windows, the
    shortest before, every hop record at 1/1 said 0 while the queue stood). The run's results
    record the check."""
    flows = tmp_path / "incast.csv"
    flows.write_text("src,dst,bytes,start_s\nh2,h1,300000,0\nh3,h1,300000,0\n")
    seen: list[int] = []
    law = reference.tita_on_ack

    def watch(cc: Any, prm: Any, hops: list[Any], **kw: Any) -> Any:
        seen.extend(h.tx_util_ppm for h in hops if h.tx_util_ppm != ALL_ONES32)
        return law(cc, prm, hops, **kw)

    monkeypatch.setattr(reference, "tita_on_ack", watch)
    for scale in ("1", "1000"):
        seen.clear()
        run = tmp_path / scale
        # the NICs on the reference, whose law's inputs this watches (the native programs are
        # held equal to it by tests/test_nic_native.py)
        argv = ["run", "--engine", "sim", "--scale", scale, "--flows", str(flows)]
        argv += ["--nic-pipeline", "reference"]
        assert main([*argv, "--schemes", "tita", "--run-dir", str(run)]) == 0
        assert len(seen) > 20
        # ppm: the port busy for most of a window (the microsecond clock puts 1 or 2 of its
        # steps in a 1.02 us window at 1/1: a reading of about 100 % or 200 %)
        assert sorted(seen)[len(seen) // 2] > 500_000, (scale, seen)
        tel = json.loads((run / "results.json").read_text())["setup"]["telemetry"]
        assert tel["resolves"] is (scale == "1000")
