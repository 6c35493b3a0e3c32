"""Fail-over in the controller's Prometheus metrics and its log: the daemon's operations loop
(controller/operations.py) fails a link over and back on fake switch sessions, and the
metrics say how often, which links are routed around now, how many reroutes each way and
how long the writes took; the telemetry counters follow the collector's."""

from __future__ import annotations

import asyncio
import logging
import types
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from controller.collector import Collector
from controller.config import load
from controller.health import PortSample, SwitchSample
from controller.metrics import registry
from controller.operations import Operations, PollFailed
from controller.topology import Topology

EXAMPLE = Path(__file__).resolve().parents[1] / "controller" / "examples" / "leafspine-2x2.yaml"
DEAD = "leaf2:6-spine2:2"


class FakeSession:
    """A switch session that accepts every reconcile and records the routes it was given."""

    def __init__(self, name: str, topo: Topology):
        self.name = name
        self.topo = topo
        self.switch = object()
        self.health = types.SimpleNamespace(connected=True)
        self.reconciled: list[frozenset[str]] = []

    async def reconcile(self) -> bool:
        self.reconciled.append(self.topo.down)
        return True


def metric_lines(d: object) -> dict[str, float]:
    out = {}
    for line in generate_latest(registry(d)).decode().splitlines():  # type: ignore[arg-type]
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_failover_and_reroutes_are_metrics_and_log_events(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = load(EXAMPLE)
    topo = Topology(cfg)
    d = types.SimpleNamespace(
        cfg=cfg,
        topo=topo,
        sessions={},
        collector=Collector(topo),
        slowloop=types.SimpleNamespace(caps={}, state={}, runs=0),
        reloads=0,
        reload_failures=0,
    )
    ops = Operations(d)  # type: ignore[arg-type]
    d.operations = ops
    sessions = [FakeSession(s.name, topo) for s in cfg.switches]
    before = metric_lines(d)
    assert before["xingmai_controller_failovers_total"] == 0
    assert not any(k.startswith("xingmai_controller_link_routed_around") for k in before)
    with caplog.at_level(logging.WARNING, logger="xingmai.controller.operations"):
        asyncio.run(ops._failover(frozenset({DEAD}), sessions))  # type: ignore[arg-type]
    assert all(s.reconciled == [frozenset({DEAD})] for s in sessions)
    m = metric_lines(d)
    assert m["xingmai_controller_failovers_total"] == 1
    assert m[f'xingmai_controller_link_routed_around{{link="{DEAD}"}}'] == 1
    assert m['xingmai_controller_reroutes_total{change="removed"}'] == 1
    assert m['xingmai_controller_reroutes_total{change="restored"}'] == 0
    assert m["xingmai_controller_dead_links"] == 1
    assert 0 <= m["xingmai_controller_failover_write_seconds"] < 5
    (rec,) = [r for r in caplog.records if "fail-over" in r.getMessage()]
    assert rec.removed == [DEAD] and rec.restored == []  # type: ignore[attr-defined]
    assert ops.events[-1]["event"] == "failover" and ops.events[-1]["removed"] == [DEAD]

    asyncio.run(ops._failover(frozenset(), sessions))  # type: ignore[arg-type]
    m = metric_lines(d)
    assert m["xingmai_controller_failovers_total"] == 2
    assert m['xingmai_controller_reroutes_total{change="restored"}'] == 1
    assert m["xingmai_controller_dead_links"] == 0
    assert not any(k.startswith("xingmai_controller_link_routed_around") for k in m)
    assert ops.events[-1]["restored"] == [DEAD]


def test_a_late_poll_is_weaker_evidence_than_a_refused_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round in which no switch answered in time and none refused is the controller's own
    lateness (a busy loop or CPU): skipped and counted, nobody named. A switch whose poll
    alone timed out is named only when silent for `silent_after_s`; one that refuses (its
    process is gone), after `dead_after_s`; one that answers SwitchAdmin but whose counter
    read timed out is alive."""
    cfg = load(EXAMPLE)
    topo = Topology(cfg)
    d = types.SimpleNamespace(
        cfg=cfg,
        topo=topo,
        sessions={s.name: FakeSession(s.name, topo) for s in cfg.switches},
        collector=Collector(topo),
        slowloop=types.SimpleNamespace(caps={}, state={}, runs=0),
        reloads=0,
        reload_failures=0,
    )
    ops = Operations(d)  # type: ignore[arg-type]
    d.operations = ops
    clock = [100.0]
    monkeypatch.setattr("controller.operations.time.monotonic", lambda: clock[0])
    ports = {s.name: [p.port for p in s.ports] for s in cfg.switches}
    answers: dict[str, PollFailed | None] = {}

    async def poll(s: FakeSession) -> SwitchSample | PollFailed:
        why = answers.get(s.name)
        if why is not None:
            return why
        return SwitchSample(
            s.name, clock[0], {p: PortSample(p, tx_packets=0, rx_packets=0) for p in ports[s.name]}
        )

    monkeypatch.setattr(ops, "_poll", poll)
    late = PollFailed("SwitchAdmin: DEADLINE_EXCEEDED", refused=False)

    def run(seconds: float) -> None:
        end = clock[0] + seconds
        while clock[0] < end - 1e-9:
            clock[0] += 0.1
            asyncio.run(ops.tick())

    run(1.0)
    answers = dict.fromkeys(ports, late)
    run(5.0)
    assert ops.rounds_late == 50 and ops.loc.ranked() == []
    m = metric_lines(types.SimpleNamespace(**{**vars(d), "sessions": {}}))
    assert m["xingmai_controller_poll_rounds_late_total"] == 50

    answers = {"spine1": late}
    run(2.0)
    assert ops.loc.ranked() == []  # late alone for 2 s: not yet
    run(1.5)
    assert [(s.element, s.kind) for s in ops.loc.ranked()] == [
        ("switch spine1", "switch-unreachable")
    ]

    answers = {}
    run(4.0)  # answers again: cleared after the hold time
    assert ops.loc.ranked() == [] and ops.dead == frozenset()
    answers = {"spine2": PollFailed("P4Runtime channel down", refused=True, answered=True)}
    answers["leaf1"] = PollFailed("P4Runtime counter read: no answer", refused=False, answered=True)
    run(0.5)
    assert [(s.element, s.kind) for s in ops.loc.ranked()] == [
        ("switch spine2", "switch-unreachable")
    ]
    run(4.0)
    assert [s.element for s in ops.loc.ranked()] == ["switch spine2"]  # leaf1 answered
