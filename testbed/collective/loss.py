"""Loss sensitivity: random loss on every link of the fabric under a ring all-reduce and a
training iteration, with go-back-N and with selective repeat (the transport's `retransmit`).

    xingmai-testbed loss-sweep --engine sim --losses 0,0.01%,0.1%,1% --seeds 1,2,3
    xingmai-testbed loss-sweep --engine emu --losses 0,0.1%,1% --seeds 1,2,3 --workloads allreduce

The loss is the project's fault mechanism (testbed/faults.py): one `link ... loss P` fault per
link of the topology, which the engine sets on the switches' traffic managers (the twin
directly, the emulation through SwitchAdmin's SetFault): a frame a switch port receives is
corrupted with probability P and dropped (a receive error). A link fault sets both ends that
are switch ports, so every switch-to-switch hop draws once per direction, and a host's link
draws once, where the switch receives (a host's NIC has no traffic manager). On the rail
topology a ring all-reduce's traffic stays on its rail: host -> rail leaf -> host, one draw per
packet, data and feedback alike: P is the packet loss rate of the path.

Workloads (per point, `iters` iterations after `warmup` ones):
- `allreduce`: the ring all-reduce of `size` bytes per rank back to back, nccl-tests' busbw;
- `training`: each iteration computes for `compute` (default: the all-reduce's time at line
  rate, so that a lossless iteration is about half communication), then all-reduces; the
  iteration time and the GPUs' utilization (compute / iteration time) against the lossless.

On the twin every point is its own run (a fresh fabric with the point's seed: the switches'
loss draws and ECN draws are seeded from it), so a point repeats exactly; `--workers`
runs points in parallel processes. On the emulation one testbed runs every point, and a seed
is a repeat (the kernel's timing makes each differ). Results: loss.json, loss.csv and a plot.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from testbed import faults
from testbed.collective.metrics import parse_size, summarize
from testbed.collective.run import CollFabric, job_spec
from testbed.topo import FabricSpec
from testbed.traffic.runner import RunError

DEFAULT_LOSSES = "0,0.01%,0.1%,1%"
WORKLOADS = ("allreduce", "training")
RETRANSMITS = ("gbn", "sr")


def fabric_loss_faults(spec: FabricSpec, loss: float) -> list[faults.Fault]:
    """A `loss` fault on every link, each named by one of its switch ends."""
    out = []
    for lk in spec.links:
        end = lk.a if spec.is_switch(lk.a.node) else lk.b
        out.append(faults.make(spec, f"{end.node}:{end.index}", "loss", loss))
    return out


def set_fabric_loss(fab: CollFabric, spec: FabricSpec, loss: float) -> None:
    for f in fabric_loss_faults(spec, loss):
        fab.apply_fault(f)


@dataclasses.dataclass(frozen=True)
class Point:
    workload: str  # allreduce or training
    loss: float  # per link, as a fraction
    retransmit: str  # gbn or sr
    seed: int


def default_compute(fab: CollFabric, size: int) -> float:
    """The ring all-reduce's time at line rate on the engine (seconds): 2(n-1)/n x size over
    the host's K NICs."""
    n = len(fab.hosts)
    return 2 * (n - 1) / n * size * 8 / (fab.nics * fab.line_rate)


def run_point(
    fab: CollFabric,
    spec: FabricSpec,
    p: Point,
    *,
    size: int,
    chunk: int,
    iters: int,
    warmup: int,
) -> dict[str, Any]:
    """One point: the fabric's links at `p.loss`, the workload, the links healed."""
    fab = dataclasses.replace(fab, transport=dict(fab.transport, retransmit=p.retransmit))
    compute = default_compute(fab, size) if p.workload == "training" else 0.0
    job = job_spec(
        fab,
        collective="allreduce",
        algorithm="ring",
        size=size,
        chunk=chunk,
        schedule="static",
        iters=iters + warmup,
        compute=compute,
    )
    row: dict[str, Any] = {**dataclasses.asdict(p), "size": size, "completed": False}
    fab.fresh()
    set_fabric_loss(fab, spec, p.loss)
    try:
        out = fab.runner(fab.hosts, job)
    except RunError as exc:
        row["error"] = str(exc)
        return row
    finally:
        set_fabric_loss(fab, spec, 0.0)
    k = fab.scaling.scale
    figs = summarize(out.results, fab.line_rate, fab.nics, k, warmup)
    ends = [max(r["iter_end"][i] for r in out.results) for i in range(iters + warmup)]
    starts = [0.0, *ends[:-1]]
    per_iter = [(b - a) / k for a, b in zip(starts, ends, strict=True)][warmup:]
    tx = sum(int(c.get("tx_packets", 0)) for c in out.counters)
    resent = sum(int(c.get("retransmits", 0)) for c in out.counters)
    row.update(
        completed=True,
        correct=figs["correct"],
        busbw_Bps=figs["busbw_Bps"],
        coll_s=figs["time_s"],
        iter_s=statistics.fmean(per_iter),
        compute_s=compute / k,
        tx_packets=tx,
        retransmits=resent,
        timeouts=sum(int(c.get("timeouts", 0)) for c in out.counters),
        naks=sum(int(c.get("naks_received", 0)) for c in out.counters),
        resent_share=resent / tx if tx else 0.0,
    )
    return row


