"""The training thread's stamps, and the drain that turns them into waits and steps.

The training thread only ever stores signed clock stamps in a record's `events` (see
`_InstrumentedIterator`): a StampRing where the C module is built, else a bounded deque. Both are
written and emptied holding the GIL (`deque.append` / `popleft` are atomic under it; the ring's
methods never release it), so the publisher thread drains without locks. Everything derived
(durations, sums, samples) is computed here on the publisher thread.
"""

from __future__ import annotations

import operator
from collections import deque
from itertools import repeat, starmap
from typing import TYPE_CHECKING, Any

from loadertop import wire
from loadertop.probe.histograms import BucketCounts

if TYPE_CHECKING:  # the state of every seam (record_state.py); object at run time
    from collections.abc import Callable

    from loadertop.probe import _hotpath
    from loadertop.probe.record_state import RecordState
else:
    RecordState = object

#: split_stamps' result: (waits, steps, trailing, first_t0, first_t1, last_t1, t0s, t1s)
SplitStamps = tuple[list[int], list[int], int | None, int | None, int | None, int | None,
                    list[int] | None, list[int] | None]

StampRing: type[_hotpath.StampRing] | None
_c_split_stamps: Callable[[int | None, list[Any], int | None, bool], SplitStamps | None] | None
try:  # the stamps' ring and the drain's bulk path in C (probe/_hotpath.c), built with the hot path
    from loadertop.probe._hotpath import StampRing
    from loadertop.probe._hotpath import split_stamps as _c_split_stamps
except ImportError:  # pragma: no cover - CI fails where it is missing (test_hotpath)
    StampRing = None
    _c_split_stamps = None

EVENTS_MAXLEN = 1 << 16  # stamps held between drains (>= 4 Hz) before the oldest are lost
EPOCH_MARK = None
EPOCHS_KEPT = 4  # ended epochs each report repeats (wire.EpochReport)


class StampDrain(RecordState):
    """LoaderRecord's drain (a mixin: see record.py). It reads the stamps `events`, the
    num_workers=0 `loop_samples` and each mark's `_iter_starts` that the training thread writes
    (record.py), adds to the interval's figures (report_assembly.py), and hands each batch and
    each epoch mark to stage pairing (`_receive`, `_next_pairing`, `_add_split`)."""

    def _init_drain(self) -> None:
        self.epoch = 0
        self.batches_total = 0
        self.dropped = 0
        self._prev_t1: int | None = None
        self.in_next_since: int | None = None  # the loop entered next() then and is still inside
        # Every wait and step of the loader's life, bucketed as drained (never reset).
        self._wait_buckets = BucketCounts()
        self._step_buckets = BucketCounts()
        self._epoch_started: int | None = None  # this epoch's iter() start, until its 1st batch
        self._epoch_starts_ms: deque[float] = deque(maxlen=8)  # the latest epochs' (every report)
        # This epoch, for its EpochReport once the next iter() ends it: its iter() start, its
        # first batch's (t0, t1), every wait of it (the first included), and whether stamps were
        # lost in it (its figures would be short: none is reported).
        self._epoch_iter_ns: int | None = None
        self._epoch_first: tuple[int, int] | None = None
        self._epoch_wait_ns = 0
        self._epoch_lost = False
        self._epochs: deque[wire.EpochReport] = deque(maxlen=EPOCHS_KEPT)

    def drain(self) -> None:
        """Turn the training thread's stamps into waits and steps.

        At tens of thousands of batches a second this runs on the publisher thread while holding
        the GIL the training loop also needs, so the steady case (alternating t0, -t1) is done in
        bulk (`split_stamps` and `bucket_count`, in C where it is built); only chunks holding an
        epoch mark, an exception exit or an overflow gap take the per-stamp loop. Splitting in the
        ring (`take_split`: no int made per stamp) and decimating the report's samples in C
        (`decimated_micros`) roughly halved the publisher thread's CPU at the fastest loaders
        (docs/performance.md: the drain, and the publisher thread at tens of thousands of
        batches/s).
        """
        events = self.events
        # A StampRing splits its steady stamps where they lie (no int made per stamp, then read
        # back); refused (a mark, a 0, lost stamps), they are taken and go the general way.
        take_split = getattr(events, "take_split", None)
        if take_split is None or not self._drain_split(
                take_split(self.in_next_since, self._prev_t1, self._want_stamps())):
            self._drain_taken(*events.take())
        self._drain_loop_samples()

    def _drain_taken(self, chunk: list[int | None], lost: int) -> None:
        if lost:
            self.dropped += 1  # stamps were lost: their waits and steps are not counted
            self._epoch_lost = True
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
            if fetch is not None and collate is not None and produced is not None:
                self._stage_fetch.append(fetch)
                self._stage_collate.append(collate)
                self._add_split(produced, wall - produced)

    def _drain_alternating(self, chunk: list[int | None]) -> bool:
        """Bulk path for [t0, -t1, t0, -t1, ...]; False (nothing consumed) if the chunk isn't so
        (an epoch mark, an exception's 0, a stamp out of place: `split_stamps`)."""
        return self._drain_split(split_stamps(self.in_next_since, chunk, self._prev_t1,
                                              self._want_stamps()))

    def _drain_split(self, parts: SplitStamps | None) -> bool:
        """Take in `split_stamps`' result; False for its None (nothing was consumed)."""
        if parts is None:
            return False
        pairing = self._pairing
        waits, steps, trailing, first_t0, first_t1, last_t1, t0s, t1s = parts
        self.in_next_since = trailing
        if first_t0 is None:
            return True
        if self._epoch_started is not None and first_t1 is not None:  # set with first_t0
            self._note_epoch_start(first_t0, first_t1)
        self._prev_t1 = last_t1
        self._record(waits, steps, first_t0)
        if pairing is not None:
            self._receive(t0s, t1s, len(waits))
        return True

    def _drain_segments(self, chunk: list[int | None]) -> None:
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

    def _drain_each(self, chunk: list[int | None]) -> None:
        waits: list[int] = []
        steps: list[int] = []
        first_t0: int | None = None
        for stamp in chunk:
            if stamp is EPOCH_MARK:
                self._end_epoch()
                self._prev_t1 = None  # the gap between epochs is not a training step
                self.in_next_since = None
                self.epoch += 1
                self._next_pairing()
                self._epoch_started = self._iter_starts.popleft() if self._iter_starts else None
                self._epoch_iter_ns = self._epoch_started
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
                    self._note_epoch_start(t0, t1)
                self._receive([t0], [t1], 1)
            else:  # left next() by an exception (or an exit whose entry was lost)
                # Not counted as a received batch: StopIteration is not one, and where torch did
                # count a task (a worker's exception re-raised) the cross-check with its
                # `_rcvd_idx` (`_check_received`) stops the epoch's pairing instead.
                self.in_next_since = None
        if waits and first_t0 is not None:  # the first wait set first_t0
            self._record(waits, steps, first_t0)

    def _note_epoch_start(self, first_t0: int, first_t1: int) -> None:
        started, self._epoch_started = self._epoch_started, None
        if started is not None and first_t1 >= started:
            self._epoch_starts_ms.append(round((first_t1 - started) / 1e6, 3))
            self._epoch_first = (first_t0, first_t1)

    def _end_epoch(self) -> None:
        """At the next iter()'s mark: the epoch that ends, as an EpochReport, where its start and
        its last batch are known and no stamp of it was lost (a partial epoch would misstate
        where its time went). Once per epoch, on the publisher thread."""
        first, started, last_t1 = self._epoch_first, self._epoch_iter_ns, self._prev_t1
        if first is not None and started is not None and last_t1 is not None \
                and not self._epoch_lost and started <= first[0] <= first[1] <= last_t1:
            t0, t1 = first
            self._epochs.append(wire.EpochReport(
                epoch=self.epoch, start_ms=round((t1 - started) / 1e6, 3),
                first_wait_ms=round((t1 - t0) / 1e6, 3), run_ms=round((last_t1 - t1) / 1e6, 3),
                run_wait_ms=round(max(0, self._epoch_wait_ns - (t1 - t0)) / 1e6, 3)))
        self._epoch_iter_ns = self._epoch_first = None
        self._epoch_wait_ns = 0
        self._epoch_lost = False

    def _record(self, waits_ns: list[int], steps_ns: list[int], first_t0: int) -> None:
        self._batches += len(waits_ns)
        self.batches_total += len(waits_ns)
        wait_ns = self._wait_buckets.add(waits_ns)  # counted in the histogram; their sum
        self._epoch_wait_ns += wait_ns  # a chunk's waits are of one epoch (marks split chunks)
        # Wall-clock attribution: of a wait that began before this interval only the part inside
        # it counts (the earlier part was reported as "blocked now" by the previous report).
        early = self._interval_start_ns - first_t0
        if early > 0:
            wait_ns -= min(early, waits_ns[0])
        self._wait_ns += wait_ns
        self._step_ns += self._step_buckets.add(steps_ns)
        self._wait_samples.extend(waits_ns)
        self._step_samples.extend(steps_ns)


