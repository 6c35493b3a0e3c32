"""PFC (802.1Qbb) in the built-in switch's traffic manager: the pause frame's bytes, XOFF/XON
per ingress port and priority, egress ports that honour received pauses, the paused-time
counters and SONiC's PFC watchdog (testbed/switch/pfc.py)."""

from __future__ import annotations

import pytest

from controller.wire.pfc import (
    PfcPause,
    decode_pfc,
    is_mac_control,
    pause_ns,
    pfc_frame,
)
from testbed.switch.pfc import PfcConfig, WatchdogConfig, pfc_headroom, pfc_thresholds
from testbed.switch.traffic_manager import Clock, TrafficManager

RATE = 1e9  # 1 Gb/s: one byte is 8 ns, one quantum 512 ns
FRAME = 1000


def test_pause_frame_bytes() -> None:
    # scapy-free golden bytes, built by hand from 802.1Qbb Annex N: DA 01:80:C2:00:00:01,
    # SA, EtherType 0x8808, opcode 0x0101, class-enable vector 0x0009 (priorities 0 and 3),
    # times: prio 0 0xffff, prio 3 0x0010, the rest 0; zero pad to 60 bytes
    src = bytes.fromhex("02aabbccddee")
    frame = pfc_frame(src, {0: 0xFFFF, 3: 0x10})
    want = (
        "0180c2000001"
        + "02aabbccddee"
        + "8808"
        + "0101"
        + "0009"
        + "ffff"
        + "0000"
        + "0000"
        + "0010"
        + "0000" * 4
        + "00" * 26
    )
    assert frame.hex() == want
    assert len(frame) == 60
    assert is_mac_control(frame)
    p = decode_pfc(frame)
    assert p == PfcPause(0x09, (0xFFFF, 0, 0, 0x10, 0, 0, 0, 0))
    assert p.priorities() == [0, 3]
    assert pause_ns(0xFFFF, 1e9) == 0xFFFF * 512


@pytest.mark.parametrize(
    "frame",
    [
        bytes.fromhex("0180c200000102aabbccddee88080001ffff"),  # 802.3x PAUSE
        bytes.fromhex("0180c200000102aabbccddee880801010100") + bytes(16),
        bytes.fromhex("0180c200000102aabbccddee88080101"),  # short
        bytes.fromhex("0180c200000102aabbccddee0800") + bytes(46),
    ],
)
def test_bad_pause_frames_are_refused(frame: bytes) -> None:
    with pytest.raises(ValueError):
        decode_pfc(frame)


def test_thresholds_keep_every_port_share_within_the_buffer() -> None:
    cfg = pfc_thresholds(RATE, delay_ns=1000, max_frame=FRAME, buffer_bytes=60_000, ports=6)
    # headroom: 2 us of a 1 Gb/s link (250 B) + two frames + the pause frame
    assert cfg.headroom_bytes == pfc_headroom(RATE, 1000, FRAME) == 250 + 2000 + 60
    assert cfg.xoff_bytes + cfg.headroom_bytes <= 60_000 // 6
    assert cfg.xon_bytes == cfg.xoff_bytes - 2 * FRAME
    with pytest.raises(ValueError, match="no room for PFC"):
        pfc_thresholds(RATE, 1000, FRAME, buffer_bytes=12_000, ports=6)


def tm_with_pfc(
    xoff: int = 3 * FRAME,
    xon: int = FRAME,
    quanta: int = 100,
    watchdog: WatchdogConfig | None = None,
):
    clock = Clock(virtual=True)
    tm = TrafficManager(clock, nb_queues=1, depth_pkts=1000)
    tm.set_rate(None, bps=RATE)
    sent: list[tuple[int, int, PfcPause]] = []
    tm.send_control = lambda port, frame: sent.append((clock.now_ns(), port, decode_pfc(frame)))
    tm.set_pfc(PfcConfig(xoff, xon, 0, quanta=quanta, link_bps=RATE), watchdog)
    return clock, tm, sent


def drain(clock: Clock, tm: TrafficManager, until_ns: int) -> list[tuple[int, int]]:
    """Service the TM as a driver does, up to `until_ns`: (departure time, port) per packet."""
    out = []
    while True:
        t = tm.next_departure_ns()
        if t is None or t > until_ns:
            break
        clock.advance_to(t)
        tm.pfc_tick(t)
        for port, _prio, _pkt, _enq, _left, start in tm.dequeue_ready(t):
            out.append((start, port))
    clock.advance_to(until_ns)
    return out


def test_xoff_at_threshold_and_xon_when_drained() -> None:
    clock, tm, sent = tm_with_pfc()
    for i in range(2):
        assert tm.enqueue(9, 0, f"p{i}", FRAME, 0, ingress_port=1) is not None
    assert sent == []  # 2 KB from port 1: under XOFF
    tm.enqueue(9, 0, "p2", FRAME, 0, ingress_port=1)
    assert [(port, p.quanta[0]) for _, port, p in sent] == [(1, 100)]  # XOFF to the upstream
    tm.enqueue(9, 0, "x", FRAME, 0, ingress_port=2)  # another port's bytes are its own
    assert len(sent) == 1
    assert tm.ports[1].pfc.xoff_sent == 1
    drain(clock, tm, 10_000)
    # XON when port 1's bytes fell to 1 KB: its second packet left at 8 us
    xon = [(t, port) for t, port, p in sent if p.quanta[0] == 0]
    assert xon == [(8000, 1)]
    assert tm.ports[1].pfc.xon_sent == 1


