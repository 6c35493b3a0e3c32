"""The simulated twin's speed: leaf-spine fabrics of 8 to 128 hosts at both speeds.

Each point is one twin run in a process of its own (so its peak memory is its own): every host
sends `per_host` bytes to the host half the fabric away (crossing the spines), all at once,
under TiTa, until all complete. Figures: wall time per simulated second, events per wall
second, packet-hops per wall second (a packet crossing one switch: the switches' received
frames), the same per CPU second of the process (what a loaded machine does not change), and
the process's peak RSS. One core: the twin is one thread.

`allreduce64` (`collective`) times the ring all-reduce of 16 MiB per rank over 64 hosts at
400G (scale 1), once per payload mode (testbed.traffic.collective_jobs): `size`, whose memory
is the goal's (at most 60 CPU seconds and 1 GiB), and `data`, every rank's buffer real; it
runs only without --quick.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import resource
import time
from typing import Any

FABRICS = {
    8: (2, 2, 4),
    16: (4, 2, 4),
    32: (4, 2, 8),
    64: (8, 4, 8),
    128: (8, 4, 16),
    1024: (16, 64, 64),  # 51.2T switches (64 hosts, 64 uplinks per leaf), 1:1: issue 30's
}


def _point(hosts: int, scale: float, per_host: int) -> dict[str, Any]:
    from controller.nic.ratelaw import Law
    from testbed.experiment.suite import deepest_queue_s, tita_window, transport_settings
    from testbed.model import Scaling
    from testbed.sim.fabric import SimFabric
    from testbed.topo import leafspine
    from testbed.traffic.generators import Flow

    spec = leafspine(*FABRICS[hosts])
    s = Scaling(scale=scale, max_hops=spec.longest_path_switches())
    t_build = time.perf_counter()
    fab = SimFabric(spec, s)
    build_s = time.perf_counter() - t_build
    t_rtt = s.base_rtt_s
    fab.set_law(Law.TITA, round(t_rtt * 1e9))
    n = len(spec.hosts)
    flows = [Flow(id=i, src=i, dst=(i + n // 2) % n, size=per_host, start=0.0) for i in range(n)]
    job = {
        "kind": "flows",
        "flows": [f.as_dict() for f in flows],
        "verify": False,
        "transport": transport_settings(
            s, tita_window(s, t_rtt), deepest_queue=deepest_queue_s(spec, s)
        ),
        "timeout": 1e4,
    }
    ev0, sim0 = fab.loop.events, fab.loop.now
    t0, c0 = time.perf_counter(), time.process_time()
    out = fab.run_job(fab.traffic_hosts(), job)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    events = fab.loop.events - ev0
    # until the last flow completed (the drain after it only runs idle timers)
    sim_s = max(f["start"] + f["fct"] for r in out.results for f in r["sent"] if f["done"])
    del sim0
    hops = sum(c.rx_packets for c in fab.port_counters().values())
    done = sum(1 for r in out.results for f in r["sent"] if f["done"])
    return {
        "hosts": n,
        "switches": len(spec.switches),
        "scale": scale,
        "per_host_bytes": per_host,
        "flows_done": done,
        "flows": n,
        "build_s": round(build_s, 2),
        "wall_s": round(wall, 2),
        "simulated_s": sim_s,
        "wall_per_simulated_s": round(wall / sim_s, 1),
        "cpu_s": round(cpu, 2),
        "events": events,
        "events_per_s": round(events / wall),
        "events_per_cpu_s": round(events / cpu),
        "packet_hops": hops,
        "packet_hops_per_s": round(hops / wall),
        "packet_hops_per_cpu_s": round(hops / cpu),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def collective(
    fabric: tuple[int, int, int],
    payload: str,
    size: int = 16 << 20,
    goal_cpu_s: float | None = 60,
    kind: str = "allreduce",
    goal_rss_mib: float | None = 1024,
) -> dict[str, Any]:
    """The collective library's `kind` (the ring all-reduce, or the all-to-all) of `size`
    bytes per rank over leafspine(*fabric) at 400G, TiTa, 1 MiB chunks; its figures against
    `goal_cpu_s` and `goal_rss_mib` of peak RSS (None: no goal)."""
    from controller.nic.ratelaw import Law
    from testbed.experiment.suite import deepest_queue_s, tita_window, transport_settings
    from testbed.model import Scaling
    from testbed.sim.fabric import SimFabric
    from testbed.topo import leafspine
    from testbed.traffic import workloads as wl

    c_setup = time.process_time()
    spec = leafspine(*fabric)
    s = Scaling(scale=1, max_hops=spec.longest_path_switches())
    fab = SimFabric(spec, s)
    fab.set_law(Law.TITA, round(s.base_rtt_s * 1e9))
    t0, c0 = time.perf_counter(), time.process_time()
    res = wl.collective(
        fab.traffic_hosts(),
        size,
        collective=kind,
        chunk=1 << 20,
        timeout=10.0,
        transport=transport_settings(
            s, tita_window(s, s.base_rtt_s), deepest_queue=deepest_queue_s(spec, s)
        ),
        runner=fab.run_job,
        payload=payload,
    )
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    coll = res["collective"]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "collective": kind,
        "fabric": spec.name,
        "switches": len(spec.switches),
        "hosts": len(spec.hosts),
        "bytes_per_rank": size,
        "payload": payload,
        "correct": res["correct"],
        "simulated_s": coll["time_s"],
        "busbw_gbps": round(coll["busbw_Bps"] * 8 / 1e9, 1),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "setup_cpu_s": round(c0 - c_setup, 1),
        "events": fab.loop.events,
        "packet_hops": sum(c.rx_packets for c in fab.port_counters().values()),
        "retransmits": res["counters"]["retransmits"],
        "timeouts": res["counters"]["timeouts"],
        "goal_cpu_s": goal_cpu_s,
        "goal_rss_mib": goal_rss_mib,
        "within_goal": (goal_cpu_s is None or cpu <= goal_cpu_s)
        and (goal_rss_mib is None or rss <= goal_rss_mib),
        "peak_rss_mib": round(rss, 1),
    }


def _in_child(fn: Any, *args: Any) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as ex:
        result: dict[str, Any] = ex.submit(fn, *args).result()
        return result


def run(quick: bool) -> dict[str, Any]:
    sizes = (8, 16) if quick else (8, 16, 32, 64, 128)
    per_host = 32 << 10 if quick else 64 << 10
    points: list[dict[str, Any]] = []
    out: dict[str, Any] = {"points": points}
    for scale in (1.0, 20_000.0):
        # the 1,024-host fabric at 400G too, beside ns-3's point (its build: half a minute)
        for hosts in sizes + ((1024,) if scale == 1.0 and not quick else ()):
            try:
                points.append(_in_child(_point, hosts, scale, per_host))
            except Exception as exc:  # one failed point does not lose the others
                points.append(
                    {"hosts": hosts, "scale": scale, "error": f"{type(exc).__name__}: {exc}"}
                )
    if not quick:
        out["allreduce64"] = runs = {}
        for payload in ("size", "data"):
            try:
                runs[payload] = _in_child(collective, FABRICS[64], payload)
            except Exception as exc:
                runs[payload] = {"error": f"{type(exc).__name__}: {exc}"}
    return out
