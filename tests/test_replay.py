"""灵境: a job slowed by a hidden fault, recorded on the twin (`run --engine sim --faults`),
is replayed under candidate faults (`xingmai-testbed replay`) and the faulty element comes
first — from the controller's suspects, and from the telemetry alone when the record names
none. The replay never reads the faults the record holds."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import faults
from testbed.experiment.suite import SuiteConfig
from testbed.p4files import P4INFO
from testbed.replay import Observed, ReplayError, candidates, load_recording, pick_run, replay
from testbed.topo import parse_choice

REPO = Path(__file__).resolve().parent.parent
TOPO = "leafspine:2,2,2"
HIDDEN = {"at": 0.0, "target": "leaf1:3", "kind": "rate", "value": "25%"}  # leaf1 -> spine2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not P4INFO.exists(), reason="p4src not built (make p4)"),
]


def _record(run_dir: Path, fault: dict[str, object] | None) -> None:
    """A twin run of one ring all-reduce (TiTa), with `fault` hidden in it."""
    from testbed.sim.run import run_sim

    spec = parse_choice(TOPO)
    args = argparse.Namespace(
        topo=TOPO, scale=20000.0, run_dir=run_dir, flows=None, faults=None, fault_list=[]
    )
    if fault is not None:
        args.fault_list = [
            faults.make(
                spec,
                str(fault["target"]),
                str(fault["kind"]),
                fault["value"],
                float(str(fault["at"])),
            )
        ]
    cfg = SuiteConfig(
        schemes=("tita",),
        scenarios=("allreduce",),
        allreduce_bytes=256 << 10,
        allreduce_chunk=64 << 10,
    )
    assert run_sim(args, cfg) == 0


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("recorded")
    _record(run_dir, HIDDEN)
    return run_dir


def _same_link(a: str, b: str) -> bool:
    spec = parse_choice(TOPO)
    from testbed.topo import End

    node, _, idx = a.partition(":")
    return a == b or str(spec.peer(End(node, int(idx)))) == b


def test_replay_names_the_hidden_fault_from_the_suspects(recorded: Path) -> None:
    run = json.loads((recorded / "results.json").read_text())["runs"][0]
    assert run["faults"] and run["suspects"]  # what the run injected, what its controller named
    res = replay(recorded, jobs=2)
    culprit = res.culprit.replayed.fault
    assert culprit is not None and _same_link(culprit.target, str(HIDDEN["target"]))
    assert (culprit.kind, culprit.value) == ("rate", 0.25)
    # the twin is deterministic: the right fault reproduces the record exactly, and it is
    # clearly better than the healthy fabric
    assert res.culprit.terms["total"] < 0.05
    healthy = next(r for r in res.ranked if r.replayed.fault is None)
    assert healthy.terms["total"] > 0.5
    assert res.observed.completion_s > 1.5 * healthy.replayed.completion_s


def test_replay_from_the_telemetry_alone(recorded: Path, tmp_path: Path) -> None:
    doc = json.loads((recorded / "results.json").read_text())
    for run in doc["runs"]:
        run["suspects"] = []  # a controller that named nothing
    (tmp_path / "results.json").write_text(json.dumps(doc))
    (tmp_path / "topology.yaml").write_text((recorded / "topology.yaml").read_text())
    res = replay(tmp_path, jobs=2)
    assert res.candidates_from.startswith("telemetry")
    culprit = res.culprit.replayed.fault
    assert culprit is not None and _same_link(culprit.target, str(HIDDEN["target"]))
    assert culprit.kind == "rate"


def test_candidates_and_bad_input(recorded: Path, tmp_path: Path) -> None:
    rec = load_recording(recorded)
    obs = Observed.of(pick_run(rec, None, None))
    cands = candidates(rec.spec, obs)
    assert all(_same_link(f.target, str(HIDDEN["target"])) for f, _ in cands)
    assert {f.kind for f, _ in cands} == {"rate", "delay"}  # a slow link's faults
    with pytest.raises(ReplayError, match="no record"):
        pick_run(rec, "incast", None)
    with pytest.raises(ReplayError, match="results.json"):
        load_recording(tmp_path)
    res = subprocess.run(
        [sys.executable, "-m", "testbed", "replay", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "not a results file" in res.stderr


def test_a_candidate_the_job_cannot_finish_under_ranks_last_and_the_twin_goes_on(
    recorded: Path,
) -> None:
    """A candidate that cuts a host off (its only link down) stalls the collective: that
    replay is scored as no completion, ranked last, and the next one runs on a clean twin
    (an emulation run's telemetry named host links, and the whole replay stopped at the first
    such candidate)."""
    from testbed import replay as rp

    rec = load_recording(recorded)
    obs = Observed.of(pick_run(rec, None, None))
    cut = faults.make(rec.spec, "leaf1:1", "down", None)  # h1's only link
    rp._init_worker(rec.spec, rec.scaling, rec.cfg, obs.scheme)
    stuck = rp._replay_one(obs.scenario, obs.scheme, cut)
    healthy = rp._replay_one(obs.scenario, obs.scheme, None)
    assert stuck.failed and "stuck" in stuck.failed and stuck.completion_s == float("inf")
    assert healthy.failed is None and 0 < healthy.completion_s < obs.completion_s
    ranked = rp.rank(obs, [stuck, healthy], ["cut", "healthy"])
    assert [r.why for r in ranked] == ["healthy", "cut"]


def test_a_suspect_on_a_host_link_is_a_candidate() -> None:
    """The controller names a host link by its ends, the host's interface name holding a '-'
    ("link h1:h1-eth0-leaf1:1"): its candidate faults go on the switch's end (the emulation's
    replay once found no candidate at all for such a suspect)."""
    from testbed.replay import suspect_target

    spec = parse_choice("leafspine:2,2,4")
    assert suspect_target(spec, "link h1:h1-eth0-leaf1:1") == "leaf1:1"
    assert suspect_target(spec, "link leaf1:5-spine1:1") == "leaf1:5"
    assert suspect_target(spec, "switch spine1") == "spine1"
    assert suspect_target(spec, "link nowhere-else:1") is None
    obs = Observed(
        scenario="allreduce",
        scheme="tita",
        completion_s=3.0,
        queue_p99={},
        retransmits=0,
        fct_p50=None,
        fct_p99=None,
        suspects=[{"element": "link h1:h1-eth0-leaf1:1", "kind": "slow-link"}],
        drops_by_switch={},
    )
    cands = candidates(spec, obs)
    assert cands and {f.target for f, _ in cands} == {"leaf1:1"}
