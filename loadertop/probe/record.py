"""Per-loader state: what the training thread writes (cheaply) and the publisher thread reads.

`LoaderRecord` is one object per instrumented loader, made of one mixin per seam, each in its own
module with the state it owns (its `_init_*`):

- stamp_drain.py: the training thread's stamps, and the drain that turns them into waits and steps
- stage_pairing.py: each received batch paired with its worker's "produced" stamp
- queue_sampling.py: queue depth, and the loop's CPU while it waits
- worker_resources.py: each worker's fetch figures, random states, liveness, CPU and RSS
- hang_forensics.py: how long a worker has been in its batch, and the stacks of what is stuck
- report_assembly.py: the interval's figures, and the report and goodbye made of them

(histograms.py: the bucket counts and decimated samples the reports carry.) They are mixins, not
helper objects, so that the drain, which runs per batch, reads the record's own attributes: no
attribute lookup or call more than in one class. This module holds the record's identity and what
the training thread calls, at each epoch or once, never per batch (attach, refresh_config,
note_error).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loadertop import environment, wire
from loadertop.probe import torch_internals
from loadertop.probe.hang_forensics import HangForensics
from loadertop.probe.queue_sampling import QueueSampling
from loadertop.probe.report_assembly import ReportAssembly
from loadertop.probe.stage_pairing import EpochPairing, StagePairing
from loadertop.probe.stamp_drain import EPOCH_MARK, StampDrain, new_events
from loadertop.probe.worker_resources import WorkerResources

if TYPE_CHECKING:
    from loadertop.probe.autotune import LoaderTuner
    from loadertop.probe.record_state import LoopSample

LOOP_CPU_SAMPLE_NS = 10_000_000  # num_workers=0: measure the loop's fetch CPU every >= 10 ms


class LoaderRecord(StampDrain, StagePairing, QueueSampling, WorkerResources, HangForensics,
                   ReportAssembly):
    def __init__(self, loader: Any, *, name: str, source: str, host: str, rank: int | None,
                 command: str, process_started_at: float) -> None:
        # --- written by the training thread ---
        # t0 > 0, -t1 < 0, 0, or EPOCH_MARK: raw in a C ring where it is built (the C hot path
        # pushes there without making an int), else Python ints in a bounded deque.
        self.events = new_events()
        # num_workers=0, one batch per LOOP_CPU_SAMPLE_NS: (wall, cpu, fetch, collate, produced)
        # in ns, `produced` counted from next()'s entry; fetch/collate None where unmeasured.
        self.loop_samples: deque[LoopSample] = deque(maxlen=4096)
        self._iterator_ref = None
        # `run --autotune`: the epoch's batches before the current iterator's first (an iterator
        # that replaced the epoch's first counts from 0: probe/worker_switch.py), and the epoch's
        # first pairing, which a replacement's pairing is chained to
        self._iterator_offset = 0
        self._attached_pairing: EpochPairing | None = None
        # one EpochPairing (or None: no workers) per EPOCH_MARK, in order
        self._pairings: deque[EpochPairing | None] = deque(maxlen=64)
        self._unresolved: deque[EpochPairing] = deque()  # pairings whose pids the publisher has yet to read
        self._iter_starts: deque[int | None] = deque(maxlen=64)  # each EPOCH_MARK's iter() start, in order
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
        self._config_key: tuple[Any, ...] | None = torch_internals.settings_key(loader)
        self._loop_cpu_clock: int | None = None  # CPU clock of the thread that iterates
        self.retired_since: float | None = None  # set by the publisher while the loader is dead
        self.autotune: LoaderTuner | None = None  # `run --autotune` (docs/contract.md §10)
        # --- publisher-thread state, seam by seam ---
        self._init_drain()
        self._init_stage_pairing()
        self._init_queue_sampling()
        self._init_worker_resources()
        self._init_hang_forensics()
        self._init_report_assembly()
        if environment.autotune():  # after the drain's state, which the tuner reads
            self.start_autotune(loader)

    # ------------------------------------------------------------ training thread (not hot)
    def attach(self, iterator: Any, started_ns: int | None = None) -> None:
        """A new epoch's iterator: called from the loader's __iter__, never per batch.
        `started_ns` is when that __iter__ began (the workers start inside it).

        This runs right after torch forked the epoch's workers, where every page of this process
        the loop's thread writes first is copied (a page fault each; docs/performance.md,
        "recording the epoch", when this read the workers' pids and the loader's settings itself).
        So it keeps to
        references and appends: the settings are read before the fork (`refresh_config`), and the
        workers' pids on the publisher thread (`_resolve_epochs`), from torch's own list of the
        epoch's Process objects, which stays readable after a worker dies or the iterator goes."""
        same_iterator = self.iterator is iterator  # persistent workers: one iterator, reset
        self._iterator_offset = 0
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
        pairing: EpochPairing | None
        if num_workers:
            # torch 2.13 starts the workers in the iterator's __init__ and keeps them in
            # `_workers`: holding that list now, not at the next 1 Hz sample, means a worker that
            # dies (and takes the iterator with it) in the first second is still reported dead.
            pairing = EpochPairing(
                None, self._generation,
                "in_order_false" if getattr(iterator, "_in_order", True) is False else None,
                getattr(iterator, "_workers", None), num_workers)
            self._unresolved.append(pairing)
        else:
            pairing = None
        self._attached_pairing = pairing
        self._pairings.append(pairing)
        self._iter_starts.append(started_ns)
        self.events.append(EPOCH_MARK)

    def switched(self, iterator: Any, offset: int, started_ns: int) -> None:
        """`run --autotune` replaced the epoch's iterator inside it (probe/worker_switch.py): the
        loop's batches from `offset` on are `iterator`'s, made by its workers (started at
        `started_ns`). Training thread, once per switch; the config is read again (the count)."""
        first = self._attached_pairing
        pairing = EpochPairing(
            None, 0, "in_order_false" if getattr(iterator, "_in_order", True) is False else None,
            getattr(iterator, "_workers", None), int(getattr(iterator, "_num_workers", 0) or 0),
            offset=offset, started_ns=started_ns)
        if first is not None:
            # the publisher reads the chain only for batches >= offset, none of them yielded yet
            first.last().successor = pairing
            self._unresolved.append(pairing)
        self._iterator_offset = offset
        self._iterator_ref = _weak(iterator)

    def start_autotune(self, loader: Any) -> None:
        """Tune this loader's num_workers between epochs (probe/autotune.py); imported only here,
        so a run without --autotune loads none of it."""
        from loadertop.probe import autotune

        starts = self._epoch_starts_ms  # the drain's first-batch latencies, latest last
        self.autotune = autotune.LoaderTuner(
            loader, self.name, warm_up_ms=lambda: starts[-1] if starts else None, record=self)
        autotune.track(self.autotune)

    def refresh_config(self, loader: Any) -> None:
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

    def alive(self) -> bool:
        """False once the loader is garbage-collected and no iterator of it remains."""
        loader = self._loader_ref() if self._loader_ref is not None else None
        return loader is not None or self.iterator is not None

    def loader_dropped(self) -> bool:
        """The loader itself is garbage-collected (an iterator of it may remain)."""
        return self._loader_ref is not None and self._loader_ref() is None

    @property
    def iterator(self) -> Any:
        return self._iterator_ref() if self._iterator_ref is not None else None


def _thread_cpu_clock() -> int | None:
    """The calling thread's CPU-time clock id, readable from other threads (Linux, macOS)."""
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):
        return None


def _weak(obj: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj
