"""`xingmai-testbed replay RUN_DIR` (灵境): replay a recorded job in the simulated twin under
candidate faults and name the one that explains its slowdown.

A recorded run is a run directory of `xingmai-testbed run` on either engine: `results.json`
(per scenario and scheme: the job's completion time and, for flow workloads, every flow's
FCT; the telemetry kept from the INT records of the data packets — each link's queue
percentiles —; the switches' drops, the transports' retransmissions; the controller's ranked
suspects) and `topology.yaml`. The job itself is the suite's workload, rebuilt from the run's
suite settings and seed; the replay never reads the faults the run injected. (The controller's
collector keeps its own per-link series, but the run directory does not hold them yet: the
queue profile comes from the hosts' INT records, which both engines record alike.)

1. The record to explain (`--scenario`, `--scheme`; by default the run's only one).
2. Candidates: each element the controller suspected, with the faults its kind of suspect
   means (a slow link: its rate cut or a delay; a lossy link: loss; a link down; a slow or
   dead switch); when the record names no suspect (or to widen the search, `--widen`), the
   links whose recorded queue was highest and the switches that dropped most, with every
   fault of their class. Plus "no fault".
3. Each candidate is the record's job replayed in the twin (the same topology, scale, scheme,
   suite settings and seed) with the fault injected from the start through the twin's fault
   mechanism (testbed/faults.py, testbed/sim/operations.py). Replays run in parallel, one
   twin per worker process, built once.
4. Each replay is scored by how far it is from the record: the completion time (log ratio),
   the queue profile (per link p99, as a fraction of the larger of the two profiles), the
   retransmissions (log ratio, damped), and, for flow workloads, the FCT percentiles. The
   lowest score is the culprit; its evidence is each term next to the healthy twin's.

    xingmai-testbed replay runs/20261201-230102 --scenario allreduce --scheme tita
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed import faults
from testbed.experiment.suite import SuiteConfig
from testbed.faults import Fault
from testbed.model import Scaling, model_with_buffer
from testbed.topo import FabricSpec, load

# the faults each kind of suspect stands for (the localizer's kinds, controller/health.py)
SUSPECT_FAULTS: dict[str, list[tuple[str, str | None]]] = {
    "slow-link": [("rate", "10%"), ("rate", "25%"), ("rate", "50%"), ("delay", "2ms")],
    "lossy-link": [("loss", "1%"), ("loss", "5%")],
    "link-down": [("down", None)],
    "slow-switch": [("slow", "2ms"), ("slow", "5ms")],
    "switch-unreachable": [("kill", None)],
}
# every fault of a class, for elements drawn from the telemetry
CLASS_FAULTS: dict[str, list[tuple[str, str | None]]] = {
    "link": [
        ("rate", "10%"),
        ("rate", "25%"),
        ("rate", "50%"),
        ("loss", "1%"),
        ("delay", "2ms"),
        ("down", None),
    ],
    "switch": [("slow", "2ms"), ("slow", "5ms")],
}
# a link's p99 queue below three 4 KB frames is noise, not congestion: on the emulation the
# uncongested links of a ring all-reduce show 4-11 KB (a software switch's scheduling hiccups)
QUEUE_FLOOR_BYTES = 12_000


class ReplayError(ValueError):
    pass


# ---- the record -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """What a run recorded of one job: the figures a replay must reproduce."""

    scenario: str
    scheme: str
    completion_s: float
    queue_p99: dict[str, float]  # per link ("switch:port"), bytes
    retransmits: int
    drops_by_switch: dict[str, int]
    fct_p50: float | None
    fct_p99: float | None
    suspects: list[dict[str, Any]] = field(default_factory=list)

    @staticmethod
    def of(run: dict[str, Any]) -> Observed:
        return Observed(
            scenario=run["scenario"],
            scheme=run["scheme"],
            completion_s=float(run["completion_s"]),
            queue_p99={k: float(v["p99"]) for k, v in run.get("queue_by_link", {}).items()},
            retransmits=int(run.get("retransmits", 0)),
            drops_by_switch={k: int(v) for k, v in run.get("drops_by_switch", {}).items()},
            fct_p50=run.get("fct_slowdown_p50"),
            fct_p99=run.get("fct_slowdown_p99"),
            suspects=list(run.get("suspects", [])),
        )


@dataclass(frozen=True)
class Recording:
    run_dir: Path
    spec: FabricSpec
    scaling: Scaling
    cfg: SuiteConfig
    setup: dict[str, Any]
    runs: list[dict[str, Any]]


def load_recording(run_dir: Path) -> Recording:
    res_path, topo_path = run_dir / "results.json", run_dir / "topology.yaml"
    try:
        doc = json.loads(res_path.read_text())
    except (OSError, ValueError) as exc:
        raise ReplayError(f"{res_path}: not a results file ({exc})") from None
    if not topo_path.is_file():
        raise ReplayError(f"{topo_path}: missing (the run's topology)")
    setup = doc["setup"]
    spec = load(topo_path)
    scaling = Scaling(
        model=model_with_buffer(setup.get("buffer", "static")),  # before --buffer: static
        scale=float(setup["scale"]),
        max_hops=spec.longest_path_switches(),
    )
    suite = dict(setup["suite"])
    suite["schemes"] = tuple(suite["schemes"])
    suite["scenarios"] = tuple(suite["scenarios"])
    # TiTa's T as the run had it, not re-measured on the twin
    suite["tita_base_rtt_s"] = setup.get("tita_base_rtt_s") or suite.get("tita_base_rtt_s")
    # a run recorded before the proactive start existed started every flow at line rate
    suite.setdefault("proactive_start", False)
    cfg = SuiteConfig(**{k: v for k, v in suite.items() if k in SuiteConfig.__dataclass_fields__})
    return Recording(run_dir, spec, scaling, cfg, setup, list(doc["runs"]))


def pick_run(rec: Recording, scenario: str | None, scheme: str | None) -> dict[str, Any]:
    runs = [
        r
        for r in rec.runs
        if (scenario is None or r["scenario"] == scenario)
        and (scheme is None or r["scheme"] == scheme)
    ]
    if not runs:
        have = ", ".join(f"{r['scenario']}/{r['scheme']}" for r in rec.runs)
        raise ReplayError(
            f"no record {scenario or '*'}/{scheme or '*'} in the run (it has: {have})"
        )
    if len(runs) > 1:
        have = ", ".join(f"{r['scenario']}/{r['scheme']}" for r in runs)
        raise ReplayError(f"several records match ({have}): give --scenario and --scheme")
    return runs[0]


# ---- candidates -------------------------------------------------------------------------------


def suspect_target(spec: FabricSpec, element: str) -> str | None:
    """A suspect's element as a fault target: "link leaf1:5-spine1:1" -> leaf1:5 (one end
    names the link), "link h1:h1-eth0-leaf1:1" -> leaf1:1 (a host link's switch end: a host's
    interface name may hold a '-' too), "switch spine1" -> spine1, "nic h3" -> h3."""
    kind, _, name = element.partition(" ")
    if kind == "link":
        for i, c in enumerate(name):
            if c != "-":
                continue
            for end in (name[:i], name[i + 1 :]):
                try:
                    if faults.target_class(spec, end) == "link":
                        return end
                except faults.FaultError:
                    continue
        return None
    if kind in ("switch", "nic"):
        return name or None
    return None


def _make(spec: FabricSpec, target: str, kind: str, value: str | None) -> Fault | None:
    try:
        return faults.make(spec, target, kind, value)
    except faults.FaultError:
        return None


def _same_link(spec: FabricSpec, a: str, b: str) -> bool:
    if a == b:
        return True
    if ":" not in a or ":" not in b:
        return False
    from testbed.topo import End

    na, _, ia = a.partition(":")
    peer = spec.peer(End(na, int(ia)))
    return peer is not None and str(peer) == b


def candidates(spec: FabricSpec, obs: Observed, widen: int = 0) -> list[tuple[Fault, str]]:
    """(fault, why) for every candidate: the suspects' faults first, then, when there is no
    suspect or `widen` > 0, every fault of the `widen` (at least 3) elements the telemetry
    points at."""
    out: list[tuple[Fault, str]] = []
    seen: set[tuple[str, str, float | None]] = set()

    def add(f: Fault | None, why: str) -> None:
        if f is None:
            return
        key = (f.target, f.kind, f.value)
        if any(_same_link(spec, f.target, t) and (k, v) == (f.kind, f.value) for t, k, v in seen):
            return
        seen.add(key)
        out.append((f, why))

    for i, s in enumerate(obs.suspects):
        target = suspect_target(spec, str(s.get("element", "")))
        if target is None:
            continue
        for kind, value in SUSPECT_FAULTS.get(str(s.get("kind", "")), []):
            add(
                _make(spec, target, kind, value),
                f"suspect #{i + 1} ({s.get('element')}: {s.get('kind')})",
            )
    if obs.suspects and widen <= 0:
        return out
    n = max(3, widen)
    # links by their recorded queue (a rate cut or a delay queues upstream of it), then the
    # switches that dropped (a lossy or dead link, a slow switch)
    links = sorted(
        (lk for lk, q in obs.queue_p99.items() if q > 0), key=lambda lk: -obs.queue_p99[lk]
    )[:n]
    for lk in links:
        for kind, value in CLASS_FAULTS["link"]:
            add(
                _make(spec, lk, kind, value),
                f"telemetry: queue p99 {obs.queue_p99[lk] / 1e3:.0f} KB at {lk}",
            )
    switches = sorted(
        (sw for sw, d in obs.drops_by_switch.items() if d > 0),
        key=lambda sw: -obs.drops_by_switch[sw],
    )[:n]
    for sw in switches:
        for kind, value in CLASS_FAULTS["switch"]:
            add(_make(spec, sw, kind, value), f"telemetry: {obs.drops_by_switch[sw]} drops at {sw}")
    return out


# ---- replaying --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replayed:
    fault: Fault | None
    completion_s: float
    queue_p99: dict[str, float]
    retransmits: int
    fct_p50: float | None
    fct_p99: float | None
    suspects: list[str]  # what the twin's localizer named (elements, ranked)
    wall_s: float
    cpu_s: float  # the worker's CPU time for this replay
    failed: str | None = None  # why the job did not complete under this fault (time: inf)


_twin: Any = None  # the worker's twin (SimSuite), built once by _init_worker


def _init_worker(spec: FabricSpec, scaling: Scaling, cfg: SuiteConfig, scheme: str) -> None:
    import logging

    from testbed.sim.fabric import SimFabric
    from testbed.sim.suite import SimSuite

    global _twin
    # the twin localizer's events (warnings) belong to the candidates: the ranking lists them
    logging.getLogger("xingmai").setLevel(logging.ERROR)
    fab = SimFabric(spec, scaling, seed=cfg.seed)
    suite = SimSuite(fab, cfg)
    suite.prepare()  # every candidate's run then starts on a fresh fabric with the scheme set
    _twin = suite


def _replay_one(scenario: str, scheme: str, fault: Fault | None) -> Replayed:
    t0, c0 = time.monotonic(), time.process_time()
    suite = _twin
    suite.faults = [fault] if fault is not None else []
    try:
        rec = suite.run_one(scheme, scenario)
    finally:
        suite.faults = []
    if rec.error:
        # the job cannot finish under this fault (a host cut off, a collective stuck): a
        # candidate that explains no completion at all (the twin left that job behind)
        return Replayed(
            fault,
            math.inf,
            {},
            0,
            None,
            None,
            [],
            time.monotonic() - t0,
            time.process_time() - c0,
            failed=rec.error,
        )
    return Replayed(
        fault,
        rec.completion_s,
        {k: v["p99"] for k, v in rec.queue_by_link.items()},
        rec.retransmits,
        rec.fct_slowdown_p50,
        rec.fct_slowdown_p99,
        [s["element"] for s in rec.suspects],
        time.monotonic() - t0,
        time.process_time() - c0,
    )


def replay_all(
    rec: Recording, obs: Observed, cands: list[Fault | None], jobs: int
) -> list[Replayed]:
    """Every candidate replayed in the twin, `jobs` twins in parallel."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no gRPC state forked
    with ProcessPoolExecutor(
        max_workers=max(1, min(jobs, len(cands))),
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(rec.spec, rec.scaling, rec.cfg, obs.scheme),
    ) as pool:
        futs = [pool.submit(_replay_one, obs.scenario, obs.scheme, c) for c in cands]
        return [f.result() for f in futs]


