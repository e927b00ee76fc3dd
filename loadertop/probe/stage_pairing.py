"""Stage pairing: of the loop's wait for each batch, the part before its worker had produced it
(`producing`: the workers were the limit) and the part after (`handoff`), by pairing each batch
the loop received with its worker's "produced" stamp (publisher thread only)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from loadertop import wire
from loadertop.probe import torch_internals
from loadertop.probe.histograms import decimated_micros

if TYPE_CHECKING:  # the state of every seam (record_state.py); object at run time
    from loadertop.probe.record_state import RecordState
else:
    RecordState = object

# Pairing a received batch with its worker's "produced" stamp waits this long after the loop had
# it, so the worker's sample (sent before the batch was queued, over another socket) has surely
# arrived, and an iterable worker's "ran out" notice has too (see EpochPairing).
PAIR_GRACE_NS = 50_000_000
PAIR_GIVE_UP_NS = 5_000_000_000  # a worker's stamp no receipt claimed (a broken-off epoch): dropped
PAIR_MAX_PENDING = 1 << 16


class EpochPairing:
    """How to name the task behind the loop's c-th batch of one epoch (publisher thread only).

    torch 2.13 `_MultiProcessingDataLoaderIter`: `_try_put_index` sends task `_send_idx` to the next
    worker of `itertools.cycle(range(num_workers))` that is still active, `_reset` restarts both
    the count and the cycle each epoch, and with `in_order=True` the loop is given task
    `_rcvd_idx`, counting up. So for a map-style dataset the c-th batch of an epoch is task c,
    and task c is the (c // W)-th batch of worker c % W. An iterable dataset's worker that runs out
    (task e) is skipped from then on: batches from c = e on can no longer be named and stay
    unpaired. With `in_order=False` batches come in completion order: nothing is paired.

    With `run --autotune` an epoch's iterator can be replaced inside it (probe/worker_switch.py):
    from the loop's batch `offset` on, the batches are the new iterator's tasks 0, 1, ..., made
    by its own workers. Each iterator of the epoch has its EpochPairing, chained from the first
    (`successor`), and the c-th batch of the epoch is named by the last one whose offset is <= c.
    """

    __slots__ = ("pids", "generation", "limit", "unpaired", "received", "workers", "expected",
                 "offset", "successor", "started_ns")

    def __init__(self, pids: list[int | None] | None, generation: int, unpaired: str | None,
                 workers: list[Any] | None = None, expected: int = 0, offset: int = 0,
                 started_ns: int = 0) -> None:
        self.pids = pids  # None until LoaderRecord._resolve_epochs reads them from `workers`
        self.generation = generation
        self.limit: int | None = None  # the first task index that can no longer be named
        self.unpaired = unpaired
        self.received = 0
        self.workers = workers  # torch's list of the epoch's Process objects, until resolved
        self.expected = expected  # the loader's num_workers when the epoch began
        self.offset = offset  # the epoch's batches before this iterator's first
        self.successor: EpochPairing | None = None  # the iterator that replaced this one
        self.started_ns = started_ns  # when a successor's workers started (0: the epoch's)

    def key(self, c: int) -> tuple[int | None, int, int] | None:
        """The task behind the epoch's c-th batch; None where it cannot be named (a successor
        whose workers are unreadable, or whose batches come in completion order)."""
        pairing = self
        while pairing.successor is not None and c >= pairing.successor.offset:
            pairing = pairing.successor
        if pairing is not self and (pairing.unpaired is not None or pairing.pids is None):
            return None
        # Called once `_resolve_epochs` has read the pids: a list by then, not None.
        t = c - pairing.offset
        w = len(pairing.pids)  # type: ignore[arg-type]
        return pairing.pids[t % w], pairing.generation, t // w  # type: ignore[index]

    def last(self) -> EpochPairing:
        pairing = self
        while pairing.successor is not None:
            pairing = pairing.successor
        return pairing


class StagePairing(RecordState):
    """LoaderRecord's stage pairing (a mixin: see record.py). `attach` (record.py) queues one
    EpochPairing per epoch in `_pairings` / `_unresolved`; the drain hands over the received
    batches (`_receive`) and the epoch marks (`_next_pairing`); the workers' samples bring the
    produced stamps into `_done` (worker_resources.py)."""

    def _init_stage_pairing(self) -> None:
        self._generation = 0
        self._pairing: EpochPairing | None = None
        self._recent_pairings: dict[tuple[int | None, int], EpochPairing] = {}
        self._done: dict[tuple[int | None, int, int], int] = {}  # task key -> produced stamp
        # (pairing, c, t0, t1) waiting for their worker sample
        self._receipts: deque[tuple[EpochPairing, int, int, int]] = deque()
        self._tensors: tuple[int, int] | None = None
        self._count_mismatch = False

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
            if pairing.started_ns:  # an iterator replaced inside the epoch: its workers are new
                self._epoch_floor_ns = pairing.started_ns
                self._busy_since = {}
                self._idle_seen = {}

    def _next_pairing(self) -> None:
        self._resolve_epochs()  # attach queued this mark's pairing before the mark itself
        self._pairing = self._pairings.popleft() if self._pairings else None
        self._count_mismatch = False

    def _break_pairing(self, reason: str) -> None:
        if self._pairing is not None and self._pairing.unpaired is None:
            self._pairing.unpaired = reason

    def _want_stamps(self) -> bool:
        """Whether the drain needs the batches' own stamps: while the epoch's are paired."""
        pairing = self._pairing
        return pairing is not None and pairing.unpaired is None

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

    def _add_split(self, producing_ns: int, handoff_ns: int) -> None:
        self._paired += 1
        self._producing_ns += producing_ns
        self._handoff_ns += handoff_ns
        self._handoff_samples.append(handoff_ns)

    def _check_received(self, it: Any) -> None:
        """Cross-check our count of the epoch's batches with torch's own `_rcvd_idx` while the
        loop is outside next(). A difference twice running (one could be the loop having moved
        on between our drain and this read) means the count is off: pair nothing more this
        epoch rather than pair wrongly. `_rcvd_idx` is 0 between a persistent iterator's reset
        and our `attach`: not a difference."""
        pairing = self._pairing
        if pairing is None or pairing.unpaired is not None or pairing.limit is not None:
            return
        try:
            # an iterator that replaced the epoch's first counts from 0 (probe/worker_switch.py)
            rcvd = int(it._rcvd_idx) + self._iterator_offset
        except (AttributeError, TypeError, ValueError):
            return
        if rcvd == 0 or rcvd == pairing.received:
            self._count_mismatch = False
        elif self._count_mismatch:
            pairing.unpaired = "lost_count"
        else:
            self._count_mismatch = True

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
            key = pairing.key(c)
            produced = done.pop(key, None) if key is not None else None
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
            # arg-type: lists go out as tuples do (msgpack arrays), wire's types are as decoded
            return wire.StageReport(
                paired=self._paired, producing_ns=self._producing_ns, handoff_ns=self._handoff_ns,
                handoff_us=decimated_micros(self._handoff_samples),  # type: ignore[arg-type]
                fetch_us=decimated_micros(self._stage_fetch),  # type: ignore[arg-type]
                collate_us=decimated_micros(self._stage_collate))  # type: ignore[arg-type]
        pairing = self._pairing
        tensors, size = self._tensors if self._tensors is not None else (None, None)
        # arg-type: lists go out as tuples do (msgpack arrays), wire's types are as decoded
        return wire.StageReport(
            paired=self._paired, producing_ns=self._producing_ns, handoff_ns=self._handoff_ns,
            handoff_us=decimated_micros(self._handoff_samples),  # type: ignore[arg-type]
            unpaired=self._unpaired_reason(pairing) if not self._paired else None,
            batch_tensors=tensors, batch_bytes=size)

    @staticmethod
    def _unpaired_reason(pairing: EpochPairing | None) -> str | None:
        if pairing is None:
            return None
        if pairing.unpaired is None and pairing.limit is not None:
            return "iterable_ended"  # the batches since a worker ran out cannot be named
        return pairing.unpaired
