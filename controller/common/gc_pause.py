"""Python's cyclic garbage collector kept off work it would repeat. A job of a thousand peers
is a queue pair per peer, each a few containers, made at once: with the collector on, every
threshold crossed while they are made walks all of them again (60 % of the time the flow
engine took to build the 512-host all-to-all's jobs, one rank at a time). Collection changes
no result, only when memory is freed."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off inside (as it was after): what is made here is walked once, at the
    next collection after it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextmanager
def gc_frozen() -> Iterator[None]:
    """What exists on entry is left out of every collection inside (`gc.freeze`): long-lived
    state, such as a run's jobs, that the collector would otherwise walk at each full
    collection; it is collectable again after."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
