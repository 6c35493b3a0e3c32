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
    # the summary plot, and none of the packet engines' (a fluid model has no queues, rates
    # or FCTs to draw)
    assert (tmp_path / "summary.png").stat().st_size > 0
    assert not (tmp_path / "queue.png").exists() and not (tmp_path / "rates.png").exists()
    runs = {(r["scheme"], r["scenario"]): r for r in doc["runs"]}
    assert set(runs) == {(s, c) for s in ("none", "tita") for c in ("allreduce", "alltoall")}
    applied = doc["setup"]["flow_efficiency"]
    for (scheme, coll), r in runs.items():
        got = applied[scheme][coll]
        fitted = calibration.load()["schemes"][scheme][coll]["fitted_on"]
        assert r["completion_s"] == pytest.approx(fitted["ideal_time_s"] / got["efficiency"])
        if coll == "allreduce":  # the NICs set its rates: the free fit, made on this run
            assert got["regime"] == "free"
            assert got["efficiency"] == calibration.efficiency(scheme, coll)
            assert r["completion_s"] == pytest.approx(fitted["twin_time_s"], rel=1e-3)
        else:  # the network holds the all-to-all's last flows (ECMP collisions): congested
            assert fitted["held_by_network"] and got["regime"] == "congested"
        assert r["queue_samples"] == 0 and r["correct"] is None


def test_an_uncalibrated_scheme_is_refused_with_its_command() -> None:
    with pytest.raises(UserError, match="calibrate-flow --scheme tita-reactive"):
        calibration.efficiency("tita-reactive", "allreduce")
    assert (
        main(["run", "--engine", "flow", "--schemes", "tita-reactive", "--scenarios", "allreduce"])
        == 1
    )


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


def _point(ideal_s: float, eff: float) -> dict[str, object]:
    return {"efficiency": eff, "fitted_on": {"ideal_time_s": ideal_s}}


def test_the_congested_efficiency_by_the_collectives_ideal_time() -> None:
    points = [_point(1e-4, 0.5), _point(1e-5, 0.9)]  # in any order
    mid = calibration.congested_efficiency(points, 10**-4.5)  # halfway in the logarithm
    assert mid.efficiency == pytest.approx(0.7) and mid.regime == "congested" and not mid.note
    assert calibration.congested_efficiency(points, 1e-4).efficiency == 0.5
    beyond = calibration.congested_efficiency(points, 0.181)
    assert beyond.efficiency == 0.5
    assert (
        beyond.note
        == "held 181 ms ideally, beyond the congested fit's 10 us-100 us: the efficiency at 100 us"
    )
    below = calibration.congested_efficiency(points, 1e-6)
    assert below.efficiency == 0.9 and "the efficiency at 10 us" in below.note
    assert beyond.beyond and below.beyond and not mid.beyond


def test_a_collective_the_network_holds_takes_the_congested_fit(tmp_path: Path) -> None:
    from testbed.flow.collectives import CollResult

    path = tmp_path / "calibration.yaml"
    path.write_text(
        json.dumps(
            {
                "format": calibration.FORMAT,
                "schemes": {
                    "tita": {
                        "allreduce": {
                            "efficiency": 0.95,
                            "congested": {"points": [_point(1e-5, 0.9), _point(1e-4, 0.8)]},
                        },
                        "alltoall": {
                            "efficiency": 0.9,
                            "held_out": {"error": -0.07},
                            "congested": {
                                "points": [_point(1e-5, 0.9), _point(1e-4, 0.3)],
                                "held_out": {"error": 0.41},
                            },
                        },
                    }
                },
            }
        )
    )

    def result(held: bool, coll: str = "allreduce") -> CollResult:
        return CollResult(coll, 8, 1 << 20, 1e-4, 1.0, 14, 8, 1, "", held_by_network=held)

    free = calibration.applied("tita", "allreduce", result(False), path)
    assert (free.efficiency, free.regime) == (0.95, "free")
    held = calibration.applied("tita", "allreduce", result(True), path)
    assert (held.efficiency, held.regime) == (0.8, "congested")
    free = calibration.applied("tita", "alltoall", result(False, "alltoall"), path)
    assert (free.efficiency, free.held_out_error, free.note) == (0.9, -0.07, "")
    # a congested fit that missed its held-out check by more than the 10 % says so
    missed = calibration.applied("tita", "alltoall", result(True, "alltoall"), path)
    assert missed.efficiency == 0.3 and missed.held_out_error == 0.41
    assert "missed its held-out check by +41%" in missed.note and missed.missed
    assert not free.missed
    doc = calibration.load(path)
    cong = doc["schemes"]["tita"]["alltoall"]["congested"]
    cong["held_out"] = {"failed": "h1: alltoall rank 0 stuck"}
    path.write_text(json.dumps(doc))
    failed = calibration.applied("tita", "alltoall", result(True, "alltoall"), path)
    assert failed.held_out_error is None
    assert (
        "its held-out run did not complete on the twin (h1: alltoall rank 0 stuck)" in failed.note
    )
    calibration.require("tita", "alltoall", path)
    with pytest.raises(
        UserError, match="where the network holds it .*calibrate-flow --scheme none"
    ):
        calibration.require("none", "allreduce", path)


