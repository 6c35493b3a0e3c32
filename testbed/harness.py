"""scapy harness: craft RoCE/INT packets, inject them into an interface, capture and decode.

  python -m testbed.harness craft data --dst 10.0.0.2 --int-hops 3 --out data.pcap
  python -m testbed.harness send --iface eth0 data --dst 10.0.0.2 --capture 1 --out reply.pcap
  python -m testbed.harness capture --iface eth0 --seconds 5 --out cap.pcap
  python -m testbed.harness decode cap.pcap [--int-dscp 23]

`--netns NAME` runs the command inside that network namespace (nsenter --net). Packets are
built with testbed.packets (BTH/AETH/CNP with a correct ICRC, INT-MD v2.1, Telemetry Report
v2.0); pcap files are plain libpcap Ethernet captures that Wireshark opens (it decodes UDP
4791 as RoCEv2; INT-carrying packets need its INT dissector or show the shim as BTH bytes).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw
from scapy.sendrecv import AsyncSniffer, sendp
from scapy.utils import rdpcap, wrpcap

from controller.common.netns import netns_path
from controller.wire.int_md import INT_DSCP_DEFAULT
from controller.wire.roce import OP_ACK, OP_CNP, OP_SEND_ONLY, ROCE_UDP_PORT
from controller.wire.telemetry_report import TELEMETRY_REPORT_PORT
from testbed.packets import AETH, BTH, CNP, decode, int_packet, parse_int, parse_report

# A plausible hop, used for crafted stacks; node ids count down so newest-first is visible.
_HOP = {
    "l1_ingress_port": 1,
    "l1_egress_port": 2,
    "hop_latency": 1500,
    "queue_id": 0,
    "queue_occupancy": 3000,
    "egress_ts": 1_000_000,
    "tx_util": 250_000,
}


def craft(args: argparse.Namespace) -> list[Packet]:
    """The packets a `craft`/`send` command describes."""
    l2 = Ether(src=args.src_mac, dst=args.dst_mac)
    l3 = IP(src=args.src, dst=args.dst, tos=(args.dscp << 2) | args.ecn, flags="DF", id=0)
    l4 = UDP(sport=args.sport, dport=ROCE_UDP_PORT, chksum=0)
    out: list[Packet] = []
    for i in range(args.count):
        psn = args.psn + i
        if args.kind == "data":
            bth = BTH(opcode=OP_SEND_ONLY, dqpn=args.qpn, psn=psn, ackreq=1)
            body = bth / Raw(b"\xa5" * args.payload)
            if args.int_hops:
                hops = [dict(_HOP, node_id=args.int_hops - k) for k in range(args.int_hops)]
                pkt = int_packet(
                    src_ip=args.src,
                    dst_ip=args.dst,
                    sport=args.sport,
                    hops=hops,
                    remaining_hop_cnt=max(0, 8 - args.int_hops),
                    payload=body,
                    src_mac=args.src_mac,
                    dst_mac=args.dst_mac,
                    ecn=args.ecn,
                    int_dscp=args.int_dscp,
                    ip_id=0,
                )
            else:
                pkt = l2 / l3 / l4 / body
        elif args.kind == "ack":
            pkt = (
                l2
                / l3
                / l4
                / BTH(opcode=OP_ACK, dqpn=args.qpn, psn=psn)
                / AETH(syndrome=args.syndrome, msn=0)
            )
        elif args.kind == "cnp":
            pkt = l2 / l3 / l4 / BTH(opcode=OP_CNP, dqpn=args.qpn, psn=0) / CNP()
        else:
            raise ValueError(f"unknown packet kind {args.kind}")
        out.append(Ether(bytes(pkt)))  # freeze the computed fields (lengths, ICRC)
    return out


def describe(pkt: Packet, int_dscp: int | None) -> str:
    """One line per packet, with the INT stack or telemetry report decoded."""
    p = decode(bytes(pkt), int_dscp)
    line = p.summary()
    if BTH in p:
        b = p[BTH]
        line += f" | opcode={b.opcode:#04x} dqpn={b.dqpn:#x} psn={b.psn} ackreq={b.ackreq}"
    if AETH in p:
        line += f" syndrome={p[AETH].syndrome:#04x} msn={p[AETH].msn}"
    info = parse_int(p)
    if info is not None:
        line += f" | INT hops={len(info['hops'])} " + " ".join(
            f"[node {h.get('node_id')} lat={h.get('hop_latency')} q={h.get('queue_occupancy')}]"
            for h in info["hops"]
        )
    if UDP in p and p[UDP].dport == TELEMETRY_REPORT_PORT:
        rep = parse_report(bytes(p[UDP].payload), int_dscp)
        line += f" | report seq={rep['seq']} node={rep['node_id']} n={len(rep['reports'])}"
    return line


def _capture(
    iface: str, seconds: float, out: Path | None, int_dscp: int | None, during: Any = None
) -> list[Packet]:
    sniffer = AsyncSniffer(iface=iface, store=True)
    sniffer.start()
    time.sleep(0.2)  # the socket is open before anything is sent
    if during is not None:
        during()
    time.sleep(seconds)
    pkts = list(sniffer.stop() or [])
    for p in pkts:
        print(describe(p, int_dscp))
    if out is not None:
        wrpcap(str(out), pkts)
        print(f"{len(pkts)} packets written to {out}")
    return pkts


def _add_packet_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=["data", "ack", "cnp"])
    p.add_argument("--src", default="10.0.0.1")
    p.add_argument("--dst", default="10.0.0.2")
    p.add_argument("--src-mac", default="02:00:00:00:00:01")
    p.add_argument("--dst-mac", default="ff:ff:ff:ff:ff:ff")
    p.add_argument("--sport", type=int, default=49152)
    p.add_argument("--qpn", type=lambda s: int(s, 0), default=1)
    p.add_argument("--psn", type=int, default=0)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--payload", type=int, default=256, help="data payload bytes")
    p.add_argument("--int-hops", type=int, default=0, help="INT stack of this many hops")
    p.add_argument("--dscp", type=int, default=0)
    p.add_argument("--ecn", type=int, default=0b10, help="2 = ECT(0), 3 = CE")
    p.add_argument("--syndrome", type=lambda s: int(s, 0), default=0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m testbed.harness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--netns", help="run inside this network namespace (name or path)")
    ap.add_argument(
        "--int-dscp",
        type=int,
        default=INT_DSCP_DEFAULT,
        help="DSCP that marks INT (-1: never parse INT)",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("craft", help="build packets and write them to a pcap")
    _add_packet_args(p)
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("send", help="inject packets into an interface, optionally capture")
    _add_packet_args(p)
    p.add_argument("--iface", required=True)
    p.add_argument("--capture", type=float, default=0.0, help="seconds to capture after")
    p.add_argument("--out", type=Path, help="pcap of what was captured")
    p = sub.add_parser("capture", help="capture from an interface, decode, write a pcap")
    p.add_argument("--iface", required=True)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--out", type=Path)
    p = sub.add_parser("decode", help="decode a pcap file")
    p.add_argument("pcap", type=Path)
    args = ap.parse_args(argv)

    if args.netns:
        path = netns_path(args.netns)
        rest = list(argv if argv is not None else sys.argv[1:])
        i = rest.index("--netns")
        del rest[i : i + 2]
        os.execvp(
            "nsenter",
            ["nsenter", f"--net={path}", "--", sys.executable, "-m", "testbed.harness", *rest],
        )
    int_dscp = None if args.int_dscp < 0 else args.int_dscp
    args.int_dscp = INT_DSCP_DEFAULT if int_dscp is None else int_dscp

    if args.cmd == "craft":
        pkts = craft(args)
        wrpcap(str(args.out), pkts)
        for pkt in pkts:
            print(describe(pkt, int_dscp))
    elif args.cmd == "send":
        pkts = craft(args)
        for pkt in pkts:
            print("sent:", describe(pkt, int_dscp))

        def inject() -> None:
            sendp(pkts, iface=args.iface, verbose=False)

        if args.capture > 0:
            _capture(args.iface, args.capture, args.out, int_dscp, during=inject)
        else:
            inject()
    elif args.cmd == "capture":
        _capture(args.iface, args.seconds, args.out, int_dscp)
    else:
        for pkt in rdpcap(str(args.pcap)):
            print(describe(pkt, int_dscp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
