"""The probe's one-time start (its import and the publisher's) without bringing the program's next
full garbage collection forward.

CPython (3.10-3.13, gcmodule.c / gc.c) makes a full collection only when the objects moved into
the oldest generation since the last one exceed a quarter of what it held then
(`long_lived_pending > long_lived_total / 4`). The probe's start moves several thousand objects
there: psutil, msgspec, pyzmq, the schema, the publisher. A program that was fewer than that short
of its next full collection makes it at its first loader, over all of torch's objects, on the
training loop's thread. And a program that would have made none before exiting (a short script, a
test, an evaluation pass) pays all of it: tests/benchmarks/short_loaders.py shows it, its plain
run making its full collections inside `import torch` only, and a third one at its first loader
under `loadertop run` before this (docs/performance.md: the figures).

So the start runs with the collector paused, after a young collection (the program's own young
objects are examined as they would have been), and what the start made is then moved straight
to the oldest generation (`gc.freeze()` then `gc.unfreeze()`), not counted as newly promoted:
modules, classes and a publisher that live as long as the process. `gc.freeze()` also sets the
generations' counts to zero, so the program does not carry the paused allocations into its next
collections either; pausing alone did (as `attach`'s bootstrap once did): the parent was left
on the edge of a full collection that every forked worker then made itself, before its first
batch (docs/performance.md).

Left as it is:
- a program that has frozen objects itself (`gc.freeze()` before starting workers, to keep their
  pages shared): `unfreeze()` would undo that;
- a program that has turned the collector off: it collects nothing, so there is nothing to spare.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")


def call(start: Callable[..., _T], *args: Any) -> _T:
    """`start(*args)`, its allocations not counted towards the next full collection."""
    try:
        quiet = gc.isenabled() and gc.get_freeze_count() == 0
    except Exception:  # an interpreter without these (PyPy): start as usual
        quiet = False
    if not quiet:
        return start(*args)
    gc.collect(1)
    gc.disable()
    try:
        return start(*args)
    finally:
        if gc.get_freeze_count() == 0:  # still none of the program's own (another thread's)
            gc.freeze()
            gc.unfreeze()
        gc.enable()
