"""How jobs number their queue pairs, and what they need of a host's transport.

The QP of host i towards host j in slot k has QPN `qpn(j, k)` on host i and `qpn(i, k)` on
host j, so both ends know each other's QPN without a handshake. Jobs sharing hosts use
different slots (the workloads' flows 0-3, the collective library's channels from 8).
"""

from __future__ import annotations

from typing import Protocol

from testbed.traffic.transport_core import QueuePair

QP_SLOTS = 64


def qpn(peer: int, slot: int) -> int:
    if not 0 <= slot < QP_SLOTS:
        raise ValueError(f"slot {slot} out of range")
    return 1 + peer * QP_SLOTS + slot


class QpHost(Protocol):
    """What a job needs of its host's transport (TransportCore or the socket Transport)."""

    @property
    def qps(self) -> dict[int, QueuePair]: ...

    def create_qp(
        self, qpn: int, peer_ip: str, remote_qpn: int, *, local_ip: str | None = None
    ) -> QueuePair: ...

    def hint_rate(self, qp: QueuePair, rate_bps: int) -> None: ...

    def nic_payload_rate(self, qp: QueuePair) -> float: ...
