"""`run --autotune` inside the training process: at each epoch boundary (a loader's new `iter()`)
the strategy (loadertop/autotune.py) may set a new `num_workers`; never inside an epoch, and never
anything else of the loader (docs/contract.md §10, docs/autotune.md).

How the count changes (torch 2.13, `DataLoader.__iter__`/`_get_iterator`): `num_workers` is read
when an iterator is created, and `DataLoader.__setattr__` allows setting it after construction
(only `batch_size`, `sampler`, `batch_sampler`, `drop_last`, `dataset` and `persistent_workers`
are refused). Without persistent workers each `iter()` creates an iterator, so the new count
simply applies. With them, `iter()` resets the iterator kept in `loader._iterator` and its
workers; so when the count changes the old workers are shut down there
(`_iterator._shutdown_workers()`, what its `__del__` would do) and `_iterator` dropped, and torch
starts the new count. The sampler, batch size, collate_fn, worker_init_fn and generator are not
touched: the epoch's batches, their order and content are the sampler's.

An epoch is measured from its `iter()` to the end of its iterator (its last reference dropped:
the `for` loop ended or broke) or the next `iter()`, whichever comes first, with torch's own
batch count (`_num_yielded`); nothing is added to the per-batch path. A long epoch (a measurement
by itself) leaves out its warm-up: the time to its first batch, which the record's drain measures.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from loadertop import autotune, wire

MEMORY_MARGIN = 0.10  # available memory (or what the cgroup limit leaves) under 10 %: pressure
MAX_WORKERS_PER_CORE = 4  # the highest count tried: this many per core (I/O-bound loaders wait)
MAX_WORKERS_FLOOR = 8


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class LoaderTuner:
    """One loader's tuner, kept on its record (`record.autotune`). Training thread: `begin`
    (before torch creates the epoch's iterator) and `started`; the end of an epoch comes from the
    training thread too (the iterator's end, or the next `begin`); the publisher thread reads
    `report()`. A lock keeps the two consistent."""

    def __init__(self, loader: Any, name: str,
                 warm_up_ms: Callable[[], float | None] | None = None) -> None:
        own = int(getattr(loader, "num_workers", 0) or 0)
        self.name = name
        # the latest epoch's time from iter() to its first batch (the record's drain measures it)
        self._warm_up_ms = warm_up_ms
        self.note_batch_size(loader)
        self.tuner = autotune.EpochTuner(own, max(MAX_WORKERS_FLOOR, MAX_WORKERS_PER_CORE * _cores()))
        self.active = own > 0  # a num_workers=0 program is left as it is (docs/autotune.md)
        self._lock = threading.Lock()
        self.epoch_token = 0  # which epoch an iterator belongs to (its end is told once)
        self._open: tuple[int, int, int, Any] | None = None  # (token, started ns, count, weakref to inner)
        self._swap = _swap_pages()
        self._said_iterable = False
        # the base seed of a restarted persistent iterator's workers (see _seed_source)
        self._restart_seed: int | None = None

    # -------------------------------------------------------------- training thread
    def begin(self, loader: Any) -> None:
        """At `iter()`, before torch creates the iterator: close the last epoch, and set the
        coming epoch's count."""
        if not self.active:
            return
        if not self._said_iterable and _is_iterable(loader):
            self._said_iterable = True
            print(f"loadertop: autotune of {self.name!r}: its dataset is an IterableDataset, whose "
                  "sharding by worker id changes with num_workers; a bit-exact reproducible run "
                  "should not use --autotune", file=sys.stderr, flush=True)
        self._close_open(time.perf_counter_ns())
        self.note_batch_size(loader)
        with self._lock:
            target = self.tuner.num_workers
        current = int(getattr(loader, "num_workers", 0) or 0)
        if target != current and current > 0:
            self._restart_seed = _set_num_workers(loader, target)

    def create(self, loader: Any, create: Any) -> Any:
        """`create(loader)` (torch's iterator), and when the count we set cannot start its workers,
        the count before it: reverted, with a finding on stderr; the program's own count's error
        is the program's."""
        seed, self._restart_seed = self._restart_seed, None
        with _seed_source(loader, seed):
            return self._create(loader, create)

    def _create(self, loader: Any, create: Any) -> Any:
        try:
            if not self.active or loader.num_workers == self.tuner.program_num_workers:
                return create(loader)
            with warnings.catch_warnings():
                # torch warns when num_workers exceeds its suggested maximum (the cores); a count
                # the tuner set is ours to answer for, not the program's.
                warnings.filterwarnings("ignore", message="This DataLoader will create")
                return create(loader)
        except (OSError, RuntimeError) as exc:
            tried = loader.num_workers
            if not self.active or tried == self.tuner.program_num_workers:
                raise
            with self._lock:
                previous = max((s.num_workers for s in self.tuner.tried.values()
                                if s.note is None and s.rate is not None),
                               key=lambda n: self.tuner.tried[n].rate or 0.0,
                               default=self.tuner.program_num_workers)
                self.tuner.failed_to_start(tried, previous)
            print(f"loadertop: autotune of {self.name!r}: {tried} workers could not start "
                  f"({exc!r}); back to {previous}", file=sys.stderr, flush=True)
            _set_num_workers(loader, previous)
            return create(loader)

    def started(self, loader: Any, inner: Any, started_ns: int) -> None:
        if not self.active:
            return
        self.epoch_token += 1
        self._open = (self.epoch_token, started_ns, int(loader.num_workers or 0), weakref.ref(inner))

    def ended(self, token: int, batches: int | None) -> None:
        """The epoch's iterator was released (its last reference dropped)."""
        if self._open is not None and self._open[0] == token:
            self._close_open(time.perf_counter_ns(), batches)

    def _close_open(self, now_ns: int, batches: int | None = None) -> None:
        opened, self._open = self._open, None
        if opened is None:
            return
        _, started_ns, count, inner_ref = opened
        inner = inner_ref()
        if batches is None:
            batches = int(getattr(inner, "_num_yielded", 0) or 0) if inner is not None else 0
        killed = _killed_worker(inner)
        pressure = killed or self._memory_pressure()
        seconds = (now_ns - started_ns) / 1e9
        measured = batches
        if seconds >= autotune.LONG_EPOCH_S and batches > 1 and self._warm_up_ms is not None:
            # A long epoch is a measurement by itself: its warm-up (the workers' start and the
            # first batch) is left out, as `tune` leaves out a trial's start-up.
            warm_up = (self._warm_up_ms() or 0.0) / 1000
            if 0 < warm_up < seconds / 2:
                seconds -= warm_up
                measured = batches - 1
        epoch = autotune.Epoch(num_workers=count, samples=measured * self._batch_size,
                               seconds=seconds, batches=batches, memory_pressure=pressure)
        with self._lock:
            self.tuner.observe(epoch)

    _batch_size = 1

    def note_batch_size(self, loader: Any) -> None:
        size = getattr(loader, "batch_size", None)
        self._batch_size = size if isinstance(size, int) and size > 0 else 1

    def _memory_pressure(self) -> str | None:
        swap = _swap_pages()
        swapped = swap is not None and self._swap is not None and swap > self._swap
        self._swap = swap
        if swapped:
            return "swap activity"
        return _memory_short()

    # -------------------------------------------------------------- publisher thread, exit
    def report(self) -> wire.AutotuneReport | None:
        if not self.active:
            return None
        with self._lock:
            t = self.tuner
            best = t.pick()
            tried = tuple(wire.AutotuneSetting(
                num_workers=s.num_workers, samples_per_s=s.rate, noise=s.noise, epochs=s.epochs,
                note=s.note) for s in sorted(t.tried.values(), key=lambda s: s.num_workers))
            return wire.AutotuneReport(
                state=t.state, num_workers=t.num_workers, program_num_workers=t.program_num_workers,
                epoch=t.epochs, best_num_workers=best.num_workers if best else None,
                best_samples_per_s=best.rate if best else None, tried=tried, reason=t.reason)

    def closing_line(self) -> str | None:
        if not self.active:
            return None
        self._close_open(time.perf_counter_ns())
        with self._lock:
            t = self.tuner
            pick = t.pick()
            if pick is None or pick.rate is None:
                return (f"loadertop: autotune of {self.name!r}: not enough epochs to judge "
                        f"(stayed at {t.program_num_workers} workers)")
            gain = t.gain()
            gained = (f", {gain:+.0%} over the program's {t.program_num_workers}"
                      if gain is not None else "")
            where = "settled on" if t.state == autotune.SETTLED else "best so far:"
            return (f"loadertop: autotune of {self.name!r}: {where} num_workers={pick.num_workers}"
                    f" ({pick.rate:.0f} samples/s{gained}) after {t.epochs} epochs; "
                    f"to keep it, set num_workers={pick.num_workers}")


def _set_num_workers(loader: Any, count: int) -> int | None:
    """Set the count the next iterator starts. With persistent workers, shut the kept iterator's
    down and drop it, and return a seed for its replacement's workers (see `_seed_source`)."""
    seed = None
    if getattr(loader, "persistent_workers", False):
        old = getattr(loader, "_iterator", None)
        if old is not None:
            # torch 2.13 would reset these workers for the new epoch; the new count needs new ones
            shutdown = getattr(old, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            loader._iterator = None
            base = getattr(old, "_base_seed", 0)
            seed = (int(base) * 6364136223846793005 + 1442695040888963407) % (1 << 63)
    loader.num_workers = count
    return seed


class _seed_source:
    """While a restarted persistent iterator is created, `loader.generator` is a generator of its
    own, seeded from the old iterator's seed. torch 2.13's `_BaseDataLoaderIter.__init__` draws
    the workers' base seed from `loader.generator` (the global generator when None), where the
    `_reset` of a kept iterator draws nothing: drawn from the program's generator, that one draw
    would shift the sampler's shuffle (a RandomSampler keeps its own reference to the same
    generator, and draws from it, not from `loader.generator`) or the program's global random
    stream. `DataLoader.__setattr__` allows setting `generator` after construction."""

    def __init__(self, loader: Any, seed: int | None) -> None:
        self.loader = loader
        self.seed = seed
        self.saved: Any = None

    def __enter__(self) -> None:
        if self.seed is None:
            return
        import torch

        self.saved = self.loader.generator
        self.loader.generator = torch.Generator().manual_seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        if self.seed is not None:
            self.loader.generator = self.saved


def _is_iterable(loader: Any) -> bool:
    try:
        from torch.utils.data import IterableDataset

        return isinstance(getattr(loader, "dataset", None), IterableDataset)
    except Exception:
        return False


def _killed_worker(inner: Any) -> str | None:
    for worker in list(getattr(inner, "_workers", None) or ()):
        code = getattr(worker, "exitcode", None)
        if code is not None and code < 0 and -code == 9:
            return f"a worker was killed (pid {getattr(worker, 'pid', '?')})"
    return None


def _swap_pages() -> int | None:
    try:
        with open("/proc/vmstat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    total = 0
    for line in text.splitlines():
        if line.startswith((b"pswpin ", b"pswpout ")):
            total += int(line.split()[1])
    return total


def _memory_short() -> str | None:
    try:
        with open("/proc/meminfo", "rb") as f:
            info = {line.split(b":")[0]: int(line.split()[1]) * 1024 for line in f if b":" in line
                    and len(line.split()) >= 2 and line.split()[1].isdigit()}
        total, available = info.get(b"MemTotal"), info.get(b"MemAvailable")
        if total and available is not None and available < MEMORY_MARGIN * total:
            return f"available memory {available / total:.0%} of the machine's"
    except (OSError, ValueError):
        pass
    try:
        from loadertop.system.cgroup import Cgroup

        group = Cgroup.detect()
        limit, used = group.mem_limit_bytes(), group.mem_used_bytes()
        if limit and used is not None and limit - used < MEMORY_MARGIN * limit:
            return f"the cgroup's memory limit {used / limit:.0%} used"
    except Exception:
        pass
    return None


# ---------------------------------------------------------------- the exit line, once per process
_tuners: list[weakref.ref[LoaderTuner]] = []
_exit_registered = False


def track(tuner: LoaderTuner) -> None:
    global _exit_registered
    _tuners.append(weakref.ref(tuner))
    if not _exit_registered:
        import atexit

        atexit.register(_say_where_settled)
        _exit_registered = True


def _say_where_settled() -> None:
    for ref in _tuners:
        tuner = ref()
        if tuner is None:
            continue
        try:
            line = tuner.closing_line()
        except Exception:
            continue
        if line:
            print(line, file=sys.stderr, flush=True)
