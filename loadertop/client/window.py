"""A source's reports in the model's window, walked once per refresh into the sums and samples
that every figure of `Model.source_figures` reads.

    window = Window(state.reports, now - window_s)
    window.batches, window.wait_us, window.workers[(id, pid)] ...

The walk is the C one (client/_figures.c, `walk`) where the package's optional extension is built
and the report types are laid out as it expects, else `python_walk`: the same sums, to the bit
(tests/unit/test_window.py). A viewer of a 128-source fleet walks ~12 reports of each source at
each refresh; the C one reads their fields where msgspec keeps them (docs/performance.md, "The TUI
watching many sources").

Walked again at each refresh rather than kept as running sums: at the default refresh a report
stays in a few windows only, and adding and dropping each report from running sums cost more than
the walk (the same page).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from loadertop import wire

#: One worker process's reports in a window: (fetch_us, collate_us, batches, wall_ns, cpu_ns),
#: its samples as each report's tuple (`stats_of_parts` reads them where they lie).
WorkerSums = tuple[list[Sequence[int]], list[Sequence[int]], int, int, int]
#: Each worker process's sums by (id, pid): a worker of an earlier epoch is another process.
WorkersSums = dict[tuple[int, int | None], WorkerSums]

# The walk's result, in this order (Window's attributes).
_FIELDS = ("batches", "covered", "wait_ns", "wait_us", "step_us", "queue_samples",
           "queue_ready_sum", "queue_in_flight_sum", "queue_waiting_samples",
           "queue_waiting_ready_samples", "queue_waiting_cpu_ns", "queue_waiting_wall_ns",
           "process_cpu_ns", "process_cpu_s", "loop_cpu_ns", "loop_cpu_s",
           "loop_fetch_wall_ns", "loop_fetch_cpu_ns", "stages", "workers")


def python_walk(reports: deque[tuple[float, wire.LoaderReport]], since: float) -> tuple[Any, ...]:
    """The reports received since `since`, summed, as a tuple in `_FIELDS`' order."""
    batches = wait_ns = 0
    covered: float = 0  # an empty window says 0, as sum() did
    wait_us: list[Sequence[int]] = []
    step_us: list[Sequence[int]] = []
    q_samples = q_ready = q_in_flight = q_waiting = q_waiting_ready = q_cpu = q_wall = 0
    process_ns = loop_ns = fetch_wall = fetch_cpu = 0
    process_s = loop_s = 0.0
    stages: list[wire.StageReport] = []
    workers: dict[tuple[int, int | None], list[Any]] = {}
    # The window is the deque's tail (HISTORY_S of reports are kept: ~480, the window ~12),
    # found from the right, then walked oldest first as the figures expect.
    recent: list[wire.LoaderReport] = []
    for received, m in reversed(reports):
        if received < since:
            break
        recent.append(m)
    recent.reverse()
    for m in recent:
        batches += m.batches
        covered += m.interval_s
        wait_ns += m.wait_ns
        wait_us.append(m.wait_us)
        step_us.append(m.step_us)
        q = m.queue
        q_samples += q.samples
        q_ready += q.ready_sum
        q_in_flight += q.in_flight_sum
        q_waiting += q.waiting_samples
        q_waiting_ready += q.waiting_ready_samples
        q_cpu += q.waiting_cpu_ns
        q_wall += q.waiting_wall_ns
        # The training process's CPU: only the reports that carry it (an older probe's don't).
        if m.process_cpu_ns is not None:
            process_ns += m.process_cpu_ns
            process_s += m.interval_s
        if m.loop_cpu_ns is not None:
            loop_ns += m.loop_cpu_ns
            loop_s += m.interval_s
        fetch_wall += m.loop_fetch_wall_ns
        fetch_cpu += m.loop_fetch_cpu_ns
        if m.stages is not None:
            stages.append(m.stages)
        for mw in m.workers:
            sums = workers.get((mw.id, mw.pid))
            if sums is None:
                sums = workers[mw.id, mw.pid] = [[], [], 0, 0, 0]
            sums[0].append(mw.fetch_us)
            sums[1].append(mw.collate_us)
            sums[2] += mw.batches
            sums[3] += mw.fetch_wall_ns
            sums[4] += mw.fetch_cpu_ns
    return (batches, covered, wait_ns, wait_us, step_us, q_samples, q_ready, q_in_flight,
            q_waiting, q_waiting_ready, q_cpu, q_wall, process_ns, process_s, loop_ns, loop_s,
            fetch_wall, fetch_cpu, stages, {key: tuple(sums) for key, sums in workers.items()})


_figures: ModuleType | None
try:
    from loadertop.client import _figures
except ImportError:  # pragma: no cover - not built (no compiler at install): the Python one
    _figures = None

_c_walk: Callable[[deque[tuple[float, wire.LoaderReport]], float], tuple[Any, ...] | None] | None
_c_walk = None
# The C walk reads the fields where msgspec keeps them; it agrees to only if each field is a
# plain slot of these types (msgspec 0.18-0.19: one member descriptor per field).
if _figures is not None and _figures.bind_walk(wire.LoaderReport, wire.QueueReport,
                                               wire.WorkerReport):
    _c_walk = _figures.walk


class Window:
    """A source's reports received since `since`, walked once: the sums and samples that
    `Model.source_figures` reads (each figure used to walk the reports itself: ~25 passes a
    source). Samples stay each report's tuple, in a list per figure: `stats_of_parts` reads them
    where they lie, rather than Python joining them into one list to sort."""

    __slots__ = _FIELDS

    batches: int
    covered: float
    wait_ns: int
    wait_us: list[Sequence[int]]
    step_us: list[Sequence[int]]
    queue_samples: int
    queue_ready_sum: int
    queue_in_flight_sum: int
    queue_waiting_samples: int
    queue_waiting_ready_samples: int
    queue_waiting_cpu_ns: int
    queue_waiting_wall_ns: int
    process_cpu_ns: int
    process_cpu_s: float
    loop_cpu_ns: int
    loop_cpu_s: float
    loop_fetch_wall_ns: int
    loop_fetch_cpu_ns: int
    stages: list[wire.StageReport]
    workers: WorkersSums

    def __init__(self, reports: deque[tuple[float, wire.LoaderReport]], since: float) -> None:
        # None from the C walk: something it does not sum natively (an int past 64 bits...).
        walked = _c_walk(reports, since) if _c_walk is not None else None
        if walked is None:
            walked = python_walk(reports, since)
        (self.batches, self.covered, self.wait_ns, self.wait_us, self.step_us, self.queue_samples,
         self.queue_ready_sum, self.queue_in_flight_sum, self.queue_waiting_samples,
         self.queue_waiting_ready_samples, self.queue_waiting_cpu_ns, self.queue_waiting_wall_ns,
         self.process_cpu_ns, self.process_cpu_s, self.loop_cpu_ns, self.loop_cpu_s,
         self.loop_fetch_wall_ns, self.loop_fetch_cpu_ns, self.stages, self.workers) = walked
