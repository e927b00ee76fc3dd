"""The earlier settings of one loader in this run: what it measured with another `num_workers`.

A program that re-creates its DataLoader with another worker count (a sweep by hand, an epoch
that raises `num_workers`, `loadertop tune`'s trials inside one process) runs the same source
with a new config: the probe re-reads the loader's config when an epoch's iterator is made, so a
report's `config` says which setting it measured. `SettingHistory.add` cuts the reports into
stretches of one setting (num_workers, batch_size) and, when the setting changes, keeps the last
`KEEP_S` of the stretch that ended as a `SettingFigures`: throughput, fetch time per batch and the
fetching side's CPU share. The diagnosis compares them with the current window — a fetch time that
rose while the workers were added and the throughput stayed is the measured sign that more workers
only queue for the storage (issue 15).

A stretch's start-up never counts: its reports up to and including the first one that received a
batch (the workers starting, the first batch) are left out, and so are its last reports without a
batch (the program dropping the loader and making the next). A stretch shorter than `MIN_S` after
that says too little and is not kept.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

import msgspec

from loadertop import wire
from loadertop.client.document import SettingFigures

MIN_S: Final = 2.0  # a setting measured for less than this (start-up excluded) is not kept
KEEP_S: Final = 30.0  # a setting is summarised by its latest this-many seconds
MAX_SETTINGS: Final = 8  # earlier settings kept per source (the latest of each)

SettingKey = tuple[int, int | None]  # (num_workers, batch_size)


class _Interval(msgspec.Struct, frozen=True, gc=False):
    """One report's share of a stretch, reduced to sums (no samples are kept)."""

    received: float
    seconds: float
    batches: int
    wait_ns: int
    fetch_batches: int  # batches the fetch sums cover (the workers', or the loop's with 0)
    fetch_wall_ns: int
    fetch_cpu_ns: int
    workers_rss: int | None  # the workers' RSS at this report, summed


def _interval(received: float, msg: wire.LoaderReport) -> _Interval:
    fetch_batches = wall = cpu = 0
    rss: int | None = None
    for w in msg.workers:
        fetch_batches += w.batches
        wall += w.fetch_wall_ns
        cpu += w.fetch_cpu_ns
        if w.rss_bytes is not None:
            rss = w.rss_bytes if rss is None else rss + w.rss_bytes
    if not msg.config.num_workers:  # the loop fetches inside next(): its wait is the fetch
        fetch_batches, wall, cpu = msg.batches, msg.wait_ns, 0
    return _Interval(received, msg.interval_s, msg.batches, msg.wait_ns, fetch_batches, wall, cpu,
                     rss)


@dataclass
class _Stretch:
    """The reports of one setting. Each is kept as it came, with when it was received (the
    model keeps it longer anyway: an untracked tuple is all this adds), and reduced to its sums
    only when the stretch ends: a setting changes rarely, a report comes 4 times a second per
    source (docs/performance.md, "The TUI watching many sources")."""

    key: SettingKey
    started: bool = False  # the start-up (up to the first report with a batch) is behind it
    reports: deque[tuple[float, wire.LoaderReport]] = field(default_factory=deque)

    def add(self, msg: wire.LoaderReport, now: float) -> None:
        if not self.started:
            self.started = msg.batches > 0
            return
        reports = self.reports
        reports.append((now, msg))
        while reports and reports[0][0] < now - KEEP_S:
            reports.popleft()

    def summary(self) -> SettingFigures | None:
        intervals = [_interval(received, msg) for received, msg in self.reports]
        # The reports after the last batch are the program dropping the loader and making the
        # next one (still under the old config until the new iterator exists): not this setting.
        while intervals and intervals[-1].batches == 0:
            intervals.pop()
        seconds = sum(i.seconds for i in intervals)
        batches = sum(i.batches for i in intervals)
        if seconds < MIN_S or batches == 0:
            return None
        workers, batch_size = self.key
        fetch_batches = sum(i.fetch_batches for i in intervals)
        wall = sum(i.fetch_wall_ns for i in intervals)
        cpu = sum(i.fetch_cpu_ns for i in intervals)
        rate = batches / seconds
        rss = next((i.workers_rss for i in reversed(intervals) if i.workers_rss is not None), None)
        return SettingFigures(
            num_workers=workers, batch_size=batch_size, seconds=round(seconds, 2),
            batches=batches, batches_per_s=round(rate, 3),
            samples_per_s=round(rate * batch_size, 3) if batch_size else None,
            fetch_ms=round(wall / fetch_batches / 1e6, 3) if fetch_batches else None,
            cpu_fraction=round(min(1.0, cpu / wall), 3) if workers and wall else None,
            wait_fraction=round(min(1.0, sum(i.wait_ns for i in intervals) / (seconds * 1e9)), 3),
            workers_rss_bytes=rss,
            ended_at=round(intervals[-1].received, 3))


class SettingHistory:
    """One source's settings: the current stretch, and the summary of each earlier setting."""

    def __init__(self) -> None:
        self._current: _Stretch | None = None
        self._earlier: dict[SettingKey, SettingFigures] = {}

    def add(self, msg: wire.LoaderReport, now: float) -> None:
        key = (msg.config.num_workers, msg.config.batch_size)
        current = self._current
        if current is None or current.key != key:
            if current is not None:
                summary = current.summary()
                if summary is not None:
                    self._earlier.pop(current.key, None)
                    self._earlier[current.key] = summary  # newest last
                    while len(self._earlier) > MAX_SETTINGS:
                        del self._earlier[next(iter(self._earlier))]
            current = self._current = _Stretch(key)
        current.add(msg, now)

    def earlier(self) -> tuple[SettingFigures, ...]:
        """The earlier settings' figures, oldest first (the current setting is not among them)."""
        current = self._current.key if self._current is not None else None
        return tuple(s for k, s in self._earlier.items() if k != current)
