"""Findings (docs/contract.md §5) on screen: the lines under the banner, and the list the `e` key opens.

Under the banner (`FindingsBar`), one line per finding of the shown source and of the machine,
most severe first: the severity's mark in its colour, the kind in words, the worker, the summary.
A hang's finding (`worker_hung` first, then `loop_hung`) gets its stack right under its line, as
`py-spy dump` prints one — innermost frame first, ``function (file:line)`` — with the user's own
innermost frame marked. The rows it takes are bounded (`bar_rows`): at 80×24 the screen has none
to spare, so there it is two rows — the hang's line, and one row from the user's frame in to the
one it is stuck in (``▶ _read_record (shards.py:61) → read → readinto (socket.py:720)``) — and a
"+N more · e" that says where the rest are.

The list (`FindingsScreen`) shows every finding of every source and of the machine with its
evidence, advice and whole stack (full paths where they fit the width), and how crashed loops
ended; it follows the document while it is open (the app hands it each new one).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen

from loadertop.client.document import FINDING_KINDS, SEVERITIES, Document, Finding, Source
from loadertop.client.units import fmt_duration
from loadertop.tui.theme import (
    ACCENT,
    DIM,
    END_MARKS,
    HANG_KINDS,
    finding_words,
    severity_style,
    source_labels,
    worst,
)
from loadertop.tui.widgets import graphics
from loadertop.tui.widgets.graphics import Line, Span
from loadertop.tui.widgets.lines import LineWidget
from loadertop.views.text import (
    FindingStack,
    end_words,
    finding_stack,
    severity_counts,
    short_location,
    split_frame,
)

#: Rows under the banner at most, compact (80×24 has none to spare: the banner gives its evidence
#: row for them, and the loader panel its graph's row to a blocked or crashed line) and wide (the
#: loader panel's graphs give them: from 2 rows at 30 lines to `WIDE_MAX_ROWS` from 50, see
#: `bar_rows`). Below `LEAN_HEIGHT` lines the banner gives its evidence rows to the findings too.
COMPACT_ROWS = 2
WIDE_MAX_ROWS = 12
LEAN_HEIGHT = 40
#: Of those rows, the findings' own lines at most, wide (the rest go to a hang's stack).
WIDE_FINDINGS = 4
#: A hang's frames shown under the banner at most, wide (the list shows them all).
WIDE_FRAMES = 8
#: The user's frame is marked so; other frames are indented to match.
USER_MARK, FRAME_INDENT = "▶ ", "    "


def bar_rows(height: int, compact: bool) -> int:
    """Rows the findings may take under the banner on a terminal ``height`` rows tall."""
    if compact:
        return COMPACT_ROWS
    return max(COMPACT_ROWS, min(WIDE_MAX_ROWS, (height - 30) // 2 + COMPACT_ROWS))


def lean(height: int, compact: bool) -> bool:
    """Whether the banner gives its evidence rows to the findings (when there are any)."""
    return compact or height < LEAN_HEIGHT


def shown_findings(doc: Document | None, src: Source | None) -> tuple[Finding, ...]:
    """The findings of ``src`` and of the machine, most severe first."""
    if doc is None:
        return ()
    machine = tuple(f for f in doc.findings if f.source is None)
    own = src.findings if src is not None else ()
    merged = [*own, *machine]
    return tuple(sorted(merged, key=lambda f: SEVERITIES.index(f.severity)
                        if f.severity in SEVERITIES else len(SEVERITIES)))


def hang_of(findings: Sequence[Finding]) -> Finding | None:
    """The hang whose stack is shown: a hung worker's first (it says why the loop waits)."""
    for kind in HANG_KINDS:
        for f in findings:
            if f.kind == kind and f.stack:
                return f
    return None


def marks(findings: Sequence[Finding]) -> Line:
    """"✖ 2" — how many findings, in the colour of the worst (the overview, the header's tabs)."""
    top = worst(findings)
    if top is None:
        return ()
    style = severity_style(top.severity)
    return ((f"{style.glyph} {len(findings)}", f"bold {style.colour}"),)


def who(finding: Finding) -> str | None:
    """"worker 2", "machine", or None when the summary already names the worker (or there is
    none to name)."""
    if finding.source is None:
        return "machine"
    if finding.worker is not None and f"worker {finding.worker}" not in finding.summary:
        return f"worker {finding.worker}"
    return None


