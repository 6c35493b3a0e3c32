"""Auto-tune: choose a collective's algorithm, channels and chunk size per message size by
measuring candidates on the engine (the twin: deterministic and fast), and cache the choice
per (topology, scale of the communicator, collective, size, scheme).

The search is coordinate-wise, as tuners of this kind do to stay cheap: the algorithms at
the default chunk and all channels, then the chunk sizes for the best algorithm, then the
channel count; the fastest candidate (busbw) wins. The default it is compared with is the
library's fixed choice (`DEFAULT`: ring, every channel, 1 MiB chunks). `choose()` reads the
cache: a job given `algorithm: auto` runs what was tuned for its size (the nearest tuned
size, else the default).
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
DEFAULT: dict[str, Any] = {"algorithm": DEFAULT_ALGORITHM, "channels": 0, "chunk": DEFAULT_CHUNK}
CHUNKS = (64 << 10, 256 << 10, 1 << 20)
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
    return {k: best[k] for k in DEFAULT}


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
    measured: dict[tuple[int, str, int, int], float] = {}

    def busbw(size: int, alg: str, ch: int, chunk: int) -> float:
        c = (size, alg, ch or k, chunk)
        if c not in measured:
            r = measure(
                fab,
                collective=collective,
                algorithm=alg,
                size=size,
                channels=ch or k,
                chunk=chunk,
                schedule="adaptive",
                iters=2,
                warmup=1,
            )
            if not r["correct"]:
                raise RuntimeError(f"{collective} {alg} {size} B: wrong result")
            measured[c] = r["busbw_Bps"]
            say(
                f"tune {fmt_size(size)}: {alg} ch={ch or k} chunk={fmt_size(chunk)}: "
                f"{r['busbw_Bps'] / 1e9:.1f} GB/s"
            )
        return measured[c]

    doc = _load(cache)
    rows = []
    for size in sizes:
        default = busbw(size, DEFAULT_ALGORITHM, 0, DEFAULT_CHUNK)
        algs = SUPPORTED[collective]
        best_alg = max(algs, key=lambda a: busbw(size, a, 0, DEFAULT_CHUNK))
        best_chunk = max(CHUNKS, key=lambda c: busbw(size, best_alg, 0, c))
        chans = sorted({1, k})
        best_ch = max(chans, key=lambda c: busbw(size, best_alg, c, best_chunk))
        best = busbw(size, best_alg, best_ch, best_chunk)
        fixed = {c: v for c, v in measured.items() if c[0] == size}
        best_fixed = max(fixed.values())
        choice = {"algorithm": best_alg, "channels": best_ch, "chunk": best_chunk}
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
                "best_fixed_Bps": best_fixed,
                "candidates": len(fixed),
            }
        )
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(doc, indent=1, sort_keys=True))
    return {
        "collective": collective,
        "scheme": scheme,
        "rows": rows,
        "measured": [
            {"size": c[0], "algorithm": c[1], "channels": c[2], "chunk": c[3], "busbw_Bps": v}
            for c, v in measured.items()
        ],
    }


def tune_table(res: dict[str, Any]) -> str:
    lines = [
        f"{'size':>8} {'algorithm':>9} {'channels':>8} {'chunk':>6} "
        f"{'busbw(GB/s)':>11} {'default':>8} {'gain':>6} {'vs best':>7}"
    ]
    for r in res["rows"]:
        lines.append(
            f"{fmt_size(r['size']):>8} {r['algorithm']:>9} {r['channels']:>8} "
            f"{fmt_size(r['chunk']):>6} {r['busbw_Bps'] / 1e9:>11.2f} "
            f"{r['default_Bps'] / 1e9:>8.2f} {r['gain']:>5.2f}x "
            f"{r['busbw_Bps'] / r['best_fixed_Bps']:>6.0%}"
        )
    return "\n".join(lines)
