"""controller.common.gc_pause: the collector paused and restored as it was; what exists on
entry to gc_frozen left out of collections inside, collectable after."""

from __future__ import annotations

import gc

from controller.common.gc_pause import gc_frozen, gc_paused


def test_paused_inside_and_restored_as_it_was() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # it was off: left off
    finally:
        gc.enable()


def test_paused_is_restored_on_an_error() -> None:
    try:
        with gc_paused():
            raise RuntimeError("x")
    except RuntimeError:
        pass
    assert gc.isenabled()


def test_frozen_leaves_what_exists_out_and_gives_it_back() -> None:
    class Cycle:
        def __init__(self) -> None:
            self.me = self

    kept = [Cycle() for _ in range(10)]
    with gc_frozen():
        assert gc.get_freeze_count() >= len(kept)
    assert gc.get_freeze_count() == 0
    del kept
    # the cycles are collectable again once unfrozen
    assert gc.collect() >= 10
