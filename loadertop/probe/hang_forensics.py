"""Hang forensics: how long each worker has been inside its current batch, and the stack of the
loop or of a worker stuck past STACK_AFTER_NS (publisher thread only; the stacks themselves are
taken by probe/stacks.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from loadertop import wire
from loadertop.probe import stacks, torch_internals

if TYPE_CHECKING:  # the state of every seam (record_state.py); object at run time
    from loadertop.probe.record_state import RecordState
else:
    RecordState = object

# Hang forensics: past this long inside one next() (the loop) or one batch (a worker), each
# report carries the thread's stack, taken again at most once per STACK_REFRESH_NS.
STACK_AFTER_NS = int(stacks.STACK_AFTER_S * 1e9)
STACK_SEARCH_GAP_NS = 1_000_000_000  # a stuck worker without a stack file: looked for this often
STACK_REFRESH_NS = int(stacks.STACK_REFRESH_S * 1e9)  # the loop's; a worker's first re-ask
STACK_ASK_MAX_GAP_NS = 8 * STACK_REFRESH_NS  # a worker still inside that batch: asked at most this rarely


class _StackAsk:
    """A worker inside one batch past STACK_AFTER_NS: when to signal it next, the gap after that
    (doubling), since when it has been in that batch (Unix time: only a dump of this batch is
    read), and the latest stack read."""

    __slots__ = ("next_ns", "gap_ns", "since", "stack")

    def __init__(self, next_ns: int, since: float) -> None:
        self.next_ns = next_ns
        self.gap_ns = STACK_REFRESH_NS
        self.since = since
        self.stack: wire.Stack | None = None


class HangForensics(RecordState):
    """LoaderRecord's hang forensics (a mixin: see record.py). The drain resets the busy times
    at each epoch mark; `sample_workers` (worker_resources.py) updates them at ~1 Hz."""

    def _init_hang_forensics(self) -> None:
        self.stack_dir: str | None = None  # workers' faulthandler dumps (set by the publisher)
        self._epoch_floor_ns = 0  # the current epoch's start: no batch of it began earlier
        self._busy_since: dict[int, int] = {}  # worker id -> inside a batch since (perf ns)
        self._idle_seen: dict[int, int] = {}  # worker id -> last seen with no work outstanding
        self._worker_stacks: dict[int, _StackAsk] = {}  # worker id -> its stack, asked for
        self._stack_files: dict[int, str] = {}  # pid -> its stack file (announced, or found)
        self._stack_search_at: dict[int, int] = {}  # pid -> when to look for its file again
        self._loop_stack: tuple[int, wire.Stack | None] | None = None

    def _remember_stack_file(self, pid: int, path: str) -> None:
        """At most wire.MAX_WORKERS of them: when full, those of past epochs' workers go."""
        if len(self._stack_files) >= wire.MAX_WORKERS:
            current = {p for _, p, _ in self._worker_procs}
            self._stack_files = {p: f for p, f in self._stack_files.items() if p in current}
        if len(self._stack_files) < wire.MAX_WORKERS:
            self._stack_files[pid] = path

    def _update_busy(self, it: Any, now_ns: int) -> None:
        """Which workers are inside a batch, and since when (1 Hz, from torch's `_task_info`).

        A worker with tasks outstanding works on them back to back, so it has been inside its
        current batch since the later of: its last produced batch, the last time it was seen
        without work, and the epoch's start."""
        outstanding = torch_internals.outstanding_by_worker(it) if it is not None else None
        if outstanding is None:
            self._busy_since = {}
            return
        floor = self._epoch_floor_ns
        for wid in range(self.config.num_workers):
            if outstanding.get(wid):
                if wid not in self._busy_since:
                    acc = self._workers.get(wid)
                    self._busy_since[wid] = max(acc.last_done_ns if acc else 0,
                                                self._idle_seen.get(wid, 0), floor)
            else:
                self._busy_since.pop(wid, None)
                self._idle_seen[wid] = now_ns

    def _busy_ms(self, wid: int, now_ns: int) -> float | None:
        since = self._busy_since.get(wid)
        if since is None:
            return None
        acc = self._workers.get(wid)
        if acc is not None:
            since = max(since, acc.last_done_ns)
        return max(0, now_ns - since) / 1e6

    def _worker_stack(self, wid: int, pid: int | None, now_ns: int,
                      watched: bool) -> wire.Stack | None:
        """A worker's stack while it has been inside one batch past STACK_AFTER_NS.

        Asked for with a signal (stacks.ask_worker_stack) only while `watched` (a viewer is
        subscribed): at once, and again after 1, 2, 4... up to STACK_ASK_MAX_GAP_NS, so a batch
        that is merely slow is interrupted a few times, not every second. The dump is written
        within the next report; the latest one is read at each report."""
        busy = self._busy_ms(wid, now_ns)
        path = self._stack_files.get(pid) if pid is not None else None
        if path is None and busy is not None and busy * 1e6 >= STACK_AFTER_NS and watched:
            path = self._find_stack_file(wid, pid, now_ns)
        if busy is None or busy * 1e6 < STACK_AFTER_NS or path is None:
            self._worker_stacks.pop(wid, None)
            return None
        ask = self._worker_stacks.get(wid)
        if ask is None:
            ask = self._worker_stacks[wid] = _StackAsk(now_ns, time.time() - busy / 1e3)
        if watched and now_ns >= ask.next_ns:
            status = self._worker_status.get(wid)
            if status is not None and status[0] == pid and status[1]:  # alive at the last look
                stacks.trim_dump_file(path)
                stacks.ask_worker_stack(pid)  # type: ignore[arg-type]  # a path was found: pid is set
            ask.next_ns = now_ns + ask.gap_ns
            ask.gap_ns = min(2 * ask.gap_ns, STACK_ASK_MAX_GAP_NS)
        stack = stacks.read_dump_file(path, ask.since)
        if stack is not None:
            ask.stack = stack
        return ask.stack

    def _find_stack_file(self, wid: int, pid: int | None, now_ns: int) -> str | None:
        """The stack file of a worker stuck before its start message (it goes after the first
        batch), looked for among its open files at most every STACK_SEARCH_GAP_NS."""
        if pid is None or now_ns < self._stack_search_at.get(pid, 0):
            return None
        status = self._worker_status.get(wid)
        if status is None or status[0] != pid or not status[1]:  # a live worker of this epoch
            return None
        path = stacks.find_worker_stack_file(pid, self.stack_dir)
        if path is None:
            if len(self._stack_search_at) >= wire.MAX_WORKERS:
                self._stack_search_at.clear()
            self._stack_search_at[pid] = now_ns + STACK_SEARCH_GAP_NS
        else:
            self._remember_stack_file(pid, path)
        return path

    def _loop_stack_now(self, now_ns: int) -> wire.Stack | None:
        since = self.in_next_since
        if since is None or now_ns - since < STACK_AFTER_NS or self._loop_thread is None:
            self._loop_stack = None
            return None
        cached = self._loop_stack
        if cached is None or now_ns - cached[0] >= STACK_REFRESH_NS:
            try:
                stack = stacks.thread_stack(self._loop_thread)
            except Exception:
                stack = None
            cached = self._loop_stack = (now_ns, stack)
        return cached[1]
