"""`xingmai-testbed run --engine sim`: the suite on the simulated twin, with the emulation's
outputs (results.json, the table, the plots, flows.csv and queues.csv:
testbed.experiment.report.write_csvs).

The flow list of `--flows FILE` is a CSV with a header `src,dst,bytes,start_s`: source and
destination host names (as the topology names them), the flow's size in bytes and its start
in seconds of the model at the run's scale (lines starting with # are comments).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from testbed.experiment.rundir import new_run_dir
from testbed.experiment.suite import SuiteConfig, fmt_time
from testbed.model import DEFAULT_MODEL, Scaling, model_with_buffer
from testbed.sim.fabric import SimFabric
from testbed.sim.suite import SimSuite
from testbed.switch.v1model import DEFAULT_PIPELINE
from testbed.topo import FabricSpec, dump, parse_choice
from testbed.traffic.generators import Flow


def load_flows(path: Path, spec: FabricSpec) -> list[Flow]:
    """A --flows file (see the module's docstring) as the workloads' flows."""
    index = {h.name: i for i, h in enumerate(spec.hosts)}
    flows: list[Flow] = []
    lines = [
        ln for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    rows = list(csv.DictReader(lines))
    if not rows or set(rows[0]) != {"src", "dst", "bytes", "start_s"}:
        raise ValueError(f"{path}: expected a CSV header src,dst,bytes,start_s")
    slots: dict[tuple[int, int], int] = {}
    for n, row in enumerate(rows, start=2):
        try:
            src, dst = index[row["src"].strip()], index[row["dst"].strip()]
            size, start = int(row["bytes"]), float(row["start_s"])
        except KeyError as exc:
            raise ValueError(f"{path}:{n}: unknown host {exc}") from None
        except (TypeError, ValueError):
            raise ValueError(f"{path}:{n}: bytes must be an integer, start_s a number") from None
        if src == dst or size < 1 or start < 0:
            raise ValueError(
                f"{path}:{n}: a flow needs two different hosts, bytes >= 1 and start_s >= 0"
            )
        # flows of one pair take turns on a few queue pairs, as the generators do
        k = slots.get((src, dst), 0)
        slots[(src, dst)] = (k + 1) % 4
        flows.append(Flow(id=len(flows), src=src, dst=dst, size=size, start=start, slot=k))
    return flows


def run_sim(args: argparse.Namespace, cfg: SuiteConfig) -> int:
    from testbed.experiment.plots import write_plots
    from testbed.experiment.report import (
        operations_notes,
        table,
        telemetry_notes,
        verdict,
        write_csvs,
        write_results,
    )

    t0 = time.monotonic()
    spec = parse_choice(args.topo)
    scaling = Scaling(
        model=model_with_buffer(getattr(args, "buffer", DEFAULT_MODEL.buffer)),
        scale=args.scale,
        max_hops=spec.longest_path_switches(),
    )
    run_dir = args.run_dir or new_run_dir("sim")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "topology.yaml").write_text(dump(spec))  # as the emulation does (replay reads it)

    def say(line: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {line}", file=sys.stderr, flush=True)

    say(f"twin: {spec.name}, {scaling.describe()}")
    fab = SimFabric(
        spec,
        scaling,
        seed=cfg.seed,
        pipeline=getattr(args, "pipeline", DEFAULT_PIPELINE),
        nic_pipeline=getattr(args, "nic_pipeline", None),
        loop_pipeline=getattr(args, "loop_pipeline", None),
        host_pipeline=getattr(args, "host_pipeline", None),
        transport_pipeline=getattr(args, "transport_pipeline", None),
    )
    if fab.pipeline == "native":
        sw = next(iter(fab.switches.values())).sw
        if sw.pipeline_in_use != "native":
            say(f"native pipeline unavailable ({sw.native_reason}): the reference runs")
    if fab.nic_native_reason:
        say(f"native NIC unavailable ({fab.nic_native_reason}): the reference runs")
    say(
        f"{len(fab.switches)} built-in switches programmed through P4Runtime "
        f"({sum(len(s.sw.compiled.tables) for s in fab.switches.values() if s.sw.compiled)}"
        " tables loaded), "
        f"{len(fab.hosts)} hosts"
    )
    suite = SimSuite(fab, cfg, say)
    if args.flows is not None:
        suite.flows_override = load_flows(args.flows, spec)
    suite.faults = getattr(args, "fault_list", [])
    records = suite.run()
    for why in sorted(suite.fab.transport_native_reasons):
        say(f"native transport not run for some jobs ({why}): the reference ran them")
    wall = time.monotonic() - t0
    setup = {
        "engine": "sim",
        "command": getattr(args, "command", None),
        "topology": spec.name,
        "switch": "builtin",
        "scaling": scaling.describe(),
        "scale": scaling.scale,
        "buffer": scaling.model.buffer,
        "pipeline": next(iter(fab.switches.values())).sw.pipeline_in_use,
        "nic_pipeline": fab.nic_pipeline_in_use,
        "loop_pipeline": fab.loop_in_use,
        # which host loops the jobs ran (as transport_pipeline), and why not native
        "host_pipeline": "+".join(sorted(suite.fab.host_in_use)) or None,
        "host_native_reasons": sorted(suite.fab.host_native_reasons),
        # which cores the jobs ran ("native", "reference", or both where some jobs' transport
        # the native core does not run), and why not native where it was asked for
        "transport_pipeline": "+".join(sorted(suite.fab.transport_in_use)) or None,
        "transport_native_reasons": sorted(suite.fab.transport_native_reasons),
        "link_bps": scaling.link_bps,
        "nic_bps": scaling.nic_bps,
        "base_rtt_s": suite.base_rtt_s,
        "tita_base_rtt_s": suite.tita_t_s,
        "link_delay_s": fab.delay_ns / 1e9,
        "rto_s": suite.rto_s(),
        "suite": cfg.__dict__,
        # per scheme: its law's CC profile, the profile's source and the values the NICs ran
        "cc_profiles": suite.cc_records,
        "telemetry": suite.telemetry,
        "flows_file": str(args.flows) if args.flows else None,
        "faults_file": str(args.faults) if getattr(args, "faults", None) else None,
        "faults": [f.to_dict() for f in suite.faults],  # as run, whatever the file becomes
        "controller_caps": False,
        "events": suite.total_events,
        "simulated_s": suite.total_simulated_s,
        "queue_source": "INT queue occupancy of every data packet arriving at a "
        "host (per departure from each hop)",
    }
    write_results(
        run_dir / "results.json",
        records,
        setup,
        machine_extra={"wall_s": round(wall, 1), "events_per_s": round(suite.total_events / wall)},
    )
    plots = write_plots(records, run_dir, scaling.link_bps, scaling.nic_bps)
    csvs = write_csvs(records, run_dir)
    print()
    print(
        f"{spec.name}, simulated twin (built-in switch pipeline, virtual time); "
        f"{scaling.describe()}"
    )
    print(
        f"base RTT {fmt_time(suite.base_rtt_s)} (simulated), TiTa's T "
        f"{fmt_time(suite.tita_t_s)}; queue: INT at the bottleneck egress port"
    )
    print()
    print(table(records, scaling.link_bps))
    print()
    for line in [*verdict(records), *telemetry_notes(setup), *operations_notes(records)]:
        print(line)
    print()
    print(f"results: {run_dir / 'results.json'}")
    print("plots:   " + (", ".join(str(p) for p in plots) or "none"))
    print("csv:     " + ", ".join(str(p) for p in csvs))
    print(
        f"{suite.total_events} events, {suite.total_simulated_s:.3g} s simulated in {wall:.0f} s "
        f"({suite.total_events / wall:.0f} events/s)"
    )
    return 0
