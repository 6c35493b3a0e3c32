"""Fail-over in the controller's Prometheus metrics and its log: the daemon's operations loop
(controller/operations.py) fails a link over and back on fake switch sessions, and the
metrics say how often, which links are routed around now, how many reroutes each way and
how long the writes took; the telemetry counters follow the collector's."""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from controller.collector import Collector
from controller.config import load
from controller.health import NicSample, PortSample, ProbeFlowSample, SwitchSample
from controller.metrics import registry
from controller.operations import Operations, PollFailed
from controller.slowloop import AgentError
from controller.topology import Topology
from controller.wire.telemetry_report import Hop

EXAMPLE = Path(__file__).resolve().parents[1] / "controller" / "examples" / "leafspine-2x2.yaml"
DEAD = "leaf2:6-spine2:2"


def fake_daemon(topo: Topology, **kw: object) -> types.SimpleNamespace:
    """What Operations reads of the daemon: no sessions or agents unless given."""
    return types.SimpleNamespace(
        **{
            "cfg": topo.cfg,
            "topo": topo,
            "sessions": {},
            "collector": Collector(topo),
            "slowloop": types.SimpleNamespace(caps={}, state={}, runs=0),
            "agents": {},
            "reloads": 0,
            "reload_failures": 0,
            **kw,
        }
    )


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
    d = fake_daemon(topo)
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


def clocked_operations(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Operations, list[float], dict[str, list[int]]]:
    """The operations loop on the example fabric's fake sessions, its clock `clock[0]` set by
    the test; each switch's ports."""
    cfg = load(EXAMPLE)
    topo = Topology(cfg)
    d = fake_daemon(topo, sessions={s.name: FakeSession(s.name, topo) for s in cfg.switches})
    ops = Operations(d)  # type: ignore[arg-type]
    d.operations = ops
    clock = [100.0]
    monkeypatch.setattr("controller.operations.time.monotonic", lambda: clock[0])
    return ops, clock, {s.name: [p.port for p in s.ports] for s in cfg.switches}


def failing_polls(
    monkeypatch: pytest.MonkeyPatch,
    ops: Operations,
    clock: list[float],
    ports: dict[str, list[int]],
) -> Callable[[dict[str, PollFailed]], None]:
    """Polls in which every switch answers whole at the clock's time but those the last call
    of the returned function names, which fail as it says."""
    failures: dict[str, PollFailed] = {}

    async def poll(s: FakeSession) -> SwitchSample | PollFailed:
        why = failures.get(s.name)
        if why is not None:
            return why
        return SwitchSample(
            s.name, clock[0], {p: PortSample(p, tx_packets=0, rx_packets=0) for p in ports[s.name]}
        )

    monkeypatch.setattr(ops, "_poll", poll)

    def fail(these: dict[str, PollFailed]) -> None:
        failures.clear()
        failures.update(these)

    return fail


