"""The memory trends copy_on_read and memory_growth read (`client.resources`' least squares over
the samples after a process's warm-up), and their wording."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import MemoryTrend
from loadertop.client.units import say_bytes, say_fraction

#: A trend counts from this many readings past the warm-up (20 s at the probe's 5 s).
TREND_MIN_SAMPLES: Final = 4
#: "Steadily": at least this share of consecutive readings rose.
RISING_SHARE_MIN: Final = 0.6


def fitted_growth(trend: MemoryTrend) -> float:
    """How much the least-squares line rose over the trend (robust to one odd reading)."""
    return trend.slope_bytes_per_s * trend.over_s


def steady(trend: MemoryTrend | None) -> bool:
    return (trend is not None and trend.samples >= TREND_MIN_SAMPLES
            and trend.rising_share >= RISING_SHARE_MIN and trend.slope_bytes_per_s > 0)


def trend_words(trend: MemoryTrend) -> str:
    return (f"{say_bytes(trend.first_bytes)} → {say_bytes(trend.last_bytes)} over "
            f"{trend.over_s:.0f} s ({rate(trend.slope_bytes_per_s)}, "
            f"rising in {say_fraction(trend.rising_share)} of {trend.samples} readings)")


def rate(bytes_per_s: float) -> str:
    sign = "-" if bytes_per_s < 0 else "+"
    per_min = abs(bytes_per_s) * 60
    return f"{sign}{say_bytes(per_min)}/min"
