"""The metrics of CONTRACT §8, built from one `Document` when Prometheus scrapes.

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

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from loadertop.diagnosis import CATEGORIES
from loadertop.document import Document, HistogramFigures, Source

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


def _add_histogram(family: HistogramMetricFamily, labels: tuple[str, ...],
                   histogram: HistogramFigures | None) -> None:
    """One series of `family`, unless the probe sent no histogram or inconsistent figures."""
    buckets = _buckets(histogram) if histogram is not None else None
    if histogram is not None and buckets is not None:
        family.add_metric(labels, buckets, histogram.sum_ms / 1000.0)


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

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        document = self._latest()
        if document is None:
            return iter(())
        return iter(families(document))


def families(document: Document) -> list[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
    """Every metric family of CONTRACT §8 for `document`."""
    batches = CounterMetricFamily(
        "loadertop_batches", "Batches the training loop received from this loader, since its "
        "process began", labels=SOURCE_LABELS)
    wait = HistogramMetricFamily(
        "loadertop_wait_seconds", "The training loop's wait in next() per batch, every batch "
        "counted", labels=SOURCE_LABELS)
    step = HistogramMetricFamily(
        "loadertop_step_seconds", "The training loop's own time between receiving a batch and "
        "asking for the next", labels=SOURCE_LABELS)
    wait_ratio = GaugeMetricFamily(
        "loadertop_wait_ratio", "Share of wall time the training loop waited for data over the "
        "viewer's window (0..1)", labels=SOURCE_LABELS)
    batch_size = GaugeMetricFamily(
        "loadertop_batch_size", "Samples per batch as configured (samples/s = "
        "rate(loadertop_batches_total) * this)", labels=SOURCE_LABELS)
    queue = GaugeMetricFamily(
        "loadertop_queue_batches", "The loader's queue at the latest sample: batches ready for "
        "the loop, requested from workers, and the capacity (num_workers * prefetch_factor)",
        labels=(*SOURCE_LABELS, "state"))
    fetch = HistogramMetricFamily(
        "loadertop_worker_fetch_seconds", "A worker's time per batch getting the items "
        "(collate_fn excluded), every batch counted", labels=WORKER_LABELS)
    worker_up = GaugeMetricFamily(
        "loadertop_worker_up", "1 while the worker process is alive and its source reports; 0 "
        "once it exited or its source is gone", labels=WORKER_LABELS)
    worker_rss = GaugeMetricFamily(
        "loadertop_worker_resident_memory_bytes", "The worker process's resident memory (RSS)",
        labels=WORKER_LABELS)
    worker_cpu = GaugeMetricFamily(
        "loadertop_worker_cpu_ratio", "A worker's CPU time / wall time while producing batches "
        "over the window: near 1 it computes, near 0 it waits (storage, network, locks)",
        labels=WORKER_LABELS)
    bottleneck = GaugeMetricFamily(
        "loadertop_bottleneck", "The source's diagnosis (CONTRACT §4): 1 for the current "
        "category, 0 for every other", labels=(*SOURCE_LABELS, "category"))
    finding = GaugeMetricFamily(
        "loadertop_finding", "A pitfall found live (CONTRACT §5), 1 while listed; worker empty "
        "when about the whole loader, loader empty when about the machine",
        labels=FINDING_LABELS)
    source_up = GaugeMetricFamily(
        "loadertop_source_up", "1 while the source reports; 0 once it is gone or finished (until "
        "the viewer forgets it, 10 minutes later)", labels=SOURCE_LABELS)

    seen: set[tuple[str, str, str, str]] = set()
    for source in document.sources:
        labels = source_labels(source)
        if labels in seen:
            continue
        seen.add(labels)
        up = source.state not in DOWN_STATES
        source_up.add_metric(labels, 1.0 if up else 0.0)
        batches.add_metric(labels, float(source.batches_total))
        _add_histogram(wait, labels, source.wait_histogram)
        _add_histogram(step, labels, source.step_histogram)
        if source.wait_fraction is not None:
            wait_ratio.add_metric(labels, source.wait_fraction)
        if source.config.batch_size is not None:
            batch_size.add_metric(labels, float(source.config.batch_size))
        q = source.queue
        for state, value in zip(QUEUE_STATES, (q.ready, q.in_flight, q.capacity)):
            if value is not None:
                queue.add_metric((*labels, state), float(value))
        category = source.diagnosis.category
        for name in CATEGORIES:
            bottleneck.add_metric((*labels, name), 1.0 if name == category else 0.0)
        workers_seen: set[int] = set()
        for w in source.workers:
            if w.id in workers_seen:
                continue
            workers_seen.add(w.id)
            wlabels = (*labels, str(w.id))
            _add_histogram(fetch, wlabels, w.fetch_histogram)
            if not up:
                worker_up.add_metric(wlabels, 0.0)  # its last reading is no longer news
            elif w.alive is not None:
                worker_up.add_metric(wlabels, 1.0 if w.alive else 0.0)
            if w.rss_bytes is not None and up:
                worker_rss.add_metric(wlabels, float(w.rss_bytes))
            if w.cpu_fraction is not None:
                worker_cpu.add_metric(wlabels, w.cpu_fraction)
        found: set[tuple[str, str, str]] = set()
        for f in source.findings:
            worker = "" if f.worker is None else str(f.worker)
            if (worker, f.kind, f.severity) not in found:
                found.add((worker, f.kind, f.severity))
                finding.add_metric((*labels, worker, f.kind, f.severity), 1.0)
    machine_host = document.system.host if document.system is not None else ""
    machine_found: set[str] = set()
    for f in document.findings:
        if f.source is None and f.kind not in machine_found:
            machine_found.add(f.kind)
            finding.add_metric((machine_host, "", "", "", "", f.kind, f.severity), 1.0)
    return [source_up, batches, wait, step, wait_ratio, batch_size, queue, fetch, worker_up,
            worker_rss, worker_cpu, bottleneck, finding]


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
