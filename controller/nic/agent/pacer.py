"""Pacing: what the kernel offers, and the qdiscs that delay packets to each flow's rate.

- EDT (`sch_fq` as root qdisc): tc_egress.c sets skb->tstamp from the rate map; nothing to
  manage per flow.
- HTB (no `sch_fq`, as on this project's kernel): one root HTB per interface with one class
  for the port (rate = ceil = the line rate: what the NIC's port sends, together) and under it
  a default class and one class per flow that the agent creates and re-rates over netlink,
  each with a token rate (MIN_RATE_BPS) and a ceiling: the line rate for the default class,
  the flow's rate for a flow's (a NIC's per-QP rate limiter). Beyond its token rate a class
  borrows from the port's, so the flows together never exceed the line rate, each at most
  its own rate, and the port is shared among them by their quanta (weights); tc_egress.c
  sends each packet to its flow's class via skb->priority. HTB delays packets (token buckets);
  the leaf queue only fills up to the sender's socket buffer, which blocks the sender rather
  than dropping.
TCP is paced by the kernel itself in both modes (sockops.c sets SO_MAX_PACING_RATE).
"""

from __future__ import annotations

import enum
import logging
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

from controller.nic.agent.htb_netlink import ClassChange, HtbClassWriter

log = logging.getLogger("xingmai.agent.pacer")

HTB_MAJOR = 0x1
ROOT_HANDLE = HTB_MAJOR << 16
PORT_MINOR = 0x1  # the class of the port: every other class borrows from it
DEFAULT_MINOR = 0xFFFE
FIRST_FLOW_MINOR = 0x10
LAST_FLOW_MINOR = 0xFFF0
MTU = 1600  # HTB rate-table cell sizing (bytes)
# Who borrows the port's rate first (HTB's prio, lower first): the default class, where a
# RoCE NIC's feedback (ACK, NAK, CNP) leaves, before the flows' classes, as the twin's NIC sends
# its feedback ahead of its queue pairs' data (testbed/sim/nic.py's kick). Equal, an ACK waited
# its turn behind a backlogged flow's frames.
DEFAULT_PRIO = 0
FLOW_PRIO = 1
BURST_S = 0.002  # token bucket depth in time at the class rate: catches up timer lateness
# The slowest an HTB class paces: its rate table and buffer are 32-bit counts of 1/64 us ticks,
# which overflow for a full-size frame below ~100 b/s (netlink then refuses the class); a
# slower rate is paced at this one.
MIN_RATE_BPS = 8_000


class PacingMode(enum.StrEnum):
    HTB = "htb"
    EDT = "edt"


def classid(minor: int) -> int:
    return ROOT_HANDLE | minor


def _burst(rate_Bps: int) -> int:
    return max(2 * MTU, int(rate_Bps * BURST_S))


def _quantum(weight: int) -> int:
    # HTB warns below 1000 and above 200000 bytes
    return max(1514, min(200_000, 1514 * max(1, weight)))


def root_qdisc_kind(ipr: Any, ifindex: int) -> tuple[str, int] | None:
    for q in ipr.get_qdiscs(ifindex):
        if q["parent"] == 0xFFFFFFFF:
            return q.get_attr("TCA_KIND"), q["handle"]
    return None


def detect_mode(ifname: str, wanted: str = "auto") -> tuple[PacingMode, str]:
    """Pick the pacing mode: EDT when `sch_fq` can be made the root qdisc (it is then left in
    place for EdtPacer), else HTB. Asks the kernel through `tc`, whose error for a missing
    qdisc kind is unambiguous. Returns the mode and what was found."""
    if wanted == "htb":
        return PacingMode.HTB, "HTB requested"
    res = subprocess.run(
        ["tc", "qdisc", "replace", "dev", ifname, "root", "handle", f"{HTB_MAJOR:x}:", "fq"],
        capture_output=True,
        text=True,
    )
    if res.returncode == 0:
        return PacingMode.EDT, "sch_fq available: EDT (skb->tstamp) from the rate map"
    why = (res.stderr or res.stdout).strip().splitlines()[0] if (res.stderr or res.stdout) else "?"
    if wanted == "edt":
        raise RuntimeError(f"EDT pacing requested but sch_fq is unavailable: {why}")
    return PacingMode.HTB, f"no sch_fq in this kernel ({why}): per-flow HTB classes"


