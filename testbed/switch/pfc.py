"""Priority Flow Control settings of the traffic manager, and the PFC watchdog's.

PFC (IEEE 802.1Qbb) makes a priority lossless: the switch counts, per ingress port and
priority, the bytes that came in on it and still sit in its buffer; at XOFF it sends the
upstream device a pause for that priority (controller/wire/pfc.py), refreshed while the
count stays above XON, and at XON a resume. What is still on the way when the pause goes
out lands in the headroom above XOFF: one round trip of the link at its rate, the frame the
upstream was sending when the pause arrived and the one this port was sending when it
decided (a pause waits for the frame on the wire), the pause frame itself and the upstream's
response time. `pfc_thresholds` sizes XOFF so that every ingress port's share, XOFF plus
headroom, fits the buffer: then no egress queue can overflow.

The watchdog is SONiC's (`pfcwd`): every poll it looks at each lossless queue that a
received pause holds; a queue paused with packets waiting and nothing sent for
`detect_polls` polls in a row is in a storm, and the action applies to it (`drop`: its
packets and new arrivals are dropped and pauses on it are ignored; `forward`: pauses on it
are ignored, it sends). After `restore_polls` polls with no pause received on it, it is
restored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from controller.wire.pfc import MAX_QUANTA, MIN_FRAME, PRIORITIES

WATCHDOG_ACTIONS = ("drop", "forward")
# The PFC watchdog's poll in the model's time (dilated by the scale like every time): long
# against a congestion pause's XOFF-to-XON cycle (a few frame times of fan-in), short against
# a storm. SONiC's defaults (100 ms polls, 200 ms detection) are for real time on 100G.
WATCHDOG_POLL_MODEL_NS = 5_000
WATCHDOG_POLLS = 3  # to detect, and to restore


@dataclass(frozen=True)
class PfcConfig:
    xoff_bytes: int  # ingress bytes of a (port, priority) at which the upstream is paused
    xon_bytes: int  # ... at or below which it is resumed
    headroom_bytes: int  # what may still arrive after the pause (sized, for the record)
    quanta: int = MAX_QUANTA  # the pause time each XOFF asks for
    priorities: frozenset[int] = frozenset({0})  # the lossless priorities
    link_bps: float = 0.0  # a port's speed for pause times when its queue has no rate set
    # With a shared buffer, a dynamic XOFF (0: the static xoff_bytes / xon_bytes): a (port,
    # priority) pauses when its bytes above `reserve_bytes` reach `alpha` times what is left
    # of `pool_bytes` (the buffer less every port's headroom and reserve) after every
    # (port, priority)'s bytes above its reserve, and resumes `resume_offset_bytes` below.
    alpha: float = 0.0
    pool_bytes: int = 0
    reserve_bytes: int = 0
    resume_offset_bytes: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.xon_bytes < self.xoff_bytes:
            raise ValueError(
                f"PFC needs 0 <= XON < XOFF, got XON {self.xon_bytes} XOFF {self.xoff_bytes}"
            )
        if not 1 <= self.quanta <= MAX_QUANTA:
            raise ValueError(f"PFC quanta must be within [1, {MAX_QUANTA}], got {self.quanta}")
        if not self.priorities or not all(0 <= p < PRIORITIES for p in self.priorities):
            raise ValueError(f"PFC priorities must be within [0, 7], got {set(self.priorities)}")
        if not (math.isfinite(self.link_bps) and self.link_bps >= 0):
            raise ValueError(f"link_bps must be >= 0, got {self.link_bps}")
        if not (math.isfinite(self.alpha) and 0 <= self.alpha <= 64):
            raise ValueError(f"PFC's alpha must be within [0, 64] (0: static), got {self.alpha}")
        if self.alpha and self.pool_bytes < 1:
            raise ValueError("a dynamic PFC threshold needs a shared pool (pool_bytes >= 1)")
        if min(self.pool_bytes, self.reserve_bytes, self.resume_offset_bytes) < 0:
            raise ValueError("PFC's pool, reserve and resume offset are bytes >= 0")


def pfc_headroom(link_bps: float, delay_ns: int, max_frame: int, response_ns: int = 0) -> int:
    """Bytes that can still arrive on a port after it decided to pause its upstream."""
    in_flight = math.ceil((2 * delay_ns + response_ns) * link_bps / 8e9)
    return in_flight + 2 * max_frame + MIN_FRAME


def pfc_thresholds(
    link_bps: float,
    delay_ns: int,
    max_frame: int,
    buffer_bytes: int,
    ports: int,
    response_ns: int = 0,
    alpha: float = 0.0,
) -> PfcConfig:
    """XOFF and XON for a switch of `ports` ports sharing `buffer_bytes`.

    Static (`alpha` 0): each port's share is XOFF + headroom; XON two frames below XOFF, as
    SONiC's default xon offset. Dynamic (a shared buffer, `alpha` > 0, as HPCC's simulator and
    shipping switches set it): every port keeps its headroom and a reserve of one frame per
    priority, the rest is one pool, and a (port, priority) pauses when its bytes above its
    reserve reach `alpha` times what of the pool is still free (resuming two frames below);
    `xoff_bytes` / `xon_bytes` then record the thresholds of an empty buffer."""
    if ports < 1 or buffer_bytes < 1:
        raise ValueError("PFC thresholds need at least one port and a buffer")
    headroom = pfc_headroom(link_bps, delay_ns, max_frame, response_ns)
    if alpha:
        reserve = max_frame
        pool = buffer_bytes - ports * (headroom + reserve)
        xoff = math.floor(alpha * pool)
    else:
        xoff = buffer_bytes // ports - headroom
    xon = xoff - 2 * max_frame
    if xon < 0:
        raise ValueError(
            f"a buffer of {buffer_bytes} B over {ports} ports leaves no room for PFC: "
            f"{headroom} B of headroom per port ({link_bps:g} b/s, {delay_ns} ns links)"
        )
    if not alpha:
        return PfcConfig(xoff, max(0, xon), headroom, link_bps=link_bps)
    return PfcConfig(
        xoff,
        xon,
        headroom,
        link_bps=link_bps,
        alpha=alpha,
        pool_bytes=pool,
        reserve_bytes=reserve,
        resume_offset_bytes=2 * max_frame,
    )


@dataclass(frozen=True)
class WatchdogConfig:
    poll_ns: int  # time between polls
    detect_polls: int = 2  # stalled polls in a row that make a storm
    restore_polls: int = 2  # polls without a pause that end it
    action: str = "drop"

    def __post_init__(self) -> None:
        if self.poll_ns < 1 or self.detect_polls < 1 or self.restore_polls < 1:
            raise ValueError("the PFC watchdog needs a poll time and counts >= 1")
        if self.action not in WATCHDOG_ACTIONS:
            raise ValueError(
                f"PFC watchdog action {self.action!r} is not one of {', '.join(WATCHDOG_ACTIONS)}"
            )


def model_watchdog(scale: float, action: str = "drop") -> WatchdogConfig:
    """The watchdog both engines run: the model's poll, dilated by the scale."""
    return WatchdogConfig(
        round(WATCHDOG_POLL_MODEL_NS * scale), WATCHDOG_POLLS, WATCHDOG_POLLS, action
    )


