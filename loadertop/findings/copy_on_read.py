"""copy_on_read: a worker's private memory grows while its RSS stays flat (reading Python objects
copies them into every worker)."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import (
    Finding,
    SourceFigures,
    SystemFigures,
    WorkerFigures,
)
from loadertop.client.units import say_bytes, say_fraction
from loadertop.findings._common import finding, names, one, resource_workers
from loadertop.findings._trends import TREND_MIN_SAMPLES, fitted_growth, rate, steady, trend_words

_MIB: Final = 1024 * 1024

KIND: Final = "copy_on_read"

#: copy_on_read: a worker's USS grew at least this much over its trend (the fitted line) ...
COW_MIN_GROWTH_BYTES: Final = 32 * _MIB
#: ... while its RSS grew by at most this share of that (RSS "looks flat": the pages were
#: already resident, shared with the main process; each one read is now a private copy).
COW_RSS_SHARE_MAX: Final = 0.25


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    workers = resource_workers(source)
    found = _copy_on_read(source, workers) if workers is not None else None
    return [found] if found is not None else []


def copies_on_read(w: WorkerFigures) -> bool:
    """USS grows steadily by COW_MIN_GROWTH_BYTES while RSS grows by at most COW_RSS_SHARE_MAX
    of that."""
    uss, rss = w.uss_trend, w.rss_trend
    if not steady(uss) or rss is None or rss.samples < TREND_MIN_SAMPLES:
        return False
    assert uss is not None
    grown = fitted_growth(uss)
    return grown >= COW_MIN_GROWTH_BYTES and fitted_growth(rss) <= COW_RSS_SHARE_MAX * grown


def _copy_on_read(source: SourceFigures, workers: list[WorkerFigures]) -> Finding | None:
    hit = [w for w in workers if copies_on_read(w)]
    if not hit:
        return None
    ids = [w.id for w in hit]
    evidence = []
    for w in hit:
        assert w.uss_trend is not None and w.rss_trend is not None
        evidence.append(f"worker {w.id} USS {trend_words(w.uss_trend)}; RSS "
                        f"{rate(w.rss_trend.slope_bytes_per_s)} (threshold: USS +"
                        f"{say_bytes(COW_MIN_GROWTH_BYTES)}, RSS at most "
                        f"{say_fraction(COW_RSS_SHARE_MAX)} of that)")
    private = sum(w.uss_bytes or 0 for w in hit)
    if private:
        evidence.append(f"private memory of these workers now {say_bytes(private)} "
                        f"(each may end up with a whole copy of what it reads)")
    summary = (f"{names(ids)}: private memory (USS) grows steadily while RSS stays flat — "
               "reading Python objects copies them into every worker (copy-on-read)")
    advice = [
        f"keep {source.config.dataset}'s data in numpy arrays, torch tensors or Arrow columns "
        "instead of lists or dicts of Python objects: reading a Python object writes its "
        "reference count, which copies its memory page into the worker (pytorch#13246)",
        "a list of strings (file paths, captions): one numpy array (np.array(paths, "
        "dtype=np.bytes_)) or one bytes buffer with an offsets array",
        "or load the data inside each worker (in worker_init_fn, or lazily on first use) "
        "rather than in the main process before the workers fork",
    ]
    return finding("copy_on_read", "warning", source.id, one(ids), summary, evidence, advice)