def test_a_late_poll_is_weaker_evidence_than_a_refused_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round in which no switch answered in time and none refused is the controller's own
    lateness (a busy loop or CPU): skipped and counted, nobody named. A switch whose poll
    alone timed out is named only when silent for `silent_after_s`; one that refuses (its
    process is gone), after `dead_after_s`; one that answers SwitchAdmin but whose counter
    read timed out is alive."""
    ops, clock, ports = clocked_operations(monkeypatch)
    fail = failing_polls(monkeypatch, ops, clock, ports)
    late = PollFailed("SwitchAdmin: DEADLINE_EXCEEDED", refused=False)

    def run(seconds: float) -> None:
        end = clock[0] + seconds
        while clock[0] < end - 1e-9:
            clock[0] += 0.1
            asyncio.run(ops.tick())

    run(1.0)
    fail(dict.fromkeys(ports, late))
    run(5.0)
    assert ops.rounds_late == 50 and ops.loc.ranked() == []
    m = metric_lines(types.SimpleNamespace(**{**vars(ops.d), "sessions": {}}))
    assert m["xingmai_controller_poll_rounds_late_total"] == 50

    fail({"spine1": late})
    run(2.0)
    assert ops.loc.ranked() == []  # late alone for 2 s: not yet
    run(1.5)
    assert [(s.element, s.kind) for s in ops.loc.ranked()] == [
        ("switch spine1", "switch-unreachable")
    ]

    fail({})
    run(4.0)  # answers again: cleared after the hold time
    assert ops.loc.ranked() == [] and ops.dead == frozenset()
    fail(
        {
            "spine2": PollFailed("P4Runtime channel down", refused=True, answered=True),
            "leaf1": PollFailed("P4Runtime counter read: no answer", refused=False, answered=True),
        }
    )
    run(0.5)
    assert [(s.element, s.kind) for s in ops.loc.ranked()] == [
        ("switch spine2", "switch-unreachable")
    ]
    run(4.0)
    assert [s.element for s in ops.loc.ranked()] == ["switch spine2"]  # leaf1 answered


def test_a_switch_whose_answer_came_before_the_loop_stalled_is_not_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round in which one switch answered at once and the controller's loop then stalled
    for 3.5 s before the others' answers came (CPU starvation on a loaded box): its sample
    is stamped 3.5 s before the round's end, and it is not a switch silent for 3.5 s (the
    default suite named a spine unreachable this way, 'no answer for 3.32 s')."""
    ops, clock, ports = clocked_operations(monkeypatch)
    stall = [0.0]

    async def poll(s: FakeSession) -> SwitchSample:
        # spine2 answered, then the loop stalled; the others' answers came after it
        t = clock[0] - (stall[0] if s.name == "spine2" else 0.0)
        return SwitchSample(
            s.name, t, {p: PortSample(p, tx_packets=0, rx_packets=0) for p in ports[s.name]}
        )

    monkeypatch.setattr(ops, "_poll", poll)
    for _ in range(10):
        clock[0] += 0.1
        asyncio.run(ops.tick())
    stall[0] = 3.5
    clock[0] += 3.6
    asyncio.run(ops.tick())
    assert ops.loc.ranked() == [] and ops.dead == frozenset()


def test_a_round_every_switch_was_late_in_is_the_box_even_if_some_answered_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The emulation's clean suite once named both leaves unreachable: the box stalled for 5 s
    (2 cores under WebSearch without CC), and in the round after it the leaves' SwitchAdmin
    timed out while the spines answered it and timed out on their counter read. Every switch
    late at once, none refusing, is the box, not two leaves failing together: the round is
    skipped, and a switch late alone is still named."""
    ops, clock, ports = clocked_operations(monkeypatch)
    fail = failing_polls(monkeypatch, ops, clock, ports)
    for _ in range(10):
        clock[0] += 0.5
        asyncio.run(ops.tick())
    admin_late = PollFailed("SwitchAdmin: DEADLINE_EXCEEDED", refused=False)
    counters_late = PollFailed("P4Runtime counter read: no answer", refused=False, answered=True)
    fail(
        {"leaf1": admin_late, "leaf2": admin_late, "spine1": counters_late, "spine2": counters_late}
    )
    clock[0] += 5.19  # the stall, then the round
    asyncio.run(ops.tick())
    assert ops.rounds_late == 1 and ops.loc.ranked() == [] and ops.dead == frozenset()
    fail({"leaf1": admin_late})  # the others answer whole: leaf1 is late alone
    for _ in range(8):
        clock[0] += 0.5
        asyncio.run(ops.tick())
    assert [(s.element, s.kind) for s in ops.loc.ranked()] == [
        ("switch leaf1", "switch-unreachable")
    ]


def test_a_poll_that_never_returns_is_a_late_poll_not_a_stopped_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each poll is bounded as a whole: a switch whose poll hangs (whatever its calls'
    deadlines did) is late that round, and the others are localized as before."""
    cfg = load(EXAMPLE)
    topo = Topology(cfg)
    d = fake_daemon(topo, sessions={s.name: FakeSession(s.name, topo) for s in cfg.switches})
    ops = Operations(d)  # type: ignore[arg-type]
    ops.poll_limit_s = 0.05
    ports = {s.name: [p.port for p in s.ports] for s in cfg.switches}

    async def poll(s: FakeSession) -> SwitchSample | PollFailed:
        if s.name == "spine1":
            await asyncio.Event().wait()  # never answers
        return SwitchSample(
            s.name,
            0.0,
            {p: PortSample(p, tx_packets=0, rx_packets=0) for p in ports[s.name]},
        )

    monkeypatch.setattr(ops, "_poll", poll)
    asyncio.run(asyncio.wait_for(ops.tick(), 5))  # returns: the loop goes on
    assert ops._poll_failed["spine1"] == "no answer within 0.05 s"
    assert all(ops._poll_failed.get(s) is None for s in ports if s != "spine1")


