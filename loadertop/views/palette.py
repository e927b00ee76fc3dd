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


#: Each diagnosis category (CONTRACT §4) as the screen names and colours it; keyed by the
#: diagnosis' own constants (a test checks the key set is `diagnosis.CATEGORIES`).
CATEGORY_STYLES: dict[Category, CategoryStyle] = {
    diagnosis.COMPUTE_BOUND: CategoryStyle("Healthy: compute-bound", OK, "ok"),
    diagnosis.INPUT_BOUND_IO: CategoryStyle("Input-bound: waiting on I/O", WARN, "warn"),
    diagnosis.INPUT_BOUND_CPU: CategoryStyle("Input-bound: workers CPU-limited", WARN, "warn"),
    diagnosis.MAIN_PROCESS_BOUND: CategoryStyle("Main-process-bound", ORANGE, "warn"),
    diagnosis.CPU_SATURATED: CategoryStyle("CPU saturated", BAD, "bad"),
    diagnosis.MEMORY_PRESSURE: CategoryStyle("Memory pressure", BAD, "bad"),
    diagnosis.STALLED: CategoryStyle("Stalled", BAD, "bad"),
    diagnosis.IDLE: CategoryStyle("Idle", DIM, "none"),
    diagnosis.INSUFFICIENT_DATA: CategoryStyle("Gathering data", DIM, "none"),
}
NO_DIAGNOSIS = CategoryStyle("No diagnosis yet", DIM, "none")


def category_style(category: str | None) -> CategoryStyle:
    if category is None:
        return NO_DIAGNOSIS
    found = CATEGORY_STYLES.get(category)  # type: ignore[call-overload]
    return found or CategoryStyle(category.replace("_", " "), DIM, "none")


# --------------------------------------------------------------------------- findings


class SeverityStyle(NamedTuple):
    glyph: str  # told apart without colour too (--no-color, NO_COLOR)
    colour: str
    word: str  # the findings list's heading word


#: Each finding severity (CONTRACT §5) as the screen marks it; a test checks the key set is
#: `document.SEVERITIES`.
SEVERITY_STYLES: dict[Severity, SeverityStyle] = {
    "critical": SeverityStyle("✖", BAD, "CRITICAL"),
    "warning": SeverityStyle("▲", WARN, "WARNING"),
    "info": SeverityStyle("●", ACCENT, "INFO"),
}


def severity_style(severity: str) -> SeverityStyle:
    return SEVERITY_STYLES.get(severity) or SeverityStyle("●", DIM, severity.upper())  # type: ignore[call-overload]
