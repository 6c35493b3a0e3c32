"""A lossy link in the flow engine: the goodput the transport keeps through it, fitted on the twin.

A fluid model has no packets to lose. What a lost frame costs a collective is the
transport's (go-back-N resends from the lost packet on, a tail loss waits for its timeout),
and the packet-level twin runs that transport. `xingmai-testbed calibrate-flow --scheme S
--part loss` runs the twin's ring all-reduce (LOSS_BYTES per rank) on the suite's 8-host
leaf-spine with the first host's link losing a share P of what its switch port receives
(`--faults`: `link leaf1:1 loss P`, the packet engines' own fault), at each P of LOSS_POINTS,
beside the same run without the fault, over LOSS_SEEDS. Per P it stores the twin's slow-down
(the median over the seeds of the time with the loss over the time without, each seed's pair
on the same paths) and the **goodput** g: the fraction of the lossy link's rate at which the
flow engine's own all-reduce on that fabric slows by the same ratio (bisection; the
efficiency the scheme runs at is the calibration's, so a lossy link changes only what it
cuts). A held-out check runs the 16-host leaf-spine at LOSS_CHECK, between the fitted points.

The flow engine then runs a lossy link as one whose rate in the directions that lose is g(P)
of its own (`fabric.lose`): g linear in P between (0, 1) and the fitted points; a loss beyond
the last fitted point is refused. What this does not model: the goodput is the ring's (a flow
held elsewhere below g of the lossy link's rate loses nothing here, where its resends would
cost it time on the twin), measured with go-back-N (the transport's default), at one size
and on a host's link: a link between switches, whose flows have twice the path in flight and
lose both ways, cost the twin more than this predicts (docs/flow.md, "A lossy link").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from testbed.errors import UserError
from testbed.experiment.report import load_results
from testbed.flow import calibration
from testbed.flow.collectives import model_link_latency, suite_collective
from testbed.flow.fabric import from_spec, lose
from testbed.topo import FabricSpec, parse_choice

LOSS_POINTS = (0.001, 0.01)  # the fitted losses: a gray failure's 0.1 % and ten times it
LOSS_CHECK = 0.003  # held out, between them
LOSS_SEEDS = (1, 2, 3)
LOSS_BYTES = 16 << 20  # per rank: ~7,000 frames through the lossy link, ~7 lost at 0.1 %
LOSS_COLLECTIVE = "allreduce"
RETRANSMIT = "gbn"  # the transport's default, which the twin's fit runs


def lossy_end(spec: FabricSpec) -> str:
    """The fitted link, by its switch end: the first host's first NIC's link."""
    end = spec.attachment(spec.hosts[0].name, 0)
    return f"{end.node}:{end.index}"


def fault_file(path: Path, target: str, loss: float) -> Path:
    """A `--faults` file: `target` losing `loss` from the start."""
    path.write_text(yaml.safe_dump([{"at": 0.0, "target": target, "kind": "loss", "value": loss}]))
    return path


def _pct(p: float) -> str:
    return f"{p * 100:g} %"


def run_twin(
    scheme: str,
    topology: str,
    loss: float,
    seed: int,
    run_dir: Path,
    say: Any = print,
    size: int = LOSS_BYTES,
) -> Path:
    """One twin run of the fit: the all-reduce of `size` per rank, `loss` on the first
    host's link (0: no fault), the suite's seed `seed`; returns its results.json."""
    extra = ["--seed", str(seed)]
    if loss:
        run_dir.mkdir(parents=True, exist_ok=True)
        spec = parse_choice(topology)
        extra += ["--faults", str(fault_file(run_dir / "faults.yaml", lossy_end(spec), loss))]
    return calibration.run_twin(
        scheme,
        topology,
        run_dir,
        say,
        {calibration.SIZE_KEY[LOSS_COLLECTIVE]: size},
        collectives=(LOSS_COLLECTIVE,),
        extra=extra,
    )


def twin_time(results: Path, scheme: str) -> dict[str, Any]:
    """A fit run's all-reduce: the twin's time in the model's, and what it ran."""
    f = calibration.ideal_vs_twin(results).get(LOSS_COLLECTIVE)
    if f is None:
        raise UserError(f"{results}: no {LOSS_COLLECTIVE} to fit a loss on")
    if f["scheme"] != scheme:
        raise UserError(f"{results}: a run of {f['scheme']}, not {scheme}")
    if "failed" in f:
        raise UserError(f"{results}: the twin's {f['topology']} run failed ({f['failed']})")
    setup = load_results(results)["setup"]
    if "faults" not in setup:
        raise UserError(f"{results}: a run that does not record its faults (before this fit)")
    spec = parse_choice(calibration.topology_arg(f["topology"]))
    want = lossy_end(spec)
    f["loss"] = 0.0
    for x in setup["faults"]:
        if (x["kind"], x["target"], x.get("at", 0.0)) != ("loss", want, 0.0):
            raise UserError(
                f"{results}: a fault {x['target']} {x['kind']} at {x.get('at', 0.0)} s; the fit "
                f"takes {want} losing from the start and nothing else"
            )
        f["loss"] = float(x["value"])
    f["seed"] = int(setup["suite"].get("seed", 1))
    return f