@pytest.mark.parametrize(
    "exc",
    [AssertionError("the session's client is gone"), asyncio.CancelledError()],
    ids=["assert", "cancelled"],
)
def test_a_round_that_raises_is_counted_and_the_loop_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, exc: BaseException
) -> None:
    """A defect in one round (finsy's AssertionError when a killed switch's session ended
    mid-poll once ended the loop, and with it localization and fail-over), or a call that
    was cancelled under it (grpc.aio cancels the calls of a channel that closes: the same
    kill ended the loop that way in a full test run), is logged with its traceback and
    counted; the next round runs, and stopping the loop still stops it."""
    cfg = load(EXAMPLE)
    topo = Topology(cfg)
    d = fake_daemon(topo)
    ops = Operations(d, poll_s=0.01)  # type: ignore[arg-type]
    d.operations = ops
    rounds = [0]

    async def tick() -> None:
        rounds[0] += 1
        if rounds[0] == 1:
            raise exc

    async def nics() -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(ops, "tick", tick)
    monkeypatch.setattr(ops, "_nic_loop", nics)

    async def run_a_while() -> bool:
        task = asyncio.create_task(ops.run())
        while rounds[0] < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.wait([task])
        return task.cancelled()

    with caplog.at_level(logging.ERROR, logger="xingmai.controller.operations"):
        assert asyncio.run(asyncio.wait_for(run_a_while(), 5))
    assert rounds[0] >= 3 and ops.rounds_failed == 1 and ops.rounds >= 3
    assert any(r.getMessage().startswith("operations round failed") for r in caplog.records)
    m = metric_lines(d)
    assert m["xingmai_controller_poll_rounds_failed_total"] == 1
    assert m["xingmai_controller_poll_rounds_total"] == ops.rounds


def test_a_counter_read_cancelled_by_its_channel_closing_is_a_refused_poll() -> None:
    """finsy closes a session's channel when its switch goes away; grpc.aio then cancels the
    read in flight, which raises CancelledError in the poll: a refused poll (the switch is
    gone), not the end of the round or of the loop."""
    cfg = load(EXAMPLE)
    topo = Topology(cfg)
    d = fake_daemon(topo)
    ops = Operations(d)  # type: ignore[arg-type]

    class ClosingSwitch:
        is_up = True

        async def read(self, entities: object) -> Any:
            raise asyncio.CancelledError()
            yield  # an async generator, as finsy's

    spec = cfg.switches[0]
    session = types.SimpleNamespace(
        name=spec.name,
        sw=types.SimpleNamespace(ports=spec.ports, kind="bmv2", grpc_addr="127.0.0.1:1"),
        switch=ClosingSwitch(),
        health=types.SimpleNamespace(connected=True),
    )
    r = asyncio.run(ops._poll_within(session))  # type: ignore[arg-type]
    assert isinstance(r, PollFailed) and r.refused and "closed" in r.reason


class FakeNic:
    """A host agent's NIC counters: flows waiting at the line rate, `sends` of it sent;
    `refuse`: GetNicCounters fails."""

    def __init__(self, host: str, clock: list[float], sends: float = 1.0, refuse: bool = False):
        self.host, self.clock, self.sends, self.refuse = host, clock, sends, refuse
        self.polls = 0

    async def nic_counters(self) -> NicSample:
        self.polls += 1
        if self.refuse:
            raise AgentError("GetNicCounters: UNAVAILABLE")
        t = self.clock[0]  # its flows wait at the line rate all along
        return NicSample(self.host, t, int(t * 1e9 * self.sends / 8), t * 1e9, 1e9)


