"""The native transport core (testbed/traffic/transport_native.c) against its reference
(testbed/traffic/transport_core.py): the same generated sequences of posts, packets (lost,
duplicated, reordered, CE-marked, given INT, corrupted, cut short, random) and timer expiries
through both, and every packet, counter, drop, deadline, delivered message and completion
identical, step by step."""

from __future__ import annotations

import random
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from controller.wire.ipv4 import with_checksum
from testbed.switch.native.build import BuildError, compiler
from testbed.traffic.transport_core import TransportConfig, TransportCore
from testbed.traffic.transport_native import (
    DROP_NAMES,
    NativeTransportCore,
    Unsupported,
    library,
    make_core,
)
from tests.transport_differential import CONFIGS, drive, first_difference
from tests.transport_differential import A as TA
from tests.transport_differential import B as TB

A = "10.0.1.1"

try:
    compiler()
    NO_COMPILER = ""
except BuildError as exc:  # pragma: no cover - every machine of this project has gcc
    NO_COMPILER = str(exc)
# without a compiler the reference runs (make_core says why); with one, the C must build
needs_native = pytest.mark.skipif(bool(NO_COMPILER), reason=NO_COMPILER)


@needs_native
def test_the_native_core_builds() -> None:
    library()


def test_drop_reasons_are_the_references() -> None:
    """Every reason the C counts is one the reference counts, and the reference counts none
    the C lacks but selective repeat's (which the C does not run)."""
    text = Path("testbed/traffic/transport_core.py").read_text()
    reference = set(re.findall(r'drops\["([a-z_]+)"\]', text))
    assert set(DROP_NAMES) <= reference
    assert reference - set(DROP_NAMES) == {"sr_out_of_window"}
    c = Path("testbed/traffic/transport_native.c").read_text()
    enum = re.search(r"enum \{(.*?)\};", c, re.S)
    assert enum is not None
    names = [n.strip()[2:].lower() for n in enum.group(1).split(",") if n.strip()]
    assert tuple(names[:-1]) == DROP_NAMES and names[-1] == "n"


@needs_native
def test_unsupported_configurations_run_the_reference() -> None:
    sr = TransportConfig(local_ip=A, retransmit="sr")
    with pytest.raises(Unsupported, match="go-back-N"):
        NativeTransportCore(sr, 1)
    core, why = make_core(sr, 1, "native")
    assert type(core) is TransportCore and "go-back-N" in why
    core, why = make_core(TransportConfig(local_ip=A), 1, "native")
    assert type(core) is NativeTransportCore and why == ""
    assert core.counters()["transport"] == "native"
    assert make_core(sr, 1, "reference")[0].counters()["transport"] == "reference"
    with pytest.raises(ValueError, match="one of"):
        make_core(TransportConfig(local_ip=A), 1, "fast")


@needs_native
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"mtu{c['mtu']}-w{c['window']}")
@pytest.mark.parametrize("seed", range(6))
def test_native_equals_reference(cfg: dict[str, Any], seed: int) -> None:
    ref = drive(False, seed, 1500, **cfg)
    nat = drive(True, seed, 1500, **cfg)
    assert ref == nat, first_difference(ref, nat)
    # the sequences did what they are for: messages through loss, drops of every kind seen
    kinds = {e[0] for e in ref}
    assert {"post", "data", "fb", "msg"} <= kinds
    assert ("report" in kinds) == ("report_to" in cfg)


@needs_native
def test_batched_receive_is_the_receive_loop() -> None:
    """The emulation's batched read (recvmmsg in C) gives what `receive` per packet gives:
    the same packets in order, each at the same time, at most `budget` a call."""
    log = drive(False, 3, 800, **CONFIGS[1])
    pkts = [e[2] for e in log if e[0] == "data" and e[1] == 5]  # a's to b's QP 6
    assert len(pkts) > 40

    def core() -> NativeTransportCore:
        c = NativeTransportCore(TransportConfig(local_ip=TB, **CONFIGS[1]), seed=2)
        c.create_qp(6, TA, 5)
        return c

    one, batched = core(), core()
    for p in pkts:
        one.receive(p, 1.0)
    rx, tx = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with rx, tx:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)  # all of them, unread
        for p in pkts:
            tx.send(p)
        got = [batched.receive_from(rx.fileno(), 7, 1.0) for _ in range(-(-len(pkts) // 7) + 1)]
    assert got[:-1] == [7] * (len(pkts) // 7) + ([len(pkts) % 7] if len(pkts) % 7 else [])
    assert got[-1] == 0  # the socket empty: nothing, no error
    assert one.counters() == batched.counters() and one.drops == batched.drops
    assert [o.packet for o in one.feedback] == [o.packet for o in batched.feedback]
    assert [m.data for m in one.qps[6].recv_q] == [m.data for m in batched.qps[6].recv_q]


@needs_native
def test_the_ipv4_checksum_is_the_kernels() -> None:
    """The header checksum the native send path fills in (for the twin's NIC) is
    controller.wire.ipv4.with_checksum's, on random headers with and without options."""
    ffi, lib = library()
    rng = random.Random(7)
    for _ in range(2000):
        ihl = rng.choice([5, 5, 5, 6, 15])
        hdr = bytes([0x40 | ihl]) + bytes(rng.randrange(256) for _ in range(4 * ihl - 1))
        buf = ffi.new("uint8_t[]", hdr)
        lib.xm_tp_ipv4_checksum(buf)
        assert bytes(ffi.buffer(buf, len(hdr))) == with_checksum(hdr)
