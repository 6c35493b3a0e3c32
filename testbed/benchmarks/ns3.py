"""ns-3 forwarding the twin bench's load, for a packet-hop rate to set beside the twin's.

The same leaf-spines as `testbed.benchmarks.twin` (8 to 128 hosts), built in ns-3 from
point-to-point links at the model's port speed (400 Gb/s, 80 ns, MTU 9000, one 500 KB FIFO
per port) with IPv4 routers as switches (global routing, random per-packet ECMP over the
spines): every host sends `per_host` bytes of UDP (4096-byte payloads, paced at its share of
its leaf's uplinks) to the host half the fabric away, all at once.

Figures, of `Simulator::Run` alone: wall and CPU seconds, packets delivered, packet-hops
(packets the switches' devices received, counted by a C++ callback on their MacRx traces) per
wall and per CPU second, and the process's peak RSS (most of it cppyy's C++ interpreter, given
alone as `rss_after_import_mib`). Each point is measured twice in its process: cold (as the
twin's figures) and, on a rebuilt fabric, `warm`.

ns-3 is optional and runs in a Python of its own: the interpreter named by NS3_PYTHON (one with
`pip install ns3==3.44.post0`, the project's `ns3` extra), else this one if it has ns3; with
neither the benchmark records why it was skipped. Each point runs in a process of its own.

    NS3_PYTHON=/path/to/venv/bin/python python -m testbed.benchmarks.ns3 --hosts 8 16
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

NS3_PYTHON = "NS3_PYTHON"
POINT_TIMEOUT_S = 3600

# Per-packet counters in C++: a Python callback per packet would time cppyy, not ns-3.
_COUNTERS = """
namespace xingmai_bench {
uint64_t hops = 0;
uint64_t delivered = 0;
double last_rx_s = 0;
void OnSwitchRx(ns3::Ptr<const ns3::Packet>) { ++hops; }
void OnSinkRx(ns3::Ptr<const ns3::Packet>, const ns3::Address&) {
    ++delivered;
    last_rx_s = ns3::Simulator::Now().GetSeconds();
}
void Connect(ns3::NodeContainer switches, ns3::ApplicationContainer sinks) {
    for (uint32_t i = 0; i < switches.GetN(); ++i) {
        ns3::Ptr<ns3::Node> node = switches.Get(i);
        for (uint32_t d = 0; d < node->GetNDevices(); ++d) {
            auto dev = ns3::DynamicCast<ns3::PointToPointNetDevice>(node->GetDevice(d));
            if (dev) dev->TraceConnectWithoutContext("MacRx", ns3::MakeCallback(&OnSwitchRx));
        }
    }
    for (uint32_t i = 0; i < sinks.GetN(); ++i)
        sinks.Get(i)->TraceConnectWithoutContext("Rx", ns3::MakeCallback(&OnSinkRx));
}
}
"""


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def sender_gbps(cfg: dict[str, Any]) -> float:
    """Every sender's UDP rate (payload): its fair share of its leaf's uplinks, less the
    IPv4, UDP and PPP headers. The twin's congestion control settles there; open-loop UDP at
    line rate would overflow the uplinks (2:1 to 4:1 oversubscribed) once a host's load
    outgrows the queues."""
    share = min(1.0, cfg["spines"] / cfg["hosts_per_leaf"])
    return float(cfg["link_gbps"] * share * cfg["payload"] / (cfg["payload"] + 20 + 8 + 2))


def _build(ns: Any, counters: Any, cfg: dict[str, Any]) -> Any:
    """The fabric, its routes and its senders in ns-3; returns the receivers (packet sinks)."""
    ns.Config.SetDefault("ns3::Ipv4GlobalRouting::RandomEcmpRouting", ns.BooleanValue(cfg["ecmp"]))
    n_leaves, n_spines, per_leaf = cfg["leaves"], cfg["spines"], cfg["hosts_per_leaf"]
    n = n_leaves * per_leaf
    leaves, spines, hosts = ns.NodeContainer(), ns.NodeContainer(), ns.NodeContainer()
    leaves.Create(n_leaves)
    spines.Create(n_spines)
    hosts.Create(n)
    ns.InternetStackHelper().InstallAll()

    p2p = ns.PointToPointHelper()
    p2p.SetDeviceAttribute("DataRate", ns.StringValue(f"{cfg['link_gbps']:g}Gbps"))
    p2p.SetDeviceAttribute("Mtu", ns.UintegerValue(cfg["mtu"]))
    p2p.SetChannelAttribute("Delay", ns.StringValue(f"{cfg['delay_ns']}ns"))
    # one FIFO per port, as deep as the model's queue (the device's; no queue disc below)
    p2p.SetQueue("ns3::DropTailQueue<Packet>", "MaxSize", ns.StringValue(f"{cfg['queue_bytes']}B"))
    addresses = ns.Ipv4AddressHelper()
    no_qdisc = ns.TrafficControlHelper()
    subnet = 0

    def link(a: Any, b: Any) -> Any:
        """A point-to-point link a-b in a /24 of its own; returns its interfaces."""
        nonlocal subnet
        subnet += 1
        addresses.SetBase(
            ns.Ipv4Address(f"10.{subnet // 256}.{subnet % 256}.0"), ns.Ipv4Mask("255.255.255.0")
        )
        devices = p2p.Install(a, b)
        interfaces = addresses.Assign(devices)
        no_qdisc.Uninstall(devices)  # Assign installs ns-3's default, FqCoDel
        return interfaces

    host_ip = [link(hosts.Get(i), leaves.Get(i // per_leaf)).GetAddress(0) for i in range(n)]
    for i in range(n_leaves):
        for k in range(n_spines):
            link(leaves.Get(i), spines.Get(k))
    ns.Ipv4GlobalRoutingHelper.PopulateRoutingTables()

    port = 9
    any_addr = ns.InetSocketAddress(ns.Ipv4Address.GetAny(), port).ConvertTo()
    sinks = ns.PacketSinkHelper("ns3::UdpSocketFactory", any_addr).Install(hosts)
    for i in range(n):
        dst = ns.InetSocketAddress(host_ip[(i + n // 2) % n], port).ConvertTo()
        sender = ns.OnOffHelper("ns3::UdpSocketFactory", dst)
        sender.SetConstantRate(ns.DataRate(f"{sender_gbps(cfg):.6g}Gbps"), cfg["payload"])
        sender.SetAttribute("MaxBytes", ns.UintegerValue(cfg["per_host"]))
        sender.Install(hosts.Get(i))
    counters.Connect(ns.NodeContainer(leaves, spines), sinks)
    ns.Simulator.Stop(ns.Seconds(1.0))  # the transfers take microseconds
    return sinks


def _measure(ns: Any, counters: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Build the fabric, run it to the end, and return its figures."""
    counters.hops = counters.delivered = 0
    counters.last_rx_s = 0.0
    t_build = time.perf_counter()
    sinks = _build(ns, counters, cfg)
    build_s = time.perf_counter() - t_build

    t0, c0 = time.perf_counter(), time.process_time()
    ns.Simulator.Run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0

    events = int(ns.Simulator.GetEventCount())
    rx = [sinks.Get(i).GetObject[ns.PacketSink]().GetTotalRx() for i in range(sinks.GetN())]
    hops = int(counters.hops)
    figures = {
        "flows_done": sum(1 for b in rx if b >= cfg["per_host"]),
        "packets_delivered": int(counters.delivered),
        "build_s": round(build_s, 2),
        "wall_s": round(wall, 4),
        "simulated_s": float(counters.last_rx_s),
        "cpu_s": round(cpu, 4),
        "events": events,
        "events_per_s": round(events / wall),
        "events_per_cpu_s": round(events / max(cpu, 1e-6)),
        "packet_hops": hops,
        "packet_hops_per_s": round(hops / wall),
        "packet_hops_per_cpu_s": round(hops / max(cpu, 1e-6)),
    }
    ns.Simulator.Destroy()
    return figures


