"""The flow engine's commands:

xingmai-testbed fabric --gpus 131072 --tiers 3 --rail      # switches, links, bisection
xingmai-testbed fabric --gpus 64 --radix 8 --dump > f.yaml  # for the packet engines
xingmai-testbed flow-iteration --gpus 131072 --tiers 3     # DP ring + EP all-to-all
xingmai-testbed flow-workload workload.txt --tiers 3        # a SimAI/AICB workload file
xingmai-testbed calibrate-flow --scheme tita               # fit on the twin (free, congested)
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from testbed.collective.metrics import fmt_size
from testbed.experiment.machine import provenance
from testbed.experiment.rundir import new_run_dir
from testbed.faults import parse_value
from testbed.flow import calibration, lossfit
from testbed.flow.collectives import (
    CollResult,
    alltoall,
    ep_groups,
    flat_ring,
    hier_allreduce,
    model_link_latency,
    rail_rings,
    ring_allreduce,
)
from testbed.flow.fabric import ClosParams, build_clos, describe, fail, lose, slow, to_spec
from testbed.flow.report import LinkLoad, collective_rows, link_load, load_lines
from testbed.topo import dump

DP_ALGOS = {
    "rails": "a DP group per rail (GPU g of every server), one ring each",
    "hier": "every GPU in one DP group, the library's hierarchical all-reduce (scale-up, "
    "then a ring per rail on GPU g's shard: TCCL's channel per NIC rail)",
    "flat": "every GPU in one DP group, one ring through every GPU server by server (one channel)",
}


def _fabric_args(ap: argparse.ArgumentParser, gpus_help: str | None = None) -> None:
    if gpus_help is None:
        ap.add_argument("--gpus", type=int, required=True)
    else:
        ap.add_argument("--gpus", type=int, help=gpus_help)
    ap.add_argument("--gpus-per-server", type=int, default=8)
    ap.add_argument("--tiers", type=int, default=2, choices=[2, 3])
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument(
        "--rail",
        dest="rail",
        action="store_true",
        default=True,
        help="rail-optimized multi-plane: NIC g of every server on plane g (default)",
    )
    kind.add_argument(
        "--clos", dest="rail", action="store_false", help="plain Clos: a server's NICs on one leaf"
    )
    ap.add_argument("--oversub", type=float, default=1.0, help="leaf downlinks : uplinks")
    ap.add_argument("--radix", type=int, default=128, help="switch ports (51.2T: 128 x 400G)")
    ap.add_argument("--port-gbps", type=float, default=400.0)
    ap.add_argument("--switch-tbps", type=float, default=51.2)
    ap.add_argument("--nic-gbps", type=float, default=400.0)
    ap.add_argument(
        "--scaleup-gbytes",
        type=float,
        default=ClosParams.scaleup_gbytes,
        help="scale-up bandwidth per GPU, GB/s both directions (default NVLink 4's "
        f"{ClosParams.scaleup_gbytes:g})",
    )


def _params(args: argparse.Namespace) -> ClosParams:
    return ClosParams(
        gpus=args.gpus,
        gpus_per_server=args.gpus_per_server,
        tiers=args.tiers,
        rail=args.rail,
        oversub=args.oversub,
        radix=args.radix,
        port_gbps=args.port_gbps,
        switch_tbps=args.switch_tbps,
        nic_gbps=args.nic_gbps,
        scaleup_gbytes=args.scaleup_gbytes,
    )


def add_parsers(sub: Any) -> None:
    fab = sub.add_parser(
        "fabric",
        help="a deployed Clos from a few parameters: switches, "
        "links, bisection (the flow engine's fabric)",
    )
    _fabric_args(fab)
    fab.add_argument(
        "--dump",
        action="store_true",
        help="as the topology YAML the packet engines take (small fabrics)",
    )
    it = sub.add_parser(
        "flow-iteration",
        help="one training iteration on the flow engine: computation, a DP all-reduce, "
        "an EP all-to-all; nccl-tests' columns, the links' utilisation, a plot",
    )
    _fabric_args(it)
    it.add_argument(
        "--dp-bytes",
        type=float,
        default=float(1 << 30),
        help="all-reduce bytes per GPU (default 1 GiB)",
    )
    it.add_argument(
        "--dp-algo",
        choices=list(DP_ALGOS),
        default="rails",
        help="; ".join(f"{k}: {v}" for k, v in DP_ALGOS.items()),
    )
    it.add_argument(
        "--adaptive",
        action="store_true",
        help="with --dp-algo hier: the library's adaptive schedule, each hop's pieces stolen "
        "between the rails' channels (a slow rail or an ECMP collision carries less)",
    )
    it.add_argument(
        "--ep-bytes",
        type=float,
        default=float(256 << 20),
        help="all-to-all bytes per GPU (default 256 MiB)",
    )
    it.add_argument("--ep-group", type=int, default=64, help="GPUs per all-to-all group")
    it.add_argument(
        "--scheme",
        default=None,
        help="apply this scheme's calibrated efficiencies (default: ideal)",
    )
    it.add_argument(
        "--compare",
        default="",
        metavar="SCHEMES",
        help="comma-separated schemes: the same iteration under each one's calibrated "
        "efficiencies, side by side (computed once; e.g. none,tita,dcqcn+pfc)",
    )
    it.add_argument(
        "--full",
        action="store_true",
        help="compute every ring step, ring and group (no symmetry shortcut)",
    )
    it.add_argument(
        "--fail",
        default="",
        metavar="ELEMENTS",
        help="switches or cables down, comma-separated: a switch by name (p1s3, p1d2a4, "
        "p1c5) or the cables between two (p1l3-p1s2); routed around as the controller's "
        "fail-over does",
    )
    it.add_argument(
        "--slow",
        default="",
        metavar="ELEMENT=FRACTION,...",
        help="links at a fraction of their rate (a gray failure the routes do not see): a "
        "cable between switches (p1l3-p1s2=0.25) or a GPU's NIC link (h5g2=0.5)",
    )
    it.add_argument(
        "--loss",
        default="",
        metavar="ELEMENT=LOSS,...",
        help="links losing a share of their frames (p1l3-p1s2=0.1%%, h5g2=1%%), at the goodput "
        "the --scheme's transport keeps through them (fitted on the twin: calibrate-flow "
        "--part loss)",
    )
    it.add_argument(
        "--spray",
        action="store_true",
        help="every flow split evenly over its equal-cost paths (packet spraying) instead "
        "of one ECMP path per flow",
    )
    it.add_argument(
        "--compute-ms",
        type=float,
        default=0.0,
        help="computation per iteration before its communication (no overlap), ms",
    )
    it.add_argument(
        "--run-dir",
        type=Path,
        help="where iteration.json and iteration.png go (default runs/<time>-flow-iteration; "
        "none with --json unless given)",
    )
    it.add_argument(
        "--json",
        action="store_true",
        help="the figures as one JSON line (no run directory unless --run-dir)",
    )
    wl = sub.add_parser(
        "flow-workload",
        help="a SimAI/AICB workload file (a TP x DP x PP x EP training iteration, layer by "
        "layer) on the flow engine's fabric: the iteration's time, compute and exposed "
        "communication, every collective as nccl-tests rows",
    )
    wl.add_argument("workload", type=Path, help="the workload file (AICB's SimAI format)")
    _fabric_args(wl, gpus_help="the fabric's GPUs (default: the file's all_gpus)")
    wl.add_argument("--scheme", default=None, help="apply this scheme's calibrated efficiencies")
    wl.add_argument("--spray", action="store_true", help="as flow-iteration's")
    wl.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="copies of the job on consecutive GPU ranges, in lockstep (their same "
        "collectives at once: the worst alignment), each also run alone on the same fabric "
        "(default 1)",
    )
    wl.add_argument("--json", action="store_true", help="the figures as one JSON line")
    wl.add_argument(
        "--run-dir",
        type=Path,
        help="where workload.json and workload.png go (default runs/<time>-flow-workload; "
        "none with --json unless given)",
    )
    cal = sub.add_parser(
        "calibrate-flow",
        help="fit a scheme's flow-engine efficiencies on the twin (allreduce, alltoall at 8 "
        "hosts; held-out check at 16): free, and congested at three sizes where the network "
        "holds the collective",
    )
    cal.add_argument(
        "--part",
        choices=["both", "free", "congested", "loss"],
        default="both",
        help="free: the quick sizes on the suite's leaf-spine; congested: three sizes on "
        f"{calibration.CONGESTED_TOPOLOGY}, held out on {calibration.CONGESTED_CHECK_TOPOLOGY}; "
        "loss: the goodput through a lossy link (the all-reduce with one host's link losing "
        f"{', '.join(f'{p * 100:g}%%' for p in lossfit.LOSS_POINTS)}, seeds "
        f"{','.join(map(str, lossfit.LOSS_SEEDS))}, held out at {lossfit.LOSS_CHECK * 100:g}%%; "
        "not part of both) (default both)",
    )
    cal.add_argument("--scheme", required=True)
    cal.add_argument("--hosts", type=int, default=8, help="hosts of the fitting run")
    cal.add_argument(
        "--check-hosts", type=int, default=16, help="hosts of the held-out run (0: none)"
    )
    cal.add_argument(
        "--twin-run",
        type=Path,
        help="use this twin run's results instead of running the twin for the fit",
    )
    cal.add_argument("--check-run", type=Path, help="the same for the held-out check")
    cal.add_argument(
        "--congested-runs",
        help="comma-separated twin runs to fit the congested part on instead of running them",
    )
    cal.add_argument(
        "--congested-check-run", type=Path, help="the same for the congested held-out check"
    )


def cmd_fabric(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    fab = build_clos(_params(args))
    if args.dump:
        print(dump(to_spec(fab)), end="")
        return 0
    print(describe(fab))
    print(f"  built in {time.perf_counter() - t0:.2f} s, peak RSS {_rss_mib():.0f} MiB")
    return 0


def _cuts(text: str, option: str = "--slow", kind: str = "rate") -> dict[str, float]:
    """`--slow p1l3-p1s2=0.25,h5g2=50%` (or `--loss`'s): element -> the fault's value, a
    fraction."""
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        el, eq, val = part.partition("=")
        if not eq or not el:
            raise ValueError(f"{option} {part}: ELEMENT=FRACTION (0.25 or 25%)")
        try:  # as the faults take a rate or a loss: a percentage, or a fraction
            frac = parse_value(kind, val if val.endswith("%") else float(val))
        except ValueError as exc:
            raise ValueError(f"{option} {part}: {exc}") from None
        assert frac is not None  # a rate or a loss always has a value
        out[el] = frac
    return out


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cmd_iteration(args: argparse.Namespace) -> int:
    cpu0, t0 = time.process_time(), time.perf_counter()
    fab = build_clos(_params(args))
    if args.fail:
        fab = fail(fab, [e.strip() for e in args.fail.split(",") if e.strip()])
    if args.slow:
        fab = slow(fab, _cuts(args.slow))
    lossy: dict[str, dict[str, float]] = {}
    for el, p in _cuts(args.loss, "--loss", "loss").items():
        if args.scheme is None or args.compare:
            raise ValueError(
                "--loss: what a lossy link keeps is its scheme's transport's (the twin's fit): "
                "give one --scheme, without --compare"
            )
        lossy[el] = {"loss": p, "goodput": lossfit.goodput(args.scheme, p)}
    if lossy:
        fab = lose(fab, {el: lo["goodput"] for el, lo in lossy.items()})
    t_fab = time.perf_counter() - t0
    sym = not args.full
    lat = model_link_latency()
    if args.adaptive and args.dp_algo != "hier":
        raise ValueError("--adaptive: the hierarchical all-reduce's (--dp-algo hier)")
    if args.dp_algo == "hier":
        ring = hier_allreduce(
            fab,
            args.dp_bytes,
            symmetric=sym,
            spray=args.spray,
            link_latency=lat,
            adaptive=args.adaptive,
        )
    else:
        ring = ring_allreduce(
            fab,
            rail_rings(fab) if args.dp_algo == "rails" else flat_ring(fab),
            args.dp_bytes,
            symmetric=sym,
            spray=args.spray,
            link_latency=lat,
        )
    t_ring = time.perf_counter() - t0 - t_fab
    a2a = alltoall(
        fab,
        ep_groups(fab, args.ep_group),
        args.ep_bytes,
        symmetric=sym,
        spray=args.spray,
        link_latency=lat,
    )
    t_a2a = time.perf_counter() - t0 - t_fab - t_ring
    colls = {"allreduce": ring, "alltoall": a2a}
    applied = _under(args.scheme, colls)
    eff = {c: a.efficiency for c, a in applied.items()}
    out: dict[str, Any] = {
        "fabric": fab.name,
        "gpus": fab.n_gpus,
        "scheme": args.scheme or "ideal",
        "failed": list(fab.failed),
        "slowed": dict(fab.slowed),
        "lossy": lossy,
        "routing": "spray" if args.spray else "ecmp",
        "dp_algo": args.dp_algo,
        "adaptive": args.adaptive,
        "allreduce_s": ring.time_at(eff["allreduce"]),
        "allreduce_busbw_gbps": ring.busbw_at(ring.time_at(eff["allreduce"])) / 1e9,
        "allreduce_scaleup_s": ring.scaleup_s,
        "allreduce_latency_s": ring.latency_s,
        "allreduce_shortcut": ring.shortcut,
        "allreduce_flows_computed": ring.flows_computed,
        "ring_collisions": ring.collisions,
        "allreduce_held_by_network": ring.held_by_network,
        "alltoall_held_by_network": a2a.held_by_network,
        "alltoall_s": a2a.time_at(eff["alltoall"]),
        "alltoall_busbw_gbps": a2a.busbw_at(a2a.time_at(eff["alltoall"])) / 1e9,
        "alltoall_shortcut": a2a.shortcut,
        "alltoall_flows_computed": a2a.flows_computed,
        "efficiency": {c: a.as_dict() for c, a in applied.items()},
        "wall_fabric_s": round(t_fab, 3),
        "wall_allreduce_s": round(t_ring, 3),
        "wall_alltoall_s": round(t_a2a, 3),
    }
    t_ar, t_aa = out["allreduce_s"], out["alltoall_s"]
    out["compute_s"] = args.compute_ms / 1e3
    out["iteration_s"] = out["compute_s"] + t_ar + t_aa
    out["compare"] = _compare(args.compare, colls, out["compute_s"])
    out["communication_share"] = (t_ar + t_aa) / out["iteration_s"]
    loads = [link_load(fab, ring, t_ar), link_load(fab, a2a, t_aa)]
    out["link_load"] = {ld.collective: ld.as_dict() for ld in loads}
    # the computation's cost, its outputs' included (not the files and the plot)
    out["wall_s"] = round(time.perf_counter() - t0, 3)
    out["cpu_s"] = round(time.process_time() - cpu0, 3)
    out["peak_rss_mib"] = round(_rss_mib(), 1)
    run_dir = args.run_dir or (None if args.json else new_run_dir("flow-iteration"))
    if run_dir is not None:
        _write_iteration(run_dir, args, out, loads)
    if args.json:
        print(json.dumps(out))
        return 0
    down = f", {', '.join(fab.failed)} down" if fab.failed else ""
    down += "".join(f", {el} at {f:.0%}" for el, f in fab.slowed)
    down += "".join(
        f", {el} losing {lo['loss']:.2%} (goodput {lo['goodput']:.3f})" for el, lo in lossy.items()
    )
    print(f"{fab.name}: one iteration ({out['scheme']}, {out['routing']}{down})")
    print(f"  DP all-reduce: {DP_ALGOS[args.dp_algo]}; EP all-to-all in groups of {args.ep_group}")
    print(collective_rows([(ring, t_ar), (a2a, t_aa)]))
    print(
        f"  iteration {out['iteration_s'] * 1e3:.2f} ms: compute {args.compute_ms:g} ms, "
        f"communication {out['communication_share']:.0%} (no overlap)"
    )
    print(
        f"  ECMP: all-reduce excess {ring.collisions.get('excess', 0)} (worst link "
        f"{ring.collisions.get('worst', 0)} flows, {ring.collisions.get('worst_perfect', 0)} in "
        f"a perfect spread); symmetry: {ring.shortcut} / {a2a.shortcut}"
    )
    held = [c.collective for c in (ring, a2a) if c.held_by_network]
    if held:
        print(
            f"  held by the network (a switch's egress, not the NIC, sets the last flows' "
            f"rate: where congestion control acts, the scheme's congested fit, docs/flow.md): "
            f"{', '.join(held)}"
        )
    if args.scheme:
        for c, a in applied.items():
            note = f"; {a.note}" if a.note else ""
            print(f"  {args.scheme} {c}: efficiency {a.efficiency:.3f} ({a.regime} fit{note})")
    if out["compare"]:
        print(f"  {'scheme':>10} {'all-reduce':>12} {'all-to-all':>12} {'iteration':>12}  fits")
        for sch, c in out["compare"].items():
            fits = ", ".join(
                f"{k} {v['regime']} {v['efficiency']:.3f}"
                + ("*" if v["beyond"] else "")
                + ("!" if v["missed"] else "")
                for k, v in c["efficiency"].items()
            )
            print(
                f"  {sch:>10} {c['allreduce_s'] * 1e3:>9.2f} ms {c['alltoall_s'] * 1e3:>9.2f} ms "
                f"{c['iteration_s'] * 1e3:>9.2f} ms  {fits}"
            )
        print(
            "  (*: the collective's ideal time lies beyond the fitted ones, the nearest "
            "point's efficiency; !: the fit missed its held-out check: docs/flow.md)"
        )
    print("  link utilisation (network links, idle included):")
    for ld in loads:
        print("\n".join(load_lines(ld)))
    print(
        f"  wall {out['wall_s']:.2f} s (fabric {t_fab:.2f}, all-reduce {t_ring:.2f}, "
        f"all-to-all {t_a2a:.2f}), CPU {out['cpu_s']:.2f} s, peak RSS "
        f"{out['peak_rss_mib']:.0f} MiB"
    )
    if run_dir is not None:
        print(f"  results: {run_dir / 'iteration.json'}\n  plot:    {run_dir / 'iteration.png'}")
    return 0


def _under(scheme: str | None, colls: dict[str, CollResult]) -> dict[str, calibration.Applied]:
    """Each collective's calibrated efficiency under `scheme` (None: the ideal, 1)."""
    if not scheme:
        return {c: calibration.Applied(1.0, "ideal") for c in colls}
    return {c: calibration.applied(scheme, c, r) for c, r in colls.items()}


def _compare(
    schemes: str, colls: dict[str, CollResult], compute_s: float
) -> dict[str, dict[str, Any]]:
    """The iteration under each scheme of `schemes` (comma-separated): its collectives'
    times at the scheme's calibrated efficiencies (the fit each took, and its note)."""
    out = {}
    for sch in (x.strip() for x in schemes.split(",") if x.strip()):
        got = _under(sch, colls)
        t = {c: r.time_at(got[c].efficiency) for c, r in colls.items()}
        out[sch] = {
            "allreduce_s": t["allreduce"],
            "alltoall_s": t["alltoall"],
            "iteration_s": compute_s + sum(t.values()),
            "efficiency": {c: a.as_dict() for c, a in got.items()},
        }
    return out


def _write_iteration(
    run_dir: Path, args: argparse.Namespace, out: dict[str, Any], loads: list[LinkLoad]
) -> None:
    from testbed.flow.plots import iteration_plot

    run_dir.mkdir(parents=True, exist_ok=True)
    doc = {**provenance(getattr(args, "command", None)), "iteration": out}
    (run_dir / "iteration.json").write_text(json.dumps(doc, indent=1) + "\n")
    parts = {"compute": out["compute_s"], "all-reduce": out["allreduce_s"]}
    parts["all-to-all"] = out["alltoall_s"]
    iteration_plot(
        parts,
        loads,
        run_dir / "iteration.png",
        f"{out['fabric']}, {out['scheme']}, {out['routing']}, DP {out['dp_algo']}",
    )


def cmd_calibrate(args: argparse.Namespace) -> int:
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="xingmai-cal-") as tmp:
        if args.part in ("both", "free"):
            _calibrate_free(args, Path(tmp), say)
        if args.part in ("both", "congested"):
            _calibrate_congested(args, Path(tmp), say)
        if args.part == "loss":
            _calibrate_loss(args, Path(tmp), say)
    print(f"written: {calibration.CALIBRATION}")
    return 0