def finding_line(finding: Finding) -> Line:
    """"✖ worker died  worker 2 (pid 4321) died: killed by SIGKILL …"."""
    style = severity_style(finding.severity)
    line: list[Span] = [(f"{style.glyph} {finding_words(finding.kind)}", f"bold {style.colour}"),
                        ("  ", "")]
    name = who(finding)
    if name:
        line += [(name, "bold"), (" · ", DIM)]
    line.append((finding.summary, ""))
    return tuple(line)


class FrameRow(NamedTuple):
    frame: int | None  # its index in the stack (innermost last); None: a gap ("⋮ N frames")
    skipped: int = 0


def pick_frames(stack: FindingStack, most: int) -> list[FrameRow]:
    """At most ``most`` rows of a stack, innermost first: the innermost frames, and — where it is
    further out — a gap and the user's frame (with two rows: the innermost and the user's)."""
    n = len(stack.frames)
    order = list(range(n - 1, -1, -1))  # innermost first
    if n <= most:
        return [FrameRow(i) for i in order]
    user = stack.user_frame
    if user is None or n - 1 - user < most:
        return [FrameRow(i) for i in order[:most]]
    position = n - 1 - user  # the user's frame, counted from the innermost
    if most <= 2:
        return [FrameRow(order[0]), FrameRow(user)][:max(1, most)]
    head = order[:most - 2]
    return [*(FrameRow(i) for i in head), FrameRow(None, position - len(head)), FrameRow(user)]


def call_chain(stack: FindingStack, width: int) -> Line:
    """One row, from the user's frame in to the innermost (the order calls go):
    ``▶ _read_record (…/shards.py:61) → read (fsspec/spec.py:1941) → readinto (socket.py:720)``;
    the frames between left out (``→ … →``) where they do not fit; without a user's frame, the
    two innermost."""
    n = len(stack.frames)
    user = stack.user_frame
    first = user if user is not None else max(0, n - 2)

    def frame(i: int, marked: bool) -> Line:
        function, location = split_frame(stack.frames[i])
        where = short_location(location)
        style = f"bold {ACCENT}" if marked else ""
        return ((function or where, style), (f" ({where})" if function else "", ACCENT if marked else DIM))

    arrow: Line = ((" → ", DIM),)
    head: Line = ((USER_MARK.rjust(len(FRAME_INDENT)), f"bold {ACCENT}"),) if user is not None \
        else ((FRAME_INDENT, ""), ("… → ", DIM))
    frames = [frame(i, i == user) for i in range(first, n)]
    full: list[Span] = [*head]
    for k, f in enumerate(frames):
        full += [*(arrow if k else ()), *f]
    if graphics.line_len(tuple(full)) <= width or len(frames) <= 2:
        return tuple(full)
    return (*head, *frames[0], *arrow, ("…", DIM), *arrow, *frames[-1])


def frame_line(stack: FindingStack, row: FrameRow, *, full: bool = False) -> Line:
    """One frame as py-spy prints it: ``function (file:line)``, the user's marked."""
    if row.frame is None:
        return ((FRAME_INDENT, ""), (f"⋮ {row.skipped} frame{'s' if row.skipped != 1 else ''}", DIM))
    function, location = split_frame(stack.frames[row.frame])
    where = location if full else short_location(location)
    if row.frame == stack.user_frame:
        return ((USER_MARK.rjust(len(FRAME_INDENT)), f"bold {ACCENT}"),
                (function or where, f"bold {ACCENT}"), (f" ({where})" if function else "", ACCENT),
                ("  ◀ your code", DIM))
    return ((FRAME_INDENT, ""), (function or where, ""), (f" ({where})" if function else "", DIM))


