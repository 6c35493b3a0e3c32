"""What waits in a NIC (controller/nic/backlog.py) and how the agent reads its classes'
backlogs (controller/nic/agent/tcstats.py): the meter's integral on a hand-made series, and
the raw netlink parser on hand-built messages, a truncated one and an error."""

from __future__ import annotations

import errno
import struct

import pytest

from controller.nic.agent.tcstats import (
    NLMSG_DONE,
    NLMSG_ERROR,
    RTM_NEWTCLASS,
    TCA_STATS2,
    TCA_STATS_QUEUE,
    parse_class_backlogs,
)
from controller.nic.backlog import WaitingMeter


def test_the_meter_holds_each_sample_until_the_next_and_caps_it_at_the_line_rate() -> None:
    m = WaitingMeter(line_rate_bps=100.0, period_s=0.5)
    m.sample(1.0, 50.0)  # nothing before the first sample
    m.sample(1.5, 300.0)  # 0.5 s at 50
    m.sample(2.0, 0.0)  # 0.5 s at the line rate, not 300
    m.sample(2.0, 10.0)  # no time: nothing added, the later rate holds
    m.sample(2.5, 20.0)  # 0.5 s at 10
    m.sample(5.5, 0.0)  # a sampler held up for 3 s: two periods at 20, not six
    assert m.bits == pytest.approx(25.0 + 50.0 + 5.0 + 20.0)
    assert (m.samples, m.late) == (6, 1)


def _attr(typ: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), typ) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _msg(typ: int, body: bytes) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), typ, 2, 1, 0) + body


def _class(minor: int, qlen: int, backlog: int) -> bytes:
    tcm = struct.pack("=BxxxiIII", 0, 3, (1 << 16) | minor, (1 << 16) | 1, 0)
    queue = struct.pack("=IIIII", qlen, backlog, 0, 0, 0)
    stats = _attr(TCA_STATS2, _attr(1, b"\0" * 16) + _attr(TCA_STATS_QUEUE, queue))
    return _msg(RTM_NEWTCLASS, tcm + _attr(1, b"htb\0") + stats)


def test_the_parser_reads_each_class_queue_and_the_dump_end() -> None:
    buf = _class(2, 0, 0) + _class(0x10, 3, 4500) + _msg(NLMSG_DONE, b"\0" * 4)
    assert parse_class_backlogs(buf, len(buf)) == ({2: 0, 0x10: 3}, True)
    # a part of a dump: no end yet; a message cut short is left, not misread
    part = _class(0x11, 1, 1500)
    assert parse_class_backlogs(part, len(part)) == ({0x11: 1}, False)
    assert parse_class_backlogs(part, len(part) - 6) == ({}, False)


def test_a_netlink_error_is_raised() -> None:
    buf = _msg(NLMSG_ERROR, struct.pack("=i", -errno.ENODEV) + b"\0" * 16)
    with pytest.raises(OSError, match="No such device"):
        parse_class_backlogs(buf, len(buf))
