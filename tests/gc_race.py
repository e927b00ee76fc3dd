"""A garbage collection at a C function's first allocation, with a finalizer that runs Python
code: what the stamps' ring must survive, since a finalizer can release the GIL and let the
training thread push stamps in the middle of the publisher thread's call (CPython 3.11 collects
at once when the threshold is 1)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

ATTEMPTS = 5


def call_while_a_finalizer_runs(
        make: Callable[[], tuple[Callable[[], object], Callable[[], T], Any]]) -> tuple[T, Any]:
    """`call()`, with a collection due at its first GC-tracked allocation that frees an object
    whose finalizer calls `on_free()`; `make()` gives a fresh (on_free, call, state) for each
    attempt. Returns (call's result, its state) from the first attempt in which that collection
    ran; fails if none of ATTEMPTS did.

    Another thread of the test process (a publisher thread an earlier test left) can make a
    young collection between the object's making and the call: the object, still referenced
    then, moves to an older generation that the call's young collection does not look at, and
    the call runs without the race. The switch interval is raised meanwhile, so that such a
    thread seldom gets the GIL, and the attempt is made again when it did."""
    thresholds = gc.get_threshold()
    interval = sys.getswitchinterval()
    for _ in range(ATTEMPTS):
        on_free, call, state = make()
        ran: list[bool] = []

        class RunsWhenFreed:
            def __del__(self, on_free=on_free, ran=ran) -> None:
                ran.append(True)
                on_free()

        sys.setswitchinterval(1.0)
        try:
            gc.collect()
            cyclic = RunsWhenFreed()
            cyclic.me = cyclic  # type: ignore[attr-defined]  # a cycle: only a collection frees it
            del cyclic
            gc.set_threshold(1)  # the next GC-tracked allocation collects
            result = call()
        finally:
            gc.set_threshold(*thresholds)
            sys.setswitchinterval(interval)
        if ran:
            return result, state
        gc.collect()  # the object, and the finalizer that did not run during the call
    raise AssertionError(f"no collection ran during the call in {ATTEMPTS} attempts")
