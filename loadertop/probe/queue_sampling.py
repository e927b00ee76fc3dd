"""Queue depth, and the loop thread's CPU while it waits in next(): sampled by the publisher
thread (4-48 Hz while a viewer is subscribed, see publisher.py), never on the hot path."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from loadertop.probe import torch_internals

if TYPE_CHECKING:  # the state of every seam (record_state.py); object at run time
    from loadertop.probe.record_state import RecordState
else:
    RecordState = object


class QueueSampling(RecordState):
    """LoaderRecord's queue sampling (a mixin: see record.py); its sums go out with the next
    report (report_assembly.py: `_reset_interval`)."""

    def _init_queue_sampling(self) -> None:
        self._waiting_mark: tuple[int, int, int] | None = None  # (t0 of next(), wall, cpu)

    def has_queue(self) -> bool:
        """A multiprocessing iterator is live: its queue is worth sampling."""
        return self.config.num_workers > 0 and self.iterator is not None

    def sample_queue(self) -> None:
        """One queue-depth sample (publisher thread, 4-48 Hz while a viewer is subscribed)."""
        it = self.iterator
        if it is None or self.config.num_workers == 0:
            return
        self.drain()
        in_next = self.in_next_since is not None
        depth = torch_internals.read_queue(it)
        if depth is None:
            return
        self._q_last = depth
        if not in_next:
            self._check_received(it)
        # Hold the user's iterator no longer than needed: while this thread has it, a loader the
        # program dropped stays "alive" (see `alive`), and the loader it makes next under the
        # same name would become another source ("train-2").
        it = None
        self._q_samples += 1
        self._q_ready_sum += depth.ready
        self._q_flight_sum += depth.in_flight
        self._sample_loop_cpu()
        if in_next:
            self._q_waiting += 1
            # mp.Queue counts a batch from the worker's put() until the loop has received all
            # its bytes, so while the loop is inside next() one counted batch is usually the one
            # it is receiving: only a second one proves a batch sat ready while the loop waited.
            if depth.ready >= 2:
                self._q_waiting_ready += 1

    def _sample_loop_cpu(self) -> None:
        """The loop thread's CPU share while blocked in one long next() call.

        Read from this thread through the loop thread's CPU clock, never on the hot path. Only
        two samples inside the *same* next() call count: short calls (the main-process-bound
        case) rarely span two samples and give no figure, long waits do.
        """
        since = self.in_next_since
        clock = self._loop_cpu_clock
        if since is None or clock is None:
            self._waiting_mark = None
            return
        try:
            cpu = time.clock_gettime_ns(clock)
        except OSError:  # the thread is gone
            self._loop_cpu_clock = self._waiting_mark = None
            return
        wall = time.perf_counter_ns()
        mark = self._waiting_mark
        if mark is not None and mark[0] == since:
            self._q_waiting_wall += wall - mark[1]
            self._q_waiting_cpu += max(0, cpu - mark[2])
        self._waiting_mark = (since, wall, cpu)
