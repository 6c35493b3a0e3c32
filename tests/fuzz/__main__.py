"""make fuzz: every surface, N cases each, counts to a JSON file.

python -m tests.fuzz --cases 10000 --out results/fuzz.json [--surface NAME ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from tests.fuzz.surfaces import SURFACES, unavailable


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    ap.add_argument("--cases", type=int, default=10_000, help="cases per surface")
    ap.add_argument("--out", type=Path, default=Path("results/fuzz.json"))
    ap.add_argument(
        "--surface",
        action="append",
        choices=sorted(SURFACES),
        help="only these surfaces (repeatable)",
    )
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument(
        "--merge", action="store_true", help="keep the other surfaces' results already in --out"
    )
    args = ap.parse_args(argv)
    from tests.fuzz.harness import run

    results: dict[str, object] = {}
    if args.merge and args.out.exists():
        results.update(json.loads(args.out.read_text()).get("surfaces", {}))
    clean = True
    for name in args.surface or list(SURFACES):
        why = unavailable(name)
        if why:
            print(f"{name}: skipped ({why})", flush=True)
            results[name] = {"skipped": why}
            continue
        res = run(SURFACES[name](), args.cases, args.seed)
        clean &= res.clean
        results[name] = res.as_dict()
        print(
            f"{name}: {res.cases} cases, {res.crashes} crashes, {res.hangs} hangs, "
            f"growth {res.growth or 'none'}, {res.seconds:.0f} s",
            flush=True,
        )
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "cases_per_surface": args.cases,
        "seed": args.seed,
        "surfaces": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
