"""The traffic manager's shared buffer: a dynamic threshold per queue (a queue admits a packet
while it holds at most alpha times the free buffer), PFC's dynamic XOFF on the shared pool,
the P4 program's 19-bit queue depth saturating (not wrapping) past 512 KiB, and the switch
model's two buffers as `--buffer` chooses them."""

from __future__ import annotations

import pytest

from testbed.model import BUFFERS, DEFAULT_MODEL, Scaling, model_with_buffer
from testbed.switch.pfc import PfcConfig, pfc_thresholds
from testbed.switch.traffic_manager import Clock, SharedBuffer, TrafficManager

FRAME = 1000
RATE = 1e9


def tm(buffer: SharedBuffer | None) -> TrafficManager:
    t = TrafficManager(Clock(virtual=True), nb_queues=1, depth_pkts=8)
    t.set_rate(None, bps=RATE)
    t.set_buffer(buffer)
    return t


def fill(t: TrafficManager, port: int, n: int) -> int:
    """Offer `n` frames to `port` at once: how many were admitted."""
    return sum(t.enqueue(port, 0, i, FRAME, 0) is not None for i in range(n))


def test_one_queue_takes_alpha_over_one_plus_alpha_of_the_buffer() -> None:
    # 30 frames of buffer, alpha 1: the (k+1)-th frame joins while k + 1 <= 30 - k: 15
    t = tm(SharedBuffer(30 * FRAME, 1.0))
    assert fill(t, 1, 100) == 15
    assert t.buffered_bytes == 15 * FRAME and t.ports[1].dropped == 85
    # alpha 2: q <= 2 (B - q): 20 frames
    assert fill(tm(SharedBuffer(30 * FRAME, 2.0)), 1, 100) == 20
    # the static depth (8 packets) no longer binds with a shared buffer; it does without
    assert fill(tm(None), 1, 100) == 8


def test_queues_share_what_is_free_and_get_it_back_as_others_drain() -> None:
    t = tm(SharedBuffer(30 * FRAME, 1.0))
    assert fill(t, 1, 100) == 15
    # a second queue admits its (k+1)-th frame while k + 1 <= 30 - 15 - k: 8 frames
    assert fill(t, 2, 100) == 8
    assert t.buffered_bytes == 23 * FRAME
    clock = t.clock
    while t.buffered_bytes:
        nxt = t.next_departure_ns()
        assert nxt is not None
        clock.advance_to(nxt)
        t.dequeue_ready(nxt)
    assert t.buffered_bytes == 0  # every byte booked in is booked out
    assert fill(t, 2, 100) == 15  # the whole buffer is free again


def test_a_down_port_gives_its_buffer_back() -> None:
    t = tm(SharedBuffer(30 * FRAME, 1.0))
    fill(t, 1, 100)
    t.set_fault(1, down=True)
    assert t.buffered_bytes == 0 and fill(t, 2, 100) == 15


def test_lossless_packets_are_held_by_pfc_not_by_the_threshold() -> None:
    t = tm(SharedBuffer(30 * FRAME, 1.0))
    t.set_pfc(PfcConfig(10**6, 10**6 - 1, 0, link_bps=RATE))  # pauses, never: no threshold
    assert fill(t, 1, 100) == 30  # priority 0 is lossless: only the buffer's size binds


def test_dynamic_xoff_is_a_share_of_the_free_pool() -> None:
    """HPCC's simulator's rule: a (port, priority) pauses when its bytes above its reserve
    reach alpha x (pool - every (port, priority)'s bytes above its reserve)."""
    cfg = pfc_thresholds(RATE, 0, FRAME, buffer_bytes=100 * FRAME, ports=4, alpha=0.5)
    headroom = cfg.headroom_bytes
    assert cfg.reserve_bytes == FRAME
    assert cfg.pool_bytes == 100 * FRAME - 4 * (headroom + FRAME)
    assert cfg.xoff_bytes == cfg.pool_bytes // 2  # an empty buffer's threshold
    t = TrafficManager(Clock(virtual=True), nb_queues=1)
    t.set_rate(None, bps=RATE)
    t.set_buffer(SharedBuffer(100 * FRAME))
    t.set_pfc(cfg)
    pool = cfg.pool_bytes
    # port 1 alone: pauses when its shared bytes s reach 0.5 (pool - s), s = pool / 3
    n = 1
    while not (1 in t.ports and t.ports[1].pfc.xoff_sent):
        t.enqueue(9, 0, n, FRAME, 0, ingress_port=1)
        n += 1
    shared = t.ports[1].pfc.state(0).ingress_bytes - FRAME
    before = shared - FRAME  # the last packet crossed the threshold
    assert shared >= 0.5 * (pool - shared) and before < 0.5 * (pool - before)
    # a second port, with port 1's bytes in the pool, pauses sooner
    m = 1
    while not (2 in t.ports and t.ports[2].pfc.xoff_sent):
        t.enqueue(8, 0, m, FRAME, 0, ingress_port=2)
        m += 1
    assert m < n


def test_pfc_config_refuses_a_dynamic_threshold_without_a_pool() -> None:
    with pytest.raises(ValueError, match="pool"):
        PfcConfig(1000, 0, 0, alpha=0.125)
    with pytest.raises(ValueError, match="alpha"):
        SharedBuffer(1000, 0.0)
    with pytest.raises(ValueError, match="bytes"):
        SharedBuffer(0)


def test_the_model_gives_a_switch_its_ports_share_of_the_part() -> None:
    assert BUFFERS == ("shared", "static") and DEFAULT_MODEL.buffer in BUFFERS
    shared = model_with_buffer("shared")
    assert shared.buffer_per_port() == 1_000_000  # 128 MB over 128 ports
    assert shared.pfc_buffer(6) == (6_000_000, 0.125)  # PFC's share of the pool: HPCC's 1/8
    assert model_with_buffer("static").pfc_buffer(6) == (500_000, 0.0)  # one queue's depth
    assert "buffer shared, 1000 KB per port" in Scaling(model=shared).describe()
    with pytest.raises(ValueError, match="buffer"):
        model_with_buffer("deep")


def probe_depths(unit: str) -> list[int]:
    """enq_qdepth as tests/p4/queue_probe.p4 sees it for 600 frames of 1000 B queued at once
    behind a slow port, in a 4 MB shared buffer."""
    import struct
    from pathlib import Path

    from testbed.switch.v1model import V1Switch

    json_path = Path(__file__).parent / "p4" / "build" / "queue_probe.json"
    if not json_path.exists():
        pytest.skip(f"{json_path} not built")
    sw = V1Switch(Clock(virtual=True), qdepth_unit=unit)
    sw.load(json_path.read_bytes())
    sw.tm.set_rate(2, bps=8e6)
    sw.tm.set_buffer(SharedBuffer(4_000_000))
    depths: list[int] = []
    sw.transmit = lambda port, data: depths.append(struct.unpack("!I", data[14:18])[0])
    frame = bytes(12) + b"\x88\xb5" + bytes(28) + bytes(958)  # 1000 bytes (test_switch_queueing)
    for _ in range(600):
        sw.receive(1, frame)
    sw.clock.advance(700_000_000)
    sw.service()
    assert len(depths) == 600
    return depths


def test_the_programs_queue_depth_saturates_past_19_bits_of_bytes() -> None:
    """A shared buffer's queue may pass 512 KiB; in bytes the P4 program's 19-bit enq_qdepth
    then reads the largest value it holds (wrapped, a deep queue would read as nearly
    empty); in cells of 80 B (what the model's shared buffer runs with) it reads them all."""
    depths = probe_depths("bytes")
    assert depths[524] == 524_000 and depths[525:] == [(1 << 19) - 1] * 75
    cells = probe_depths("cells")
    assert cells[:3] == [0, 13, 25]  # 1000 B in 80 B cells, rounded up
    assert cells[599] == 599_000 // 80 + 1