class FindingsBar(LineWidget):
    """The shown source's and the machine's findings under the banner (see the module)."""

    LEVELS = ("critical", "warning", "info")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key: tuple[Any, ...] | None = None
        self._findings: tuple[Finding, ...] = ()
        self._src: Source | None = None
        self._elsewhere: list[tuple[str, tuple[Finding, ...]]] = []  # other sources': label, findings
        self._rows = COMPACT_ROWS
        self._compact = False
        self.set_class(True, "-empty")

    def show(self, doc: Document | None, src: Source | None, *, rows: int, compact: bool) -> None:
        findings = shown_findings(doc, src)
        elsewhere = []
        if doc is not None:
            elsewhere = [(label, s.findings) for s, label in zip(doc.sources, source_labels(doc.sources))
                         if s.findings and (src is None or s.id != src.id)]
        stack_figures = None
        if src is not None and hang_of(findings) is not None:
            stack_figures = (src.loop_stack, tuple(w.stack for w in src.workers))
        key = (findings, stack_figures, elsewhere, rows, compact)
        if key == self._key:
            return
        self._key = key
        self._findings, self._src, self._elsewhere = findings, src, elsewhere
        self._rows, self._compact = rows, compact
        top = worst(findings)
        for level in self.LEVELS:
            self.set_class(top is not None and top.severity == level, f"-{level}")
        self.set_class(not findings and not elsewhere, "-empty")
        self.update_lines()

    def build(self, width: int) -> list[Line]:
        findings = list(self._findings)
        if not findings:
            if not self._elsewhere:
                return []
            return [(("in other sources: ", DIM), *self._elsewhere_spans(),
                     ("  · tab reaches them, e lists them", DIM))]
        hang = hang_of(findings)
        stack = finding_stack(hang, self._src) if hang is not None else None
        if hang is not None:  # its stack goes under its line: first
            findings.remove(hang)
            findings.insert(0, hang)
        rows = self._rows
        chain = self._compact or rows <= COMPACT_ROWS  # the stack as one row (see call_chain)
        frames: list[FrameRow] = []
        if stack is not None and chain:
            shown = findings[:max(1, rows - 1)]
        elif stack is not None:
            shown = findings[:min(WIDE_FINDINGS, max(1, rows - 3))]
            frames = pick_frames(stack, max(2, min(WIDE_FRAMES, rows - len(shown) - 1)))
        else:
            shown = findings[:min(WIDE_FINDINGS, rows)]
        hidden = len(findings) - len(shown)
        lines = [finding_line(f) for f in shown]
        suffix = self._suffix(hidden)
        if suffix:
            last = lines[-1]
            lines[-1] = (*graphics.fit(last, max(1, width - graphics.line_len(suffix))), *suffix)
        if hang is None or stack is None:
            return lines
        if chain:
            lines.insert(1, call_chain(stack, width))  # under the hang's own line
        else:
            more = len(stack.frames) - sum(1 for r in frames if r.frame is not None)
            head = f"stack of {_thread(hang)}, innermost first"
            head += f" · {more} more frame{'s' if more != 1 else ''} (e)" if more else ""
            lines[1:1] = [((FRAME_INDENT, ""), (head, DIM)),
                          *(frame_line(stack, row) for row in frames)]
        return lines

    def _elsewhere_spans(self) -> list[Span]:
        """"val ✖ 2  train r1 ▲ 1": the other sources with findings, each with its marks."""
        out: list[Span] = []
        for i, (label, findings) in enumerate(self._elsewhere):
            out += [("  " if i else "", ""), (f"{label} ", "bold"), *marks(findings)]
        return out

    def _suffix(self, hidden: int) -> Line:
        out: list[Span] = [("   ", "")]
        if hidden:
            out.append((f"+{hidden} more · ", DIM))
        if self._elsewhere:
            out += [("also ", DIM), *self._elsewhere_spans(), (" · ", DIM)]
        if len(out) == 1:
            return ()
        return (*out, ("e", DIM))


def _thread(finding: Finding) -> str:
    return "the training loop" if finding.kind == "loop_hung" else f"worker {finding.worker}"


# --------------------------------------------------------------------------- the list (e)

#: The list's left column (evidence / advice / stack) is this wide.
LABEL_WIDTH = 10