def parse_losses(text: str) -> list[float]:
    out = []
    for word in text.split(","):
        word = word.strip()
        v = faults.parse_value("loss", 0.0 if word in ("0", "0%") else word)
        assert v is not None
        out.append(v)
    return out


def points(args: argparse.Namespace) -> list[Point]:
    workloads = [w for w in args.workloads.split(",") if w]
    retransmits = [r for r in args.retransmits.split(",") if r]
    for w in workloads:
        if w not in WORKLOADS:
            raise ValueError(f"workload {w!r}: one of {', '.join(WORKLOADS)}")
    for r in retransmits:
        if r not in RETRANSMITS:
            raise ValueError(f"retransmit {r!r}: one of {', '.join(RETRANSMITS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    return [
        Point(w, loss, r, seed)
        for seed in seeds
        for w in workloads
        for r in retransmits
        for loss in parse_losses(args.losses)
    ]


# ---- running on an engine -------------------------------------------------------------


def _suite_args(args: argparse.Namespace, seed: int) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "seed": seed, "retransmit": "gbn"})


# testbed.collective_cli.open_suite: a prepared suite and its collective fabric
OpenSuite = Callable[[argparse.Namespace], AbstractContextManager[Any]]


def _run(
    args: argparse.Namespace, pts: list[Point], open_suite: OpenSuite, say: Callable[[str], None]
) -> list[Any]:
    """`pts` on one suite (one fabric) of the engine, in order."""
    rows = []
    with open_suite(_suite_args(args, pts[0].seed)) as (suite, fab):
        for p in pts:
            row = run_point(
                fab,
                suite.spec,
                p,
                size=parse_size(args.size),
                chunk=parse_size(args.chunk),
                iters=args.iters,
                warmup=args.warmup,
            )
            say(one_line(row))
            rows.append(row)
    return rows


def _twin_point(args: argparse.Namespace, p: Point, open_suite: OpenSuite) -> dict[str, Any]:
    row: dict[str, Any] = _run(args, [p], open_suite, lambda line: None)[0]
    return row


def run_sweep(
    args: argparse.Namespace, open_suite: OpenSuite, say: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    pts = points(args)
    if args.engine == "emu":
        return _run(args, pts, open_suite, say)
    if args.workers <= 1:
        rows = []
        for p in pts:
            rows.append(_twin_point(args, p, open_suite))
            say(one_line(rows[-1]))
        return rows
    n = len(pts)
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(_twin_point, [args] * n, pts, [open_suite] * n))
    for r in rows:
        say(one_line(r))
    return rows


# ---- summarising ----------------------------------------------------------------------


def one_line(r: dict[str, Any]) -> str:
    head = f"{r['workload']} {r['retransmit']} loss {r['loss'] * 100:g}% seed {r['seed']}"
    if not r["completed"]:
        return f"{head}: did not complete ({r.get('error', '')})"
    return (
        f"{head}: busbw {r['busbw_Bps'] / 1e9:.1f} GB/s, iteration {r['iter_s'] * 1e6:.1f} us, "
        f"{r['retransmits']} resent ({r['resent_share']:.1%}), {r['timeouts']} timeouts"
        f"{'' if r['correct'] else ', WRONG'}"
    )


def _stats(values: Iterable[float]) -> dict[str, float]:
    v = list(values)
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (workload, retransmit, loss): median, min and max over the seeds of busbw,
    iteration time and the share resent; for training, the GPUs' utilization and the share
    of compute lost against the same scheme's lossless median."""
    cells: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["workload"], r["retransmit"], r["loss"]), []).append(r)
    out = []
    for (w, rt, loss), rs in sorted(cells.items()):
        done = [r for r in rs if r["completed"]]
        cell: dict[str, Any] = {
            "workload": w,
            "retransmit": rt,
            "loss": loss,
            "runs": len(rs),
            "completed": len(done),
            "correct": all(r.get("correct") for r in done),
        }
        if done:
            cell["busbw_Bps"] = _stats(r["busbw_Bps"] for r in done)
            cell["iter_s"] = _stats(r["iter_s"] for r in done)
            cell["resent_share"] = _stats(r["resent_share"] for r in done)
            cell["timeouts"] = _stats(r["timeouts"] for r in done)
            if w == "training":
                cell["utilization"] = _stats(r["compute_s"] / r["iter_s"] for r in done)
        out.append(cell)
    for cell in out:
        base = next(
            (
                c
                for c in out
                if (c["workload"], c["retransmit"], c["loss"])
                == (cell["workload"], cell["retransmit"], 0.0)
                and "iter_s" in c
            ),
            None,
        )
        if base is not None and "iter_s" in cell:
            cell["slowdown"] = cell["iter_s"]["median"] / base["iter_s"]["median"]
            cell["compute_lost"] = 1 - base["iter_s"]["median"] / cell["iter_s"]["median"]
    return out


