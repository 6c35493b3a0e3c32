"""PFC pauses at the NIC: XDP (ebpf/lib/pfc.h) against the Python reference
(controller/nic/pfc.py), frame by frame (BPF_PROG_TEST_RUN, root).

XDP stamps a pause with bpf_ktime_get_ns(), which the test cannot pass in: it reads XDP's
time back from the state it wrote (a pause's start is `since_ns`; a resume's time is what
it added to `paused_ns`) and gives the reference the same time, then every field must be
equal. MAC Control frames are consumed (XDP_DROP), everything else passes on."""

from __future__ import annotations

import ctypes
import os
import time

import pytest

from controller.nic.bpf.syscalls import prog_test_run
from controller.nic.pfc import PfcNic, PfcState, PinnedPfc
from controller.wire.pfc import pause_ns, pfc_frame
from testbed.emu.nicrig import standalone_nic
from testbed.traffic.transport import Transport, TransportConfig

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (eBPF programs, bpffs)"),
]

XDP_DROP, XDP_PASS = 1, 2
LINE = 19_531_250
MAC = bytes.fromhex("02580001000a")


def state(nic, prio: int) -> PfcState:  # type: ignore[no-untyped-def]
    v = nic.table("xm_pfc")[ctypes.c_uint(prio)]
    return PfcState(
        int(v.pause_until_ns),
        int(v.since_ns),
        int(v.paused_ns),
        int(v.pauses),
        int(v.resumes),
        bool(v.active),
    )


def test_pause_and_resume_match_the_reference() -> None:
    ref = PfcNic()
    with standalone_nic(LINE, law="dcqcn") as nic:
        before = nic.counter_values()
        # pause priority 0 for the longest time, priority 3 for 100 quanta
        frame = pfc_frame(MAC, {0: 0xFFFF, 3: 100})
        assert prog_test_run(nic.fd("xdp"), frame).retval == XDP_DROP
        x0, x3 = state(nic, 0), state(nic, 3)
        now = x0.since_ns
        assert ref.on_frame(frame, LINE, now) == ["PFC_PAUSE", "PFC_PAUSE"]
        assert x0 == ref.prio[0] and x3 == ref.prio[3]
        assert x0.pause_until_ns - now == pause_ns(0xFFFF, LINE) == 1_717_960_704
        assert state(nic, 1) == PfcState()
        # a second pause of priority 0 before the first ends: the time so far is closed
        frame = pfc_frame(MAC, {0: 50})
        assert prog_test_run(nic.fd("xdp"), frame).retval == XDP_DROP
        x0 = state(nic, 0)
        assert ref.on_frame(frame, LINE, x0.since_ns) == ["PFC_PAUSE"]
        assert x0 == ref.prio[0]
        # resume (time 0): XDP's time is what it added to the paused time
        frame = pfc_frame(MAC, {0: 0})
        held = x0.paused_ns
        assert prog_test_run(nic.fd("xdp"), frame).retval == XDP_DROP
        x0 = state(nic, 0)
        # (well within the 50 quanta: 1.3 ms; since_ns stays the pause's start)
        resume_at = x0.since_ns + (x0.paused_ns - held)
        assert resume_at < ref.prio[0].pause_until_ns
        assert ref.on_frame(frame, LINE, resume_at) == ["PFC_RESUME"]
        assert x0 == ref.prio[0]
        assert not x0.active and x0.resumes == 1 and x0.pauses == 2
        assert x0.pause_until_ns == resume_at
        after = nic.counter_values()
        assert after["xdp_pfc_pause"] - before["xdp_pfc_pause"] == 3
        assert after["xdp_pfc_resume"] - before["xdp_pfc_resume"] == 1


def test_the_pinned_map_read_without_bcc_is_what_xdp_wrote() -> None:
    """PinnedPfc (bpf(2) and the header's struct layout, no bcc) is how the emulation's
    transport learns that its switch paused it: the same state as bcc's view, field by field,
    and a hold until the pause's end, none after a resume."""
    with standalone_nic(LINE, law="dcqcn") as nic:
        pinned = PinnedPfc(nic.pin_dir / "xm_pfc")
        try:
            assert pinned.state(0) == PfcState() and pinned.hold_until_ns(1) == 0
            assert (
                prog_test_run(nic.fd("xdp"), pfc_frame(MAC, {0: 0xFFFF, 5: 7})).retval == XDP_DROP
            )
            for prio in range(8):
                assert pinned.state(prio) == state(nic, prio)
            x0 = state(nic, 0)
            assert pinned.hold_until_ns(x0.since_ns + 1) == x0.pause_until_ns
            assert pinned.hold_until_ns(x0.pause_until_ns) == 0  # the pause is over
            prog_test_run(nic.fd("xdp"), pfc_frame(MAC, {0: 0}))
            assert pinned.state(0) == state(nic, 0) and pinned.hold_until_ns(x0.since_ns) == 0
        finally:
            pinned.close()


def test_the_native_loop_holds_a_paused_nic_from_the_pinned_map() -> None:
    """The emulation's native loop (Transport.run_steps, in C) reads the pinned xm_pfc itself,
    as `hold` (PinnedPfc.hold_until_ns) does: nothing leaves while the switch's pause holds,
    the data goes once it ends, and the hold is counted as the Python steps count it."""
    quanta = 12_000  # about 0.31 s at LINE
    with standalone_nic(LINE, law="dcqcn") as nic:
        pinned = PinnedPfc(nic.pin_dir / "xm_pfc")
        cfg = TransportConfig(local_ip="127.0.0.1", mtu=1024)
        try:
            with Transport(cfg, pinned.hold_until_ns, hold_map=pinned.native_view()) as t:
                assert t.native_loop()
                qp = t.create_qp(7, "127.0.0.2", 7)  # nobody answers: sent is what counts
                assert prog_test_run(nic.fd("xdp"), pfc_frame(MAC, {0: quanta})).retval == XDP_DROP
                until = pinned.hold_until_ns(time.monotonic_ns()) / 1e9
                assert until - time.monotonic() > 0.2
                qp.post_send(bytes(8192), time.monotonic())
                while time.monotonic() < until - 0.05:
                    t.run_steps(until - 0.05)
                assert qp.counters.tx_packets == 0 and t.holds == 1
                while time.monotonic() < until + 0.05:
                    t.run_steps(until + 0.05)
                assert qp.counters.tx_packets >= 8
                held = pause_ns(quanta, LINE) / 1e9
                assert 0.6 * held <= t.counters()["pfc_held_us"] / 1e6 <= held + 0.05
        finally:
            pinned.close()


@pytest.mark.parametrize(
    "frame",
    [
        bytes.fromhex("0180c200000102580001000a88080001ffff") + bytes(42),  # 802.3x
        bytes.fromhex("0180c200000102580001000a880801010101") + bytes(42),
        bytes.fromhex("0180c200000102580001000a88080101"),  # short
    ],
)
def test_other_mac_control_is_consumed_and_counted(frame: bytes) -> None:
    with standalone_nic(LINE, law="dcqcn") as nic:
        before = nic.counter_values()["xdp_pfc_malformed"]
        assert prog_test_run(nic.fd("xdp"), frame).retval == XDP_DROP
        assert nic.counter_values()["xdp_pfc_malformed"] == before + 1
        assert state(nic, 0) == PfcState()
        assert PfcNic().on_frame(frame, LINE, 1) == ["PFC_MALFORMED"]


def test_other_frames_pass() -> None:
    with standalone_nic(LINE, law="dcqcn") as nic:
        arp = bytes.fromhex("ffffffffffff02580001000a0806") + bytes(46)
        assert prog_test_run(nic.fd("xdp"), arp).retval == XDP_PASS
        assert PfcNic().on_frame(arp, LINE, 1) is None
