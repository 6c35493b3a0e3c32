"""ECN marking in the P4 switch: CE only above the threshold, a RED-like ramp between Kmin and
Kmax, never on packets that are not ECN-capable, marks counted per port."""

from __future__ import annotations

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from tests.p4 import program as P
from tests.p4.fixtures import FabricFactory, fabric  # noqa: F401
from tests.p4.harness import Fabric, Topology

ONE = Topology(1, hosts={"a": (0, 1), "b": (0, 2)})
FRAME = 200  # bytes per test frame
ECT0, ECT1, NOT_ECT, CE = 0b10, 0b01, 0b00, 0b11


def frame(ecn: int, seq: int) -> bytes:
    pkt = (
        Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:a0")
        / IP(src="10.0.1.1", dst="10.0.2.2", tos=ecn, id=seq)
        / UDP(sport=1000, dport=4791, chksum=0)
    )
    return bytes(pkt / Raw(b"\x00" * (FRAME - len(pkt))))


def program(fab: Fabric) -> None:
    fab.write(0, P.switch_config(node_id=1, qdepth_unit=fab.qdepth_unit_for(FRAME)))
    fab.write(0, P.host_route("10.0.2.0/24", 1, port=2, smac=P.mac(0xA0), dmac=P.mac(2)))
    # slow enough that a burst queues up even behind bmv2's software ingress
    fab.set_port_rate(0, 2, pps=1000 if fab.virtual_time else 100, frame_bytes=FRAME)


def burst(fab: Fabric, n: int, ecn: int) -> list[int]:
    """Send n frames at once; the ECN field of each as it left, in sending order."""
    for k in range(n):
        fab.send("a", frame(ecn, k))
    fab.settle()
    out = sorted(fab.take("b"), key=lambda f: IP(f[14:]).id)
    assert len(out) == n
    return [f[15] & 0b11 for f in out]


def test_ce_only_above_the_threshold(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(ONE)
    program(fab)
    k = 5 * FRAME + FRAME // 2  # between 5 and 6 frames queued ahead
    fab.write(0, P.ecn_thresholds(2, kmin=k, kmax=k))
    n = 12 if fab.virtual_time else 16  # (a real queue builds a little slower)
    for ecn in (ECT0, ECT1):
        marks = burst(fab, n, ecn)
        if fab.virtual_time:
            # frame i found i frames (i * FRAME bytes) ahead of it
            assert marks == [CE if i * FRAME > k else ecn for i in range(n)], marks
        else:
            assert marks[0] == ecn and marks[-1] == CE, marks
            first_ce = marks.index(CE)
            assert all(m == CE for m in marks[first_ce:]), marks
    assert burst(fab, n, NOT_ECT) == [NOT_ECT] * n
    marked = 2 * sum(1 for i in range(n) if i * FRAME > k) if fab.virtual_time else None
    got = fab.counter(0, "ecn_marks", 2)[0]
    assert got == marked if marked is not None else got > 0


def test_no_marks_without_thresholds(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(ONE)
    program(fab)
    assert burst(fab, 12, ECT0) == [ECT0] * 12
    assert fab.counter(0, "ecn_marks", 2)[0] == 0


def test_red_ramp_between_kmin_and_kmax(fabric: FabricFactory) -> None:  # noqa: F811
    fab = fabric(ONE)
    program(fab)
    # On a real clock the depth each frame finds is only roughly its index: a shorter ramp,
    # well inside the burst, and only the ramp's ends are certain.
    kmin, kmax = (4 * FRAME, 16 * FRAME) if fab.virtual_time else (2 * FRAME, 8 * FRAME)
    fab.write(0, P.ecn_thresholds(2, kmin=kmin, kmax=kmax, pmax=1.0))
    n, rounds = (20, 25) if fab.virtual_time else (20, 10)
    hits = [0] * n
    for _ in range(rounds):
        for i, m in enumerate(burst(fab, n, ECT0)):
            hits[i] += m == CE
    if not fab.virtual_time:
        assert hits[0] == 0 and hits[-1] == rounds, hits
        assert any(0 < h < rounds for h in hits), hits
        return
    depth = [i * FRAME for i in range(n)]
    below = [h for h, q in zip(hits, depth, strict=True) if q <= kmin]
    above = [h for h, q in zip(hits, depth, strict=True) if q > kmax]
    ramp = [
        (h, (q - kmin) / (kmax - kmin))
        for h, q in zip(hits, depth, strict=True)
        if kmin < q <= kmax
    ]
    assert all(h == 0 for h in below), hits
    assert all(h == rounds for h in above), hits
    observed = sum(h for h, _ in ramp) / (rounds * len(ramp))
    expected = sum(p for _, p in ramp) / len(ramp)
    assert abs(observed - expected) < 0.1, (observed, expected, hits)
    # and it rises: the upper half of the ramp marks more than the lower half
    half = len(ramp) // 2
    assert sum(h for h, _ in ramp[half:]) > sum(h for h, _ in ramp[:half]), hits
