"""The twin's suite on the native per-packet path against the Python reference (issue 30's
proof at the scale of the default suite): the same suite, same seed, once with
`--pipeline native` (the switches' generated C, the NICs' XDP program compiled, the event loop
and the switches' hops in C, the transport core in C), once with `--pipeline reference`, once
native with the Python event loop (`--loop-pipeline reference`) and once native with the Python
transport core (`--transport-pipeline reference`), each in a process of its own; their
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
)
RUNS = {  # name: (--pipeline, --loop-pipeline, --transport-pipeline)
    "native": ("native", None, None),
    "reference": ("reference", None, None),
    "native_python_loop": ("native", "reference", None),
    "native_python_transport": ("native", None, "reference"),
}
SEED = 1


def _suite(
    pipeline: str, loop: str | None, transport: str | None, run_dir: str, quick: bool
) -> dict[str, Any]:
    """One suite on the twin (in a child process): its results file as `comparable` reads it,
    the pipelines that ran and the CPU seconds it took."""
    from testbed.experiment.report import comparable
    from testbed.main import main

    argv = ["run", "--engine", "sim", "--switch", "builtin", "--pipeline", pipeline]
    argv += ["--seed", str(SEED), "--run-dir", run_dir, *(["--quick"] if quick else [])]
    argv += ["--loop-pipeline", loop] if loop else []
    argv += ["--transport-pipeline", transport] if transport else []
    c0 = time.process_time()
    rc = main(argv)
    cpu = time.process_time() - c0
    doc = json.loads((Path(run_dir) / "results.json").read_text())
    return {
        "rc": rc,
        "cpu_s": round(cpu, 1),
        "pipeline": doc["setup"].get("pipeline"),
        "nic_pipeline": doc["setup"].get("nic_pipeline"),
        "loop_pipeline": doc["setup"].get("loop_pipeline"),
        "transport_pipeline": doc["setup"].get("transport_pipeline"),
        "doc": comparable(doc, PIPELINE_SETUP),
    }


def run(quick: bool) -> dict[str, Any]:
    from testbed.experiment.report import differences

    with tempfile.TemporaryDirectory(prefix="xingmai-pipelines-") as tmp:
        runs = {
            name: _in_child(_suite, pipeline, loop, transport, str(Path(tmp) / name), quick)
            for name, (pipeline, loop, transport) in RUNS.items()
        }
    docs = {p: r.pop("doc") for p, r in runs.items()}
    native = runs["native"]
    in_use = (
        native["pipeline"],
        native["nic_pipeline"],
        native["loop_pipeline"],
        native["transport_pipeline"],
    )
    if in_use != ("native", "native", "native", "native"):
        # no compiler here: the "native" run fell back to the reference, nothing to compare
        return {"skipped": "the native pipeline did not build here", "runs": runs}
    diff = differences(docs["reference"], docs["native"])
    loop_diff = differences(docs["native_python_loop"], docs["native"])
    transport_diff = differences(docs["native_python_transport"], docs["native"])
    cpu = {name: r["cpu_s"] for name, r in runs.items()}
    return {
        "suite": "quick" if quick else "default",
        "seed": SEED,
        "cells": len(docs["reference"]["runs"]),
        "identical": not diff and not loop_diff and not transport_diff,
        "differences": diff,
        "loop_differences": loop_diff,
        "transport_differences": transport_diff,
        "cpu_s": cpu,
        "reference_over_native": round(cpu["reference"] / max(cpu["native"], 1e-9), 2),
        "python_loop_over_native": round(cpu["native_python_loop"] / max(cpu["native"], 1e-9), 2),
        "python_transport_over_native": round(
            cpu["native_python_transport"] / max(cpu["native"], 1e-9), 2
        ),
        "exit_codes": {name: r["rc"] for name, r in runs.items()},
    }
