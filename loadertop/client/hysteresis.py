"""The verdict's hysteresis over time: the one stateful part of naming the bottleneck.

`loadertop.diagnosis` is pure (no state across calls, no clocks); this keeps, per source, the
category shown now and the one waiting to replace it, and takes the time from its caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from loadertop.client.document import Category, Verdict
from loadertop.diagnosis import URGENT_CATEGORIES
from loadertop.diagnosis.thresholds import STABLE_SECONDS, STABLE_UPDATES

#: The held category's verdict for today's figures (`diagnosis.restate`, bound to them), or None
#: when there is nothing true to say under it any more.
Restate = Callable[[Category], Verdict | None]


class VerdictStabilizer:
    """Hysteresis over time: keeps the shown category until a new one has persisted.

    ``update`` returns the verdict to show. A verdict of the shown category replaces it at once (its
    figures refresh every update); an urgent one (stalled, memory_pressure) shows at once; any other
    new category shows after ``updates`` consecutive updates, or once it has lasted ``seconds``
    over at least two consecutive updates.

    While a change is pending, the shown category holds, its `pending` naming the category that
    waits. Its words are those of today's figures when ``restate`` is given (the held category's
    own summary, evidence and advice, fed the figures that named the new one: a held verdict
    never quotes figures that are no longer true, docs/diagnosis.md "Hysteresis"); where the held
    category has nothing true left to say (``restate`` gives None: a stall that ended, batches
    after idle) the change shows at once. Without ``restate`` the held verdict keeps the figures
    of its last update.
    """

    def __init__(self, updates: int = STABLE_UPDATES, seconds: float = STABLE_SECONDS) -> None:
        self.updates = max(1, int(updates))
        self.seconds = float(seconds)
        self._states: dict[str, _StabilizerState] = {}

    def update(self, source_id: str, verdict: Verdict, now: float,
               restate: Restate | None = None) -> Verdict:
        category = verdict.category
        state = self._states.get(source_id)
        if state is None or category == state.shown.category or category in URGENT_CATEGORIES:
            return self._show(source_id, verdict)
        if category == state.pending_category:
            state.pending_count += 1
        else:
            state.pending_category, state.pending_count, state.pending_since = category, 1, now
        lasted = now - state.pending_since
        if state.pending_count >= self.updates or (state.pending_count >= 2 and lasted >= self.seconds):
            return self._show(source_id, verdict)
        if restate is not None:
            current = restate(state.shown.category)
            if current is None:
                return self._show(source_id, verdict)
            state.shown = current
        return msgspec.structs.replace(state.shown, pending=category)

    def _show(self, source_id: str, verdict: Verdict) -> Verdict:
        self._states[source_id] = _StabilizerState(shown=verdict)
        return verdict

    def shown_category(self, source_id: str) -> Category | None:
        """The category shown now for this source (pass it to `diagnose` as ``previous``)."""
        state = self._states.get(source_id)
        return state.shown.category if state is not None else None

    def forget(self, source_id: str) -> None:
        """Drop a source that is gone for good."""
        self._states.pop(source_id, None)


@dataclass
class _StabilizerState:
    shown: Verdict
    pending_category: Category | None = None
    pending_count: int = 0
    pending_since: float = 0.0
