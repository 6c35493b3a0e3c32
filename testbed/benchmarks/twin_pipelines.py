"""The twin's suite on the native per-packet path against the Python reference (issue 30's
proof at the scale of the default suite): the same suite, same seed, once with
`--pipeline native` (the switches' generated C, the NICs' XDP program compiled, the event loop
and the switches' hops in C, the transport core in C, the hosts' per-packet loops in C), once
with `--pipeline reference`, and once native with each part alone on its Python reference (the
event loop, `--loop-pipeline reference`; the transport core; the hosts), each in a process of
its own; their
`results.json` must be equal but for when, where and with which pipeline they ran
(testbed.experiment.report.comparable). Figures: whether they are, the first paths where they
differ, and each run's CPU seconds.

`make test` runs eight cells of the short suite the same way (tests/test_native_twin.py);
this runs the default suite (`--quick`: the short one), which takes a few minutes.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed.benchmarks.twin import _in_child

# what differs by design
PIPELINE_SETUP = (
    "command",
    "pipeline",
    "nic_pipeline",
    "loop_pipeline",
    "transport_pipeline",
    "transport_native_reasons",
    "host_pipeline",
    "host_native_reasons",
)
# each part's option, and its key in results.json's setup
PARTS = {"loop": "--loop-pipeline", "transport": "--transport-pipeline", "host": "--host-pipeline"}
RUNS: dict[str, tuple[str, dict[str, str]]] = {  # name: (--pipeline, parts on the reference)
    "native": ("native", {}),
    "reference": ("reference", {}),
    **{f"native_python_{part}": ("native", {part: "reference"}) for part in PARTS},
}
SEED = 1


def _suite(pipeline: str, parts: dict[str, str], run_dir: str, quick: bool) -> dict[str, Any]:
    """One suite on the twin (in a child process): its results file as `comparable` reads it,
    the pipelines that ran and the CPU seconds it took."""
    from testbed.experiment.report import comparable
    from testbed.main import main

    argv = ["run", "--engine", "sim", "--switch", "builtin", "--pipeline", pipeline]
    argv += ["--seed", str(SEED), "--run-dir", run_dir, *(["--quick"] if quick else [])]
    for part, value in parts.items():
        argv += [PARTS[part], value]
    c0 = time.process_time()
    rc = main(argv)
    cpu = time.process_time() - c0
    doc = json.loads((Path(run_dir) / "results.json").read_text())
    return {
        "rc": rc,
        "cpu_s": round(cpu, 1),
        "pipeline": doc["setup"].get("pipeline"),
        "nic_pipeline": doc["setup"].get("nic_pipeline"),
        **{f"{part}_pipeline": doc["setup"].get(f"{part}_pipeline") for part in PARTS},
        "doc": comparable(doc, PIPELINE_SETUP),
    }


def run(quick: bool) -> dict[str, Any]:
    from testbed.experiment.report import differences

    with tempfile.TemporaryDirectory(prefix="xingmai-pipelines-") as tmp:
        runs = {
            name: _in_child(_suite, pipeline, parts, str(Path(tmp) / name), quick)
            for name, (pipeline, parts) in RUNS.items()
        }
    docs = {p: r.pop("doc") for p, r in runs.items()}
    native = runs["native"]
    in_use = [native["pipeline"], native["nic_pipeline"], native["loop_pipeline"]]
    # the transport and the hosts: native for some jobs at least (the C lacks a few features)
    in_use += [str(native[f"{part}_pipeline"]).split("+")[0] for part in ("transport", "host")]
    if set(in_use) != {"native"}:
        # no compiler here: the "native" run fell back to the reference, nothing to compare
        return {"skipped": "the native pipeline did not build here", "runs": runs}
    diffs = {
        "differences": differences(docs["reference"], docs["native"]),
        **{
            f"{part}_differences": differences(docs[f"native_python_{part}"], docs["native"])
            for part in PARTS
        },
    }
    cpu = {name: r["cpu_s"] for name, r in runs.items()}
    return {
        "suite": "quick" if quick else "default",
        "seed": SEED,
        "cells": len(docs["reference"]["runs"]),
        "identical": not any(diffs.values()),
        **diffs,
        "cpu_s": cpu,
        "reference_over_native": round(cpu["reference"] / max(cpu["native"], 1e-9), 2),
        **{
            f"python_{part}_over_native": round(
                cpu[f"native_python_{part}"] / max(cpu["native"], 1e-9), 2
            )
            for part in PARTS
        },
        "exit_codes": {name: r["rc"] for name, r in runs.items()},
    }
