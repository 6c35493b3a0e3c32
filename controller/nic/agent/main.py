"""`xingmai-agent`: the host agent daemon (one per emulated host, inside its network namespace).

    xingmai-agent --name h1 --netns h1 --interface h1-eth0 --line-rate 100M --rate-law tita

Flags override the YAML config file (`--config`), whose keys are the flags' long names with
underscores (line_rate: 100M, interfaces: [h1-eth0], ...). SIGTERM or SIGINT detach the
programs and remove every class and pin the agent made; SIGKILL leaves flows paced at their
last rate and a restarted agent adopts the pins.
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import yaml

from controller.common.logs import setup_logging
from controller.common.netns import enter_netns, netns_path
from controller.nic.ratelaw import Law

log = logging.getLogger("xingmai.agent.main")

_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(bit|bps|b/s)?\s*$", re.I)
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|ms|s)?\s*$", re.I)


def parse_rate(v: str | int | float) -> int:
    """'100M', '1G', '250mbit', '1e9' or a number: bit/s."""
    if isinstance(v, (int, float)):
        return int(v)
    try:
        return int(float(v))
    except ValueError:
        pass
    m = _RATE.match(v)
    if not m:
        raise argparse.ArgumentTypeError(f"not a rate: {v!r} (e.g. 100M, 1G, 250mbit)")
    mult = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def parse_duration_ns(v: str | int | float) -> int:
    """'100us', '2ms', '1s' or a number of ns."""
    if isinstance(v, (int, float)):
        return int(v)
    m = _TIME.match(v)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {v!r} (e.g. 100us, 2ms)")
    mult = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9, None: 1}[
        m.group(2).lower() if m.group(2) else None
    ]
    return int(float(m.group(1)) * mult)


def parse_bitmap(v: str | int) -> int:
    """'0xf500', '62720' or instruction bit numbers '0,1,2,3,5,7' (bit 0 = MSB)."""
    if isinstance(v, int):
        return v
    if "," in v:
        return sum(0x8000 >> int(b) for b in v.split(",") if b.strip())
    return int(v, 0)


def parse_wire_peer(v: str) -> tuple[str, str, str]:
    """'h1-eth0=/proc/42/ns/net:s1-eth3' -> (interface, namespace path, peer interface)."""
    iface, eq, rest = v.partition("=")
    netns, colon, peer = rest.rpartition(":")
    if not (eq and colon and iface and netns and peer):
        raise argparse.ArgumentTypeError(f"{v!r}: expected IFACE=NETNS:PEER")
    return iface, netns_path(netns), peer


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="xingmai-agent",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("--config", type=Path, help="YAML file with defaults for these flags")
    ap.add_argument("--name", help="agent name: pins, run files and logs (default: netns name)")
    ap.add_argument("--netns", help="network namespace to enter (name in /run/netns or a path)")
    ap.add_argument(
        "--interface",
        "-i",
        dest="interfaces",
        action="append",
        help="interface to attach to (repeat; default: every non-loopback one)",
    )
    ap.add_argument(
        "--wire-peer",
        dest="wire_peers",
        action="append",
        type=parse_wire_peer,
        help="IFACE=NETNS:PEER, the far end of IFACE's wire (PEER in namespace NETNS, a name "
        "in /run/netns or a path): under HTB pacing the RTT probes' departures are stamped "
        "there, after their wait in the flow's class (repeat per interface)",
    )
    ap.add_argument("--line-rate", type=parse_rate, help="emulated NIC line rate, e.g. 100M")
    ap.add_argument(
        "--listen", help="gRPC address (default unix:///run/xingmai/agents/NAME/agent.sock)"
    )
    ap.add_argument("--rate-law", choices=[law.name.lower() for law in Law], help="host rate law")
    ap.add_argument("--base-rtt", type=parse_duration_ns, help="TiTa base RTT T, e.g. 200us")
    ap.add_argument(
        "--int",
        dest="int_enabled",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="act as INT source for the transport's data packets",
    )
    ap.add_argument("--int-dscp", type=lambda v: int(v, 0), help="INT DSCP (default 0x17)")
    ap.add_argument("--int-bitmap", type=parse_bitmap, help="instruction bitmap (default 0xf500)")
    ap.add_argument("--hop-budget", type=int, help="INT RemainingHopCnt at the source")
    ap.add_argument("--mtu", type=int, help="largest IP packet after INT insertion (1500)")
    ap.add_argument("--pacing", choices=["auto", "htb", "edt"], help="pacing mode (auto)")
    ap.add_argument(
        "--sockops",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pace TCP with sock_ops (default on)",
    )
    ap.add_argument("--cgroup", type=Path, help="cgroup v2 folder for sock_ops (default: mount)")
    ap.add_argument("--bpffs-root", type=Path, help="where the agent mounts its bpffs")
    ap.add_argument("--run-root", type=Path, help="where the agent keeps its state file")
    ap.add_argument(
        "--sync-interval",
        type=parse_duration_ns,
        help="least time between two passes over rate changes while rates move "
        "(2ms); idle, the agent waits for the datapath's events",
    )
    ap.add_argument("--idle-timeout", type=float, help="seconds before an idle flow is forgotten")
    ap.add_argument(
        "--metrics-addr",
        help="Prometheus HTTP HOST:PORT, bound in the namespace the agent starts in "
        "(before --netns), e.g. 127.0.0.1:9470 (default: off)",
    )
    ap.add_argument("--log-level", help="debug, info, warning (default info)")
    ap.add_argument("--log-file", type=Path, help="also write JSON logs here")
    return ap


def merged_settings(args: argparse.Namespace) -> dict[str, Any]:
    conf: dict[str, Any] = {}
    if args.config:
        loaded = yaml.safe_load(args.config.read_text()) or {}
        if not isinstance(loaded, dict):
            raise SystemExit(f"{args.config}: expected a mapping of settings")
        known = {a.dest for a in build_parser()._actions}
        unknown = set(loaded) - known
        if unknown:
            raise SystemExit(f"{args.config}: unknown keys {sorted(unknown)}")
        conf.update(loaded)
    for k, v in vars(args).items():
        if v is not None and k != "config":
            conf[k] = v
    return conf


# glibc's mallopt() parameter for the number of malloc arenas (malloc.h: M_ARENA_MAX).
M_ARENA_MAX = -8
MALLOC_ARENAS = 2


def bound_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas. By default glibc gives each new thread its own arena, up to
    8 per core, and keeps what a burst of requests on a gRPC worker grew: 3,000 fuzzed API calls
    grew the agent by 281 MB that way, with the same calls under two arenas growing 54 MB and
    then staying flat. True when the cap is in place (False off glibc)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        return bool(ctypes.CDLL(name).mallopt(M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    bound_malloc_arenas()  # before any thread is started
    args = build_parser().parse_args(argv)
    s = merged_settings(args)
    setup_logging("agent", s.get("log_level", "info"), file=s.get("log_file"))

    # The metrics listener is bound before the agent enters the host's namespace: a socket stays
    # in the namespace it was made in, so Prometheus on the machine reaches it (the testbed's
    # hosts have no address the root namespace can reach).
    from prometheus_client import CollectorRegistry, start_http_server

    reg = CollectorRegistry()
    metrics_server = None
    if s.get("metrics_addr"):
        m_host, _, m_port = str(s["metrics_addr"]).rpartition(":")
        if not m_port.isdigit():
            raise SystemExit(f"--metrics-addr {s['metrics_addr']!r}: expected HOST:PORT")
        metrics_server, _ = start_http_server(int(m_port), addr=m_host or "127.0.0.1", registry=reg)

    # Enter the host's namespace first: everything after (bcc, netlink, sockets) lives there.
    if s.get("netns"):
        enter_netns(str(s["netns"]))
    name = s.get("name") or (Path(str(s["netns"])).name if s.get("netns") else "agent")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise SystemExit(f"agent name {name!r}: letters, digits, '_', '.', '-' only")
    interfaces = s.get("interfaces") or _default_interfaces()
    if not interfaces:
        raise SystemExit("no interface to attach to (give --interface)")
    if "line_rate" not in s:
        raise SystemExit("--line-rate is required (the emulated NIC's speed, e.g. 100M)")
    try:  # a --config file gives them as strings
        wire_peers = tuple(
            parse_wire_peer(w) if isinstance(w, str) else tuple(w)
            for w in s.get("wire_peers") or ()
        )
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"wire_peers: {exc}") from exc
    for iface, _, _ in wire_peers:
        if iface not in interfaces:
            raise SystemExit(f"--wire-peer {iface}=...: {iface} is not one of {interfaces}")

    from controller.nic.agent.agent import Agent, AgentOptions

    opts = AgentOptions(
        name=name,
        interfaces=tuple(interfaces),
        line_rate_bps=parse_rate(s["line_rate"]),
        law=Law[str(s.get("rate_law", "tita")).upper()],
        base_rtt_ns=parse_duration_ns(s.get("base_rtt", 100_000)),
        int_enabled=bool(s.get("int_enabled", True)),
        int_dscp=int(s.get("int_dscp", 0x17)),
        int_bitmap=parse_bitmap(s.get("int_bitmap", 0xF500)),
        int_hop_budget=int(s.get("hop_budget", 8)),
        mtu=int(s.get("mtu", 1500)),
        pacing=str(s.get("pacing", "auto")),
        sockops=bool(s.get("sockops", True)),
        cgroup=Path(s["cgroup"]) if s.get("cgroup") else None,
        bpffs_root=Path(s.get("bpffs_root", "/run/xingmai/bpffs")),
        run_root=Path(s.get("run_root", "/run/xingmai/agents")),
        sync_interval_s=parse_duration_ns(s.get("sync_interval", 2_000_000)) / 1e9,
        idle_timeout_s=float(s.get("idle_timeout", 30.0)),
        wire_peers=wire_peers,
    )
    listen = s.get("listen") or f"unix://{opts.run_dir / 'agent.sock'}"

    import grpc

    from controller.nic.agent.metrics import exposition, registry_for
    from controller.nic.agent.service import MAX_WORKERS, HostAgentService
    from controller.proto import agent_pb2_grpc

    agent = Agent(opts)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        agent.start()
    except Exception as exc:
        log.exception("agent failed to start: %s", exc)
        if agent.adopted:
            # a previous agent's maps and classes still pace its flows: leave them for the
            # next attempt rather than tear them down
            log.error("leaving the adopted pins and classes in place")
        else:
            agent.stop()
        return 1
    registry_for(agent, reg)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="grpc"),
        options=[("grpc.so_reuseport", 0)],
    )
    agent_pb2_grpc.add_HostAgentServicer_to_server(
        HostAgentService(agent, lambda: exposition(reg)), server
    )
    if listen.startswith("unix://"):
        sock = Path(listen[len("unix://") :])
        sock.parent.mkdir(parents=True, exist_ok=True)
        sock.unlink(missing_ok=True)
    try:
        server.add_insecure_port(listen)
    except RuntimeError as exc:
        log.error("cannot listen on %s: %s", listen, exc)
        agent.stop()
        return 1
    server.start()
    log.info("serving", extra={"listen": listen, "metrics": s.get("metrics_addr", "")})
    stop.wait()
    log.info("stopping")
    server.stop(grace=1).wait()
    if metrics_server is not None:
        metrics_server.shutdown()
    agent.stop()
    if listen.startswith("unix://"):
        Path(listen[len("unix://") :]).unlink(missing_ok=True)
    return 0


def _default_interfaces() -> list[str]:
    import socket

    # the netns's own list (/sys/class/net would show the mount's namespace)
    return sorted(n for _, n in socket.if_nameindex() if n != "lo")


if __name__ == "__main__":
    sys.exit(main())