def _point(cfg: dict[str, Any]) -> dict[str, Any]:
    """One fabric in ns-3 (in the ns-3 interpreter's process), run twice: the first run's
    figures (the process cold, as the twin's are), then a rebuilt fabric's (`warm`: cppyy's
    lazily compiled code and ns-3's first-touch costs paid)."""
    t0 = time.perf_counter()
    import cppyy
    from ns import ns

    import_s = time.perf_counter() - t0
    rss_import = _rss_mib()
    cppyy.cppdef(_COUNTERS)
    counters = cppyy.gbl.xingmai_bench
    n = cfg["leaves"] * cfg["hosts_per_leaf"]
    cold = _measure(ns, counters, cfg)
    warm = _measure(ns, counters, cfg)
    return {
        "hosts": n,
        "switches": cfg["leaves"] + cfg["spines"],
        "per_host_bytes": cfg["per_host"],
        "ecmp": cfg["ecmp"],
        "sender_gbps": round(sender_gbps(cfg), 2),
        "flows": n,
        "packets_sent": n * -(-cfg["per_host"] // cfg["payload"]),
        "import_s": round(import_s, 2),
        **cold,
        "warm": warm,
        "rss_after_import_mib": rss_import,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def find_python() -> tuple[str | None, str]:
    """An interpreter with ns3 and its version, or None and why there is none."""
    python = os.environ.get(NS3_PYTHON) or sys.executable
    probe = "from importlib.metadata import version; print(version('ns3'))"
    try:
        out = subprocess.run(
            [python, "-I", "-c", probe], capture_output=True, text=True, timeout=60
        )
    except OSError as exc:
        return None, f"{NS3_PYTHON}={python}: {exc}"
    if out.returncode != 0:
        where = f"{NS3_PYTHON}={python}" if os.environ.get(NS3_PYTHON) else python
        return None, (
            f"no ns3 in {where}; set {NS3_PYTHON} to a Python with "
            "`pip install ns3==3.44.post0` (the ns3 extra)"
        )
    return python, out.stdout.strip()


def _in_process(python: str, cfg: dict[str, Any]) -> dict[str, Any]:
    # -I: this file's folder stays off sys.path (its name would hide the ns3 package)
    cmd = [python, "-I", str(Path(__file__).resolve()), "--point", json.dumps(cfg)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=POINT_TIMEOUT_S)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"exit {out.returncode}: {tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run(
    quick: bool, sizes: tuple[int, ...] | None = None, per_host: int | None = None
) -> dict[str, Any]:
    from testbed.benchmarks.twin import FABRICS
    from testbed.model import DEFAULT_MODEL, LINK_DELAY_MODEL_NS, Scaling

    python, version = find_python()
    if python is None:
        return {"skipped": version}
    sizes = sizes or ((8, 16) if quick else (8, 16, 32, 64, 128, 1024))
    per_host = per_host or (32 << 10 if quick else 64 << 10)  # as the twin's bench
    points: list[dict[str, Any]] = []
    for hosts in sizes:
        leaves, spines, per_leaf = FABRICS[hosts]
        cfg = {
            "leaves": leaves,
            "spines": spines,
            "hosts_per_leaf": per_leaf,
            "per_host": per_host,
            "payload": Scaling().transport_mtu,
            "mtu": Scaling().link_mtu,
            "link_gbps": DEFAULT_MODEL.port_speed_gbps,
            "delay_ns": LINK_DELAY_MODEL_NS,
            "queue_bytes": DEFAULT_MODEL.queue_bytes,
            "ecmp": True,
        }
        try:
            points.append(_in_process(python, cfg))
        except Exception as exc:  # one failed point does not lose the others
            points.append({"hosts": hosts, "error": f"{type(exc).__name__}: {exc}"})
    return {"ns3_version": version, "python": python, "points": points}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, nargs="+", help="fabric sizes (default: all)")
    ap.add_argument("--quick", action="store_true", help="as make bench --quick")
    ap.add_argument("--per-host", type=int, help="bytes each host sends (default: 64 KiB)")
    ap.add_argument("--point", help=argparse.SUPPRESS)  # one point, in the ns-3 Python
    args = ap.parse_args(argv)
    if args.point:
        print(json.dumps(_point(json.loads(args.point))), flush=True)
    else:
        sizes = tuple(args.hosts) if args.hosts else None
        print(json.dumps(run(args.quick, sizes, args.per_host), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