def test_xoff_is_refreshed_while_above_xon() -> None:
    clock, tm, sent = tm_with_pfc(quanta=10)  # 5.12 us: refreshed every 2.56 us
    tm.set_rate(9, bps=1e8)  # the egress drains slowly: 80 us per packet
    for i in range(6):
        tm.enqueue(9, 0, i, FRAME, 0, ingress_port=1)
    drain(clock, tm, 20_000)
    xoffs = [t for t, _, p in sent if p.quanta[0]]
    assert xoffs[:3] == [0, 2560, 5120]
    assert len(xoffs) == 8  # 0 .. 17,920 ns every 2,560 ns


def test_egress_holds_a_paused_priority_and_counts_paused_time() -> None:
    clock, tm, _ = tm_with_pfc()
    tm.enqueue(5, 0, "a", FRAME, 0)
    assert tm.receive_pause(5, PfcPause(1, (100, 0, 0, 0, 0, 0, 0, 0)), 0)
    assert tm.next_departure_ns() == 100 * 512  # the pause's end
    assert tm.dequeue_ready(1000) == []
    assert drain(clock, tm, 10**6) == [(51_200, 5)]
    pc = tm.ports[5].pfc
    assert pc.pauses_received == 1
    assert pc.paused_ns(10**6) == 51_200


def test_resume_releases_before_the_pause_ends() -> None:
    clock, tm, _ = tm_with_pfc()
    tm.enqueue(5, 0, "a", FRAME, 0)
    tm.receive_pause(5, PfcPause(1, (0xFFFF, 0, 0, 0, 0, 0, 0, 0)), 0)
    clock.advance_to(7000)
    tm.receive_pause(5, PfcPause(1, (0,) * 8), 7000)  # XON
    assert drain(clock, tm, 10**6) == [(7000, 5)]
    assert tm.ports[5].pfc.paused_ns(10**6) == 7000
    assert tm.ports[5].pfc.resumes_received == 1


def test_a_pause_on_a_lossy_priority_or_with_pfc_off_is_not_honoured() -> None:
    clock, tm, _ = tm_with_pfc()
    tm2 = TrafficManager(Clock(virtual=True), nb_queues=2)
    assert not tm2.receive_pause(1, PfcPause(1, (100,) + (0,) * 7), 0)  # PFC off
    tm.enqueue(5, 0, "a", FRAME, 0)
    tm.receive_pause(5, PfcPause(0x02, (0, 100, 0, 0, 0, 0, 0, 0)), 0)  # priority 1
    assert drain(clock, tm, 10**6) == [(0, 5)]


def test_watchdog_detects_a_storm_drops_and_restores() -> None:
    wd = WatchdogConfig(poll_ns=10_000, detect_polls=3, restore_polls=2, action="drop")
    clock, tm, sent = tm_with_pfc(xoff=3 * FRAME, quanta=1000, watchdog=wd)
    storm = PfcPause(1, (0xFFFF,) + (0,) * 7)
    for i in range(4):
        tm.enqueue(5, 0, i, FRAME, 0, ingress_port=1)  # held: the upstream gets XOFF
    assert [p.quanta[0] for _, _, p in sent] == [1000]
    t = 0
    while t <= 60_000:  # the downstream keeps pausing port 5 every 5 us
        tm.receive_pause(5, storm, t)
        drain(clock, tm, t + 5000)
        t += 5000
    pc = tm.ports[5].pfc
    # polls at 10, 20, 30 us see a paused, non-empty queue that sent nothing: a storm at 30
    assert pc.storms == 1
    assert pc.watchdog_drops == 4  # the queue's packets, dropped
    assert [p.quanta[0] for _, _, p in sent] == [1000, 0]  # the upstream released
    assert tm.enqueue(5, 0, "late", FRAME, t, ingress_port=1) is None
    assert tm.last_drop == "pfc_watchdog"
    assert pc.paused_ns(t) == 30_000  # pauses are ignored once the storm is found
    # the storm stops: two quiet polls restore the queue
    drain(clock, tm, t + 40_000)
    assert pc.restored == 1
    assert tm.enqueue(5, 0, "after", FRAME, t + 40_000, ingress_port=1) is not None
    assert [d[2] for d in tm.dequeue_ready(t + 40_000)] == ["after"]  # it sends again


def test_watchdog_leaves_a_queue_that_drains_while_paused_at_times() -> None:
    wd = WatchdogConfig(poll_ns=10_000, detect_polls=2, restore_polls=2)
    clock, tm, _ = tm_with_pfc(watchdog=wd)
    tm.set_rate(5, bps=1e8)
    for i in range(20):
        tm.enqueue(5, 0, i, FRAME, 0)
    for t in range(0, 2_000_000, 20_000):  # short pauses: 10.24 us of every 20
        tm.receive_pause(5, PfcPause(1, (2,) + (0,) * 7), t)
        drain(clock, tm, t + 20_000)
    assert tm.ports[5].pfc.storms == 0
    assert tm.ports[5].dequeued == 20  # 80 us per packet: all sent within 2 ms
    assert tm.ports[5].pfc.paused_ns(2_000_000) == 100 * 10_240
