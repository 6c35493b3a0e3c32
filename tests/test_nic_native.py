"""The twin's native NIC (ebpf/tc_egress.c and ebpf/xdp_ingress.c compiled for the process,
testbed/sim/nic_native.py) against their Python references (testbed/sim/nic_programs.py over
controller/nic/ratelaw/), frame by frame on generated traffic (tests/nic_differential.py):
the same rates and per-flow law states under every law, the same frames and flow counters
out of tc. No root: the programs run in this process, not in the kernel
(tests/test_nic_ratelaw.py runs XDP in the kernel, as root). `make fuzz` runs many more seeds,
also under AddressSanitizer and UBSan (tests/fuzz/nic.py)."""

from __future__ import annotations

import random

import pytest

from controller.nic.ratelaw import CcParams, Law
from controller.nic.ratelaw.params import DCQCN_CLAMP_AFTER_TIMER
from controller.nic.ratelaw.reference import parse_feedback
from testbed.sim.nic_native import NativeNic, library
from testbed.switch.native.build import BuildError, compiler
from tests.nic_differential import LINE, RTT_NS, drive_laws, drive_tc, params_for
from tests.nic_fuzz_frames import fuzz_frames


def _native_or_skip() -> None:
    """Skips where there is no C compiler (the twin then runs the reference and says so); a
    program that does not build where one is fails."""
    try:
        compiler()
    except BuildError as exc:
        pytest.skip(str(exc))
    library()


@pytest.mark.parametrize("law", [law for law in Law if law != Law.NONE], ids=lambda x: x.name)
def test_native_nic_equals_the_reference_frame_by_frame(law: Law) -> None:
    _native_or_skip()
    changed = sum(drive_laws(law, seed) for seed in range(3))
    assert changed > 50  # the laws moved: a sequence that changes no rate proves nothing


def test_native_dcqcn_equals_the_reference_under_every_target_clamp() -> None:
    """The seeds whose DCQCN parameters clamp the target after a timer increase only, and
    never (the frame-by-frame test's seeds draw the others)."""
    _native_or_skip()
    seeds = (3, 5)
    clamps = {params_for(Law.DCQCN, random.Random(s)).dcqcn.clamp_target for s in seeds}
    assert clamps == {DCQCN_CLAMP_AFTER_TIMER, 0}
    assert sum(drive_laws(Law.DCQCN, s) for s in seeds) > 30


def test_a_frame_that_is_not_feedback_changes_nothing() -> None:
    _native_or_skip()
    prm = CcParams.defaults(Law.TITA, LINE, RTT_NS)
    nat = NativeNic(LINE, prm)
    for frame in fuzz_frames(200, 9):
        fb = parse_feedback(frame)
        got = nat.on_frame(frame, now_ns=1000, tx_bytes=0, snd_nxt_psn=1)
        if fb is None:
            assert got is None
    nat.reset()
    assert len(nat) == 0


@pytest.mark.parametrize("law", [Law.TITA, Law.TIMELY, Law.DCQCN], ids=lambda x: x.name)
def test_native_tc_egress_equals_the_reference(law: Law) -> None:
    """tc egress: the frames it sends (INT inserted or not) and each flow's counters and RTT
    probe, native against the reference, frame by frame, with XDP's feedback between them."""
    _native_or_skip()
    assert drive_tc(law, int(law)) > 100  # the INT source ran