def _calibrate_free(args: argparse.Namespace, tmp: Path, say: Callable[[str], None]) -> None:
    fit_run = args.twin_run or calibration.run_twin(
        args.scheme, calibration.topology_for(args.hosts), tmp / "fit", say
    )
    check_run = args.check_run
    if check_run is None and args.check_hosts:
        check_run = calibration.run_twin(
            args.scheme, calibration.topology_for(args.check_hosts), tmp / "check", say
        )
    entry = calibration.fit(
        args.scheme, _results(fit_run), _results(check_run) if check_run else None
    )
    for coll, e in entry.items():
        print(f"{args.scheme} {coll}: efficiency {_fit_line(e['efficiency'], e)}")


def _calibrate_congested(args: argparse.Namespace, tmp: Path, say: Callable[[str], None]) -> None:
    if args.congested_runs:
        runs = [_results(Path(p)) for p in args.congested_runs.split(",") if p]
    else:
        runs = [
            calibration.run_twin(
                args.scheme, calibration.CONGESTED_TOPOLOGY, tmp / f"congested{i}", say, sizes
            )
            for i, sizes in enumerate(calibration.CONGESTED_SIZES)
        ]
    check = args.congested_check_run
    if check is None:
        check = calibration.run_twin(
            args.scheme,
            calibration.CONGESTED_CHECK_TOPOLOGY,
            tmp / "congested-check",
            say,
            calibration.CONGESTED_CHECK_SIZES,
        )
    out = calibration.fit_congested(args.scheme, runs, _results(check))
    for coll, cong in out.items():
        for p in cong["points"]:
            print(f"{args.scheme} {coll} congested: efficiency {_fit_line(p['efficiency'], p)}")
        if "held_out" in cong:
            print(f"  {_held_line(cong['held_out'])}")


