"""Text graphics: sparklines, bars, the per-core grid, and lines of styled spans fitted to a width.

Pure functions over numbers and strings (no Textual, no document types), so they are tested on
their own (`tests/unit/test_graphics.py`) and cost next to nothing: a text sparkline is a string,
where a plotted graph (textual-plotext) redrawn at 10 Hz cost a large share of a core
(docs/performance.md).

A *line* is a tuple of spans, each ``(text, style)`` with a Rich style string ("" for the widget's
own style; a `rich.style.Style` is accepted too, e.g. one read from the CSS). Lines are hashable
and compare by value, which is how a line-API widget tells which of its lines changed
(`loadertop.tui.widgets.lines`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rich.cells import cell_len

Span = tuple[str, Any]  # (text, Rich style string or rich.style.Style)
Line = tuple[Span, ...]

SPARK_CHARS = "▁▂▃▄▅▆▇█"
BAR_PARTIAL = " ▏▎▍▌▋▊▉"
TRACK = "·"  # the empty part of a bar
ELLIPSIS = "…"


# --------------------------------------------------------------------------- sparklines


def _peak(values: Sequence[float | None], top: float | None) -> float:
    if top is not None:
        return top
    return max((v for v in values if v is not None), default=0.0)


def _last(values: Iterable[float | None], width: int) -> list[float | None]:
    if width <= 0:
        return []
    vals = values if isinstance(values, list) else list(values)
    return vals[-width:]


def sparkline(values: Iterable[float | None], width: int, top: float | None = None) -> str:
    """The last ``width`` values as one row of eighth blocks, right-aligned; None is a gap.

    Scaled to ``top`` (e.g. 100 for a percentage) or else to the largest value shown; a known value
    shows at least the lowest block, so 0 is told apart from unknown."""
    vals = _last(values, width)
    peak = _peak(vals, top)
    top_index = len(SPARK_CHARS) - 1
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        elif peak <= 0:
            out.append(SPARK_CHARS[0])
        else:
            out.append(SPARK_CHARS[int(round(min(max(v / peak, 0.0), 1.0) * top_index))])
    return " " * (width - len(out)) + "".join(out)


def sparkline_rows(values: Iterable[float | None], width: int, height: int,
                   top: float | None = None) -> list[str]:
    """A sparkline ``height`` rows tall (eighth-block resolution per row), top row first."""
    if height <= 1:
        return [sparkline(values, width, top)]
    vals = _last(values, width)
    peak = _peak(vals, top)
    levels: list[int | None] = []
    for v in vals:
        if v is None:
            levels.append(None)
        else:
            level = 0 if peak <= 0 else int(round(min(max(v / peak, 0.0), 1.0) * height * 8))
            levels.append(max(1, level))  # a known value shows at least the lowest eighth
    pad = " " * (width - len(levels))
    rows = []
    for r in range(height - 1, -1, -1):  # r: the row's index from the bottom
        chars = []
        for eighths in levels:
            fill = -1 if eighths is None else eighths - r * 8
            chars.append(" " if fill <= 0 else "█" if fill >= 8 else SPARK_CHARS[fill - 1])
        rows.append(pad + "".join(chars))
    return rows


def known_height(values: Iterable[float | None], width: int, room: int, *, most: int = 8,
                 points_per_row: int = 3) -> int:
    """Rows for a graph: what the room allows, at most ``most`` (taller is a wall of blocks), and no
    taller than its history (a row per ``points_per_row`` known points: a few points drawn tall are a
    solid block)."""
    known = sum(1 for v in _last(values, width) if v is not None)
    return max(1, min(most, room, known // points_per_row))


def peak(values: Iterable[float | None], width: int) -> float | None:
    """The largest known value among the last ``width``, None without one."""
    return max((v for v in _last(values, width) if v is not None), default=None)


# --------------------------------------------------------------------------- bars


def bar(fraction: float | None, width: int) -> tuple[str, str]:
    """A horizontal bar with eighth-block resolution: (filled part, empty track).

    Unknown (None) is all track, so it never reads as a made-up 0 % bar... nor as a full one."""
    width = max(1, width)
    if fraction is None:
        return "", TRACK * width
    cells = min(max(fraction, 0.0), 1.0) * width
    full = int(cells)
    part = BAR_PARTIAL[int((cells - full) * 8)] if full < width else ""
    filled = "█" * full + part.strip()
    return filled, TRACK * (width - len(filled))


def bar_spans(fraction: float | None, width: int, colour: str, track_style: str) -> Line:
    filled, track = bar(fraction, width)
    return tuple(s for s in ((filled, colour), (track, track_style)) if s[0])


def stacked_bar(parts: Sequence[tuple[float | None, str, Any]], width: int,
                track_style: Any) -> Line:
    """One bar of several parts, htop's meter style: ``parts`` are ``(fraction, glyph, style)``,
    left to right, each drawn ``glyph`` × its share of ``width`` cells (shares of 1 in all; what
    they leave is track). Cells go to the parts by the largest remainder, so the cells add up to
    the parts' sum however they round; an unknown (None) or negative part takes none."""
    width = max(1, width)
    shares = [min(max(f or 0.0, 0.0), 1.0) for f, _, _ in parts]
    total = sum(shares)
    if total > 1.0:  # rounding in the figures (0.62 + 0.381): scale down to the bar
        shares = [s / total for s in shares]
        total = 1.0
    exact = [s * width for s in shares]
    counts = [int(e) for e in exact]
    filled = min(width, int(round(total * width)))
    # The cells rounding left over go to the parts that lost most to it.
    for i in sorted(range(len(parts)), key=lambda i: exact[i] - counts[i], reverse=True):
        if sum(counts) >= filled:
            break
        if exact[i] > counts[i]:
            counts[i] += 1
    out: list[Span] = [(glyph * n, style) for (_, glyph, style), n in zip(parts, counts) if n > 0]
    rest = width - sum(counts)
    if rest > 0:
        out.append((TRACK * rest, track_style))
    return tuple(out)


