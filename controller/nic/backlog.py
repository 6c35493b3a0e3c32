"""What waits in a NIC: the time integral of the rates of its flows that have packets queued
in it, for the controller's slow-NIC rule (controller/health.py). A healthy NIC sends, at
every moment, what its waiting flows are paced at (at most its line rate): over any interval
the bytes it sent match this integral; a NIC that cannot keep up sends less.

Both engines sample it the same way, every `WAITING_SAMPLE_S`: the agent from its pacer's
classes (HTB's per-class backlogs, controller/nic/agent/tcstats.py), the twin from its
transport's queue pairs. A sample's rate holds until the next one, for at most two sampling
periods: polls a few tenths of a second apart that merely found flows waiting said nothing of
the time between them (a flow hands its window's worth of packets over at once, then waits for
ACKs) and named healthy NICs slow, and a sampler held up (a busy agent's thread) says nothing
of the time it missed.
"""

from __future__ import annotations

# seconds between samples of what waits in the NIC: 50 ms rather than 20 to spare the loaded
# emulation's CPU (four agents' threads of 50 dumps a second were followed by a full test run
# whose switches answered late)
WAITING_SAMPLE_S = 0.05


class WaitingMeter:
    """The integral, in bits, of min(waiting, line rate) over time, from samples taken every
    `period_s` (of the caller's clock)."""

    def __init__(self, line_rate_bps: float, period_s: float = WAITING_SAMPLE_S):
        self.line_rate_bps = line_rate_bps
        self.period_s = period_s
        self.bits = 0.0
        self.samples = 0
        self.late = 0  # samples that came more than two periods after the one before
        self._t: float | None = None
        self._bps = 0.0

    def sample(self, t: float, waiting_bps: float) -> None:
        """At time `t` (s) the flows with packets waiting are paced at `waiting_bps` together."""
        self.samples += 1
        if self._t is not None and t > self._t:
            if t - self._t > 2 * self.period_s:
                self.late += 1
            self.bits += self._bps * min(t - self._t, 2 * self.period_s)
        self._t, self._bps = t, min(max(0.0, waiting_bps), self.line_rate_bps)
