"""`run --autotune` inside the training process: the strategy (loadertop/autotune.py) sets a
loader's `num_workers` at each epoch boundary (a loader's new `iter()`) and, for a map-style
loader, inside a long epoch (probe/worker_switch.py); never anything else of the loader
(docs/contract.md §10, docs/autotune.md).

At an epoch boundary (torch 2.13, `DataLoader.__iter__`/`_get_iterator`): `num_workers` is read
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

Inside an epoch the publisher thread measures windows of the loop's batches at each report
(`tick`, from the record's drained stamps: the batch count and the last batch's exit time), each
count's warm-up left out; an epoch expected to last LONG_EPOCH_S or more feeds them to the
strategy, and a count it answers is switched to at once where the rest of the epoch pays for the
switch (`autotune.worth_switching`, with the switches' measured cost).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from loadertop import autotune, environment, wire
from loadertop.probe import torch_internals
from loadertop.probe.tuner_memory import MemoryPlan, memory_short, swap_pages
from loadertop.probe.tuner_windows import Windows
from loadertop.probe.worker_switch import Switch, why_not_switchable

MAX_WORKERS_PER_CORE = 4  # the highest count tried: this many per core (I/O-bound loaders wait)
MAX_WORKERS_FLOOR = 8
SWITCH_LOG = 64  # the switches a report carries (the latest)
# The tuner's clock: CLOCK_MONOTONIC, as the record's stamps (perf_counter_ns on Linux); a name of
# its own so that a test can hold it still.
_clock_ns = time.perf_counter_ns


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class LoaderTuner:
    """One loader's tuner, kept on its record (`record.autotune`). Training thread: `begin`,
    `create`, `started` (at `iter()`, holding `switch_lock`), the end of an epoch (the
    iterator's release, or the next `begin`) and a switch's steps (`switch_*`); the publisher
    thread: `tick` and `report()`. `_lock` keeps the two consistent."""

    def __init__(self, loader: Any, name: str,
                 warm_up_ms: Callable[[], float | None] | None = None,
                 record: Any = None, environ: Mapping[str, str] = os.environ) -> None:
        own = int(getattr(loader, "num_workers", 0) or 0)
        self.name = name
        # the latest epoch's time from iter() to its first batch (the record's drain measures it)
        self._warm_up_ms = warm_up_ms
        self._record = weakref.ref(record) if record is not None else None
        self._loader = _weak(loader)
        self.note_batch_size(loader)
        prefetch = getattr(loader, "prefetch_factor", None) if own else None
        self.tuner = autotune.EpochTuner(
            own, max(MAX_WORKERS_FLOOR, MAX_WORKERS_PER_CORE * _cores()),
            prefetch if isinstance(prefetch, int) and prefetch > 0 else None)
        self.active = own > 0  # a num_workers=0 program is left as it is (docs/autotune.md)
        self._stateful = _is_stateful(loader)
        unfit = _why_not_tuned(loader) if self.active else None
        if unfit is not None:
            self.active = False
            print(f"loadertop: autotune of {name!r}: left at {own} workers: {unfit}",
                  file=sys.stderr, flush=True)
        self._lock = threading.Lock()
        # Held by the training thread while an iterator of the loader is made (torch sets its
        # `_sampler_iter` there) and by the publisher thread while it arms a switch: a switch is
        # never armed on an iterator being made or reset.
        self.switch_lock = threading.Lock()
        self.epoch_token = 0  # which epoch an iterator belongs to (its end is told once)
        self._open: tuple[int, int, int, Any] | None = None  # (token, started ns, count, weakref to inner)
        self._swap = swap_pages()
        self._said_iterable = False
        # the base seed of a restarted persistent iterator's workers (see _seed_source)
        self._restart_seed: int | None = None
        # --- inside an epoch
        self.worker_init: Callable[[Any], Any] | None = None  # the new workers' hook (loader.py)
        self._loop: Callable[[], Any] = lambda: None  # the loop's iterator (weakly)
        self._fixed: str | None = None  # why this loader's count changes only between epochs
        # The switch armed or under way, weakly: the old iterator's Trigger holds it until it
        # fires, then the loop's iterator; a loop that drops them drops it.
        self._switch: Callable[[], Switch | None] = _none
        self._switched_ns = 0  # the end of this epoch's latest switch (0: none)
        self._windows_token = 0  # the epoch whose windows the strategy had
        self._windows = Windows()  # publisher thread
        self._epoch_sums = [0, 0, 0]  # the open epoch's loop waits, wall time, worker fetch (ns)
        self._switches: deque[wire.AutotuneSwitch] = deque(maxlen=SWITCH_LOG)
        self.switch_count = 0
        self._epoch_base_seed: int | None = None  # the base seed torch drew for this epoch
        self._memory = MemoryPlan()
        self._schedule = environment.autotune_schedule(environ)  # tests: switches where told

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
        self._close_open(_clock_ns())
        with self._lock:
            self._switch = _none  # one armed last epoch went with its iterator's reset or release
            self._switched_ns = 0
            target, prefetch = self.tuner.num_workers, self.tuner.prefetch_factor
        self.note_batch_size(loader)
        current = int(getattr(loader, "num_workers", 0) or 0)
        resumed = _resumed_count(loader)
        if resumed is not None:
            target = resumed  # torchdata resumes a state_dict only with the count it was taken at
        elif self._schedule is not None:
            target, prefetch = current, None  # the forced schedule alone changes the count
        if current > 0 and (target != current or (
                prefetch is not None and prefetch != getattr(loader, "prefetch_factor", None))):
            self._restart_seed = _set_num_workers(loader, target, prefetch)

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
            previous = self._revert(tried, exc)
            _set_num_workers(loader, previous)
            return create(loader)

    def _revert(self, tried: int, exc: BaseException) -> int:
        """`tried` workers could not start: the best count so far instead, never `tried` again."""
        with self._lock:
            previous = max((s.num_workers for s in self.tuner.tried.values()
                            if s.note is None and s.rate is not None),
                           key=lambda n: self.tuner.tried[n].rate or 0.0,
                           default=self.tuner.program_num_workers)
            self.tuner.failed_to_start(tried, previous)
        print(f"loadertop: autotune of {self.name!r}: {tried} workers could not start "
              f"({exc!r}); back to {previous}", file=sys.stderr, flush=True)
        return previous

    def started(self, loader: Any, inner: Any, started_ns: int) -> None:
        if not self.active:
            return
        self.epoch_token += 1
        count = int(loader.num_workers or 0)
        with self._lock:
            self._open = (self.epoch_token, started_ns, count, weakref.ref(inner))
            self._epoch_sums = [0, 0, 0]
        base = getattr(inner, "_base_seed", None)
        self._epoch_base_seed = int(base) if isinstance(base, int) else None
        if self._fixed is None:
            why = why_not_switchable(loader, inner)
            if why is not None:
                self._fixed = why
                if not self._said_iterable:  # an IterableDataset was told about already
                    print(f"loadertop: autotune of {self.name!r}: num_workers changes only "
                          f"between epochs: {why}", file=sys.stderr, flush=True)
        self._keep_state_in_program_terms(inner)

    def loop_iterator(self, wrapper: Any) -> None:
        """The loop's iterator of the epoch just started (loader.py), through which a switch
        inside the epoch goes; with the forced schedule, its first switch is armed here."""
        if not self.active:
            return
        self._loop = weakref.ref(wrapper)
        if self._schedule is not None:
            self._arm_scheduled(wrapper)

    def ended(self, token: int, batches: int | None) -> None:
        """The epoch's iterator was released (its last reference dropped)."""
        if self._open is not None and self._open[0] == token:
            self._close_open(_clock_ns(), batches)

    def _close_open(self, now_ns: int, batches: int | None = None) -> None:
        with self._lock:
            opened, self._open = self._open, None
            windowed = opened is not None and self._windows_token == opened[0]
        if opened is None:
            return
        token, started_ns, count, inner_ref = opened
        inner = inner_ref()
        if batches is None:
            batches = int(getattr(inner, "_num_yielded", 0) or 0) if inner is not None else 0
        killed = _killed_worker(inner)
        pressure = killed or self._memory_pressure()
        if windowed:  # measured by its windows: only its end and any memory pressure are news
            with self._lock:
                self.tuner.epochs += 1
                if pressure is not None:
                    self.tuner.observe(autotune.Epoch(num_workers=count, samples=0, seconds=0.0,
                                                      batches=0, memory_pressure=pressure,
                                                      window=True))
            return
        seconds = (now_ns - started_ns) / 1e9
        measured = batches
        if seconds >= autotune.LONG_EPOCH_S and batches > 1 and self._warm_up_ms is not None:
            # A long epoch is a measurement by itself: its warm-up (the workers' start and the
            # first batch) is left out, as `tune` leaves out a trial's start-up.
            warm_up = (self._warm_up_ms() or 0.0) / 1000
            if 0 < warm_up < seconds / 2:
                seconds -= warm_up
                measured = batches - 1
        if self._switched_ns:  # switched inside and measured whole: not one count's epoch
            count = -1
        wait, wall, busy = self._epoch_sums
        epoch = autotune.Epoch(num_workers=count, samples=measured * self._batch_size,
                               seconds=seconds, batches=batches, memory_pressure=pressure,
                               prefetch_factor=_prefetch_of(inner),
                               starved=_starved(wait, wall, busy, count))
        with self._lock:
            self.tuner.observe(epoch)

    _batch_size = 1

    def note_batch_size(self, loader: Any) -> None:
        size = getattr(loader, "batch_size", None)
        self._batch_size = size if isinstance(size, int) and size > 0 else 1

    def _memory_pressure(self) -> str | None:
        swap = swap_pages()
        swapped = swap is not None and self._swap is not None and swap > self._swap
        self._swap = swap
        if swapped:
            return "swap activity"
        return memory_short()

    # -------------------------------------------------------------- a switch inside an epoch
    def switch_started(self, switch: Switch) -> None:
        """Training thread: the new iterator is about to be made (its workers to start)."""

    def switch_done(self, switch: Switch) -> None:
        """Training thread: the new iterator took the old one's place (probe/worker_switch.py)."""
        new = switch.new
        with self._lock:
            current = self._open is not None and self._open[0] == switch.token
            if not current:  # the loop's iterator of an epoch the loader has moved on from
                return
            self._switch = _none
            token, started_ns, _, _ = self._open  # type: ignore[misc]  # current
            self._open = (token, started_ns, switch.count, weakref.ref(new))
            self._switched_ns = switch.done_ns or _clock_ns()
            self.switch_count += 1
            self._switches.append(wire.AutotuneSwitch(
                epoch=max(0, self.epoch_token - 1), batch=switch.at_batch or 0,
                from_workers=switch.old_count, to_workers=switch.count,
                reason=switch.reason[:wire.MAX_TEXT],
                prefetch_factor=switch.prefetch if switch.prefetch != switch.old_prefetch
                else None))
        record = self._record() if self._record is not None else None
        if record is not None:
            record.switched(new, switch.handed_over or 0, switch.fired_ns or 0)
            loader = self._loader()
            if loader is not None:
                record.refresh_config(loader)
        self._keep_state_in_program_terms(new, switched=True)
        if self._schedule is not None:
            wrapper = self._loop()
            if wrapper is not None:
                self._arm_scheduled(wrapper)

    def switch_dropped(self, switch: Switch, why: str, error: BaseException | None) -> None:
        """Training thread: the switch did not happen; `error`: the new workers could not start
        (that count is never tried again)."""
        with self._lock:
            self._switch = _none
        if error is not None:
            self._revert(switch.count, error)

    def _arm(self, wrapper: Any, count: int, reason: str, at_batch: int | None = None,
             prefetch: int | None = None) -> bool:
        """Ask for a switch of the loop's iterator to `count` workers (with `switch_lock` held
        or on the training thread)."""
        loader = self._loader()
        inner = getattr(wrapper, "_inner", None)
        if loader is None or inner is None or self.worker_init is None:
            return False
        base = getattr(inner, "_base_seed", 0)
        switch = Switch(owner=self, wrapper=wrapper, old=inner, loader=loader, count=count,
                        worker_hook=self.worker_init, base_seed=_next_seed(int(base)),
                        reason=reason, prefetch=prefetch, token=self.epoch_token)
        if not switch.arm(at_batch):
            return False
        self._switch = weakref.ref(switch)
        return True

    def _arm_scheduled(self, wrapper: Any) -> None:
        """The forced schedule (LOADERTOP_AUTOTUNE_SCHEDULE): this epoch's next switch."""
        epoch = self.epoch_token - 1
        done = sum(1 for s in self._switches if s.epoch == epoch)
        due = [(batch, count) for e, batch, count in self._schedule or () if e == epoch][done:]
        if due and self._fixed is None:
            batch, count = due[0]
            with self._lock:
                self._arm(wrapper, count, f"scheduled: {count} workers at batch {batch}",
                          at_batch=batch)

    # -------------------------------------------------------------- publisher thread
    def tick(self, batches_total: int, last_exit_ns: int | None, wait_ns: int = 0,
             interval_ns: int = 0, busy_ns: int = 0) -> None:
        """At each report, after the drain: the loop's batch count and its latest batch's exit
        (both from the drained stamps), and the report interval's loop waits and workers' fetch
        times. Measures the epoch's windows (tuner_windows.py), feeds a long epoch's to the
        strategy, and switches where the strategy moved and the epoch pays for it."""
        if not self.active or self._schedule is not None:
            return
        with self._lock:
            opened, switching, from_ns = self._open, self._switch(), self._switched_ns
            sums = self._epoch_sums
            sums[0] += wait_ns
            sums[1] += interval_ns
            sums[2] += busy_ns
        windows = self._windows
        windows.add_interval(wait_ns, interval_ns, busy_ns)
        if opened is None or last_exit_ns is None:
            windows.forget()
            return
        token, started_ns, count, inner_ref = opened
        if switching is not None:
            windows.last_tick = (batches_total, last_exit_ns)
            return  # no window across a switch
        inner = inner_ref()
        if inner is None:
            return
        window = windows.next((token, count, from_ns or started_ns), batches_total, last_exit_ns,
                              count, bool(from_ns))
        if windows.warmed_up:  # a worker's start (its first batch) is no growth to extrapolate
            self._read_memory(inner)
        if window is None:
            return
        try:
            left, total = len(inner) - int(inner._num_yielded), len(inner)
        except (TypeError, AttributeError, ValueError):
            return
        rate = window.batches / window.seconds
        if self._windows_token != token:
            if total / rate < autotune.LONG_EPOCH_S or self._fixed is not None:
                windows.too_short()  # measured whole at its end
                return
            self._windows_token = token
        pressure = self._memory_pressure()
        prefetch = _prefetch_of(inner)
        with self._lock:
            target = self.tuner.observe(autotune.Epoch(
                num_workers=count, samples=window.batches * self._batch_size,
                seconds=window.seconds, batches=window.batches, memory_pressure=pressure,
                window=True, prefetch_factor=prefetch, starved=window.starved))
            target_prefetch, reason = self.tuner.prefetch_factor, self.tuner.reason
            now_rate = self._rate(count)
            then_rate = self._rate(target) if target != count else None
        if target == count and target_prefetch in (None, prefetch):
            return
        if pressure is None and not autotune.worth_switching(
                now_rate or rate * self._batch_size, then_rate, left / rate, self._cost()):
            return  # the next epoch boundary applies it
        if not self.switch_lock.acquire(blocking=False):
            return  # an iter() of the loader is under way
        try:
            with self._lock:
                wrapper = self._loop()
                if self._open is not None and self._open[0] == token and self._switch() is None \
                        and wrapper is not None and getattr(wrapper, "_lt_token", None) == token \
                        and self._arm(wrapper, target, reason, prefetch=target_prefetch):
                    windows.armed_at = windows.last_tick
        finally:
            self.switch_lock.release()

    def _rate(self, count: int) -> float | None:
        setting = self.tuner.tried.get(count)
        return setting.rate if setting is not None and setting.measured() else None

    def _cost(self) -> float:
        warm_up = (self._warm_up_ms() or 0.0) / 1000 if self._warm_up_ms is not None else 0.0
        return self._windows.cost(warm_up)

    def _read_memory(self, inner: Any) -> None:
        """While exploring upward: the workers' memory, and from it the most the strategy may
        try (tuner_memory.py)."""
        if self.tuner.state != autotune.EXPLORING:
            return
        pids = [pid for _, pid, _ in torch_internals.worker_pids(inner) if pid]
        if not self._memory.read(pids):
            return
        try:  # the rest of the epoch (tuner_memory.py bounds it)
            horizon = (len(inner) - int(inner._num_yielded)) * (self._rate_per_batch() or 0.0)
        except (TypeError, AttributeError, ValueError):
            horizon = 0.0
        cap, why = self._memory.cap(horizon)
        with self._lock:
            self.tuner.set_memory_cap(cap, why)

    def _rate_per_batch(self) -> float | None:
        """Seconds per batch at the current count, as measured."""
        rate = self._rate(self.tuner.num_workers)
        return self._batch_size / rate if rate else None

    # -------------------------------------------------------------- StatefulDataLoader
    def _keep_state_in_program_terms(self, inner: Any, switched: bool = False) -> None:
        """torchdata's iterator of a count other than the program's: its `state_dict()` is
        given in the program's count (probe/stateful_state.py), so it loads into the program
        as written."""
        if not self._stateful or not hasattr(inner, "_snapshot"):
            return
        if switched is False and getattr(inner, "_num_workers", None) == \
                self.tuner.program_num_workers:
            return  # the program's own iterator: its state_dict is the program's
        from loadertop.probe.stateful_state import InProgramTerms

        InProgramTerms.install(inner, self.tuner.program_num_workers, self._epoch_base_seed)

    # -------------------------------------------------------------- publisher thread, exit
    def report(self) -> wire.AutotuneReport | None:
        if not self.active:
            return None
        with self._lock:
            t = self.tuner
            best = t.pick()
            best_rate = t.pick_rate()
            tried = tuple(wire.AutotuneSetting(
                num_workers=s.num_workers, samples_per_s=s.rate, noise=s.noise, epochs=s.epochs,
                note=s.note, windows=s.windows)
                for s in sorted(t.tried.values(), key=lambda s: s.num_workers))
            return wire.AutotuneReport(
                state=t.state, num_workers=t.num_workers, program_num_workers=t.program_num_workers,
                epoch=t.epochs, best_num_workers=best.num_workers if best else None,
                best_samples_per_s=best_rate, tried=tried, reason=t.reason,
                switches=tuple(self._with_gain(s) for s in self._switches),
                switch_count=self.switch_count,
                fixed=self._fixed[:256] if self._fixed is not None else None,
                prefetch_factor=t.prefetch_factor,
                program_prefetch_factor=t.program_prefetch_factor)

    def _with_gain(self, switch: wire.AutotuneSwitch) -> wire.AutotuneSwitch:
        """A switch with its gain, once both counts (or a prefetch_factor's doubling) are
        measured."""
        if switch.gain is not None:
            return switch
        if switch.prefetch_factor is not None and switch.from_workers == switch.to_workers:
            gain = self.tuner.prefetch_gains.get(switch.prefetch_factor)
            return self._replace(switch, gain) if gain is not None else switch
        before, after = (self.tuner.tried.get(n) for n in (switch.from_workers, switch.to_workers))
        if before is None or after is None or not before.rate or after.rate is None or \
                not (after.measured() or after.can_tell()):
            return switch
        return self._replace(switch, after.rate / before.rate - 1)

    def _replace(self, switch: wire.AutotuneSwitch, gain: float) -> wire.AutotuneSwitch:
        gained = msgspec.structs.replace(switch, gain=gain)
        self._switches = deque((gained if s is switch else s for s in self._switches),
                               maxlen=SWITCH_LOG)
        return gained

    def closing_line(self) -> str | None:
        if not self.active:
            return None
        self._close_open(_clock_ns())
        with self._lock:
            t = self.tuner
            pick = t.pick()
            switched = (f", {self.switch_count} switches inside epochs"
                        if self.switch_count else "")
            if pick is None or pick.rate is None:
                return (f"loadertop: autotune of {self.name!r}: not enough epochs to judge "
                        f"(stayed at {t.program_num_workers} workers{switched})")
            gain = t.gain()
            gained = (f", {gain:+.0%} over the program's {t.program_num_workers}"
                      if gain is not None else "")
            where = "settled on" if t.state == autotune.SETTLED else "best so far:"
            keep = f"num_workers={pick.num_workers}"
            if t.prefetch_factor != t.program_prefetch_factor:
                keep += f", prefetch_factor={t.prefetch_factor}"
            return (f"loadertop: autotune of {self.name!r}: {where} {keep}"
                    f" ({t.pick_rate() or pick.rate:.0f} samples/s{gained}) after {t.epochs} "
                    f"epochs{switched}; to keep it, set {keep}")


def _none() -> None:
    return None


def _prefetch_of(inner: Any) -> int | None:
    """The prefetch_factor torch's iterator was made with (None: not one with workers)."""
    value = getattr(inner, "_prefetch_factor", None)
    return value if isinstance(value, int) else None


def _starved(wait_ns: int, wall_ns: int, busy_ns: int, count: int) -> bool:
    """The loop waited while the workers idled (loadertop/autotune.py, STARVED_WAIT)."""
    return (wall_ns > 0 and count > 0 and wait_ns >= autotune.STARVED_WAIT * wall_ns
            and busy_ns <= autotune.STARVED_BUSY * wall_ns * count)


def _weak(obj: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _next_seed(seed: int) -> int:
    """A base seed for new workers, from the old ones' (never drawn from a program's generator)."""
    return (seed * 6364136223846793005 + 1442695040888963407) % (1 << 63)


def _set_num_workers(loader: Any, count: int, prefetch: int | None = None) -> int | None:
    """Set the count (and prefetch_factor) the next iterator starts. With persistent workers,
    shut the kept iterator's down and drop it, and return a seed for its replacement's workers
    (see `_seed_source`)."""
    seed = None
    if prefetch is not None:
        loader.prefetch_factor = prefetch  # DataLoader.__setattr__ allows it (torch 2.13)
    if getattr(loader, "persistent_workers", False):
        old = getattr(loader, "_iterator", None)
        if old is not None:
            # torch 2.13 would reset these workers for the new epoch; the new count needs new ones
            shutdown = getattr(old, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            loader._iterator = None
            seed = _next_seed(int(getattr(old, "_base_seed", 0)))
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


def _is_stateful(loader: Any) -> bool:
    """torchdata's StatefulDataLoader (or a loader like it): its `state_dict()` names its count."""
    return hasattr(loader, "snapshot_every_n_steps") and callable(getattr(loader, "state_dict", None))


def _why_not_tuned(loader: Any) -> str | None:
    """Why a loader cannot be tuned at all (None: it can): torchdata's StatefulDataLoader
    resumes a state_dict only with the count it was taken at, and where the workers' state is
    more than the sampler's position (an IterableDataset's shards, a dataset's own state_dict)
    no state_dict can be told in another count (probe/stateful_state.py)."""
    if not _is_stateful(loader):
        return None
    dataset = getattr(loader, "dataset", None)
    if _is_iterable(loader):
        return ("a StatefulDataLoader of an IterableDataset: its state_dict holds each worker's "
                "shard position, which no other count can resume")
    if callable(getattr(dataset, "state_dict", None)) and \
            callable(getattr(dataset, "load_state_dict", None)):
        return ("a StatefulDataLoader whose dataset has a state_dict of its own per worker, "
                "which no other count can resume")
    return None


def _resumed_count(loader: Any) -> int | None:
    """The count of the state_dict a StatefulDataLoader is about to resume (torchdata 0.11
    asserts it equals num_workers), None when it resumes none."""
    state = getattr(loader, "next_iter_state", None)
    if not isinstance(state, dict):
        return None
    try:
        count = state["_snapshot"]["_main_snapshot"]["_num_workers"]
    except (KeyError, TypeError):
        return None
    return count if isinstance(count, int) and count > 0 else None


def _killed_worker(inner: Any) -> str | None:
    for worker in list(getattr(inner, "_workers", None) or ()):
        code = getattr(worker, "exitcode", None)
        if code is not None and code < 0 and -code == 9:
            return f"a worker was killed (pid {getattr(worker, 'pid', '?')})"
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
