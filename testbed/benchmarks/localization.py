"""Fault localization on the twin: a set of faults, each injected 0.5 s into a WebSearch mix
per scheme, and whether the controller's localizer named the faulty element first, how long
after the injection (emulated seconds), and the fail-over time of dead links and switches.

    python -m testbed.benchmarks.localization [--quick] [--json OUT]

`run(quick)` is also `make bench`'s entry (the quick set there). Deterministic: the same
faults and seeds give the same figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from testbed import faults
from testbed.experiment.suite import SuiteConfig
from testbed.model import Scaling
from testbed.sim.fabric import SimFabric
from testbed.sim.suite import SimSuite
from testbed.topo import leafspine

AT_S = 0.5
# (fault, the element that must be named first, its kind)
FAULTS = [
    ("link leaf1:5 down", "link leaf1:5-spine1:1", "link-down"),
    ("link leaf2:6 down", "link leaf2:6-spine2:2", "link-down"),
    ("link leaf1:5 loss 1%", "link leaf1:5-spine1:1", "lossy-link"),
    ("link leaf2:5 loss 1%", "link leaf2:5-spine1:2", "lossy-link"),
    ("link leaf1:6 rate 25%", "link leaf1:6-spine2:1", "slow-link"),
    ("link leaf2:5 rate 25%", "link leaf2:5-spine1:2", "slow-link"),
    ("link leaf1:5 delay 2ms", "link leaf1:5-spine1:1", "slow-link"),
    ("switch spine1 slow 5ms", "switch spine1", "slow-switch"),
    ("switch spine2 slow 5ms", "switch spine2", "slow-switch"),
    ("switch spine1 kill", "switch spine1", "switch-unreachable"),
    ("switch spine2 kill", "switch spine2", "switch-unreachable"),
]
SCHEMES = ("none", "dcqcn", "tita")


def one(spec: Any, scheme: str, line: str | None) -> dict[str, Any]:
    fab = SimFabric(spec, Scaling(max_hops=spec.longest_path_switches()))
    cfg = SuiteConfig(
        **{
            **SuiteConfig.quick().__dict__,
            "schemes": (scheme,),
            "scenarios": ("websearch",),
            "websearch_seconds": 4.0,
        }
    )
    suite = SimSuite(fab, cfg)
    if line is not None:
        f = faults.parse_command(spec, line)
        suite.faults = [faults.Fault(f.target, f.kind, f.value, AT_S)]
    [rec] = suite.run()
    return {
        "scheme": scheme,
        "fault": line,
        "suspects": rec.suspects,
        "failovers": rec.failovers,
        "flows": rec.flows,
        "flows_completed": rec.flows_completed,
        "completion_s": rec.completion_s,
    }


def run(quick: bool = True, schemes: tuple[str, ...] | None = None) -> dict[str, Any]:
    spec = leafspine(2, 2, 4)
    schemes = schemes or (("tita",) if quick else SCHEMES)
    cases = FAULTS[::3] if quick else FAULTS
    out: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for scheme in schemes:
        healthy = one(spec, scheme, None)
        healthy["false_suspects"] = [s["element"] for s in healthy["suspects"]]
        out.append(healthy)
        for line, element, kind in cases:
            r = one(spec, scheme, line)
            top = r["suspects"][0] if r["suspects"] else None
            r["expected"] = element
            r["localized"] = top is not None and (top["element"], top["kind"]) == (element, kind)
            r["time_s"] = round(top["first_named"] - AT_S, 3) if top and r["localized"] else None
            r["other_suspects"] = [s["element"] for s in r["suspects"][1:]]
            if kind in ("link-down", "switch-unreachable") and r["failovers"]:
                r["failover_s"] = round(r["failovers"][0]["t"] - AT_S, 3)
            out.append(r)
            print(
                f"{scheme:6} {line:26} -> {top['element'] if top else '-':24} "
                f"{'ok' if r['localized'] else 'MISSED':6} "
                f"{r['time_s'] if r['time_s'] is not None else '-'} s",
                file=sys.stderr,
                flush=True,
            )
    tried = [r for r in out if r["fault"] is not None]
    hit = [r for r in tried if r["localized"]]
    times = [r["time_s"] for r in hit]
    fo = [r["failover_s"] for r in tried if "failover_s" in r]
    return {
        "engine": "sim",
        "topology": spec.name,
        "at_s": AT_S,
        "workload": "websearch",
        "tried": len(tried),
        "localized": len(hit),
        "missed": [(r["scheme"], r["fault"]) for r in tried if not r["localized"]],
        "time_s": {"median": statistics.median(times), "max": max(times), "min": min(times)}
        if times
        else None,
        "failover_s": {"median": statistics.median(fo), "max": max(fo)} if fo else None,
        "healthy_false_suspects": sum(len(r["false_suspects"]) for r in out if r["fault"] is None),
        "runs": out,
        "wall_s": round(time.monotonic() - t0, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    args = ap.parse_args()
    res = run(args.quick, tuple(s for s in args.schemes.split(",") if s))
    summary = {k: v for k, v in res.items() if k != "runs"}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
