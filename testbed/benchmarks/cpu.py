"""Where the emulation's CPU goes (`make bench`): per component, idle and during the all-reduce.

Boots the default fabric (2 leaves, 2 spines, 8 hosts; `quick`: 2 leaves, 1 spine, 4 hosts),
then measures from /proc the CPU time (user + system, with reaped children) of the processes
the testbed started, by role:

- `switch`: the switch processes; `agent`: the NIC agents; `controller`: the controller;
- `transport`: the transport workers of a job (children of this process, reaped when the job
  ends: the change of RUSAGE_CHILDREN over the job);
- `probes`: this process itself (INT sampler, rate watcher, the suite's bookkeeping).

Figures:
- `idle`: the fabric up and nothing sent, in windows of `IDLE_WINDOW_S`: each role's CPU as %
  of one core, median and min-max over the windows, and every agent together (the issue's
  goal: all agents <= 2 % of one core); `idle_without_prometheus` the same once the testbed's
  Prometheus server (two scrapes a second of every daemon) is stopped, after the all-reduce;
- `allreduce`: the suite's ring all-reduce once per scheme: CPU seconds per emulated megabyte
  of payload (2(n-1) x size per all-reduce over n ranks) per role, each role's share of the
  CPU used, and the bus bandwidth.
The load average is recorded with each figure: the machine is shared.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

IDLE_WINDOW_S = 10.0
TICK = os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """`pid` and every live process below it (through /proc/PID/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return out


def proc_cpu_s(pid: int) -> float:
    """CPU seconds of a process: its own user + system time and that of its reaped children
    (fields 14-17 of /proc/PID/stat); 0 for a process that is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return sum(int(f) for f in fields[11:15]) / TICK


def tree_cpu_s(pid: int) -> float:
    return sum(proc_cpu_s(p) for p in descendants(pid))


def own_cpu_s() -> tuple[float, float]:
    """(this process, its reaped children), CPU seconds."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, ch.ru_utime + ch.ru_stime


def sample(roles: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds so far of every role (each agent also on its own: `agent:<host>`)."""
    out = {role: sum(tree_cpu_s(p) for p in pids) for role, pids in roles.items()}
    out["probes"], out["transport"] = own_cpu_s()
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


def testbed_roles(tb: Any) -> dict[str, list[int]]:
    roles: dict[str, list[int]] = {
        "switch": [s.component.pid for s in tb.switches() if s.component is not None],
        "agent": [a.component.pid for a in tb.agents.values()],
        "controller": [tb.controller.pid] if tb.controller is not None else [],
    }
    for host, a in tb.agents.items():
        roles[f"agent:{host}"] = [a.component.pid]
    return roles


def idle_cpu(roles: dict[str, list[int]], windows: int, window_s: float) -> dict[str, Any]:
    """Each role's CPU in % of one core over `windows` windows of `window_s` with nothing
    sent: median and min-max."""
    per: dict[str, list[float]] = {}
    loads = [os.getloadavg()[0]]
    for _ in range(windows):
        t0, s0 = time.monotonic(), sample(roles)
        time.sleep(window_s)
        d, dt = delta(s0, sample(roles)), time.monotonic() - t0
        for role, cpu in d.items():
            per.setdefault(role, []).append(100 * cpu / dt)
        loads.append(os.getloadavg()[0])
    out: dict[str, Any] = {
        "windows": windows,
        "window_s": window_s,
        "load_avg_1m": [round(x, 2) for x in loads],
    }
    for role, vals in sorted(per.items()):
        if role.startswith("agent:") or role == "transport":
            continue
        out[f"{role}_pct_of_core"] = spread(vals)
    agents = [v for r, v in per.items() if r.startswith("agent:")]
    out["agent_each_pct_of_core"] = spread([statistics.median(v) for v in agents])
    return out


def spread(vals: list[float]) -> dict[str, float]:
    """Median and min-max of repeated figures (the benchmarks' spread)."""
    return {
        "median": round(statistics.median(vals), 3),
        "min": round(min(vals), 3),
        "max": round(max(vals), 3),
    }


def allreduce_cpu(tb: Any, suite: Any, schemes: tuple[str, ...]) -> dict[str, Any]:
    """The suite's all-reduce once per scheme, with the CPU of every role over it."""
    roles = {k: v for k, v in testbed_roles(tb).items() if not k.startswith("agent:")}
    n = len(suite.hosts)
    payload_mb = 2 * (n - 1) * suite.cfg.allreduce_bytes / 1e6
    out: dict[str, Any] = {"ranks": n, "payload_mb_per_run": round(payload_mb, 3)}
    for scheme in schemes:
        suite._set_policy(scheme, suite.scheme_cc(scheme))
        load = os.getloadavg()[0]
        t0, s0 = time.monotonic(), sample(roles)
        rec = suite.run_one(scheme, "allreduce")
        d, wall = delta(s0, sample(roles)), time.monotonic() - t0
        used = sum(d.values())
        out[scheme] = {
            "load_avg_1m": round(load, 2),
            "wall_s": round(wall, 2),
            "completion_s": round(rec.completion_s, 3),
            "busbw_mbps": None if rec.busbw_bps is None else round(rec.busbw_bps / 1e6, 3),
            "cpu_s": {r: round(c, 3) for r, c in sorted(d.items())},
            "cpu_s_per_mb": {r: round(c / payload_mb, 4) for r, c in sorted(d.items())},
            "share_of_cpu_used": {r: round(c / used, 3) for r, c in sorted(d.items())},
            "cores_busy": round(used / wall, 2),
        }
    return out


def run(quick: bool) -> dict[str, Any]:
    if os.geteuid() != 0:
        return {"skipped": "needs root (network namespaces, veths, eBPF)"}
    from testbed.emu.network import Testbed, TestbedOptions
    from testbed.emu.suite import EmuSuite
    from testbed.experiment.rundir import new_run_dir
    from testbed.experiment.suite import SuiteConfig
    from testbed.topo import leafspine

    spec = leafspine(2, 1, 2) if quick else leafspine(2, 2, 4)
    base = SuiteConfig.quick() if quick else SuiteConfig()
    cfg = SuiteConfig(**{**base.__dict__, "scenarios": ("allreduce",)})
    run_dir = new_run_dir()
    tb = Testbed(spec, TestbedOptions(run_dir=run_dir, progress=lambda line: None))
    with tb, EmuSuite(tb, cfg) as suite:
        time.sleep(3.0)  # boot's last RPCs and compiles settle
        roles = testbed_roles(tb)
        idle = idle_cpu(roles, 1 if quick else 3, IDLE_WINDOW_S)
        suite.prepare()
        schemes = ("tita",) if quick else ("none", "dcqcn", "tita")
        busy = allreduce_cpu(tb, suite, schemes)
        # What the monitoring costs the idle daemons: Prometheus scrapes every one of them
        # twice a second (each scrape builds the daemon's metrics in Python)
        unscraped = None
        if tb.prometheus is not None:
            tb.prometheus.stop()
            unscraped = idle_cpu(roles, 1 if quick else 3, IDLE_WINDOW_S)
        return {
            "topology": spec.name,
            "switch": tb.switch_cls.kind,
            "agents": len(tb.agents),
            "idle": idle,
            "idle_without_prometheus": unscraped,
            "allreduce": busy,
            "run_dir": str(run_dir),
        }
