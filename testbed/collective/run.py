"""The collective library's workloads on either engine. A `CollFabric` says what they need
of the engine (hosts and their NICs, the job runner, the transport for the scheme in force,
a port's rate); the scenario suite makes one for its engine
(testbed.experiment.suite.Suite.collective_fabric), so the same code runs on the emulation and
on the twin.

- `collective()`: one collective job on all hosts, K channels over the hosts' NICs;
- `sweep()`: the same over message sizes (nccl-tests' `-b -e -f`);
- `concurrent()`: several jobs at once (a scenario file), each also alone for its slowdown;
- `degraded_rail()`: an all-reduce with one rail's port at a fraction of its rate, static
  split against adaptive channels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.collective.metrics import parse_size, summarize
from testbed.faults import Fault
from testbed.model import Scaling
from testbed.topo import End, FabricSpec
from testbed.traffic.collective_jobs import NVLINK_BPS, NVLINK_LATENCY_S, channel_estimate
from testbed.traffic.collective_plans import SUPPORTED
from testbed.traffic.generators import Flow
from testbed.traffic.metrics import counter_totals, iteration_times
from testbed.traffic.netns import Host
from testbed.traffic.runner import RunOutput


@dataclass
class CollFabric:
    """An engine as the collective workloads see it, with a scheme in force."""

    topology: str
    hosts: list[Host]
    nic_ips: list[list[str]]  # per host, its NICs' addresses (channel c: NIC c)
    runner: Callable[[list[Host], dict[str, Any]], RunOutput]
    scaling: Scaling
    scheme: str
    law: str  # the scheme's rate law (testbed.experiment.schemes.scheme_law)
    transport: dict[str, Any]  # testbed.experiment.suite.transport_settings for the scheme
    line_rate: float  # NIC line rate in payload bits/s (the engine's)
    time_scale: float  # timeouts stretch with the model's time
    seed: int
    set_port_rate: Callable[[str, int, float], None]  # switch, port, b/s
    websearch: Callable[[int, float, float], list[Flow]]  # hosts, load, seconds -> flows
    apply_fault: Callable[[Fault], None]  # a link or switch fault (testbed/faults.py), now
    # faults at their times (Fault.at: the faults' seconds, see testbed/faults.py) from the
    # next job's start; end_faults heals them and says which were applied, and when
    begin_faults: Callable[[list[Fault]], None]
    end_faults: Callable[[], list[dict[str, Any]]]
    spec: FabricSpec  # the topology's links (which host and NIC a switch port reaches)
    # Before every run: the fabric as built, the scheme set (the twin builds a new one, so a
    # run depends only on its own inputs; the emulation's fabric lives on). Port rates and
    # faults a run needs are set after it.
    fresh: Callable[[], None]
    # The scheme's law with these parameters over its CC profile's for the runs to come
    # (Profile.with_values; {}: the profile as configured)
    set_cc: Callable[[dict[str, str]], None]
    # what every job declares to the NICs as it starts (the proactive start's
    # `start_share_bps`, testbed.traffic.collective_jobs); {}: nothing, flows start at line rate
    start: dict[str, Any] = field(default_factory=dict)

    @property
    def nics(self) -> int:
        return min(len(ips) for ips in self.nic_ips)


def _timeout(fab: CollFabric, size: int, n: int) -> float:
    """Generous: the job's bytes at a tenth of one NIC, in the engine's time, plus slack."""
    s = fab.scaling
    return 20.0 * fab.time_scale + 10 * 2 * size * 8 * max(1, n) / s.nic_bps


def job_spec(fab: CollFabric, **params: Any) -> dict[str, Any]:
    """A collective job's spec (testbed.traffic.collective_jobs) with the fabric's transport."""
    k = int(params.pop("channels", 0) or fab.nics)
    spec: dict[str, Any] = {
        "kind": "collective",
        "channels": k,
        "transport": fab.transport,
        "nic_ips": fab.nic_ips,
        "seed": fab.seed,
        **fab.start,
    }
    spec.update(params)
    # the hosts' NVLink (the hierarchical algorithm's steps inside a host) as the model has
    # it (a job file's values too), run in the engine's time, `scale` times slower as the
    # links are
    spec["nvlink_bps"] = float(spec.get("nvlink_bps", NVLINK_BPS)) / fab.scaling.scale
    spec["nvlink_latency"] = float(spec.get("nvlink_latency", NVLINK_LATENCY_S)) * fab.scaling.scale
    spec.setdefault("timeout", _timeout(fab, int(spec["size"]), int(spec.get("iters", 1))))
    return spec


def collective(
    fab: CollFabric,
    warmup: int = 0,
    tune_cache: Path | None = None,
    prepare: Callable[[], None] | None = None,
    faults: list[Fault] | None = None,
    **params: Any,
) -> dict[str, Any]:
    """Run one collective job on all the fabric's hosts, on a fresh fabric that `prepare`
    sets up (a port's rate, a fault), with `faults` injected at their times from the job's
    start (`faults` in the result: those applied); nccl-tests' figures. With `algorithm: auto`, the
    algorithm, channels and chunk the tuner chose for this fabric and size
    (testbed.collective.tune, its cache `tune_cache`)."""
    if params.get("algorithm") == "auto":
        from testbed.collective import tune

        choice = tune.choose(
            tune_cache or tune.DEFAULT_CACHE,
            fab.topology,
            len(fab.hosts),
            fab.nics,
            str(params.get("collective", "allreduce")),
            int(params["size"]),
            fab.scheme,
        )
        params.update(choice)
    fab.set_cc(dict(params.pop("cc", None) or {}))
    spec = job_spec(fab, **params)
    fab.fresh()
    if prepare is not None:
        prepare()
    if faults:
        fab.begin_faults(faults)
    try:
        out = fab.runner(fab.hosts, spec)
    finally:
        applied = fab.end_faults() if faults else []
    s = fab.scaling
    res = summarize(out.results, fab.line_rate, fab.nics, s.scale, warmup)
    res["scheme"] = fab.scheme
    total = counter_totals(out.counters)
    res["counters"] = {
        k: total[k]
        for k in ("retransmits", "timeouts", "cnps_received", "reports", "reports_suppressed")
    }
    res["rate_bps_per_channel"] = [
        max(r["channel_rate_bps"][c] for r in out.results) * s.scale
        for c in range(spec["channels"])
    ]
    if faults:
        res["faults"] = applied
    if spec.get("trace_rates"):  # per rank, times in the model's seconds, rates its B/s
        res["rate_trace"] = {
            r["rank"]: [(t / s.scale, p, c, a * s.scale, b * s.scale) for t, p, c, a, b in tr]
            for r in out.results
            if (tr := r.get("rate_trace"))
        }
    return res


def sweep(
    fab: CollFabric, sizes: list[int], algorithms: list[str], say: Any = print, **params: Any
) -> list[dict[str, Any]]:
    rows = []
    coll = params.get("collective", "allreduce")
    for alg in algorithms:
        if alg != "auto" and alg not in SUPPORTED[coll]:
            raise ValueError(f"{coll} has no {alg!r} algorithm ({SUPPORTED[coll]})")
        for size in sizes:
            r = collective(fab, algorithm=alg, size=size, **params)
            say(
                f"{coll} {alg} {size} B: busbw {r['busbw_Bps'] / 1e9:.1f} GB/s, "
                f"efficiency {r['efficiency']:.1%}, {'ok' if r['correct'] else 'WRONG'}"
            )
            rows.append(r)
    return rows


# ---- concurrent jobs ------------------------------------------------------------------


@dataclass
class JobDecl:
    """One job of a scenario file."""

    name: str
    kind: str  # training (a collective in a loop) or websearch (background flows)
    hosts: list[int]  # indices into the suite's hosts
    params: dict[str, Any] = field(default_factory=dict)


def load_jobs(path: Path, n_hosts: int) -> list[JobDecl]:
    """A scenario file (YAML):

    jobs:
      - name: dp                     # a data-parallel job
        hosts: 0-3                   # host indices (a range a-b, or a list)
        collective: allreduce        # testbed.traffic.collective_jobs's parameters
        algorithm: ring
        size: 1M
        iters: 4
        compute: 20e-6               # s of the model per iteration
      - name: moe
        hosts: [4, 5, 6, 7]
        collective: alltoall
        size: 1M
      - name: bg
        kind: websearch              # background flows over the hosts
        hosts: 0-7
        load: 0.3
        seconds: 200e-6
    """
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list) or not doc["jobs"]:
        raise ValueError(f"{path}: expected a mapping with a non-empty list 'jobs'")
    return [parse_job(j, n_hosts, f"{path}: job {i}") for i, j in enumerate(doc["jobs"])]


def _hosts(v: Any, n: int, where: str) -> list[int]:
    if isinstance(v, str) and "-" in v:
        a, b = (int(x) for x in v.split("-", 1))
        out = list(range(a, b + 1))
    elif isinstance(v, list):
        out = [int(x) for x in v]
    else:
        raise ValueError(f"{where}: hosts is a range 'a-b' or a list")
    if len(set(out)) != len(out) or any(not 0 <= h < n for h in out) or len(out) < 2:
        raise ValueError(f"{where}: hosts {v!r}: at least two distinct of 0..{n - 1}")
    return out


def parse_job(j: Any, n_hosts: int, where: str) -> JobDecl:
    if not isinstance(j, dict) or "name" not in j or "hosts" not in j:
        raise ValueError(f"{where}: a job is a mapping with a name and hosts")
    j = dict(j)
    name, kind = str(j.pop("name")), str(j.pop("kind", "training"))
    hosts = _hosts(j.pop("hosts"), n_hosts, where)
    if kind not in ("training", "websearch"):
        raise ValueError(f"{where}: kind {kind!r}: training or websearch")
    for key in ("size", "chunk"):
        if key in j:
            j[key] = parse_size(str(j[key]))
    for key in ("compute", "load", "seconds", "nvlink_bps", "nvlink_latency"):
        if key in j:
            j[key] = float(j[key])
    return JobDecl(name, kind, hosts, j)


def _sub_spec(fab: CollFabric, d: JobDecl, slot: int) -> dict[str, Any]:
    if d.kind == "websearch":
        seconds = float(d.params.get("seconds", 200e-6)) * fab.scaling.scale
        flows = fab.websearch(len(d.hosts), float(d.params.get("load", 0.3)), seconds)
        # the job's hosts by index; slots 0-3 (the generators' queue pairs)
        return {
            "kind": "flows",
            "seed": fab.seed,
            "verify": True,
            "flows": [dict(f.as_dict(), src=d.hosts[f.src], dst=d.hosts[f.dst]) for f in flows],
        }
    params = dict(d.params)
    params["compute"] = float(params.get("compute", 0.0)) * fab.scaling.scale
    spec = job_spec(fab, **params)
    spec.update(ranks=d.hosts, slot=slot)
    for key in ("transport", "nic_ips", "timeout"):  # the run's, not the job's
        spec.pop(key)
    return spec


def concurrent(fab: CollFabric, decls: list[JobDecl]) -> dict[str, Any]:
    """The jobs together, then each training job alone on the same hosts: per job its
    iteration time, busbw, slowdown together vs alone and communication share."""
    together = Together(fab, decls)
    together.run_alone()
    return together.summary()


class Together:
    """Jobs run at once on `fab` (at construction), and each training job's run alone for its
    slowdown (`run_alone`), a step of its own so that a measurement of the together run (the
    suite's two-job cell: its queues, utilisation and counters) can end before it."""

    def __init__(self, fab: CollFabric, decls: list[JobDecl]) -> None:
        self.fab = fab
        slots, self.specs = 8, []
        for d in decls:
            self.specs.append(_sub_spec(fab, d, slots))
            slots += int(self.specs[-1].get("channels", 0))
        self.base = {
            "kind": "jobs",
            "transport": fab.transport,
            "nic_ips": fab.nic_ips,
            "timeout": 60.0 * fab.time_scale
            + sum(
                _timeout(fab, int(sp.get("size", 0)), int(sp.get("iters", 1))) for sp in self.specs
            ),
        }
        self.rows: list[dict[str, Any]] = []
        self.figures = self._run(self.specs)
        for d, fig in zip(decls, self.figures, strict=True):
            row: dict[str, Any] = {"name": d.name, "kind": d.kind, "hosts": d.hosts}
            if fig is not None:
                row.update(fig)
            self.rows.append(row)

    def _run(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
        fab = self.fab
        fab.fresh()
        out = fab.runner(fab.hosts, dict(self.base, jobs=jobs))
        per_job: list[dict[str, Any] | None] = [None] * len(jobs)
        for i in range(len(jobs)):
            parts = [r["jobs"][i] for r in out.results if r["jobs"][i] is not None]
            per_job[i] = _job_figures(jobs[i], parts, fab) if parts else None
        return per_job

    def run_alone(self) -> None:
        """Each training job alone on the same hosts: its slowdown together vs alone."""
        for sp, fig, row in zip(self.specs, self.figures, self.rows, strict=True):
            if sp["kind"] != "collective":
                continue
            alone = self._run([sp])[0]
            if alone is not None and fig is not None:
                row["alone_iter_s"] = alone["iter_s"]
                row["alone_busbw_Bps"] = alone["busbw_Bps"]
                row["slowdown"] = fig["iter_s"] / alone["iter_s"]

    def summary(self) -> dict[str, Any]:
        return {"scheme": self.fab.scheme, "jobs": self.rows}


def _job_figures(
    spec: dict[str, Any], parts: list[dict[str, Any]], fab: CollFabric
) -> dict[str, Any]:
    s = fab.scaling
    if spec["kind"] == "flows":
        sent = [f for p in parts for f in p["sent"]]
        done = [f for f in sent if f["fct"] is not None]
        fcts = sorted(f["fct"] / s.scale for f in done)
        return {
            "flows": len(sent),
            "completed": len(done),
            "fct_p50_s": fcts[len(fcts) // 2] if fcts else None,
            "fct_p99_s": fcts[min(len(fcts) - 1, int(len(fcts) * 0.99))] if fcts else None,
            "correct": len(done) == len(sent)
            and all(r["ok"] for p in parts for r in p["received"]),
        }
    figs = summarize(parts, fab.line_rate, fab.nics, s.scale)
    ends = [max(p["iter_end"][i] for p in parts) for i in range(len(parts[0]["iter_end"]))]
    iters = [b - a for a, b in zip([0.0, *ends[:-1]], ends, strict=True)]
    iter_s = sum(iters) / len(iters) / s.scale
    comm = [t for t in iteration_times(parts)]
    comm_s = sum(comm) / len(comm) / s.scale
    return {
        "iter_s": iter_s,
        "comm_s": comm_s,
        "compute_s": parts[0]["compute"] / s.scale,
        "comm_share": min(1.0, comm_s / iter_s) if iter_s else 0.0,
        "busbw_Bps": figs["busbw_Bps"],
        "makespan_busbw_Bps": figs["makespan_busbw_Bps"],  # the scenario table's
        "efficiency": figs["efficiency"],
        "collective": figs["collective"],
        "size": figs["size"],
        "correct": figs["correct"],
    }


def jobs_table(res: dict[str, Any]) -> str:
    lines = [
        f"{'job':<8} {'kind':<10} {'hosts':<12} {'what':<16} {'iter(us)':>9} "
        f"{'alone(us)':>9} {'slowdown':>8} {'comm%':>6} {'busbw(GB/s)':>11} {'ok':>3}"
    ]
    for r in res["jobs"]:
        hosts = (
            f"{min(r['hosts'])}-{max(r['hosts'])}"
            if r["hosts"] == list(range(min(r["hosts"]), max(r["hosts"]) + 1))
            else ",".join(map(str, r["hosts"]))
        )
        if r["kind"] == "websearch":
            p99 = r.get("fct_p99_s")
            what = f"{r.get('completed', 0)}/{r.get('flows', 0)} flows"
            lines.append(
                f"{r['name']:<8} {r['kind']:<10} {hosts:<12} {what:<16} "
                f"{'':>9} {'':>9} {'':>8} {'':>6} "
                f"{'p99 FCT ' + format(p99 * 1e6, '.1f') + 'us' if p99 else '':>11} "
                f"{'y' if r.get('correct') else 'n':>3}"
            )
            continue
        what = f"{r.get('collective', '?')} {r.get('size', 0) >> 10}K"
        lines.append(
            f"{r['name']:<8} {r['kind']:<10} {hosts:<12} {what:<16} "
            f"{r.get('iter_s', float('nan')) * 1e6:>9.1f} "
            f"{r.get('alone_iter_s', float('nan')) * 1e6:>9.1f} "
            f"{r.get('slowdown', float('nan')):>8.2f} {r.get('comm_share', 0) * 100:>5.0f}% "
            f"{r.get('busbw_Bps', 0) / 1e9:>11.1f} {'y' if r.get('correct') else 'n':>3}"
        )
    return "\n".join(lines)


# ---- a degraded rail ------------------------------------------------------------------


GOAL_OF_IDEAL = 0.95  # issue 32's goal for a degraded rail: 95 % of the ideal


def degraded_rail(
    fab: CollFabric,
    switch: str,
    port: int,
    fraction: float,
    at: float | None = None,
    **params: Any,
) -> dict[str, Any]:
    """Healthy, then `switch:port` at `fraction` of its rate with the static split and with
    adaptive channels; busbw of each and their ratios to healthy, against the ideal ratio
    (K - 1 + fraction) / K: the degraded host's rails at their rates, all used.

    `at`: the port degrades `at` seconds (the model's) into the collective, while it runs, not
    before it; the adaptive run then records its channels' rates (`trace_rates`) and
    `reaction` says, for each sender through the port, how long after the degradation its
    schedule's rate of that channel fell halfway to the degraded rate ((1 + fraction) / 2 of
    what it was): from then on it sends that channel its reduced share."""
    link = fab.scaling.link_bps
    healthy = collective(fab, schedule="adaptive", **params)
    reaction: dict[str, Any] | None = None
    if at is None:

        def degrade() -> None:
            fab.set_port_rate(switch, port, link * fraction)

        try:
            static = collective(fab, schedule="static", prepare=degrade, **params)
            adaptive = collective(fab, schedule="adaptive", prepare=degrade, **params)
        finally:
            fab.set_port_rate(switch, port, link)  # the emulation's fabric lives on
    else:
        # the faults' clock is the emulation's seconds (testbed/faults.py)
        when = at * fab.scaling.scale / fab.time_scale
        fault = [Fault(f"{switch}:{port}", "rate", fraction, at=when)]
        static = collective(fab, schedule="static", faults=fault, **params)
        adaptive = collective(fab, schedule="adaptive", faults=fault, trace_rates=True, **params)
        reaction = reaction_times(fab, adaptive, switch, port, fraction, at)
        adaptive.pop("rate_trace", None)  # the reaction is what it is for: not in results
    k = fab.nics
    return {
        "port": f"{switch}:{port}",
        "fraction": fraction,
        "channels": k,
        "at": at,
        "healthy": healthy,
        "static": static,
        "adaptive": adaptive,
        "static_ratio": static["busbw_Bps"] / healthy["busbw_Bps"],
        "adaptive_ratio": adaptive["busbw_Bps"] / healthy["busbw_Bps"],
        # what the degraded host's K NICs can take: K - 1 healthy rails and the slow one
        "ideal": (k - 1 + fraction) / k,
        "goal": GOAL_OF_IDEAL * (k - 1 + fraction) / k,
        **({"reaction": reaction} if reaction is not None else {}),
    }


REACTION_GOAL_RTTS = 10  # issue 32: the move made within 10 RTTs of the degradation


def reaction_times(
    fab: CollFabric, res: dict[str, Any], switch: str, port: int, fraction: float, at: float
) -> dict[str, Any]:
    """From an adaptive run's rate trace: per sender to the host behind `switch:port` on
    that NIC's channel, the time from the degradation (`at`, the model's seconds from the
    job's start) until the channel's rate as the schedule reckons it (its completions',
    capped by its NIC's) first fell to (1 + fraction) / 2 of the last before `at`; also in
    the model's base RTTs. None for a sender whose rate never fell that far."""
    end = fab.spec.peer(End(switch, port))
    if end is None or fab.spec.is_switch(end.node):
        raise ValueError(f"{switch}:{port} does not reach a host")
    names = [h.name for h in fab.hosts]
    dst, channel = names.index(end.node), end.index
    rtt = fab.scaling.model.base_rtt_us * 1e-6
    senders: dict[str, Any] = {}
    for rank, trace in res.get("rate_trace", {}).items():
        mine = [(t, a, b) for t, p, c, a, b in trace if p == dst and c == channel]
        before = [e for t, a, b in mine if t < at and (e := channel_estimate(a, b)) > 0]
        if not before:
            continue
        limit = before[-1] * (1 + fraction) / 2
        fell = next(
            ((t, a, b) for t, a, b in mine if t >= at and 0 < channel_estimate(a, b) <= limit),
            None,
        )
        senders[names[int(rank)]] = (
            None
            if fell is None
            else {
                "after_s": fell[0] - at,
                "rtts": (fell[0] - at) / rtt,
                "rate_before": before[-1],
                # which reading showed it: the NIC's rate or the messages' completions
                "by": "nic" if 0 < fell[2] <= limit else "completions",
            }
        )
    times = [v["rtts"] for v in senders.values() if v is not None]
    return {
        "towards": f"{end.node} nic {channel}",
        "senders": senders,
        "base_rtt_s": rtt,
        "worst_rtts": max(times) if times and len(times) == len(senders) else None,
        "goal_rtts": REACTION_GOAL_RTTS,
    }
