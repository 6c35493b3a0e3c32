"""`xingmai-controller suspects`: the running controller's ranked suspects, with evidence, the
links it failed over, and (with --all) every suspect named since it started.

    xingmai-controller suspects --config fabric.yaml     # the address from the config
    xingmai-controller suspects --addr 127.0.0.1:50051 --all
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import grpc


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="xingmai-controller suspects", description=__doc__.split("\n\n")[0]
    )
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", "-c", type=Path, help="the controller's config file")
    where.add_argument("--addr", help="the controller's gRPC address")
    ap.add_argument("--all", action="store_true", help="every suspect named since the start")
    return ap


def _line(s: Any, now: float) -> str:
    return (
        f"  {s.score:4.2f}  {s.element:<26} {s.kind:<18} first named "
        f"{now - s.first_named_unix:7.1f} s ago  {s.evidence}"
    )


def main(argv: list[str]) -> int:
    from controller.proto import controller_pb2 as pb
    from controller.proto import controller_pb2_grpc as pb_grpc

    args = build_parser().parse_args(argv)
    addr = args.addr
    if addr is None:
        from controller import config as config_mod

        try:
            addr = config_mod.load(args.config).controller.grpc_addr
        except config_mod.ConfigError as exc:
            print(f"xingmai-controller suspects: {exc}", file=sys.stderr)
            return 2
    with grpc.insecure_channel(addr) as ch:
        try:
            resp = pb_grpc.ControllerStub(ch).GetSuspects(pb.GetSuspectsRequest(), timeout=5)
        except grpc.RpcError as exc:
            print(
                f"xingmai-controller suspects: {addr}: {exc.code().name} {exc.details()}",
                file=sys.stderr,
            )
            return 1
    now = time.time()
    print(f"suspects ({len(resp.suspects)}), ranked:" if resp.suspects else "no suspect")
    for s in resp.suspects:
        print(_line(s, now))
    if resp.dead_links:
        print(f"routed around (fail-over {resp.failovers}x): {', '.join(resp.dead_links)}")
    if args.all:
        print(f"named since the start ({len(resp.named)}):")
        for s in sorted(resp.named, key=lambda s: s.first_named_unix):
            print(_line(s, now))
    return 0
