"""`run --autotune`'s measuring inside an epoch (docs/autotune.md, "Inside an epoch"): windows of
the loop's batches, each count's warm-up left out, and what each switch cost (publisher thread).

At each report the record's drain gives the loop's batch count and its latest batch's exit time
(`perf_counter_ns`), so a window runs from one batch's exit to another's: its rate is exact, with
no part of a batch at either end. A stretch at one count (one torch iterator: from the epoch's
`iter()`, or from the end of the switch that made it) first waits out a round of batches, one per
worker — the new workers' first batches come together — then measures windows of at least
`WINDOW_S` and `WINDOW_MIN_BATCHES`. Beside the batches a window also sums the loop's waits and
the workers' fetch times of the reports it spans: "starved" where the loop waited while the
workers idled (loadertop/autotune.py, STARVED_WAIT).

A switch's cost is the time from its asking to the end of the new count's warm-up, less the time
the batches made meanwhile take at the new count's measured rate.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from loadertop import autotune

WINDOW_S = 0.5  # a measurement window inside an epoch: at least this long ...
WINDOW_MIN_BATCHES = 8  # ... and this many batches
SWITCH_COST_S = 0.5  # a switch's cost before one was measured (and no epoch's warm-up either)


@dataclass(frozen=True)
class Window:
    batches: int
    seconds: float
    starved: bool


class _Stretch:
    """One count's stretch of an epoch."""

    __slots__ = ("key", "base", "start", "mark", "short", "cost_from")

    def __init__(self, key: tuple[int, int, int], cost_from: tuple[int, int] | None) -> None:
        self.key = key  # (epoch token, count, from ns)
        self.base: int | None = None  # the drain's batch count when it first saw this stretch
        self.start: tuple[int, int] | None = None  # (batches, exit ns) where measuring began
        self.mark: tuple[int, int] | None = None  # ... where the current window began
        self.short = False  # its epoch is too short to be measured inside
        self.cost_from = cost_from  # (batches, exit ns) when the switch into it was asked for


class Windows:
    """One loader's windows (publisher thread only)."""

    def __init__(self) -> None:
        self._stretch: _Stretch | None = None
        self.last_tick: tuple[int, int] | None = None  # (batches, exit ns) at the latest report
        self.armed_at: tuple[int, int] | None = None  # ... when the latest switch was asked for
        self._costs: deque[float] = deque(maxlen=4)  # the latest switches' cost, in seconds
        self._wait_ns = self._busy_ns = self._interval_ns = 0  # the current window's reports

    def add_interval(self, wait_ns: int, interval_ns: int, busy_ns: int) -> None:
        """One report's interval: the loop's waits and the workers' fetch times in it."""
        self._wait_ns += wait_ns
        self._interval_ns += interval_ns
        self._busy_ns += busy_ns

    def forget(self) -> None:
        self._stretch = None

    def next(self, key: tuple[int, int, int], batches_total: int, last_exit_ns: int,
             count: int, switched: bool) -> Window | None:
        """The window this report completes in the stretch `key` (None: none yet). `switched`:
        the stretch began with a switch (its cost is counted)."""
        self.last_tick = (batches_total, last_exit_ns)
        stretch = self._stretch
        if stretch is None or stretch.key != key:
            stretch = self._stretch = _Stretch(key, self.armed_at if switched else None)
            self._restart_sums()
        if last_exit_ns < key[2]:
            return None
        if stretch.base is None:
            stretch.base = batches_total
            return None
        if stretch.start is None:  # a round of batches first: the workers' warm-up
            if batches_total - stretch.base >= max(1, count):
                stretch.start = stretch.mark = (batches_total, last_exit_ns)
                self._restart_sums()
            return None
        if stretch.short:
            return None
        b0, t0 = stretch.mark  # type: ignore[misc]  # set with start
        batches, seconds = batches_total - b0, (last_exit_ns - t0) / 1e9
        if batches < WINDOW_MIN_BATCHES or seconds < WINDOW_S:
            return None
        stretch.mark = (batches_total, last_exit_ns)
        interval = max(1, self._interval_ns)
        starved = (self._wait_ns >= autotune.STARVED_WAIT * interval
                   and self._busy_ns <= autotune.STARVED_BUSY * interval * count)
        self._restart_sums()
        if stretch.cost_from is not None:
            (fb, ft), (sb, st) = stretch.cost_from, stretch.start
            stretch.cost_from = None
            self._costs.append(max(0.0, (st - ft) / 1e9 - (sb - fb) / (batches / seconds)))
        return Window(batches, seconds, starved)

    @property
    def warmed_up(self) -> bool:
        """The current stretch's workers are past their first round of batches."""
        return self._stretch is not None and self._stretch.start is not None

    def too_short(self) -> None:
        """The current stretch's epoch is measured whole, at its end: no windows of it."""
        if self._stretch is not None:
            self._stretch.short = True

    def cost(self, warm_up_s: float) -> float:
        """What a switch costs: the largest of the latest measured, else the epoch's warm-up."""
        if self._costs:
            return max(self._costs)
        return warm_up_s if warm_up_s > 0 else SWITCH_COST_S

    def _restart_sums(self) -> None:
        self._wait_ns = self._busy_ns = self._interval_ns = 0
