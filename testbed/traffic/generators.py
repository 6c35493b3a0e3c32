"""Workload generators: which flows (src, dst, size, start) a run has. Pure functions of their
parameters and a seed, so a schedule can be checked statistically and replayed exactly.

A flow is one message on a queue pair between two hosts; `slot` picks which of the pair's
queue pairs carries it (flows on one queue pair are sent one after another, as an RDMA
application posting on one QP would). Host indexes refer to the run's host list.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

CDF_FILES = {
    "websearch": "WebSearch_distribution.txt",
    "fbhadoop": "FbHdp_distribution.txt",
    "alistorage": "AliStorage2019.txt",
    "googlerpc": "GoogleRPC2008.txt",
}


@dataclass(frozen=True)
class Flow:
    id: int
    src: int
    dst: int
    size: int  # bytes
    start: float  # seconds after the run starts
    slot: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


class SizeCdf:
    """An empirical flow-size CDF: points (size in bytes, cumulative fraction), linear between."""

    def __init__(self, points: list[tuple[float, float]], name: str = "") -> None:
        if len(points) < 2:
            raise ValueError("a CDF needs at least two points")
        sizes = [float(s) for s, _ in points]
        probs = [float(p) for _, p in points]
        if any(b < a for a, b in zip(sizes, sizes[1:], strict=False)) or any(
            b < a for a, b in zip(probs, probs[1:], strict=False)
        ):
            raise ValueError("CDF points must be non-decreasing")
        if abs(probs[-1] - 1.0) > 1e-9 or probs[0] < 0:
            raise ValueError(f"CDF must end at 1.0 (got {probs[-1]})")
        self.name = name
        self.sizes = sizes
        self.probs = probs

    @classmethod
    def load(cls, name_or_path: str) -> SizeCdf:
        """A bundled CDF by name (see CDF_FILES) or a file of `<bytes> <cumulative %>` lines."""
        if name_or_path in CDF_FILES:
            text = (resources.files("testbed.data.workloads") / CDF_FILES[name_or_path]).read_text()
        else:
            try:
                text = Path(name_or_path).read_text()
            except OSError as exc:
                raise ValueError(
                    f"{name_or_path!r}: neither a bundled CDF ({', '.join(sorted(CDF_FILES))}) "
                    f"nor a readable file ({exc.strerror})"
                ) from None
        points = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ValueError(f"{name_or_path}:{lineno}: expected '<bytes> <percent>'")
            points.append((float(parts[0]), float(parts[1]) / 100.0))
        return cls(points, name_or_path)

    def sample(self, rng: random.Random) -> int:
        u = rng.random()
        i = bisect.bisect_left(self.probs, u)
        if i == 0:
            return max(1, round(self.sizes[0]))
        p0, p1 = self.probs[i - 1], self.probs[i]
        s0, s1 = self.sizes[i - 1], self.sizes[i]
        size = s1 if p1 == p0 else s0 + (s1 - s0) * (u - p0) / (p1 - p0)
        return max(1, round(size))

    def mean(self) -> float:
        """Mean size of the piecewise-linear distribution (each segment uniform)."""
        pts = list(zip(self.sizes, self.probs, strict=True))
        segments = sum(
            (p1 - p0) * (s0 + s1) / 2 for (s0, p0), (s1, p1) in zip(pts, pts[1:], strict=False)
        )
        return segments + self.probs[0] * self.sizes[0]

    def cdf(self, size: float) -> float:
        if size < self.sizes[0]:
            return 0.0
        i = bisect.bisect_right(self.sizes, size)
        if i >= len(self.sizes):
            return 1.0
        s0, s1 = self.sizes[i - 1], self.sizes[i]
        p0, p1 = self.probs[i - 1], self.probs[i]
        return p0 + (p1 - p0) * (size - s0) / (s1 - s0)


def incast(
    n_hosts: int,
    size: int,
    *,
    receiver: int = 0,
    senders: list[int] | None = None,
    start: float = 0.0,
) -> list[Flow]:
    """N:1 incast: every sender sends `size` bytes to `receiver` at the same time."""
    srcs = senders if senders is not None else [h for h in range(n_hosts) if h != receiver]
    if receiver in srcs or not srcs:
        raise ValueError("incast needs senders other than the receiver")
    return [Flow(i, s, receiver, size, start) for i, s in enumerate(srcs)]


def all_to_all(n_hosts: int, size: int, start: float = 0.0) -> list[Flow]:
    """MoE dispatch: each rank sends size / n bytes to every other rank (nccl-tests sizing)."""
    per = size // n_hosts
    if per <= 0:
        raise ValueError("size must be at least n_hosts bytes")
    flows: list[Flow] = []
    for s in range(n_hosts):
        for k in range(1, n_hosts):
            flows.append(Flow(len(flows), s, (s + k) % n_hosts, per, start))
    return flows


def pairs_flows(pairs: list[tuple[int, int]], size: int, qps_per_pair: int = 1) -> list[Flow]:
    """One flow of `size` bytes per (src, dst) pair and per queue pair slot, all at time 0."""
    return [
        Flow(i * qps_per_pair + k, s, d, size, 0.0, k)
        for i, (s, d) in enumerate(pairs)
        for k in range(qps_per_pair)
    ]


def poisson(
    n_hosts: int,
    cdf: SizeCdf,
    load: float,
    line_rate_bps: float,
    duration: float,
    *,
    seed: int = 1,
    qps_per_pair: int = 4,
    max_flows: int = 100_000,
) -> list[Flow]:
    """Flows with Poisson arrivals at each host so that its offered load is `load` x line rate.

    Each host draws inter-arrival times from an exponential with mean
    mean_size * 8 / (load * line_rate), a size from `cdf`, and a destination uniformly among the
    other hosts; consecutive flows of a pair rotate over `qps_per_pair` queue pairs.
    """
    if not 0 < load <= 1.0:
        raise ValueError("load must be in (0, 1]")
    if n_hosts < 2 or duration <= 0 or line_rate_bps <= 0:
        raise ValueError("need >= 2 hosts, a positive duration and line rate")
    rng = random.Random(seed)
    rate = load * line_rate_bps / (8 * cdf.mean())  # flows per second per host
    flows: list[Flow] = []
    per_pair: dict[tuple[int, int], int] = {}
    for src in range(n_hosts):
        t = rng.expovariate(rate)
        while t < duration:
            dst = rng.randrange(n_hosts - 1)
            dst += dst >= src
            k = per_pair.get((src, dst), 0)
            per_pair[(src, dst)] = k + 1
            flows.append(Flow(0, src, dst, cdf.sample(rng), t, k % qps_per_pair))
            if len(flows) > max_flows:
                raise ValueError(f"more than {max_flows} flows: lower the load or duration")
            t += rng.expovariate(rate)
    flows.sort(key=lambda f: (f.start, f.src))
    return [Flow(i, f.src, f.dst, f.size, f.start, f.slot) for i, f in enumerate(flows)]


def flows_csv(flows: list[Flow], names: list[str], comment: str = "") -> str:
    """`flows` as a `--flows` file (testbed.sim.run.load_flows reads it): a `# comment`
    line, the header `src,dst,bytes,start_s`, one line per flow by start, hosts by name."""
    lines = [f"# {comment}"] if comment else []
    lines.append("src,dst,bytes,start_s")
    for f in sorted(flows, key=lambda f: (f.start, f.id)):
        lines.append(f"{names[f.src]},{names[f.dst]},{f.size},{f.start!r}")
    return "\n".join(lines) + "\n"


def offered_load(flows: list[Flow], n_hosts: int, line_rate_bps: float, duration: float) -> float:
    """Mean offered load per host as a fraction of the line rate."""
    return sum(f.size for f in flows) * 8 / (n_hosts * line_rate_bps * duration)


def log_buckets(sizes: list[int]) -> list[int]:
    """Decade bucket upper bounds covering `sizes` (for FCT tables)."""
    top = max(sizes, default=1)
    return [10**k for k in range(3, max(4, math.ceil(math.log10(top + 1)) + 1))]
