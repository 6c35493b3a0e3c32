"""The collective library's workloads on either engine, through a scenario suite
(testbed.scenarios.SuiteBase: the emulation's Suite or the twin's SimSuite give the hosts,
the runner, the scheme and the transport settings).

- `collective()`: one collective job on all hosts, K channels over the hosts' NICs;
- `sweep()`: the same over message sizes (nccl-tests' `-b -e -f`);
- `concurrent()`: several jobs at once (a scenario file), each also alone for its slowdown;
- `degraded_rail()`: an all-reduce with one rail's port at a fraction of its rate, static
  split against adaptive channels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from testbed.collective.metrics import iteration_times, summarize
from testbed.collective.plan import SUPPORTED
from testbed.scenarios import payload_line_rate, transport_settings

if TYPE_CHECKING:
    from testbed.scenarios import SuiteBase


def nic_ips(suite: SuiteBase) -> list[list[str]]:
    """Every traffic host's NIC addresses, in the suite's host order."""
    by_name = {h.name: [n.ip for n in h.nics] for h in suite.spec.hosts}
    return [by_name[h.name] for h in suite.hosts]


def nics(suite: SuiteBase) -> int:
    return min(len(ips) for ips in nic_ips(suite))


def _timeout(suite: SuiteBase, size: int, n: int) -> float:
    """Generous: the job's bytes at a tenth of one NIC, in the engine's time, plus slack."""
    s = suite.scaling
    return 20.0 * suite.time_scale + 10 * 2 * size * 8 * max(1, n) / s.nic_bps


def job_spec(suite: SuiteBase, scheme: str, **params: Any) -> dict[str, Any]:
    """A collective job's spec (testbed.collective.job) with the suite's transport."""
    k = int(params.pop("channels", 0) or nics(suite))
    spec: dict[str, Any] = {"kind": "collective", "channels": k,
                            "transport": transport_settings(suite.scaling,
                                                            suite.window(scheme)),
                            "nic_ips": nic_ips(suite), "seed": suite.cfg.seed}
    spec.update(params)
    spec.setdefault("timeout", _timeout(suite, int(spec["size"]),
                                        int(spec.get("iters", 1))))
    return spec


def collective(suite: SuiteBase, scheme: str, warmup: int = 0,
               **params: Any) -> dict[str, Any]:
    """Run one collective job on all the suite's hosts; nccl-tests' figures."""
    spec = job_spec(suite, scheme, **params)
    out = suite.runner(suite.hosts, spec)
    s = suite.scaling
    res = summarize(out.results, payload_line_rate(s), nics(suite), s.scale, warmup)
    res["scheme"] = scheme
    res["counters"] = {k: sum(int(c.get(k, 0)) for c in out.counters)
                       for k in ("retransmits", "timeouts", "cnps_received")}
    res["rate_bps_per_channel"] = [max(r["channel_rate_bps"][c] for r in out.results) * s.scale
                                   for c in range(spec["channels"])]
    return res


def sweep(suite: SuiteBase, scheme: str, sizes: list[int], algorithms: list[str],
          say: Any = print, **params: Any) -> list[dict[str, Any]]:
    rows = []
    coll = params.get("collective", "allreduce")
    for alg in algorithms:
        if alg not in SUPPORTED[coll]:
            raise ValueError(f"{coll} has no {alg!r} algorithm ({SUPPORTED[coll]})")
        for size in sizes:
            r = collective(suite, scheme, algorithm=alg, size=size, **params)
            say(f"{coll} {alg} {size} B: busbw {r['busbw_Bps'] / 1e9:.1f} GB/s, "
                f"efficiency {r['efficiency']:.1%}, {'ok' if r['correct'] else 'WRONG'}")
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
            collective: allreduce        # testbed.collective.job's parameters
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
    from testbed.collective.metrics import parse_size

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


def _sub_spec(suite: SuiteBase, scheme: str, d: JobDecl, slot: int) -> dict[str, Any]:
    if d.kind == "websearch":
        from testbed.scenarios import websearch_flows

        seconds = float(d.params.get("seconds", 200e-6)) * suite.scaling.scale
        cfg = suite.cfg
        wcfg = type(cfg)(**{**cfg.__dict__, "websearch_load": float(d.params.get("load", 0.3))})
        flows = websearch_flows(wcfg, len(d.hosts), suite.scaling.nic_bps, seconds)
        # the job's hosts by index; slots 0-3 (the generators' queue pairs)
        return {"kind": "flows", "seed": cfg.seed, "verify": True,
                "flows": [dict(f.as_dict(), src=d.hosts[f.src], dst=d.hosts[f.dst])
                          for f in flows]}
    params = dict(d.params)
    params["compute"] = float(params.get("compute", 0.0)) * suite.scaling.scale
    spec = job_spec(suite, scheme, **params)
    spec.update(ranks=d.hosts, slot=slot)
    spec.pop("transport"), spec.pop("nic_ips"), spec.pop("timeout")
    return spec


def concurrent(suite: SuiteBase, scheme: str, decls: list[JobDecl]) -> dict[str, Any]:
    """The jobs together, then each training job alone on the same hosts: per job its
    iteration time, busbw, slowdown together vs alone and communication share."""
    slots, specs = 8, []
    for d in decls:
        specs.append(_sub_spec(suite, scheme, d, slots))
        slots += int(specs[-1].get("channels", 0))
    s = suite.scaling
    base = {"kind": "jobs", "transport": transport_settings(s, suite.window(scheme)),
            "nic_ips": nic_ips(suite),
            "timeout": 60.0 * suite.time_scale + sum(
                _timeout(suite, int(sp.get("size", 0)), int(sp.get("iters", 1)))
                for sp in specs)}

    def run(jobs: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
        out = suite.runner(suite.hosts, dict(base, jobs=jobs))
        per_job: list[dict[str, Any] | None] = [None] * len(jobs)
        for i in range(len(jobs)):
            parts = [r["jobs"][i] for r in out.results if r["jobs"][i] is not None]
            per_job[i] = _job_figures(jobs[i], parts, suite) if parts else None
        return per_job

    together = run(specs)
    rows = []
    for d, sp, fig in zip(decls, specs, together, strict=True):
        row: dict[str, Any] = {"name": d.name, "kind": d.kind, "hosts": d.hosts}
        if fig is not None:
            row.update(fig)
        if sp["kind"] == "collective":
            alone = run([sp])[0]
            if alone is not None and fig is not None:
                row["alone_iter_s"] = alone["iter_s"]
                row["alone_busbw_Bps"] = alone["busbw_Bps"]
                row["slowdown"] = fig["iter_s"] / alone["iter_s"]
        rows.append(row)
    return {"scheme": scheme, "jobs": rows}


def _job_figures(spec: dict[str, Any], parts: list[dict[str, Any]],
                 suite: SuiteBase) -> dict[str, Any]:
    s = suite.scaling
    if spec["kind"] == "flows":
        sent = [f for p in parts for f in p["sent"]]
        done = [f for f in sent if f["fct"] is not None]
        fcts = sorted(f["fct"] / s.scale for f in done)
        return {"flows": len(sent), "completed": len(done),
                "fct_p50_s": fcts[len(fcts) // 2] if fcts else None,
                "fct_p99_s": fcts[min(len(fcts) - 1, int(len(fcts) * 0.99))] if fcts else None,
                "correct": len(done) == len(sent) and
                           all(r["ok"] for p in parts for r in p["received"])}
    figs = summarize(parts, payload_line_rate(s), nics(suite), s.scale)
    ends = [max(p["iter_end"][i] for p in parts) for i in range(len(parts[0]["iter_end"]))]
    iters = [b - a for a, b in zip([0.0, *ends[:-1]], ends, strict=True)]
    iter_s = sum(iters) / len(iters) / s.scale
    comm = [t for t in iteration_times(parts)]
    comm_s = sum(comm) / len(comm) / s.scale
    return {"iter_s": iter_s, "comm_s": comm_s, "compute_s": parts[0]["compute"] / s.scale,
            "comm_share": min(1.0, comm_s / iter_s) if iter_s else 0.0,
            "busbw_Bps": figs["busbw_Bps"], "efficiency": figs["efficiency"],
            "collective": figs["collective"], "size": figs["size"],
            "correct": figs["correct"]}


def jobs_table(res: dict[str, Any]) -> str:
    lines = [f"{'job':<8} {'kind':<10} {'hosts':<12} {'what':<16} {'iter(us)':>9} "
             f"{'alone(us)':>9} {'slowdown':>8} {'comm%':>6} {'busbw(GB/s)':>11} {'ok':>3}"]
    for r in res["jobs"]:
        hosts = f"{min(r['hosts'])}-{max(r['hosts'])}" if r["hosts"] == list(
            range(min(r["hosts"]), max(r["hosts"]) + 1)) else ",".join(map(str, r["hosts"]))
        if r["kind"] == "websearch":
            p99 = r.get("fct_p99_s")
            what = f"{r.get('completed', 0)}/{r.get('flows', 0)} flows"
            lines.append(f"{r['name']:<8} {r['kind']:<10} {hosts:<12} {what:<16} "
                         f"{'':>9} {'':>9} {'':>8} {'':>6} "
                         f"{'p99 FCT ' + format(p99 * 1e6, '.1f') + 'us' if p99 else '':>11} "
                         f"{'y' if r.get('correct') else 'n':>3}")
            continue
        what = f"{r.get('collective', '?')} {r.get('size', 0) >> 10}K"
        lines.append(
            f"{r['name']:<8} {r['kind']:<10} {hosts:<12} {what:<16} "
            f"{r.get('iter_s', float('nan')) * 1e6:>9.1f} "
            f"{r.get('alone_iter_s', float('nan')) * 1e6:>9.1f} "
            f"{r.get('slowdown', float('nan')):>8.2f} {r.get('comm_share', 0) * 100:>5.0f}% "
            f"{r.get('busbw_Bps', 0) / 1e9:>11.1f} {'y' if r.get('correct') else 'n':>3}")
    return "\n".join(lines)


# ---- a degraded rail ------------------------------------------------------------------


def set_port_rate(suite: SuiteBase, switch: str, port: int, rate_bps: float) -> None:
    """A switch port's drain rate (the engine's traffic manager, through SwitchAdmin)."""
    fab = getattr(suite, "fab", None)
    if fab is not None:  # the twin
        from controller.proto import switch_pb2

        fab.switches[switch].admin.SetQueue(
            switch_pb2.SetQueueRequest(port=port, rate_bps=round(rate_bps)), None)
    else:
        suite.tb.set_queue_rate(switch, port, rate_bps)  # type: ignore[attr-defined]


def degraded_rail(suite: SuiteBase, scheme: str, switch: str, port: int, fraction: float,
                  **params: Any) -> dict[str, Any]:
    """Healthy, then `switch:port` at `fraction` of its rate with the static split and with
    adaptive channels; busbw of each and their ratios to healthy."""
    link = suite.scaling.link_bps
    healthy = collective(suite, scheme, schedule="adaptive", **params)
    set_port_rate(suite, switch, port, link * fraction)
    try:
        static = collective(suite, scheme, schedule="static", **params)
        adaptive = collective(suite, scheme, schedule="adaptive", **params)
    finally:
        set_port_rate(suite, switch, port, link)
    k = nics(suite)
    return {"port": f"{switch}:{port}", "fraction": fraction, "channels": k,
            "healthy": healthy, "static": static, "adaptive": adaptive,
            "static_ratio": static["busbw_Bps"] / healthy["busbw_Bps"],
            "adaptive_ratio": adaptive["busbw_Bps"] / healthy["busbw_Bps"],
            "goal": (k - 1) / k}
