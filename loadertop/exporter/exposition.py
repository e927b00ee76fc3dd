"""The text a scrape gets: prometheus_client's exposition of the registry, with each series'
name-and-labels written by prometheus_client once and kept.

Why not `generate_latest(registry)` on every new document: prometheus_client 0.26 checks and
escapes every label name of every series at every scrape, though the label sets stay the same
from one second to the next, and the families' `Sample` objects are built anew too (at 64 sources
that is most of a scrape's CPU: docs/performance.md).

`SeriesWriter` writes the same bytes from the document's series (`DocumentMetrics.walk`): for a series
it has not seen, it asks prometheus_client for that series alone (`generate_latest` of a family
holding just it) and keeps the text before each value; then every scrape appends to those the
values spelled by prometheus_client's `floatToGoString`, as `generate_latest` does. The HELP and
TYPE lines are prometheus_client's too (an empty family's). Nothing of the format is written
here, only cut out of prometheus_client's output and put back together in its order.

`Exposition` checks that claim once per process on the first document with sources (both ways,
bytes compared) and falls back to `generate_latest` for good, with one line on stderr, if a
prometheus_client version ever writes differently.
"""

from __future__ import annotations

import gzip
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, chain
from operator import itemgetter

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from loadertop.client.document import Document, HistogramFigures
from loadertop.exporter.collector import (
    FAMILIES,
    DocumentCollector,
    DocumentMetrics,
    Family,
    MetricFamily,
    _buckets,
)

# Prometheus asks for gzip; level 1 shrinks an exposition nearly as much as the default level 9
# for a fraction of its time (docs/performance.md).
GZIP_LEVEL = 1
# A scrape expected before the next advance plus this much is written for ahead (`prepare`).
PREPARE_MARGIN_S = 0.25
_COUNT, _SUM = -1, -2  # what a histogram line holds that is not a bucket
_Glued = tuple[tuple[str, ...], Callable[[list[str]], tuple[str, ...]]]
MAX_SPELLED = 1 << 16  # counts whose spelling is kept (then forgotten all at once)


class _Families(Collector):
    """A collector of given families, to have prometheus_client write just them."""

    def __init__(self, families: Iterable[MetricFamily]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[MetricFamily]:
        return iter(self._families)


def _written(family: MetricFamily) -> list[str]:
    return generate_latest(_Families([family])).decode("utf-8").split("\n")[:-1]


def _sample_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("#")]


def _prefix(line: str) -> str:
    # A line is `name{labels} value`: the value has no space, label values are quoted and
    # escaped, so the last space ends the labels.
    return line[:line.rindex(" ") + 1]


def header(family: Family, per_worker: bool) -> str:
    """prometheus_client's HELP and TYPE lines of `family` (what it writes for an empty one)."""
    return "".join(line + "\n" for line in _written(family.metric_family(per_worker)))


def value_prefix(family: Family, labels: tuple[str, ...], per_worker: bool) -> str:
    """prometheus_client's text before the value of `family`'s series `labels`."""
    made = family.metric_family(per_worker)
    made.add_metric(labels, 0.0)
    (line,) = _sample_lines(_written(made))
    return _prefix(line)


def histogram_prefixes(family: Family, labels: tuple[str, ...], figures: HistogramFigures,
                       per_worker: bool) -> tuple[tuple[str, int], ...] | None:
    """prometheus_client's lines of a histogram series, each as (the text before its value,
    which value: a bucket's index, _COUNT or _SUM), in its order; None when the figures are
    inconsistent (the family then has no such series)."""
    buckets = _buckets(figures)
    if buckets is None:
        return None
    made = family.metric_family(per_worker)
    made.add_metric(labels, buckets, 0.0)
    out = []
    bucket = 0
    for line in _sample_lines(_written(made)):
        name = line[:line.index("{")] if "{" in line else line[:line.index(" ")]
        if name.endswith("_bucket"):
            out.append((_prefix(line), bucket))
            bucket += 1
        elif name.endswith("_count"):
            out.append((_prefix(line), _COUNT))
        elif name.endswith("_sum"):
            out.append((_prefix(line), _SUM))
        else:
            raise ValueError(f"a histogram line of neither a bucket, _count nor _sum: {line!r}")
    return tuple(out)


