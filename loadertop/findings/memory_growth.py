"""memory_growth: the memory of the training process or a worker grows steadily (a leak, or a
cache without bound)."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import (
    Finding,
    MemoryTrend,
    ProcessFigures,
    SourceFigures,
    SystemFigures,
    WorkerFigures,
)
from loadertop.client.units import say_bytes, say_fraction
from loadertop.findings._common import finding, names, one, resource_workers
from loadertop.findings._trends import fitted_growth, steady, trend_words

_MIB: Final = 1024 * 1024

KIND: Final = "memory_growth"

#: memory_growth: RSS rising over at least this long ("over minutes") ...
GROWTH_MIN_S: Final = 120.0
#: ... by at least this much (the fitted line) ...
GROWTH_MIN_BYTES: Final = 64 * _MIB
#: ... and at least this share of what the process held when the trend began.
GROWTH_MIN_SHARE: Final = 0.1


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    workers = resource_workers(source)
    found = _memory_growth(source, source.process, workers) if workers is not None else None
    return [found] if found is not None else []


def grows(trend: MemoryTrend | None) -> bool:
    """RSS rising steadily over GROWTH_MIN_S by GROWTH_MIN_BYTES and GROWTH_MIN_SHARE."""
    if not steady(trend) or trend is None or trend.over_s < GROWTH_MIN_S:
        return False
    grown = fitted_growth(trend)
    return grown >= GROWTH_MIN_BYTES and grown >= GROWTH_MIN_SHARE * trend.first_bytes


def _memory_growth(source: SourceFigures, process: ProcessFigures,
                  workers: list[WorkerFigures]) -> Finding | None:
    main = grows(process.rss_trend)
    hit = [w for w in workers if grows(w.rss_trend)]
    if not main and not hit:
        return None
    ids = [w.id for w in hit]
    threshold = (f"(threshold: steadily over {GROWTH_MIN_S:.0f} s, +{say_bytes(GROWTH_MIN_BYTES)}"
                 f" and +{say_fraction(GROWTH_MIN_SHARE)})")
    evidence = []
    who = []
    if main:
        assert process.rss_trend is not None
        who.append("the training process")
        evidence.append(f"training process RSS {trend_words(process.rss_trend)} {threshold}")
    for w in hit:
        assert w.rss_trend is not None
        evidence.append(f"worker {w.id} RSS {trend_words(w.rss_trend)} {threshold}")
    if hit:
        who.append(names(ids))
    summary = f"memory of {' and '.join(who)} grows steadily (it will run out if it goes on)"
    advice = ["find what accumulates (seed §5.1): tracemalloc snapshots a minute apart, or "
              "memray, show which line's allocations grow"]
    if main:
        advice.append("in the training loop: keep no per-step tensors in Python lists (losses, "
                      "outputs, metrics): store loss.item() or tensor.detach().cpu(), not the "
                      "tensor with its autograd graph")
    if hit:
        advice.append("in the dataset: bound any cache it fills (functools.lru_cache(maxsize=…) "
                      "or a fixed-size dict); close files it opens per item")
    advice.append("memory that levels off after the first epoch is a cache filling, not a leak")
    worker = one(ids) if not main else None
    return finding("memory_growth", "warning", source.id, worker, summary, evidence, advice)
