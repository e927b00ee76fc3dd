"""The names and colours of the diagnosis categories and finding severities: one table for the
screen (`tui.theme` re-exports it) and for the HTML report (`recording.report`), so a
verdict has the same words and colour in both.

Pure and imported by the report without Textual: the `tui` package imports Textual, so
these tables cannot live in a module under it. Colours are Rich style strings (ANSI names or hex);
the report maps them to colours readable on paper.
"""

from __future__ import annotations

from typing import NamedTuple

from loadertop import diagnosis
from loadertop.client.document import Category, Severity

# --------------------------------------------------------------------------- colours

OK, WARN, BAD, DIM, ACCENT = "green", "yellow", "red", "#9e9e9e", "cyan"
ORANGE = "#ff8700"


class CategoryStyle(NamedTuple):
    words: str  # what the banner, the loader panel's title and the overview say
    colour: str  # Rich colour of the words
    level: str  # the banner's CSS class suffix: ok / warn / bad / none


#: Each diagnosis category (docs/contract.md §4) as the screen names and colours it: its words and
#: colour live in its own module (`loadertop.diagnosis.categories`), collected here in the
#: contract's order (a test checks the key set is `diagnosis.CATEGORIES`).
CATEGORY_STYLES: dict[Category, CategoryStyle] = {
    c.CATEGORY: CategoryStyle(c.WORDS, c.COLOUR, c.LEVEL)
    for c in sorted(diagnosis.LADDER, key=lambda c: diagnosis.CATEGORIES.index(c.CATEGORY))
}
NO_DIAGNOSIS = CategoryStyle("No diagnosis yet", DIM, "none")


def source_title(name: str, rank: int | None) -> str:
    """"train", or "train r1" for rank 1 of a distributed run."""
    return (name or "?") + (f" r{rank}" if rank is not None else "")


def category_style(category: str | None) -> CategoryStyle:
    if category is None:
        return NO_DIAGNOSIS
    found = CATEGORY_STYLES.get(category)  # type: ignore[call-overload]
    return found or CategoryStyle(category.replace("_", " "), DIM, "none")


def pending_words(pending: str, shown: str | None) -> str:
    """"changing to input-bound?": a change the verdict's hysteresis holds back
    (`Verdict.pending`), in the pending category's words — their part before the colon where
    that tells it from the category shown (`Input-bound: waiting on I/O` after `Healthy: …`),
    else whole (after `Input-bound: workers CPU-limited`) — first letter lowered unless the word
    is an acronym ("CPU saturated")."""
    words = category_style(pending).words
    head = words.split(":", 1)[0]
    if head != category_style(shown).words.split(":", 1)[0]:
        words = head
    if words[1:2].islower():
        words = words[0].lower() + words[1:]
    return f"changing to {words}?"


# --------------------------------------------------------------------------- findings


class SeverityStyle(NamedTuple):
    glyph: str  # told apart without colour too (--no-color, NO_COLOR)
    colour: str
    word: str  # the findings list's heading word


#: Each finding severity (docs/contract.md §5) as the screen marks it; a test checks the key set is
#: `document.SEVERITIES`.
SEVERITY_STYLES: dict[Severity, SeverityStyle] = {
    "critical": SeverityStyle("✖", BAD, "CRITICAL"),
    "warning": SeverityStyle("▲", WARN, "WARNING"),
    "info": SeverityStyle("●", ACCENT, "INFO"),
}


def severity_style(severity: str) -> SeverityStyle:
    return SEVERITY_STYLES.get(severity) or SeverityStyle("●", DIM, severity.upper())  # type: ignore[call-overload]