@dataclass
class FlowClass:
    minor: int
    rate_bps: int
    weight: int
    changed_ns: int


class HtbPacer:
    """Per-flow HTB classes on every managed interface (same minor on each)."""

    def __init__(self, ipr: Any, ifindexes: list[int], line_rate_bps: int):
        self.ipr = ipr
        self.ifindexes = list(ifindexes)
        self.line_rate_bps = line_rate_bps
        self.port_rate_bps = line_rate_bps  # what the port sends (a NIC fault lowers it)
        self.classes: dict[Any, FlowClass] = {}
        self.lock = threading.RLock()
        self.rerates = 0
        self.rerate_seconds = 0.0
        self.errors = 0
        self._writer: HtbClassWriter | None = None  # class changes (made in the namespace)

    # ---- lifecycle ----

    def setup(self) -> bool:
        """Create (or adopt) the root HTB and default class. True when adopted."""
        adopted = True
        for idx in self.ifindexes:
            root = root_qdisc_kind(self.ipr, idx)
            if root != ("htb", ROOT_HANDLE):
                adopted = False
                if root is not None and root[0] not in ("noqueue", "pfifo_fast", "mq", "fq"):
                    log.warning("replacing root qdisc %s on ifindex %d", root[0], idx)
                self.ipr.tc("replace", "htb", idx, ROOT_HANDLE, default=DEFAULT_MINOR)
            self._write_port(idx, "replace-class", self.port_rate_bps)
            self._write_leaf(
                idx, "replace-class", DEFAULT_MINOR, self.line_rate_bps, 1, DEFAULT_PRIO
            )
        return adopted

    def set_port_rate(self, rate_bps: int) -> int:
        """The rate the port sends at, all flows together (the line rate; less for a NIC
        that cannot keep up: a fault). Returns it as set."""
        rate_bps = max(MIN_RATE_BPS, min(int(rate_bps), self.line_rate_bps))
        with self.lock:
            for idx in self.ifindexes:
                self._write_port(idx, "change-class", rate_bps)
            self.port_rate_bps = rate_bps
        return rate_bps

    def _write_port(self, idx: int, cmd: str, rate_bps: int) -> None:
        self._write_class(idx, cmd, PORT_MINOR, ROOT_HANDLE, rate_bps, rate_bps, 1, DEFAULT_PRIO)

    def _write_leaf(
        self, idx: int, cmd: str, minor: int, ceil_bps: int, weight: int, prio: int = FLOW_PRIO
    ) -> None:
        """A class under the port's: its token rate the least HTB paces, so that it borrows
        the rest from the port (within the port's rate), up to `ceil_bps`, in `prio`'s turn."""
        parent = classid(PORT_MINOR)
        self._write_class(
            idx, cmd, minor, parent, MIN_RATE_BPS, max(MIN_RATE_BPS, ceil_bps), weight, prio
        )

    def _write_class(
        self,
        idx: int,
        cmd: str,
        minor: int,
        parent: int,
        rate_bps: int,
        ceil_bps: int,
        weight: int,
        prio: int,
    ) -> None:
        rate, ceil = rate_bps // 8, ceil_bps // 8
        if cmd == "change-class":  # a re-rate, the rate thread's hot path: encoded here
            with self.lock:
                if self._writer is None:
                    self._writer = HtbClassWriter()
                self._writer.change(
                    ClassChange(
                        idx,
                        classid(minor),
                        parent,
                        rate,
                        ceil,
                        _burst(rate),
                        _burst(ceil),
                        _quantum(weight),
                        prio,
                    )
                )
            return
        self.ipr.tc(
            cmd,
            "htb",
            idx,
            classid(minor),
            parent=parent,
            rate=rate,
            ceil=ceil,
            burst=_burst(rate),
            cburst=_burst(ceil),
            quantum=_quantum(weight),
            prio=prio,
            mtu=MTU,
        )

    def existing_minors(self) -> set[int]:
        found: set[int] = set()
        for idx in self.ifindexes:
            for c in self.ipr.get_classes(idx):
                h = c["handle"]
                if h >> 16 == HTB_MAJOR and FIRST_FLOW_MINOR <= (h & 0xFFFF) <= LAST_FLOW_MINOR:
                    found.add(h & 0xFFFF)
        return found

    def adopt(self, flow: Any, minor: int, rate_bps: int) -> None:
        self.classes[flow] = FlowClass(minor, rate_bps, 1, time.monotonic_ns())

    def teardown(self) -> None:
        """Remove the root qdisc (and with it every class) from each interface."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        for idx in self.ifindexes:
            try:
                self.ipr.tc("del", "htb", idx, ROOT_HANDLE)
            except Exception as exc:
                log.warning("removing HTB from ifindex %d: %s", idx, exc)
        self.classes.clear()

    # ---- classes ----

    def _free_minor(self) -> int:
        used = {c.minor for c in self.classes.values()}
        for m in range(FIRST_FLOW_MINOR, LAST_FLOW_MINOR + 1):
            if m not in used:
                return m
        raise RuntimeError("no free HTB class id")

    def _write(self, cmd: str, minor: int, rate_bps: int, weight: int) -> None:
        for idx in self.ifindexes:
            self._write_leaf(idx, cmd, minor, rate_bps, weight)

    def apply(self, flow: Any, rate_bps: int, weight: int = 1) -> tuple[FlowClass, bool]:
        """Create or re-rate the flow's class; returns it and whether a netlink call was made."""
        with self.lock:
            fc = self.classes.get(flow)
            t0 = time.perf_counter()
            if fc is None:
                fc = FlowClass(self._free_minor(), rate_bps, weight, 0)
                self._write("replace-class", fc.minor, rate_bps, weight)
                self.classes[flow] = fc
            elif fc.rate_bps != rate_bps or fc.weight != weight:
                self._write("change-class", fc.minor, rate_bps, weight)
                fc.rate_bps, fc.weight = rate_bps, weight
            else:
                return fc, False
            fc.changed_ns = time.monotonic_ns()
            self.rerates += 1
            self.rerate_seconds += time.perf_counter() - t0
            return fc, True

    def remove(self, flow: Any) -> FlowClass | None:
        with self.lock:
            fc = self.classes.pop(flow, None)
            if fc is None:
                return None
            for idx in self.ifindexes:
                try:
                    # pyroute2 builds HTB parameters even for a delete: give it a rate
                    self.ipr.tc(
                        "del-class",
                        "htb",
                        idx,
                        classid(fc.minor),
                        parent=classid(PORT_MINOR),
                        rate=1000,
                        ceil=1000,
                    )
                except Exception as exc:
                    log.warning("removing class %x: %s", fc.minor, exc)
            return fc

    def drops(self) -> dict[int, int]:
        """Packets dropped per class minor, summed over interfaces (pacing must keep it 0)."""
        out: dict[int, int] = {}
        with self.lock:
            for idx in self.ifindexes:
                for c in self.ipr.get_classes(idx):
                    st = c.get_attr("TCA_STATS2")
                    q = st.get_attr("TCA_STATS_QUEUE") if st else None
                    if q is not None:
                        m = c["handle"] & 0xFFFF
                        out[m] = out.get(m, 0) + int(q["drops"])
        return out


class EdtPacer:
    """sch_fq root on every interface; rates are read by tc_egress.c from the rate map."""

    def __init__(self, ipr: Any, ifindexes: list[int]):
        self.ipr = ipr
        self.ifindexes = list(ifindexes)

    def setup(self) -> bool:
        # detect_mode() left sch_fq as root of the first interface; the others get it too
        for idx in self.ifindexes[1:]:
            name = self.ipr.get_links(idx)[0].get_attr("IFLA_IFNAME")
            subprocess.run(
                ["tc", "qdisc", "replace", "dev", name, "root", "handle", f"{HTB_MAJOR:x}:", "fq"],
                check=True,
                capture_output=True,
            )
        return False

    def teardown(self) -> None:
        for idx in self.ifindexes:
            try:
                self.ipr.tc("del", "fq", idx, ROOT_HANDLE, parent=0xFFFFFFFF)
            except Exception as exc:
                log.warning("removing fq from ifindex %d: %s", idx, exc)
