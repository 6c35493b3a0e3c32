"""Every figure of a run's record (RunRecord) and of the table, defined once: what is counted,
over which interval, in which unit, and the range it must lie in. The suite computes them with
the functions below (and testbed.traffic.metrics for FCTs, bandwidths and fairness), and
docs/fidelity.md holds the same table (`python -m testbed.experiment.metrics` prints it;
tests/test_metrics_audit.py checks the two agree and each function on a hand-computed trace).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Metric:
    field: str  # the RunRecord field (results.json's `runs`)
    column: str  # the table's column ("" where the table does not show it)
    unit: str
    definition: str
    lo: float | None = 0.0  # the range it must lie in (None: unbounded on that side)
    hi: float | None = None


_QUEUE = (
    "of the bottleneck port's egress queue, in bytes, as the INT record of every data packet "
    "that crossed it and arrived at a host shows it (queue occupancy at the packet's "
    "departure from that hop; the traffic manager's own figure, so v1model's 19-bit "
    "deq_qdepth does not limit it); percentiles interpolate linearly between samples (numpy)"
)

METRICS: tuple[Metric, ...] = (
    Metric("queue_p50_bytes", "p50 queue", "B", "the median " + _QUEUE),
    Metric("queue_p99_bytes", "p99 queue", "B", "the 99th percentile " + _QUEUE),
    Metric("queue_max_bytes", "", "B", "the largest " + _QUEUE),
    Metric("queue_samples", "", "packets", "the INT samples of the bottleneck port"),
    Metric(
        "drops",
        "drops",
        "frames",
        "frames the switches received and did not send during the run: over every switch "
        "port, frames received minus frames sent (port counters; MAC Control frames left "
        "out); frames a switch made itself (clones, drop reports) count against it, so it "
        "can be below the drop counters' sum",
        lo=None,
    ),
    Metric(
        "utilization",
        "util",
        "fraction",
        "bytes the bottleneck port sent during the run (Ethernet frames, headers and INT "
        "included) / (its line rate x the interval), the interval being the completion time, "
        "or the span of the port's own transmissions (first start to last end, the traffic "
        "manager's) where that is longer; the twin's port never sends faster than its rate, so "
        "this never exceeds 1 there (the emulation reads the interval from the completion "
        "time alone where the switch reports no span)",
        hi=1.0,
    ),
    Metric(
        "util_after_2t",
        "util>2T",
        "fraction",
        "the incast's: the receiver's downlink's utilization over the frames that arrived after "
        "the first 2 T of traffic. On the twin by arrival time (bytes arriving after the first "
        "such arrival / (line rate x time from it to the last)); on the emulation by the "
        "downlink's departures, the last hop's INT egress stamps (bytes of all but the last "
        "departure / (line rate x (time from the first to the last + the stamps' 1 us))), "
        "because a switch process that wakes late delivers overdue frames back to back and the "
        "arrivals then read up to about 1 % above the line rate (1.0099 on a `dcqcn+pfc` "
        "incast here)",
        hi=1.0,
    ),
    Metric(
        "fairness_min",
        "Jain min",
        "index",
        "the incast's: Jain's index of the flows' received rates at the receiver's downlink "
        "per window of 10 T while two or more flows are active, the worst window",
        hi=1.0,
    ),
    Metric("fairness_p50", "", "index", "the same, the median window", hi=1.0),
    Metric(
        "fct_slowdown_p50",
        "FCT p50",
        "ratio",
        "the median over completed flows of FCT / ideal FCT: FCT from the flow's start to "
        "the sender seeing its last packet acknowledged, ideal = size x 8 / the payload line "
        "rate of the flow's slower NIC + the measured base RTT",
    ),
    Metric("fct_slowdown_p99", "FCT p99", "ratio", "the same, the 99th percentile"),
    Metric("flows", "", "flows", "flows (or ranks, or jobs) the workload started"),
    Metric("flows_completed", "", "flows", "of those, the ones that completed"),
    Metric(
        "busbw_bps",
        "busbw",
        "b/s",
        "bus bandwidth: bytes per rank / the collective's makespan (`completion_s`) x the "
        "collective's bus factor (all-reduce 2(n-1)/n, all-to-all (n-1)/n), payload bits. "
        "The collective library's own tables (`xingmai-testbed collective`, `tune`) use "
        "nccl-tests' time instead, each rank's own time averaged over the ranks "
        "([Collectives](collectives.md)); the two differ only where ranks end apart",
    ),
    Metric(
        "completion_s",
        "time",
        "s",
        "from the workload's start to its last flow's completion (flows), or the "
        "collective's makespan (collectives: from the first rank's start to the last "
        "rank's end, averaged over its iterations, as a flow workload's ends with its last "
        "flow), in the model's seconds at the run's scale",
    ),
    Metric("retransmits", "", "packets", "packets the senders' transports sent again"),
    Metric("cnps", "", "packets", "CNPs the senders received"),
    Metric("out_of_order", "", "packets", "data packets the receivers dropped for a PSN gap"),
    Metric(
        "reordered",
        "",
        "gaps",
        "gaps in the receivers' PSNs whose missing packet came late (sent before the packet "
        "that showed the gap): reordered on the way, not lost",
    ),
    Metric(
        "feedback_not_sent",
        "",
        "packets",
        "ACKs, NAKs and CNPs the receivers made and their sockets refused: lost before the "
        "wire (the emulation's; the twin's NICs take every one)",
    ),
    Metric("pauses", "pauses", "frames", "PFC pause (XOFF) frames sent by switches and NICs"),
    Metric("paused_s", "", "s", "time egress ports and NICs were held by pauses, summed"),
)
BY_FIELD = {m.field: m for m in METRICS}


def queue_stats(samples: Sequence[float]) -> dict[str, float]:
    """p50, p99, max and count of queue samples (zeros where there are none)."""
    if not samples:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0, "samples": 0.0}
    return {
        "p50": float(np.percentile(samples, 50)),
        "p99": float(np.percentile(samples, 99)),
        "max": float(max(samples)),
        "samples": float(len(samples)),
    }


def utilization(
    tx_bytes: int, rate_bps: float, completion_s: float, busy_span_s: float = 0.0
) -> float | None:
    """`utilization`'s definition: bytes sent / (rate x max(completion, the port's span))."""
    interval = max(completion_s, busy_span_s)
    if rate_bps <= 0 or interval <= 0:
        return None
    return tx_bytes * 8 / (rate_bps * interval)


def out_of_range(values: dict[str, object]) -> list[str]:
    """The metrics of a record (RunRecord.summary()) outside their range, described."""
    out = []
    for m in METRICS:
        v = values.get(m.field)
        if not isinstance(v, int | float) or isinstance(v, bool):
            continue
        if math.isnan(v) or (m.lo is not None and v < m.lo) or (m.hi is not None and v > m.hi):
            out.append(f"{m.field} = {v} outside [{m.lo}, {m.hi}]")
    return out


def markdown() -> str:
    """The definitions as docs/fidelity.md shows them."""
    lines = ["| field | column | unit | range | definition |", "| --- | --- | --- | --- | --- |"]
    for m in METRICS:
        lo = "-inf" if m.lo is None else f"{m.lo:g}"
        hi = "inf" if m.hi is None else f"{m.hi:g}"
        col = f"`{m.column}`" if m.column else ""
        lines.append(f"| `{m.field}` | {col} | {m.unit} | [{lo}, {hi}] | {m.definition} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
