"""HTB class changes over rtnetlink, encoded here: the re-rate of a flow's class, the hot path
of the agent's rate thread. pyroute2's `tc()` took 0.63-0.88 ms of CPU a write (its asyncio
loop, the rate tables it computes in Python, its attribute encoder; docs/nic.md); this is the
same request in a few struct packs.

It is the message pyroute2 sends (`tc("change-class", "htb", ...)`: RTM_NEWTCLASS, the class's
TCA_HTB_PARMS, the 64-bit rates where they do not fit) but for the rate tables: each ratespec
names its link layer (Ethernet) instead, which is all the kernel reads a rate table for
(net/sched/sch_htb.c, htb_change_class: a ratespec whose link layer is unknown has it taken
from the table), and what it records from pyroute2's tables too.
tests/test_htb_netlink.py writes classes both ways and requires the kernel to read them back
identical.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from dataclasses import dataclass
from typing import Final

# the kernel's psched tick in microseconds (/proc/net/psched), as pyroute2 reads it
from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec

RTM_NEWTCLASS: Final = 40
NLMSG_ERROR: Final = 2
NLM_F_REQUEST: Final = 0x1
NLM_F_ACK: Final = 0x4
TCA_KIND: Final = 1
TCA_OPTIONS: Final = 2
TCA_HTB_PARMS: Final = 1
TCA_HTB_RATE64: Final = 6
TCA_HTB_CEIL64: Final = 7
TC_LINKLAYER_ETHERNET: Final = 1
TIME_UNITS_PER_SEC: Final = 1_000_000

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_TCMSG = struct.Struct("=BBHiIII")  # family, pad, pad, ifindex, handle, parent, info
_NLA = struct.Struct("=HH")  # len, type
# struct tc_ratespec: cell_log, linklayer, overhead, cell_align, mpu, rate
_RATESPEC = "BBHhHI"
# struct tc_htb_opt: rate, ceil (tc_ratespec), buffer, cbuffer, quantum, level, prio
_HTB_OPT = struct.Struct("=" + _RATESPEC * 2 + "IIIII")
U32_MAX: Final = (1 << 32) - 1


@dataclass(frozen=True, slots=True)
class ClassChange:
    """An existing HTB class's new parameters: its rate and ceiling (bytes/s), their bursts
    (bytes), quantum and priority, under `parent` on the interface `ifindex`."""

    ifindex: int
    handle: int
    parent: int
    rate_Bps: int
    ceil_Bps: int
    burst: int
    cburst: int
    quantum: int
    prio: int


def xmit_ticks(rate_Bps: int, size: int) -> int:
    """The time `size` bytes take at `rate_Bps`, in the kernel's psched ticks: tc's
    tc_calc_xmittime, as pyroute2 computes it (whole microseconds, then ticks)."""
    return int(int(TIME_UNITS_PER_SEC * (float(size) / rate_Bps)) * tick_in_usec)


def _nla(kind: int, payload: bytes) -> bytes:
    n = _NLA.size + len(payload)
    return _NLA.pack(n, kind) + payload + b"\0" * (-n % 4)


def _ratespec(rate_Bps: int) -> tuple[int, ...]:
    """A tc_ratespec naming its link layer (no rate table), its rate capped at 32 bits (the
    64-bit attribute carries the rest)."""
    return (0, TC_LINKLAYER_ETHERNET, 0, -1, 0, min(rate_Bps, U32_MAX))


def encode_change(seq: int, c: ClassChange) -> bytes:
    """RTM_NEWTCLASS changing an existing HTB class."""
    if c.rate_Bps <= 0 or c.ceil_Bps <= 0:
        raise ValueError(f"an HTB class needs rates above 0 (rate {c.rate_Bps}, ceil {c.ceil_Bps})")
    opt = _HTB_OPT.pack(
        *_ratespec(c.rate_Bps),
        *_ratespec(c.ceil_Bps),
        xmit_ticks(c.rate_Bps, c.burst),
        xmit_ticks(c.ceil_Bps, c.cburst),
        c.quantum,
        0,
        c.prio,
    )
    options = _nla(TCA_HTB_PARMS, opt)
    if c.rate_Bps >= U32_MAX:
        options += _nla(TCA_HTB_RATE64, struct.pack("=Q", c.rate_Bps))
    if c.ceil_Bps >= U32_MAX:
        options += _nla(TCA_HTB_CEIL64, struct.pack("=Q", c.ceil_Bps))
    body = (
        _TCMSG.pack(socket.AF_UNSPEC, 0, 0, c.ifindex, c.handle, c.parent, 0)
        + _nla(TCA_KIND, b"htb\0")
        + _nla(TCA_OPTIONS, options)
    )
    flags = NLM_F_REQUEST | NLM_F_ACK
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_NEWTCLASS, flags, seq, 0) + body


class HtbClassWriter:
    """One rtnetlink socket in the namespace it is made in; `change` sends a class change and
    waits for the kernel's answer (OSError with its errno on a refusal)."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._sock.bind((0, 0))
        self._seq = 0

    def change(self, c: ClassChange) -> None:
        self._seq = (self._seq + 1) & U32_MAX
        self._sock.send(encode_change(self._seq, c))
        while True:  # the answer to this request (an earlier one's, timed out, is skipped)
            data = self._sock.recv(65536)
            off = 0
            while off + _NLMSGHDR.size <= len(data):
                n, kind, _, seq, _ = _NLMSGHDR.unpack_from(data, off)
                if n < _NLMSGHDR.size:
                    raise OSError(errno.EBADMSG, "a malformed netlink answer")
                if seq == self._seq and kind == NLMSG_ERROR:
                    (err,) = struct.unpack_from("=i", data, off + _NLMSGHDR.size)
                    if err:
                        raise OSError(-err, f"HTB class change refused: {os.strerror(-err)}")
                    return
                off += (n + 3) & ~3

    def close(self) -> None:
        self._sock.close()
