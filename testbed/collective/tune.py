"""Auto-tune: choose a collective's algorithm, channels, chunk size and its scheme's CC
parameters per message size by measuring candidates on the engine (the twin: deterministic
and fast), and cache the choice per (topology, scale of the communicator, collective, size,
scheme).

The search is coordinate-wise, as tuners of this kind do to stay cheap: the algorithms at
the default chunk and all channels, then the chunk sizes for the best algorithm, then the
channel count, then each CC knob of the scheme's rate law in turn (`CC_KNOBS`: two knobs of
every law, two values each besides its profile's: the same budget for every scheme with a
rate law); a candidate wins by a higher busbw, the default kept unless another is 1 % faster
(`MIN_GAIN`). The default it is compared with is the
library's fixed choice (`DEFAULT`: ring, every channel, 1 MiB chunks) under the scheme's CC
profile as shipped. `choose()` reads the cache: a job given `algorithm: auto` runs what was
tuned for its size (the nearest tuned size, else the default), CC parameters included.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.collective.metrics import fmt_size
from testbed.traffic.collective_plans import SUPPORTED

if TYPE_CHECKING:
    from testbed.collective.run import CollFabric

DEFAULT_ALGORITHM, DEFAULT_CHUNK = "ring", 1 << 20  # the library's fixed choice, every NIC
DEFAULT: dict[str, Any] = {
    "algorithm": DEFAULT_ALGORITHM,
    "channels": 0,
    "chunk": DEFAULT_CHUNK,
    "cc": {},  # the scheme's CC profile as shipped
}
CHUNKS = (64 << 10, 256 << 10, 1 << 20)
# A candidate replaces the one in hand only when it is this much faster: a choice (and a CC
# setting cached for the job) is not changed for a gain within the runs' rounding
MIN_GAIN = 1.01
# Per rate law, the CC parameters the tuner tries besides its profile's values (each
# `VALUE UNIT`, Profile.with_values): the knobs that set how hard a law cuts and how fast it
# climbs back. TiTa/HPCC: the target utilisation eta and the additive step W_AI; DCQCN: the
# gain g of its congestion estimate alpha (how fast a cut's depth follows the CNPs) and the
# additive increase R_AI; TIMELY: its EWMA weight and decrease factor; Swift: its additive
# increase and decrease factor.
CC_KNOBS: dict[str, dict[str, tuple[str, ...]]] = {
    "tita": {"eta": ("0.9 fraction", "0.98 fraction"), "wai_bps": ("0.01 line", "0.2 line")},
    "hpcc": {"eta": ("0.9 fraction", "0.98 fraction"), "wai_bps": ("0.01 line", "0.2 line")},
    "dcqcn": {
        "g": ("0.00390625 fraction", "0.0625 fraction"),
        "rai_bps": ("0.0001 line", "0.001 line"),
    },
    "timely": {"alpha": ("0.3 fraction", "0.9 fraction"), "beta": ("0.4 fraction", "0.9 fraction")},
    "swift": {"ai_bytes": ("0.5 packets", "4 packets"), "beta": ("0.4 fraction", "0.9 fraction")},
}
DEFAULT_CACHE = Path("runs") / "tune-cache.json"  # the working directory's runs/


def key(topology: str, hosts: int, nics: int, collective: str, size: int, scheme: str) -> str:
    return f"{topology}|{hosts}x{nics}|{collective}|{size}|{scheme}"


def _load(cache: Path) -> dict[str, Any]:
    if not cache.exists():
        return {}
    doc = json.loads(cache.read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{cache}: not a tuning cache")
    return doc


def choose(
    cache: Path, topology: str, hosts: int, nics: int, collective: str, size: int, scheme: str
) -> dict[str, Any]:
    """The tuned choice for this size (the nearest tuned size of the same communicator),
    or the default."""
    doc = _load(cache)
    prefix = key(topology, hosts, nics, collective, 0, scheme).rsplit("|", 2)[0]
    tuned = [
        (int(k.split("|")[3]), v)
        for k, v in doc.items()
        if k.startswith(prefix + "|") and k.endswith("|" + scheme)
    ]
    if not tuned:
        return dict(DEFAULT)
    _, best = min(tuned, key=lambda t: abs(t[0] - size) / max(t[0], size))
    return {k: best.get(k, DEFAULT[k]) for k in DEFAULT}


def _best(candidates: list[Any], busbw: Callable[[Any], float]) -> Any:
    """The first candidate (the default) unless a later one is MIN_GAIN faster than the best
    so far."""
    best = candidates[0]
    for c in candidates[1:]:
        if busbw(c) > busbw(best) * MIN_GAIN:
            best = c
    return best


def _cc_label(cc: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(cc.items())) or "profile"


def tune(
    fab: CollFabric,
    collective: str,
    sizes: list[int],
    cache: Path,
    measure: Callable[..., dict[str, Any]],
    say: Any = print,
) -> dict[str, Any]:
    """`measure(fab, **params)`: one run's figures (testbed.collective.run.collective)."""
    k = fab.nics
    scheme = fab.scheme
    knobs = CC_KNOBS.get(fab.law, {})
    measured: dict[tuple[int, str, int, int, str], tuple[float, dict[str, str]]] = {}

    def busbw(size: int, alg: str, ch: int, chunk: int, cc: dict[str, str] | None = None) -> float:
        cc = cc or {}
        c = (size, alg, ch or k, chunk, _cc_label(cc))
        if c not in measured:
            r = measure(
                fab,
                collective=collective,
                algorithm=alg,
                size=size,
                channels=ch or k,
                chunk=chunk,
                cc=cc,
                schedule="adaptive",
                iters=2,
                warmup=1,
            )
            if not r["correct"]:
                raise RuntimeError(f"{collective} {alg} {size} B: wrong result")
            measured[c] = (r["busbw_Bps"], dict(cc))
            say(
                f"tune {fmt_size(size)}: {alg} ch={ch or k} chunk={fmt_size(chunk)} "
                f"cc={_cc_label(cc)}: {r['busbw_Bps'] / 1e9:.1f} GB/s"
            )
        return measured[c][0]

    def search(size: int) -> tuple[str, int, int, dict[str, str]]:
        # each coordinate tries the default first (ring is in every list), which the
        # others must beat by MIN_GAIN
        algs = sorted(SUPPORTED[collective], key=lambda a: a != DEFAULT_ALGORITHM)
        alg = _best(algs, lambda a: busbw(size, a, 0, DEFAULT_CHUNK))
        chunks = [DEFAULT_CHUNK] + [c for c in CHUNKS if c != DEFAULT_CHUNK]
        chunk = _best(chunks, lambda c: busbw(size, alg, 0, c))
        ch = _best([k] + ([1] if k != 1 else []), lambda c: busbw(size, alg, c, chunk))
        cc: dict[str, str] = {}
        for knob, values in knobs.items():
            tries = [cc] + [cc | {knob: v} for v in values]
            cc = _best(tries, lambda t: busbw(size, alg, ch, chunk, t))
        return alg, chunk, ch, cc

    doc = _load(cache)
    rows = []
    try:
        for size in sizes:
            default = busbw(size, DEFAULT_ALGORITHM, 0, DEFAULT_CHUNK)
            best_alg, best_chunk, best_ch, best_cc = search(size)
            best = busbw(size, best_alg, best_ch, best_chunk, best_cc)
            profile_best = busbw(size, best_alg, best_ch, best_chunk)
            fixed = [v for c, (v, _) in measured.items() if c[0] == size]
            choice = {
                "algorithm": best_alg,
                "channels": best_ch,
                "chunk": best_chunk,
                "cc": best_cc,
            }
            doc[key(fab.topology, len(fab.hosts), k, collective, size, scheme)] = {
                **choice,
                "busbw_Bps": best,
            }
            rows.append(
                {
                    "size": size,
                    **choice,
                    "busbw_Bps": best,
                    "default_Bps": default,
                    "gain": best / default,
                    # the best algorithm, chunk and channels under the profile as shipped
                    "profile_Bps": profile_best,
                    "best_fixed_Bps": max(fixed),
                    "candidates": len(fixed),
                }
            )
    finally:
        fab.set_cc({})  # later runs on this fabric: the profile as configured
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(doc, indent=1, sort_keys=True))
    return {
        "collective": collective,
        "scheme": scheme,
        "cc_knobs": {n: list(v) for n, v in knobs.items()},
        "rows": rows,
        "measured": [
            {
                "size": c[0],
                "algorithm": c[1],
                "channels": c[2],
                "chunk": c[3],
                "cc": cc,
                "busbw_Bps": v,
            }
            for c, (v, cc) in measured.items()
        ],
    }


def tune_table(res: dict[str, Any]) -> str:
    """The tuner's choice per size against the library's default under the shipped CC
    profile (`gain`) and against the best choice without CC tuning (`cc gain`)."""
    lines = [
        f"{'size':>8} {'algorithm':>9} {'channels':>8} {'chunk':>6} "
        f"{'busbw(GB/s)':>11} {'default':>8} {'gain':>6} {'cc gain':>7} {'vs best':>7}  cc"
    ]
    for r in res["rows"]:
        profile = r.get("profile_Bps", r["busbw_Bps"])
        lines.append(
            f"{fmt_size(r['size']):>8} {r['algorithm']:>9} {r['channels']:>8} "
            f"{fmt_size(r['chunk']):>6} {r['busbw_Bps'] / 1e9:>11.2f} "
            f"{r['default_Bps'] / 1e9:>8.2f} {r['gain']:>5.2f}x {r['busbw_Bps'] / profile:>6.2f}x "
            f"{r['busbw_Bps'] / r['best_fixed_Bps']:>6.0%}  {_cc_label(r.get('cc') or {})}"
        )
    return "\n".join(lines)
