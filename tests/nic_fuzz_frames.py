"""Random, truncated and corrupted frames of every kind the NIC's XDP and tc programs parse."""

from __future__ import annotations

import random
import socket

from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from testbed.packets.int_md import IntHop, IntMD, IntShim
from testbed.packets.roce import AETH, BTH, CNP

A, B = "10.0.1.1", "10.0.2.2"


def templates() -> list[bytes]:
    """Valid packets of every kind the programs parse, to truncate and corrupt."""
    hop = {
        "node_id": 1,
        "l1_ingress_port": 1,
        "l1_egress_port": 2,
        "hop_latency": 1,
        "queue_id": 0,
        "queue_occupancy": 100,
        "egress_ts": 5,
        "tx_util": 500_000,
    }
    base = Ether() / IP(src=B, dst=A) / UDP(sport=40001, dport=4791)
    return [
        bytes(
            base
            / BTH(opcode=0x11, psn=9)
            / AETH()
            / IntShim()
            / IntMD(instruction_bitmap=0xF500, hops=[IntHop(0xF500, **hop)] * 2)
        ),
        bytes(base / BTH(opcode=0x81) / CNP()),
        bytes(base / BTH(opcode=0x11) / AETH(syndrome=0x60)),
        bytes(
            Ether()
            / IP(src=A, dst=B)
            / UDP(sport=40001, dport=4791)
            / BTH(opcode=0x04)
            / Raw(b"d" * 64)
        ),
        bytes(Ether() / IP(src=A, dst=B) / TCP(sport=1, dport=2) / Raw(b"t" * 20)),
    ]


def fuzz_frames(n: int, seed: int = 4) -> list[bytes]:
    rnd = random.Random(seed)
    tmpl = templates()
    frames = []
    for i in range(n):
        kind = i % 3
        if kind == 0:  # random bytes behind an IPv4 ethertype half of the time
            body = bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(0, 160)))
            head = b"\x02" * 12 + (b"\x08\x00" if rnd.random() < 0.5 else b"\x86\xdd")
            frames.append(head + body)
        elif kind == 1:  # truncated valid packets
            t = rnd.choice(tmpl)
            frames.append(t[: rnd.randrange(14, len(t))])
        else:  # valid packets with random bytes flipped (addresses left alone: not our flow)
            t = bytearray(rnd.choice(tmpl))
            for _ in range(rnd.randrange(1, 6)):
                pos = rnd.randrange(34, len(t))
                t[pos] = rnd.getrandbits(8)
            t[26:30] = socket.inet_aton("10.9.9.9")  # a source no flow of ours talks to
            frames.append(bytes(t))
    return frames