def test_run_sets_a_suite_parameter(tmp_path: Path) -> None:
    argv = ["run", "--engine", "flow", "--quick", "--schemes", "none", "--scenarios", "allreduce"]
    argv += ["--run-dir", str(tmp_path), "--param", "allreduce_bytes=2097152"]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["setup"]["suite"]["allreduce_bytes"] == 2 << 20
    assert doc["setup"]["suite"]["alltoall_bytes"] == 256 << 10  # the quick suite's
    [run] = doc["runs"]
    assert run["busbw_bps"] > 0
    for bad in ("allreduce_bytes=x", "seed=3", "allreduce_bytes", "nonsense=1"):
        assert main([*argv[:-1], bad]) == 2


def test_flow_iteration_compares_schemes_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    """`--compare`: the iteration computed once, each scheme's calibrated efficiencies on
    it; its fits marked (beyond the fitted times, a missed held-out check); an unknown
    scheme refused by name."""
    argv = ["flow-iteration", "--gpus", "128", "--radix", "8", "--switch-tbps", "3.2"]
    argv += ["--tiers", "3", "--clos", "--dp-bytes", "16777216", "--ep-bytes", "1048576"]
    argv += ["--ep-group", "8", "--json"]
    assert main([*argv, "--compare", "none,tita,timely"]) == 0
    out = json.loads(capsys.readouterr().out)
    cmp = out["compare"]
    assert list(cmp) == ["none", "tita", "timely"]
    for c in cmp.values():
        eff = c["efficiency"]["allreduce"]
        assert eff["regime"] == ("congested" if out["allreduce_held_by_network"] else "free")
        assert c["iteration_s"] == pytest.approx(c["allreduce_s"] + c["alltoall_s"])
    assert cmp["timely"]["efficiency"]["allreduce"]["missed"]  # its fit missed (+15 %)
    assert cmp["none"]["allreduce_s"] < cmp["timely"]["allreduce_s"]
    assert main([*argv, "--compare", "none,bogus"]) == 1
    assert "unknown scheme 'bogus'" in capsys.readouterr().err


def test_schemes_on_one_fabric_share_its_ideal(monkeypatch: pytest.MonkeyPatch) -> None:
    # the ideal is a function of the fabric, scenario, sizes and seed: computed once for the
    # schemes on the same fabric, again for a scheme whose lossy link makes a fabric its own
    from dataclasses import replace

    from testbed.experiment.suite import SuiteConfig
    from testbed.faults import Fault
    from testbed.flow import suite as flow_suite
    from testbed.topo import leafspine

    calls: list[str] = []
    real = flow_suite.suite_collective

    def counted(*args: object, **kw: object) -> object:
        calls.append(str(args[1]))
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(flow_suite, "suite_collective", counted)
    cfg = replace(
        SuiteConfig.quick(), schemes=("none", "tita"), scenarios=("allreduce", "alltoall")
    )
    plain = flow_suite.FlowSuite(leafspine(2, 2, 4), cfg, lambda line: None)
    records = plain.run()
    assert sorted(calls) == ["allreduce", "alltoall"] and len(records) == 4
    by = {(r.scheme, r.scenario): r for r in records}
    assert by["none", "alltoall"].completion_s != by["tita", "alltoall"].completion_s
    calls.clear()
    lossy = flow_suite.FlowSuite(
        leafspine(2, 2, 4), cfg, lambda line: None, [Fault("leaf1:1", "loss", 0.01, 0.0)]
    )
    lossy.run()
    assert sorted(calls) == ["allreduce", "allreduce", "alltoall", "alltoall"]
