"""`xingmai-testbed sweep`: a grid of runs on Dask, one table of medians and ranges.

The grid is schemes x values of one suite parameter (a field of
testbed.experiment.suite.SuiteConfig, `--param NAME=V1,V2,...`) x seeds. Every point is one run
of the suite's scenarios under one scheme on an engine that runs in one process (`ENGINES`: the
twin, testbed.sim.suite.SimSuite, by default; or the flow-level engine,
testbed.flow.suite.FlowSuite, its `allreduce` and `alltoall`), run as a task of a
dask.distributed cluster: a LocalCluster on this machine by default, or the user's cluster
(`--scheduler ADDR`). A point runs in one process and is deterministic, so a grid spreads over
as many workers as it has points. The table gives, per (value, scenario, scheme) cell, the
median over the seeds and the min-max of each metric; `sweep.json` in the run dir holds every
point.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.experiment.machine import provenance
from testbed.experiment.rundir import new_run_dir
from testbed.experiment.schemes import SCHEMES
from testbed.experiment.suite import Suite, SuiteConfig, suite_param
from testbed.model import Scaling
from testbed.topo import FabricSpec, parse_choice

METRICS = (  # (label, RunRecord field, factor to the shown unit)
    ("p99 queue KB", "queue_p99_bytes", 1e-3),
    ("drops", "drops", 1.0),
    ("FCT p99", "fct_slowdown_p99", 1.0),
    ("busbw Gb/s", "busbw_bps", 1e-9),
    ("time ms", "completion_s", 1e3),
)


def _twin(spec: FabricSpec, scaling: Scaling, cfg: SuiteConfig) -> Suite:
    from testbed.sim.fabric import SimFabric
    from testbed.sim.suite import SimSuite

    return SimSuite(SimFabric(spec, scaling, seed=cfg.seed), cfg)


def _flow(spec: FabricSpec, scaling: Scaling, cfg: SuiteConfig) -> Suite:
    from testbed.flow import calibration
    from testbed.flow.suite import FlowSuite

    # its efficiencies hold for the CC profiles the twin was fitted under, no other
    calibration.check_profiles(cfg.schemes, cfg.cc_profiles, cfg.cc_set)
    return FlowSuite(spec, cfg, lambda line: None)


# The engines a sweep can run: those whose run is one deterministic process (a Dask task);
# the emulation needs the whole machine and root, so it has no place in a grid of workers.
# The flow engine runs at the model's own speed whatever `--scale` says.
ENGINES: dict[str, Callable[[FabricSpec, Scaling, SuiteConfig], Suite]] = {
    "sim": _twin,
    "flow": _flow,
}
ENGINE_NAMES = {"sim": "twin", "flow": "flow-engine"}


def run_point(
    engine: str, topo: str, scale: float, suite: dict[str, Any], scheme: str
) -> list[dict[str, Any]]:
    """One run (a Dask task): the suite's scenarios under `scheme` on `engine`; summaries."""
    spec = parse_choice(topo)
    cfg = SuiteConfig(**{**suite, "schemes": (scheme,), "scenarios": tuple(suite["scenarios"])})
    scaling = Scaling(scale=scale, max_hops=spec.longest_path_switches())
    return [r.summary() for r in ENGINES[engine](spec, scaling, cfg).run()]


def parse_param(text: str | None) -> tuple[str, list[Any]]:
    if not text:
        return "", [None]
    name, _, values = text.partition("=")
    if not values:
        raise ValueError("--param NAME=V1,V2,...: a suite parameter and its values")
    return name, [suite_param(name, v) for v in values.split(",") if v]


def aggregate(points: list[dict[str, Any]]) -> dict[tuple[Any, str, str], dict[str, Any]]:
    """Per (value, scenario, scheme): each metric's median, min and max over the seeds."""
    cells: dict[tuple[Any, str, str], list[dict[str, Any]]] = {}
    for p in points:
        for run in p["runs"]:
            cells.setdefault((p["value"], run["scenario"], run["scheme"]), []).append(run)
    out = {}
    for key, runs in cells.items():
        agg: dict[str, Any] = {"seeds": len(runs)}
        for label, fld, k in METRICS:
            vals = [r[fld] * k for r in runs if r.get(fld) is not None]
            if vals:
                agg[label] = (statistics.median(vals), min(vals), max(vals))
        out[key] = agg
    return out


def table(param: str, cells: dict[tuple[Any, str, str], dict[str, Any]]) -> str:
    head = f"{param or '-':<14} {'scenario':<10} {'scheme':<6} {'n':>2} " + " ".join(
        f"{label:>24}" for label, _, _ in METRICS
    )
    lines = [
        head,
        f"{'':<14} {'':<10} {'':<6} {'':>2} "
        + " ".join(f"{'median [min-max]':>24}" for _ in METRICS),
        "-" * len(head),
    ]
    for (value, scenario, scheme), agg in sorted(
        cells.items(), key=lambda kv: tuple(map(str, kv[0]))
    ):
        parts = []
        for label, _, _ in METRICS:
            m = agg.get(label)
            parts.append(
                f"{'-':>24}" if m is None else f"{f'{m[0]:.4g} [{m[1]:.4g}-{m[2]:.4g}]':>24}"
            )
        lines.append(
            f"{'-' if value is None else value!s:<14} {scenario:<10} {scheme:<6} "
            f"{agg['seeds']:>2} " + " ".join(parts)
        )
    return "\n".join(lines)


