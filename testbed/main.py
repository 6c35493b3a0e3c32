"""`xingmai-testbed` (`python -m testbed`): boot the emulated fabric and use it.

    xingmai-testbed run      # the main job: TiTa vs DCQCN vs no CC on AI-training traffic
    xingmai-testbed run --engine sim --scale 1   # the same on the simulated twin, at 400G
    xingmai-testbed compare RUN_DIR RUN_DIR...   # runs side by side, with ratios
    xingmai-testbed sweep --param incast_bytes=1e5,4e5 --seeds 1,2,3   # twin runs on Dask
    xingmai-testbed replay RUN_DIR   # name the fault behind a slow job: replays in the twin
    xingmai-testbed peer ns3-hpcc --sim PATH --flows F RUNDIR   # beside HPCC's ns-3 simulator
    xingmai-testbed cli      # the same network with Mininet's CLI and project commands
    xingmai-testbed doctor   # what this machine has and lacks
    xingmai-testbed topo leafspine:2,2,4 --dump   # a topology as YAML
    xingmai-testbed collective --sizes 64K:4M     # collectives over the rails (nccl-tests)
    xingmai-testbed jobs FILE                     # concurrent jobs of a scenario file
    xingmai-testbed tune                          # auto-tune algorithm/channels/chunk
    xingmai-testbed fabric --gpus 131072 --tiers 3  # a fleet-scale fabric (flow engine)
    xingmai-testbed flow-iteration --gpus 131072 --tiers 3   # one iteration on it
    xingmai-testbed calibrate-flow --scheme tita  # fit the flow engine on the twin

Topologies: `single[:H]`, `leafspine[:L,S,H[,G]]`, `crossed[:L,S,H[,G]]` (G: the hosts' links
in Gb/s, e.g. 100 under 400G switch ports), `rail[:K,H,S]`, `fattree[:P,T,H,A,C[,G]]` (three
tiers; alone, HPCC's 320-host fat-tree) or a YAML file (testbed.topo).
The emulation (`--engine emu`, the default) needs root; everything it starts it stops, on
exit, error, Ctrl-C or SIGTERM. The simulated twin (`--engine sim`, testbed.sim) runs the same
suite in one process under a virtual clock, without root.
"""

from __future__ import annotations

import argparse
import io
import os
import shlex
import sys
import time
from pathlib import Path

from testbed.errors import UserError
from testbed.experiment.schemes import (
    RATE_LAWS,
    add_ack_argument,
    add_cc_arguments,
    add_start_argument,
    check_ack_every,
)
from testbed.model import (
    BUFFERS,
    DEFAULT_MODEL,
    DEFAULT_SCALE,
    LINK_TIMES,
    Scaling,
    model_with_buffer,
)
from testbed.switch.v1model import DEFAULT_PIPELINE, PIPELINES

# Mininet, bcc and the gRPC stubs are imported where a command needs them: `doctor` must run
# (and say what is missing) on a machine that lacks them.

DEFAULT_TOPO = "leafspine:2,2,4"


