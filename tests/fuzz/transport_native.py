"""Differential fuzzing: the native transport core against its Python reference.

    python -m tests.fuzz.transport_native --seeds 200 [--steps 3000] --out FILE.json

Per configuration of tests/transport_differential.py (CONFIGS: small and large MTUs and
windows, every ACK or every fourth, a short PSN window and message limit, no INT, the NIC as
INT sink), `--seeds` generated sequences through a pair of reference cores and a pair of native
ones, whose logs (every packet, counter, drop, deadline, message, completion and report after
every step) must be equal. The counts and each divergence go to the JSON file; the exit status
is 1 on any. `make fuzz` runs it plain and again with the C built with AddressSanitizer and
UBSan (XINGMAI_NATIVE_SANITIZE), where a memory error or undefined behaviour ends the process
with the sanitizer's report.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from testbed.traffic.transport_native import library
from tests.fuzz.harness import write_report
from tests.transport_differential import CONFIGS, drive, first_difference


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.transport_native", description=__doc__)
    ap.add_argument("--seeds", type=int, default=200, help="sequences per configuration")
    ap.add_argument("--steps", type=int, default=3000, help="steps per sequence")
    ap.add_argument("--first-seed", type=int, default=1000, help="the seeds' start")
    ap.add_argument("--out", type=Path, default=Path("results/fuzz-transport.json"))
    args = ap.parse_args(argv)
    library()  # builds here, or says why not
    t0 = time.monotonic()
    configs: list[dict[str, Any]] = []
    clean = True
    for cfg in CONFIGS:
        res: dict[str, Any] = {"config": cfg, "runs": 0, "packets": 0, "divergences": []}
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            ref = drive(False, seed, args.steps, **cfg)
            nat = drive(True, seed, args.steps, **cfg)
            if ref != nat:
                res["divergences"].append(f"seed {seed}: " + first_difference(ref, nat))
            res["runs"] += 1
            res["packets"] += sum(1 for e in ref if e[0] in ("data", "fb"))
        clean &= not res["divergences"]
        configs.append(res)
        print(
            f"mtu {cfg['mtu']} window {cfg['window']}: {res['runs']} runs, "
            f"{res['packets']} packets, {len(res['divergences'])} divergences",
            flush=True,
        )
    write_report(
        args.out,
        {
            "seeds": args.seeds,
            "steps_per_run": args.steps,
            "seconds": round(time.monotonic() - t0, 1),
            "configs": configs,
        },
    )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
