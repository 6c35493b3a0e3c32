"""`make bench`: run every component's benchmark and write one results file.

Each benchmark is a module under `testbed.benchmarks` with a function
`run(quick: bool) -> dict` returning JSON-serialisable figures (and the conditions they were
measured under). The machine is shared and noisy: benchmarks compare ratios measured in the
same run rather than absolute timings against fixed thresholds.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from testbed.experiment.machine import machine_description, source_description

# Benchmark modules, in the order they run. Add a component's module here.
BENCHMARKS: tuple[str, ...] = (
    "switch",
    "transport",
    "collector",
    "nic",
    "cpu",
    "scenarios",
    "emu_allreduce",
    "twin",
    "twin_pipelines",
    "ns3",
    "localization",
    "flow_scale",
)
# Run only when named (--only): they take tens of minutes.
OPT_IN: tuple[str, ...] = ("twin_scale",)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench.json", help="results file (JSON)")
    ap.add_argument("--only", action="append", default=[], help="run only these benchmarks")
    ap.add_argument("--quick", action="store_true", help="shorter runs (smoke test)")
    args = ap.parse_args(argv)

    unknown = set(args.only) - set(BENCHMARKS) - set(OPT_IN)
    if unknown:
        ap.error(f"unknown benchmark(s) {sorted(unknown)}: {', '.join(BENCHMARKS + OPT_IN)}")
    names = [
        n for n in BENCHMARKS + OPT_IN if n in args.only or (not args.only and n in BENCHMARKS)
    ]
    out_path = Path(args.out)
    results: dict[str, object] = {}
    if out_path.exists() and args.only:
        # Keep the figures of benchmarks not re-run this time.
        results = json.loads(out_path.read_text()).get("benchmarks", {})
    failed = []
    for name in names:
        print(f"== bench {name}", flush=True)
        t0 = time.monotonic()
        try:
            mod = importlib.import_module(f"testbed.benchmarks.{name}")
            fig = mod.run(quick=args.quick)
            fig["elapsed_s"] = round(time.monotonic() - t0, 1)
            results[name] = fig
            print(json.dumps(fig, indent=2), flush=True)
        except Exception as exc:  # a failed benchmark is reported, the others still run
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            failed.append(name)
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_description(),
        "source": source_description(),  # the commit the figures are of
        "benchmarks": results,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"results written to {out_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
