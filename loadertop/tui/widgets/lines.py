"""`LineWidget`: the base of every text panel and graph on the screen, drawn through Textual's line
API.

A subclass says what to show as a list of *lines* (`graphics.Line`: tuples of ``(text, style)``
spans) built for a width. `update_lines()` rebuilds them after new data and compares them with the
lines on screen: only the lines that differ are marked dirty (``refresh(region)`` of one row each),
and the screen is laid out again only when the number of lines changed. `render_line(y)` returns
the cached `Strip` of line ``y``, made once per change.

Why not `Static`/`render()`: a widget that renders returns one renderable, and any change repaints
all of it through Rich's layout; the profile of the first viewer showed Textual composing and Rich
rendering the panels as most of its CPU. Here a tick that changes one figure repaints one row,
and a graph that gained a point repaints the rows of that graph (memray's live TUI draws its graphs
the same way; Textual's own `Log` and `DataTable` are line-API widgets too).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from loadertop.tui.theme import BAD
from loadertop.tui.widgets.graphics import Line, fit, line_len


@lru_cache(maxsize=512)
def _parse(style: str) -> Style:
    return Style.parse(style) if style else Style.null()


def rich_style(style: str | Style) -> Style:
    """A Rich style from a span's style string, parsed once ("" is the widget's own style)."""
    return style if isinstance(style, Style) else _parse(style)


def to_strip(line: Line, width: int, base: Style) -> Strip:
    """One line as a `Strip` exactly ``width`` cells wide, over the widget's own style ``base``
    (its CSS colour and background: a span without a background shows the widget's)."""
    line = fit(line, width)
    segments = [Segment(text, base + rich_style(style)) for text, style in line if text]
    strip = Strip(segments, line_len(line))
    return strip.adjust_cell_length(width, base)


class LineWidget(Widget):
    """A widget that shows ``build(width)`` line by line (see the module's docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lines: list[Line] = []
        self._strips: list[Strip | None] = []
        self._built_width = -1
        self._base: Style | None = None
        self._shown_title: str | None = None

    # ------------------------------------------------------------------ for subclasses

    def build(self, width: int) -> list[Line]:
        """The lines to show at ``width`` cells (each is cut to the width with an ellipsis)."""
        return []

    def update_lines(self) -> None:
        """Rebuild the lines after new data; repaint only those that changed."""
        width = self._width()
        new = self._safe_build(width)
        old, self._lines, self._built_width = self._lines, new, width
        if len(new) != len(old) or not self.is_mounted:
            self._strips = [None] * len(new)
            self.refresh(layout=True)
            return
        row_width = max(width, self.size.width)
        for y, (before, after) in enumerate(zip(old, new)):
            if before != after:
                self._strips[y] = None
                self.refresh(Region(0, y, row_width, 1))

    def set_title(self, title: str) -> None:
        """Set the border title; Textual repaints on every assignment, equal or not, so assign
        only a change."""
        if title != self._shown_title:
            self._shown_title = title
            self.border_title = title

    @property
    def lines(self) -> list[Line]:
        """The lines on screen (tests read them as text with `graphics.plain`)."""
        return self._lines

    def text(self) -> str:
        """What the widget shows, as plain text, one line per row."""
        return "\n".join("".join(t for t, _ in line) for line in self._lines)

    # ------------------------------------------------------------------ Textual's side

    def _width(self) -> int:
        width = self.size.width
        return width if width > 0 else max(self._built_width, 40)

    def _safe_build(self, width: int) -> list[Line]:
        try:
            return self.build(width)
        except Exception as exc:  # a malformed document must not take the screen down
            return [((f"cannot show: {exc!r}", BAD),)]

    def _rebuild_for(self, width: int) -> None:
        if width != self._built_width:
            self._lines = self._safe_build(width)
            self._built_width = width
            self._strips = [None] * len(self._lines)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._rebuild_for(width)
        return len(self._lines)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return container.width

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._base = None  # colours or background changed (a class, the theme): redo every strip
        self._strips = [None] * len(self._lines)

    def on_resize(self) -> None:
        self._rebuild_for(self.size.width)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self._base
        if base is None:
            base = self._base = self.visual_style.rich_style
        self._rebuild_for(width)
        if y >= len(self._lines):
            return Strip.blank(width, base)
        strip = self._strips[y]
        if strip is None:
            strip = self._strips[y] = to_strip(self._lines[y], width, base)
        return strip