def _glued(prefixes: tuple[tuple[str, int], ...] | None) -> _Glued | None:
    """A histogram's line prefixes as the text between its values (each prefix after the first
    with the newline that ends the line before it), and which value goes after each: an index
    into the cumulative counts with the sum after them (_COUNT is the last bucket's, +Inf)."""
    if prefixes is None:
        return None
    buckets = sum(1 for _, which in prefixes if which >= 0)
    where = tuple(buckets - 1 if which == _COUNT else buckets if which == _SUM else which
                  for _, which in prefixes)
    return (prefixes[0][0], *("\n" + prefix for prefix, _ in prefixes[1:])), itemgetter(*where)


class SeriesWriter:
    """`generate_latest` of a registry holding a `DocumentCollector` of `metrics`, for one
    document after another, with the series' prefixes kept from one document to the next (those
    of series no longer present are dropped)."""

    def __init__(self, metrics: DocumentMetrics | None = None) -> None:
        self.metrics = metrics = metrics or DocumentMetrics()
        per_worker = metrics.per_worker
        self._headers = [header(family, per_worker) for family in FAMILIES]
        self._values: dict[tuple[int, tuple[str, ...]], str] = {}
        self._histograms: dict[tuple[int, tuple[str, ...], tuple[float, ...]],
                               _Glued | None] = {}
        self._spelled: dict[int, str] = {}  # a count -> floatToGoString's text of it

    def write(self, document: Document) -> bytes:
        old_values, old_histograms = self._values, self._histograms
        values: dict[tuple[int, tuple[str, ...]], str] = {}
        histograms: dict[tuple[int, tuple[str, ...], tuple[float, ...]],
                         _Glued | None] = {}
        out: list[list[str]] = [[header] for header in self._headers]
        spell: Callable[[float], str] = floatToGoString
        spelled = self._spelled
        per_worker = self.metrics.per_worker
        if len(spelled) > MAX_SPELLED:
            spelled.clear()

        def spell_count(total: int) -> str:
            text = spelled[total] = spell(total)
            return text

        def value(family: Family, labels: tuple[str, ...], v: float) -> None:
            key = (family.index, labels)
            prefix = old_values.get(key)
            if prefix is None:
                prefix = value_prefix(family, labels, per_worker)
            values[key] = prefix
            out[family.index].append(prefix + spell(v) + "\n")

        def histogram(family: Family, labels: tuple[str, ...], figures: HistogramFigures) -> None:
            key = (family.index, labels, figures.le_ms)
            if key in old_histograms:
                glue = old_histograms[key]
            else:
                glue = _glued(histogram_prefixes(family, labels, figures, per_worker))
            histograms[key] = glue
            if glue is None or len(figures.counts) != len(figures.le_ms) + 1:
                return
            # The cumulative counts, spelled (a histogram's upper buckets mostly repeat the one
            # below, and counts repeat across series and scrapes: spelled once), then _count
            # and _sum; the lines are the kept text and these, interleaved, in C.
            texts, pick = glue
            values = [spelled.get(total) or spell_count(total)
                      for total in accumulate(figures.counts)]
            values.append(spell(figures.sum_ms / 1000.0))
            out[family.index].append("".join(chain.from_iterable(zip(texts, pick(values)))) + "\n")

        self.metrics.walk(document, value, histogram)
        self._values, self._histograms = values, histograms
        return "".join("".join(lines) for lines in out).encode("utf-8")