# ---- scoring ----------------------------------------------------------------------------------


def _log_ratio(a: float, b: float) -> float:
    return abs(math.log(max(a, 1e-9) / max(b, 1e-9)))


def score(obs: Observed, rep: Replayed) -> dict[str, float]:
    """Distance terms (0: identical); `total` ranks the candidates."""
    terms = {"time": _log_ratio(rep.completion_s, obs.completion_s)}

    # where the queues are: 1 - the weighted Jaccard overlap of the two profiles, each link's
    # p99 counted above the noise floor only (0: the same queues at the same links; 1: none
    # in common, or queues on one side only)
    def hot(q: dict[str, float]) -> dict[str, float]:
        return {lk: v for lk, v in q.items() if v >= QUEUE_FLOOR_BYTES}

    o, r = hot(obs.queue_p99), hot(rep.queue_p99)
    links = set(o) | set(r)
    both = sum(min(o.get(lk, 0.0), r.get(lk, 0.0)) for lk in links)
    either = sum(max(o.get(lk, 0.0), r.get(lk, 0.0)) for lk in links)
    terms["queue"] = 1.0 - both / either if either > 0 else 0.0
    terms["retransmits"] = 0.25 * _log_ratio(1 + rep.retransmits, 1 + obs.retransmits)
    if (
        obs.fct_p99 is not None
        and rep.fct_p99 is not None
        and obs.fct_p50 is not None
        and rep.fct_p50 is not None
    ):
        terms["fct"] = 0.5 * (
            _log_ratio(rep.fct_p50, obs.fct_p50) + _log_ratio(rep.fct_p99, obs.fct_p99)
        )
    terms["total"] = sum(terms.values())
    return terms


