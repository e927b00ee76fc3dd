"""The publisher thread's timetable: the periods of its one grid (every SLOW_S tick is a REPORT_S
tick is a queue-sample tick, see publisher.py), and how often a loader's queue is sampled on it."""

from __future__ import annotations

from loadertop.probe.record import LoaderRecord

# Queue-depth sampling: the queue changes with every batch, so it is sampled in proportion to the
# batch rate of the last second, SAMPLES_PER_BATCH, at REPORT_S / k for k in SAMPLES_PER_REPORT
# (the grid): 4 Hz up to ~27 batches/s (12 samples in the viewer's 3 s window), 48 Hz from 320/s
# on. A fixed rate well above a slow loader's queue changes paid for wake-ups that saw nothing new
# (docs/performance.md: the fixed rate of old).
SAMPLES_PER_BATCH = 0.15
SAMPLES_PER_REPORT = (1, 2, 3, 4, 6, 12)
REPORT_S = 0.25  # one report per loader: 4 Hz keeps the viewer's 1 s refresh fresh
SLOW_S = 1.0  # psutil worker sampling and the system sample; a multiple of REPORT_S
# The loop's CPU while blocked in next() vetoes "main process bound" when batches sit ready while
# the loop waits. It needs two readings of the loop thread's CPU clock inside one next() call, and
# the viewer counts it only from >= 100 ms of such pairs in its 3 s window: long waits sampled
# often. So while >= CONTESTED_READY_SHARE of last second's samples taken inside next() found
# >= 2 batches ready (the case the figure decides), the queue is sampled at 48 Hz whatever the
# batch rate; a 2-worker loader at 20 batches/s whose workers are the limit stays at 4 Hz.
CONTESTED_READY_SHARE = 0.25


def next_tick(origin: int, period: int, now: int) -> int:
    """The first tick of the grid `origin + k * period` after `now`: a late wake-up skips the
    ticks it missed rather than bunching them, and the periods, multiples of one another, keep
    falling on the same wake-up."""
    return origin + ((now - origin) // period + 1) * period


def samples_per_report(records: list[LoaderRecord], totals: dict[int, int], elapsed_ns: int) -> int:
    """Queue samples per report for the next second: SAMPLES_PER_BATCH of the batches the
    busiest loader with workers took over the last one, snapped up to SAMPLES_PER_REPORT."""
    batches = 0.0
    seen: dict[int, int] = {}
    for record in records:
        key, total = id(record), record.batches_total
        seen[key] = total
        if elapsed_ns > 0 and key in totals and record.config.num_workers:
            batches = max(batches, (total - totals[key]) * REPORT_S * 1e9 / elapsed_ns)
    totals.clear()
    totals.update(seen)
    want = batches * SAMPLES_PER_BATCH
    return next((k for k in SAMPLES_PER_REPORT if k >= want), SAMPLES_PER_REPORT[-1])


def count_waiting(record: LoaderRecord, waiting: list[int]) -> None:
    """After a queue sample: was the loop inside next(), and were >= 2 batches ready then? (The
    record's last depth reading, read on this thread only.)"""
    if record.in_next_since is not None and record.has_queue():
        depth = getattr(record, "_q_last", None)
        waiting[0] += 1
        if depth is not None and depth.ready >= 2:
            waiting[1] += 1
