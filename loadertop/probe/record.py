"""Per-loader state: what the training thread writes (cheaply) and the publisher thread reads.

The training thread only ever stores signed clock stamps in `events` (see
`_InstrumentedIterator`): a StampRing where the C module is built, else a bounded deque. Both are
written and emptied holding the GIL (`deque.append` / `popleft` are atomic under it; the ring's
methods never release it), so the publisher thread drains without locks. Everything derived
(durations, sums, samples, queue depth, workers) is computed here on the publisher thread.
"""

from __future__ import annotations

import bisect
import operator
import os
import threading
import time
import weakref
from collections import deque
from itertools import repeat, starmap

from loadertop import wire
from loadertop.probe import resources, stacks, torch_internals

try:  # the stamps' ring and the drain's bulk path in C (probe/_hotpath.c), built with the hot path
    from loadertop.probe._hotpath import StampRing
    from loadertop.probe._hotpath import bucket_count as _c_bucket_count
    from loadertop.probe._hotpath import decimate_micros as _c_decimate_micros
    from loadertop.probe._hotpath import split_stamps as _c_split_stamps
except ImportError:  # pragma: no cover - CI fails where it is missing (test_hotpath)
    StampRing = None
    _c_bucket_count = _c_split_stamps = _c_decimate_micros = None

EVENTS_MAXLEN = 1 << 16  # stamps held between drains (>= 4 Hz) before the oldest are lost
LOOP_CPU_SAMPLE_NS = 10_000_000  # num_workers=0: measure the loop's fetch CPU every >= 10 ms
EPOCH_MARK = None
# Pairing a received batch with its worker's "produced" stamp waits this long after the loop had
# it, so the worker's sample (sent before the batch was queued, over another socket) has surely
# arrived, and an iterable worker's "ran out" notice has too (see EpochPairing).
PAIR_GRACE_NS = 50_000_000
PAIR_GIVE_UP_NS = 5_000_000_000  # a worker's stamp no receipt claimed (a broken-off epoch): dropped
PAIR_MAX_PENDING = 1 << 16
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


class EpochPairing:
    """How to name the task behind the loop's c-th batch of one epoch (publisher thread only).

    torch 2.13 `_MultiProcessingDataLoaderIter`: `_try_put_index` sends task `_send_idx` to the next
    worker of `itertools.cycle(range(num_workers))` that is still active, `_reset` restarts both
    the count and the cycle each epoch, and with `in_order=True` the loop is given task
    `_rcvd_idx`, counting up. So for a map-style dataset the c-th batch of an epoch is task c,
    and task c is the (c // W)-th batch of worker c % W. An iterable dataset's worker that runs out
    (task e) is skipped from then on: batches from c = e on can no longer be named and stay
    unpaired. With `in_order=False` batches come in completion order: nothing is paired.
    """

    __slots__ = ("pids", "generation", "limit", "unpaired", "received", "workers", "expected")

    def __init__(self, pids: list[int | None] | None, generation: int, unpaired: str | None,
                 workers=None, expected: int = 0) -> None:
        self.pids = pids  # None until LoaderRecord._resolve_epochs reads them from `workers`
        self.generation = generation
        self.limit: int | None = None  # the first task index that can no longer be named
        self.unpaired = unpaired
        self.received = 0
        self.workers = workers  # torch's list of the epoch's Process objects, until resolved
        self.expected = expected  # the loader's num_workers when the epoch began

    def key(self, c: int) -> tuple[int | None, int, int]:
        w = len(self.pids)
        return self.pids[c % w], self.generation, c // w


class BucketCounts:
    """Cumulative counts of durations (ns) in the buckets of `wire.HISTOGRAM_BOUNDS_NS`, and
    their sum: every value, where the report's samples are decimated (publisher thread only)."""

    __slots__ = ("counts", "sum_ns")

    def __init__(self) -> None:
        self.counts = [0] * (len(wire.HISTOGRAM_BOUNDS_NS) + 1)
        self.sum_ns = 0

    def add(self, values_ns: list[int]) -> int:
        """Count every value; returns their sum."""
        total = bucket_count(wire.HISTOGRAM_BOUNDS_NS, self.counts, values_ns)
        self.sum_ns += total
        return total

    def add_one(self, value_ns: int) -> None:
        self.counts[bisect.bisect_left(wire.HISTOGRAM_BOUNDS_NS, value_ns)] += 1
        self.sum_ns += value_ns

    def histogram(self) -> wire.Histogram:
        return wire.Histogram(counts=list(self.counts), sum_ns=max(0, self.sum_ns))


SORT_FROM = 64  # py_bucket_count: below this many values one bisect each is cheapest (~0.2 µs a
# value here); above it, one sort and a bisect per bound (~0.06 µs a value at 1000).


def py_bucket_count(bounds: tuple[int, ...], counts: list[int], values_ns: list[int]) -> int:
    """`BucketCounts.add`'s counting in Python: each value into the first bucket whose bound it
    does not exceed (Prometheus's `le`), the last beyond every bound; returns the sum."""
    if len(values_ns) < SORT_FROM:
        for value in values_ns:
            counts[bisect.bisect_left(bounds, value)] += 1
    else:
        ordered = sorted(values_ns)
        below = 0
        for i, bound in enumerate(bounds):
            upto = bisect.bisect_right(ordered, bound)  # values <= bound: Prometheus's `le`
            counts[i] += upto - below
            below = upto
        counts[-1] += len(ordered) - below
    return sum(values_ns)