def _common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--topo",
        default=DEFAULT_TOPO,
        help=f"single[:H], leafspine[:L,S,H[,G]], crossed[:L,S,H[,G]], rail[:K,H,S], "
        f"fattree[:P,T,H,A,C[,G]] or a YAML file (default {DEFAULT_TOPO})",
    )
    ap.add_argument(
        "--switch",
        choices=["auto", "bmv2", "builtin"],
        default="auto",
        help="bmv2's simple_switch_grpc (auto: when on PATH) or the built-in switch",
    )
    ap.add_argument(
        "--scale",
        type=float,
        default=DEFAULT_SCALE,
        help=f"model speed / emulated speed (default {DEFAULT_SCALE:g}: 400G -> "
        f"{400e9 / DEFAULT_SCALE / 1e6:g} Mb/s)",
    )
    ap.add_argument(
        "--buffer",
        choices=BUFFERS,
        default=DEFAULT_MODEL.buffer,
        help="the switches' packet buffer: static depth per queue, or shared by the queues "
        "with dynamic thresholds (and a dynamic PFC XOFF) as a 51.2T part has it "
        f"(default {DEFAULT_MODEL.buffer})",
    )
    ap.add_argument(
        "--pipeline",
        choices=PIPELINES,
        default=DEFAULT_PIPELINE,
        help=f"the per-packet code (default {DEFAULT_PIPELINE}): native, or the Python "
        "reference it is proven identical to; the built-in switches' P4 pipeline (native code "
        "generated from the JSON) and, on the twin, the NICs' rate laws (the XDP program "
        "compiled); where the native one cannot run (no C compiler, a construct it lacks) one "
        "line says why and the reference runs",
    )
    ap.add_argument(
        "--nic-pipeline",
        choices=PIPELINES,
        help="the twin's NICs alone on this one (default: as --pipeline): to bisect a "
        "difference between the native and the reference runs",
    )
    ap.add_argument(
        "--loop-pipeline",
        choices=PIPELINES,
        help="the twin's event loop and its switches' hops alone on this one (default: as "
        "--pipeline; native needs the switches native): to bisect, as --nic-pipeline",
    )
    ap.add_argument(
        "--host-pipeline",
        choices=PIPELINES,
        help="the twin's hosts' per-packet loops alone on this one (default: as --pipeline; "
        "native needs the event loop, NICs and transport native, and runs the jobs with one "
        "NIC, no PFC, no prober, no INT sink on the NIC): to bisect, as --nic-pipeline",
    )
    ap.add_argument(
        "--transport-pipeline",
        choices=PIPELINES,
        help="the hosts' transport cores alone on this one, on either packet engine (default: "
        "as --pipeline; the native core runs go-back-N, the reference selective repeat): to "
        "bisect, as --nic-pipeline",
    )
    ap.add_argument(
        "--link-time",
        choices=LINK_TIMES,
        help="the emulation's links (default model): the built-in switches hold each frame "
        "for its link's serialization and delay, as the twin's links take it (a base RTT of "
        "the model's 20 ms at 1/20000); none: at once, as a veth (a fraction of a "
        "millisecond, and fewer of the switches' wake-ups: more hosts on two cores)",
    )
    ap.add_argument("--pcap", action="store_true", help="per-port pcap files in the run dir")
    ap.add_argument("--run-dir", type=Path, help="default: runs/<timestamp>")
    ap.add_argument(
        "--controller-caps",
        action="store_true",
        help="let the controller's slow loop push max-min caps to the NICs",
    )
    ap.add_argument(
        "--rate-law",
        choices=RATE_LAWS,
        default="tita",
        help="the hosts' rate law at start (cli; run sets each scheme in turn)",
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="xingmai-testbed",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="the scenario suite, once per scheme; table, plots, JSON")
    _common(run)
    run.add_argument(
        "--schemes",
        default=None,
        help="comma-separated (default: "
        "testbed.experiment.schemes.DEFAULT_SCHEMES, no CC, "
        "DCQCN lossy and on PFC, TiTa), of none,dcqcn,tita,hpcc,timely,swift "
        "and the "
        "lossless dcqcn+pfc,tita+pfc (PFC in every switch and NIC; the "
        "built-in switch)",
    )
    run.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated (default: all of them, "
        "testbed.experiment.suite.SCENARIOS; "
        "also victim, storm: PFC's harms)",
    )
    add_start_argument(run)
    run.add_argument(
        "--pfc-watchdog",
        choices=["on", "off"],
        default="on",
        help="the PFC watchdog in the switches of a lossless scheme (default on)",
    )
    add_cc_arguments(run)
    run.add_argument("--quick", action="store_true", help="a shorter suite")
    run.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a numeric suite parameter set otherwise than the suite (or --quick) has it, e.g. "
        "allreduce_bytes=16777216 (repeatable; recorded in results.json's setup.suite)",
    )
    run.add_argument(
        "--engine",
        choices=["emu", "sim", "flow"],
        default="emu",
        help="emu: the emulation (root, Mininet, eBPF); sim: the simulated twin "
        "(one process, virtual time, deterministic); flow: the flow-level "
        "engine (allreduce, alltoall; calibrated schemes; docs/flow.md)",
    )
    run.add_argument("--seed", type=int, default=1, help="workloads' seed (default 1)")
    run.add_argument(
        "--retransmit",
        choices=["gbn", "sr"],
        default="gbn",
        help="the transport's retransmission: go-back-N (RC's; default) or selective repeat",
    )
    add_ack_argument(run)
    run.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run every (scenario, scheme) N times: the table shows median "
        "[min-max], the verdict calls only differences beyond that range",
    )
    run.add_argument(
        "--flows",
        type=Path,
        help="a flow list (CSV: src,dst,bytes,start_s; hosts by name) run as the "
        "scenario 'flows' instead of the suite's scenarios",
    )
    run.add_argument(
        "--faults",
        type=Path,
        help="faults to inject in every scenario (YAML list of {at: SECONDS, "
        "target: leaf1:3|spine1|h3, kind: down|up|loss|rate|delay|kill|slow, "
        "value: ...}; testbed/faults.py)",
    )
    run.add_argument(
        "--probes",
        type=float,
        metavar="MS",
        help="the hosts' active probers: every host probes a peer under every other leaf "
        "from 8 source ports, each probe flow once per MS emulated milliseconds, and the "
        "localizer ranks links by the probes lost (controller/nic/prober.py)",
    )
    from testbed.sweep import build_parser as sweep_parser

    sweep_parser(sub)
    from testbed.replay import build_parser as replay_parser

    replay_parser(sub)
    from testbed.peer.ns3_hpcc import add_parser as peer_parser

    peer_parser(sub)
    compare = sub.add_parser("compare", help="two or more runs side by side, with ratios")
    compare.add_argument("runs", nargs="+", type=Path, help="run dirs (or results.json files)")
    compare.add_argument(
        "--median",
        action="store_true",
        help="the runs after the first are repeats: compare the first with "
        "their median and show their min-max",
    )
    report = sub.add_parser(
        "report",
        help="a run's table again: as text, or as Markdown for "
        "the docs with the run's command, commit, date and machine",
    )
    report.add_argument(
        "run",
        type=Path,
        help="a run dir (or its results.json, collective.json, jobs.json, tune.json)",
    )
    report.add_argument("--markdown", action="store_true", help="Markdown, with the run named")
    cli = sub.add_parser("cli", help="Mininet's CLI on the booted network")
    _common(cli)
    sub.add_parser("doctor", help="check the prerequisites")
    from testbed.collective_cli import add_parsers

    add_parsers(sub)  # collective, jobs, tune
    from testbed.flow.cli import add_parsers as flow_parsers

    flow_parsers(sub)  # fabric, flow-iteration, calibrate-flow
    fl = sub.add_parser(
        "flows",
        help="a --flows file: Poisson arrivals of a flow-size CDF at a load (HPCC's workloads)",
    )
    fl.add_argument("cdf", help="websearch, fbhadoop, ... (testbed/data/workloads) or a CDF file")
    fl.add_argument("--load", type=float, required=True, help="of each host's line rate, 0-1")
    fl.add_argument("--seconds", type=float, required=True, help="of arrivals, in the model's time")
    fl.add_argument("--topo", default=DEFAULT_TOPO, help="whose hosts send (as run --topo)")
    fl.add_argument(
        "--gbps",
        type=float,
        help="the line rate the load is of (default: the first host's link, or the model's port)",
    )
    fl.add_argument("--seed", type=int, default=1)
    fl.add_argument("--out", type=Path, help="the file (default: standard output)")
    topo = sub.add_parser("topo", help="print a topology")
    topo.add_argument("topo", nargs="?", default=DEFAULT_TOPO)
    topo.add_argument("--dump", action="store_true", help="as YAML (the file format)")
    return ap


