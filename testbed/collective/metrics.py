"""nccl-tests' figures from the ranks' results of a collective job.

- time: each rank's own time in the collective (its start to its end), averaged over the
  ranks (nccl-tests times each rank's loop and averages the ranks' times;
  testbed.traffic.metrics.collective_times) and over the iterations after the first `warmup`;
- makespan: the first rank's start to the last rank's end, averaged the same way, and the
  busbw it gives: the scenario table's time and busbw of a collective (comparable with a flow
  workload's completion and with the flow engine, whose fluid model has makespans only);
- algbw = size / time, busbw = algbw x the collective's bus factor (2(n-1)/n for all-reduce,
  (n-1)/n for reduce-scatter, all-gather and all-to-all, 1 for send/recv), so that busbw is
  comparable with the hardware's bandwidth whatever the collective and n;
- efficiency = busbw / (K x NIC rate): the share of the host's K NICs the collective uses.
  The NIC rate is the line rate in payload bits (headers excluded), what a NIC can deliver.

Rates and times are the engine's; `scale` (model speed / engine speed) turns them into the
model's (the emulation runs at 1/scale of the model's rates).
"""

from __future__ import annotations

import statistics
from typing import Any

from testbed.traffic.metrics import collective_times, iteration_times


def summarize(
    results: list[dict[str, Any]],
    nic_payload_bps: float,
    nics: int,
    scale: float = 1.0,
    warmup: int = 0,
) -> dict[str, Any]:
    """The figures of one collective job (`results`: its ranks' results)."""
    if not results:
        raise ValueError("no ranks")
    r0 = results[0]
    times = collective_times(results)
    used = times[warmup:] or times
    t = statistics.fmean(used)
    spans = iteration_times(results)
    makespan = statistics.fmean(spans[warmup:] or spans)
    algbw = r0["size"] / t * scale  # bytes/s of the model
    busbw = algbw * r0["bus_factor"]
    per_channel = [sum(r["channel_bytes"][c] for r in results) for c in range(r0["channels"])]
    return {
        "collective": r0["collective"],
        "algorithm": r0["algorithm"],
        "schedule": r0["schedule"],
        "size": r0["size"],
        "payload": r0["payload"],
        "channels": r0["channels"],
        "chunk": r0["chunk"],
        "ranks": r0["ranks"],
        "time_s": t / scale,  # the model's
        "time_spread_s": (max(used) - min(used)) / scale,
        # the first rank's start to the last rank's end, averaged over the iterations: the
        # scenario table's completion time (a flow workload's is its last flow's end)
        "makespan_s": makespan / scale,
        "makespan_busbw_Bps": r0["size"] / makespan * scale * r0["bus_factor"],
        "iterations": len(used),
        "algbw_Bps": algbw,
        "busbw_Bps": busbw,
        "efficiency": busbw * 8 / (nics * nic_payload_bps * scale),
        "correct": all(r["ok"] for r in results),
        "wrong_ranks": sum(not r["ok"] for r in results),
        "channel_bytes": per_channel,
        "moved": sum(r["moved"] for r in results),
        "transfers": sum(r["transfers_out"] for r in results),
    }


def fmt_size(n: int) -> str:
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise ValueError(f"{text!r}: a size like 65536, 64K, 4M") from None


def parse_sizes(text: str) -> list[int]:
    """`64K:64M` (powers of two from .. to), `64K:64M:4` (factor 4), or `1M,4M,16M`."""
    if ":" in text:
        parts = text.split(":")
        lo, hi = parse_size(parts[0]), parse_size(parts[1])
        f = int(parts[2]) if len(parts) > 2 else 2
        if lo < 1 or hi < lo or f < 2:
            raise ValueError(f"{text!r}: from <= to and a factor >= 2")
        out = []
        s = lo
        while s <= hi:
            out.append(s)
            s *= f
        return out
    return [parse_size(p) for p in text.split(",") if p.strip()]


def table(rows: list[dict[str, Any]], unit_note: str = "") -> str:
    """The nccl-tests table (out-of-place columns; times in us and bandwidths in GB/s of the
    model), with the efficiency and the channel split added."""
    head = (
        f"{'size':>10} {'count':>10} {'type':>6} {'redop':>6} {'algo':>5} {'sched':>8} "
        f"{'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'eff':>6} "
        f"{'#wrong':>6}  channel bytes"
    )
    lines = []
    if unit_note:
        lines.append(f"# {unit_note}")
    lines.append("#" + head[1:])
    for r in rows:
        redop = "sum" if r["collective"] in ("allreduce", "reducescatter") else "none"
        share = "/".join(f"{b / max(1, sum(r['channel_bytes'])):.2f}" for b in r["channel_bytes"])
        lines.append(
            f"{r['size']:>10} {r['size'] // 4:>10} {'float':>6} {redop:>6} "
            f"{r['algorithm']:>5} {r['schedule'][:8]:>8} {r['time_s'] * 1e6:>10.1f} "
            f"{r['algbw_Bps'] / 1e9:>12.2f} {r['busbw_Bps'] / 1e9:>12.2f} "
            f"{r['efficiency'] * 100:>5.1f}% {r['wrong_ranks']:>6}  {share}"
        )
    return "\n".join(lines)