class DequeStamps(deque[int | None]):
    """The stamps where the C module is not built: StampRing's interface (append, extend, len,
    take) on a bounded deque, which drops single entries at its left when full."""

    __slots__ = ()

    def take(self) -> tuple[list[int | None], int]:
        """(every stamp held, oldest first; 1 where the deque is full and so may have lost
        some, else 0), leaving it empty."""
        n = len(self)
        # n pops in one C loop (starmap over n empty argument tuples): no bytecode runs between
        # them, where a comprehension runs some per stamp (docs/performance.md); the training
        # thread appends only at the right.
        return list(starmap(self.popleft, repeat((), n))), int(n == self.maxlen)


def new_events() -> _hotpath.StampRing | DequeStamps:
    """The training thread's stamps of one record: a StampRing where the C module is built."""
    if StampRing is not None:
        return StampRing(EVENTS_MAXLEN)
    return DequeStamps(maxlen=EVENTS_MAXLEN)


def py_split_stamps(pending: int | None, chunk: list[Any], prev_t1: int | None,
                    want_stamps: bool) -> SplitStamps | None:
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
    firsts: tuple[Any, Any, Any] = (None, None, None)
    if t0s:
        firsts = (t0s[0], t1s[0], t1s[-1])
        if prev_t1 is not None and t0s[0] >= prev_t1:
            steps.insert(0, t0s[0] - prev_t1)
    if not want_stamps:
        return waits, steps, trailing, *firsts, None, None
    return waits, steps, trailing, *firsts, t0s, t1s


def split_stamps(pending: int | None, chunk: list[Any], prev_t1: int | None,
                 want_stamps: bool) -> SplitStamps | None:
    """In C where it is built: one pass, where Python makes lists (docs/performance.md)."""
    if _c_split_stamps is not None:
        return _c_split_stamps(pending, chunk, prev_t1, want_stamps)
    return py_split_stamps(pending, chunk, prev_t1, want_stamps)
