"""The metrics of docs/contract.md §8, built from one `Document` when Prometheus scrapes.

A `prometheus_client` custom collector: the registry calls `collect()` on the HTTP server's thread,
which reads the latest document (an immutable object the receive loop replaces whole) and yields
metric families; `prometheus_client` writes the exposition format and escapes label values.

Labels: every per-source metric has `host`, `pid`, `rank` (empty when the source has none, which
Prometheus treats as absent) and `loader` (the source's name). `host` is the trainer's hostname as
the probe read it (`socket.gethostname()`), the value node_exporter reports as
`node_uname_info{nodename}` and the DCGM exporter as `Hostname`: join on it (docs/prometheus.md).

Series per source, bounded whatever the workers and findings (docs/prometheus.md counts them): by
default the workers' figures are one series per source each, their sum (alive workers, RSS, the
fetch histogram) or mean (CPU ratio) — what `sum`/`avg without (worker)` of the per-worker series
would give, so a query written with `sum by`/`avg by` reads the same either way; a finding is one
series per kind; the bottleneck is one series, its current category. `DocumentMetrics(per_worker=
True)` (`--per-worker`) adds the `worker` label: one series per worker, and per worker's finding.
The histograms' buckets: `aggregate.py`.

Everything here came from sockets: two sources that claim the same labels (a hostile or confused
peer can say any host, pid and name) are served once, the first in the document's order, so a
scrape never carries a duplicate series (Prometheus would reject the whole scrape).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from loadertop.client.document import Document, HistogramFigures, Source, WorkerFigures
from loadertop.client.tracker_keys import DOWN_STATES
from loadertop.exporter.aggregate import (
    EXPORTED_LE_MS,
    STEP_LE_MS,
    WorkerFetchTotals,
    rebucketed,
)

MetricFamily = CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily

SOURCE_LABELS = ("host", "pid", "rank", "loader")
QUEUE_STATES = ("ready", "in_flight", "capacity")

_le_cache: dict[tuple[float, ...], tuple[str, ...]] = {}


def _le_labels(le_ms: tuple[float, ...]) -> tuple[str, ...]:
    """The `le` label values of a histogram's bounds (ms in the document, seconds here), the same
    strings for every series so that `sum by (le)` adds them up."""
    labels = _le_cache.get(le_ms)
    if labels is None:
        # The Go client's spelling of a bound (what client_golang writes for the same value).
        labels = (*(floatToGoString(bound / 1000.0)  # type: ignore[no-untyped-call]
                    for bound in le_ms), "+Inf")
        if len(_le_cache) < 16:
            _le_cache[le_ms] = labels
    return labels


def _buckets(histogram: HistogramFigures) -> list[tuple[str, float]] | None:
    """Prometheus's cumulative buckets (`le`, count), None when the figures are inconsistent."""
    if len(histogram.counts) != len(histogram.le_ms) + 1:
        return None
    return list(zip(_le_labels(histogram.le_ms), accumulate(histogram.counts)))


def source_labels(source: Source) -> tuple[str, str, str, str]:
    return (source.host, str(source.pid), "" if source.rank is None else str(source.rank),
            source.name)


class Family:
    """One metric family of docs/contract.md §8: what prometheus_client is told about it.
    `per_worker`: it gains the `worker` label (after the source's) under `--per-worker`."""

    __slots__ = ("index", "name", "kind", "help", "extra", "per_worker")

    def __init__(self, index: int, name: str, kind: str, help: str,
                 extra: tuple[str, ...] = (), per_worker: bool = False) -> None:
        self.index = index  # its place in the exposition
        self.name = name
        self.kind = kind
        self.help = help
        self.extra = extra  # labels after the source's (and the worker's)
        self.per_worker = per_worker

    def labels(self, per_worker: bool) -> tuple[str, ...]:
        worker = ("worker",) if per_worker and self.per_worker else ()
        return (*SOURCE_LABELS, *worker, *self.extra)

    def metric_family(self, per_worker: bool) -> Any:
        """A new, empty prometheus_client family (typed Any: its add_metric's arguments differ
        by kind, and the walk's two sinks call each with its kind's)."""
        kind = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily,
                "histogram": HistogramMetricFamily}[self.kind]
        return kind(self.name, self.help, labels=self.labels(per_worker))


def _family(name: str, kind: str, help: str, extra: tuple[str, ...] = (),
            per_worker: bool = False) -> Family:
    family = Family(len(FAMILIES), name, kind, help, extra, per_worker)
    FAMILIES.append(family)
    return family


FAMILIES: list[Family] = []  # in the exposition's order
SOURCE_UP = _family(
    "loadertop_source_up", "gauge", "1 while the source reports; 0 once it is gone or finished "
    "(until the viewer forgets it, 10 minutes later)")