def _slowdown(scheme: str, spec: FabricSpec, size: int, seed: int) -> Callable[[float], float]:
    """g -> the flow engine's all-reduce time with the first host's link at goodput g, over
    its time without the loss (computed once), under the scheme's calibrated efficiency."""
    lat = model_link_latency()
    fab = from_spec(spec)
    end = lossy_end(spec)

    def time(g: float) -> float:
        f = fab if g >= 1 else lose(fab, {end: g})
        ideal = suite_collective(f, LOSS_COLLECTIVE, size, lat, spec, seed)
        return ideal.time_at(calibration.applied(scheme, LOSS_COLLECTIVE, ideal).efficiency)

    whole = time(1.0)
    return lambda g: time(g) / whole


def flow_ratio(scheme: str, spec: FabricSpec, goodput: float, size: int, seed: int) -> float:
    """The flow engine's all-reduce time with the first host's link at `goodput`, over its
    time without the loss, under the scheme's calibrated efficiency."""
    return _slowdown(scheme, spec, size, seed)(goodput)


def goodput_for(scheme: str, spec: FabricSpec, ratio: float, size: int, seed: int) -> float:
    """The goodput at which the flow engine's all-reduce slows by `ratio` (1: none, as a
    twin run with the loss no slower than without it); bisection on the log of g, to a
    millionth (the fit keeps four digits)."""
    if ratio <= 1.0:
        return 1.0
    slowdown = _slowdown(scheme, spec, size, seed)
    lo, hi = -12.0, 0.0  # log g: g from 6e-6 (a ratio far beyond any fit) to 1
    if slowdown(math.exp(lo)) < ratio:
        raise UserError(f"a slow-down of {ratio:.3g}x is beyond what a lossy link can cost here")
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        if slowdown(math.exp(mid)) > ratio:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def _ratios(runs: dict[tuple[float, int], Path], scheme: str) -> dict[float, dict[str, Any]]:
    """Per loss of `runs` ({(loss, seed): results.json}, loss 0 each seed's baseline): each
    seed's twin times and the median slow-down."""
    times = {key: twin_time(path, scheme) for key, path in runs.items()}
    for (loss, seed), f in times.items():
        if (f["loss"], f["seed"]) != (loss, seed):
            raise UserError(
                f"{runs[(loss, seed)]}: a run at {_pct(f['loss'])} loss and seed {f['seed']}, "
                f"given as {_pct(loss)} and seed {seed}"
            )
    out: dict[float, dict[str, Any]] = {}
    for loss in sorted({loss for loss, _ in runs if loss}):
        seeds = sorted(s for lo, s in runs if lo == loss)
        missing = [s for s in seeds if (0.0, s) not in times]
        if missing:
            raise UserError(f"loss {_pct(loss)}: no run without the loss at seed(s) {missing}")
        per = {s: [times[(0.0, s)]["twin_time_s"], times[(loss, s)]["twin_time_s"]] for s in seeds}
        out[loss] = {
            "twin_ratio": round(statistics.median(b / a for a, b in per.values()), 4),
            "twin_times_s": {s: [float(f"{t:.6g}") for t in ab] for s, ab in per.items()},
            "fitted_on": times[(loss, seeds[0])],
        }
    return out