def table(cells: list[dict[str, Any]], note: str = "") -> str:
    lines = [f"# {note}"] if note else []
    lines.append(
        f"{'workload':<10} {'retx':<4} {'loss':>6} {'busbw GB/s (min-max)':>22} "
        f"{'iteration us (min-max)':>24} {'slowdown':>8} {'lost':>6} {'util':>5} "
        f"{'resent':>7} {'RTOs':>5} {'ok':>3}"
    )
    for c in cells:
        if "iter_s" not in c:
            lines.append(
                f"{c['workload']:<10} {c['retransmit']:<4} {c['loss'] * 100:>5g}% "
                f"did not complete ({c['completed']}/{c['runs']})"
            )
            continue
        b, t = c["busbw_Bps"], c["iter_s"]
        util = f"{c['utilization']['median']:.0%}" if "utilization" in c else ""
        lines.append(
            f"{c['workload']:<10} {c['retransmit']:<4} {c['loss'] * 100:>5g}% "
            f"{b['median'] / 1e9:>8.1f} ({b['min'] / 1e9:5.1f}-{b['max'] / 1e9:5.1f}) "
            f"{t['median'] * 1e6:>10.1f} ({t['min'] * 1e6:5.1f}-{t['max'] * 1e6:5.1f}) "
            f"{c.get('slowdown', float('nan')):>8.2f} {c.get('compute_lost', 0.0):>6.0%} "
            f"{util:>5} {c['resent_share']['median']:>7.1%} {c['timeouts']['median']:>5g} "
            f"{'y' if c['correct'] and c['completed'] == c['runs'] else 'n':>3}"
        )
    return "\n".join(lines)


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    keys = [
        "workload",
        "retransmit",
        "loss",
        "seed",
        "completed",
        "correct",
        "busbw_Bps",
        "coll_s",
        "iter_s",
        "compute_s",
        "tx_packets",
        "retransmits",
        "timeouts",
        "naks",
        "resent_share",
    ]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


# ---- the command (testbed.collective_cli) ----------------------------------------------


def add_arguments(ls: argparse.ArgumentParser) -> None:
    ls.set_defaults(scheme="dcqcn")  # RoCE as deployed: DCQCN, RC go-back-N
    ls.add_argument(
        "--losses",
        default=DEFAULT_LOSSES,
        help=f"per link (default {DEFAULT_LOSSES.replace('%', '%%')})",  # argparse's % escaped
    )
    ls.add_argument("--retransmits", default="gbn,sr", help="of gbn,sr (default both)")
    ls.add_argument("--workloads", default="allreduce,training", help="of allreduce,training")
    ls.add_argument("--seeds", default="1,2,3", help="twin: seeds; emulation: repeats")
    ls.add_argument("--size", default="4M", help="all-reduce bytes per rank (default 4M)")
    ls.add_argument("--chunk", default="256K")
    ls.add_argument("--iters", type=int, default=4)
    ls.add_argument("--warmup", type=int, default=1)
    ls.add_argument("--workers", type=int, default=1, help="twin: points run in parallel")
    ls.add_argument("--plot", type=Path, help="the plot's path (default: in the run dir)")


def note(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    engine = "twin at 1/1" if args.engine == "sim" else "emulation"
    if args.scale is not None:
        engine = f"{engine.split(' ')[0]} at 1/{args.scale:g}"
    repeats = "seeds" if args.engine == "sim" else "repeats"
    return (
        f"{args.topo}, {engine}, scheme {args.scheme}, ring all-reduce {args.size} per rank, "
        f"{args.iters} iterations; loss per link; {len({r['seed'] for r in rows})} {repeats}"
    )


def write(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    out: Path,
    provenance: dict[str, object] | None = None,
) -> str:
    """loss.json (the run's provenance, rows and summary), loss.csv (rows), loss.txt (the
    table); the table."""
    cells = summary(rows)
    text = table(cells, note(args, rows))
    doc = {
        **(provenance or {}),
        "note": note(args, rows),
        "args": {k: str(v) for k, v in vars(args).items()},
        "rows": rows,
        "summary": cells,
    }
    (out / "loss.json").write_text(json.dumps(doc, indent=1))
    write_csv(rows, out / "loss.csv")
    (out / "loss.txt").write_text(text + "\n")
    return text
