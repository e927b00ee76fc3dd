"""The slow readings' history of one source (memory, files, threads), and their trends.

The probe samples the training process and each worker every few seconds (`probe.resources`);
`ResourceHistory.add` keeps those samples up to `HISTORY_S`, one series per process: the main
process, and each worker process — a worker is (id, pid): a worker re-created with a new pid is a
new process, whose history starts fresh.

A `MemoryTrend` (least-squares slope, first and last reading, the share of samples that rose)
covers a series **after its warm-up**: a process's memory rises while it starts (imports, the
first batches, allocator arenas) and while caches fill. So the first `WARMUP_SAMPLES` readings
of a process never count, nor the first `WARMUP_SHARE` of the time it has been watched: a rise
that stops (a cache that filled) drops out of the trend as the process lives on, while a rise that
goes on (a leak, copy-on-read) stays in it. Trends are computed when asked and kept until the
next sample.

Nothing here trusts the sender: readings are validated on the wire, samples closer together than
`MIN_GAP_S` are dropped, and the series and the number of processes kept are bounded.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

from loadertop import wire
from loadertop.client.document import MemoryTrend, ProcessFigures

HISTORY_S: Final = 1800.0  # memory trends look back this far (docs/contract.md §5: "over minutes")
#: A process's first readings (start-up: imports, fork, the first batches) never count.
WARMUP_SAMPLES: Final = 2
#: Nor the first half of the time it has been watched (caches filling at the start).
WARMUP_SHARE: Final = 0.5
#: The probe samples every few seconds (at most once a second): closer samples are not kept.
MIN_GAP_S: Final = 0.5
MAX_SAMPLES: Final = 720  # per process (an hour at the probe's 5 s)
#: Ended worker processes stay answerable this long (their last figures), up to MAX_PROCESSES.
ENDED_KEEP_S: Final = 120.0
MAX_PROCESSES: Final = 256


@dataclass(frozen=True)
class WorkerResourceView:
    uss_bytes: int | None = None
    pss_bytes: int | None = None
    fds: int | None = None
    threads: int | None = None
    uss_trend: MemoryTrend | None = None
    rss_trend: MemoryTrend | None = None


NO_WORKER_RESOURCES = WorkerResourceView()


class _Series:
    """One process's samples: (received at, figure a, figure b), oldest first; for the main
    process a = rss, b = uss; for a worker a = uss, b = rss."""

    __slots__ = ("first_at", "last_at", "samples", "latest", "latest_full", "_trends")

    def __init__(self, at: float) -> None:
        self.first_at = at
        self.last_at = at
        self.samples: deque[tuple[float, int | None, int | None]] = deque(maxlen=MAX_SAMPLES)
        self.latest: object = None  # the last wire reading (a ResourceReport or WorkerResources)
        self.latest_full: object = None  # ... the last with USS (not read every round)
        self._trends: tuple[MemoryTrend | None, MemoryTrend | None] | None = None

    def add(self, at: float, a: int | None, b: int | None, latest: object,
            full: bool) -> None:
        self.samples.append((at, a, b))
        self.last_at = at
        self.latest = latest
        if full:
            self.latest_full = latest
        self._trends = None
        horizon = at - HISTORY_S
        while self.samples and self.samples[0][0] < horizon:
            self.samples.popleft()

    def trends(self) -> tuple[MemoryTrend | None, MemoryTrend | None]:
        if self._trends is None:
            self._trends = (self._trend(1), self._trend(2))
        return self._trends

    def _trend(self, index: int) -> MemoryTrend | None:
        points = [(s[0], v) for s in self.samples
                  if (v := s[1] if index == 1 else s[2]) is not None]
        return memory_trend(points, self.first_at)


def memory_trend(points: list[tuple[float, int]], first_at: float) -> MemoryTrend | None:
    """The trend of (time, bytes) points, oldest first, of a process first watched at
    `first_at`, after the warm-up; None with fewer than two points left. `points` must be all
    the readings of that figure since `first_at` for `WARMUP_SAMPLES` to mean its first ones
    (once older samples have aged out of the history, they have long been past the warm-up)."""
    if not points:
        return None
    start = first_at + WARMUP_SHARE * (points[-1][0] - first_at)
    kept = [p for i, p in enumerate(points) if i >= WARMUP_SAMPLES and p[0] >= start]
    n = len(kept)
    if n < 2:
        return None
    t0 = kept[0][0]
    xs = [t - t0 for t, _ in kept]
    ys = [float(v) for _, v in kept]
    mean_x = sum(xs) / n
    mean_y = sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    slope = sxy / sxx if sxx > 0 else 0.0
    rises = sum(1 for a, b in zip(ys, ys[1:]) if b > a)
    return MemoryTrend(over_s=round(xs[-1], 3), first_bytes=int(ys[0]), last_bytes=int(ys[-1]),
                       slope_bytes_per_s=round(slope, 3), rising_share=round(rises / (n - 1), 4),
                       samples=n)


class ResourceHistory:
    """The slow readings of one source: `add` each report's, then ask `process` and `worker`."""

    def __init__(self) -> None:
        self.main: _Series | None = None
        self.workers: dict[tuple[int, int], _Series] = {}
        self.last_at: float | None = None
        self.last: wire.ResourceReport | None = None

    def add(self, report: wire.ResourceReport, received_at: float) -> None:
        if self.last_at is not None and received_at - self.last_at < MIN_GAP_S:
            return  # faster than the probe samples: not ours to keep
        self.last_at = received_at
        self.last = report
        if self.main is None:
            self.main = _Series(received_at)
        self.main.add(received_at, report.rss_bytes, report.uss_bytes, report,
                      report.uss_bytes is not None)
        for w in report.workers:
            key = (w.id, w.pid)
            series = self.workers.get(key)
            if series is None:
                series = self.workers[key] = _Series(received_at)
            series.add(received_at, w.uss_bytes, w.rss_bytes, w, w.uss_bytes is not None)
        self._forget_ended(received_at)

    def _forget_ended(self, now: float) -> None:
        ended = [k for k, s in self.workers.items() if now - s.last_at > ENDED_KEEP_S]
        for key in ended:
            del self.workers[key]
        if len(self.workers) > MAX_PROCESSES:
            by_age = sorted(self.workers, key=lambda k: self.workers[k].last_at)
            for key in by_age[:len(self.workers) - MAX_PROCESSES]:
                del self.workers[key]

    def process(self, now: float) -> ProcessFigures:
        main, last = self.main, self.last
        if main is None or last is None or self.last_at is None:
            return ProcessFigures(rss_bytes=None, uss_bytes=None, fds=None, fd_limit=None,
                                  threads=None, rss_trend=None, uss_trend=None, age_s=None)
        rss_trend, uss_trend = main.trends()
        full = main.latest_full
        uss = full.uss_bytes if isinstance(full, wire.ResourceReport) else None
        return ProcessFigures(rss_bytes=last.rss_bytes, uss_bytes=uss,
                              fds=last.fds, fd_limit=last.fd_limit, threads=last.threads,
                              rss_trend=rss_trend, uss_trend=uss_trend,
                              age_s=round(max(0.0, now - self.last_at), 2))

    def worker(self, worker_id: int, pid: int | None) -> WorkerResourceView:
        if pid is not None:
            series = self.workers.get((worker_id, pid))
        else:  # the pid is not known yet: the newest process of that worker id
            candidates = [s for (wid, _), s in self.workers.items() if wid == worker_id]
            series = max(candidates, key=lambda s: s.last_at) if candidates else None
        if series is None:
            return NO_WORKER_RESOURCES
        w, full = series.latest, series.latest_full
        if not isinstance(w, wire.WorkerResources):
            return NO_WORKER_RESOURCES
        uss_trend, rss_trend = series.trends()
        uss = pss = None
        if isinstance(full, wire.WorkerResources):  # USS and PSS: the last round that read them
            uss, pss = full.uss_bytes, full.pss_bytes
        return WorkerResourceView(uss_bytes=uss, pss_bytes=pss, fds=w.fds, threads=w.threads,
                                  uss_trend=uss_trend, rss_trend=rss_trend)
