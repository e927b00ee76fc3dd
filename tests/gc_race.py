"""A garbage collection at a C function's first allocation, with a finalizer that runs Python
code: what the stamps' ring must survive, since a finalizer can release the GIL and let the
training thread push stamps in the middle of the publisher thread's call (CPython 3.11 collects
at once when the threshold is 1)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def call_while_a_finalizer_runs(on_free: Callable[[], object], call: Callable[[], T]) -> T:
    """`call()`, with a collection due at its first GC-tracked allocation that frees an object
    whose finalizer calls `on_free()`; fails if no collection ran it."""
    ran: list[bool] = []

    class RunsWhenFreed:
        def __del__(self) -> None:
            ran.append(True)
            on_free()

    thresholds = gc.get_threshold()
    gc.collect()
    try:
        cyclic = RunsWhenFreed()
        cyclic.me = cyclic  # type: ignore[attr-defined]  # a cycle: only a collection frees it
        del cyclic
        gc.set_threshold(1)  # the next GC-tracked allocation collects
        result = call()
    finally:
        gc.set_threshold(*thresholds)
    assert ran, "no collection ran during the call"
    return result
