"""Readable units for figures (KiB/MiB/GiB, ms, %, /s): the one module for every number's wording.

Two registers, told apart by their names:

* ``fmt_*``: a figure in a table cell (the TUI, the text report), unknown (None) shown as
  `MISSING`; ``fmt_pct`` takes a percentage, ``fmt_frac_pct`` a fraction;
* ``say_*``: a figure inside a sentence (the diagnosis' evidence and advice, the findings, tune's
  recommendation): its unit written out and as few digits as it needs; ``say_percent`` takes a
  percentage, ``say_fraction`` a fraction (both read "12 %").

Plain strings only (no textual/rich), so `loadertop snapshot` can use them without loading the UI.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MISSING = "–"  # a figure that is unknown (None) is shown as this, never as 0


def _num(value: float, digits: int = 3) -> str:
    """A number with about ``digits`` significant figures, no exponent."""
    if value == 0:
        return "0"
    mag = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - mag)
    return f"{value:.{decimals}f}"


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return MISSING
    if ms >= 10_000:
        return f"{ms / 1000:.0f} s"
    if ms >= 1000:
        return f"{ms / 1000:.1f} s"
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    return f"{ms:.2f}"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return MISSING
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{_num(n)} {unit}"
        n /= 1024
    return MISSING  # unreachable


def fmt_pair(used: float | None, total: float | None) -> str:
    """"37.3/126 GiB": two sizes in the unit of the larger."""
    if used is None or total is None:
        return f"{fmt_bytes(used)}/{fmt_bytes(total)}"
    t = fmt_bytes(total)
    num, unit = t.split(" ")
    scale = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}[unit]
    return f"{_num(used / scale) if used else '0'}/{num} {unit}"


def fmt_rate(bytes_per_s: float | None) -> str:
    return MISSING if bytes_per_s is None else f"{fmt_bytes(bytes_per_s)}/s"


def fmt_pct(percent: float | None, decimals: int = 0) -> str:
    return MISSING if percent is None else f"{percent:.{decimals}f} %"


def fmt_frac_pct(fraction: float | None) -> str:
    if fraction is None:
        return MISSING
    pct = fraction * 100
    return f"{pct:.1f} %" if pct < 10 else f"{pct:.0f} %"


def fmt_per_s(value: float | None) -> str:
    return MISSING if value is None else _num(value)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return MISSING
    s = max(0, int(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def fmt_float(value: float | None, decimals: int = 2) -> str:
    return MISSING if value is None else f"{value:.{decimals}f}"


# --------------------------------------------------------------------------- in sentences

_GIB = 1024.0**3
_MIB = 1024.0**2
_KIB = 1024.0


def say_number(value: float) -> str:
    """"12", "1.5", "3": whole above 10, else one decimal (dropped when it is 0)."""
    if abs(value) >= 10:
        return f"{value:.0f}"
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def say_fraction(fraction: float) -> str:
    """A fraction (0.12) as a percentage: "12 %"."""
    return f"{say_number(fraction * 100.0)} %"


def say_percent(percent: float) -> str:
    """A percentage (12.0) as itself: "12 %"."""
    return f"{say_number(percent)} %"


def say_fraction_range(fractions: Sequence[float]) -> str:
    """"3 %", or "2–4 %" from the lowest fraction to the highest."""
    low, high = say_number(min(fractions) * 100.0), say_number(max(fractions) * 100.0)
    return f"{low} %" if low == high else f"{low}–{high} %"


def say_ms(value: float) -> str:
    """Milliseconds: "0.45 ms", "1.5 ms", "12 ms", "2.5 s"."""
    if value >= 1000:
        return f"{value / 1000:.1f} s"
    if value >= 10:
        return f"{value:.0f} ms"
    if value >= 1:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def say_bytes(value: float) -> str:
    """"3.1 GiB", "512 MiB", "12 KiB", "100 B"."""
    for unit, size in (("GiB", _GIB), ("MiB", _MIB), ("KiB", _KIB)):
        if value >= size:
            return f"{say_number(value / size)} {unit}"
    return f"{value:.0f} B"


def say_cores(value: float) -> str:
    """"1 core", "1.5 cores"."""
    text = say_number(value)
    return f"{text} core" + ("" if text == "1" else "s")


def say_core_share(value: float) -> str:
    """A fraction of a core with the digits it needs: 0.06, 0.9, 1.9, 12."""
    if value < 1:
        return f"{value:.2f}".rstrip("0").rstrip(".") or "0"
    return say_number(value)


def say_workers(count: int) -> str:
    """"1 worker", "0 workers", "3 workers"."""
    return f"{count} worker" + ("" if count == 1 else "s")