def _calibrate_loss(args: argparse.Namespace, tmp: Path, say: Callable[[str], None]) -> None:
    def runs(hosts: int, losses: Sequence[float]) -> dict[tuple[float, int], Path]:
        topo = calibration.topology_for(hosts)
        return {
            (p, s): lossfit.run_twin(args.scheme, topo, p, s, tmp / f"loss{hosts}-{p:g}-{s}", say)
            for p in (0.0, *losses)
            for s in lossfit.LOSS_SEEDS
        }

    check = runs(args.check_hosts, [lossfit.LOSS_CHECK]) if args.check_hosts else None
    entry = lossfit.fit(args.scheme, runs(args.hosts, lossfit.LOSS_POINTS), check)
    f = entry["fitted_on"]
    print(
        f"{args.scheme}: a lossy link ({f['link']} on {f['topology']}, the all-reduce of "
        f"{fmt_size(f['bytes_per_rank'])} per rank, seeds {','.join(map(str, f['seeds']))})"
    )
    for p in entry["points"]:
        print(
            f"  loss {p['loss']:.2%}: the twin {p['twin_ratio']:.3f}x slower -> goodput "
            f"{p['goodput']:.3f}"
        )
    h = entry.get("held_out")
    if h:
        print(
            f"  held out {h['topology']} at {h['loss']:.2%}: predicted "
            f"{h['predicted_ratio']:.3f}x, twin {h['twin_ratio']:.3f}x, error {h['error']:+.1%}"
        )


