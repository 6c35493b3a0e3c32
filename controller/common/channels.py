"""Options of the gRPC channels the controller opens to the host agents.

gRPC's default reconnect backoff starts at 1 s and grows 1.6 times per failed attempt, up to
120 s: a daemon that took 20 s to come up (an agent compiling its eBPF programs) or came back
after a restart was reached up to 11 s after it listened (the emulation's boot waited that long
between "agents healthy" and the controller reaching them). These daemons are on the
management network, a millisecond away: a channel retries at least every second. (The
minimum backoff is gRPC's connect deadline too, left at its 20 s. The channels to the switches
keep gRPC's defaults, and finsy its own backoff for P4Runtime.)
"""

from __future__ import annotations

RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