def reference(document: Document, metrics: DocumentMetrics | None = None) -> bytes:
    """What `generate_latest` writes for `document`'s families (SeriesWriter's claim); `metrics`:
    the writer's, whose sums over workers the same document then reads the same."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DocumentCollector(lambda: document, metrics))
    return generate_latest(registry)


class Exposition:
    """The scrape's body for the latest document: the document's series (`SeriesWriter`), then
    `others` (the exporter's own figures, the process collector) by `generate_latest`. Written
    once per document however many scrapers ask (an HA pair of Prometheus servers, a curl beside
    them), and its gzip once per document too.

    Always the text format 0.0.4, which every Prometheus reads: OpenMetrics, which Prometheus
    2.x asks for first, adds nothing these metrics use (no exemplars, no `_created`) and is slower
    to write (prometheus_client 0.26; docs/performance.md)."""

    content_type = CONTENT_TYPE_PLAIN_0_0_4

    def __init__(self, others: CollectorRegistry, latest: Callable[[], Document | None], *,
                 metrics: DocumentMetrics | None = None,
                 warn: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._others = others
        self._latest = latest
        self._clock = clock
        self._scraped_at: float | None = None  # the latest scrape's time, and the gap before it
        self._scrape_gap: float | None = None
        self._scrape_gzipped = True
        self._metrics = metrics = metrics or DocumentMetrics()
        self._writer: SeriesWriter | None = SeriesWriter(metrics)
        self._checked = False
        self._warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        self._lock = threading.Lock()  # one writer at a time; the others then reuse its text
        self._written_for: object = None
        self._text = b""
        self._gzipped: bytes | None = None

    def _series(self, document: Document) -> bytes:
        if self._writer is None:
            return reference(document, self._metrics)
        text = self._writer.write(document)
        if not self._checked and document.sources:
            self._checked = True
            if text != reference(document, self._metrics):
                self._writer = None
                self._warn("loadertop export: this prometheus_client writes series differently "
                           "from what loadertop keeps of them; writing every scrape in full "
                           "(slower)")
                return reference(document, self._metrics)
        return text

    def scrape(self, gzipped: bool) -> bytes:
        """The body for a scraper (the HTTP handler): `body`, and when it came, for `prepare`."""
        now = self._clock()
        if self._scraped_at is not None:
            self._scrape_gap = now - self._scraped_at
        self._scraped_at, self._scrape_gzipped = now, gzipped
        return self.body(gzipped)

    def next_scrape(self) -> float | None:
        """When the next scrape is expected (this clock): one gap after the last, while the
        scraper keeps to it (None before two scrapes, or once it is a gap overdue)."""
        scraped_at, gap = self._scraped_at, self._scrape_gap
        if scraped_at is None or gap is None or gap <= 0:
            return None
        expected = scraped_at + gap
        return expected if self._clock() <= expected + gap else None

    def prepare(self, next_advance_in: float) -> bool:
        """Write the latest document's body now (on the receive thread, just after an advance)
        if the next scrape, expected one gap after the last, comes before the next advance: it
        is then served at once instead of waiting for the writing, which shared the GIL with an
        advance (docs/performance.md: a 64-source scrape that way). Once
        per scrape, as when the scrape writes it: a 15 s scraper is not written for every
        second. True if it wrote."""
        scraped_at, gap = self._scraped_at, self._scrape_gap
        if scraped_at is None or gap is None:
            return False
        expected, now = scraped_at + gap, self._clock()
        # Not yet due, or overdue by more than an advance (the scraper stopped or slowed down:
        # its next scrape, if any, writes for itself).
        if not now - next_advance_in <= expected <= now + next_advance_in + PREPARE_MARGIN_S:
            return False
        self.body(self._scrape_gzipped)
        return True

    def body(self, gzipped: bool) -> bytes:
        with self._lock:
            # Read under the lock: a scrape that waited for another's writing then finds the
            # document that one wrote, or a newer one, never an older one (the sums over workers
            # move forward only: aggregate.WorkerFetchTotals).
            document = self._latest()
            if document is None or document is not self._written_for:
                series = self._series(document) if document is not None else b""
                self._text = series + generate_latest(self._others)
                self._gzipped = None
                self._written_for = document
            if not gzipped:
                return self._text
            if self._gzipped is None:
                self._gzipped = gzip.compress(self._text, compresslevel=GZIP_LEVEL)
            return self._gzipped
