"""Local ports for the servers the testbed and the tests start (gRPC, metrics, collectors).

A port the kernel picks for `bind(("127.0.0.1", 0))` lies in its ephemeral range
(net.ipv4.ip_local_port_range), the range every outgoing connection's source port is drawn
from too: between the pick and the server's own bind, a gRPC client connecting anywhere can
take it ("Address already in use", seen on CI). The ports handed out here lie below that
range, where no outgoing connection lands, are never handed out twice by one process, and are
checked free by a bind of the same kind before they are returned.
"""

from __future__ import annotations

import random
import socket
import threading

# Below Linux's default ephemeral range (32768-60999) and above the registered ports most
# services use; the range is read from the machine when it is configured differently.
_LOW = 20000
_EPHEMERAL_FALLBACK = (32768, 60999)
_TRIES = 200

_given: set[int] = set()
_lock = threading.Lock()
# seeded by the OS: two processes picking at once do not walk the same sequence
_rng = random.SystemRandom()


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(v) for v in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return _EPHEMERAL_FALLBACK


def _candidates() -> range:
    lo, hi = _ephemeral_range()
    if lo - _LOW >= 1000:
        return range(_LOW, lo)
    # the ephemeral range starts low: use what lies above it
    return range(hi + 1, 65536)


def _bindable(port: int, kind: int) -> bool:
    with socket.socket(socket.AF_INET, kind) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port of 127.0.0.1 free for `kind` (TCP by default), outside the ephemeral range."""
    pool = _candidates()
    with _lock:
        if len(_given) > len(pool) // 2:
            # bounded: a port given long ago is bound by its server by now (the bind check
            # skips it) or free again
            _given.clear()
        for _ in range(_TRIES):
            port = _rng.choice(pool)
            if port in _given or not _bindable(port, kind):
                continue
            _given.add(port)
            return port
    raise OSError(
        f"no free local port after {_TRIES} tries in {pool.start}-{pool.stop - 1} "
        "(below the kernel's ephemeral range)"
    )