def fit(
    scheme: str,
    runs: dict[tuple[float, int], Path],
    check_runs: dict[tuple[float, int], Path] | None,
    path: Path = calibration.CALIBRATION,
) -> dict[str, Any]:
    """Store the scheme's goodput through a lossy link from twin runs ({(loss, seed):
    results.json}, loss 0 the baselines) and the held-out error of others; returns it."""
    points = []
    first: dict[str, Any] = {}
    for loss, r in _ratios(runs, scheme).items():
        f = r.pop("fitted_on")
        first = first or f
        spec = parse_choice(calibration.topology_arg(f["topology"]))
        g = goodput_for(scheme, spec, r["twin_ratio"], f["bytes_per_rank"], 1)
        points.append({"loss": loss, "goodput": round(g, 4), **r})
    if not points:
        raise UserError("the loss fit wants runs with a loss and their baselines")
    entry: dict[str, Any] = {
        "retransmit": RETRANSMIT,
        "points": points,
        "fitted_on": {
            **{k: first[k] for k in ("scheme", "topology", "hosts", "bytes_per_rank")},
            "link": lossy_end(parse_choice(calibration.topology_arg(first["topology"]))),
            "seeds": sorted({s for _, s in runs}),
            **{k: first[k] for k in first if k.startswith("twin_") or k == "cc_profile"},
        },
    }
    entry["fitted_on"].pop("twin_time_s")  # each point's, per seed
    for loss, r in _ratios(check_runs or {}, scheme).items():
        f = r["fitted_on"]
        spec = parse_choice(calibration.topology_arg(f["topology"]))
        predicted = flow_ratio(scheme, spec, interpolate(points, loss), f["bytes_per_rank"], 1)
        entry["held_out"] = {
            "topology": f["topology"],
            "hosts": f["hosts"],
            "loss": loss,
            "twin_ratio": r["twin_ratio"],
            "twin_times_s": r["twin_times_s"],
            "predicted_ratio": round(predicted, 4),
            "error": round(predicted / r["twin_ratio"] - 1, 4),
        }
    doc = calibration.load(path)
    doc.setdefault("loss", {})[scheme] = entry
    calibration.write(doc, path)
    return entry


def interpolate(points: list[dict[str, Any]], loss: float) -> float:
    """The goodput at `loss`: linear in P between (0, 1) and the fitted points (each lost
    frame costs its flow about the same resent window, so the time grows with the losses);
    beyond the last point a UserError."""
    pts = [(0.0, 1.0), *sorted((float(p["loss"]), float(p["goodput"])) for p in points)]
    if loss > pts[-1][0] * (1 + 1e-9):
        raise UserError(
            f"a loss of {_pct(loss)} is beyond the flow engine's loss fit (to "
            f"{_pct(pts[-1][0])}): run it on a packet engine"
        )
    return float(np.interp(max(loss, 0.0), [p for p, _ in pts], [g for _, g in pts]))


def entry(scheme: str, path: Path = calibration.CALIBRATION) -> dict[str, Any]:
    """The scheme's loss fit, or Uncalibrated naming the command that fits it."""
    got = calibration.load(path).get("loss", {}).get(scheme)
    if got is None:
        raise calibration.Uncalibrated(
            f"scheme {scheme!r} has no flow-engine fit of a lossy link (what the transport "
            f"keeps through one is the twin's to measure): "
            f"{calibration.calibrate_command(scheme)} --part loss"
        )
    return got


def require(scheme: str, profile: str, path: Path = calibration.CALIBRATION) -> None:
    """The scheme's loss fit exists and was made under `profile`, or a UserError says how."""
    got = calibration.fitted_profile(scheme, entry(scheme, path)["fitted_on"])
    if got != profile:
        raise UserError(
            f"the flow engine's lossy link under {scheme} was fitted on the twin under cc "
            f"profile {got!r}, not {profile!r}: run this on a packet engine, or fit it again "
            f"({calibration.calibrate_command(scheme)} --part loss)"
        )


def goodput(scheme: str, loss: float, path: Path = calibration.CALIBRATION) -> float:
    """What a link losing `loss` of its frames carries as goodput under `scheme`."""
    return interpolate(entry(scheme, path)["points"], loss)
