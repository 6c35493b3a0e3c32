"""Two sans-I/O transport cores joined by a function that moves packets, on the caller's clock."""

from __future__ import annotations

from collections.abc import Callable

from testbed.traffic.transport_core import TransportConfig, TransportCore

A, B = "10.0.0.1", "10.0.0.2"
MTU = 1024


def pair(**cfg: object) -> tuple[TransportCore, TransportCore]:
    a = TransportCore(TransportConfig(local_ip=A, mtu=MTU, **cfg), seed=1)  # type: ignore[arg-type]
    b = TransportCore(TransportConfig(local_ip=B, mtu=MTU, **cfg), seed=2)  # type: ignore[arg-type]
    a.create_qp(5, B, 6)
    b.create_qp(6, A, 5)
    return a, b


def opcode(pkt: bytes) -> int:
    ihl = (pkt[0] & 0x0F) * 4
    return pkt[ihl + 8]


def shuttle(
    a: TransportCore,
    b: TransportCore,
    now: float,
    wire: Callable[[bytes], bytes | None] = lambda p: p,
) -> list[bytes]:
    """Move packets both ways until neither core has anything to send; `wire` may change or
    drop (None) a packet. Returns every packet that was sent."""
    sent: list[bytes] = []
    peer = {id(a): b, id(b): a}
    moved = True
    while moved:
        moved = False
        for core in (a, b):
            out = []
            while core.feedback:
                out.append(core.feedback.popleft().packet)
            for qp in core.senders():
                while (pkt := qp.peek(now)) is not None:
                    qp.commit(now)
                    out.append(pkt)
            for pkt in out:
                moved = True
                sent.append(pkt)
                got = wire(pkt)
                if got is not None:
                    peer[id(core)].receive(got, now)
    return sent