def pfc_request(pfc: PfcConfig, wd: WatchdogConfig | None) -> Any:
    """SwitchAdmin's SetPfc request for these settings (as a controller sets them)."""
    from controller.proto import switch_pb2

    return switch_pb2.SetPfcRequest(
        enable=True,
        xoff_bytes=pfc.xoff_bytes,
        xon_bytes=pfc.xon_bytes,
        headroom_bytes=pfc.headroom_bytes,
        alpha=pfc.alpha,
        pool_bytes=pfc.pool_bytes,
        reserve_bytes=pfc.reserve_bytes,
        resume_offset_bytes=pfc.resume_offset_bytes,
        quanta=pfc.quanta,
        priority_mask=sum(1 << p for p in pfc.priorities),
        link_bps=pfc.link_bps,
        watchdog_poll_ns=wd.poll_ns if wd else 0,
        detect_polls=wd.detect_polls if wd else 0,
        restore_polls=wd.restore_polls if wd else 0,
        watchdog_action=wd.action if wd else "",
    )


@dataclass
class PfcQueueState:
    """One (port, priority)'s PFC state: both directions of the port."""

    # ingress: bytes that came in on this port at this priority and are still queued
    ingress_bytes: int = 0
    pausing: bool = False  # this switch holds the upstream paused
    xoff_sent_ns: int = 0  # when the last XOFF went out (refreshed at half its time)
    # egress: the pause the downstream device sent
    paused_until_ns: int = 0
    paused_since_ns: int | None = None
    paused_ns: int = 0  # closed pause intervals
    last_pause_rx_ns: int | None = None
    # watchdog
    dequeued: int = 0
    wd_seen_dequeued: int = 0
    wd_stalled_polls: int = 0
    wd_quiet_polls: int = 0
    wd_seen_pause_rx: int = 0
    storm: bool = False


@dataclass
class PfcPortCounters:
    """Per port: pause frames sent (XOFF and XON), received, and what the watchdog did."""

    xoff_sent: int = 0
    xon_sent: int = 0
    pauses_received: int = 0  # frames with a non-zero time
    resumes_received: int = 0  # frames with time 0 (XON)
    storms: int = 0
    restored: int = 0
    watchdog_drops: int = 0
    per_prio: dict[int, PfcQueueState] = field(default_factory=dict)

    def state(self, prio: int) -> PfcQueueState:
        st = self.per_prio.get(prio)
        if st is None:
            st = self.per_prio[prio] = PfcQueueState()
        return st

    def paused_ns(self, now_ns: int) -> int:
        """Time the port's egress was held by received pauses, summed over priorities."""
        total = 0
        for st in self.per_prio.values():
            total += st.paused_ns
            if st.paused_since_ns is not None:
                total += max(0, min(now_ns, st.paused_until_ns) - st.paused_since_ns)
        return total
