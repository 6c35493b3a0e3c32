"""Per-scheme efficiencies of the flow engine, fitted on the packet-level twin.

A flow-level model cannot derive what congestion control does (it has no queues, packets or
rate laws): it gives the ideal time of a collective (max-min rates, plus each step's latency
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
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from testbed.ctlconfig import smallest_resolving_scale
from testbed.errors import UserError
from testbed.experiment.report import load_results
from testbed.experiment.schemes import cc_profile_name, default_cc_profiles
from testbed.flow.collectives import model_link_latency, suite_collective
from testbed.flow.fabric import from_spec
from testbed.model import Scaling
from testbed.topo import parse_choice

CALIBRATION = Path(__file__).with_name("calibration.yaml")
FORMAT = 1
COLLECTIVES = ("allreduce", "alltoall")
SIZE_KEY = {"allreduce": "allreduce_bytes", "alltoall": "alltoall_bytes"}


class Uncalibrated(UserError):
    pass


def calibrate_command(scheme: str) -> str:
    return f"xingmai-testbed calibrate-flow --scheme {scheme}"


def load(path: Path = CALIBRATION) -> dict[str, Any]:
    if not path.exists():
        return {"format": FORMAT, "schemes": {}}
    doc = yaml.safe_load(path.read_text()) or {}
    if doc.get("format") != FORMAT:
        raise UserError(f"{path}: format {doc.get('format')!r}, this engine reads {FORMAT}")
    doc.setdefault("schemes", {})
    return doc


def efficiency(scheme: str, collective: str, path: Path = CALIBRATION) -> float:
    """The fitted ratio ideal time / twin time; Uncalibrated names the command to fit it."""
    entry = load(path)["schemes"].get(scheme, {}).get(collective)
    if entry is None:
        raise Uncalibrated(
            f"scheme {scheme!r} has no flow-engine calibration for {collective} "
            f"(a flow model cannot derive congestion control); fit it on the twin: "
            f"{calibrate_command(scheme)}"
        )
    return float(entry["efficiency"])


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


def twin_scale(hosts: int) -> float:
    """The scale the twin is calibrated at on the fabric of `hosts`: the smallest at which
    its switches' telemetry resolves the base RTT."""
    spec = parse_choice(topology_for(hosts))
    k = smallest_resolving_scale(spec, Scaling(max_hops=spec.longest_path_switches()))
    if k is None:
        raise UserError(f"{spec.name}: no scale resolves its switches' telemetry")
    return k


def run_twin(scheme: str, hosts: int, run_dir: Path, say: Any = print) -> Path:
    """The twin's allreduce and alltoall (quick sizes) at `twin_scale`, in a process of its
    own; returns its results.json."""
    cmd = [
        sys.executable,
        "-m",
        "testbed",
        "run",
        "--engine",
        "sim",
        "--scale",
        f"{twin_scale(hosts):g}",
        "--quick",
        "--topo",
        topology_for(hosts),
        "--schemes",
        scheme,
        "--scenarios",
        ",".join(COLLECTIVES),
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
    spec = parse_choice(f"{_topology_arg(setup['topology'])}")
    fab = from_spec(spec)
    lat = model_link_latency()  # as the flow engine runs (the twin's measured RTT recorded)
    out = {}
    for run in doc["runs"]:
        coll = run["scenario"]
        if coll not in COLLECTIVES or run.get("error"):
            continue
        size = setup["suite"][SIZE_KEY[coll]]
        ideal = suite_collective(fab, coll, size, lat, spec, int(setup["suite"].get("seed", 1)))
        out[coll] = {
            "scheme": run["scheme"],
            "topology": setup["topology"],
            "hosts": len(spec.hosts),
            "bytes_per_rank": size,
            "twin_time_s": run["completion_s"] / k,
            "twin_scale": k,
            "ideal_time_s": ideal.time_s,
            "ideal_latency_s": ideal.latency_s,
            "twin_base_rtt_s": setup["base_rtt_s"] / k,
            "cc_profile": setup.get("cc_profiles", {}).get(run["scheme"], {}).get("profile"),
            "twin_commit": doc["source"]["commit"],
            "twin_dirty": doc["source"]["dirty"],
            "twin_date": doc["date"],
            "twin_command": setup.get("command"),
        }
    return out


def _topology_arg(name: str) -> str:
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
        eff = f["ideal_time_s"] / f["twin_time_s"]
        entry[coll] = {"efficiency": round(eff, 4), "fitted_on": f}
        if coll in held:
            h = held[coll]
            predicted = h["ideal_time_s"] / eff
            entry[coll]["held_out"] = {
                **h,
                "predicted_time_s": predicted,
                "error": round(predicted / h["twin_time_s"] - 1, 4),
            }
    doc = load(path)
    doc["schemes"][scheme] = entry
    doc["format"] = FORMAT
    header = (
        "# The flow engine's per-scheme efficiencies (ideal max-min time / the twin's "
        "time),\n# written by `xingmai-testbed calibrate-flow`; see docs/flow.md.\n"
    )
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False))
    return entry
