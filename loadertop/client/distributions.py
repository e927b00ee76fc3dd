"""The five figures of a distribution (mean, p50, p95, p99, max in ms) that every view shows, from
a window's samples in whole µs: computed a dozen times per source and refresh, so written for it.

The model asks for a window's figures as `stats_of_parts`: the samples of several reports, each
report's tuple as decoded, never joined into one list in Python. It is the C one (client/_figures.c)
where the package's optional extension is built, else `python_stats_of_parts`: the same figures to
the bit (tests/unit/test_distributions.py). A viewer of a 128-source fleet asks ~1,700 times a
second (docs/performance.md, "The TUI watching many sources")."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import ModuleType

from loadertop.client.document import Stats


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in 0..100."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


# Below this many µs, an integer count of µs divided by 1000.0 is already what round(·, 3)
# gives back: the float nearest v/1000 lies within half an ulp of it (under 2**-11 for values
# under 2**42 ms), so v/1000 is the 3-decimal number nearest to it.
_EXACT_MS_BELOW_US = 4 * 10**15
# For a sample count: the (low rank, high rank, fraction) of its 50th, 95th and 99th percentiles.
_Rank = tuple[int, int, float]
_RANKS: dict[int, tuple[_Rank, _Rank, _Rank]] = {}


def _rank(last: int, q: int) -> _Rank:
    pos = last * q / 100.0
    lo = int(pos)
    return lo, min(lo + 1, last), pos - lo


def _ranks(n: int) -> tuple[_Rank, _Rank, _Rank]:
    ranks = (_rank(n - 1, 50), _rank(n - 1, 95), _rank(n - 1, 99))
    if len(_RANKS) < 4096:  # sample counts repeat; a bound all the same
        _RANKS[n] = ranks
    return ranks


def stats_of_us(values: list[int]) -> Stats | None:
    """{mean, p50, p95, p99, max} in ms of samples in whole µs, or None without any (never a
    made-up 0). Sorts `values` in place, as ints (CPython 3.11 compares them without a method
    call), and turns only the five figures into ms.
    `percentile`'s interpolation is written out, its ranks looked up by sample count, and a
    percentile that falls on one sample is that sample in ms, unrounded (see
    _EXACT_MS_BELOW_US): a viewer computes a dozen of these per source and refresh."""
    n = len(values)
    if not n:
        return None
    values.sort()
    top = values[-1]
    (lo50, hi50, f50), (lo95, hi95, f95), (lo99, hi99, f99) = _RANKS.get(n) or _ranks(n)
    exact = top < _EXACT_MS_BELOW_US
    # Interpolated between the two values in ms, as numpy does, to the same float bits.
    if f50 or not exact:
        low = values[lo50] / 1000.0
        p50 = round(low + (values[hi50] / 1000.0 - low) * f50, 3)
    else:
        p50 = values[lo50] / 1000.0
    if f95 or not exact:
        low = values[lo95] / 1000.0
        p95 = round(low + (values[hi95] / 1000.0 - low) * f95, 3)
    else:
        p95 = values[lo95] / 1000.0
    if f99 or not exact:
        low = values[lo99] / 1000.0
        p99 = round(low + (values[hi99] / 1000.0 - low) * f99, 3)
    else:
        p99 = values[lo99] / 1000.0
    return Stats(mean=round(sum(values) / n / 1000.0, 3), p50=p50, p95=p95, p99=p99,
                 max=top / 1000.0 if exact else round(top / 1000.0, 3))



def python_stats_of_parts(parts: list[Sequence[int]]) -> Stats | None:
    """`stats_of_us` of the samples of all `parts` together."""
    values: list[int] = []
    for part in parts:
        values += part
    return stats_of_us(values)


_figures: ModuleType | None
try:
    from loadertop.client import _figures
except ImportError:  # pragma: no cover - not built (no compiler at install): the Python one
    _figures = None

stats_of_parts: Callable[[list[Sequence[int]]], Stats | None]
if _figures is not None:
    # What C cannot do to the bit (a sample or a sum past 2**53) it hands to the Python one.
    _figures.bind(Stats, python_stats_of_parts)
    stats_of_parts = _figures.stats_of_parts
else:  # pragma: no cover
    stats_of_parts = python_stats_of_parts