def build_parser(sub: Any) -> None:
    sw = sub.add_parser("sweep", help="a grid of runs on Dask: median and min-max")
    sw.add_argument(
        "--engine",
        choices=sorted(ENGINES),
        default="sim",
        help="the engine (default: the twin; flow: the flow-level engine, allreduce and "
        "alltoall, calibrated schemes)",
    )
    sw.add_argument("--topo", default="leafspine:2,2,4")
    sw.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="model speed / simulated speed (default 1: the model's own speed)",
    )
    sw.add_argument("--schemes", default="dcqcn,tita")
    sw.add_argument("--scenarios", default="incast,websearch")
    sw.add_argument("--param", help="NAME=V1,V2,...: a SuiteConfig field to sweep")
    sw.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default 1,2,3)")
    sw.add_argument("--quick", action="store_true", help="the short suite's sizes")
    sw.add_argument("--scheduler", help="a Dask scheduler's address (default: a LocalCluster)")
    sw.add_argument(
        "--workers", type=int, default=0, help="LocalCluster workers (default: one per core)"
    )
    sw.add_argument("--run-dir", type=Path, help="where sweep.json goes (default runs/<ts>-sweep)")


def cmd_sweep(args: argparse.Namespace) -> int:
    from testbed.errors import require

    require("dask.distributed", "the sweep")
    from dask.distributed import Client, LocalCluster, as_completed

    schemes = [s for s in args.schemes.split(",") if s]
    bad = [s for s in schemes if s not in SCHEMES]
    if bad:
        raise ValueError(f"unknown scheme(s) {bad}")
    param, values = parse_param(args.param)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    scenarios = [s for s in args.scenarios.split(",") if s]
    if args.engine == "flow":  # what the flow engine cannot run is refused before the grid
        from testbed.flow import calibration
        from testbed.flow.suite import FLOW_SCENARIOS

        if any(s not in FLOW_SCENARIOS for s in scenarios):
            raise ValueError(
                f"--engine flow runs {', '.join(FLOW_SCENARIOS)}, not --scenarios {args.scenarios}"
            )
        for scheme in schemes:
            for scenario in scenarios:
                calibration.require(scheme, scenario)
    base = SuiteConfig.quick() if args.quick else SuiteConfig()
    grid = []
    for value in values:
        for seed in seeds:
            suite = {**base.__dict__, "scenarios": scenarios, "seed": seed}
            if param:
                suite[param] = value
            for scheme in schemes:
                grid.append((value, seed, scheme, suite))
    t0 = time.monotonic()
    cluster = None
    if args.scheduler:
        client = Client(args.scheduler)
    else:
        import os

        n = args.workers or os.cpu_count() or 1
        cluster = LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None
        )
        client = Client(cluster)
    try:
        print(
            f"sweep: {len(grid)} {ENGINE_NAMES[args.engine]} runs on "
            f"{client.scheduler_info()['address']} "
            f"({len(client.scheduler_info()['workers'])} workers)",
            file=sys.stderr,
        )
        futures = [
            client.submit(run_point, args.engine, args.topo, args.scale, suite, scheme, pure=False)
            for _, _, scheme, suite in grid
        ]
        which = {f.key: i for i, f in enumerate(futures)}
        for done, fut in enumerate(as_completed(futures), 1):  # a line as each run ends
            value, seed, scheme, _ = grid[which[fut.key]]
            what = f"{param}={value} " if param else ""
            print(
                f"[{time.monotonic() - t0:6.1f}s] [{done}/{len(grid)}] {what}seed {seed} "
                f"{scheme}: {'failed' if fut.status == 'error' else 'done'}",
                file=sys.stderr,
                flush=True,
            )
        results = client.gather(futures)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    points = [
        {"value": v, "seed": seed, "scheme": scheme, "runs": runs}
        for (v, seed, scheme, _), runs in zip(grid, results, strict=True)
    ]
    cells = aggregate(points)
    run_dir = args.run_dir or new_run_dir("sweep")
    run_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        **provenance(getattr(args, "command", None)),
        "engine": args.engine,
        "topology": args.topo,
        "scale": args.scale if args.engine != "flow" else 1.0,
        "param": param,
        "values": values,
        "seeds": seeds,
        "schemes": schemes,
        "points": points,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    (run_dir / "sweep.json").write_text(json.dumps(doc, indent=1) + "\n")
    where = "flow engine (400G)" if args.engine == "flow" else f"twin at scale 1/{args.scale:g}"
    print(f"{args.topo}, {where}; {len(seeds)} seeds per cell")
    print(table(param, cells))
    print(f"sweep.json: {run_dir / 'sweep.json'}; {doc['wall_s']} s")
    return 0
