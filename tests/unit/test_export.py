"""`loadertop export` (issue 13, docs/contract.md §8): the collector's output from known model states,
written by prometheus_client and parsed back with its own text parser; hostile label values;
the listen address; the HTTP server over a real socket; the command's one-line errors.
Against a real Prometheus server: tests/functional/test_export_prometheus.py."""

from __future__ import annotations

import inspect
import socket
import urllib.error
import urllib.request

import msgspec
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from loadertop import cli, wire
from loadertop.client.document import Document, Finding, HistogramFigures
from loadertop.client.model import Model
from loadertop.exporter import exposition
from loadertop.exporter.aggregate import EXPORTED_LE_MS, STEP_LE_MS
from loadertop.exporter.collector import DocumentMetrics, ExporterCollector
from loadertop.exporter.exposition import Exposition, SeriesWriter, reference
from loadertop.exporter.server import ListenError, MetricsServer, parse_listen
from loadertop.findings import MACHINE_KINDS, SOURCE_KINDS

import fakes
from fakes import (
    T0,
    bad_frames_doc,
    disconnected_doc,
    findings_multi_source_doc,
    finished_doc,
    healthy_doc,
    killed_worker_doc,
    loader_report,
    pitfalls_doc,
    same_name_doc,
    shm_low_doc,
)


def scrape(doc: Document | None, per_worker: bool = False) -> str:
    """What the server's /metrics would serve for `doc` (its Exposition, without the process
    collector, whose figures move)."""
    others = CollectorRegistry(auto_describe=False)
    others.register(ExporterCollector(lambda: doc))
    return Exposition(others, lambda: doc, metrics=DocumentMetrics(per_worker),
                      warn=pytest.fail).body(False).decode()


def parsed(doc: Document | None, per_worker: bool = False) -> dict:
    """{family name: family} as Prometheus's text parser reads the exposition back."""
    return {f.name: f for f in text_string_to_metric_families(scrape(doc, per_worker))}


