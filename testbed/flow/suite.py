"""`xingmai-testbed run --engine flow`: the suite's collective scenarios (allreduce,
alltoall) on the flow engine, with the same results.json and table as the packet engines.

A run's time is the flow engine's ideal time (max-min rates, the all-to-all through FIFO
queues, and each step's latency from
the model's base RTT, `collectives.model_link_latency`) divided by the scheme's efficiency
fitted on the twin (testbed.flow.calibration); its bus bandwidth follows. What a fluid model
cannot measure is left at nothing: no queue samples (the queue columns read 0 with
`queue_samples` 0), no drops, no INT, retransmissions, CNPs or rate series, no fairness, no
correctness check (no data moves). The bottleneck is the link the ideal computation loaded
most, and its utilisation is that link's bits over its capacity and the run's time.

It runs at the model's own speed (400G links, `--scale 1`): the flow engine has no dilated
emulation to match.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from controller.nic.ratelaw import CcParams
from testbed.errors import UserError
from testbed.experiment.plots import write_plots
from testbed.experiment.rundir import new_run_dir
from testbed.experiment.schemes import cc_profile_name
from testbed.experiment.suite import RunRecord, Suite, SuiteConfig
from testbed.faults import Fault, target_class
from testbed.flow import calibration, lossfit
from testbed.flow.collectives import CollResult, model_link_latency, suite_collective
from testbed.flow.fabric import Fabric, fail, from_spec, lose, slow
from testbed.model import Scaling
from testbed.topo import FabricSpec, dump, parse_choice

FLOW_SCENARIOS = ("allreduce", "alltoall")


class FlowSuite(Suite):
    """The suite's loop and records over the flow engine. It overrides `run_one` (a run is
    one computation, not jobs on hosts), so the packet engines' hooks are not used."""

    reseed_repetitions = True  # deterministic

    def __init__(
        self,
        spec: FabricSpec,
        cfg: SuiteConfig,
        say: Callable[[str], None],
        faults: Sequence[Fault] = (),
    ):
        super().__init__(cfg, say)
        bad = [s for s in cfg.scenarios if s not in FLOW_SCENARIOS]
        if bad:
            raise UserError(
                f"the flow engine models {', '.join(FLOW_SCENARIOS)}, not "
                f"{', '.join(bad)} (--scenarios {','.join(FLOW_SCENARIOS)})"
            )
        for scheme in cfg.schemes:  # refuse before running anything
            for scenario in cfg.scenarios:
                calibration.require(scheme, scenario)
        # per (scheme, scenario): the efficiency each ran at and which fit gave it
        self.applied: dict[str, dict[str, calibration.Applied]] = {}
        self.spec = spec
        self.scaling = Scaling(scale=1.0, max_hops=spec.longest_path_switches())
        self.hosts = []
        self.fab: Fabric = from_spec(spec, self.scaling.model.port_speed_gbps)
        down, cuts, self.losses = flow_faults(spec, faults)
        if down:
            self.fab = fail(self.fab, down)
        if cuts:
            self.fab = slow(self.fab, cuts)
        # per scheme: the fabric with its lossy links at that scheme's goodput, made (or
        # refused: no fit, another CC profile, a loss beyond the fit) before anything runs
        self.lossy_fabs: dict[str, Fabric] = {}
        for scheme in cfg.schemes if self.losses else ():
            lossfit.require(scheme, cc_profile_name(scheme, cfg.cc_profiles, cfg.cc_set))
            goodput = {el: lossfit.goodput(scheme, p) for el, p in self.losses.items()}
            self.lossy_fabs[scheme] = lose(self.fab, goodput)
        self._ideals: dict[tuple[int, str], CollResult] = {}  # `ideal`'s, per fabric

    def _measure_base_rtt(self) -> float:
        return self.scaling.base_rtt_s  # the model's: a fluid model has no RTT to measure

    def prepare(self) -> None:
        self.base_rtt_s = self.tita_t_s = self._measure_base_rtt()
        down = f"; down: {', '.join(self.fab.failed)}" if self.fab.failed else ""
        down += "".join(f"; {el} at {f:.0%}" for el, f in self.fab.slowed)
        down += "".join(f"; {el} losing {p:.2%}" for el, p in self.losses.items())
        self.say(
            f"flow engine: {self.spec.name}, {self.fab.n_links} directed links; no RTT "
            f"is measured (the model's, 1 us){down}"
        )

    def _set_policy(self, scheme: str, cc: dict[str, CcParams]) -> int:
        return 0  # no NICs: the scheme is its calibrated efficiency

    def fabric_for(self, scheme: str) -> Fabric:
        """The fabric as `scheme` runs it: its lossy links at the goodput its transport keeps
        through them (the twin's loss fit of that scheme)."""
        return self.lossy_fabs.get(scheme, self.fab)

    def ideal(self, scheme: str, scenario: str) -> CollResult:
        """The scenario's ideal on the fabric as `scheme` runs it: a function of the fabric,
        the scenario and the suite's sizes and seed alone, so computed once for the schemes
        that share a fabric (all but those with lossy links of their own)."""
        fab = self.fabric_for(scheme)
        size = self.cfg.allreduce_bytes if scenario == "allreduce" else self.cfg.alltoall_bytes
        key = (id(fab), scenario)
        if key not in self._ideals:
            self._ideals[key] = suite_collective(
                fab, scenario, size, model_link_latency(), self.spec, self.cfg.seed
            )
        return self._ideals[key]

    def run_one(self, scheme: str, scenario: str) -> RunRecord:
        ideal = self.ideal(scheme, scenario)
        got = calibration.applied(scheme, scenario, ideal)  # its note: under the table
        if ideal.overflow is not None:
            got = replace(got, note="; ".join(n for n in (got.note, overflow_note(ideal)) if n))
        self.applied.setdefault(scheme, {})[scenario] = got
        eff = got.efficiency
        n = self.fab.servers
        return RunRecord(
            scheme=scheme,
            scenario=scenario,
            bottleneck=ideal.bottleneck,
            queue_p50_bytes=0.0,
            queue_p99_bytes=0.0,
            queue_max_bytes=0.0,
            queue_samples=0,
            drops=0,
            utilization=min(1.0, ideal.bottleneck_util * eff),
            fct_slowdown_p50=None,
            fct_slowdown_p99=None,
            flows=n,
            flows_completed=n,
            busbw_bps=ideal.busbw_at(ideal.time_at(eff)),
            completion_s=ideal.time_at(eff),
            int_packets=0,
            int_max_hops=0,
            retransmits=0,
            cnps=0,
            out_of_order=0,
            window=0,
            correct=None,
        )


def overflow_note(ideal: CollResult) -> str:
    """What a collective whose FIFOs pass the buffer's admission is: no figure this engine
    was fitted to give (docs/flow.md, "Side by side with the twin at 128 hosts")."""
    o = ideal.overflow
    assert o is not None
    return (
        f"with no law acting its queue at {o['link']} would reach {o['queue_bytes'] / 1e3:,.0f}"
        f" KB and its switch's queues {o['switch_queues_bytes'] / 1e3:,.0f} KB of a "
        f"{o['switch_buffer_bytes'] / 1e3:,.0f} KB shared buffer, past what it admits (a queue "
        f"holds at most {o['alpha']:g} times what is free): where the flows are too short for "
        "their law the packet engines drop there and wait out resends, which no fit here "
        "covers (docs/flow.md): a figure to check on the twin"
    )


def flow_faults(
    spec: FabricSpec, faults: Sequence[Fault]
) -> tuple[list[str], dict[str, float], dict[str, float]]:
    """`--faults` as the flow engine takes them, for the whole run (at 0): links down and
    switches killed (routed around as the controller's fail-over does); links (by one end)
    or hosts' NICs (each NIC's own end: what it sends) at a fraction of their rate; and links
    or NICs losing a share of their frames, silently or not (`lossfit`: at the goodput the
    scheme's transport keeps through them). Other kinds, a NIC down, and a fault that comes
    later have no meaning in a fluid model of one collective and are refused. Returns what
    is down, the rate cuts and the losses, by element."""
    down: list[str] = []
    cuts: dict[str, float] = {}
    losses: dict[str, float] = {}
    taken = ("down", "kill", "rate", "loss", "silent-loss")
    for f in faults:
        cls = target_class(spec, f.target)
        if f.kind not in taken or f.at != 0 or (cls, f.kind) == ("nic", "down"):
            raise UserError(
                f"--faults {f.describe()} at {f.at:g} s: the flow engine takes links down, "
                "switches killed, rate cuts and losses from the start (at: 0); delay, "
                "flaps, a silent rate cut and a NIC down run on the packet engines"
            )
        if f.kind in ("down", "kill"):
            down.append(f.target)
            continue
        assert f.value is not None
        nics = range(len(spec.host(f.target).nics)) if cls == "nic" else None
        into = cuts if f.kind == "rate" else losses
        for end in [f.target] if nics is None else [f"{f.target}:{i}" for i in nics]:
            into[end] = f.value
    return down, cuts, losses


def run_flow(args: argparse.Namespace, cfg: SuiteConfig) -> int:
    from testbed.experiment.report import table, write_results

    t0 = time.monotonic()
    spec = parse_choice(args.topo)
    run_dir = args.run_dir or new_run_dir("flow")

    def say(line: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {line}", file=sys.stderr, flush=True)

    # its fits hold for the CC profiles the twin ran them under, no other
    calibration.check_profiles(cfg.schemes, cfg.cc_profiles, cfg.cc_set)
    faults = getattr(args, "fault_list", [])
    suite = FlowSuite(spec, cfg, say, faults)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "topology.yaml").write_text(dump(spec))
    records = suite.run()
    s = suite.scaling
    eff = {sc: {c: got.as_dict() for c, got in per.items()} for sc, per in suite.applied.items()}
    setup = {
        "engine": "flow",
        "command": getattr(args, "command", None),
        "topology": spec.name,
        "switch": "none (flow-level)",
        "scaling": s.describe(),
        "scale": 1.0,
        "link_bps": s.link_bps,
        "nic_bps": s.nic_bps,
        "base_rtt_s": suite.base_rtt_s,
        "tita_base_rtt_s": suite.tita_t_s,
        "suite": cfg.__dict__,
        "cc_profiles": {
            sc: {"profile": cc_profile_name(sc, cfg.cc_profiles, cfg.cc_set)} for sc in cfg.schemes
        },
        "flow_efficiency": eff,
        "calibration": str(calibration.CALIBRATION.name),
        "queue_source": "none: a fluid model has no queues (docs/flow.md)",
        "faults": [f.to_dict() for f in faults],
        "loss_goodput": {
            sc: dict(suite.fabric_for(sc).lossy) for sc in cfg.schemes if suite.losses
        },
    }
    write_results(
        run_dir / "results.json",
        records,
        setup,
        machine_extra={"wall_s": round(time.monotonic() - t0, 2)},
    )
    print()
    print(
        f"{spec.name}, flow engine (max-min rates, the all-to-all through FIFO queues, over "
        f"ECMP paths, x the efficiency fitted on the "
        f"twin); 400G links, scale 1"
    )
    print()
    print(table(records, s.link_bps))
    print()
    for sc, per in suite.applied.items():
        for c, got in per.items():
            print(
                f"{c} {sc}: efficiency {got.efficiency:.3f}, {got.regime} fit"
                + (f"; {got.note}" if got.note else "")
            )
    print()
    plots = write_plots(records, run_dir, s.link_bps, s.nic_bps)
    print(f"results: {run_dir / 'results.json'}")
    print("plots:   " + (", ".join(str(p) for p in plots) or "none"))
    return 0
