"""Print an INT packet before and after three switches (the example in docs/int.md).

    .venv/bin/python -m tests.p4.int_example

A RoCE-like packet from a NIC that is the INT source (no hops yet, instruction bitmap 0xF500,
hop budget 8) crosses s1 - s2 - s3 of the built-in switch running p4src/build/xingmai.json,
programmed over P4Runtime; s3's port towards the host is rate-limited so a queue builds. The
packet shown is the fourth of a burst of eight.
"""

from __future__ import annotations

import contextlib
import io

from testbed.packets import BTH, decode, int_packet
from tests.p4.harness import BuiltinFabric
from tests.p4.int_chain import CHAIN, program_chain


def main() -> None:
    before = int_packet(
        src_ip="10.0.1.1",
        dst_ip="10.0.2.2",
        sport=49152,
        src_mac="02:00:00:00:00:11",
        dst_mac="02:00:00:00:00:b0",
        bitmap=0xF500,
        remaining_hop_cnt=8,
        payload=BTH(opcode=0x04, dqpn=0x12, psn=7) / (b"\x00" * 16),
    )
    frame = bytes(before)
    fab = BuiltinFabric(CHAIN)
    try:
        program_chain(fab, frame_bytes=len(frame) + 3 * 28)
        fab.set_port_rate(2, 2, pps=10_000, frame_bytes=len(frame) + 3 * 28)
        for _ in range(8):
            fab.send("h1", frame)
        fab.settle()
        after = fab.take("h2")[3]
    finally:
        fab.close()
    for title, data in (("before (as the NIC sends it)", frame), ("after s1, s2, s3", after)):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            decode(data).show()
        print(f"# {title}: {len(data)} bytes\n{out.getvalue()}")


if __name__ == "__main__":
    main()