class FindingsList(LineWidget):
    """Every finding with its evidence, advice and whole stack; first how crashed loops ended."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._doc: Document | None = None

    def show(self, doc: Document | None) -> None:
        if doc is self._doc:
            return
        self._doc = doc
        self.update_lines()

    def build(self, width: int) -> list[Line]:
        doc = self._doc
        out: list[Line] = []
        sources = doc.sources if doc is not None else ()
        labels = dict(zip((s.id for s in sources), source_labels(sources)))
        by_id = {s.id: s for s in sources}
        for source in sources:
            ended = end_words(source)
            if source.end is not None and source.end.how in END_MARKS and ended:
                mark, colour = END_MARKS[source.end.how]
                out += graphics.wrap(((f"{mark} {labels[source.id]} ended: ", f"bold {colour}"),
                                      (ended, colour)), width, indent=2)
        findings = doc.findings if doc is not None else ()
        if out:
            out.append(())
        if not findings:
            kinds = ", ".join(finding_words(k) for k in FINDING_KINDS)
            out += graphics.wrap((("No findings.", "bold"), (" loadertop looks for: ", DIM),
                                  (kinds, DIM)), width, indent=2)
            return out
        taken_at = doc.taken_at if doc is not None else time.time()
        for finding in findings:
            src = by_id.get(finding.source) if finding.source is not None else None
            out += self._finding(finding, src, labels, taken_at, width)
            out.append(())
        return out[:-1]

    @staticmethod
    def _finding(finding: Finding, src: Source | None, labels: dict[str, str], taken_at: float,
                 width: int) -> list[Line]:
        style = severity_style(finding.severity)
        colour = style.colour
        where = "machine" if finding.source is None else labels.get(finding.source, finding.source)
        head: list[Span] = [(f"{style.glyph} {style.word}", f"bold {colour}"), ("  ", ""),
                            (finding_words(finding.kind), f"bold {colour}"), (" · ", DIM),
                            (where, "bold")]
        if finding.worker is not None:
            head += [(" · ", DIM), (f"worker {finding.worker}", "bold")]
        since = time.strftime("%H:%M:%S", time.localtime(finding.since))
        head.append((f"   first seen {since} ({fmt_duration(taken_at - finding.since)} ago)", DIM))
        out = graphics.wrap(tuple(head), width, indent=2)
        out += graphics.wrap((("  ", ""), (finding.summary, "")), width, indent=2)
        indent = 2 + LABEL_WIDTH
        for label, items, mark in (("evidence", finding.evidence, "· "),
                                   ("advice", finding.advice, "→ ")):
            for i, item in enumerate(items):
                gutter = f"  {label if i == 0 else '':<{LABEL_WIDTH}}"
                out += graphics.wrap(((gutter, DIM), (mark, f"bold {colour}" if mark == "→ " else DIM),
                                      (item, "")), width, indent=indent + len(mark))
        stack = finding_stack(finding, src)
        if stack is not None:
            out.append(((f"  {'stack':<{LABEL_WIDTH}}", DIM),
                        (f"{len(stack.frames)} frames, innermost first", DIM)))
            pad = " " * (indent - len(FRAME_INDENT))
            for i in range(len(stack.frames) - 1, -1, -1):
                line = ((pad, ""), *frame_line(stack, FrameRow(i), full=True))
                if graphics.line_len(line) > width:  # the path shortened rather than wrapped
                    line = ((pad, ""), *frame_line(stack, FrameRow(i)))
                out += graphics.wrap(line, width, indent=indent + 2)
        return out


class FindingsScreen(ModalScreen[None]):
    """The findings list (`e`): every finding with evidence, advice and stack; e, Esc or q close
    it, the arrows and page keys scroll it."""

    BINDINGS = [Binding("escape,e,q", "app.pop_screen", "Close", show=True)]

    def __init__(self, doc: Document | None) -> None:
        super().__init__()
        self._doc = doc

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="findings-list"):
            yield FindingsList(id="findings-body")

    def on_mount(self) -> None:
        self.show(self._doc)
        self.query_one("#findings-list", VerticalScroll).focus()

    def show(self, doc: Document | None) -> None:
        """Follow the app's document while open."""
        self._doc = doc
        findings = doc.findings if doc is not None else ()
        counts = severity_counts(findings)
        title = f"Findings ({counts})" if counts else "Findings (none)"
        container = self.query_one("#findings-list", VerticalScroll)
        container.border_title = title
        container.border_subtitle = "↑↓ PgUp PgDn scroll · e / Esc close"
        self.query_one(FindingsList).show(doc)

    @property
    def body(self) -> FindingsList:
        return self.query_one(FindingsList)
