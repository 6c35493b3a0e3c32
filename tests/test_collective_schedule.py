"""The adaptive channel schedule reads the NIC (testbed/traffic/collective_jobs.py, sans-I/O):
a channel whose NIC's rate law cut its flow gets less work before any of its messages
completes; with every NIC at its line rate, or no NIC to read, the channels share evenly."""

from __future__ import annotations

from typing import Any

from testbed.traffic.collective_jobs import CollectiveJob
from testbed.traffic.transport_core import QueuePair, TransportConfig, TransportCore

LINE = 100_000_000_000
NICS = [["10.0.1.1", "10.0.2.1"], ["10.0.1.2", "10.0.2.2"]]


class Nic:
    """A host's NICs whose second one sends its flows at `cut` of the line rate."""

    def __init__(self, cut: float) -> None:
        self.cut = cut
        self.reads = 0

    def rate_bps(self, qp: QueuePair) -> int:
        self.reads += 1
        second = qp.local_addr == bytes([10, 0, 2, 1])
        return int(LINE * self.cut) if second else LINE


def _posted(nic: Nic | None, schedule: str = "adaptive") -> list[int]:
    """Messages rank 0 of a two-rank ring all-reduce puts on each channel at its start."""
    core = TransportCore(TransportConfig(local_ip=NICS[0][0], mtu=4096), seed=1)
    core.nic_rates = nic
    spec: dict[str, Any] = {
        "kind": "collective",
        "hosts": [{"name": "h1", "ip": NICS[0][0]}, {"name": "h2", "ip": NICS[1][0]}],
        "nic_ips": NICS,
        "channels": 2,
        "size": 1 << 20,
        "chunk": 16 << 10,
        "schedule": schedule,
    }
    job = CollectiveJob(core, spec, 0)
    job.start(0.0)
    job.poll(0.0)
    return [ch.sent_msgs for ch in job.channels[1]]


def test_a_channel_its_nic_cut_gets_less_work_before_anything_completes() -> None:
    nic = Nic(0.25)
    fast, slow = _posted(nic)
    assert nic.reads > 0
    # the fast channel fills its depth (8); the slow one gets a message only while the fast
    # one has 4 or more queued (it would finish a fifth 4 times later)
    assert fast == 8 and 1 <= slow <= 2


def test_channels_share_evenly_at_line_rate_or_without_a_nic() -> None:
    assert _posted(Nic(1.0)) == [8, 8]
    assert _posted(None) == [8, 8]


def test_the_static_schedule_does_not_read_the_nic() -> None:
    nic = Nic(0.25)
    assert _posted(nic, "static") == [8, 8]
    assert nic.reads == 0


def _hints(collective: str, ranks: int, channels: int, nics: int) -> list[int]:
    """The start rates rank 0 declares (the proactive start) for its first flows."""
    ips = [[f"10.0.{c + 1}.{r + 1}" for c in range(nics)] for r in range(ranks)]
    core = TransportCore(TransportConfig(local_ip=ips[0][0], mtu=4096), seed=1)
    spec: dict[str, Any] = {
        "kind": "collective",
        "collective": collective,
        "hosts": [{"name": f"h{r + 1}", "ip": ips[r][0]} for r in range(ranks)],
        "nic_ips": ips,
        "channels": channels,
        "size": 1 << 20,
        "chunk": 16 << 10,
        "start_share_bps": LINE,
    }
    CollectiveJob(core, spec, 0)
    return sorted(bps for _, bps in core.rate_hints)


def test_a_collective_declares_each_flow_it_starts_its_share_of_the_nic() -> None:
    """An all-to-all starts towards all its n - 1 peers at once: a seventh of the NIC each at
    8 ranks; a ring starts towards its next rank alone: the whole NIC, or a half per channel
    when two channels share one NIC; two rails give each channel a NIC of its own."""
    assert _hints("alltoall", 8, 1, 1) == [round(LINE / 7)] * 7
    assert _hints("allreduce", 8, 1, 1) == [LINE]
    assert _hints("allreduce", 8, 2, 1) == [LINE // 2] * 2
    assert _hints("allreduce", 8, 2, 2) == [LINE] * 2
    assert _hints("alltoall", 4, 2, 2) == [round(LINE / 3)] * 6
