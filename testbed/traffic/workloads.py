"""AI-training workloads over a list of hosts: Python API and `python -m testbed.traffic`.

Each function runs one workload through the runner (one transport process per host) and
returns its metrics (testbed.traffic.metrics) as a JSON-able dict, with the raw per-host
results under "raw". `transport` holds TransportConfig fields (except local_ip).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.traffic import generators as gen
from testbed.traffic import metrics as m
from testbed.traffic.metrics import iteration_times
from testbed.traffic.netns import Host, NetnsLan
from testbed.traffic.runner import RunOutput, run_job

# How a workload's job reaches the hosts: the emulation's worker processes (run_job) or the
# simulated twin's in-process hosts (testbed.sim); both take the hosts and the job spec.
Runner = Callable[[list[Host], dict[str, Any]], RunOutput]

DEFAULT_LINE_RATE = 100e6  # b/s: what the emulated links carry (see the transport benchmark)
DEFAULT_BASE_RTT = 100e-6  # s
# the all-reduce's schedule (the suite's; the flow engine's `suite_collective` models it)
ALLREDUCE_SCHEDULE = "adaptive"


def _flows_metrics(
    name: str, hosts: list[Host], out: RunOutput, line_rate: float, base_rtt: float
) -> dict[str, Any]:
    sent = [f for r in out.results for f in r["sent"]]
    received = [f for r in out.results for f in r["received"]]
    return {
        "workload": name,
        "hosts": [h.name for h in hosts],
        "flows": len(sent),
        "completed": sum(1 for f in sent if f["done"]),
        "intact": sum(1 for f in received if f["ok"]),
        "corrupt": sum(1 for f in received if not f["ok"]),
        "missing": sum(len(r["missing"]) for r in out.results),
        "fct": m.fct_stats(sent, line_rate, base_rtt),
        "goodput": m.goodput(received),
        "counters": m.counter_totals(out.counters),
        "raw": out.results,
    }


def run_flows(
    hosts: list[Host],
    flows: list[gen.Flow],
    *,
    name: str = "flows",
    transport: dict[str, Any] | None = None,
    line_rate: float = DEFAULT_LINE_RATE,
    base_rtt: float = DEFAULT_BASE_RTT,
    timeout: float = 60.0,
    seed: int = 1,
    verify: bool = True,
    runner: Runner = run_job,
    start_rate: float | None = None,
) -> dict[str, Any]:
    """`start_rate`: the rate every flow declares to its NIC before it sends (b/s; None: the
    NIC's line rate, as a flow that declares nothing)."""
    spec: dict[str, Any] = {
        "kind": "flows",
        "flows": [f.as_dict() for f in flows],
        "transport": transport or {},
        "timeout": timeout,
        "seed": seed,
        "verify": verify,
    }
    if start_rate:
        spec["start_rate_bps"] = round(start_rate)
    return _flows_metrics(name, hosts, runner(hosts, spec), line_rate, base_rtt)


def base_rtt(
    hosts: list[Host], mtu: int, runner: Runner, timeout: float, samples: int = 1
) -> float | None:
    """The round trip of an `mtu`-byte message from the first host to the last (the longest
    path of the standard topologies) and its ACK, on the idle fabric: how both engines measure
    their base RTT (the FCT slowdown's ideal; TiTa's T where it is above the model's). The
    median FCT of `samples` such messages, a tenth of a second apart (one: the twin, which
    has no noise); None if one did not complete."""
    flows = [
        gen.Flow(id=i, src=0, dst=len(hosts) - 1, size=mtu, start=0.1 * i).as_dict()
        for i in range(samples)
    ]
    spec = {"kind": "flows", "flows": flows, "seed": 1, "transport": {"mtu": mtu}}
    out = runner(hosts, {**spec, "timeout": timeout})
    fcts = sorted(f["fct"] for r in out.results for f in r["sent"])
    if len(fcts) != samples or None in fcts:
        return None
    return float(fcts[len(fcts) // 2])


def incast(hosts: list[Host], size: int, *, receiver: int = 0, **kw: Any) -> dict[str, Any]:
    """N:1 incast of `size` bytes from every other host to `receiver`."""
    return run_flows(hosts, gen.incast(len(hosts), size, receiver=receiver), name="incast", **kw)


def alltoall(hosts: list[Host], size: int, **kw: Any) -> dict[str, Any]:
    """All-to-all of `size` bytes per rank; adds algbw/busbw (time = last flow done)."""
    res = run_flows(hosts, gen.all_to_all(len(hosts), size), name="alltoall", **kw)
    done = [f for r in res["raw"] for f in r["sent"]]
    if done and all(f["done"] for f in done):
        res["collective"] = m.collective_bw(
            "alltoall", size, max(f["fct"] for f in done), len(hosts)
        )
    return res


def poisson(
    hosts: list[Host],
    cdf: str,
    load: float,
    duration: float,
    *,
    line_rate: float = DEFAULT_LINE_RATE,
    seed: int = 1,
    qps_per_pair: int = 4,
    **kw: Any,
) -> dict[str, Any]:
    """Flows with sizes from a CDF ("websearch", "fbhadoop", ... or a file) and Poisson
    arrivals at `load` x `line_rate` per host, for `duration` seconds of arrivals."""
    flows = gen.poisson(
        len(hosts),
        gen.SizeCdf.load(cdf),
        load,
        line_rate,
        duration,
        seed=seed,
        qps_per_pair=qps_per_pair,
    )
    kw.setdefault("timeout", duration * 4 + 30)
    res = run_flows(hosts, flows, name=f"poisson:{cdf}", line_rate=line_rate, seed=seed, **kw)
    res["offered_load"] = gen.offered_load(flows, len(hosts), line_rate, duration)
    return res


def collective(
    hosts: list[Host],
    size: int,
    *,
    collective: str = "allreduce",
    chunk: int = 1 << 20,
    iters: int = 1,
    transport: dict[str, Any] | None = None,
    timeout: float = 120.0,
    seed: int = 1,
    runner: Runner = run_job,
    nic_ips: list[list[str]] | None = None,
    algorithm: str = "ring",
    schedule: str = ALLREDUCE_SCHEDULE,
    payload: str = "data",
) -> dict[str, Any]:
    """The collective library's `collective` (all-reduce by default) of `size` bytes of
    float32 per rank (testbed.traffic.collective_jobs: ring by default, one channel per NIC
    given in `nic_ips`, else one on each host's address); checks the result on every rank
    (`payload: size`: its fingerprints)."""
    channels = min(len(ips) for ips in nic_ips) if nic_ips else 1
    spec = {
        "kind": "collective",
        "collective": collective,
        "algorithm": algorithm,
        "schedule": schedule,
        "channels": channels,
        "size": size,
        "chunk": chunk,
        "iters": iters,
        "transport": transport or {},
        "timeout": timeout,
        "seed": seed,
        "payload": payload,
    }
    if nic_ips:
        spec["nic_ips"] = nic_ips
    out = runner(hosts, spec)
    per_iter = iteration_times(out.results)
    mean_t = sum(per_iter) / len(per_iter)
    return {
        "workload": collective,
        "hosts": [h.name for h in hosts],
        "channels": channels,
        "correct": all(r["ok"] for r in out.results),
        "max_abs_err": max(r["max_abs_err"] for r in out.results),
        "collective": m.collective_bw(collective, size, mean_t, len(hosts)),
        "iter_times_s": per_iter,
        "channel_bytes": [sum(r["channel_bytes"][c] for r in out.results) for c in range(channels)],
        "counters": m.counter_totals(out.counters),
        "raw": out.results,
    }


def longlived(
    hosts: list[Host],
    pairs: list[tuple[int, int]],
    duration: float,
    *,
    qps_per_pair: int = 1,
    message: int = 1 << 20,
    transport: dict[str, Any] | None = None,
    seed: int = 1,
) -> dict[str, Any]:
    """Long-lived flows: each (src, dst) pair keeps `qps_per_pair` QPs busy for `duration`."""
    flows = gen.pairs_flows(pairs, message, qps_per_pair)
    spec = {
        "kind": "longlived",
        "flows": [f.as_dict() for f in flows],
        "duration": duration,
        "message": message,
        "transport": transport or {},
        "timeout": duration + 30,
        "seed": seed,
    }
    out = run_job(hosts, spec)
    per_flow = [f for r in out.results for f in r["flows"]]
    total = sum(f["acked_bytes"] for f in per_flow)
    return {
        "workload": "longlived",
        "hosts": [h.name for h in hosts],
        "flows": per_flow,
        "goodput": {"bytes": total, "seconds": duration, "goodput_bps": total * 8 / duration},
        "bad_messages": sum(r["bad_messages"] for r in out.results),
        "counters": m.counter_totals(out.counters),
        "raw": out.results,
    }


# ---- command line ----------------------------------------------------------------------


def _parse_size(text: str) -> int:
    units = {"k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}
    t = text.strip().lower().rstrip("b")
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u):
            return int(float(t[: -len(u)]) * units[u])
    return int(t)


def _parse_host(text: str) -> Host:
    try:
        name, netns, ip = text.split(":")
    except ValueError:
        raise argparse.ArgumentTypeError("host is NAME:NETNS:IP") from None
    return Host(name, netns, ip)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.traffic", description=__doc__)
    ap.add_argument(
        "--host",
        type=_parse_host,
        action="append",
        default=[],
        help="NAME:NETNS:IP (netns: name under /run/netns or a path); repeat",
    )
    ap.add_argument(
        "--lan",
        type=int,
        default=0,
        help="make a throwaway switchless LAN of this many namespace hosts",
    )
    ap.add_argument("--out", type=Path, help="write the metrics JSON here")
    ap.add_argument(
        "--transport",
        type=json.loads,
        default={},
        help="TransportConfig fields as JSON, e.g. '{\"mtu\": 1024}'",
    )
    ap.add_argument("--line-rate", type=float, default=DEFAULT_LINE_RATE, help="b/s")
    ap.add_argument("--base-rtt", type=float, default=DEFAULT_BASE_RTT, help="s")
    sub = ap.add_subparsers(dest="workload", required=True)
    p = sub.add_parser("incast")
    p.add_argument("--size", type=_parse_size, default=1_000_000)
    p.add_argument("--receiver", type=int, default=0)
    p = sub.add_parser("allreduce")
    p.add_argument("--size", type=_parse_size, default=4_000_000)
    p.add_argument("--chunk", type=_parse_size, default=1 << 20)
    p.add_argument("--iters", type=int, default=1)
    p = sub.add_parser("alltoall")
    p.add_argument("--size", type=_parse_size, default=4_000_000)
    p = sub.add_parser("longlived")
    p.add_argument("--pair", action="append", default=[], help="SRC:DST host indexes")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--qps", type=int, default=1)
    p = sub.add_parser("poisson")
    p.add_argument("--cdf", default="websearch")
    p.add_argument("--load", type=float, default=0.5)
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)

    lan = NetnsLan(a.lan) if a.lan else None
    hosts = a.host or (lan.hosts if lan else [])
    if len(hosts) < 2:
        ap.error("give at least two --host, or --lan N")
    common = {"transport": a.transport}
    try:
        if a.workload == "incast":
            res = incast(
                hosts,
                a.size,
                receiver=a.receiver,
                line_rate=a.line_rate,
                base_rtt=a.base_rtt,
                **common,
            )
        elif a.workload == "allreduce":
            res = collective(hosts, a.size, chunk=a.chunk, iters=a.iters, **common)
        elif a.workload == "alltoall":
            res = alltoall(hosts, a.size, line_rate=a.line_rate, base_rtt=a.base_rtt, **common)
        elif a.workload == "longlived":
            split = [p.split(":") for p in a.pair]
            pairs = [(int(s), int(d)) for s, d in split] or [(0, 1)]
            res = longlived(
                hosts,
                pairs,
                a.duration,
                qps_per_pair=a.qps,
                **common,
            )
        else:
            res = poisson(
                hosts,
                a.cdf,
                a.load,
                a.duration,
                line_rate=a.line_rate,
                base_rtt=a.base_rtt,
                seed=a.seed,
                **common,
            )
    finally:
        if lan:
            lan.close()
    print(m.table(res))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
