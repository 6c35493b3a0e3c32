"""The collective library's commands of `xingmai-testbed`:

    xingmai-testbed collective --engine sim --scale 1 --topo rail:2,8,1 --sizes 64K:4M
        nccl-tests' table (time, algbw, busbw, efficiency per size) and busbw-vs-size plot;
        --degrade rail2:1=0.25: one rail's port at a quarter rate, static vs adaptive
    xingmai-testbed jobs FILE --engine sim --scale 1
        concurrent jobs of a scenario file (testbed.collective.run.load_jobs)
    xingmai-testbed tune --engine sim --scale 1 --sizes 64K:4M
        the auto-tuner's table (testbed.collective.tune)
    xingmai-testbed loss-sweep --engine sim --losses 0,0.01%,0.1%,1%
        random loss on every link, go-back-N vs selective repeat (testbed.collective.loss)

Both engines: `--engine sim` is the simulated twin (no root), `--engine emu` the emulation.
Figures are in the model's units (times and rates at the model's speed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from testbed.collective.metrics import fmt_size, parse_sizes, table
from testbed.experiment.machine import provenance
from testbed.experiment.rundir import new_run_dir
from testbed.experiment.schemes import (
    SCHEMES,
    add_cc_arguments,
    add_start_argument,
    cc_config,
    scheme_law,
)
from testbed.faults import parse_seconds
from testbed.model import DEFAULT_SCALE, Scaling


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _engine_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--engine", choices=["sim", "emu"], default="sim")
    ap.add_argument("--topo", default="rail:2,8,1", help="default rail:2,8,1 (8 hosts x 2 rails)")
    ap.add_argument(
        "--scale",
        type=float,
        default=None,
        help=f"model speed / engine speed (default: 1 on the twin, "
        f"{DEFAULT_SCALE:g} on the emulation)",
    )
    ap.add_argument("--scheme", choices=SCHEMES, default="tita")
    add_cc_arguments(ap)
    add_start_argument(ap)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--retransmit",
        choices=["gbn", "sr"],
        default="gbn",
        help="the transport's: go-back-N (default) or selective repeat",
    )
    ap.add_argument("--switch", choices=["auto", "bmv2", "builtin"], default="builtin")
    ap.add_argument("--run-dir", type=Path, help="default: runs/<timestamp>-collective")


def _coll_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--collective",
        default="allreduce",
        choices=["allreduce", "reducescatter", "allgather", "alltoall", "sendrecv"],
    )
    ap.add_argument("--channels", type=int, default=0, help="default: the hosts' NICs")
    ap.add_argument("--chunk", default="256K", help="bytes per message (default 256K)")
    ap.add_argument("--schedule", choices=["static", "adaptive"], default="adaptive")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="iterations not counted")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs per host (hier; default K)")
    ap.add_argument(
        "--payload",
        choices=["data", "size"],
        default="data",
        help="data: messages carry the float32 buffers, sums checked element by element; "
        "size: a 32-bit fingerprint per piece, padded to the message's size (the same "
        "traffic, memory that grows with the plan, not the data)",
    )


def add_parsers(sub: Any) -> None:
    c = sub.add_parser("collective", help="collectives over the rails: nccl-tests' table")
    _engine_args(c)
    _coll_args(c)
    c.add_argument(
        "--algorithms",
        default="ring",
        help="ring,tree,hier (all-reduce); auto: the tuner's choice per size",
    )
    c.add_argument("--sizes", default="64K:4M:4", help="from:to[:factor] or a list")
    c.add_argument(
        "--degrade",
        help="SWITCH:PORT=FRACTION: that port's rate cut, static "
        "split vs adaptive channels (at the largest size)",
    )
    c.add_argument(
        "--degrade-at",
        metavar="TIME",
        help="with --degrade: the cut comes this long (the model's time, e.g. 20us) into "
        "the collective instead of before it, and how soon each sender through the port "
        "reckoned with it is shown",
    )
    j = sub.add_parser("jobs", help="concurrent jobs from a scenario file (YAML)")
    _engine_args(j)
    j.add_argument("file", type=Path)
    from testbed.collective.loss import add_arguments as loss_arguments

    ls = sub.add_parser(
        "loss-sweep", help="random loss on every link: busbw and iteration time, GBN vs SR"
    )
    _engine_args(ls)
    loss_arguments(ls)
    t = sub.add_parser("tune", help="auto-tune algorithm, channels, chunk per size")
    _engine_args(t)
    t.add_argument("--collective", default="allreduce")
    t.add_argument("--sizes", default="64K:4M:4")
    t.add_argument(
        "--cache", type=Path, default=None, help="the tuner's cache (default runs/tune-cache.json)"
    )


def _run_dir(args: argparse.Namespace, what: str) -> Path:
    path: Path = args.run_dir or new_run_dir(what)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def open_suite(args: argparse.Namespace) -> Iterator[Any]:
    """A prepared suite (base RTT measured, TiTa's T fixed) on the chosen engine, with the
    scheme set."""
    from testbed.experiment.suite import SuiteConfig
    from testbed.topo import parse_choice

    spec = parse_choice(args.topo)
    scale = (
        args.scale if args.scale is not None else (1.0 if args.engine == "sim" else DEFAULT_SCALE)
    )
    scaling = Scaling(scale=scale, max_hops=spec.longest_path_switches())
    cfg = SuiteConfig(
        seed=args.seed,
        retransmit=args.retransmit,
        proactive_start=args.proactive_start,
        **cc_config(args),
    )
    if args.engine == "sim":
        from testbed.sim.fabric import SimFabric
        from testbed.sim.suite import SimSuite

        fab = SimFabric(spec, scaling, seed=args.seed)
        suite: Any = SimSuite(fab, cfg, _say)
        suite.prepare()
        suite.use_scheme(args.scheme)
        yield suite, suite.collective_fabric(args.scheme)
        return
    from controller.config import EcnConfig
    from testbed.emu.network import Testbed, TestbedOptions, install_signal_handlers
    from testbed.emu.suite import EmuSuite

    install_signal_handlers()
    opts = TestbedOptions(
        switch=args.switch,
        scaling=scaling,
        rate_law=scheme_law(args.scheme),
        ecn=EcnConfig(),
        pcap=False,
        run_dir=args.run_dir,
        controller_caps=False,
    )
    tb = Testbed(spec, opts)
    with tb:
        with EmuSuite(tb, cfg) as esuite:
            esuite.prepare()
            esuite.use_scheme(args.scheme)
            yield esuite, esuite.collective_fabric(args.scheme)


def _params(args: argparse.Namespace) -> dict[str, Any]:
    from testbed.collective.metrics import parse_size

    p: dict[str, Any] = {
        "collective": args.collective,
        "channels": args.channels,
        "chunk": parse_size(args.chunk),
        "schedule": args.schedule,
        "iters": args.iters + args.warmup,
        "payload": args.payload,
    }
    if args.gpus:
        p["gpus"] = args.gpus
    return p


def _note(fab: Any, args: argparse.Namespace) -> str:
    s = fab.scaling
    return (
        f"{fab.topology}, {len(fab.hosts)} hosts x {fab.nics} NICs, "
        f"{'twin' if args.engine == 'sim' else 'emulation'} at 1/{s.scale:g} of the "
        f"model ({s.model.port_speed_gbps:g}G); scheme {args.scheme}; figures in the "
        "model's units"
        + (
            "; sizes only: sums checked by fingerprint"
            if getattr(args, "payload", "data") == "size"
            else ""
        )
    )


def _print_notes(telemetry: dict[str, Any]) -> None:
    """What the switches' telemetry could not resolve at this scale, under the table."""
    from testbed.experiment.report import telemetry_notes

    for line in telemetry_notes({"telemetry": telemetry}):
        print(line)


def cmd_collective(args: argparse.Namespace) -> int:
    from testbed.collective import run
    from testbed.collective.plots import busbw_plot

    sizes = parse_sizes(args.sizes)
    algorithms = [a for a in args.algorithms.split(",") if a]
    out = _run_dir(args, "collective")
    with open_suite(args) as (suite, fab):
        cc_profile = suite.cc_records[args.scheme]
        telemetry = suite.telemetry
        params = _params(args)
        warmup = args.warmup
        rows = run.sweep(fab, sizes, algorithms, say=_say, warmup=warmup, **params)
        note = _note(fab, args)
        degraded = None
        if args.degrade:
            where, frac = args.degrade.split("=")
            sw, port = where.split(":")
            params.pop("schedule")
            degraded = run.degraded_rail(
                fab,
                sw,
                int(port),
                float(frac),
                at=parse_seconds(args.degrade_at) if args.degrade_at else None,
                algorithm=algorithms[0],
                size=max(sizes),
                warmup=warmup,
                **params,
            )
    print(table(rows, note))
    _print_notes(telemetry)
    plot = busbw_plot(rows, out / "busbw.png", note)
    doc: dict[str, Any] = {
        **provenance(args.command),
        "note": note,
        "cc_profile": cc_profile,
        "telemetry": telemetry,
        "rows": rows,
    }
    if degraded is not None:
        doc["degraded"] = degraded
        print()
        print(degraded_text(degraded))
    (out / "collective.json").write_text(json.dumps(doc, indent=1))
    print(f"\nresults: {out / 'collective.json'}\nplot:    {plot}")
    ok = all(r["correct"] for r in rows)
    return 0 if ok else 1


OUTPUTS = ("collective.json", "jobs.json", "tune.json")  # what these commands write


def report(path: Path, markdown: bool = False) -> str:
    """The table of a collective, jobs or tune run (its directory or JSON file), as the
    command printed it; `markdown`: named as the docs name a run (commit, date, machine,
    command), the table in a code block."""
    from testbed.collective import run, tune
    from testbed.experiment.report import run_named

    p = path
    if path.is_dir():
        found = [path / name for name in OUTPUTS if (path / name).exists()]
        if not found:
            raise ValueError(f"{path}: no {', '.join(OUTPUTS)} in it")
        p = found[0]
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{p}: not a collective run's output ({exc})") from None
    if p.name == "collective.json":
        text = table(doc["rows"], doc.get("note", ""))
        if doc.get("degraded"):
            text += "\n\n" + degraded_text(doc["degraded"])
    elif p.name == "jobs.json":
        text = f"# {doc.get('note', '')}\n{run.jobs_table(doc)}"
    elif p.name == "tune.json":
        text = f"# {doc.get('note', '')}\n{tune.tune_table(doc)}"
    else:
        raise ValueError(f"{p}: not one of {', '.join(OUTPUTS)}")
    if not markdown:
        return text
    return f"{run_named(path, doc, p.stem, doc.get('command'))}\n\n```\n{text}\n```"


def degraded_text(d: dict[str, Any]) -> str:
    h, s, a = d["healthy"], d["static"], d["adaptive"]
    lines = [
        f"one degraded rail: {d['port']} at {d['fraction']:g} of its rate, "
        f"{fmt_size(h['size'])} {h['collective']} {h['algorithm']}, K = {d['channels']}",
        f"  healthy           busbw {h['busbw_Bps'] / 1e9:7.2f} GB/s",
        f"  degraded, static  busbw {s['busbw_Bps'] / 1e9:7.2f} GB/s  "
        f"({d['static_ratio']:.0%} of healthy)",
        f"  degraded, adaptive busbw {a['busbw_Bps'] / 1e9:6.2f} GB/s  "
        f"({d['adaptive_ratio']:.0%} of healthy, {d['adaptive_ratio'] / d['ideal']:.0%} of "
        f"the ideal {d['ideal']:.1%}; goal >= {d['goal']:.1%}; "
        f"{a['moved']} transfers moved off their static channel)",
    ]
    r = d.get("reaction")
    if r is not None:
        lines.append(
            f"  the cut came {d['at'] * 1e6:g} us into the collective; each sender towards "
            f"{r['towards']} reckoned the channel halfway down after (goal <= "
            f"{r['goal_rtts']} base RTTs of {r['base_rtt_s'] * 1e6:g} us):"
        )
        for host, v in r["senders"].items():
            if v is None:
                lines.append(f"    {host}: never")
                continue
            by = "its NIC's rate" if v["by"] == "nic" else "its messages' completions"
            lines.append(
                f"    {host}: {v['after_s'] * 1e6:.2f} us = {v['rtts']:.1f} RTTs (from {by})"
            )
    return "\n".join(lines)


def cmd_jobs(args: argparse.Namespace) -> int:
    from testbed.collective import run

    out = _run_dir(args, "jobs")
    with open_suite(args) as (suite, fab):
        telemetry = suite.telemetry
        decls = run.load_jobs(args.file, len(fab.hosts))
        res = run.concurrent(fab, decls)
        note = _note(fab, args)
    print(f"# {note}")
    print(run.jobs_table(res))
    _print_notes(telemetry)
    doc = {**provenance(args.command), "note": note, "telemetry": telemetry, **res}
    (out / "jobs.json").write_text(json.dumps(doc, indent=1))
    print(f"\nresults: {out / 'jobs.json'}")
    return 0 if all(r.get("correct") for r in res["jobs"]) else 1


def cmd_tune(args: argparse.Namespace) -> int:
    from testbed.collective import run, tune

    out = _run_dir(args, "tune")
    cache = args.cache or tune.DEFAULT_CACHE
    with open_suite(args) as (suite, fab):
        cc_profile = suite.cc_records[args.scheme]  # as shipped (or as --cc-set says)
        telemetry = suite.telemetry
        res = tune.tune(
            fab, args.collective, parse_sizes(args.sizes), cache, run.collective, say=_say
        )
        note = _note(fab, args)
    print(f"# {note}")
    print(tune.tune_table(res))
    _print_notes(telemetry)
    doc = {
        **provenance(args.command),
        "note": note,
        "cc_profile": cc_profile,
        "telemetry": telemetry,
        **res,
    }
    (out / "tune.json").write_text(json.dumps(doc, indent=1))
    print(f"\nresults: {out / 'tune.json'}\ncache:   {cache}")
    return 0


def cmd_loss_sweep(args: argparse.Namespace) -> int:
    from testbed.collective import loss
    from testbed.collective.plots import loss_plot

    out = _run_dir(args, "loss")
    rows = loss.run_sweep(args, open_suite, _say)
    print(loss.write(args, rows, out, provenance(args.command)))
    plot = loss_plot(loss.summary(rows), args.plot or out / "loss.png", loss.note(args, rows))
    print(f"\nresults: {out / 'loss.json'}, {out / 'loss.csv'}\nplot:    {plot}")
    return 0 if all(r["completed"] and r["correct"] for r in rows) else 1


COMMANDS = {
    "collective": cmd_collective,
    "jobs": cmd_jobs,
    "tune": cmd_tune,
    "loss-sweep": cmd_loss_sweep,
}
