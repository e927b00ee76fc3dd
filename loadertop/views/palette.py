"""The names and colours of the diagnosis categories and finding severities: one table for the
screen (`tui.theme` re-exports it) and for the HTML report (`recording.report`), so a
verdict has the same words and colour in both.

Pure and imported by the report without Textual: the `tui` package imports Textual, so
these tables cannot live in a module under it. Colours are Rich style strings (ANSI names or hex);
`paper_colour` maps them to colours readable on a page (the HTML report, the notebook's panel).
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


# --------------------------------------------------------------------------- on a page

#: The terminal colour names as shades readable on a page, white or dark (the HTML report's plots
#: and the notebook's panel); hex colours pass as they are.
PAPER_COLOURS = {"green": "#2e9d4a", "yellow": "#e3b505", "red": "#d43b35", "cyan": "#1f9eb5"}


def paper_colour(rich: str) -> str:
    """A Rich style colour of the TUI ("bold red", "#ff8700") as a colour for a page."""
    colour = rich.split()[-1] if rich else DIM
    return PAPER_COLOURS.get(colour, colour if colour.startswith("#") else DIM)


def category_colour(category: str | None) -> str:
    """A diagnosis category's colour on a page (None: not diagnosed yet)."""
    return paper_colour(category_style(category).colour)


#: Source states (docs/contract.md §3) → colour of the state word; "crashed" is a finished source whose
#: loop (or process) ended with an exception, "stopped" one a signal ended, "died" a gone one whose
#: process died without a goodbye (`views.text.shown_state`).
STATE_COLOURS: dict[str, str] = {"running": OK, "waiting": WARN, "stalled": f"bold {BAD}",
                                 "gone": BAD, "crashed": f"bold {BAD}", "stopped": WARN,
                                 "died": f"bold {BAD}"}


# --------------------------------------------------------------------------- where the time goes


class StagePart(NamedTuple):
    glyph: str  # the bar's cells (told apart without colour too: --no-color, NO_COLOR)
    colour: str


#: The parts of the "where the time goes" bar (the TUI's loader panel, the notebook's panel), each
#: in the colour of the verdict it points to when it dominates: the loop's own step
#: (compute-bound), waiting while the batch is produced (input-bound), the handoff after
#: (main-process-bound); `wait` is the whole wait when the probe could not split it.
STAGE_PARTS: dict[str, StagePart] = {
    "step": StagePart("█", CATEGORY_STYLES[diagnosis.COMPUTE_BOUND].colour),
    "producing": StagePart("▓", CATEGORY_STYLES[diagnosis.INPUT_BOUND_CPU].colour),
    "handoff": StagePart("▒", CATEGORY_STYLES[diagnosis.MAIN_PROCESS_BOUND].colour),
    "wait": StagePart("▓", CATEGORY_STYLES[diagnosis.INPUT_BOUND_CPU].colour),
}


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
