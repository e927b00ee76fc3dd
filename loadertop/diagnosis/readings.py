"""Reading one figure: a broken reading (None, inf, NaN) is no evidence and never becomes a value."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from loadertop.client.document import Stats

# Products of huge (still valid) figures that overflow to inf are clamped to this before they
# become a worker count: math.floor/ceil of inf raise.
FLOAT_MAX = sys.float_info.max


def finite(value: float | None) -> float | None:
    """The value when it is a finite number, else None (a broken reading is no evidence)."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def stat(stats: Stats | None, key: str = "p50") -> float | None:
    """One figure of a `Stats`; the mean stands in for one that is not finite."""
    if stats is None:
        return None
    value = finite(getattr(stats, key))
    return value if value is not None else finite(stats.mean)


def weighted_mean(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Mean of (value, weight) pairs, weighted by batches when every weight is > 0; None when
    huge values overflow it (inf, or NaN from inf - inf)."""
    if not pairs:
        return None
    if all(w > 0 for _, w in pairs):
        return finite(sum(v * w for v, w in pairs) / sum(w for _, w in pairs))
    return finite(sum(v for v, _ in pairs) / len(pairs))