def _testbed(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from controller.config import EcnConfig
    from testbed.emu.network import Testbed, TestbedOptions
    from testbed.topo import parse_choice

    spec = parse_choice(args.topo)
    scaling = Scaling(
        model=model_with_buffer(args.buffer),
        scale=args.scale,
        max_hops=spec.longest_path_switches(),
    )
    opts = TestbedOptions(
        switch=args.switch,
        pipeline=args.pipeline,
        transport_pipeline=getattr(args, "transport_pipeline", None) or args.pipeline,
        link_time=getattr(args, "link_time", None) or LINK_TIMES[0],
        scaling=scaling,
        rate_law=args.rate_law,
        ecn=EcnConfig(),
        pcap=args.pcap,
        run_dir=args.run_dir,
        controller_caps=args.controller_caps,
        probe_interval_s=(getattr(args, "probes", None) or 0.0) / 1e3,
    )
    return Testbed(spec, opts)


def cmd_run(args: argparse.Namespace) -> int:
    from testbed.experiment.plots import write_plots
    from testbed.experiment.report import (
        operations_notes,
        table,
        telemetry_notes,
        verdict,
        write_csvs,
        write_results,
    )
    from testbed.experiment.schemes import DEFAULT_SCHEMES, SCHEMES, cc_config, lossless
    from testbed.experiment.suite import ALL_SCENARIOS, SCENARIOS, SuiteConfig, suite_param

    schemes = tuple(s for s in args.schemes.split(",") if s) if args.schemes else DEFAULT_SCHEMES
    scenarios = tuple(s for s in args.scenarios.split(",") if s) if args.scenarios else SCENARIOS
    bad = [s for s in schemes if s not in SCHEMES] + [
        s for s in scenarios if s not in ALL_SCENARIOS
    ]
    if args.engine == "emu" and args.seed != 1:
        print("--seed is the twin's (the emulation's workloads use seed 1)", file=sys.stderr)
        return 2
    if args.engine != "sim" and args.nic_pipeline is not None:
        print(
            "--nic-pipeline is the twin's (the emulation's NICs run the XDP program in the "
            "kernel; the flow engine has no NIC)",
            file=sys.stderr,
        )
        return 2
    if args.engine != "emu" and args.link_time is not None:
        print(
            "--link-time is the emulation's (the twin's links always take the model's time)",
            file=sys.stderr,
        )
        return 2
    if args.engine == "flow" and args.transport_pipeline is not None:
        print("--transport-pipeline: the flow engine has no transport", file=sys.stderr)
        return 2
    if args.engine != "sim" and args.loop_pipeline is not None:
        print(
            "--loop-pipeline is the twin's (the emulation's switch processes take --io)",
            file=sys.stderr,
        )
        return 2
    if args.engine != "sim" and args.host_pipeline is not None:
        print(
            "--host-pipeline is the twin's (the emulation's hosts are processes)", file=sys.stderr
        )
        return 2
    if bad:
        print(f"unknown scheme or scenario: {bad}", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print("--repeat must be at least 1", file=sys.stderr)
        return 2
    if args.probes is not None and not 0 < args.probes < float("inf"):
        print("--probes must be a positive number of milliseconds", file=sys.stderr)
        return 2
    if args.probes is not None and args.engine == "flow":
        print("--probes runs on the packet engines, not --engine flow", file=sys.stderr)
        return 2
    try:
        check_ack_every(args.ack_every)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    base = SuiteConfig.quick() if args.quick else SuiteConfig()
    try:
        params = {}
        for item in args.param:
            name, eq, value = item.partition("=")
            if not eq:
                raise ValueError(f"--param {item}: NAME=VALUE")
            params[name] = suite_param(name, value)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.flows is not None:
        scenarios = ("flows",)
    cfg = SuiteConfig(
        **{
            **base.__dict__,
            **params,
            "schemes": schemes,
            "scenarios": scenarios,
            "seed": args.seed,
            "repeat": args.repeat,
            "retransmit": args.retransmit,
            "pfc_watchdog": args.pfc_watchdog == "on",
            "proactive_start": args.proactive_start,
            "ack_every": args.ack_every,
            "probe_interval_s": None if args.probes is None else args.probes / 1e3,
            **cc_config(args),
        }
    )
    if args.faults is not None:
        from testbed import faults
        from testbed.topo import parse_choice

        try:
            args.fault_list = faults.load(parse_choice(args.topo), args.faults)
        except faults.FaultError as exc:
            print(f"--faults: {exc}", file=sys.stderr)
            return 2
    else:
        args.fault_list = []
    if args.engine == "sim":
        from testbed.sim.run import run_sim

        return run_sim(args, cfg)
    if args.engine == "flow":
        from testbed.flow.suite import run_flow

        if args.flows is not None:
            print("--flows runs on the packet engines, not --engine flow", file=sys.stderr)
            return 2
        return run_flow(args, cfg)
    if args.flows is not None:
        print("--flows runs on the twin (--engine sim)", file=sys.stderr)
        return 2
    if "storm" in scenarios:
        print(
            "the storm runs on the twin (--engine sim): the emulation's NICs honour PFC "
            "pauses but do not send them",
            file=sys.stderr,
        )
        return 2
    if any(lossless(s) for s in schemes) and args.switch == "bmv2":
        print(
            "lossless schemes need the built-in switch (--switch builtin): bmv2 has no PFC",
            file=sys.stderr,
        )
        return 2
    from testbed.emu.network import install_signal_handlers
    from testbed.emu.suite import EmuSuite

    install_signal_handlers()
    t0 = time.monotonic()
    tb = _testbed(args)
    with tb:
        with EmuSuite(tb, cfg) as suite:
            suite.faults = args.fault_list
            records = suite.run()
            base_rtt, tita_t = suite.base_rtt_s, suite.tita_t_s
            rto = suite.rto_s()
            cc_records = suite.cc_records
            telemetry = suite.telemetry
        s = tb.scaling
        setup = {
            "engine": "emu",
            "command": args.command,
            "topology": tb.spec.name,
            "switch": tb.switch_cls.kind,
            "scaling": s.describe(),
            "scale": s.scale,
            "buffer": s.model.buffer,
            "pipeline": args.pipeline,
            "transport_pipeline": tb.opts.transport_pipeline,
            "link_bps": s.link_bps,
            "nic_bps": s.nic_bps,
            "base_rtt_s": base_rtt,
            "tita_base_rtt_s": tita_t,
            "link_time": tb.opts.link_time,
            "link_delay_s": tb.link_delay_s,
            "rto_s": rto,
            "suite": cfg.__dict__,
            "cc_profiles": cc_records,
            "telemetry": telemetry,
            "controller_caps": args.controller_caps,
            "faults_file": str(args.faults) if args.faults else None,
            "faults": [f.to_dict() for f in args.fault_list],  # as run, whatever the file becomes
            "queue_source": "INT queue occupancy of every data packet arriving at a "
            "host (per departure from each hop)",
        }
        write_results(tb.run_dir / "results.json", records, setup)
        plots = write_plots(records, tb.run_dir, s.link_bps, s.nic_bps)
        csvs = write_csvs(records, tb.run_dir)
        tb.say("stopping the testbed")
    left = tb.leftovers()
    print()
    print(f"{tb.spec.name}, {tb.switch_cls.kind} switches; {s.describe()}")
    print(
        f"base RTT {base_rtt * 1e3:.2f} ms (measured), TiTa's T {tita_t * 1e3:.1f} ms; "
        "queue: INT at the bottleneck egress port"
    )
    if tb.switch_cls.kind == "bmv2":
        print(bmv2_caveat(s))
    print()
    print(table(records))
    print()
    for line in [*verdict(records), *telemetry_notes(setup), *operations_notes(records)]:
        print(line)
    print()
    print(f"results: {tb.run_dir / 'results.json'}")
    print("plots:   " + (", ".join(str(p) for p in plots) or "none"))
    print("csv:     " + ", ".join(str(p) for p in csvs))
    print(f"logs:    {tb.run_dir / 'logs'}")
    print(f"total {time.monotonic() - t0:.0f} s; left behind: {', '.join(left) or 'nothing'}")
    return 0 if not left else 1


def cmd_cli(args: argparse.Namespace) -> int:
    from testbed.emu.cli import run_cli
    from testbed.emu.network import install_signal_handlers

    install_signal_handlers(SystemExit)
    with _testbed(args) as tb:
        run_cli(tb)
    left = tb.leftovers()
    print(f"stopped; left behind: {', '.join(left) or 'nothing'}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from testbed.replay import main

    return main(args)


def cmd_report(args: argparse.Namespace) -> int:
    from testbed.collective_cli import OUTPUTS, report
    from testbed.experiment.report import load_results, markdown_report

    run = args.run
    if any((run / name).exists() for name in OUTPUTS) or run.name in OUTPUTS:
        print(report(run, args.markdown))  # a collective, jobs or tune run
        return 0
    if args.markdown:
        print(markdown_report(args.run))
    else:
        print(load_results(args.run)["table"])
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from testbed.experiment.report import compare

    print(compare(args.runs, median=args.median))
    return 0


def cmd_peer(args: argparse.Namespace) -> int:
    from testbed.peer.ns3_hpcc import cmd_peer as run

    return run(args)


def cmd_sweep(args: argparse.Namespace) -> int:
    from testbed.sweep import cmd_sweep as run

    return run(args)


def cmd_doctor(args: argparse.Namespace) -> int:
    from testbed.emu.doctor import report

    return report()


def cmd_flows(args: argparse.Namespace) -> int:
    from testbed.topo import End, parse_choice
    from testbed.traffic import generators as gen

    spec = parse_choice(args.topo)
    gbps = args.gbps or spec.link_gbps(End(spec.hosts[0].name, 0), DEFAULT_MODEL.port_speed_gbps)
    flows = gen.poisson(
        len(spec.hosts),
        gen.SizeCdf.load(args.cdf),
        args.load,
        gbps * 1e9,
        args.seconds,
        seed=args.seed,
    )
    what = (
        f"{args.cdf} at {args.load:g} of {gbps:g} Gb/s per host, {args.seconds * 1e3:g} ms of "
        f"Poisson arrivals, seed {args.seed}, {spec.name}: {len(flows)} flows, "
        f"{sum(f.size for f in flows) / 1e6:.1f} MB"
    )
    text = gen.flows_csv(flows, [h.name for h in spec.hosts], what)
    if args.out is None:
        print(text, end="")
    else:
        args.out.write_text(text)
        print(f"{args.out}: {what}", file=sys.stderr)
    return 0


def cmd_topo(args: argparse.Namespace) -> int:
    from testbed.topo import dump, parse_choice

    spec = parse_choice(args.topo)
    if args.dump:
        print(dump(spec), end="")
        return 0
    print(
        f"{spec.name}: {len(spec.switches)} switches, {len(spec.hosts)} hosts, "
        f"{len(spec.links)} links; longest path {spec.longest_path_switches()} switches"
    )
    for lk in spec.links:
        print(f"  {lk.a} -- {lk.b}")
    if spec.collector is not None:
        print(f"  {spec.collector} -- collector")
    return 0


def _command(argv: list[str]) -> str:
    """What the user typed, kept in the results file (the docs name the command of a table),
    less where the outputs went: the same inputs give the same file wherever it is written."""
    kept: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--run-dir":
            skip = True
        elif not a.startswith("--run-dir="):
            kept.append(a)
    return shlex.join(["xingmai-testbed", *kept])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.command = _command(sys.argv[1:] if argv is None else argv)
    try:
        from testbed.collective_cli import COMMANDS
        from testbed.flow.cli import COMMANDS as FLOW_COMMANDS

        return {
            "run": cmd_run,
            "cli": cmd_cli,
            "doctor": cmd_doctor,
            "topo": cmd_topo,
            "flows": cmd_flows,
            "compare": cmd_compare,
            "report": cmd_report,
            "sweep": cmd_sweep,
            "replay": cmd_replay,
            "peer": cmd_peer,
            **COMMANDS,
            **FLOW_COMMANDS,
        }[args.cmd](args)
    except ValueError as exc:  # testbed.topo.TopologyError and bad options
        print(f"xingmai-testbed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("xingmai-testbed: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    except UserError as exc:  # a testbed or component that cannot start, a missing extra
        print(f"xingmai-testbed: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly, as Unix tools do
        try:  # and let the interpreter's last flush of stdout go nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            pass
        return 141


if __name__ == "__main__":
    sys.exit(main())


def bmv2_caveat(s: Scaling) -> str:
    """What differs on bmv2, said under its table: bmv2's traffic manager counts packets."""
    f = s.frame_bytes
    return (
        f"bmv2: queues drain in packets/s (port speed / {f} B frames), so an ACK costs a "
        "port as much time as a full frame and data sharing a port with ACKs drains below "
        f"the port's speed; INT queue depths are packets x {f} B; bmv2 has no PFC (the "
        "lossless schemes run on the built-in switch). Not comparable with the built-in "
        "switch's table figure for figure."
    )