def bucket_count(bounds: tuple[int, ...], counts: list[int], values_ns: list[int]) -> int:
    """In C where it is built: a wait and a step counted in 17 ns a batch here (median of 40
    chunks of 5,000 batches), against 239 in Python (a sort each). The C one declines (None)
    values that are not ints within int64, which Python then counts."""
    if _c_bucket_count is not None and type(values_ns) is list:
        total = _c_bucket_count(bounds, counts, values_ns)
        if total is not None:
            return total
    return py_bucket_count(bounds, counts, values_ns)


class _WorkerAccum:
    __slots__ = ("pid", "batches", "fetch_us", "collate_us", "wall_ns", "cpu_ns", "dropped",
                 "last_done_ns", "fetch_buckets")

    def __init__(self) -> None:
        self.pid: int | None = None
        self.reset()
        self.dropped = 0
        self.last_done_ns = 0  # when its latest batch was produced (perf_counter_ns)
        # Every fetch of this worker id (its processes of every epoch), never reset: the
        # Prometheus counter of `loadertop export`.
        self.fetch_buckets = BucketCounts()

    def reset(self) -> None:
        self.batches = 0
        self.fetch_us: list[int] = []
        self.collate_us: list[int] = []
        self.wall_ns = 0
        self.cpu_ns = 0


