"""What a scenario on the emulation reports of the controller's localization, and its clock
(testbed/emu/operations.py): the controller outlives the scenario, so a suspect it named in an
earlier scenario, cleared and named again in this one counts from its naming in this one, and
one named, cleared and named again within the scenario from its first naming there; the
scenario's clock starts when its first job does."""

from __future__ import annotations

import json
import types

from controller.proto import controller_pb2 as pb
from testbed.emu.operations import EmuOperations

T0 = 1_000_000.0  # the scenario's start, unix seconds


def view(named: list[pb.Suspect], events: list[dict[str, object]]) -> list[dict[str, object]]:
    resp = pb.GetSuspectsResponse(
        named=named, events=[pb.OperationsEvent(json=json.dumps(e)) for e in events]
    )
    stub = types.SimpleNamespace(GetSuspects=lambda req, timeout: resp)
    ops = EmuOperations(types.SimpleNamespace(controller_stub=lambda: stub))  # type: ignore[arg-type]
    ops.t0 = T0
    suspects, failovers = ops._controller_view()
    assert failovers == []
    return suspects


def named_event(element: str, kind: str, t: float) -> dict[str, object]:
    return {"event": "named", "element": element, "kind": kind, "t": t}


def test_a_suspect_named_again_counts_from_its_first_naming_in_the_scenario() -> None:
    link = "link leaf1:3-spine1:1"
    # named in the scenario before (T0 - 20), cleared; in this one at +2.6, cleared, at +10.1
    s = pb.Suspect(
        element=link,
        kind="lossy-link",
        score=0.4,
        first_named_unix=T0 - 20,
        last_named_unix=T0 + 12,
    )
    events = [
        named_event(link, "lossy-link", T0 - 20),
        {"event": "cleared", "element": link, "kind": "lossy-link", "t": T0 - 10},
        named_event(link, "lossy-link", T0 + 2.6),
        {"event": "cleared", "element": link, "kind": "lossy-link", "t": T0 + 7},
        named_event(link, "lossy-link", T0 + 10.1),
        named_event(link, "slow-link", T0 + 1.0),  # another kind: not this suspect's naming
    ]
    [got] = view([s], events)
    assert got["element"] == link and got["first_named"] == 2.6


def test_suspects_from_before_the_scenario_count_from_its_start() -> None:
    held = pb.Suspect(  # still named when the scenario began, no naming since
        element="switch spine1",
        kind="slow-switch",
        score=0.6,
        first_named_unix=T0 - 3,
        last_named_unix=T0 + 1,
    )
    gone = pb.Suspect(  # cleared before the scenario: not reported
        element="nic h3",
        kind="slow-nic",
        score=0.5,
        first_named_unix=T0 - 30,
        last_named_unix=T0 - 25,
    )
    [got] = view([held, gone], [named_event("switch spine1", "slow-switch", T0 - 3)])
    assert got["element"] == "switch spine1" and got["first_named"] == 0.0


def test_the_scenario_clock_starts_with_its_first_job() -> None:
    resp = pb.GetSuspectsResponse()
    stub = types.SimpleNamespace(GetSuspects=lambda req, timeout: resp)
    tb = types.SimpleNamespace(controller_stub=lambda: stub)
    ops = EmuOperations(tb)  # type: ignore[arg-type]
    ops.begin()
    ops.start(T0 + 2.0)  # the workers took 2 s to get ready
    ops.start(T0 + 9.0)  # a later job of the same scenario
    assert ops.t0 == T0 + 2.0
    assert ops.end()["faults"] == []


def test_faults_of_a_scenario_that_started_no_job_are_reported_not_applied() -> None:
    from testbed import faults

    resp = pb.GetSuspectsResponse()
    stub = types.SimpleNamespace(GetSuspects=lambda req, timeout: resp)
    tb = types.SimpleNamespace(controller_stub=lambda: stub)
    ops = EmuOperations(tb)  # type: ignore[arg-type]
    ops.faults = [faults.Fault("leaf1:3", "down", None, 0.5)]
    ops.begin()
    assert ops.end()["faults"] == [{"error": "the scenario started no job: no fault applied"}]
