"""Durations as a report carries them (publisher thread only): every value counted in the
buckets of `wire.HISTOGRAM_BOUNDS_NS` (`BucketCounts`, cumulative), and a decimated sample of
them in µs (`decimated_micros`); each in C where `probe/_hotpath.c` is built, else in Python."""

from __future__ import annotations

import bisect
from collections.abc import Callable

from loadertop import wire

_c_bucket_count: Callable[[tuple[int, ...], list[int], list[int]], int | None] | None
_c_decimate_micros: Callable[[list[int], int], list[int] | None] | None
try:  # the drain's bulk counting and the report's decimation in C (probe/_hotpath.c)
    from loadertop.probe._hotpath import bucket_count as _c_bucket_count
    from loadertop.probe._hotpath import decimate_micros as _c_decimate_micros
except ImportError:  # pragma: no cover - CI fails where it is missing (test_hotpath)
    _c_bucket_count = _c_decimate_micros = None


class BucketCounts:
    """Cumulative counts of durations (ns) in the buckets of `wire.HISTOGRAM_BOUNDS_NS`, and
    their sum: every value, where the report's samples are decimated (publisher thread only)."""

    __slots__ = ("counts", "sum_ns")

    def __init__(self) -> None:
        self.counts = [0] * (len(wire.HISTOGRAM_BOUNDS_NS) + 1)
        self.sum_ns = 0

    def add(self, values_ns: list[int]) -> int:
        """Count every value; returns their sum."""
        total = bucket_count(wire.HISTOGRAM_BOUNDS_NS, self.counts, values_ns)
        self.sum_ns += total
        return total

    def add_one(self, value_ns: int) -> None:
        self.counts[bisect.bisect_left(wire.HISTOGRAM_BOUNDS_NS, value_ns)] += 1
        self.sum_ns += value_ns

    def histogram(self) -> wire.Histogram:
        # arg-type: lists go out as tuples do (msgpack arrays), wire's types are as decoded
        return wire.Histogram(counts=list(self.counts), sum_ns=max(0, self.sum_ns))  # type: ignore[arg-type]


SORT_FROM = 64  # py_bucket_count: below this many values one bisect each is cheapest; above it,
# one sort and a bisect per bound (docs/performance.md: the two, a value each).


def py_bucket_count(bounds: tuple[int, ...], counts: list[int], values_ns: list[int]) -> int:
    """`BucketCounts.add`'s counting in Python: each value into the first bucket whose bound it
    does not exceed (Prometheus's `le`), the last beyond every bound; returns the sum."""
    if len(values_ns) < SORT_FROM:
        for value in values_ns:
            counts[bisect.bisect_left(bounds, value)] += 1
    else:
        ordered = sorted(values_ns)
        below = 0
        for i, bound in enumerate(bounds):
            upto = bisect.bisect_right(ordered, bound)  # values <= bound: Prometheus's `le`
            counts[i] += upto - below
            below = upto
        counts[-1] += len(ordered) - below
    return sum(values_ns)


def bucket_count(bounds: tuple[int, ...], counts: list[int], values_ns: list[int]) -> int:
    """In C where it is built (one pass, where Python sorts; docs/performance.md). The C one
    declines (None) values that are not ints within int64, which Python then counts."""
    if _c_bucket_count is not None and type(values_ns) is list:
        total = _c_bucket_count(bounds, counts, values_ns)
        if total is not None:
            return total
    return py_bucket_count(bounds, counts, values_ns)


def py_decimated_micros(samples_ns: list[int]) -> list[int]:
    """A report's samples: at most wire.MAX_SAMPLES of them (`wire.decimate`), in µs. The bound
    is read at each call, as the C path reads it: one bound for both."""
    return [v // 1000 for v in wire.decimate(samples_ns, wire.MAX_SAMPLES)]


def decimated_micros(samples_ns: list[int]) -> list[int]:
    """`py_decimated_micros`, in C where it is built: one pass, no list in between."""
    if _c_decimate_micros is not None:
        out = _c_decimate_micros(samples_ns, wire.MAX_SAMPLES)
        if out is not None:
            return out
    return py_decimated_micros(samples_ns)
