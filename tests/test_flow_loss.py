"""A lossy link on the flow engine: the directions it cuts, the goodput between fitted
points, `--faults` and `flow-iteration --loss` through the twin's fit, and the fit itself
re-made on the twin at a small size."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from testbed.errors import UserError
from testbed.flow import calibration, lossfit
from testbed.flow.fabric import FabricError, from_spec, lose
from testbed.main import main
from testbed.topo import leafspine, parse_choice


def _points(*pairs: tuple[float, float]) -> list[dict[str, float]]:
    return [{"loss": p, "goodput": g} for p, g in pairs]


def test_the_goodput_between_the_fitted_losses() -> None:
    pts = _points((0.01, 0.5), (0.001, 0.9))  # in any order
    assert lossfit.interpolate(pts, 0.0) == 1.0
    assert lossfit.interpolate(pts, 0.0005) == pytest.approx(0.95)  # linear from (0, 1)
    assert lossfit.interpolate(pts, 0.001) == pytest.approx(0.9)
    assert lossfit.interpolate(pts, 0.0055) == pytest.approx(0.7)  # halfway between them
    assert lossfit.interpolate(pts, 0.01) == pytest.approx(0.5)
    with pytest.raises(UserError, match="beyond the flow engine's loss fit .to 1 %"):
        lossfit.interpolate(pts, 0.02)


def test_a_lossy_link_cuts_what_its_switch_ends_receive() -> None:
    fab = from_spec(leafspine(2, 2, 4))
    names = fab.end_names or []

    def cut(el: str) -> set[str]:
        got = lose(fab, {el: 0.5})
        assert got.lossy == ((el, 0.5),)
        changed = np.flatnonzero(got.link_cap != fab.link_cap)
        assert np.allclose(got.link_cap[changed], fab.link_cap[changed] / 2)
        return {names[i] for i in changed}  # each cut direction by its sending end

    # a host's link: what the NIC sends (the leaf's port receives it), not what it receives
    assert cut("leaf1:1") == {"h1:0"} == cut("h1:0")
    # a link between switches: both of its ports receive, both directions lose
    assert cut("leaf1:5") == {"leaf1:5", "spine1:1"}
    with pytest.raises(FabricError, match="a switch"):
        lose(fab, {"spine1": 0.5})
    with pytest.raises(FabricError, match="a fraction of the rate"):
        lose(fab, {"leaf1:1": 0.0})


def test_a_lossy_link_slows_its_flows_but_no_queue_holds_them() -> None:
    """A slow link's switch port queues what its sender sends faster (the network holds
    the ring: the congested fit); a lossy one's sender resends at its rate, and the
    network holds nothing for it: the same goodput, a different regime."""
    from testbed.flow.collectives import rail_rings, ring_allreduce
    from testbed.flow.fabric import ClosParams, build_clos, slow

    fab = build_clos(ClosParams(64, radix=16, switch_tbps=6.4))  # 8 rails, rings of 8
    whole = ring_allreduce(fab, rail_rings(fab), 1 << 20)
    lossy = ring_allreduce(lose(fab, {"h3g2": 0.5}), rail_rings(fab), 1 << 20)
    cut = ring_allreduce(slow(fab, {"h3g2": 0.5}), rail_rings(fab), 1 << 20)
    assert lossy.time_s == pytest.approx(cut.time_s) and lossy.time_s > 1.9 * whole.time_s
    assert cut.held_by_network and not lossy.held_by_network and not whole.held_by_network
    # a rate cut after the loss cuts what the queues see too
    both = slow(lose(fab, {"h3g2": 0.5}), {"h3g2": 0.5})
    assert both.queue_cap is not None
    assert ring_allreduce(both, rail_rings(fab), 1 << 20).held_by_network


def test_the_suites_faults_take_losses_by_the_packet_engines_ends() -> None:
    from testbed import faults
    from testbed.flow.suite import flow_faults

    spec = parse_choice("leafspine:2,2,4")
    got = flow_faults(
        spec,
        [
            faults.make(spec, "leaf1:1", "loss", "0.1%"),
            faults.make(spec, "leaf2:5", "silent-loss", "1%"),  # no counter: the same loss
            faults.make(spec, "h3", "loss", "0.5%"),  # a NIC: what it sends
            faults.make(spec, "leaf1:6", "rate", "50%"),
        ],
    )
    assert got == ([], {"leaf1:6": 0.5}, {"leaf1:1": 0.001, "leaf2:5": 0.01, "h3:0": 0.005})
    with pytest.raises(UserError, match="delay, flaps"):
        flow_faults(spec, [faults.make(spec, "leaf1:1", "delay", "2ms")])


def test_the_stored_fits_say_what_they_were_fitted_on() -> None:
    doc = calibration.load()
    assert doc.get("loss"), "no scheme's lossy link fitted: calibrate-flow --part loss"
    for scheme, e in doc["loss"].items():
        f = e["fitted_on"]
        assert f["scheme"] == scheme and f["link"] == "leaf1:1" and f["twin_commit"]
        assert f["bytes_per_rank"] == lossfit.LOSS_BYTES and f["seeds"] == list(lossfit.LOSS_SEEDS)
        assert [p["loss"] for p in e["points"]] == list(lossfit.LOSS_POINTS)
        for p in e["points"]:  # every seed's pair, and the goodput a loss leaves below 1
            assert set(p["twin_times_s"]) == set(lossfit.LOSS_SEEDS)
            assert 0 < p["goodput"] <= 1 and p["twin_ratio"] > 0
        h = e["held_out"]
        assert h["loss"] == lossfit.LOSS_CHECK and h["hosts"] == 16
        assert h["error"] == pytest.approx(h["predicted_ratio"] / h["twin_ratio"] - 1, abs=1e-3)


def test_a_lossy_link_on_the_flow_suite_at_its_schemes_goodput(tmp_path: Path) -> None:
    scheme = next(iter(calibration.load()["loss"]))
    argv = ["run", "--engine", "flow", "--quick", "--topo", "leafspine:2,2,4"]
    argv += ["--schemes", scheme, "--scenarios", "allreduce"]
    assert main([*argv, "--run-dir", str(tmp_path / "whole")]) == 0
    (tmp_path / "f.yaml").write_text("- {at: 0, target: leaf1:1, kind: loss, value: 1%}\n")
    lossy = [*argv, "--faults", str(tmp_path / "f.yaml"), "--run-dir", str(tmp_path / "lossy")]
    assert main(lossy) == 0
    whole, cut = (
        json.loads((tmp_path / d / "results.json").read_text()) for d in ("whole", "lossy")
    )
    g = lossfit.goodput(scheme, 0.01)
    assert cut["setup"]["loss_goodput"] == {scheme: {"leaf1:1": g}}
    ratio = cut["runs"][0]["completion_s"] / whole["runs"][0]["completion_s"]
    spec = parse_choice("leafspine:2,2,4")
    assert ratio == pytest.approx(lossfit.flow_ratio(scheme, spec, g, 1 << 20, 1))
    assert g < 1 and ratio > 1
    # a loss beyond the fit is refused before anything runs
    (tmp_path / "far.yaml").write_text("- {at: 0, target: leaf1:1, kind: loss, value: 5%}\n")
    far = [*argv, "--faults", str(tmp_path / "far.yaml"), "--run-dir", str(tmp_path / "far")]
    assert main(far) == 1 and not (tmp_path / "far").exists()
    # a scheme without a loss fit is refused with the command that fits it
    unfit = tmp_path / "calibration.yaml"
    unfit.write_text(json.dumps({"format": calibration.FORMAT, "schemes": {}}))
    with pytest.raises(UserError, match=f"calibrate-flow --scheme {scheme} --part loss"):
        lossfit.entry(scheme, unfit)


def test_flow_iteration_takes_a_lossy_link(capsys: pytest.CaptureFixture[str]) -> None:
    scheme = next(iter(calibration.load()["loss"]))
    base = ["flow-iteration", "--gpus", "64", "--json", "--scheme", scheme]
    assert main(base) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main([*base, "--loss", "h3g2=1%"]) == 0
    cut = json.loads(capsys.readouterr().out)
    g = lossfit.goodput(scheme, 0.01)
    assert cut["lossy"] == {"h3g2": {"loss": 0.01, "goodput": g}}
    assert cut["allreduce_s"] > whole["allreduce_s"]
    # without a scheme there is no transport to say what the link keeps: a usage error
    assert main(["flow-iteration", "--gpus", "64", "--json", "--loss", "h3g2=1%"]) == 2


def test_the_loss_fit_refits_on_the_twin_at_a_small_size(tmp_path: Path) -> None:
    """calibrate-flow --part loss's runs at 1 MiB and one seed: the twin slower with 2 % lost
    on the first host's link, the goodput that gives the flow engine the same slow-down, and
    the held-out check on the same runs predicting them back (the fit inverts the model)."""
    path = tmp_path / "calibration.yaml"
    shutil.copy(calibration.CALIBRATION, path)
    topo = calibration.topology_for(8)
    runs = {
        (p, 1): lossfit.run_twin("tita", topo, p, 1, tmp_path / f"r{p:g}", size=1 << 20)
        for p in (0.0, 0.02)
    }
    entry = lossfit.fit("tita", runs, runs, path)
    (point,) = entry["points"]
    assert point["loss"] == 0.02 and point["twin_ratio"] > 1 and point["goodput"] < 1
    assert entry["fitted_on"]["link"] == "leaf1:1" and entry["fitted_on"]["seeds"] == [1]
    assert entry["held_out"]["error"] == pytest.approx(0, abs=1e-3)
    assert calibration.load(path)["loss"]["tita"] == entry
    # the free and congested fits are left as they were
    assert calibration.load(path)["schemes"] == calibration.load()["schemes"]
    with pytest.raises(UserError, match="given as 2 % and seed 2"):
        lossfit.fit("tita", {(0.0, 1): runs[(0.0, 1)], (0.02, 2): runs[(0.02, 1)]}, None, path)