BATCHES = _family(
    "loadertop_batches", "counter", "Batches the training loop received from this loader, since "
    "its process began")
WAIT = _family(
    "loadertop_wait_seconds", "histogram", "The training loop's wait in next() per batch, every "
    "batch counted")
STEP = _family(
    "loadertop_step_seconds", "histogram", "The training loop's own time between receiving a "
    "batch and asking for the next, every batch counted (count and sum: the mean)")
WAIT_RATIO = _family(
    "loadertop_wait_ratio", "gauge", "Share of wall time the training loop waited for data over "
    "the viewer's window (0..1)")
BATCH_SIZE = _family(
    "loadertop_batch_size", "gauge", "Samples per batch as configured (samples/s = "
    "rate(loadertop_batches_total) * this)")
QUEUE = _family(
    "loadertop_queue_batches", "gauge", "The loader's queue at the latest sample: batches ready "
    "for the loop, requested from workers, and the capacity (num_workers * prefetch_factor)",
    ("state",))
FETCH = _family(
    "loadertop_worker_fetch_seconds", "histogram", "The workers' time per batch getting the "
    "items (collate_fn excluded), every batch of every worker counted (per worker with "
    "--per-worker)", per_worker=True)
WORKER_UP = _family(
    "loadertop_worker_up", "gauge", "The source's workers alive (with --per-worker, per worker: "
    "1 while alive); 0 once they exited or the source is gone or finished", per_worker=True)
WORKER_RSS = _family(
    "loadertop_worker_resident_memory_bytes", "gauge", "The workers' resident memory (RSS), "
    "summed (per worker with --per-worker)", per_worker=True)
WORKER_CPU = _family(
    "loadertop_worker_cpu_ratio", "gauge", "The workers' CPU time / wall time while producing "
    "batches over the window, their mean (per worker with --per-worker): near 1 they compute, "
    "near 0 they wait (storage, network, locks)", per_worker=True)
BOTTLENECK = _family(
    "loadertop_bottleneck", "gauge", "The source's diagnosis (docs/contract.md §4): one series, "
    "1, labelled with the current category", ("category",))
FINDING = _family(
    "loadertop_finding", "gauge", "A pitfall found live (docs/contract.md §5), 1 while listed: one "
    "series per kind (and per worker with --per-worker, worker empty when about the whole "
    "loader); loader empty when about the machine", ("kind", "severity"), per_worker=True)

ValueSink = Callable[[Family, tuple[str, ...], float], None]
HistogramSink = Callable[[Family, tuple[str, ...], HistogramFigures], None]


def _served(histogram: HistogramSink, family: Family, labels: tuple[str, ...],
            figures: HistogramFigures | None, le_ms: tuple[float, ...]) -> None:
    if figures is not None:
        served = rebucketed(figures, le_ms)
        if served is not None:  # inconsistent figures: no series rather than a wrong one
            histogram(family, labels, served)


def _unique(workers: Sequence[WorkerFigures]) -> list[WorkerFigures]:
    """The first of each worker id (a peer may repeat one: a duplicate series voids a scrape)."""
    seen: set[int] = set()
    out = []
    for w in workers:
        if w.id not in seen:
            seen.add(w.id)
            out.append(w)
    return out