class LoaderRecord:
    def __init__(self, loader, *, name: str, source: str, host: str, rank: int | None,
                 command: str, process_started_at: float) -> None:
        # --- written by the training thread ---
        # t0 > 0, -t1 < 0, 0, or EPOCH_MARK: raw in a C ring where it is built (the C hot path
        # pushes there without making an int), else Python ints in a bounded deque.
        self.events = new_events()
        # num_workers=0, one batch per LOOP_CPU_SAMPLE_NS: (wall, cpu, fetch, collate, produced)
        # in ns, `produced` counted from next()'s entry; fetch/collate None where unmeasured.
        self.loop_samples: deque = deque(maxlen=4096)
        self._iterator_ref = None
        self._pairings: deque = deque(maxlen=64)  # one EpochPairing per EPOCH_MARK, in order
        self._unresolved: deque = deque()  # pairings whose pids the publisher has yet to read
        self._iter_starts: deque = deque(maxlen=64)  # each EPOCH_MARK's iter() start, in order
        self.error: wire.LoopError | None = None  # the last exception out of next() this epoch
        self._error_new = False
        self._loop_thread: int | None = None  # the thread that iterates (its stack for loop_hung)
        # Workers started before `loadertop attach` (no worker hook: no fetch samples, ever).
        self.unhooked_pids: set[int] = set()
        # --- identity ---
        self.name = name
        self.source = source
        self.host = host
        self.rank = rank
        self.command = command
        self.process_started_at = process_started_at
        self._loader_ref = _weak(loader)
        self.config = wire.LoaderConfig(**torch_internals.loader_config(loader))
        # what `config` was read from (see refresh_config)
        self._config_key: tuple | None = torch_internals.settings_key(loader)
        # --- publisher-thread state ---
        self.seq = 0
        self.epoch = 0
        self.batches_total = 0
        self.dropped = 0
        self._prev_t1: int | None = None
        self.in_next_since: int | None = None  # the loop entered next() then and is still inside
        self._interval_start_ns = time.perf_counter_ns()
        self._reset_interval()
        # Every wait and step of the loader's life, bucketed as drained (never reset).
        self._wait_buckets = BucketCounts()
        self._step_buckets = BucketCounts()
        self._workers: dict[int, _WorkerAccum] = {}
        # worker id -> (pid, alive, exitcode, cpu %, rss), refreshed by sample_workers()
        self._worker_status: dict[int, tuple] = {}
        self._psutil: dict[int, object] = {}  # pid -> psutil.Process
        self._alive_pids: set[int] = set()  # the workers alive at the last sample_workers()
        self._worker_procs: list = []
        self.retired_since: float | None = None  # set by the publisher while the loader is dead
        self._loop_cpu_clock: int | None = None  # CPU clock of the thread that iterates
        # (process CPU ns, loop clock id, loop CPU ns) at the last report: the next report's
        # process_cpu_ns and loop_cpu_ns are the differences.
        self._cpu_mark: tuple[int, int | None, int | None] = (time.process_time_ns(), None, None)
        self._waiting_mark: tuple[int, int, int] | None = None  # (t0 of next(), wall, cpu)
        # --- stage pairing (publisher thread) ---
        self._generation = 0
        self._pairing: EpochPairing | None = None
        self._recent_pairings: dict[tuple[int | None, int], EpochPairing] = {}
        self._done: dict[tuple[int | None, int, int], int] = {}  # task key -> produced stamp
        self._receipts: deque = deque()  # (pairing, c, t0, t1) waiting for their worker sample
        self._tensors: tuple[int, int] | None = None
        self._count_mismatch = False
        # --- hang forensics, epoch starts, random states (publisher thread) ---
        self.stack_dir: str | None = None  # workers' faulthandler dumps (set by the publisher)
        self._epoch_started: int | None = None  # this epoch's iter() start, until its 1st batch
        self._epoch_starts_ms: deque[float] = deque(maxlen=8)  # the latest epochs' (every report)
        self._epoch_floor_ns = 0  # the current epoch's start: no batch of it began earlier
        self._busy_since: dict[int, int] = {}  # worker id -> inside a batch since (perf ns)
        self._idle_seen: dict[int, int] = {}  # worker id -> last seen with no work outstanding
        self._worker_stacks: dict[int, _StackAsk] = {}  # worker id -> its stack, asked for
        self._stack_files: dict[int, str] = {}  # pid -> its stack file (announced, or found)
        self._stack_search_at: dict[int, int] = {}  # pid -> when to look for its file again
        self._loop_stack: tuple[int, wire.Stack | None] | None = None
        self._rng: dict[int, tuple[int, dict[str, str]]] = {}  # pid -> (worker id, digests)
        # --- slow readings: set by the publisher every RESOURCE_S, sent with the next report ---
        self.pending_resources: wire.ResourceReport | None = None

    # ------------------------------------------------------------ training thread (not hot)
    def attach(self, iterator, started_ns: int | None = None) -> None:
        """A new epoch's iterator: called from the loader's __iter__, never per batch.
        `started_ns` is when that __iter__ began (the workers start inside it).

        This runs right after torch forked the epoch's workers, where every page of this process
        the loop's thread writes first is copied (a page fault each: ~87 of them and 0.38 ms here
        when this read the workers' pids and the loader's settings itself). So it keeps to
        references and appends: the settings are read before the fork (`refresh_config`), and the
        workers' pids on the publisher thread (`_resolve_epochs`), from torch's own list of the
        epoch's Process objects, which stays readable after a worker dies or the iterator goes."""
        same_iterator = self.iterator is iterator  # persistent workers: one iterator, reset
        self._iterator_ref = _weak(iterator)
        self._loop_thread = threading.get_ident()
        # Read at every epoch: a thread's ident can be reused by a later thread, whose kernel
        # thread, and so CPU clock, is another.
        self._loop_cpu_clock = _thread_cpu_clock()
        self.error = None
        # A persistent worker makes a new fetcher per epoch (a new "generation" of its batch
        # count); new workers start at generation 0.
        self._generation = self._generation + 1 if same_iterator else 0
        num_workers = self.config.num_workers
        if num_workers:
            # torch 2.13 starts the workers in the iterator's __init__ and keeps them in
            # `_workers`: holding that list now, not at the next 1 Hz sample, means a worker that
            # dies (and takes the iterator with it) in the first second is still reported dead.
            pairing: EpochPairing | None = EpochPairing(
                None, self._generation,
                "in_order_false" if getattr(iterator, "_in_order", True) is False else None,
                getattr(iterator, "_workers", None), num_workers)
            self._unresolved.append(pairing)
        else:
            pairing = None
        self._pairings.append(pairing)
        self._iter_starts.append(started_ns)
        self.events.append(EPOCH_MARK)

    def refresh_config(self, loader) -> None:
        """The loader's settings, read again before each epoch's iterator (and so before torch
        forks its workers): only where `torch_internals.settings_key` differs from the last
        time."""
        try:
            key = torch_internals.settings_key(loader)
            if key == self._config_key:
                return
            self.config = wire.LoaderConfig(**torch_internals.loader_config(loader))
            self._config_key = key
        except Exception:
            pass

    def note_error(self, exc: BaseException) -> None:
        """The loop's next() raised (not StopIteration): once, as the loop ends, never per batch."""
        try:
            message = str(exc)
        except Exception:
            message = "<str() failed>"
        self.error = wire.LoopError(type=type(exc).__name__[:256], message=message[:wire.MAX_TEXT],
                                    at=time.time())
        self._error_new = True

    def _resolve_epochs(self) -> None:
        """Publisher thread: the pids of the epochs attached since the last call, read from the
        Process objects `attach` kept, and each epoch's pairing registered under them (before
        any of its workers' samples or its mark is handled: every caller of those calls this;
        the drain's call is at the mark, since attach queues the pairing before the mark)."""
        unresolved = self._unresolved
        while unresolved:
            pairing = unresolved.popleft()
            procs = torch_internals.worker_pids_in(pairing.workers)
            pairing.workers = None
            pids = [pid for _, pid, _ in procs]
            pairing.pids = pids
            if self.unhooked_pids.intersection(pids):
                pairing.unpaired = "workers_unhooked"  # started before `loadertop attach`
            elif pairing.unpaired is None and (len(pids) != pairing.expected or None in pids):
                pairing.unpaired = "unreadable"
            recent = self._recent_pairings
            for pid in pids:
                recent[(pid, pairing.generation)] = pairing
            while len(recent) > 256:
                del recent[next(iter(recent))]
            self._worker_procs = procs
            self._worker_status = {}  # the previous epoch's workers are not this epoch's

    def alive(self) -> bool:
        """False once the loader is garbage-collected and no iterator of it remains."""
        loader = self._loader_ref() if self._loader_ref is not None else None
        return loader is not None or self.iterator is not None

    def loader_dropped(self) -> bool:
        """The loader itself is garbage-collected (an iterator of it may remain)."""
        return self._loader_ref is not None and self._loader_ref() is None

    @property
    def iterator(self):
        return self._iterator_ref() if self._iterator_ref is not None else None

    # ------------------------------------------------------------ publisher thread
    def _reset_interval(self) -> None:
        self._batches = 0
        self._wait_ns = 0
        self._step_ns = 0
        self._wait_samples: list[int] = []  # ns, converted to µs once decimated, at report time
        self._step_samples: list[int] = []
        self._q_samples = 0
        self._q_ready_sum = 0
        self._q_flight_sum = 0
        self._q_waiting = 0
        self._q_waiting_ready = 0
        self._q_waiting_cpu = 0
        self._q_waiting_wall = 0
        self._q_last: torch_internals.QueueDepth | None = None
        self._loop_us: list[int] = []
        self._loop_wall = 0
        self._loop_cpu = 0
        self._paired = 0
        self._producing_ns = 0
        self._handoff_ns = 0
        self._handoff_samples: list[int] = []
        self._stage_fetch: list[int] = []  # num_workers=0, ns
        self._stage_collate: list[int] = []

    def drain(self) -> None:
        """Turn the training thread's stamps into waits and steps.

        At tens of thousands of batches a second this runs on the publisher thread while holding
        the GIL the training loop also needs, so the steady case (alternating t0, -t1) is done in
        bulk (`split_stamps` and `bucket_count`, in C where it is built); only chunks holding an
        epoch mark, an exception exit or an overflow gap take the per-stamp loop. With the stamps
        still in a deque, the whole drain took 595 ns a batch here through Python's bulk path and
        236-308 through the C one (the median of 30 drains of 5,000 batches of a real
        num_workers=0 loader). Splitting in the ring (`take_split`) and decimating the report's
        samples in C (`decimated_micros`) took the publisher thread of that loader from 0.97-1.12 %
        of a core to 0.47-0.52 % at 38-57k batches/s (tests/benchmarks/probe_cpu.py, fast0, three
        6 s runs of each, alternated).
        """
        events = self.events
        # A StampRing splits its steady stamps where they lie (no int made per stamp, then read
        # back); refused (a mark, a 0, lost stamps), they are taken and go the general way.
        take_split = getattr(events, "take_split", None)
        if take_split is None or not self._drain_split(
                take_split(self.in_next_since, self._prev_t1, self._want_stamps())):
            self._drain_taken(*events.take())
        self._drain_loop_samples()

    def _drain_taken(self, chunk: list, lost: int) -> None:
        if lost:
            self.dropped += 1  # stamps were lost: their waits and steps are not counted
            self._break_pairing("overflow")  # the batch count of this epoch is lost
            # the entry still pending, and the last exit, may be the lost stamps' neighbours
            self.in_next_since = self._prev_t1 = None
        self._drain_segments(chunk)

    def _drain_loop_samples(self) -> None:
        loop = self.loop_samples
        while loop:
            wall, cpu, fetch, collate, produced = loop.popleft()
            self._loop_us.append(wall // 1000)
            self._loop_wall += wall
            self._loop_cpu += cpu
            if fetch is not None and produced is not None:
                self._stage_fetch.append(fetch)
                self._stage_collate.append(collate)
                self._add_split(produced, wall - produced)

    def _add_split(self, producing_ns: int, handoff_ns: int) -> None:
        self._paired += 1
        self._producing_ns += producing_ns
        self._handoff_ns += handoff_ns
        self._handoff_samples.append(handoff_ns)

    def _break_pairing(self, reason: str) -> None:
        if self._pairing is not None and self._pairing.unpaired is None:
            self._pairing.unpaired = reason

    def _want_stamps(self) -> bool:
        """Whether the drain needs the batches' own stamps: while the epoch's are paired."""
        pairing = self._pairing
        return pairing is not None and pairing.unpaired is None

    def _drain_alternating(self, chunk: list[int]) -> bool:
        """Bulk path for [t0, -t1, t0, -t1, ...]; False (nothing consumed) if the chunk isn't so
        (an epoch mark, an exception's 0, a stamp out of place: `split_stamps`)."""
        return self._drain_split(split_stamps(self.in_next_since, chunk, self._prev_t1,
                                              self._want_stamps()))

    def _drain_split(self, parts: tuple | None) -> bool:
        """Take in `split_stamps`' result; False for its None (nothing was consumed)."""
        if parts is None:
            return False
        pairing = self._pairing
        waits, steps, trailing, first_t0, first_t1, last_t1, t0s, t1s = parts
        self.in_next_since = trailing
        if first_t0 is None:
            return True
        if self._epoch_started is not None:
            self._note_epoch_start(first_t1)
        self._prev_t1 = last_t1
        self._record(waits, steps, first_t0)
        if pairing is not None:
            self._receive(t0s, t1s, len(waits))
        return True

    def _receive(self, t0s: list[int] | None, t1s: list[int] | None, n: int) -> None:
        """Note the `n` batches the loop received, in order, for pairing with their workers'
        stamps (`t0s`, `t1s`: needed only while the epoch's batches are paired)."""
        pairing = self._pairing
        if pairing is None:
            return
        c = pairing.received
        pairing.received = c + n
        if pairing.unpaired is not None or t0s is None or t1s is None:
            return
        if len(self._receipts) + len(t0s) > PAIR_MAX_PENDING:
            self._break_pairing("overflow")
            return
        self._receipts.extend(zip([pairing] * len(t0s), range(c, c + len(t0s)), t0s, t1s))

    def _drain_segments(self, chunk: list) -> None:
        """Taken stamps: split at their epoch marks, each stretch between them tried in bulk,
        and only a stretch the bulk path refuses (an exception's 0, an exit whose entry was lost)
        goes stamp by stamp. A loader re-iterated every few hundred ms (a validation pass, a
        benchmark's rounds) puts a mark in many chunks; the whole chunk once took the per-stamp
        loop."""
        start, end = 0, len(chunk)
        while start < end:
            try:
                mark = chunk.index(EPOCH_MARK, start)  # ints compare unequal to None
            except ValueError:
                mark = end
            if mark > start:
                stretch = chunk[start:mark]
                if not self._drain_alternating(stretch):
                    self._drain_each(stretch)
            if mark < end:
                self._drain_each([EPOCH_MARK])
            start = mark + 1

    def _drain_each(self, chunk: list) -> None:
        waits: list[int] = []
        steps: list[int] = []
        first_t0 = None
        for stamp in chunk:
            if stamp is EPOCH_MARK:
                self._prev_t1 = None  # the gap between epochs is not a training step
                self.in_next_since = None
                self.epoch += 1
                self._next_pairing()
                self._epoch_started = self._iter_starts.popleft() if self._iter_starts else None
                self._epoch_floor_ns = self._epoch_started or 0
                self._busy_since = {}
                self._idle_seen = {}
            elif stamp > 0:
                self.in_next_since = stamp
            elif stamp < 0 and self.in_next_since is not None:
                t0, t1 = self.in_next_since, -stamp
                self.in_next_since = None
                if first_t0 is None:
                    first_t0 = t0
                waits.append(t1 - t0)
                if self._prev_t1 is not None and t0 >= self._prev_t1:
                    steps.append(t0 - self._prev_t1)
                self._prev_t1 = t1
                if self._epoch_started is not None:
                    self._note_epoch_start(t1)
                self._receive([t0], [t1], 1)
            else:  # left next() by an exception (or an exit whose entry was lost)
                # Not counted as a received batch: StopIteration is not one, and where torch did
                # count a task (a worker's exception re-raised) the cross-check with its
                # `_rcvd_idx` (`_check_received`) stops the epoch's pairing instead.
                self.in_next_since = None
        if waits:
            self._record(waits, steps, first_t0)

    def _note_epoch_start(self, first_t1: int) -> None:
        started, self._epoch_started = self._epoch_started, None
        if started is not None and first_t1 >= started:
            self._epoch_starts_ms.append(round((first_t1 - started) / 1e6, 3))

    def _next_pairing(self) -> None:
        self._resolve_epochs()  # attach queued this mark's pairing before the mark itself
        self._pairing = self._pairings.popleft() if self._pairings else None
        self._count_mismatch = False

    def _record(self, waits_ns: list[int], steps_ns: list[int], first_t0: int) -> None:
        self._batches += len(waits_ns)
        self.batches_total += len(waits_ns)
        wait_ns = self._wait_buckets.add(waits_ns)  # counted in the histogram; their sum
        # Wall-clock attribution: of a wait that began before this interval only the part inside
        # it counts (the earlier part was reported as "blocked now" by the previous report).
        early = self._interval_start_ns - first_t0
        if early > 0:
            wait_ns -= min(early, waits_ns[0])
        self._wait_ns += wait_ns
        self._step_ns += self._step_buckets.add(steps_ns)
        self._wait_samples.extend(waits_ns)
        self._step_samples.extend(steps_ns)

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

    def _check_received(self, it) -> None:
        """Cross-check our count of the epoch's batches with torch's own `_rcvd_idx` while the
        loop is outside next(). A difference twice running (one could be the loop having moved
        on between our drain and this read) means the count is off: pair nothing more this
        epoch rather than pair wrongly. `_rcvd_idx` is 0 between a persistent iterator's reset
        and our `attach`: not a difference."""
        pairing = self._pairing
        if pairing is None or pairing.unpaired is not None or pairing.limit is not None:
            return
        try:
            rcvd = int(it._rcvd_idx)
        except (AttributeError, TypeError, ValueError):
            return
        if rcvd == 0 or rcvd == pairing.received:
            self._count_mismatch = False
        elif self._count_mismatch:
            pairing.unpaired = "lost_count"
        else:
            self._count_mismatch = True

    def add_worker_sample(self, sample: wire.WorkerSample) -> None:
        key = (sample.pid, sample.generation, sample.seq)
        if sample.ended:
            self._resolve_epochs()  # the notice's epoch, attached since the last report
            pairing = self._recent_pairings.get((sample.pid, sample.generation))
            if pairing is not None:
                task = sample.seq * len(pairing.pids) + pairing.pids.index(sample.pid)
                pairing.limit = task if pairing.limit is None else min(pairing.limit, task)
            return
        acc = self._workers.get(sample.worker_id)
        if acc is None:
            if len(self._workers) >= wire.MAX_WORKERS:
                return
            acc = self._workers[sample.worker_id] = _WorkerAccum()
        acc.pid = sample.pid
        acc.batches += 1
        collate_ns = min(sample.collate_ns, sample.fetch_ns)
        if len(acc.fetch_us) < wire.MAX_SAMPLES:
            acc.fetch_us.append((sample.fetch_ns - collate_ns) // 1000)
            acc.collate_us.append(collate_ns // 1000)
        acc.fetch_buckets.add_one(sample.fetch_ns - collate_ns)  # every batch, sampled or not
        if sample.done_ns and len(self._done) < PAIR_MAX_PENDING:
            self._done[key] = sample.done_ns
        acc.last_done_ns = max(acc.last_done_ns, sample.done_ns)
        if sample.tensors is not None and sample.tensor_bytes is not None:
            self._tensors = (sample.tensors, sample.tensor_bytes)
        acc.wall_ns += sample.fetch_ns
        acc.cpu_ns += sample.cpu_ns
        acc.dropped = sample.dropped

    def add_worker_start(self, start: wire.WorkerStart) -> None:
        """A worker process's first message: the random states it starts with."""
        self._resolve_epochs()
        if len(self._rng) >= wire.MAX_WORKERS:
            current = {pid for _, pid, _ in self._worker_procs}
            self._rng = {pid: v for pid, v in self._rng.items() if pid in current}
        if len(self._rng) < wire.MAX_WORKERS:
            self._rng[start.pid] = (start.worker_id, dict(start.digests))
        # Only a path of the two shapes the worker makes, for that very pid: nothing read from
        # the socket names a file we would otherwise open.
        if start.stack_file is not None and stacks.is_worker_stack_file(
                start.stack_file, start.pid, self.stack_dir):
            self._remember_stack_file(start.pid, start.stack_file)

    def _remember_stack_file(self, pid: int, path: str) -> None:
        """At most wire.MAX_WORKERS of them: when full, those of past epochs' workers go."""
        if len(self._stack_files) >= wire.MAX_WORKERS:
            current = {p for _, p, _ in self._worker_procs}
            self._stack_files = {p: f for p, f in self._stack_files.items() if p in current}
        if len(self._stack_files) < wire.MAX_WORKERS:
            self._stack_files[pid] = path

    def _rng_report(self) -> tuple[int, list[wire.RngShare]]:
        """Of this epoch's workers, how many were read, and the states two or more share."""
        current = [(wid, pid) for wid, pid, _ in self._worker_procs if pid in self._rng]
        by_state: dict[str, dict[str, list[int]]] = {}
        for wid, pid in current:
            for state, digest in self._rng[pid][1].items():
                by_state.setdefault(state, {}).setdefault(digest, []).append(wid)
        shared = []
        for state, groups in by_state.items():
            for wids in groups.values():
                if len(wids) >= 2 and len(shared) < 64:
                    shared.append(wire.RngShare(state=state, workers=sorted(wids)))
        return len(current), shared

    def _update_busy(self, it, now_ns: int) -> None:
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
                stacks.ask_worker_stack(pid)
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

    def sample_workers(self) -> None:
        """Liveness, CPU % and RSS of the current iterator's workers (~1 Hz); CPU and RSS only
        once a viewer has subscribed (psutil: see publisher._loading)."""
        self._resolve_epochs()
        psutil = resources.psutil
        it = self.iterator
        if it is not None:
            self._worker_procs = torch_internals.worker_pids(it)
        it = None  # not held through the psutil reads below (see sample_queue)
        # Once the iterator is gone (a break, an epoch end, a worker death raising in the loop),
        # the remembered Process objects still tell how each worker ended.
        status = {}
        seen = set()
        for wid, pid, proc in self._worker_procs:
            alive, exitcode = torch_internals.worker_state(pid, proc)
            cpu = rss = None
            if pid is not None and alive:
                seen.add(pid)
            if pid is not None and alive and psutil is not None:
                ps = self._psutil.get(pid)
                try:
                    if ps is None:
                        ps = self._psutil[pid] = psutil.Process(pid)
                        ps.cpu_percent(None)  # primes the delta; the first figure is unknown
                    else:
                        cpu = ps.cpu_percent(None)
                    rss = ps.memory_info().rss
                except psutil.Error:
                    pass
            status[wid] = (pid, alive, exitcode, cpu, rss)
        for pid in self._alive_pids - seen:
            self._psutil.pop(pid, None)
            self._stack_files.pop(pid, None)
            if self.stack_dir:  # a worker gone: its stack files too
                stacks.remove_worker_files(self.stack_dir, pid)
        self._alive_pids = seen
        self._worker_status = status
        self._update_busy(self.iterator, time.perf_counter_ns())  # read anew: see above

    def had_worker(self, pids: set[int]) -> bool:
        """Whether one of `pids` was a worker of this loader's latest epoch."""
        return any(pid in pids for _, pid, _ in self._worker_procs)

    def worker_pid_pairs(self) -> list[tuple[int, int]]:
        """(worker id, pid) of the current epoch's workers that were alive at the last sample."""
        return [(wid, st[0]) for wid, st in sorted(self._worker_status.items())
                if st[0] is not None and st[1]]

    def match_stages(self, now_ns: int) -> None:
        """Pair each received batch (older than PAIR_GRACE_NS) with its worker's produced stamp.

        Of the loop's wait for a batch, the part before the batch was produced is `producing`
        (the workers were the limit), the part after is `handoff` (moving it to this process,
        unpickling, pin_memory, waiting for earlier batches in order).
        """
        receipts = self._receipts
        done = self._done
        ripe = now_ns - PAIR_GRACE_NS
        while receipts and receipts[0][3] <= ripe:
            pairing, c, t0, t1 = receipts[0]
            if pairing.unpaired is not None or (pairing.limit is not None and c >= pairing.limit):
                receipts.popleft()
                continue
            receipts.popleft()
            produced = done.pop(pairing.key(c), None)
            if produced is None:
                # The worker sends its sample before it queues the batch, and the publisher reads
                # the samples just before this: a sample missing PAIR_GRACE_NS after the loop had
                # the batch was lost (a worker's send buffer full): this batch stays unpaired.
                continue
            if produced > t1:  # cannot be: a batch received before it was produced
                self._break_pairing("inconsistent")
                continue
            start = max(produced, t0)
            self._add_split(start - t0, t1 - start)
        # Stamps nobody will claim: a broken-off epoch's prefetched batches, lost receipts.
        stale = now_ns - PAIR_GIVE_UP_NS
        while done:
            first = next(iter(done))
            if done[first] > stale:
                break
            del done[first]

    def stage_report(self) -> wire.StageReport | None:
        if self.config.num_workers == 0:
            if not self._paired:
                return None
            return wire.StageReport(
                paired=self._paired, producing_ns=self._producing_ns, handoff_ns=self._handoff_ns,
                handoff_us=decimated_micros(self._handoff_samples),
                fetch_us=decimated_micros(self._stage_fetch),
                collate_us=decimated_micros(self._stage_collate))
        pairing = self._pairing
        tensors, size = self._tensors if self._tensors is not None else (None, None)
        return wire.StageReport(
            paired=self._paired, producing_ns=self._producing_ns, handoff_ns=self._handoff_ns,
            handoff_us=decimated_micros(self._handoff_samples),
            unpaired=self._unpaired_reason(pairing) if not self._paired else None,
            batch_tensors=tensors, batch_bytes=size)

    @staticmethod
    def _unpaired_reason(pairing: EpochPairing | None) -> str | None:
        if pairing is None:
            return None
        if pairing.unpaired is None and pairing.limit is not None:
            return "iterable_ended"  # the batches since a worker ran out cannot be named
        return pairing.unpaired

    def report(self, now_ns: int, sent_at: float, probe_cpu_fraction: float | None,
               watched: bool = False) -> wire.LoaderReport:
        """The next report. `watched`: a viewer is subscribed, so a worker stuck in one batch is
        asked for its stack (a signal: see `_worker_stack`)."""
        self.drain()
        if self.config.num_workers:
            self.match_stages(now_ns)
        if self._error_new:
            # The loop just raised: a dead worker is the likely cause; read how they are now.
            self._error_new = False
            self.sample_workers()
        if self._worker_procs and not self._worker_status:
            # A new epoch's workers (attach cleared the last epoch's status): their liveness goes
            # out in this report, not after the next 1 Hz sample, else each epoch's first second
            # reads "alive: unknown" for every worker.
            self.sample_workers()
        start = self._interval_start_ns
        blocked_since = self.in_next_since
        blocked_ms = None
        wait_ns = self._wait_ns
        if blocked_since:
            blocked_ms = max(0, now_ns - blocked_since) / 1e6
            wait_ns += max(0, now_ns - max(blocked_since, start))
        workers = self._worker_reports(now_ns, watched)
        q = self._q_last
        queue = wire.QueueReport(
            capacity=(self.config.num_workers * (self.config.prefetch_factor or 0)),
            ready=q.ready if q else (0 if self.config.num_workers == 0 else None),
            in_flight=q.in_flight if q else (0 if self.config.num_workers == 0 else None),
            samples=self._q_samples,
            ready_sum=self._q_ready_sum,
            in_flight_sum=self._q_flight_sum,
            waiting_samples=self._q_waiting,
            waiting_ready_samples=self._q_waiting_ready,
            waiting_cpu_ns=self._q_waiting_cpu,
            waiting_wall_ns=self._q_waiting_wall,
        )
        dropped = self.dropped + sum(w.dropped for w in self._workers.values())
        rng_checked, rng_shared = self._rng_report()
        msg = wire.LoaderReport(
            source=self.source, seq=self.seq, host=self.host, pid=os.getpid(), name=self.name,
            rank=self.rank, command=self.command, process_started_at=self.process_started_at,
            sent_at=sent_at, interval_s=min(3600.0, max(0, now_ns - start) / 1e9),
            config=self.config, epoch=self.epoch, batches=self._batches,
            batches_total=self.batches_total, wait_ns=wait_ns, step_ns=self._step_ns,
            wait_us=decimated_micros(self._wait_samples),
            step_us=decimated_micros(self._step_samples),
            blocked_ms=blocked_ms, queue=queue, workers=workers,
            loop_fetch_us=wire.decimate(self._loop_us), loop_fetch_wall_ns=self._loop_wall,
            loop_fetch_cpu_ns=self._loop_cpu, dropped=dropped,
            probe_cpu_fraction=probe_cpu_fraction, stages=self.stage_report(),
            resources=self.pending_resources, loop_stack=self._loop_stack_now(now_ns),
            error=self.error, epoch_starts_ms=list(self._epoch_starts_ms),
            rng_checked=rng_checked, rng_shared=rng_shared, **self._cpu_used(),
            wait_histogram=self._wait_buckets.histogram(),
            step_histogram=self._step_buckets.histogram(),
        )
        self.pending_resources = None
        self.seq += 1
        self._interval_start_ns = now_ns
        self._reset_interval()
        for acc in self._workers.values():
            acc.reset()
        return msg

    def _cpu_used(self) -> dict[str, int | None]:
        """CPU used since the last report by the training process (CLOCK_PROCESS_CPUTIME_ID:
        every thread — the loop, pin_memory's thread, this probe thread — and no child) and by
        the loop's thread (its own CPU clock, read from here): what the advice subtracts from the
        cores before it counts workers."""
        process = time.process_time_ns()
        clock = self._loop_cpu_clock
        loop = None
        if clock is not None:
            try:
                loop = time.clock_gettime_ns(clock)
            except OSError:  # the thread is gone
                clock = None
        last_process, last_clock, last_loop = self._cpu_mark
        self._cpu_mark = (process, clock, loop)
        loop_used = None
        if loop is not None and last_loop is not None and clock == last_clock:
            loop_used = max(0, loop - last_loop)
        return {"process_cpu_ns": max(0, process - last_process), "loop_cpu_ns": loop_used}

    def _worker_reports(self, now_ns: int, watched: bool) -> list[wire.WorkerReport]:
        out = []
        ids = set(self._worker_status) | set(self._workers)
        for wid in sorted(i for i in ids if i < self.config.num_workers):
            acc = self._workers.get(wid) or _WorkerAccum()
            pid, alive, exitcode, cpu, rss = self._worker_status.get(
                wid, (acc.pid, None, None, None, None))
            out.append(wire.WorkerReport(
                id=wid, pid=pid, alive=alive, exitcode=exitcode, cpu_percent=cpu, rss_bytes=rss,
                batches=acc.batches, fetch_us=list(acc.fetch_us), fetch_wall_ns=acc.wall_ns,
                fetch_cpu_ns=acc.cpu_ns, collate_us=list(acc.collate_us),
                busy_ms=self._busy_ms(wid, now_ns) if alive is not False else None,
                stack=self._worker_stack(wid, pid, now_ns, watched) if alive is not False
                else None,
                fetch_histogram=acc.fetch_buckets.histogram(),
            ))
        return out

    def goodbye(self, sent_at: float) -> wire.Goodbye:
        self.drain()
        msg = wire.Goodbye(source=self.source, seq=self.seq, sent_at=sent_at,
                           batches_total=self.batches_total, error=self.error)
        self.seq += 1
        return msg


class DequeStamps(deque):
    """The stamps where the C module is not built: StampRing's interface (append, extend, len,
    take) on a bounded deque, which drops single entries at its left when full."""

    __slots__ = ()

    def take(self) -> tuple[list, int]:
        """(every stamp held, oldest first; 1 where the deque is full and so may have lost
        some, else 0), leaving it empty."""
        n = len(self)
        # n pops in one C loop (starmap over n empty argument tuples): no bytecode runs between
        # them. A comprehension took 122-189 ns a stamp here, this 66-99 (two stamps a batch);
        # the training thread appends only at the right.
        return list(starmap(self.popleft, repeat((), n))), int(n == self.maxlen)


def new_events():
    """The training thread's stamps of one record: a StampRing where the C module is built."""
    if StampRing is not None:
        return StampRing(EVENTS_MAXLEN)
    return DequeStamps(maxlen=EVENTS_MAXLEN)


def py_split_stamps(pending: int | None, chunk: list, prev_t1: int | None, want_stamps: bool):
    """The drain's bulk path in Python (`split_stamps`' contract: probe/_hotpath.c). One min()
    and one max() tell whether the stamps alternate: an exception's 0 or a stamp out of place
    fails the signs, and an EPOCH_MARK (None) makes the comparisons raise TypeError."""
    stamps = [pending, *chunk] if pending is not None else chunk
    trailing = stamps[-1] if len(stamps) % 2 else None  # a loop inside next() right now
    body = stamps[:-1] if trailing is not None else stamps
    t0s, exits = body[0::2], body[1::2]
    try:
        if trailing is not None and trailing <= 0:
            return None
        if t0s and (min(t0s) <= 0 or max(exits) >= 0):
            return None
    except TypeError:  # None among the stamps: an epoch starts in this chunk
        return None
    t1s = list(map(operator.neg, exits))
    waits = list(map(operator.sub, t1s, t0s))
    steps = list(map(operator.sub, t0s[1:], t1s[:-1]))
    firsts: tuple = (None, None, None)
    if t0s:
        firsts = (t0s[0], t1s[0], t1s[-1])
        if prev_t1 is not None and t0s[0] >= prev_t1:
            steps.insert(0, t0s[0] - prev_t1)
    if not want_stamps:
        return waits, steps, trailing, *firsts, None, None
    return waits, steps, trailing, *firsts, t0s, t1s


def split_stamps(pending: int | None, chunk: list, prev_t1: int | None, want_stamps: bool):
    """In C where it is built: one pass, 55 ns a batch here (median of 40 chunks of 5,000
    batches; min 22), against 208 (min 121) for the Python one."""
    if _c_split_stamps is not None:
        return _c_split_stamps(pending, chunk, prev_t1, want_stamps)
    return py_split_stamps(pending, chunk, prev_t1, want_stamps)


def _thread_cpu_clock() -> int | None:
    """The calling thread's CPU-time clock id, readable from other threads (Linux, macOS)."""
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):
        return None


def py_decimated_micros(samples_ns: list[int]) -> list[int]:
    """A report's samples: at most wire.MAX_SAMPLES of them (`wire.decimate`), in µs."""
    return [v // 1000 for v in wire.decimate(samples_ns)]


def decimated_micros(samples_ns: list[int]) -> list[int]:
    """`py_decimated_micros`, in C where it is built: one pass, no list in between."""
    if _c_decimate_micros is not None:
        out = _c_decimate_micros(samples_ns, wire.MAX_SAMPLES)
        if out is not None:
            return out
    return py_decimated_micros(samples_ns)


def _weak(obj):
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj
