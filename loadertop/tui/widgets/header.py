"""The header: which source, its command, freshness, uptime, losses, the probe's own CPU, the
refresh interval and the clock (which keeps ticking while the screen is paused); then the note
line (the demo's phase) and, with several sources, their tabs (each with its findings' marks)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from loadertop.client.document import Document, Source, ViewerStatus
from loadertop.client.units import fmt_duration
from loadertop.tui.theme import (
    ACCENT,
    BAD,
    DIM,
    DISCONNECTED_AFTER_S,
    OK,
    STALE_AFTER_S,
    WARN,
    source_labels,
    source_title,
)
from loadertop.tui.widgets import graphics
from loadertop.tui.widgets.findings import marks
from loadertop.tui.widgets.graphics import Line, Span
from loadertop.tui.widgets.lines import LineWidget


def freshness(src: Source | None, viewer: ViewerStatus | None, replay: bool = False) -> Span:
    """live / no data for N s / disconnected / waiting for data — from the model's `age_s` and
    `viewer.connected`; in a replay, as it was at that point of the recording."""
    if src is None and (viewer is None or not viewer.received):
        return ("waiting for data", DIM)  # nothing ever arrived: not a disconnection
    age = src.age_s if src is not None else None
    if (viewer is not None and not viewer.connected) or (age is not None and age >= DISCONNECTED_AFTER_S):
        extra = f" (no data for {age:.0f} s)" if age is not None else ""
        return (f"✖ disconnected{extra}", f"bold {BAD}")
    if age is None:
        return ("waiting for data", DIM)
    if age >= STALE_AFTER_S:
        return (f"● no data for {age:.0f} s", f"bold {WARN}")
    return ("● live then" if replay else "● live", f"bold {OK}")


def waiting_for(doc: Document | None) -> str | None:
    """"waiting for data from ENDPOINT" while the given endpoints have sent nothing yet, else None."""
    if doc is None or doc.sources:
        return None
    endpoints = doc.viewer.endpoints
    if not endpoints or doc.viewer.received:
        return None
    shown = ", ".join(endpoints[:2]) + (f" (+{len(endpoints) - 2})" if len(endpoints) > 2 else "")
    return f"waiting for data from {shown}"


@dataclass(frozen=True)
class HeaderState:
    doc: Document | None
    src: Source | None
    now: float
    paused: bool
    refresh_s: float
    selected: int
    compact: bool
    note: str | None
    replay: bool = False


class HeaderBar(LineWidget):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._state: HeaderState | None = None

    def show(self, doc: Document | None, src: Source | None, *, now: float, paused: bool,
             refresh_s: float, selected: int, compact: bool, note: str | None = None,
             replay: bool = False) -> None:
        self._state = HeaderState(doc, src, now, paused, refresh_s, selected, compact, note, replay)
        self.update_lines()

    def build(self, width: int) -> list[Line]:
        st = self._state
        if st is None:
            return [(("loadertop", "bold"),)]
        doc, src = st.doc, st.src
        viewer = doc.viewer if doc is not None else None
        sep = (" · ", DIM)

        left: list[Span] = [("loadertop ", f"bold {ACCENT}")]
        if src is not None:
            left += [(source_title(src.name, src.rank), "bold"), (f" {src.host}:{src.pid}", DIM)]
        elif doc is not None:
            left.append((waiting_for(doc) or "no instrumented DataLoader found", DIM))
        else:
            left.append(("starting", DIM))

        right: list[Span] = []
        if st.paused:
            right += [(" ⏸ PAUSED ", "bold reverse"), (" ", "")]
        right += [(f"⟳ {st.refresh_s:g} s ", DIM),
                  (time.strftime("%H:%M:%S", time.localtime(st.now)), "bold")]

        status: list[Span] = [freshness(src, viewer, st.replay)]
        if src is not None:
            status += [sep, ("up ", DIM), (fmt_duration(st.now - src.started_at), ""), sep,
                       ("dropped ", DIM), (str(src.dropped), WARN if src.dropped else "")]
            bad = (viewer.bad_messages + viewer.wrong_version) if viewer is not None else 0
            if bad:
                status += [(" bad ", DIM), (str(bad), WARN)]
            probe = src.probe_cpu_fraction
            status += [sep, ("probe ", DIM), ("–" if probe is None else f"{probe * 100:.1f} % cpu", "")]

        # Line 1: identity (+ the command when it fits) ... paused / refresh / clock on the right.
        right_len = graphics.line_len(tuple(right))
        ident = tuple(left)
        if src is not None and src.command:
            if width - graphics.line_len(ident) - right_len - 4 > 12:  # room for some of it
                ident += (("  $ ", DIM), (src.command, ""))
        ident = graphics.fit(ident, max(1, width - right_len - 1))
        pad = width - graphics.line_len(ident) - right_len
        line1 = (*ident, (" " * max(1, pad), ""), *right)
        lines: list[Line] = [line1, tuple(status)]
        if st.note:
            lines += [((part, ACCENT),) for part in st.note.split("\n")]

        sources = doc.sources if doc is not None else ()
        if len(sources) > 1:
            if st.compact:
                lines[1] = (*lines[1], sep, (f"source {st.selected + 1}/{len(sources)} (tab)", DIM))
            else:
                tabs: list[Span] = [("sources ", DIM)]
                for i, title in enumerate(source_labels(sources)):
                    tabs += [(f" {title} ", "bold reverse" if i == st.selected else ""),
                             *marks(sources[i].findings), (" ", "")]
                tabs.append(("(tab/[ ] switch, o overview)", DIM))
                lines.append(tuple(tabs))
        return lines