def _fit_line(eff: float, e: dict[str, Any]) -> str:
    f = e["fitted_on"]
    line = (
        f"{eff:.3f} (twin {f['twin_time_s'] * 1e6:.2f} us, ideal {f['ideal_time_s'] * 1e6:.2f} "
        f"us, {fmt_size(f['bytes_per_rank'])} per rank, {f['topology']})"
    )
    if "held_out" in e:
        line += "; " + _held_line(e["held_out"])
    return line


def _held_line(h: dict[str, Any]) -> str:
    where = f"held out {h['topology']} at {fmt_size(h['bytes_per_rank'])}: predicted "
    if "failed" in h:
        return f"{where}{h['predicted_time_s'] * 1e6:.2f} us, the twin's run failed ({h['failed']})"
    return (
        f"{where}{h['predicted_time_s'] * 1e6:.2f} us, twin {h['twin_time_s'] * 1e6:.2f} us, "
        f"error {h['error']:+.1%}"
    )


def cmd_workload(args: argparse.Namespace) -> int:
    from testbed.flow import workload

    t0, cpu0 = time.perf_counter(), time.process_time()
    wl = workload.read(args.workload)
    if args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: at least 1")
    if args.gpus is None:
        args.gpus = wl.all_gpus * args.jobs
    if args.gpus != wl.all_gpus * args.jobs:
        raise ValueError(
            f"--gpus {args.gpus}: {args.jobs} job(s) of the file's all_gpus {wl.all_gpus} "
            f"take {wl.all_gpus * args.jobs}"
        )
    fab = build_clos(_params(args))
    jobs = tuple(j * wl.all_gpus for j in range(args.jobs))
    applied: dict[int, calibration.Applied] = {}  # by the result's id: what it ran at

    def efficiency(coll: str, r: CollResult) -> float:
        # a reduce-scatter or an all-gather is half the ring all-reduce's steps: its fit
        fitted = "alltoall" if coll == "alltoall" else "allreduce"
        got = calibration.applied(args.scheme, fitted, r) if args.scheme else None
        if got is not None:
            applied[id(r)] = got
            return got.efficiency
        return 1.0

    tl = workload.run(fab, wl, model_link_latency(), efficiency, spray=args.spray, jobs=jobs)
    alone = None
    if args.jobs > 1:  # the first copy alone on the same fabric: what the others cost it
        alone = workload.run(fab, wl, model_link_latency(), efficiency, spray=args.spray)
    rows = [(key[1], r, tl.times[key], applied.get(id(r))) for key, r in tl.collectives.items()]
    out: dict[str, Any] = {
        "workload": str(args.workload),
        "policy": wl.policy,
        "parallelism": {
            "tp": wl.tp,
            "dp": wl.dp,
            "pp": wl.pp,
            "ep": wl.ep,
            "vpp": wl.vpp,
            "ga": wl.ga,
        },
        "layers": len(wl.layers),
        "fabric": fab.name,
        "gpus": fab.n_gpus,
        "scheme": args.scheme or "ideal",
        "routing": "spray" if args.spray else "ecmp",
        **tl.as_dict(),
        "jobs": args.jobs,
        "alone_s": alone.time_s if alone else tl.time_s,
    }
    out["collectives"] = [
        {
            **c,
            "fit": got.regime if got else ("ideal" if not args.scheme else "scale-up"),
            "note": got.note if got else "",
        }
        for c, (_, _, _, got) in zip(out["collectives"], rows, strict=True)
    ]
    out["wall_s"] = round(time.perf_counter() - t0, 3)
    out["cpu_s"] = round(time.process_time() - cpu0, 3)
    out["peak_rss_mib"] = round(_rss_mib(), 1)
    run_dir = args.run_dir or (None if args.json else new_run_dir("flow-workload"))
    if run_dir is not None:
        _write_workload(run_dir, args, out, fab, tl, rows)
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"{args.workload.name}: {wl.policy}, {len(wl.layers)} layers; TP {wl.tp} x DP {wl.dp} "
        f"x PP {wl.pp}, EP {wl.ep} on {fab.name} ({out['scheme']}, {out['routing']})"
    )
    print(collective_rows([(r, t) for _, r, t, _ in rows], [g for g, *_ in rows]))
    print(
        f"  one pass {tl.time_s * 1e3:.2f} ms: compute {tl.compute_s * 1e3:.2f} ms, "
        f"collectives waited for {tl.blocking_comm_s * 1e3:.2f} ms, weight-gradient "
        f"collectives {tl.wg_comm_s * 1e3:.2f} ms of which exposed {tl.wg_exposed_s * 1e3:.2f} ms"
    )
    if alone is not None:
        print(
            f"  {args.jobs} jobs in lockstep, each {tl.time_s * 1e3:.2f} ms; one alone on the "
            f"same fabric {alone.time_s * 1e3:.2f} ms: the others cost it "
            f"{tl.time_s / alone.time_s - 1:+.1%}"
        )
    print(
        "  communication by group: "
        + ", ".join(f"{g} {s * 1e3:.2f} ms" for g, s in sorted(tl.comm_by_group.items()))
    )
    if wl.pp > 1:
        print(
            f"  pipeline: PP {wl.pp}, bubble {tl.bubble_s * 1e3:.2f} ms by SimAI's formula "
            f"(not in the pass's time; its point-to-point traffic, pp_comm "
            f"{fmt_size(wl.pp_comm)} per micro-batch, not modelled)"
        )
    for group, r, _, got in rows:
        if got is not None and got.note:
            print(f"  {r.collective} {group} {fmt_size(int(r.bytes_per_rank))}: {got.note}")
    print(
        f"  wall {out['wall_s']:.2f} s, CPU {out['cpu_s']:.2f} s, peak RSS "
        f"{out['peak_rss_mib']:.0f} MiB"
    )
    if run_dir is not None:
        print(f"  results: {run_dir / 'workload.json'}")
    return 0


