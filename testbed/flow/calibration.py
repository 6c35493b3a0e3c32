"""Per-scheme efficiencies of the flow engine, fitted on the packet-level twin.

A flow-level model cannot derive what congestion control does (it has no queues, packets or
rate laws): it gives the ideal time of a collective (max-min rates, an all-to-all through
FIFO queues (`fifo`), plus each step's latency
from the model's base RTT, which the twin's fabric is built to have and measures). The twin
runs the project's own switch pipeline, NICs and transport; the ratio of the two, per
(scheme, collective), is what `calibration.yaml` beside this module stores, with what it was
fitted on (the twin's commit, the fabric, the sizes, both times), and a held-out check on a
larger fabric.

`xingmai-testbed calibrate-flow --scheme S` fits it: it runs the twin as a separate
process (`xingmai-testbed run --engine sim --scale K --quick`, the suite's allreduce and
alltoall on a 2:1 leaf-spine of 4 hosts per leaf; the flow engine does not import the twin)
and reads its results.json. K is the smallest scale at which the switches' telemetry
resolves the base RTT (testbed/ctlconfig.py: at the model's own speed INT carries no link
utilisation), and the twin's times are taken in the model's, divided by K.

Where the flows that finish last are held by the network (`CollResult.held_by_network`: a
switch's egress, not their NIC, sets their rate) the laws act, and how well depends on the
scheme and on how long the network holds the collective: one efficiency per scheme does not
hold there (docs/flow.md). The congested fit runs the twin where it does, at three sizes per
collective, and reads the efficiency there as a function of the collective's ideal time on
the network: interpolated in its logarithm between the fitted points, the nearest point's
beyond them, and said so.
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from testbed.ctlconfig import smallest_resolving_scale
from testbed.errors import UserError
from testbed.experiment.report import load_results
from testbed.experiment.schemes import SCHEMES, cc_profile_name, default_cc_profiles
from testbed.flow.collectives import CollResult, model_link_latency, suite_collective
from testbed.flow.fabric import from_spec
from testbed.model import Scaling
from testbed.topo import load as load_topology
from testbed.topo import parse_choice

CALIBRATION = Path(__file__).with_name("calibration.yaml")
FORMAT = 1
COLLECTIVES = ("allreduce", "alltoall")
SIZE_KEY = {"allreduce": "allreduce_bytes", "alltoall": "alltoall_bytes"}

# The congested fit's fabric: hosts numbered round the leaves behind one spine, so the suite's
# ring sends 4 flows through each leaf's uplink (the 4-flow ECMP collision of a 131,072-GPU
# plain Clos, docs/flow.md) and the all-to-all's cross-leaf half crosses one 4:1 uplink; held
# out on 16 hosts (4 leaves) at sizes between the fitted ones.
CONGESTED_TOPOLOGY = "crossed:2,1,4"
CONGESTED_CHECK_TOPOLOGY = "crossed:4,1,4"
CONGESTED_SIZES = (
    {"allreduce_bytes": 1 << 20, "alltoall_bytes": 256 << 10},
    {"allreduce_bytes": 4 << 20, "alltoall_bytes": 1 << 20},
    {"allreduce_bytes": 16 << 20, "alltoall_bytes": 4 << 20},
)
CONGESTED_CHECK_SIZES = {"allreduce_bytes": 8 << 20, "alltoall_bytes": 2 << 20}
# issue 31's bound on a held-out cell: a fit that misses it says so wherever it is applied
HELD_OUT_BOUND = 0.10


class Uncalibrated(UserError):
    pass


def calibrate_command(scheme: str) -> str:
    return f"xingmai-testbed calibrate-flow --scheme {scheme}"


# libyaml's parser where PyYAML was built with it (a run reads the file for every cell)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_parsed: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}  # path -> (mtime, size), doc


def load(path: Path = CALIBRATION) -> dict[str, Any]:
    """The calibration file (a copy the caller may change), parsed once while it is
    unchanged on disk."""
    if not path.exists():
        return {"format": FORMAT, "schemes": {}}
    st = path.stat()
    stamp = (st.st_mtime_ns, st.st_size)
    seen = _parsed.get(path)
    if seen is None or seen[0] != stamp:
        doc = yaml.load(path.read_text(), Loader=_LOADER) or {}
        if doc.get("format") != FORMAT:
            raise UserError(f"{path}: format {doc.get('format')!r}, this engine reads {FORMAT}")
        doc.setdefault("schemes", {})
        seen = _parsed[path] = (stamp, doc)
    return copy.deepcopy(seen[1])


def _entry(scheme: str, collective: str, path: Path, congested: bool = False) -> dict[str, Any]:
    if scheme not in SCHEMES:
        raise UserError(f"unknown scheme {scheme!r} (one of {', '.join(SCHEMES)})")
    entry = load(path)["schemes"].get(scheme, {}).get(collective)
    if entry is None or (congested and "congested" not in entry):
        where = "where the network holds it " if congested else ""
        raise Uncalibrated(
            f"scheme {scheme!r} has no flow-engine calibration for {collective} {where}"
            f"(a flow model cannot derive congestion control); fit it on the twin: "
            f"{calibrate_command(scheme)}"
        )
    return dict(entry)


def efficiency(scheme: str, collective: str, path: Path = CALIBRATION) -> float:
    """The fitted ratio ideal time / twin time where the network does not hold the
    collective; Uncalibrated names the command to fit it."""
    return float(_entry(scheme, collective, path)["efficiency"])


def require(scheme: str, collective: str, path: Path = CALIBRATION) -> None:
    """Both fits of (scheme, collective) are there, or Uncalibrated names the command."""
    _entry(scheme, collective, path, congested=True)


@dataclass(frozen=True)
class Applied:
    """The efficiency a collective runs at under a scheme, and which fit gave it."""

    efficiency: float
    regime: str  # "free": not held by the network; "congested": held (the congested fit)
    note: str = ""  # beyond the fitted times, or a fit that missed its held-out check
    held_out_error: float | None = None  # the fit's held-out check: predicted / twin - 1
    beyond: bool = False  # the collective's time lies outside the fitted ones
    missed: bool = False  # the fit missed its held-out check (or its held-out run failed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "efficiency": self.efficiency,
            "regime": self.regime,
            "note": self.note,
            "held_out_error": self.held_out_error,
            "beyond": self.beyond,
            "missed": self.missed,
        }


def applied(scheme: str, collective: str, result: CollResult, path: Path = CALIBRATION) -> Applied:
    """The efficiency of `result` (the flow engine's ideal) under `scheme`: the free fit's,
    or where the network holds the last flows the congested fit's at the collective's ideal
    time on the network."""
    if not result.held_by_network:
        entry = _entry(scheme, collective, path)
        _same_queues(scheme, collective, entry.get("fitted_on", {}), result)
        error = entry.get("held_out", {}).get("error")
        return Applied(float(entry["efficiency"]), "free", held_out_error=error)
    cong = _entry(scheme, collective, path, congested=True)["congested"]
    for p in cong["points"]:
        _same_queues(scheme, collective, p.get("fitted_on", {}), result)
    got = congested_efficiency(cong["points"], result.time_s - result.scaleup_s)
    held = cong.get("held_out", {})
    error = held.get("error")
    missed = ""
    if "failed" in held:
        missed = f"its held-out run did not complete on the twin ({held['failed']})"
    elif error is not None and abs(error) > HELD_OUT_BOUND:
        missed = f"it missed its held-out check by {error:+.0%}"
    if missed:
        missed = (
            f"the congested fit of {scheme} {collective}: {missed} (docs/flow.md): a figure "
            "to check on the twin"
        )
        got = replace(got, note="; ".join(n for n in (got.note, missed) if n), missed=True)
    return replace(got, held_out_error=error)


def _same_queues(
    scheme: str, collective: str, fitted_on: dict[str, Any], result: CollResult
) -> None:
    """The fit's ideal time was computed as `result`'s is (max-min rates, or the all-to-all
    through FIFO queues: testbed/flow/fifo.py); fits made before the FIFOs record none."""
    fitted = fitted_on.get("queues", "max-min")
    if fitted != result.queues:
        raise Uncalibrated(
            f"the flow engine's {scheme} {collective} was fitted on an ideal time of "
            f"{fitted} and computes it by {result.queues} now: fit it again on the twin "
            f"({calibrate_command(scheme)})"
        )


def congested_efficiency(points: list[dict[str, Any]], ideal_s: float) -> Applied:
    """Between fitted points (each with its ideal time), linear in the time's logarithm;
    beyond them the nearest one's, with a note saying how far beyond."""
    pts = sorted((float(p["fitted_on"]["ideal_time_s"]), float(p["efficiency"])) for p in points)
    xs = [math.log(t) for t, _ in pts]
    effs = [e for _, e in pts]
    lo, hi = pts[0][0], pts[-1][0]
    note = ""
    beyond = ideal_s > hi * (1 + 1e-9) or ideal_s < lo * (1 - 1e-9)
    if beyond:
        edge = hi if ideal_s > hi else lo
        note = (
            f"held {_fmt_s(ideal_s)} ideally, beyond the congested fit's "
            f"{_fmt_s(lo)}-{_fmt_s(hi)}: the efficiency at {_fmt_s(edge)}"
        )
    eff = float(np.interp(math.log(ideal_s), xs, effs)) if ideal_s > 0 else effs[0]
    return Applied(round(eff, 4), "congested", note, beyond=beyond)


def _fmt_s(t: float) -> str:
    return f"{t * 1e3:.3g} ms" if t >= 1e-3 else f"{t * 1e6:.3g} us"


def fitted_profile(scheme: str, fitted_on: dict[str, Any]) -> str:
    """The CC profile the twin ran a fit under: recorded with fits since the tuner's CC
    settings; before, the law's default (the twin's command then had no --cc-profile)."""
    recorded = fitted_on.get("cc_profile")
    if recorded:
        return str(recorded)
    if "--cc-" in str(fitted_on.get("twin_command", "")):
        raise UserError(f"the flow engine's fit of {scheme} does not say its CC profile")
    return cc_profile_name(scheme, default_cc_profiles(), {})


def check_profiles(
    schemes: tuple[str, ...],
    profiles: dict[str, str],
    cc_set: dict[str, dict[str, str]],
    path: Path = CALIBRATION,
) -> None:
    """Each scheme's fits were made under the CC profile this run asks for (--cc-profile,
    --cc-set); a UserError names both and the command that fits the flow engine."""
    doc = load(path)
    for scheme in schemes:
        want = cc_profile_name(scheme, profiles, cc_set)
        for coll, entry in doc["schemes"].get(scheme, {}).items():
            got = fitted_profile(scheme, entry["fitted_on"])
            if got != want:
                raise UserError(
                    f"the flow engine's {scheme} {coll} was fitted on the twin under cc profile "
                    f"{got!r}, not {want!r}: run this on a packet engine, or fit it again "
                    f"under that profile ({calibrate_command(scheme)})"
                )


def topology_for(hosts: int) -> str:
    """The suite's leaf-spine at `hosts`: 4 hosts per leaf, 2 spines (2:1, as the default)."""
    if hosts % 4 or hosts < 8:
        raise ValueError(f"--hosts {hosts}: a multiple of 4, at least 8")
    return f"leafspine:{hosts // 4},2,4"


def twin_scale(topology: str) -> float:
    """The scale the twin is calibrated at on `topology`: the smallest at which its
    switches' telemetry resolves the base RTT."""
    spec = parse_choice(topology)
    k = smallest_resolving_scale(spec, Scaling(max_hops=spec.longest_path_switches()))
    if k is None:
        raise UserError(f"{spec.name}: no scale resolves its switches' telemetry")
    return k


def run_twin(
    scheme: str,
    topology: str,
    run_dir: Path,
    say: Any = print,
    params: dict[str, int] | None = None,
    collectives: Sequence[str] = COLLECTIVES,
    extra: Sequence[str] = (),
) -> Path:
    """The twin's `collectives` (the quick suite's sizes, or `params`'s) on `topology` at
    `twin_scale`, with `extra` arguments, in a process of its own; returns its results.json."""
    cmd = [
        sys.executable,
        "-m",
        "testbed",
        "run",
        "--engine",
        "sim",
        "--scale",
        f"{twin_scale(topology):g}",
        "--quick",
        *[f"--param={k}={v}" for k, v in (params or {}).items()],
        "--topo",
        topology,
        "--schemes",
        scheme,
        "--scenarios",
        ",".join(collectives),
        *extra,
        "--run-dir",
        str(run_dir),
    ]
    say("twin: " + " ".join(cmd[2:]))
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise UserError(f"the twin's run failed ({done.returncode}): {done.stderr[-2000:]}")
    say(f"twin: done in {time.monotonic() - t0:.0f} s")
    return run_dir / "results.json"


def ideal_vs_twin(results: Path) -> dict[str, dict[str, Any]]:
    """Per collective of a twin run: its time and the flow engine's ideal on the same
    topology and size."""
    doc = load_results(results)
    setup = doc["setup"]
    if setup.get("engine") != "sim":
        raise UserError(f"{results}: not a run of the twin (--engine sim)")
    if not (setup.get("telemetry") or {}).get("resolves"):
        raise UserError(
            f"{results}: a twin run whose switches' telemetry does not resolve the base RTT "
            f"(scale {setup.get('scale')}; its results.json says why, or predates the "
            "check): calibrate on one that does, as calibrate-flow runs it"
        )
    k = float(setup["scale"])  # the twin's times in the model's
    saved = results.parent / "topology.yaml"  # the run's own fabric, as it ran
    spec = load_topology(saved) if saved.exists() else parse_choice(topology_arg(setup["topology"]))
    fab = from_spec(spec)
    lat = model_link_latency()  # as the flow engine runs (the twin's measured RTT recorded)
    out = {}
    for run in doc["runs"]:
        coll = run["scenario"]
        if coll not in COLLECTIVES:
            continue
        size = setup["suite"][SIZE_KEY[coll]]
        ideal = suite_collective(fab, coll, size, lat, spec, int(setup["suite"].get("seed", 1)))
        out[coll] = {
            "scheme": run["scheme"],
            "topology": setup["topology"],
            "hosts": len(spec.hosts),
            "bytes_per_rank": size,
            "twin_scale": k,
            "ideal_time_s": ideal.time_s,
            "ideal_latency_s": ideal.latency_s,
            "held_by_network": ideal.held_by_network,
            "queues": ideal.queues,
            "twin_base_rtt_s": setup["base_rtt_s"] / k,
            "cc_profile": setup.get("cc_profiles", {}).get(run["scheme"], {}).get("profile"),
            "twin_commit": doc["source"]["commit"],
            "twin_dirty": doc["source"]["dirty"],
            "twin_date": doc["date"],
            "twin_command": setup.get("command"),
        }
        if run.get("error"):  # the twin's collective did not complete: no time to fit on
            out[coll]["failed"] = run["error"]
        else:
            out[coll]["twin_time_s"] = run["completion_s"] / k
    return out


def _fit_point(f: dict[str, Any], results: Path) -> float:
    """A run's efficiency (ideal / twin), or a UserError if the twin's run failed."""
    if "failed" in f:
        raise UserError(f"{results}: the twin's {f['topology']} run failed ({f['failed']})")
    return float(f["ideal_time_s"] / f["twin_time_s"])


def _held_out(h: dict[str, Any], eff: float) -> dict[str, Any]:
    """A held-out run's check: the predicted time, and its error unless the twin's run failed
    (then the failure stands as the check's outcome)."""
    predicted = h["ideal_time_s"] / eff
    if "failed" in h:
        return {**h, "predicted_time_s": predicted}
    return {**h, "predicted_time_s": predicted, "error": round(predicted / h["twin_time_s"] - 1, 4)}


def topology_arg(name: str) -> str:
    """`leafspine-2x2x4` (a results file's name) as the builder's argument."""
    kind, _, dims = name.partition("-")
    return f"{kind}:{dims.replace('x', ',')}" if dims else name


def fit(
    scheme: str, fit_results: Path, check_results: Path | None, path: Path = CALIBRATION
) -> dict[str, Any]:
    """Store the scheme's efficiencies from a twin run (and the held-out error of a second
    one); returns the scheme's entry."""
    fitted = ideal_vs_twin(fit_results)
    held = ideal_vs_twin(check_results) if check_results is not None else {}
    entry: dict[str, Any] = {}
    for coll, f in fitted.items():
        if f["scheme"] != scheme:
            raise UserError(f"{fit_results}: a run of {f['scheme']}, not {scheme}")
        eff = _fit_point(f, fit_results)
        entry[coll] = {"efficiency": round(eff, 4), "fitted_on": f}
        if coll in held:
            entry[coll]["held_out"] = _held_out(held[coll], eff)
    doc = load(path)
    old = doc["schemes"].get(scheme, {})
    for coll in entry:  # the congested fit is the other command's part
        if "congested" in old.get(coll, {}):
            entry[coll]["congested"] = old[coll]["congested"]
    doc["schemes"][scheme] = entry
    write(doc, path)
    return entry


def fit_congested(
    scheme: str, fit_results: list[Path], check_results: Path | None, path: Path = CALIBRATION
) -> dict[str, Any]:
    """Store the scheme's congested efficiencies from twin runs at several sizes on a fabric
    where the network holds each collective (and the held-out error of another run);
    returns the scheme's congested entries per collective."""
    points: dict[str, list[dict[str, Any]]] = {}
    for results in fit_results:
        for coll, f in ideal_vs_twin(results).items():
            if f["scheme"] != scheme:
                raise UserError(f"{results}: a run of {f['scheme']}, not {scheme}")
            if not f["held_by_network"]:
                raise UserError(
                    f"{results}: the network does not hold its {coll} on {f['topology']}: "
                    "the congested fit wants a fabric where it does"
                )
            eff = _fit_point(f, results)
            points.setdefault(coll, []).append({"efficiency": round(eff, 4), "fitted_on": f})
    held = ideal_vs_twin(check_results) if check_results is not None else {}
    doc = load(path)
    out: dict[str, Any] = {}
    for coll, pts in points.items():
        if len({p["fitted_on"]["bytes_per_rank"] for p in pts}) != len(pts):
            raise UserError(f"the congested fit of {coll}: one twin run per size")
        pts.sort(key=lambda p: p["fitted_on"]["ideal_time_s"])
        cong: dict[str, Any] = {"points": pts}
        if coll in held:
            h = held[coll]
            cong["held_out"] = _held_out(h, congested_efficiency(pts, h["ideal_time_s"]).efficiency)
        entry = doc["schemes"].setdefault(scheme, {}).get(coll)
        if entry is None:
            raise Uncalibrated(
                f"{scheme} {coll}: fit the free efficiency first ({calibrate_command(scheme)})"
            )
        entry["congested"] = out[coll] = cong
    write(doc, path)
    return out


def write(doc: dict[str, Any], path: Path) -> None:
    doc["format"] = FORMAT
    header = (
        "# The flow engine's per-scheme efficiencies (its ideal time, by max-min rates or "
        "through FIFO queues as `queues` says, / the twin's time; `congested`: where the "
        "network holds the collective, by its ideal time),\n"
        "# `loss`: the goodput through a lossy link (testbed/flow/lossfit.py),\n"
        "# written by `xingmai-testbed calibrate-flow`; see docs/flow.md.\n"
    )
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False))