class DocumentMetrics:
    """What one exporter serves of each document: the series of docs/contract.md §8, per source
    (default) or per worker too (`per_worker`, `--per-worker`), with the state its sums over
    workers keep from one document to the next (`WorkerFetchTotals`)."""

    def __init__(self, per_worker: bool = False) -> None:
        self.per_worker = per_worker
        self.fetch_totals = WorkerFetchTotals()

    def metric_family(self, family: Family) -> Any:
        return family.metric_family(self.per_worker)

    def walk(self, document: Document, value: ValueSink, histogram: HistogramSink) -> None:
        """Every series of docs/contract.md §8 for `document`, in the exposition's order within
        each family: `value(family, label values, value)` for a counter's or gauge's,
        `histogram(family, label values, figures)` for a histogram's (in its served buckets).
        The one place that maps the document to metrics: prometheus_client's families
        (`families`) and the cached writer (`exposition.py`) both read it."""
        per_worker = self.per_worker
        totals = {} if per_worker else self.fetch_totals.of(document)
        seen: set[tuple[str, str, str, str]] = set()
        for source in document.sources:
            labels = source_labels(source)
            if labels in seen:
                continue
            seen.add(labels)
            up = source.state not in DOWN_STATES
            value(SOURCE_UP, labels, 1.0 if up else 0.0)
            value(BATCHES, labels, float(source.batches_total))
            _served(histogram, WAIT, labels, source.wait_histogram, EXPORTED_LE_MS)
            _served(histogram, STEP, labels, source.step_histogram, STEP_LE_MS)
            if source.wait_fraction is not None:
                value(WAIT_RATIO, labels, source.wait_fraction)
            if source.config.batch_size is not None:
                value(BATCH_SIZE, labels, float(source.config.batch_size))
            q = source.queue
            for state, count in zip(QUEUE_STATES, (q.ready, q.in_flight, q.capacity)):
                if count is not None:
                    value(QUEUE, (*labels, state), float(count))
            value(BOTTLENECK, (*labels, source.diagnosis.category), 1.0)
            workers = _unique(source.workers)
            if per_worker:
                for w in workers:
                    _worker(value, histogram, (*labels, str(w.id)), [w], up, w.fetch_histogram)
            elif workers:
                _worker(value, histogram, labels, workers, up, totals.get(source.id))
            found: set[tuple[str, str, str]] = set()
            for f in source.findings:
                worker = "" if f.worker is None else str(f.worker)
                key = (worker, f.kind, f.severity) if per_worker else ("", f.kind, "")
                if key not in found:
                    found.add(key)
                    who = (worker,) if per_worker else ()
                    value(FINDING, (*labels, *who, f.kind, f.severity), 1.0)
        machine_host = document.system.host if document.system is not None else ""
        machine = (machine_host, "", "", "", *(("",) if per_worker else ()))
        machine_found: set[str] = set()
        for f in document.findings:
            if f.source is None and f.kind not in machine_found:
                machine_found.add(f.kind)
                value(FINDING, (*machine, f.kind, f.severity), 1.0)

    def families(self, document: Document) -> list[MetricFamily]:
        """Every metric family of docs/contract.md §8 for `document`, as prometheus_client's
        objects."""
        made = [self.metric_family(family) for family in FAMILIES]

        def value(family: Family, labels: tuple[str, ...], v: float) -> None:
            made[family.index].add_metric(labels, v)

        def histogram(family: Family, labels: tuple[str, ...], figures: HistogramFigures) -> None:
            buckets = _buckets(figures)
            if buckets is not None:
                made[family.index].add_metric(labels, buckets, figures.sum_ms / 1000.0)

        self.walk(document, value, histogram)
        return made


def _worker(value: ValueSink, histogram: HistogramSink, labels: tuple[str, ...],
            workers: Sequence[WorkerFigures], up: bool, fetches: HistogramFigures | None) -> None:
    """The workers' series under `labels`: one worker's (with --per-worker), or every worker's
    summed (alive, RSS, fetches) and averaged (CPU ratio)."""
    _served(histogram, FETCH, labels, fetches, EXPORTED_LE_MS)
    alive = [w.alive for w in workers if w.alive is not None]
    if not up:
        value(WORKER_UP, labels, 0.0)  # their last readings are no longer news
    elif alive:
        value(WORKER_UP, labels, float(sum(alive)))
    rss = [w.rss_bytes for w in workers if w.rss_bytes is not None]
    if rss and up:
        value(WORKER_RSS, labels, float(sum(rss)))
    cpu = [w.cpu_fraction for w in workers if w.cpu_fraction is not None]
    if cpu:
        value(WORKER_CPU, labels, sum(cpu) / len(cpu))


class DocumentCollector(Collector):
    """Collects the metrics of the document `latest()` returns (None: none built yet)."""

    def __init__(self, latest: Callable[[], Document | None],
                 metrics: DocumentMetrics | None = None) -> None:
        self._latest = latest
        self._metrics = metrics or DocumentMetrics()

    def describe(self) -> list[object]:
        # The metrics depend on what is discovered: nothing to declare up front (and not letting
        # the registry call collect() at registration, before the first document).
        return []

    def collect(self) -> Iterator[MetricFamily]:
        document = self._latest()
        if document is None:
            return iter(())
        return iter(self._metrics.families(document))


class ExporterCollector(Collector):
    """The exporter's own figures: what it received and refused (its viewer status)."""

    def __init__(self, latest: Callable[[], Document | None]) -> None:
        self._latest = latest

    def describe(self) -> list[object]:
        return []

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        document = self._latest()
        if document is None:
            return iter(())
        viewer = document.viewer
        received = CounterMetricFamily(
            "loadertop_exporter_received_messages", "Messages the exporter received from "
            "instrumented processes")
        received.add_metric((), float(viewer.received))
        rejected = CounterMetricFamily(
            "loadertop_exporter_rejected_messages", "Messages refused: malformed, too large, "
            "foreign, or of another schema version", labels=("reason",))
        rejected.add_metric(("malformed",), float(viewer.bad_messages))
        rejected.add_metric(("wrong_version",), float(viewer.wrong_version))
        endpoints = GaugeMetricFamily(
            "loadertop_exporter_endpoints", "Endpoints the exporter is subscribed to (discovered "
            "and given)")
        endpoints.add_metric((), float(len(viewer.endpoints)))
        return iter((received, rejected, endpoints))
