"""Differential fuzzing: the twin's native NIC programs against their Python references.

    python -m tests.fuzz.nic --seeds 100 [--frames 1000] --out results/fuzz-nic.json

Per law, `--seeds` runs of XDP's laws (tests/nic_differential.py `drive_laws`: generated
feedback, every rate and law state compared after every frame) and, for TiTa, TIMELY and
DCQCN, of tc egress with feedback between its frames (`drive_tc`: every frame tc sends and
every flow's counters compared). The counts and each divergence go to the JSON file; the exit
status is 1 on any. `make fuzz` runs it plain and again with the programs built with
AddressSanitizer and UBSan (XINGMAI_NATIVE_SANITIZE, testbed/switch/native/build.py), where a
memory error or undefined behaviour ends the process with the sanitizer's report.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from controller.nic.ratelaw import Law
from testbed.sim.nic_native import library
from tests.fuzz.harness import write_report
from tests.nic_differential import drive_laws, drive_tc

TC_LAWS = (Law.TITA, Law.TIMELY, Law.DCQCN)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.nic", description=__doc__)
    ap.add_argument("--seeds", type=int, default=100, help="runs per law and program")
    ap.add_argument("--frames", type=int, default=1000, help="frames per run")
    ap.add_argument("--first-seed", type=int, default=1000, help="the seeds' start")
    ap.add_argument("--out", type=Path, default=Path("results/fuzz-nic.json"))
    args = ap.parse_args(argv)
    library()  # builds here, or says why not
    t0 = time.monotonic()
    report: dict[str, Any] = {"laws": {}, "tc": {}}
    clean = True
    for program, laws, drive in (
        ("laws", [law for law in Law if law != Law.NONE], drive_laws),
        ("tc", list(TC_LAWS), drive_tc),
    ):
        for law in laws:
            res: dict[str, Any] = {"runs": 0, "frames": 0, "exercised": 0, "divergences": []}
            started = time.monotonic()
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                try:
                    res["exercised"] += drive(law, seed, args.frames)
                except AssertionError as exc:
                    res["divergences"].append(f"seed {seed}: {exc}".splitlines()[0])
                res["runs"] += 1
                res["frames"] += args.frames
            res["seconds"] = round(time.monotonic() - started, 1)
            clean &= not res["divergences"]
            report[program][law.name.lower()] = res
            print(
                f"{program} {law.name.lower()}: {res['runs']} runs, {res['frames']} frames, "
                f"{len(res['divergences'])} divergences, {res['seconds']:.0f} s",
                flush=True,
            )
    write_report(
        args.out,
        {
            "seeds": args.seeds,
            "frames_per_run": args.frames,
            "seconds": round(time.monotonic() - t0, 1),
            **report,
        },
    )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