@dataclass(frozen=True)
class Ranked:
    replayed: Replayed
    why: str
    terms: dict[str, float]

    @property
    def name(self) -> str:
        return self.replayed.fault.describe() if self.replayed.fault else "no fault"


def rank(obs: Observed, reps: list[Replayed], whys: list[str]) -> list[Ranked]:
    out = [Ranked(r, w, score(obs, r)) for r, w in zip(reps, whys, strict=True)]
    return sorted(out, key=lambda x: (x.terms["total"], x.name))


def _top_queue(q: dict[str, float]) -> str:
    if not q or max(q.values()) <= 0:
        return "no queue"
    lk = max(q, key=lambda k: q[k])
    return f"{q[lk] / 1e3:.0f} KB at {lk}"


def evidence(obs: Observed, best: Ranked, healthy: Ranked | None) -> list[str]:
    r = best.replayed
    lines = [
        f"completion {r.completion_s:.3g} s replayed vs {obs.completion_s:.3g} s "
        f"recorded" + (f" (healthy twin {healthy.replayed.completion_s:.3g} s)" if healthy else ""),
        f"largest queue (p99): {_top_queue(r.queue_p99)} replayed vs "
        f"{_top_queue(obs.queue_p99)} recorded"
        + (f" (healthy twin: {_top_queue(healthy.replayed.queue_p99)})" if healthy else ""),
        f"retransmissions {r.retransmits} replayed vs {obs.retransmits} recorded",
    ]
    if r.fct_p99 is not None and obs.fct_p99 is not None:
        lines.append(f"FCT slowdown p99 {r.fct_p99:.3g} replayed vs {obs.fct_p99:.3g} recorded")
    if r.suspects:
        lines.append(f"the twin's localizer names {', '.join(r.suspects[:3])} in the replay")
    lines.append(f"candidate from {best.why}")
    return lines


# ---- the command ------------------------------------------------------------------------------


@dataclass
class ReplayResult:
    observed: Observed
    ranked: list[Ranked]
    wall_s: float
    cpu_s: float  # this process and its workers, building the twins included
    candidates_from: str  # "suspects", "telemetry" or "suspects and telemetry"

    @property
    def culprit(self) -> Ranked:
        return self.ranked[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.observed.scenario,
            "scheme": self.observed.scheme,
            "wall_s": round(self.wall_s, 2),
            "cpu_s": round(self.cpu_s, 2),
            "candidates_from": self.candidates_from,
            "culprit": self.culprit.name,
            "ranked": [
                {
                    "candidate": r.name,
                    "fault": r.replayed.fault.to_dict() if r.replayed.fault else None,
                    "why": r.why,
                    "score": {
                        k: round(v, 4) if math.isfinite(v) else None for k, v in r.terms.items()
                    },
                    "completion_s": None if r.replayed.failed else r.replayed.completion_s,
                    "failed": r.replayed.failed,
                    "queue_p99": r.replayed.queue_p99,
                    "retransmits": r.replayed.retransmits,
                    "twin_suspects": r.replayed.suspects,
                    "wall_s": round(r.replayed.wall_s, 2),
                }
                for r in self.ranked
            ],
        }


def replay(
    run_dir: Path,
    scenario: str | None = None,
    scheme: str | None = None,
    jobs: int = 2,
    widen: int = 0,
    max_candidates: int = 24,
) -> ReplayResult:
    t0, c0 = time.monotonic(), _cpu_s()
    rec = load_recording(run_dir)
    obs = Observed.of(pick_run(rec, scenario, scheme))
    cands = candidates(rec.spec, obs, widen)[:max_candidates]
    if obs.suspects and widen <= 0:
        source = "suspects"
    elif obs.suspects:
        source = "suspects and telemetry"
    else:
        source = "telemetry (the record names no suspect)"
    faults_: list[Fault | None] = [None] + [f for f, _ in cands]
    whys = ["the healthy fabric"] + [w for _, w in cands]
    reps = replay_all(rec, obs, faults_, jobs)
    return ReplayResult(obs, rank(obs, reps, whys), time.monotonic() - t0, _cpu_s() - c0, source)


def _cpu_s() -> float:
    """CPU time of this process and of its children that ended (the pool's workers)."""
    import resource

    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def build_parser(sub: Any) -> argparse.ArgumentParser:
    ap: argparse.ArgumentParser = sub.add_parser(
        "replay",
        help="replay a recorded run in the twin under candidate faults (灵境)",
        description=__doc__.split("\n\n")[0],
    )
    ap.add_argument("run_dir", type=Path, help="a run directory (results.json, topology.yaml)")
    ap.add_argument("--scenario", help="the record to explain (default: the only one)")
    ap.add_argument("--scheme", help="its scheme (default: the only one)")
    ap.add_argument("--jobs", type=int, default=2, help="twins in parallel (default 2)")
    ap.add_argument(
        "--widen",
        type=int,
        default=0,
        help="also try every fault of the N elements the telemetry points at",
    )
    ap.add_argument("--max-candidates", type=int, default=24)
    ap.add_argument("--json", type=Path, help="also write the ranking here")
    return ap


def main(args: argparse.Namespace) -> int:
    try:
        res = replay(
            args.run_dir, args.scenario, args.scheme, args.jobs, args.widen, args.max_candidates
        )
    except (ReplayError, faults.FaultError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    obs = res.observed
    healthy = next((r for r in res.ranked if r.replayed.fault is None), None)
    print(
        f"replay of {args.run_dir} {obs.scenario}/{obs.scheme}: recorded completion "
        f"{obs.completion_s:.3g} s, largest queue {_top_queue(obs.queue_p99)}, "
        f"{obs.retransmits} retransmissions; {len(obs.suspects)} suspects recorded"
    )
    print(
        f"{len(res.ranked)} candidates from {res.candidates_from}, replayed in the twin in "
        f"{res.wall_s:.1f} s wall, {res.cpu_s:.1f} s CPU"
    )
    print()
    print(
        f"{'rank':>4} {'candidate':<26} {'score':>6} {'time':>6} {'queue':>6} {'retx':>6} "
        f"{'replayed s':>10}"
    )
    for i, r in enumerate(res.ranked, 1):
        t = r.terms
        if r.replayed.failed:
            print(
                f"{i:>4} {r.name:<26} {'-':>6} {'-':>6} {'-':>6} {'-':>6} "
                f"{'no end':>10}  ({r.replayed.failed})"
            )
            continue
        print(
            f"{i:>4} {r.name:<26} {t['total']:>6.3f} {t['time']:>6.3f} {t['queue']:>6.3f} "
            f"{t['retransmits']:>6.3f} {r.replayed.completion_s:>10.3g}"
        )
    print()
    print(f"culprit: {res.culprit.name}")
    for line in evidence(obs, res.culprit, healthy):
        print(f"  - {line}")
    if args.json:
        args.json.write_text(json.dumps(res.to_dict(), indent=1) + "\n")
    return 0
