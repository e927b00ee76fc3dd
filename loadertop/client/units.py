"""Readable units for figures (KiB/MiB/GiB, ms, %, /s), shared by the TUI and the text report.

Plain strings only (no textual/rich), so `loadertop snapshot` can use them without loading the UI.
"""

from __future__ import annotations

import math

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
