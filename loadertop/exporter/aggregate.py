"""What `loadertop export` makes of the probe's histograms and of a source's workers by default
(docs/contract.md §8), so that a source costs a few dozen series however many workers it has.

- **Fewer buckets.** The probe counts every wait, step and fetch in 19 fixed buckets
  (`wire.HISTOGRAM_BOUNDS_NS`, 50 µs … 60 s). The exporter serves the waits and fetches in
  `EXPORTED_LE_MS`'s 8, a subset of the probe's bounds, so that every count served is exact (a
  bucket's count is the sum of the probe's buckets it spans); and the loop's steps as a count
  and a sum alone (`STEP_LE_MS`: the mean step and, beside the wait's sum, the share of time
  waited over any range; no question of docs/prometheus.md asks for a step's quantile).
- **One fetch histogram per source.** The workers' fetch histograms summed into one
  (`WorkerFetchTotals`), which `--per-worker` serves per worker instead. Prometheus reads a
  decrease of a cumulative count as a restart and counts the whole new value again, so the sum
  is kept from ever going down: a worker that leaves the report (`num_workers` lowered by
  `run --autotune`, or a re-created loader with fewer workers) keeps its counts in it, and a
  worker whose counts start over adds its old ones to those kept.

No prometheus_client here: figures in, figures out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from loadertop.client.document import Document, HistogramFigures, WorkerFigures

#: The upper bounds (ms) of the buckets the waits and fetches are served in: a 1-5 series from 1
#: ms (a loop that does not wait: a batch handed over from a full queue) to 5 s (a stall, an
#: epoch's first batch); each one of the probe's bounds.
EXPORTED_LE_MS: Final[tuple[float, ...]] = (1.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0)
#: The loop's steps: no bound, only the +Inf bucket, `_count` and `_sum`.
STEP_LE_MS: Final[tuple[float, ...]] = ()
#: Worker ids kept per source (a peer can send any id; a DataLoader has a few dozen at most).
MAX_WORKER_IDS: Final = 1024

_plans: dict[tuple[tuple[float, ...], tuple[float, ...]], tuple[int, ...] | None] = {}


def _plan(have: tuple[float, ...], want: tuple[float, ...]) -> tuple[int, ...] | None:
    """For each bound of `want` (ascending), the index of the same bound in `have` (to the µs);
    None when one of them is not there."""
    key = (have, want)
    if key in _plans:
        return _plans[key]
    where = {round(bound * 1000): i for i, bound in enumerate(have)}
    found = [where.get(round(bound * 1000)) for bound in want]
    plan: tuple[int, ...] | None = None
    if all(i is not None for i in found):
        indices = tuple(i for i in found if i is not None)
        if list(indices) == sorted(set(indices)):
            plan = indices
    if len(_plans) < 16:
        _plans[key] = plan
    return plan


def rebucketed(figures: HistogramFigures, le_ms: tuple[float, ...]) -> HistogramFigures | None:
    """`figures` counted in the buckets of `le_ms` (a subset of its bounds); None when its counts
    are inconsistent or one of `le_ms` is not among its bounds (no series rather than a wrong
    one)."""
    counts = figures.counts
    if len(counts) != len(figures.le_ms) + 1:
        return None
    if figures.le_ms == le_ms:
        return figures
    plan = _plan(figures.le_ms, le_ms)
    if plan is None:
        return None
    merged = []
    start = 0
    for end in plan:
        merged.append(sum(counts[start:end + 1]))
        start = end + 1
    merged.append(sum(counts[start:]))
    return HistogramFigures(le_ms=le_ms, counts=tuple(merged), count=figures.count,
                            sum_ms=figures.sum_ms)


class _SourceFetches:
    """One source's workers' latest fetch histograms, by worker id, and the counts kept from
    workers whose counts started over."""

    __slots__ = ("le_ms", "latest", "kept_counts", "kept_sum_ms")

    def __init__(self) -> None:
        self.le_ms: tuple[float, ...] | None = None
        self.latest: dict[int, HistogramFigures] = {}
        self.kept_counts: list[int] | None = None
        self.kept_sum_ms = 0.0

    def _restart(self, le_ms: tuple[float, ...]) -> None:
        self.le_ms = le_ms
        self.latest = {}
        self.kept_counts = None
        self.kept_sum_ms = 0.0

    def _keep(self, figures: HistogramFigures) -> None:
        if self.kept_counts is None:
            self.kept_counts = list(figures.counts)
        else:
            self.kept_counts = [a + b for a, b in zip(self.kept_counts, figures.counts)]
        self.kept_sum_ms += figures.sum_ms

    def add(self, workers: Iterable[WorkerFigures]) -> HistogramFigures | None:
        """The workers' latest histograms taken in; their sum since this source was first seen."""
        seen: set[int] = set()
        for w in workers:
            figures = w.fetch_histogram
            if w.id in seen or figures is None or len(figures.counts) != len(figures.le_ms) + 1:
                continue
            seen.add(w.id)
            if figures.le_ms != self.le_ms:  # another layout (never within one version): anew
                self._restart(figures.le_ms)
            before = self.latest.get(w.id)
            if before is None and len(self.latest) >= MAX_WORKER_IDS:
                continue
            if before is not None and figures.count < before.count:
                self._keep(before)  # its counts started over: the old ones stay in the sum
            self.latest[w.id] = figures
        if self.le_ms is None or not self.latest:
            return None
        columns = zip(*(figures.counts for figures in self.latest.values()))
        counts = [sum(column) for column in columns]
        sum_ms = sum(figures.sum_ms for figures in self.latest.values()) + self.kept_sum_ms
        if self.kept_counts is not None:
            counts = [a + b for a, b in zip(counts, self.kept_counts)]
        return HistogramFigures(le_ms=self.le_ms, counts=tuple(counts), count=sum(counts),
                                sum_ms=sum_ms)


class WorkerFetchTotals:
    """Per source (by id), its workers' fetch histograms summed, never decreasing while the
    source stays in the documents (one that leaves them is forgotten).

    `of(document)` computes them once per document (kept for the same document object), so
    that the writer of the scrape's text and prometheus_client's reference for the same
    document read the same sums; a document older than the last one (by `taken_at`) reads the
    last one's sums rather than taking its counts for workers that started over. Not
    thread-safe: the exposition calls it under its lock."""

    def __init__(self) -> None:
        self._document: Document | None = None
        self._totals: dict[str, HistogramFigures] = {}
        self._sources: dict[str, _SourceFetches] = {}

    def of(self, document: Document) -> dict[str, HistogramFigures]:
        last = self._document
        if document is not last and (last is None or document.taken_at >= last.taken_at):
            sources: dict[str, _SourceFetches] = {}
            totals: dict[str, HistogramFigures] = {}
            for source in document.sources:
                fetches = sources.get(source.id) or self._sources.get(source.id) or _SourceFetches()
                sources[source.id] = fetches
                total = fetches.add(source.workers)
                if total is not None:
                    totals[source.id] = total
            self._sources, self._totals, self._document = sources, totals, document
        return self._totals
