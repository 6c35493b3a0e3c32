"""xingmai-switch: the built-in P4 switch, command-line compatible with simple_switch_grpc.

    xingmai-switch -i 1@veth1 -i 2@veth2 --device-id 1 --no-p4 \\
        -- --grpc-server-addr 127.0.0.1:9559 --cpu-port 255

Runs p4c's bmv2 JSON with v1model semantics, serves P4Runtime (and the SwitchAdmin service for
queue rates and depths) on the gRPC address, and optional Prometheus metrics. Options may also
come from a YAML file (--config) whose keys are the long option names.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from controller.common.logs import setup_logging
from testbed.switch.dataplane import Wire, parse_wire
from testbed.switch.program import LoadError
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import CELL_BYTES, DEFAULT_PIPELINE, PIPELINES, QDEPTH_UNITS, V1Switch

log = logging.getLogger("xingmai.switch")


def parse_interface(spec: str) -> tuple[int, str]:
    port, sep, iface = spec.partition("@")
    if not sep or not port.isdigit() or not iface:
        raise argparse.ArgumentTypeError(f"interface must be PORT@IFACE, got {spec!r}")
    return int(port), iface


def _wire(spec: str) -> tuple[int, Wire]:
    try:
        return parse_wire(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="xingmai-switch",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("json", nargs="?", type=Path, help="bmv2 JSON to load at start")
    ap.add_argument("--config", type=Path, help="YAML file with any of these options")
    ap.add_argument(
        "-i",
        "--interface",
        action="append",
        type=parse_interface,
        default=[],
        metavar="PORT@IFACE",
        help="attach an interface as a port (repeatable)",
    )
    ap.add_argument(
        "--wire",
        action="append",
        type=_wire,
        default=[],
        metavar="PORT:BPS:DELAY_NS[:in|:stamped]",
        help="the port's link in time: each frame sent on it is held for its length at BPS "
        "plus DELAY_NS before it leaves (a veth delivers at once); with :in, each frame read "
        "from it too (the far end, a host, cannot); with :stamped (the far end a built-in "
        "switch with :stamped too), each frame leaves at once with the time it is due "
        "appended, and each frame read is held until the time it carries; repeatable. The "
        "loop then takes what arrives up to half the shortest DELAY_NS (at most 1 ms) late "
        "(a port without a wire sends that late)",
    )
    ap.add_argument("--device-id", type=int, default=0)
    ap.add_argument("--cpu-port", type=int, help="port whose packets go to/come from P4Runtime")
    ap.add_argument(
        "--grpc-server-addr",
        default="127.0.0.1:9559",
        help="P4Runtime + SwitchAdmin address (default 127.0.0.1:9559; bmv2's "
        "0.0.0.0 would serve every network the host is on)",
    )
    ap.add_argument(
        "--no-p4", action="store_true", help="start without a program; wait for one over P4Runtime"
    )
    ap.add_argument(
        "--p4info",
        type=Path,
        help="P4Info (text) of the JSON given at start, so "
        "P4Runtime can be used without pushing the pipeline",
    )
    ap.add_argument(
        "--thrift-port",
        type=int,
        help="accepted for compatibility; the built-in "
        "switch serves no Thrift API (use SwitchAdmin on the gRPC port)",
    )
    ap.add_argument("--log-console", action="store_true", help="log to stderr")
    ap.add_argument("--log-file", help="log to this file")
    ap.add_argument(
        "-L",
        "--log-level",
        default="info",
        choices=["trace", "debug", "info", "warn", "error", "off"],
    )
    ap.add_argument("--log-flush", action="store_true", help="accepted for compatibility")
    ap.add_argument(
        "--pcap",
        nargs="?",
        const=".",
        metavar="DIR",
        help="write per-port pcap files (in DIR, default the current directory)",
    )
    ap.add_argument("--priority-queues", type=int, default=1, help="queues per egress port")
    ap.add_argument("--drop-port", type=int, default=511)
    ap.add_argument("--queue-depth", type=int, help="queue depth in packets (default 64)")
    ap.add_argument("--queue-depth-bytes", type=int, help="queue depth in bytes (default none)")
    ap.add_argument("--queue-rate", type=float, help="drain rate in packets/s (bmv2 unit)")
    ap.add_argument("--queue-rate-bps", type=float, help="drain rate in bits/s")
    ap.add_argument(
        "--queue-depth-unit",
        choices=QDEPTH_UNITS,
        default="packets",
        help=f"what enq_qdepth/deq_qdepth count (bmv2: packets; cells: {CELL_BYTES} B)",
    )
    ap.add_argument(
        "--pipeline",
        choices=list(PIPELINES),
        default=DEFAULT_PIPELINE,
        help=f"the P4 pipeline (default {DEFAULT_PIPELINE}): native code generated from the "
        "JSON (testbed/switch/native/), or the Python reference it is proven identical to "
        "(where the native one cannot run, no C compiler or a construct it lacks, one line "
        "says why and the reference runs)",
    )
    ap.add_argument(
        "--io",
        choices=list(PIPELINES),
        default=None,
        help="the packet loop's per-frame part (default: as --pipeline): native, in C "
        "(reading the ports, the pipeline, the queues, sending), or Python around the "
        "pipeline; to bisect a difference",
    )
    ap.add_argument("--metrics-addr", help="serve Prometheus metrics on HOST:PORT")
    ap.add_argument("--name", default="", help="name used in logs and metrics")
    return ap


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = build_parser()
    # simple_switch_grpc takes its target options after a bare "--".
    args = ap.parse_args([a for a in argv if a != "--"])
    if args.config:
        try:
            doc = yaml.safe_load(args.config.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            ap.error(f"cannot read config {args.config}: {exc}")
        if not isinstance(doc, dict):
            ap.error(f"config {args.config} must be a mapping of option names")
        cli = [a for a in argv if a != "--"]
        for key, value in doc.items():
            dest = key.replace("-", "_")
            if not hasattr(args, dest):
                ap.error(f"config {args.config}: unknown option {key!r}")
            if f"--{key.replace('_', '-')}" in cli:
                continue  # the command line wins
            if dest == "interface":
                value = [parse_interface(str(v)) for v in value]
            elif dest in ("json", "p4info", "pcap", "config") and value is not None:
                value = Path(value) if dest != "pcap" else str(value)
            setattr(args, dest, value)
    if args.json is None and not args.no_p4:
        ap.error("give a bmv2 JSON or --no-p4")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging(
        f"switch{':' + args.name if args.name else ''}",
        args.log_level,
        console=args.log_console or not args.log_file,
        file=args.log_file,
    )
    if args.thrift_port:
        log.warning(
            "--thrift-port %d ignored: no Thrift server; queue settings are in the "
            "SwitchAdmin gRPC service",
            args.thrift_port,
        )

    # Imported here so that --help works before `make proto` has run.
    from controller.proto import switch_pb2_grpc
    from testbed.switch.admin import SwitchAdminService, metrics_registry
    from testbed.switch.dataplane import Dataplane
    from testbed.switch.p4runtime import (
        P4RuntimeService,
        RpcError,
        parse_p4info_text,
        serve,
    )

    sw = V1Switch(
        Clock(),
        device_id=args.device_id,
        cpu_port=args.cpu_port,
        drop_port=args.drop_port,
        nb_queues=args.priority_queues,
        qdepth_unit=args.queue_depth_unit,
        pipeline=args.pipeline,
    )
    sw.tm.set_depth(None, args.queue_depth, args.queue_depth_bytes)
    sw.tm.set_rate(None, args.queue_rate, args.queue_rate_bps)
    sw.log_fn = lambda msg: log.info("log_msg: %s", msg)
    interfaces = dict(args.interface)
    if len(interfaces) != len(args.interface):
        log.error("a port number is given twice in -i")
        return 2
    wires = dict(args.wire)
    if len(wires) != len(args.wire):
        log.error("a port number is given twice in --wire")
        return 2
    try:
        io = args.io or args.pipeline
        dp = Dataplane(sw, interfaces, Path(args.pcap) if args.pcap else None, io, wires)
    except ValueError as exc:  # a wire on a port with no interface
        log.error("%s", exc)
        return 2
    except OSError as exc:
        log.error("cannot open interfaces: %s", exc)
        return 1
    p4rt = P4RuntimeService(sw, args.device_id, inject=dp.inject)
    dp.cpu_handler = p4rt.packet_in
    if args.json is not None:
        try:
            if args.p4info is not None:
                p4rt.install(parse_p4info_text(args.p4info.read_text()), args.json.read_bytes(), 0)
            else:
                sw.load(args.json.read_bytes())
        except (OSError, LoadError, RpcError) as exc:
            log.error("cannot load %s: %s", args.json, exc)
            dp.close()
            return 1
    admin = SwitchAdminService(sw, dp, p4rt)
    try:
        server = serve(
            p4rt,
            args.grpc_server_addr,
            also=(lambda srv: switch_pb2_grpc.add_SwitchAdminServicer_to_server(admin, srv),),
        )
    except (OSError, RuntimeError) as exc:
        log.error("cannot serve gRPC on %s: %s", args.grpc_server_addr, exc)
        dp.close()
        return 1
    if args.metrics_addr:
        from prometheus_client import start_http_server

        host, _, port = args.metrics_addr.rpartition(":")
        start_http_server(
            int(port),
            addr=host or "127.0.0.1",
            registry=metrics_registry(sw, dp, args.name or str(args.device_id)),
        )
    dp.start()
    log.info(
        "switch up",
        extra={
            "device_id": args.device_id,
            "grpc": args.grpc_server_addr,
            "ports": {str(k): v for k, v in interfaces.items()},
            "cpu_port": args.cpu_port,
        },
    )
    done = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        log.info("signal %d: shutting down", signum)
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    done.wait()
    server.stop(grace=1).wait()
    dp.stop()
    log.info("switch stopped", extra={"rx": sw.stats.rx, "tx": sw.stats.tx})
    return 0


if __name__ == "__main__":
    sys.exit(main())