# --------------------------------------------------------------------------- the core grid

MAX_CORE_ROWS = 4
MIN_CORE_BAR = 3
#: A grid cell without its bar: "15▕" + "▏ 97%" + the space between cells.
_CELL_TEXT = 2 + 5 + 1


def core_grid(per_cpu: Sequence[float | None], width: int, colour: Callable[[float | None], str],
              dim: str, accent: str, missing: str = "–") -> list[Line]:
    """Per-core bars in up to 4 rows (``"15▕███▏ 97%"``, cores numbered down the columns); with too
    many cores for the room, one sparkline block per core instead."""
    n = len(per_cpu)
    if n == 0:
        return []
    rows = min(n, MAX_CORE_ROWS)
    cols = math.ceil(n / rows)
    num_w = len(str(n - 1))
    bar_w = (width + 1) // cols - (num_w + _CELL_TEXT)
    if bar_w < MIN_CORE_BAR:
        chunk = max(1, width - 6)
        return [(("cores " if start == 0 else "      ", dim),
                 (sparkline(per_cpu[start:start + chunk], len(per_cpu[start:start + chunk]),
                            top=100.0), accent))
                for start in range(0, n, chunk)]
    out: list[Line] = []
    for r in range(rows):
        line: list[Span] = []
        for c in range(cols):
            i = c * rows + r
            if i >= n:
                break
            if c:
                line.append((" ", ""))
            v = per_cpu[i]
            line += [(f"{i:>{num_w}}", dim), ("▕", dim)]
            line += bar_spans(None if v is None else v / 100, bar_w, colour(v), dim)
            line += [("▏", dim), (f"{missing if v is None else f'{v:.0f}':>3}%".rjust(5), "")]
        out.append(tuple(line))
    return out


# --------------------------------------------------------------------------- lines

#: Characters the screen draws with that take one cell (Rich agrees); with ASCII, a string made of
#: them is as wide as it is long, which is measured without Rich's per-character table (a new
#: sparkline every tick missed Rich's cache, a noticeable share of the viewer's CPU:
#: docs/performance.md).
_ONE_CELL = str.maketrans("", "", SPARK_CHARS + BAR_PARTIAL + TRACK + ELLIPSIS
                          + "▕▏–●✖⟳◀▶▲▼÷≥×⏸│°░▒▓")


def cells(text: str) -> int:
    """The width of ``text`` in terminal cells."""
    if text.isascii() or text.translate(_ONE_CELL).isascii():
        return len(text)
    return cell_len(text)


def line_len(line: Line) -> int:
    return sum(cells(text) for text, _ in line)


def fit(line: Line, width: int) -> Line:
    """``line`` cut to ``width`` cells, with an ellipsis where it was cut (never wrapped)."""
    if width <= 0:
        return ()
    if line_len(line) <= width:
        return line
    out: list[Span] = []
    room = width - 1  # keep a cell for the ellipsis
    last_style = ""
    for text, style in line:
        n = cells(text)
        if n <= room:
            out.append((text, style))
            room -= n
            last_style = style
            continue
        cut = _cut(text, room)
        if cut:
            out.append((cut, style))
        last_style = style
        break
    out.append((ELLIPSIS, last_style))
    return tuple(out)


def _cut(text: str, width: int) -> str:
    """The longest prefix of ``text`` that fits ``width`` cells."""
    if width <= 0:
        return ""
    if len(text) == cells(text):  # no wide characters: cells are characters
        return text[:width]
    out, used = [], 0
    for ch in text:
        w = cell_len(ch)
        if used + w > width:
            break
        out.append(ch)
        used += w
    return "".join(out)


def wrap(line: Line, width: int, indent: int = 0) -> list[Line]:
    """``line`` broken at spaces into rows of at most ``width`` cells (continuation rows indented by
    ``indent``); a word longer than a row is cut."""
    if width <= 0:
        return [()]
    if line_len(line) <= width:
        return [line]
    indent = max(0, min(indent, width // 2))
    # Words with their styles: a word is a run of non-spaces, kept with the spaces before it.
    tokens: list[tuple[str, str]] = []
    for text, style in line:
        word = ""
        for ch in text:
            if ch == " " and word and not word.isspace():
                tokens.append((word, style))
                word = ""
            word += ch
        if word:
            tokens.append((word, style))
    rows: list[list[Span]] = [[]]
    used = 0
    for text, style in tokens:
        n = cells(text)
        if used + n > width and used > (indent if len(rows) > 1 else 0):
            rows.append([(" " * indent, "")] if indent else [])
            used = indent
            text = text.lstrip(" ")
            n = cells(text)
        while used + n > width:  # a word longer than a whole row
            room = width - used
            head = _cut(text, room) or text[0]  # a wide character at a row's end: overflow it
            rows[-1].append((head, style))
            rows.append([(" " * indent, "")] if indent else [])
            used = indent
            text = text[len(head):]
            n = cells(text)
        rows[-1].append((text, style))
        used += n
    return [merge(r) for r in rows]


def merge(spans: Iterable[Span]) -> Line:
    """Adjacent spans of one style joined (fewer segments to draw)."""
    out: list[Span] = []
    for text, style in spans:
        if not text:
            continue
        if out and out[-1][1] == style:
            out[-1] = (out[-1][0] + text, style)
        else:
            out.append((text, style))
    return tuple(out)


def plain(line: Line) -> str:
    return "".join(text for text, _ in line)
