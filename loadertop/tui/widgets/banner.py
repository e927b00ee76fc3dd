"""The banner: the bottleneck as the diagnosis named it — the category in its words and colour, the
change its hysteresis holds back (`· changing to …?`), the source it is about, the summary, the
deciding evidence and the first advice.

The diagnosis lists a verdict's evidence with the deciding figures first (the wait fraction
against its threshold, then what told I/O from CPU, …) and its advice with the first thing to try
first; the banner shows them in that order, as many as fit: wide, up to `MAX_ROWS` rows with the
lines wrapped; compact, one row each, cut with an ellipsis. While findings are listed under the
banner on a small terminal (compact, or wide under `findings.LEAN_HEIGHT` lines), the banner gives
them its evidence rows (80×24 has no row to spare; a finding's line is evidence too, and `e` lists
them all).
"""

from __future__ import annotations

from typing import Any

from loadertop.client.document import OverallVerdict
from loadertop.tui.theme import DIM, category_style, pending_words
from loadertop.tui.widgets import graphics
from loadertop.tui.widgets.graphics import Line, Span
from loadertop.tui.widgets.lines import LineWidget

#: Rows the banner takes at most (wide; compact: one per part, 3).
MAX_ROWS = 5
#: Evidence items shown: wide (wrapped), compact (on one row).
EVIDENCE_WIDE, EVIDENCE_COMPACT = 3, 2
LEVELS = ("ok", "warn", "bad", "none")


class Banner(LineWidget):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key: tuple[object, ...] | None = None
        self._verdict: OverallVerdict | None = None
        self._about: str | None = None
        self._waiting: str | None = None
        self._compact = False
        self._findings_below = False
        self._set_level("none")

    def _set_level(self, level: str) -> None:
        for name in LEVELS:
            self.set_class(name == level, f"-{name}")

    def show(self, verdict: OverallVerdict | None, about: str | None, *, compact: bool,
             waiting: str | None = None, findings_below: bool = False) -> None:
        """``about``: the label of the source the verdict is about (None: the machine);
        ``waiting``: nothing has arrived yet (say so, rather than diagnose an empty window);
        ``findings_below``: the findings' lines follow the banner and take its evidence rows."""
        key = (verdict, about, compact, waiting, findings_below)
        if key == self._key:
            return
        self._key = key
        self._verdict, self._about, self._compact, self._waiting = verdict, about, compact, waiting
        self._findings_below = findings_below
        if waiting:
            self._set_level("none")
        else:
            self._set_level(category_style(verdict.category if verdict else None).level)
        self.update_lines()

    def build(self, width: int) -> list[Line]:
        if self._waiting:
            return [(("WAITING FOR DATA", f"bold {DIM}"), ("  ", ""),
                     (self._waiting.replace("waiting for data ", ""), DIM),
                     ("  — the job may still be starting", DIM))]
        verdict = self._verdict
        cat = category_style(verdict.category if verdict else None)
        head: list[Span] = [(cat.words.upper(), f"bold {cat.colour}")]
        if verdict is not None and verdict.pending is not None:
            # next to the category it qualifies: a cut summary (compact) never hides it
            head.append((f" · {pending_words(verdict.pending, verdict.category)}",
                         category_style(verdict.pending).colour))
        if self._about:
            head.append((f"  [{self._about}]", DIM))
        if verdict is None:
            return [tuple(head)]
        head += [("  ", ""), (verdict.summary, "")]
        evidence = verdict.evidence[:EVIDENCE_COMPACT if self._compact else EVIDENCE_WIDE]
        if self._findings_below:
            evidence = ()
        evidence_line: Line = (("evidence ", DIM), ("; ".join(evidence), "")) if evidence else ()
        advice_line: Line = (("→ ", f"bold {cat.colour}"), (verdict.advice[0], "")) if verdict.advice else ()
        parts = [tuple(head), evidence_line, advice_line]
        if self._compact:
            return [p for p in parts if p]
        # Wide: wrap each part; when they need more than MAX_ROWS, the evidence gives way first,
        # then the summary (the advice, what to do, keeps its first rows).
        head_rows = graphics.wrap(parts[0], width, indent=2)
        evidence_rows = graphics.wrap(evidence_line, width, indent=2) if evidence_line else []
        advice_rows = _at_most(graphics.wrap(advice_line, width, indent=2), 2, width) if advice_line else []
        head_rows = _at_most(head_rows, MAX_ROWS - len(advice_rows) - min(1, len(evidence_rows)), width)
        evidence_rows = _at_most(evidence_rows, MAX_ROWS - len(head_rows) - len(advice_rows), width)
        return [*head_rows, *evidence_rows, *advice_rows]


def _at_most(rows: list[Line], most: int, width: int) -> list[Line]:
    """The first ``most`` rows of a wrapped line, the last one ending in an ellipsis when rows were
    left out."""
    if len(rows) <= most:
        return rows
    if most <= 0:
        return []
    last = rows[most - 1]
    if graphics.line_len(last) < width:
        last = (*last, (graphics.ELLIPSIS, ""))
    else:
        last = graphics.fit((*last, (graphics.ELLIPSIS, "")), width)
    return [*rows[:most - 1], last]
