"""The metrics of docs/contract.md §8, built from one `Document` when Prometheus scrapes.

A `prometheus_client` custom collector: the registry calls `collect()` on the HTTP server's thread,
which reads the latest document (an immutable object the receive loop replaces whole) and yields
metric families; `prometheus_client` writes the exposition format and escapes label values.

Labels: every per-source metric has `host`, `pid`, `rank` (empty when the source has none, which
Prometheus treats as absent) and `loader` (the source's name); per-worker metrics add `worker`
(the worker's id, stable across epochs). `host` is the trainer's hostname as the probe read it
(`socket.gethostname()`), the value node_exporter reports as `node_uname_info{nodename}` and the
DCGM exporter as `Hostname`: join on it (docs/prometheus.md).

Everything here came from sockets: two sources that claim the same labels (a hostile or confused
peer can say any host, pid and name) are served once, the first in the document's order, so a
scrape never carries a duplicate series (Prometheus would reject the whole scrape).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from loadertop.client.document import Document, HistogramFigures, Source
from loadertop.diagnosis import CATEGORIES

MetricFamily = CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily

SOURCE_LABELS = ("host", "pid", "rank", "loader")
WORKER_LABELS = (*SOURCE_LABELS, "worker")
FINDING_LABELS = (*WORKER_LABELS, "kind", "severity")
QUEUE_STATES = ("ready", "in_flight", "capacity")
DOWN_STATES = ("gone", "finished")  # a source in these states is `loadertop_source_up 0`

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


class DocumentCollector(Collector):
    """Collects the metrics of the document `latest()` returns (None: none built yet)."""

    def __init__(self, latest: Callable[[], Document | None]) -> None:
        self._latest = latest

    def describe(self) -> list[object]:
        # The metrics depend on what is discovered: nothing to declare up front (and not letting
        # the registry call collect() at registration, before the first document).
        return []

    def collect(self) -> Iterator[MetricFamily]:
        document = self._latest()
        if document is None:
            return iter(())
        return iter(families(document))


class Family:
    """One metric family of docs/contract.md §8: what prometheus_client is told about it."""

    __slots__ = ("index", "name", "kind", "help", "labels")

    def __init__(self, index: int, name: str, kind: str, help: str,
                 labels: tuple[str, ...] = SOURCE_LABELS) -> None:
        self.index = index  # its place in the exposition
        self.name = name
        self.kind = kind
        self.help = help
        self.labels = labels

    def metric_family(self) -> Any:
        """A new, empty prometheus_client family (typed Any: its add_metric's arguments differ
        by kind, and the walk's two sinks call each with its kind's)."""
        kind = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily,
                "histogram": HistogramMetricFamily}[self.kind]
        return kind(self.name, self.help, labels=self.labels)


def _family(name: str, kind: str, help: str, labels: tuple[str, ...] = SOURCE_LABELS) -> Family:
    family = Family(len(FAMILIES), name, kind, help, labels)
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
    "batch and asking for the next")
WAIT_RATIO = _family(
    "loadertop_wait_ratio", "gauge", "Share of wall time the training loop waited for data over "
    "the viewer's window (0..1)")
BATCH_SIZE = _family(
    "loadertop_batch_size", "gauge", "Samples per batch as configured (samples/s = "
    "rate(loadertop_batches_total) * this)")
QUEUE = _family(
    "loadertop_queue_batches", "gauge", "The loader's queue at the latest sample: batches ready "
    "for the loop, requested from workers, and the capacity (num_workers * prefetch_factor)",
    (*SOURCE_LABELS, "state"))
FETCH = _family(
    "loadertop_worker_fetch_seconds", "histogram", "A worker's time per batch getting the items "
    "(collate_fn excluded), every batch counted", WORKER_LABELS)
WORKER_UP = _family(
    "loadertop_worker_up", "gauge", "1 while the worker process is alive and its source "
    "reports; 0 once it exited or its source is gone", WORKER_LABELS)
WORKER_RSS = _family(
    "loadertop_worker_resident_memory_bytes", "gauge", "The worker process's resident memory "
    "(RSS)", WORKER_LABELS)
WORKER_CPU = _family(
    "loadertop_worker_cpu_ratio", "gauge", "A worker's CPU time / wall time while producing "
    "batches over the window: near 1 it computes, near 0 it waits (storage, network, locks)",
    WORKER_LABELS)
BOTTLENECK = _family(
    "loadertop_bottleneck", "gauge", "The source's diagnosis (docs/contract.md §4): 1 for the current "
    "category, 0 for every other", (*SOURCE_LABELS, "category"))
FINDING = _family(
    "loadertop_finding", "gauge", "A pitfall found live (docs/contract.md §5), 1 while listed; worker "
    "empty when about the whole loader, loader empty when about the machine", FINDING_LABELS)

ValueSink = Callable[[Family, tuple[str, ...], float], None]
HistogramSink = Callable[[Family, tuple[str, ...], HistogramFigures], None]


def walk(document: Document, value: ValueSink, histogram: HistogramSink) -> None:
    """Every series of docs/contract.md §8 for `document`, in the exposition's order within each family:
    `value(family, label values, value)` for a counter's or gauge's, `histogram(family, label
    values, figures)` for a histogram's. The one place that maps the document to metrics: the
    families below and the cached writer (`exposition.py`) both read it."""
    seen: set[tuple[str, str, str, str]] = set()
    for source in document.sources:
        labels = source_labels(source)
        if labels in seen:
            continue
        seen.add(labels)
        up = source.state not in DOWN_STATES
        value(SOURCE_UP, labels, 1.0 if up else 0.0)
        value(BATCHES, labels, float(source.batches_total))
        if source.wait_histogram is not None:
            histogram(WAIT, labels, source.wait_histogram)
        if source.step_histogram is not None:
            histogram(STEP, labels, source.step_histogram)
        if source.wait_fraction is not None:
            value(WAIT_RATIO, labels, source.wait_fraction)
        if source.config.batch_size is not None:
            value(BATCH_SIZE, labels, float(source.config.batch_size))
        q = source.queue
        for state, count in zip(QUEUE_STATES, (q.ready, q.in_flight, q.capacity)):
            if count is not None:
                value(QUEUE, (*labels, state), float(count))
        category = source.diagnosis.category
        for name in CATEGORIES:
            value(BOTTLENECK, (*labels, name), 1.0 if name == category else 0.0)
        workers_seen: set[int] = set()
        for w in source.workers:
            if w.id in workers_seen:
                continue
            workers_seen.add(w.id)
            wlabels = (*labels, str(w.id))
            if w.fetch_histogram is not None:
                histogram(FETCH, wlabels, w.fetch_histogram)
            if not up:
                value(WORKER_UP, wlabels, 0.0)  # its last reading is no longer news
            elif w.alive is not None:
                value(WORKER_UP, wlabels, 1.0 if w.alive else 0.0)
            if w.rss_bytes is not None and up:
                value(WORKER_RSS, wlabels, float(w.rss_bytes))
            if w.cpu_fraction is not None:
                value(WORKER_CPU, wlabels, w.cpu_fraction)
        found: set[tuple[str, str, str]] = set()
        for f in source.findings:
            worker = "" if f.worker is None else str(f.worker)
            if (worker, f.kind, f.severity) not in found:
                found.add((worker, f.kind, f.severity))
                value(FINDING, (*labels, worker, f.kind, f.severity), 1.0)
    machine_host = document.system.host if document.system is not None else ""
    machine_found: set[str] = set()
    for f in document.findings:
        if f.source is None and f.kind not in machine_found:
            machine_found.add(f.kind)
            value(FINDING, (machine_host, "", "", "", "", f.kind, f.severity), 1.0)


def families(document: Document) -> list[MetricFamily]:
    """Every metric family of docs/contract.md §8 for `document`, as prometheus_client's objects."""
    made = [family.metric_family() for family in FAMILIES]

    def value(family: Family, labels: tuple[str, ...], v: float) -> None:
        made[family.index].add_metric(labels, v)

    def histogram(family: Family, labels: tuple[str, ...], figures: HistogramFigures) -> None:
        buckets = _buckets(figures)
        if buckets is not None:  # inconsistent figures: no series rather than a wrong one
            made[family.index].add_metric(labels, buckets, figures.sum_ms / 1000.0)

    walk(document, value, histogram)
    return made


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
