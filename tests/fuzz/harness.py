"""Running one surface: Hypothesis draws the cases, the surface checks each, and the counts
are kept (not stopped at the first failure: a fuzz pass reports how many of each)."""

from __future__ import annotations

import json
import os
import platform
import resource
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

# A case that uses more CPU than this is a hang (a loop that does not end); one that takes
# longer than HANG_WALL_S of wall time too (a wait that does not end). CPU time, not wall time,
# is the main test: the machine may be shared, and a slow case on a busy machine is no hang.
HANG_S = 2.0
HANG_WALL_S = 30.0
MAX_EXAMPLES_PER_RUN = 100_000


class Hang(Exception):
    pass


class Crash(Exception):
    """An answer the surface must never give (raised by a check)."""


@contextmanager
def time_limit(cpu_s: float, wall_s: float = HANG_WALL_S) -> Iterator[None]:
    def on_alarm(signum: int, frame: Any) -> None:
        what = "CPU" if signum == signal.SIGPROF else "wall"
        raise Hang(f"case over {cpu_s if what == 'CPU' else wall_s} s of {what} time")

    old_prof = signal.signal(signal.SIGPROF, on_alarm)
    old_real = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    signal.setitimer(signal.ITIMER_REAL, wall_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGPROF, old_prof)
        signal.signal(signal.SIGALRM, old_real)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Result:
    surface: str
    cases: int = 0
    crashes: int = 0
    hangs: int = 0
    growth: list[str] = field(default_factory=list)  # bounds found broken after the run
    outcomes: Counter[str] = field(default_factory=Counter)  # how the cases were answered
    examples: list[str] = field(default_factory=list)  # the first crashes and hangs
    seconds: float = 0.0
    rss_growth_mb: float = 0.0

    @property
    def clean(self) -> bool:
        return self.crashes == 0 and self.hangs == 0 and not self.growth

    def as_dict(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "crashes": self.crashes,
            "hangs": self.hangs,
            "unbounded_growth": self.growth,
            "outcomes": dict(self.outcomes.most_common()),
            "seconds": round(self.seconds, 1),
            "rss_growth_mb": round(self.rss_growth_mb, 1),
            "examples": self.examples,
        }


class Surface:
    """One fuzzed surface: `strategy()` draws a case, `check(case)` runs it and returns how it
    was answered (an outcome name), raising Crash for an answer that must never be given;
    `bounds()` lists the bounds broken after the run (empty: none)."""

    name = ""
    max_rss_growth_mb = 200.0

    def strategy(self) -> st.SearchStrategy[Any]:
        raise NotImplementedError

    def check(self, case: Any) -> str:
        raise NotImplementedError

    def bounds(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def run(surface: Surface, cases: int, seed: int = 18) -> Result:
    res = Result(surface.name)
    before = rss_mb()
    t0 = time.monotonic()

    def note(kind: str, case: Any, exc: BaseException) -> None:
        if len(res.examples) < 5:
            tb = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3)
            res.examples.append(
                f"{kind}: {type(exc).__name__}: {exc} | case {case!r:.300} | {''.join(tb)[-600:]}"
            )

    strategy = surface.strategy()  # built once: building it is costly, drawing is not

    @settings(
        max_examples=min(cases, MAX_EXAMPLES_PER_RUN),
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=False,
        print_blob=False,
    )
    @given(st.data())
    def one(data: st.DataObject) -> None:
        case = data.draw(strategy)
        res.cases += 1
        try:
            with time_limit(HANG_S):
                res.outcomes[surface.check(case)] += 1
        except Hang as exc:
            res.hangs += 1
            note("hang", case, exc)
        except Exception as exc:
            res.crashes += 1
            note("crash", case, exc)

    import random

    random.seed(seed)
    # Hypothesis may stop early once a strategy's space is exhausted; run again until the
    # count is reached (each run draws anew)
    while res.cases < cases:
        start = res.cases
        one()
        if res.cases == start:
            break
    res.seconds = time.monotonic() - t0
    res.rss_growth_mb = max(0.0, rss_mb() - before)
    res.growth = surface.bounds()
    if res.rss_growth_mb > surface.max_rss_growth_mb:
        res.growth.append(
            f"process memory grew {res.rss_growth_mb:.0f} MB "
            f"(bound {surface.max_rss_growth_mb:.0f})"
        )
    surface.close()
    return res


def mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Structure-aware mutation of a valid message: each edit (kind, position, value) flips a
    byte, sets it, cuts the message there, or inserts bytes."""
    b = bytearray(data)
    for kind, pos, value in edits:
        if not b:
            break
        i = pos % len(b)
        if kind == 0:
            b[i] ^= 1 << (value % 8)
        elif kind == 1:
            b[i] = value & 0xFF
        elif kind == 2:
            del b[i:]
        else:
            b[i:i] = bytes([value & 0xFF]) * (1 + value % 7)
    return bytes(b)


EDITS = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 1 << 16), st.integers(0, 255)),
    min_size=1,
    max_size=6,
)
Check = Callable[[Any], str]


def write_report(out: Path, fields: dict[str, Any]) -> None:
    """A fuzz pass's results file: when, where, under which sanitizers, and `fields`."""
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "sanitize": os.environ.get("XINGMAI_NATIVE_SANITIZE") or None,
        **fields,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"results: {out}")
