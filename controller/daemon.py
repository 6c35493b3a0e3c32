"""xingmai-controller: programs the fabric over P4Runtime, collects its telemetry, and runs the
slow rate-control loop on the hosts' agents.

    xingmai-controller --config fabric.yaml

Runs in the foreground (systemd: controller/systemd/xingmai-controller.service). SIGHUP reloads
the config and re-programs only the difference; SIGTERM or SIGINT shut down cleanly (the
switches and agents keep their state: a restarted controller adopts it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from controller import config as config_mod
from controller.common.logs import setup_logging
from controller.config import Config, ConfigError

log = logging.getLogger("xingmai.controller")


class Daemon:
    def __init__(self, cfg: Config, config_path: Path, overrides: argparse.Namespace | None = None):
        from controller.collector import Collector
        from controller.hostagents import connect_agents
        from controller.slowloop import SlowLoop
        from controller.switches import SwitchSession
        from controller.topology import Topology

        self.cfg = cfg
        self.config_path = config_path
        self.overrides = overrides  # the command line's, applied again on every reload
        self.topo = Topology(cfg)
        self.collector = Collector(self.topo, cfg.int.dscp, cfg.controller.series_points)
        self.sessions = {
            s.name: SwitchSession(cfg, self.topo, s, self.collector) for s in cfg.switches
        }
        self.agents = connect_agents(cfg)
        self.slowloop = SlowLoop(
            cfg.policy,
            self.topo,
            self.collector,
            self.agents,
            timeout_s=cfg.controller.rpc_timeout_s,
        )
        from controller.operations import Operations

        self.operations = Operations(self)  # localization and fail-over
        self.started = time.monotonic()
        self.reloads = 0
        self.reload_failures = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._udp: asyncio.DatagramTransport | None = None
        self._server: Any = None
        self._metrics: Any = None
        self.web: Any = None

    def healthy(self) -> bool:
        return all(
            s.health.connected and (s.health.programmed or not s.health.primary)
            for s in self.sessions.values()
        )

    # ---- lifecycle ----

    async def start(self) -> None:
        from controller.collector import serve_udp

        c = self.cfg.controller
        col = self.cfg.int.collector
        self._udp = await serve_udp(self.collector, col.bind, col.netns)
        self._server = await self._start_grpc(c.grpc_addr, c.tls)
        if c.metrics_addr:
            self._metrics = self._start_metrics(c.metrics_addr)
        if c.web_addr:
            from controller.web import WebServer

            self.web = WebServer(self)
            await self.web.start(c.web_addr)
        for s in self.sessions.values():
            s.start()
        self._tasks.append(asyncio.create_task(self.slowloop.run(), name="slowloop"))
        self._tasks.append(asyncio.create_task(self.operations.run(), name="operations"))
        log.info(
            "controller up",
            extra={
                "grpc": c.grpc_addr,
                "collector": col.bind,
                "metrics": c.metrics_addr or "",
                "web": c.web_addr or "",
                "switches": len(self.sessions),
                "agents": len(self.agents),
                "election_id": c.election_id,
            },
        )

    async def _start_grpc(self, addr: str, tls: Any) -> Any:
        import grpc

        from controller.proto import controller_pb2_grpc
        from controller.service import ControllerService

        # the port is this process's alone (gRPC's default SO_REUSEPORT would share it)
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        controller_pb2_grpc.add_ControllerServicer_to_server(ControllerService(self), server)
        if tls is not None:
            creds = grpc.ssl_server_credentials(
                [(tls.key.read_bytes(), tls.cert.read_bytes())],
                root_certificates=tls.ca.read_bytes(),
                require_client_auth=True,
            )
            bound = server.add_secure_port(addr, creds)
        else:
            bound = server.add_insecure_port(addr)
        if not bound:
            await server.stop(None)
            raise OSError(f"cannot listen on {addr}")
        await server.start()
        return server

    def _start_metrics(self, addr: str) -> Any:
        from prometheus_client import start_http_server

        from controller.metrics import registry

        host, _, port = addr.rpartition(":")
        try:
            server, _thread = start_http_server(
                int(port), addr=host or "127.0.0.1", registry=registry(self)
            )
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {addr}: {exc}") from exc
        return server

    async def stop(self) -> None:
        log.info("controller stopping")
        if self._server is not None:
            await self._server.stop(grace=1.0)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await asyncio.gather(*(s.stop() for s in self.sessions.values()))
        for agent in self.agents.values():
            await agent.close()
        if self._udp is not None:
            self._udp.close()
        if self._metrics is not None:
            self._metrics.shutdown()
        if self.web is not None:
            await self.web.stop()
        log.info("controller stopped")

    async def reload(self) -> None:
        """SIGHUP: a new config, applied as a difference. A bad file changes nothing."""
        from controller.hostagents import connect_agents
        from controller.switches import SwitchSession
        from controller.topology import Topology

        try:
            cfg = config_mod.load(self.config_path)
            if self.overrides is not None:
                cfg = apply_overrides(cfg, self.overrides)
        except ConfigError as exc:
            self.reload_failures += 1
            log.error("reload refused, keeping the running config", extra={"error": str(exc)})
            return
        old = self.cfg
        try:
            changed = await self._apply_listeners(old, cfg)
        except (OSError, RuntimeError) as exc:
            self.reload_failures += 1
            log.error(
                "reload refused: a listener could not be changed; the running config and "
                "listeners stay",
                extra={"error": str(exc)},
            )
            return
        topo = Topology(cfg)
        self.cfg, self.topo = cfg, topo
        self.collector.topo = topo
        for name in list(self.sessions):
            if name not in {s.name for s in cfg.switches}:
                await self.sessions.pop(name).stop()
        for s in cfg.switches:
            sess = self.sessions.get(s.name)
            if sess is None:
                sess = self.sessions[s.name] = SwitchSession(cfg, topo, s, self.collector)
                sess.start()
            else:
                await sess.reload(cfg, topo, s)
        # what the agents are told at setup (INT source, hop speeds) or where they are changed:
        # new clients, which set every agent up again
        if (old.hosts, old.switches, old.links, old.int, old.model) != (
            cfg.hosts,
            cfg.switches,
            cfg.links,
            cfg.int,
            cfg.model,
        ):
            for agent in self.agents.values():
                await agent.close()
            self.agents = connect_agents(cfg)
            self.slowloop.set_agents(self.agents)
        self.slowloop.topo = topo
        self.slowloop.set_policy(cfg.policy)
        self.reloads += 1
        log.info(
            "config reloaded", extra={"file": str(self.config_path), "listeners_changed": changed}
        )

    async def _apply_listeners(self, old: Config, new: Config) -> list[str]:
        """Rebind what a reload changes: the gRPC API (address or TLS), the collector's socket
        (address or namespace), the metrics server, the fabric page. All new listeners are made
        first; if one fails, the ones already made are closed and the running ones stay (the
        caller refuses the reload)."""
        oc, nc = old.controller, new.controller
        ocol, ncol = old.int.collector, new.int.collector
        grpc_changed = (oc.grpc_addr, oc.tls) != (nc.grpc_addr, nc.tls)
        udp_changed = (ocol.bind, ocol.netns) != (ncol.bind, ncol.netns)
        metrics_changed = oc.metrics_addr != nc.metrics_addr
        web_changed = oc.web_addr != nc.web_addr
        if not (grpc_changed or udp_changed or metrics_changed or web_changed):
            return []
        from controller.collector import serve_udp

        # The same address cannot be bound twice: what keeps its address (a TLS change) is
        # stopped first, and restarted as it was if its successor fails.
        made: list[tuple[str, Any]] = []
        try:
            if grpc_changed:
                if oc.grpc_addr == nc.grpc_addr and self._server is not None:
                    await self._server.stop(grace=1.0)
                    self._server = None
                made.append(("grpc", await self._start_grpc(nc.grpc_addr, nc.tls)))
            if udp_changed:
                if ocol.bind == ncol.bind and self._udp is not None:
                    self._udp.close()
                    self._udp = None
                made.append(("udp", await serve_udp(self.collector, ncol.bind, ncol.netns)))
            if metrics_changed:
                if self._metrics is not None and oc.metrics_addr == nc.metrics_addr:
                    self._metrics.shutdown()
                    self._metrics = None
                made.append(
                    ("metrics", self._start_metrics(nc.metrics_addr) if nc.metrics_addr else None)
                )
            if web_changed:
                web = None
                if nc.web_addr:
                    from controller.web import WebServer

                    web = WebServer(self)
                    await web.start(nc.web_addr)
                made.append(("web", web))
        except (OSError, RuntimeError):
            for kind, obj in made:
                await self._close_listener(kind, obj)
            if self._server is None:
                self._server = await self._start_grpc(oc.grpc_addr, oc.tls)
            if self._udp is None:
                self._udp = await serve_udp(self.collector, ocol.bind, ocol.netns)
            if self._metrics is None and oc.metrics_addr:
                self._metrics = self._start_metrics(oc.metrics_addr)
            raise
        changed = []
        for kind, obj in made:
            changed.append(kind)
            if kind == "grpc":
                old_server, self._server = self._server, obj
            elif kind == "udp":
                old_server, self._udp = self._udp, obj
            elif kind == "web":
                old_server, self.web = self.web, obj
            else:
                old_server, self._metrics = self._metrics, obj
            if old_server is not None:
                await self._close_listener(kind, old_server)
        log.info(
            "listeners changed",
            extra={
                "grpc": nc.grpc_addr,
                "tls": nc.tls is not None,
                "collector": ncol.bind,
                "metrics": nc.metrics_addr or "",
            },
        )
        return changed

    @staticmethod
    async def _close_listener(kind: str, obj: Any) -> None:
        if obj is None:
            return
        if kind == "grpc":
            await obj.stop(grace=1.0)
        elif kind == "udp":
            obj.close()
        elif kind == "web":
            await obj.stop()
        else:
            obj.shutdown()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: self._spawn(self.reload()))
        try:
            await self.start()
        except OSError as exc:
            log.error("cannot start", extra={"error": str(exc)})
            await self.stop()
            return 1
        await self._stop.wait()
        await self.stop()
        return 0

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="xingmai-controller",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The config format is described in controller/examples/leafspine-2x2.yaml. "
        "`xingmai-controller suspects --help`: the running controller's suspects.",
    )
    ap.add_argument("--config", "-c", type=Path, required=True, help="YAML config file")
    ap.add_argument(
        "--check", action="store_true", help="validate the config and exit (0: valid, 2: not)"
    )
    ap.add_argument(
        "--election-id",
        type=int,
        help="override controller.election_id (lower than the primary's: backup)",
    )
    ap.add_argument("--grpc-addr", help="override controller.grpc_addr")
    ap.add_argument("--metrics-addr", help="override controller.metrics_addr")
    ap.add_argument("--web-addr", help="override controller.web_addr (the fabric page)")
    ap.add_argument("--collector-listen", help="override int.collector.listen")
    ap.add_argument(
        "-L",
        "--log-level",
        choices=["trace", "debug", "info", "warn", "error"],
        help="override controller.log_level",
    )
    ap.add_argument("--log-file", type=Path, help="override controller.log_file")
    ap.add_argument(
        "--log-console", action="store_true", help="log to stderr even when a log file is set"
    )
    return ap


def apply_overrides(cfg: Config, args: argparse.Namespace) -> Config:
    import dataclasses

    c = cfg.controller
    changes: dict[str, Any] = {}
    if args.election_id is not None:
        if args.election_id < 1:
            raise ConfigError("--election-id: must be at least 1")
        changes["election_id"] = args.election_id
    for key in ("grpc_addr", "metrics_addr", "web_addr", "log_level", "log_file"):
        v = getattr(args, key)
        if v is not None:
            changes[key] = v
    if changes:
        cfg = dataclasses.replace(cfg, controller=dataclasses.replace(c, **changes))
    if args.collector_listen:
        col = dataclasses.replace(cfg.int.collector, listen=args.collector_listen)
        cfg = dataclasses.replace(cfg, int=dataclasses.replace(cfg.int, collector=col))
    return cfg


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "suspects":  # a client of the running daemon
        from controller.suspects import main as suspects_main

        return suspects_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        cfg = apply_overrides(config_mod.load(args.config), args)
        for sw in cfg.switches:
            pipe = cfg.pipeline_of(sw)
            for p in (pipe.p4info, pipe.bmv2_json):
                if not p.is_file():
                    raise ConfigError(f"pipeline: {p} does not exist (make p4?)")
    except ConfigError as exc:
        print(f"xingmai-controller: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(
            f"{args.config}: valid ({len(cfg.switches)} switches, {len(cfg.hosts)} hosts, "
            f"{len(cfg.links)} links)"
        )
        for w in cfg.warnings():
            print(f"warning: {w}", file=sys.stderr)
        return 0
    c = cfg.controller
    setup_logging(
        f"controller:{c.name}",
        c.log_level,
        console=args.log_console or c.log_file is None,
        file=c.log_file,
    )
    for w in cfg.warnings():
        log.warning("config: %s", w)
    return asyncio.run(_run(cfg, args.config, args))


async def _run(cfg: Config, path: Path, args: argparse.Namespace) -> int:
    # made inside the event loop: its gRPC channels belong to this loop
    return await Daemon(cfg, path, args).run()


if __name__ == "__main__":
    sys.exit(main())