def samples(families: dict, name: str, **labels: str) -> list:
    """The samples named `name` (a family's sample: `_bucket`, `_total`, …) whose labels
    include `labels`."""
    family = families[name.removesuffix("_total").removesuffix("_bucket").removesuffix("_count")
                      .removesuffix("_sum")]
    return [s for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def value(families: dict, name: str, **labels: str) -> float:
    found = samples(families, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0].value


def source_labels(src) -> dict[str, str]:
    return {"host": src.host, "pid": str(src.pid), "rank": "" if src.rank is None else str(src.rank),
            "loader": src.name}


def cumulative_at(figures, bounds_ms) -> list[int]:
    """The probe's counts of `figures` at or below each of `bounds_ms`, then all of them."""
    out = [sum(c for le, c in zip(figures.le_ms, figures.counts) if le <= bound)
           for bound in bounds_ms]
    return [*out, sum(figures.counts)]


# --------------------------------------------------------------------------- one healthy source
def test_a_healthy_source_in_every_metric():
    doc = healthy_doc()
    fam = parsed(doc)
    (src,) = doc.sources
    labels = source_labels(src)
    assert value(fam, "loadertop_source_up", **labels) == 1.0
    assert value(fam, "loadertop_batches_total", **labels) == src.batches_total
    assert fam["loadertop_batches"].type == "counter"
    assert value(fam, "loadertop_wait_ratio", **labels) == src.wait_fraction
    assert value(fam, "loadertop_batch_size", **labels) == 64
    for state, figure in (("ready", src.queue.ready), ("in_flight", src.queue.in_flight),
                          ("capacity", src.queue.capacity)):
        assert value(fam, "loadertop_queue_batches", state=state, **labels) == figure
    # the workers: one series per source, what sum / avg without (worker) would give
    workers = src.workers
    assert len(workers) == 4
    assert value(fam, "loadertop_worker_up", **labels) == 4.0
    assert value(fam, "loadertop_worker_resident_memory_bytes", **labels) == sum(
        w.rss_bytes for w in workers)
    assert value(fam, "loadertop_worker_cpu_ratio", **labels) == pytest.approx(
        sum(w.cpu_fraction for w in workers) / 4)
    assert value(fam, "loadertop_worker_fetch_seconds_count", **labels) == sum(
        w.fetch_histogram.count for w in workers)
    assert value(fam, "loadertop_worker_fetch_seconds_sum", **labels) == pytest.approx(
        sum(w.fetch_histogram.sum_ms for w in workers) / 1e3)
    assert not any("worker" in s.labels for f in fam.values() for s in f.samples)
    # the own figures: what this viewer received
    assert value(fam, "loadertop_exporter_received_messages_total") == doc.viewer.received


def test_per_worker_every_worker_in_its_own_series():
    doc = healthy_doc()
    fam = parsed(doc, per_worker=True)
    (src,) = doc.sources
    labels = source_labels(src)
    for w in src.workers:
        wl = {**labels, "worker": str(w.id)}
        assert value(fam, "loadertop_worker_up", **wl) == 1.0
        assert value(fam, "loadertop_worker_resident_memory_bytes", **wl) == w.rss_bytes
        assert value(fam, "loadertop_worker_cpu_ratio", **wl) == w.cpu_fraction
        assert w.fetch_histogram is not None
        assert value(fam, "loadertop_worker_fetch_seconds_count", **wl) == w.fetch_histogram.count
        buckets = [b.value for b in samples(fam, "loadertop_worker_fetch_seconds_bucket", **wl)]
        assert buckets == cumulative_at(w.fetch_histogram, EXPORTED_LE_MS)
    assert len(samples(fam, "loadertop_worker_up", **labels)) == 4
    # the per-source series are the same either way
    default = parsed(doc)
    for name in ("loadertop_source_up", "loadertop_batches_total", "loadertop_wait_seconds_count",
                 "loadertop_wait_ratio"):
        assert value(fam, name, **labels) == value(default, name, **labels)


def test_the_waits_and_fetches_in_eight_buckets_the_steps_as_count_and_sum():
    doc = healthy_doc()
    (src,) = doc.sources
    fam = parsed(doc)
    labels = source_labels(src)
    assert [b / 1e6 for b in wire.HISTOGRAM_BOUNDS_NS if b / 1e6 in EXPORTED_LE_MS] == list(
        EXPORTED_LE_MS)  # each served bound is one of the probe's: every count exact
    for name, histogram in (("loadertop_wait_seconds", src.wait_histogram),
                            ("loadertop_step_seconds", src.step_histogram)):
        assert histogram is not None and histogram.count > 0
        assert fam[name].type == "histogram"
        buckets = samples(fam, f"{name}_bucket", **labels)
        bounds = [float(b.labels["le"]) for b in buckets]
        served = EXPORTED_LE_MS if name == "loadertop_wait_seconds" else STEP_LE_MS
        assert bounds == [*(b / 1e3 for b in served), float("inf")]
        assert [b.value for b in buckets] == cumulative_at(histogram, served)
        assert value(fam, f"{name}_count", **labels) == histogram.count
        assert value(fam, f"{name}_sum", **labels) == pytest.approx(histogram.sum_ms / 1e3)
    assert [float(b.labels["le"]) for b in samples(fam, "loadertop_wait_seconds_bucket")][:8] == [
        0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]


def test_the_bottleneck_is_one_series_naming_the_category():
    for doc in (healthy_doc(), pitfalls_doc(), killed_worker_doc(), same_name_doc()):
        fam = parsed(doc)
        for src in doc.sources:
            got = samples(fam, "loadertop_bottleneck", **source_labels(src))
            assert [(s.labels["category"], s.value) for s in got] == [(src.diagnosis.category, 1.0)]


# --------------------------------------------------------------------------- the bound
SEVERITY = {"worker_hung": "critical", "loop_hung": "critical", "worker_died": "critical",
            "epoch_start_slow": "info"}


def crowded_doc(workers: int = 8) -> Document:
    """A source with `workers` workers and every finding a source can have at once, each worker's
    kinds on every worker; and the machine's findings."""
    doc = fakes._one([fakes.LoaderSim(workers=[fakes.WorkerSim() for _ in range(workers)])],
                     [fakes.MachineSim()])
    (src,) = doc.sources
    about_workers = ("worker_hung", "worker_died", "slow_worker", "copy_on_read", "memory_growth",
                     "fd_low")

    def finding(kind, source, worker):
        return Finding(kind=kind, severity=SEVERITY.get(kind, "warning"), source=source,
                       worker=worker, since=T0, summary="s", evidence=(), advice=(), stack=None)

    found = [finding(kind.KIND, src.id, None) for kind in SOURCE_KINDS]
    found += [finding(kind, src.id, w) for kind in about_workers for w in range(workers)]
    machine = [finding(kind.KIND, None, None) for kind in MACHINE_KINDS]
    src = msgspec.structs.replace(src, findings=tuple(found))
    return msgspec.structs.replace(doc, sources=(src,), findings=(*found, *machine))


def series_of(text: str, src) -> int:
    """The series (sample lines) of `src` in an exposition."""
    labels = source_labels(src)
    return sum(1 for f in text_string_to_metric_families(text) for s in f.samples
               if all(s.labels.get(k) == v for k, v in labels.items()))


def test_a_source_with_8_workers_and_every_finding_is_47_series():
    """docs/prometheus.md's count: 8 gauges (up, batches, wait ratio, batch size, the queue's 3),
    the bottleneck, 3 of the workers (up, RSS, CPU), the wait and fetch histograms (8 buckets,
    +Inf, count, sum: 11 each), the steps' (+Inf, count, sum) and one per finding kind."""
    doc = crowded_doc(8)
    (src,) = doc.sources
    assert len(src.workers) == 8 and {f.kind for f in src.findings} == {
        k.KIND for k in SOURCE_KINDS}
    expected = 7 + 1 + 3 + 2 * (len(EXPORTED_LE_MS) + 3) + 3 + len(SOURCE_KINDS)
    assert expected == 47
    assert series_of(scrape(doc), src) == expected <= 50
    # and as many with 64 workers; per worker, many more
    doc64 = crowded_doc(64)
    assert series_of(scrape(doc64), doc64.sources[0]) == expected
    assert series_of(scrape(doc, per_worker=True), src) > 8 * (len(EXPORTED_LE_MS) + 6)
    # the machine's own: one series per kind, its host and no loader
    machine = [s for s in samples(parsed(doc), "loadertop_finding") if s.labels["loader"] == ""]
    assert len(machine) == len(MACHINE_KINDS)


# --------------------------------------------------------------------------- lifecycle
@pytest.mark.parametrize("per_worker", [False, True])
@pytest.mark.parametrize("make, state", [(finished_doc, "finished"), (killed_worker_doc, "finished"),
                                         (disconnected_doc, "gone")])
def test_a_finished_or_gone_source_is_down_with_its_workers(make, state, per_worker):
    doc = make()
    (src,) = doc.sources
    assert src.state == state
    fam = parsed(doc, per_worker)
    labels = source_labels(src)
    assert value(fam, "loadertop_source_up", **labels) == 0.0
    assert value(fam, "loadertop_batches_total", **labels) == src.batches_total  # kept
    ups = samples(fam, "loadertop_worker_up", **labels)
    assert len(ups) == (len(src.workers) if per_worker else 1)
    assert all(s.value == 0.0 for s in ups)
    assert not samples(fam, "loadertop_worker_resident_memory_bytes", **labels)


def test_a_forgotten_source_leaves_the_metrics():
    model = Model()
    model.ingest(loader_report(sent_at=T0), T0)
    assert samples(parsed(model.advance(T0 + 1)), "loadertop_source_up")
    fam = parsed(model.advance(T0 + 601))  # FORGET_AFTER_S later
    assert "loadertop_source_up" not in fam or not samples(fam, "loadertop_source_up")


def test_no_document_yet_serves_nothing_of_ours():
    assert scrape(None) == ""


def test_several_sources_and_ranks_are_told_apart():
    doc = same_name_doc()
    fam = parsed(doc)
    assert len(doc.sources) == 2
    pids = {s.labels["pid"] for s in samples(fam, "loadertop_source_up")}
    assert pids == {"1111", "2222"}


# --------------------------------------------------------------------------- the fetches summed
def _with_workers(doc: Document, fetches: dict[int, list[int]]) -> Document:
    """`doc` whose one source has the workers of `fetches`: worker id -> its probe's counts."""
    (src,) = doc.sources
    template = src.workers[0]
    le_ms = template.fetch_histogram.le_ms
    workers = tuple(msgspec.structs.replace(
        template, id=wid, fetch_histogram=HistogramFigures(
            le_ms=le_ms, counts=tuple(counts), count=sum(counts), sum_ms=float(sum(counts))))
        for wid, counts in fetches.items())
    return msgspec.structs.replace(doc, sources=(msgspec.structs.replace(src, workers=workers),))


def test_the_summed_fetches_never_go_down_when_workers_leave_or_start_over():
    """Prometheus reads a decrease of a cumulative count as a restart: a worker that leaves the
    report (num_workers lowered), comes back, or whose counts start over must not make the sum
    fall."""
    base = healthy_doc()
    n = len(wire.HISTOGRAM_BOUNDS_NS) + 1

    def counts(k: int) -> list[int]:
        return [k] * n

    steps = [
        ({0: counts(10), 1: counts(10), 2: counts(10), 3: counts(10)}, 40),
        ({0: counts(12), 1: counts(12)}, 12 + 12 + 10 + 10),  # workers 2 and 3 left
        ({0: counts(13), 1: counts(13), 2: counts(11), 3: counts(10)}, 13 + 13 + 11 + 10),  # back
        ({0: counts(1), 1: counts(14), 2: counts(11), 3: counts(10)}, 13 + 1 + 14 + 11 + 10),  # 0 anew
        ({0: counts(2), 1: counts(14), 2: counts(11), 3: counts(10)}, 13 + 2 + 14 + 11 + 10),
    ]
    metrics = DocumentMetrics()
    writer = SeriesWriter(metrics)
    (src,) = base.sources
    labels = source_labels(src)
    for fetches, per_bucket in steps:
        doc = _with_workers(base, fetches)
        text = writer.write(doc)
        assert text == reference(doc, metrics)
        fam = {f.name: f for f in text_string_to_metric_families(text.decode())}
        assert value(fam, "loadertop_worker_fetch_seconds_count", **labels) == per_bucket * n
        assert value(fam, "loadertop_worker_fetch_seconds_sum", **labels) == per_bucket * n / 1e3
    # a fresh exporter (a restart: Prometheus sees the drop as one) starts from what the workers
    # report now
    fam = {f.name: f for f in text_string_to_metric_families(reference(doc).decode())}
    assert value(fam, "loadertop_worker_fetch_seconds_count", **labels) == (2 + 14 + 11 + 10) * n


def test_an_older_document_written_late_does_not_count_the_workers_again():
    """Two scrapers racing: the exposition reads the latest document under its lock, and the sums
    over workers ignore a document older than the last one (its lower counts are not workers
    starting over)."""
    base = healthy_doc()
    n = len(wire.HISTOGRAM_BOUNDS_NS) + 1
    older = _with_workers(base, {0: [5] * n, 1: [5] * n})
    newer = msgspec.structs.replace(_with_workers(base, {0: [9] * n, 1: [9] * n}),
                                    taken_at=base.taken_at + 1)
    later = msgspec.structs.replace(_with_workers(base, {0: [10] * n, 1: [10] * n}),
                                    taken_at=base.taken_at + 2)
    metrics = DocumentMetrics()
    counts = [metrics.fetch_totals.of(doc)[doc.sources[0].id].count
              for doc in (older, newer, older, later)]
    assert counts == [10 * n, 18 * n, 18 * n, 20 * n]


# --------------------------------------------------------------------------- findings
def test_findings_one_series_per_kind():
    doc = pitfalls_doc()
    (src,) = doc.sources
    assert src.findings
    got = {(s.labels["kind"], s.labels["severity"]): s.value
           for s in samples(parsed(doc), "loadertop_finding", **source_labels(src))}
    assert got == {(f.kind, f.severity): 1.0 for f in src.findings}
    assert ("slow_worker", "warning") in got


def test_findings_per_source_and_worker_with_per_worker():
    doc = pitfalls_doc()
    (src,) = doc.sources
    fam = parsed(doc, per_worker=True)
    got = {(s.labels["kind"], s.labels["severity"], s.labels["worker"]): s.value
           for s in samples(fam, "loadertop_finding", **source_labels(src))}
    want = {(f.kind, f.severity, "" if f.worker is None else str(f.worker)): 1.0
            for f in src.findings}
    assert got == want
    assert ("slow_worker", "warning", "3") in got


def test_a_hung_worker_in_one_of_two_loaders():
    doc = findings_multi_source_doc()
    fam = parsed(doc)
    val = next(s for s in doc.sources if s.name == "val")
    train = next(s for s in doc.sources if s.name == "train")
    kinds = {s.labels["kind"] for s in samples(fam, "loadertop_finding", **source_labels(val))}
    assert "worker_hung" in kinds
    assert not samples(fam, "loadertop_finding", **source_labels(train))


@pytest.mark.parametrize("per_worker", [False, True])
def test_a_machine_finding_has_the_host_and_no_loader(per_worker):
    doc = shm_low_doc()
    fam = parsed(doc, per_worker)
    machine = [s for s in samples(fam, "loadertop_finding") if s.labels["kind"] == "shm_low"]
    assert len(machine) == 1
    want = {"host": doc.system.host, "pid": "", "rank": "", "loader": "", "kind": "shm_low",
            "severity": "warning"}
    assert machine[0].labels == ({**want, "worker": ""} if per_worker else want)


def test_refused_messages_are_counted():
    fam = parsed(bad_frames_doc(malformed=3, wrong_version=1))
    assert value(fam, "loadertop_exporter_rejected_messages_total", reason="malformed") == 3
    assert value(fam, "loadertop_exporter_rejected_messages_total", reason="wrong_version") == 1


# --------------------------------------------------------------------------- hostile input
HOSTILE = ['quo"te', "new\nline", "back\\slash", 'all\\" \n\\n of }{,= them', "ünï\tcode ✓"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_escaped_and_read_back_whole(name):
    model = Model()
    host = f"h{name}"
    model.ingest(loader_report(source=f"{host}:123:{name}", name=name, host=host), T0)
    text = scrape(model.advance(T0 + 0.5))
    fam = {f.name: f for f in text_string_to_metric_families(text)}
    (up,) = samples(fam, "loadertop_source_up")
    assert up.labels["loader"] == name and up.labels["host"] == host
    # one sample a line: a newline in a value never breaks the format
    for line in text.splitlines():
        assert line.startswith("#") or line.startswith("loadertop_"), line


def test_two_sources_claiming_the_same_labels_are_served_once():
    """A peer can claim any host, pid and name under another source id: a duplicate series would
    make Prometheus refuse the whole scrape."""
    model = Model()
    model.ingest(loader_report(source="host:123:train"), T0)
    model.ingest(loader_report(source="impostor", batches_total=999_999), T0)
    model.ingest(loader_report(
        source="dup-workers", name="other",
        workers=[wire.WorkerReport(id=0, pid=1, alive=True), wire.WorkerReport(id=0, pid=2, alive=True)]), T0)
    doc = model.advance(T0 + 0.5)
    assert len(doc.sources) == 3
    text = scrape(doc)
    series = [line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")]
    assert len(series) == len(set(series)), "a duplicate series"
    fam = parsed(doc)
    assert len(samples(fam, "loadertop_source_up", loader="train")) == 1
    assert len(samples(fam, "loadertop_worker_up", loader="other")) == 1


# --------------------------------------------------------------------------- the kept series
DOCUMENTS = sorted(name for name, make in vars(fakes).items() if name.endswith("_doc")
                   and not any(p.default is p.empty
                               for p in inspect.signature(make).parameters.values()))


def hostile_doc(name: str) -> Document:
    model = Model()
    model.ingest(loader_report(source=f"h{name}:1:{name}", name=name, host=f"h{name}"), T0)
    return model.advance(T0 + 0.5)


@pytest.mark.parametrize("per_worker", [False, True])
@pytest.mark.parametrize("make", DOCUMENTS)
def test_the_kept_series_are_what_prometheus_client_writes(make, per_worker):
    """SeriesWriter's bytes equal `generate_latest`'s for the same document, the first time (every
    prefix asked of prometheus_client) and the second (every prefix kept)."""
    doc = getattr(fakes, make)()
    metrics = DocumentMetrics(per_worker)
    writer = SeriesWriter(metrics)
    assert writer.write(doc) == reference(doc, metrics)
    assert writer.write(doc) == reference(doc, metrics)
    if not per_worker:  # one document: the sums over workers are a fresh exporter's
        assert writer.write(doc) == reference(doc)


@pytest.mark.parametrize("per_worker", [False, True])
def test_kept_series_follow_sources_that_come_and_go_and_hostile_names(per_worker):
    metrics = DocumentMetrics(per_worker)
    writer = SeriesWriter(metrics)
    docs = [healthy_doc(), findings_multi_source_doc(), *(hostile_doc(n) for n in HOSTILE),
            killed_worker_doc(), fakes.empty_doc(), healthy_doc(), same_name_doc(),
            hostile_doc(HOSTILE[0])]
    for doc in docs:
        assert writer.write(doc) == reference(doc, metrics)
    # only the last document's series are kept
    kept = set(writer._values) | {key[:2] for key in writer._histograms}
    assert all(labels[3] == HOSTILE[0] for _, labels in kept)


def test_a_prometheus_client_that_writes_otherwise_is_used_in_full(monkeypatch):
    """The first document with sources is written both ways; if they differ (another
    prometheus_client version), one line says so and every scrape is written in full."""
    doc = healthy_doc()
    monkeypatch.setattr(exposition, "value_prefix", lambda family, labels, per_worker: "wrong ")
    warnings: list[str] = []
    served = Exposition(CollectorRegistry(auto_describe=False), lambda: doc, warn=warnings.append)
    assert served.body(False) == reference(doc)
    assert len(warnings) == 1 and "prometheus_client" in warnings[0]
    doc = findings_multi_source_doc()
    assert served.body(False) == reference(doc) and len(warnings) == 1


def test_one_text_per_document_however_many_scrape():
    doc = healthy_doc()
    served = Exposition(CollectorRegistry(auto_describe=False), lambda: doc, warn=pytest.fail)
    first = served.body(False)
    assert served.body(False) is first
    assert served.body(True) is served.body(True)
    doc = finished_doc()
    assert served.body(False) != first


# --------------------------------------------------------------------------- --listen
@pytest.mark.parametrize("text, host, port, loopback", [
    ("127.0.0.1:9464", "127.0.0.1", 9464, True),
    ("9464", "127.0.0.1", 9464, True),
    ("localhost:0", "localhost", 0, True),
    ("[::1]:9100", "::1", 9100, True),
    ("*:9464", "0.0.0.0", 9464, False),
    ("0.0.0.0:9464", "0.0.0.0", 9464, False),
    ("[::]:9464", "::", 9464, False),
    ("node-7.example:9464", "node-7.example", 9464, False),
])
def test_listen_addresses(text, host, port, loopback):
    address = parse_listen(text)
    assert (address.host, address.port, address.loopback) == (host, port, loopback)


@pytest.mark.parametrize("text", ["tcp://127.0.0.1:9464", "http://127.0.0.1:9464", "ipc:///tmp/x",
                                  "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:*", "::1:9464",
                                  "a b:1", ""])
def test_bad_listen_addresses_are_one_line(text):
    with pytest.raises(ListenError) as info:
        parse_listen(text)
    assert "\n" not in str(info.value) and str(info.value)


# --------------------------------------------------------------------------- the HTTP server
def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def test_the_server_serves_metrics_over_http_and_refuses_a_taken_port():
    doc = healthy_doc()
    server = MetricsServer(lambda: doc, parse_listen("127.0.0.1:0"))
    server.start()
    try:
        assert server.port > 0 and server.url() == f"http://127.0.0.1:{server.port}/metrics"
        status, ctype, body = _get(server.url())
        assert status == 200 and ctype.startswith("text/plain")
        fam = {f.name: f for f in text_string_to_metric_families(body)}
        assert "loadertop_wait_seconds" in fam and "process_cpu_seconds" in fam
        assert _get(f"http://127.0.0.1:{server.port}/")[0] == 200
        assert _get(f"http://127.0.0.1:{server.port}/other")[0] == 404
        with pytest.raises(OSError):
            MetricsServer(lambda: doc, parse_listen(f"127.0.0.1:{server.port}"))
    finally:
        server.close()


def test_export_on_a_taken_port_is_one_line_and_exit_2(capsys, lt_dir, monkeypatch):
    monkeypatch.setenv("LOADERTOP_DIR", str(lt_dir))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["export", "--listen", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("loadertop: cannot listen on 127.0.0.1:"), err
    assert "in use" in err


@pytest.mark.parametrize("args", [["--listen", "tcp://x:1"], ["--listen", "127.0.0.1:70000"],
                                  ["--window", "0"], ["not-an-endpoint"],
                                  ["--listen", "no-such-host.invalid:9464"]])
def test_export_usage_errors_are_one_line_and_exit_2(capsys, lt_dir, monkeypatch, args):
    monkeypatch.setenv("LOADERTOP_DIR", str(lt_dir))
    assert cli.main(["export", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("loadertop: "), err


# --------------------------------------------------------------------------- discovery
def test_a_vanished_discovery_entry_is_disconnected(lt_dir):
    """The exporter runs for months: the socket of a process that left the discovery directory
    goes (its sources stay in the model until forgotten); the TUI's subscriber keeps it."""
    import os

    import psutil

    from loadertop import discovery
    from loadertop.client.subscriber import Subscriber

    endpoint = f"ipc://{lt_dir}/job.sock"
    path = discovery.write_entry(lt_dir, pid=os.getpid(), endpoint=endpoint, command="python t.py",
                                 started_at=psutil.Process().create_time(), rank=None)
    dropping = Subscriber(Model(), directory=lt_dir, drop_vanished=True)
    keeping = Subscriber(Model(), directory=lt_dir)
    try:
        assert endpoint in dropping.sockets and endpoint in keeping.sockets
        path.unlink()
        dropping.rescan()
        keeping.rescan()
        assert endpoint not in dropping.sockets and endpoint not in dropping.model.endpoints
        assert endpoint in keeping.sockets
        discovery.write_entry(lt_dir, pid=os.getpid(), endpoint=endpoint, command="python t.py",
                              started_at=psutil.Process().create_time(), rank=None)
        dropping.rescan()
        assert endpoint in dropping.sockets  # back: watched again
    finally:
        dropping.close()
        keeping.close()


def test_help_imports_neither_prometheus_client_nor_torch():
    """`loadertop --help` and `loadertop export --help` answer at once: the client loads only
    when the exporter starts."""
    import subprocess
    import sys

    code = ("import contextlib, io, sys\n"
            "from loadertop import cli\n"
            "for argv in (['--help'], ['export', '--help']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        try:\n"
            "            cli.main(argv)\n"
            "        except SystemExit:\n"
            "            pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'prometheus_client')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True).stdout.strip()
    assert out == "[]"


def test_the_body_is_written_ahead_only_for_a_scrape_due_before_the_next_advance():
    """After two scrapes 1 s apart, each advance writes the next body ahead; scraped every 15 s,
    only the advance just before the next scrape does."""
    now = [100.0]
    docs = [healthy_doc()]
    served = Exposition(CollectorRegistry(auto_describe=False), lambda: docs[-1],
                        warn=pytest.fail, clock=lambda: now[0])
    assert served.prepare(1.0) is False  # never scraped
    served.scrape(True)
    now[0] += 1.0
    served.scrape(True)
    docs.append(finished_doc())
    assert served.prepare(1.0) is True
    written = served.body(True)
    now[0] += 1.0
    assert served.scrape(True) is written  # served what was written ahead
    # every 15 s
    now[0] += 15.0
    served.scrape(True)
    for _ in range(13):
        now[0] += 1.0
        docs.append(healthy_doc())
        assert served.prepare(1.0) is False
    now[0] += 1.0
    docs.append(killed_worker_doc())
    assert served.prepare(1.0) is True


def test_a_scraper_that_stopped_is_not_written_for():
    now = [100.0]
    served = Exposition(CollectorRegistry(auto_describe=False), healthy_doc,
                        warn=pytest.fail, clock=lambda: now[0])
    served.scrape(False)
    now[0] += 0.2
    served.scrape(False)  # polled every 0.2 s, then no more
    now[0] += 0.5
    assert served.prepare(1.0) is True  # overdue by less than an advance
    now[0] += 1.0
    assert not any(served.prepare(1.0) for _ in range(3))


def test_the_advances_settle_half_an_advance_before_each_expected_scrape():
    """A scraper every second at .9 past: the advances move a quarter of an advance at most per
    step onto .4 past (half a second before each scrape) and stay there; with no scraper in
    view the grid is left alone."""
    from loadertop.exporter.server import Exporter

    scrape_at = [None]
    exporter = Exporter(object())
    exporter.next_scrape = lambda: scrape_at[0]
    assert exporter.phased(1.0, 0.0) == 1.0  # no scrape expected yet
    advances = [0.0]
    for k in range(1, 10):
        now = advances[-1]
        scrape_at[0] = k + 0.9  # the next scrape, one gap after the last
        advances.append(exporter.phased(advances[-1] + 1.0, now))
    steps = [b - a for a, b in zip(advances, advances[1:])]
    assert all(0.75 - 1e-9 <= s <= 1.25 + 1e-9 for s in steps), steps
    assert round(steps[0], 6) == 1.25  # the first move is bounded
    assert [round(a % 1.0, 6) for a in advances[2:]] == [0.4] * 8
    # a very late advance is not followed by another at once
    assert exporter.phased(50.0, 50.0) >= 50.5


def test_the_next_scrape_is_expected_while_the_scraper_keeps_to_its_gap():
    now = [100.0]
    served = Exposition(CollectorRegistry(auto_describe=False), healthy_doc,
                        warn=pytest.fail, clock=lambda: now[0])
    assert served.next_scrape() is None
    served.scrape(True)
    assert served.next_scrape() is None  # one scrape: no gap yet
    now[0] += 15.0
    served.scrape(True)
    assert served.next_scrape() == 130.0
    now[0] += 29.0
    assert served.next_scrape() == 130.0  # late, but within a gap
    now[0] += 2.0
    assert served.next_scrape() is None  # a gap overdue: it stopped
