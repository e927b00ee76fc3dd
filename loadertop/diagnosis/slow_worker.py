"""slow_worker: one worker far slower per batch than the others while the loop waits.

Both a part of the input-bound verdicts' evidence and advice and a finding of its own
(`loadertop.findings.slow_worker`): the rule lives here, once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadertop.client.document import SourceFigures, WorkerFigures
from loadertop.client.units import say_ms
from loadertop.diagnosis.readings import finite, stat
from loadertop.diagnosis.thresholds import (
    SLOW_WORKER_FACTOR,
    SLOW_WORKER_MIN_BATCHES,
    SLOW_WORKER_MIN_MS,
    WAIT_FRACTION_INPUT_BOUND,
)


@dataclass(frozen=True)
class SlowWorker:
    worker: WorkerFigures
    batch_ms: float  # its p50 time per batch (items and collate)
    others_ms: float  # the median of the other workers' p50
    ratio: float


def slow_worker(source: SourceFigures) -> SlowWorker | None:
    """The one worker that takes SLOW_WORKER_FACTOR times longer per batch than the others while
    the loop waits: with in-order delivery (torch's default) every round of batches waits for it,
    and more workers do not help (a bad shard, file or disk behind its share of the indices)."""
    wait_fraction = finite(source.wait_fraction)
    if wait_fraction is None or wait_fraction < WAIT_FRACTION_INPUT_BOUND:
        return None
    times = []
    for w in source.workers:
        fetch = stat(w.fetch_ms)
        # A dead worker holds nothing back (torch raises, or its shard is gone): its death is the
        # finding (`worker_died`), and its last batches are no baseline for the living.
        if fetch is None or w.batches < SLOW_WORKER_MIN_BATCHES or w.alive is False:
            continue
        times.append((fetch + (stat(w.collate_ms) or 0.0), w))
    if len(times) < 2:
        return None
    times.sort(key=lambda t: t[0])
    slowest_ms, slowest = times[-1]
    others = [t for t, _ in times[:-1]]
    mid = len(others) // 2
    median = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
    if slowest_ms < SLOW_WORKER_MIN_MS or slowest_ms < SLOW_WORKER_FACTOR * median:
        return None
    ratio = slowest_ms / median if median > 0 else math.inf
    return SlowWorker(worker=slowest, batch_ms=slowest_ms, others_ms=median, ratio=ratio)


def slow_ratio_text(slow: SlowWorker) -> str:
    return f"{slow.ratio:.0f}×" if math.isfinite(slow.ratio) else "far more than"


def slow_worker_line(slow: SlowWorker) -> str:
    ratio = slow_ratio_text(slow)
    return (f"worker {slow.worker.id} takes {say_ms(slow.batch_ms)} per batch, {ratio} the others' "
            f"{say_ms(slow.others_ms)} (threshold {SLOW_WORKER_FACTOR:g}×)")


def slow_worker_advice(slow: SlowWorker) -> str:
    return (f"more workers will not fix one slow worker: look at what worker {slow.worker.id} "
            f"reads (torch sends task i to worker i mod num_workers: a slow file, shard or disk "
            f"behind its share); in_order=False lets the others' batches through meanwhile")