def test_the_loop_reads_every_agents_nic_and_names_a_slow_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every 0.5 s the operations read each agent's NIC counters: a NIC sending 40 % of what its
    flows waiting in it are paced at is named within a window and a half; an agent that
    refuses is counted (and exported), and holds nothing up."""
    cfg = load(EXAMPLE)
    topo = Topology(cfg)
    clock = [100.0]
    agents = {
        "h1": FakeNic("h1", clock),
        "h2": FakeNic("h2", clock, sends=0.4),
        "h3": FakeNic("h3", clock, refuse=True),
    }
    d = fake_daemon(topo, agents=agents)
    ops = Operations(d)  # type: ignore[arg-type]
    d.operations = ops
    monkeypatch.setattr("controller.operations.time.monotonic", lambda: clock[0])
    for i in range(30):
        clock[0] += 0.1
        if i % 5 == 4:
            asyncio.run(ops.poll_nics())
        asyncio.run(ops.tick())
    assert agents["h1"].polls == 6
    [top] = ops.loc.ranked()
    assert (top.element, top.kind) == ("nic h2", "slow-nic"), top
    assert "sent 400 Mb/s (40 % of its 1000 Mb/s)" in top.evidence
    assert ops.nic_polls_failed == 6
    m = metric_lines(d)
    assert m["xingmai_controller_nic_polls_failed_total"] == 6


class FakeProbes:
    """A receiving host agent's probe tallies (GetProbes): probe flows into it, 100 probes a
    poll each, a share lost on those from `lossy`; `refuse`: GetProbes fails."""

    PATHS = {  # (sender, source port) -> hops to h5: (node id, in port, out port)
        ("10.0.1.1", 1): ((1, 1, 5), (3, 1, 2), (2, 5, 1)),  # h1 over spine1
        ("10.0.1.1", 2): ((1, 1, 6), (4, 1, 2), (2, 6, 1)),  # h1 over spine2
        ("10.0.1.2", 1): ((1, 2, 5), (3, 1, 2), (2, 5, 1)),  # h2 over spine1
        ("10.0.1.2", 2): ((1, 2, 6), (4, 1, 2), (2, 6, 1)),  # h2 over spine2
        ("10.0.2.2", 1): ((2, 2, 1),),  # h6, under h5's leaf
    }

    def __init__(self, host: str, clock: list[float], lossy: str = "", refuse: bool = False):
        self.host, self.clock, self.lossy, self.refuse = host, clock, lossy, refuse
        self.polls = 0

    async def probe_flows(self) -> tuple[float, list[ProbeFlowSample]]:
        self.polls += 1
        if self.refuse:
            raise AgentError("GetProbes: UNAVAILABLE")
        n = self.polls * 100
        return self.clock[0], [
            ProbeFlowSample(
                src,
                sport,
                received=n - (lost := n // 50 if src == self.lossy else 0),
                lost=lost,
                lost_congested=0,
                hops=tuple(Hop(node, i, o, qocc=0) for node, i, o in hops),
            )
            for (src, sport), hops in self.PATHS.items()
        ]


def test_the_loop_reads_every_agents_probes_and_names_the_link_that_loses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operations read each agent's probe tallies and map their INT hops to links: h1's
    probes to h5 lose 2 % (h1's NIC, silently) and h1's own link is named, not h5's or the
    spines', which carry clean probes too; an agent that refuses is counted and exported."""
    topo = Topology(load(EXAMPLE))
    clock = [100.0]
    agents = {
        "h5": FakeProbes("h5", clock, lossy="10.0.1.1"),
        "h6": FakeProbes("h6", clock, refuse=True),
    }
    d = fake_daemon(topo, agents=agents)
    ops = Operations(d)  # type: ignore[arg-type]
    d.operations = ops
    monkeypatch.setattr("controller.operations.time.monotonic", lambda: clock[0])
    for i in range(30):
        clock[0] += 0.1
        if i % 5 == 4:
            asyncio.run(ops.poll_probes())
        asyncio.run(ops.tick())
    [top] = ops.loc.ranked()
    assert (top.element, top.kind) == ("link h1:eth0-leaf1:1", "lossy-link"), top
    assert top.evidence.startswith("probes: 20 of 1000 lost (2.00 %) on the 2 probe flows over")
    assert ops.probe_polls_failed == 6
    assert metric_lines(d)["xingmai_controller_probe_polls_failed_total"] == 6
