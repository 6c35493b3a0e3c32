"""`run --engine flow`: the suite's records from the flow engine, schemes refused until
calibrated, and the calibration file saying what it was fitted on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.errors import UserError
from testbed.flow import calibration
from testbed.main import main


def test_run_engine_flow_writes_the_results(tmp_path: Path) -> None:
    rc = main(
        [
            "run",
            "--engine",
            "flow",
            "--quick",
            "--schemes",
            "none,tita",
            "--scenarios",
            "allreduce,alltoall",
            "--run-dir",
            str(tmp_path),
        ]
    )
    assert rc == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["setup"]["engine"] == "flow"
    runs = {(r["scheme"], r["scenario"]): r for r in doc["runs"]}
    assert set(runs) == {(s, c) for s in ("none", "tita") for c in ("allreduce", "alltoall")}
    for (scheme, coll), r in runs.items():
        eff = calibration.efficiency(scheme, coll)
        fitted = calibration.load()["schemes"][scheme][coll]["fitted_on"]
        # the default topology and quick sizes are what it was fitted on: the twin's time
        assert r["completion_s"] == pytest.approx(fitted["ideal_time_s"] / eff)
        assert r["completion_s"] == pytest.approx(fitted["twin_time_s"], rel=1e-3)
        assert r["queue_samples"] == 0 and r["correct"] is None


def test_an_uncalibrated_scheme_is_refused_with_its_command() -> None:
    with pytest.raises(UserError, match="calibrate-flow --scheme swift"):
        calibration.efficiency("swift", "allreduce")
    assert main(["run", "--engine", "flow", "--schemes", "swift", "--scenarios", "allreduce"]) == 1


def test_other_scenarios_are_refused() -> None:
    assert main(["run", "--engine", "flow", "--schemes", "tita", "--scenarios", "incast"]) == 1


def test_the_calibration_says_what_it_was_fitted_on() -> None:
    doc = calibration.load()
    assert {"none", "tita"} <= set(doc["schemes"])
    for scheme in doc["schemes"]:
        for coll in ("allreduce", "alltoall"):
            e = doc["schemes"][scheme][coll]
            assert 0 < e["efficiency"] <= 1.5
            f = e["fitted_on"]
            assert f["hosts"] == 8 and f["scheme"] == scheme and len(f["twin_commit"]) == 40
            assert e["held_out"]["hosts"] == 16  # checked on a larger fabric
            # the ideal includes the steps' latency at the model's RTT
            assert 0 < f["ideal_latency_s"] < f["ideal_time_s"]


def test_a_cc_profile_other_than_the_fits_is_refused(tmp_path: Path) -> None:
    """The fits hold for the CC profile the twin ran under: another profile, or parameters
    set over it, is refused with the profile each side names."""
    entry = calibration.load()["schemes"]["tita"]["allreduce"]
    fitted = calibration.fitted_profile("tita", entry["fitted_on"])
    assert fitted == "tita"  # fitted before the profile was recorded: the law's default
    calibration.check_profiles(("none", "tita"), {"tita": "tita"}, {})
    with pytest.raises(UserError, match=r"under cc profile 'tita', not 'tita\[eta=0.9\]'"):
        calibration.check_profiles(("tita",), {}, {"tita": {"eta": "0.9"}})
    argv = ["run", "--engine", "flow", "--schemes", "tita", "--scenarios", "allreduce"]
    assert main([*argv, "--run-dir", str(tmp_path), "--cc-set", "tita.eta=0.9"]) == 1
    recorded = {"cc_profile": "dcqcn-paper", "twin_command": "run --cc-profile dcqcn-paper"}
    assert calibration.fitted_profile("dcqcn", recorded) == "dcqcn-paper"
    with pytest.raises(UserError, match="does not say its CC profile"):
        calibration.fitted_profile("dcqcn", {"twin_command": "run --cc-profile dcqcn-paper"})