def _write_workload(
    run_dir: Path,
    args: argparse.Namespace,
    out: dict[str, Any],
    fab: Any,
    tl: Any,
    rows: list[Any],
) -> None:
    from testbed.flow.plots import iteration_plot

    run_dir.mkdir(parents=True, exist_ok=True)
    doc = {**provenance(getattr(args, "command", None)), "workload": out}
    (run_dir / "workload.json").write_text(json.dumps(doc, indent=1) + "\n")
    parts = {
        "compute": tl.compute_s,
        "collectives waited for": tl.blocking_comm_s,
        "weight-gradient collectives exposed": tl.wg_exposed_s,
    }
    loads = []
    for group, r, t, _ in rows:
        ld = link_load(fab, r, t)
        ld.collective = f"{r.collective} {group} {fmt_size(int(r.bytes_per_rank))}"
        loads.append(ld)
    iteration_plot(
        parts, loads, run_dir / "workload.png", title=f"{args.workload.name} on {fab.name}"
    )


def _results(p: Path) -> Path:
    return p / "results.json" if p.is_dir() else p


COMMANDS = {
    "fabric": cmd_fabric,
    "flow-iteration": cmd_iteration,
    "flow-workload": cmd_workload,
    "calibrate-flow": cmd_calibrate,
}
