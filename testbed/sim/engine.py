"""A deterministic discrete-event loop: a virtual clock in integer nanoseconds and a heap of
events ordered by (time, sequence number), so events due at the same time run in the order
they were scheduled, on every run and every machine."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    def __init__(self) -> None:
        self.now_ns = 0
        self.events = 0  # events run so far
        self._heap: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0

    @property
    def now(self) -> float:
        """Seconds (what the transport core and the jobs take)."""
        return self.now_ns / 1e9

    def at(self, t_ns: int, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` at `t_ns` (not before now)."""
        self._seq += 1
        if t_ns < self.now_ns:
            t_ns = self.now_ns
        heapq.heappush(self._heap, (t_ns, self._seq, fn, args))

    def run(self, until_ns: int | None = None, stop: Callable[[], bool] | None = None) -> bool:
        """Run events in order until none are left, the next is after `until_ns`, or `stop()`
        holds after an event (True then)."""
        heap = self._heap
        pop = heapq.heappop
        while heap:
            t = heap[0][0]
            if until_ns is not None and t > until_ns:
                self.now_ns = until_ns
                return False
            _, _, fn, args = pop(heap)
            self.now_ns = t
            self.events += 1
            fn(*args)
            if stop is not None and stop():
                return True
        if until_ns is not None:
            self.now_ns = max(self.now_ns, until_ns)
        return False

    @property
    def pending(self) -> int:
        return len(self._heap)
