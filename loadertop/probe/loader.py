"""`instrument(loader)`: a transparent DataLoader wrapper whose iterator times every `next()`.

The hot path (the iterator's next()) is two clock reads and two stamps stored, in C where
`_hotpath` is built (into the record's StampRing, raw; `_PyStamper` appending to a deque
otherwise); everything else happens on the publisher thread.
Batches, order and exceptions are the wrapped iterator's own: we never touch the batch, and an
exception is re-raised as is.
"""

from __future__ import annotations

import threading
import time
import types

from loadertop import environment
from loadertop.probe import rng, torch_internals
from loadertop.probe.publisher import get_publisher, warn_once
from loadertop.probe.record import LOOP_CPU_SAMPLE_NS, LoaderRecord
from loadertop.probe.worker import WorkerHook

_hotpath: types.ModuleType | None
try:  # the C hot path: built by setup.py on Linux; optional, so an install without a compiler
    from loadertop.probe import _hotpath  # works, on the pure-Python one
except ImportError:  # pragma: no cover - CI fails where it is missing (test_hotpath)
    _hotpath = None

_clock = time.perf_counter_ns
_thread_cpu = time.thread_time_ns

# Set while we call the loader's own __iter__, so `loadertop run`'s class-level patch of
# DataLoader.__iter__ can tell an already-instrumented loader and not time it twice.
_inside = threading.local()


class _PyStamper:
    """The hot path in pure Python, where the C one (`_hotpath.Stamper`) is not built. Per batch:
    two clock reads and two appends to the record's stamps (a bounded deque where the C module is
    not built: stamp_drain.new_events) — `t0` when the loop enters next(), `-t1` when it leaves with a
    batch, `0` when it leaves by an exception (StopIteration included). The publisher thread
    pairs them; a trailing `t0` without its exit means the loop is blocked in next() right now,
    and since when. Signed stamps keep the pairing unambiguous even when the bounded store
    overflows and drops single entries. With `sampling`, a batch entered at or after
    `next_sample` goes to the subclass's `_sampled_next(t0)` instead."""

    __slots__ = ("_next", "_append", "_on_error", "next_sample")

    def __init__(self, next, append, on_error, sampling: bool = False) -> None:
        self._next = next
        self._append = append
        self._on_error = on_error
        self.next_sample = 0 if sampling else _NEVER

    def __iter__(self):
        return self

    def __next__(self):
        append = self._append
        t0 = _clock()
        append(t0)
        if t0 >= self.next_sample:
            return self._sampled_next(t0)
        try:
            batch = self._next()
        except BaseException as exc:
            append(0)
            if not isinstance(exc, StopIteration):  # not per batch: once, as the loop ends
                self._on_error(exc)
            raise  # the same exception object, StopIteration included
        append(-_clock())
        return batch

    def _sampled_next(self, t0: int):  # pragma: no cover - only sampling subclasses sample
        raise NotImplementedError


_NEVER = 1 << 62  # a next_sample no perf_counter_ns reaches (~146 years)


def _iterator_classes(stamper: type) -> tuple[type, type]:
    """The iterators `instrumented_iter` returns, on the given hot path (C or pure Python): the
    multi-worker one and the num_workers=0 one. Both exist side by side so that tests and the
    benchmark compare the two in one process."""

    class _InstrumentedIterator(stamper):
        """The loop's iterator: the wrapped one's batches, order and exceptions, each next()
        stamped (the hot path is the base class's)."""

        __slots__ = ("_inner", "_rec")
        SAMPLING = False

        def __init__(self, inner, record: LoaderRecord) -> None:
            self._inner = inner
            self._rec = record
            super().__init__(_unmeasured_next(inner), record.events.append, record.note_error,
                             self.SAMPLING)

        def __len__(self):
            return len(self._inner)

        def __getattr__(self, name):
            return getattr(self._inner, name)

    class _SingleProcessIterator(_InstrumentedIterator):
        """num_workers=0: the loop itself fetches, so at most once per LOOP_CPU_SAMPLE_NS one batch
        is measured in detail — its fetch CPU time (a thread CPU-clock read is a syscall: too dear
        for every batch) and its stages: for that one batch `_StageProbe` stands in for the iterator's
        fetcher. Every other batch takes the plain hot path."""

        __slots__ = ()
        SAMPLING = True

        def _sampled_next(self, t0: int):
            inner = self._inner
            fetcher = getattr(inner, "_dataset_fetcher", None)
            probe = _StageProbe(fetcher) if hasattr(fetcher, "collate_fn") else None
            if probe is not None:
                inner._dataset_fetcher = probe
            c0 = _thread_cpu()
            try:
                batch = self._next()
            except BaseException as exc:
                self._append(0)
                if not isinstance(exc, StopIteration):
                    self._rec.note_error(exc)
                raise
            finally:
                if probe is not None:
                    inner._dataset_fetcher = fetcher
            c1 = _thread_cpu()
            t1 = _clock()
            self._append(-t1)
            fetch = collate = produced = None
            if probe is not None and probe.fetch_end:
                collate = probe.collate_ns
                fetch = probe.fetch_end - probe.fetch_start - collate
                produced = probe.fetch_end - t0
            self._rec.loop_samples.append((t1 - t0, c1 - c0, fetch, collate, produced))
            # A slot of the hot path's class (`stamper`), a base mypy cannot see through.
            self.next_sample = t1 + LOOP_CPU_SAMPLE_NS  # type: ignore[misc]
            return batch

    return _InstrumentedIterator, _SingleProcessIterator


PY_ITERATORS = _iterator_classes(_PyStamper)
C_ITERATORS = _iterator_classes(_hotpath.Stamper) if _hotpath is not None else None
# The C hot path where it is built (setup.py: Linux), else the pure-Python one.
HOT_PATH = "c" if C_ITERATORS is not None else "python"
_InstrumentedIterator, _SingleProcessIterator = C_ITERATORS or PY_ITERATORS


def _unmeasured_next(inner):
    """`inner.__next__`, minus `loadertop attach`'s class-level timing of torch's iterators
    (probe/attach.py) when it is installed: this wrapper measures, once."""
    bound = inner.__next__
    original = getattr(bound, "_loadertop_original", None)
    return types.MethodType(original, inner) if original is not None else bound


class _StageProbe:
    """Stands in for a single-process iterator's fetcher for one batch, timing it stage by stage.

    torch 2.13 `_SingleProcessDataLoaderIter._next_data` calls `self._dataset_fetcher.fetch(index)`,
    and the fetcher's `fetch` calls `self.collate_fn(data)`. For the sampled batch the iterator's
    `_dataset_fetcher` is this probe, and the fetcher's `collate_fn` is `collate` here; both are
    put back right after. Only the values of attributes those objects already have are replaced:
    adding a `fetch` attribute to the fetcher instead (this probe's first form) left the fetcher's
    attribute dict changed after it was popped again, and every later batch of that iterator
    paid for it (CPython 3.11: docs/performance.md). The fetcher's
    own `fetch` and the user's `collate_fn` each run once; results and exceptions pass through.
    """

    __slots__ = ("fetcher", "collate_fn", "fetch_start", "fetch_end", "collate_ns")

    def __init__(self, fetcher) -> None:
        self.fetcher = fetcher
        self.collate_fn = fetcher.collate_fn
        self.fetch_start = self.fetch_end = self.collate_ns = 0

    def fetch(self, possibly_batched_index):
        fetcher = self.fetcher
        fetcher.collate_fn = self.collate
        self.fetch_start = _clock()
        try:
            data = fetcher.fetch(possibly_batched_index)
        finally:
            fetcher.collate_fn = self.collate_fn
        self.fetch_end = _clock()
        return data

    def collate(self, data):
        k0 = _clock()
        batch = self.collate_fn(data)
        self.collate_ns = _clock() - k0
        return batch

    def __getattr__(self, name):
        # anything else torch (or a subclass of its iterator) reads of the fetcher meanwhile
        return getattr(self.fetcher, name)


def instrumented_iter(loader, record: LoaderRecord, endpoint: str | None, original_iter=iter,
                      iterators: tuple[type, type] | None = None):
    """Create the loader's iterator with our worker hook chained, and wrap it.

    `original_iter(loader)` creates the iterator: `iter` here, the unpatched `DataLoader.__iter__`
    under `loadertop run` (so a subclass's own `__iter__` body is not run a second time).

    `worker_init_fn` is read by torch when the iterator is created, so we set it just for that
    call and restore it at once: the user's loader object is left as it was, and frameworks that
    set their own worker_init_fn before iterating (Lightning's worker seeding) still run theirs.

    `iterators`: (multi-worker, num_workers=0) classes of `_iterator_classes`; by default those of
    HOT_PATH (tests and the benchmark pass PY_ITERATORS to run the pure-Python one).
    """
    multi, single = iterators or (_InstrumentedIterator, _SingleProcessIterator)
    tuner = record.autotune if record.autotune is not None and record.autotune.active else None
    if tuner is not None:  # `run --autotune`: the epoch boundary, where the count may change
        # No switch inside an epoch is armed while the epoch's iterator is made (its
        # `_sampler_iter` is set there): see LoaderTuner.switch_lock.
        with tuner.switch_lock:
            tuner.begin(loader)
            tuner.worker_init = lambda view: _worker_hook(view, record, endpoint, fresh=True)
            inner, started = _make_inner(loader, record, endpoint,
                                         lambda lo: tuner.create(lo, original_iter))
            record.refresh_config(loader)  # a count that could not start was reverted in create()
            record.attach(inner, started)
            tuner.started(loader, inner, started)
            return _tuned_class(multi)(inner, record, tuner)
    inner, started = _make_inner(loader, record, endpoint, original_iter)
    record.attach(inner, started)
    return (single if not (getattr(loader, "num_workers", 0) or 0) else multi)(inner, record)


def _make_inner(loader, record: LoaderRecord, endpoint: str | None, create) -> tuple:
    """(torch's iterator, made by `create(loader)` with our worker hook chained, and when its
    making began: torch starts the workers inside it)."""
    record.refresh_config(loader)  # before torch forks the workers: see LoaderRecord.attach
    num_workers = getattr(loader, "num_workers", 0) or 0
    hooked = num_workers > 0 and hasattr(loader, "worker_init_fn")
    if hooked:
        original = loader.worker_init_fn
        loader.worker_init_fn = _worker_hook(loader, record, endpoint)
    started = _clock()  # the epoch's start: torch starts the workers inside this call
    _inside.active = True
    try:
        inner = create(loader)
    finally:
        _inside.active = False
        if hooked:
            loader.worker_init_fn = original
    return inner, started


def _worker_hook(loader, record: LoaderRecord, endpoint: str | None, fresh: bool = False):
    """The worker_init_fn the loader's workers start with: ours, chained in front of the
    loader's own. `fresh`: workers started inside an epoch (probe/worker_switch.py)."""
    original = loader.worker_init_fn
    return WorkerHook(original, record.source, endpoint, record.stack_dir,
                      _generators_for_fork(loader, original, fresh) if endpoint else None)


_TUNED: dict[type, type] = {}


def _tuned_class(multi: type) -> type:
    """The multi-worker iterator of `run --autotune`: the same per-batch path (inherited), and
    when its last reference goes (the loop ended or broke) it tells the tuner the epoch's end and
    torch's batch count. Inside an epoch the tuner may replace the torch iterator it wraps
    (probe/worker_switch.py): `_lt_follow` gives the per-batch path another callable, on the
    training thread. Used only with autotune on: without it the iterator is `multi` itself."""
    cls = _TUNED.get(multi)
    if cls is None:
        stamper = multi.__mro__[1]  # the hot path's class (C or pure Python)

        class _TunedIterator(multi):
            __slots__ = ("_lt_tuner", "_lt_token", "__weakref__")

            def __init__(self, inner, record: LoaderRecord, tuner) -> None:
                super().__init__(inner, record)
                self._lt_tuner = tuner
                self._lt_token = tuner.epoch_token
                tuner.loop_iterator(self)

            def _lt_follow(self, next_callable) -> None:
                """From the next batch on, the per-batch path calls `next_callable` (the hot
                path's own __init__ sets it: the C one keeps it in a read-only slot)."""
                rec = self._rec
                stamper.__init__(self, next_callable, rec.events.append,  # type: ignore[misc]
                                 rec.note_error, False)

            @staticmethod
            def _lt_unmeasured(inner):
                return _unmeasured_next(inner)

            def __del__(self) -> None:
                try:
                    self._lt_tuner.ended(self._lt_token,
                                         getattr(self._inner, "_num_yielded", None))
                except Exception:  # never from a finalizer into the program
                    pass

        cls = _TUNED[multi] = _TunedIterator
    return cls


def _generators_for_fork(loader, user_init_fn, fresh: bool = False) -> list | None:
    """The random generators reachable from the dataset, found here, before torch forks the
    workers, so that a forked worker reads their states without walking the dataset itself (a
    first touch there of everything the walk reads, on the way to its first batch). Here it
    costs about what one worker saves (each fork leaves the parent's pages to be copied at their
    next write; docs/performance.md: the walk in each), paid once, not in each.
    Only where that holds (rng.capture's `untouched`): workers forked, and no worker_init_fn of
    the program, which could make generators of its own; and only when this iter() starts
    workers (torch 2.13 resets a persistent iterator's workers: they ran their hook when they
    started; `fresh`: workers started inside an epoch, whatever the loader keeps)."""
    if user_init_fn is not None or torch_internals.worker_context(loader) != "fork":
        return None
    if not fresh and getattr(loader, "persistent_workers", False) and \
            getattr(loader, "_iterator", None) is not None:
        return None
    try:
        return rng.find_generators(getattr(loader, "dataset", None))
    except Exception:
        return None


class InstrumentedDataLoader:
    """Behaves like the wrapped loader: iteration, len(), attribute access, isinstance()."""

    def __init__(self, loader, record: LoaderRecord, worker_endpoint: str | None) -> None:
        object.__setattr__(self, "_lt_loader", loader)
        object.__setattr__(self, "_lt_record", record)
        object.__setattr__(self, "_lt_worker_endpoint", worker_endpoint)

    def __iter__(self):
        return instrumented_iter(self._lt_loader, self._lt_record, self._lt_worker_endpoint)

    def __len__(self):
        return len(self._lt_loader)

    def __getattr__(self, name):
        return getattr(self._lt_loader, name)

    def __setattr__(self, name, value):
        setattr(self._lt_loader, name, value)

    def __delattr__(self, name):
        delattr(self._lt_loader, name)

    # `isinstance(wrapped, DataLoader)` stays true, as frameworks check it (wrapt does the same).
    @property  # type: ignore[misc]  # read-only here: assigning a wrapper's class is not meant
    def __class__(self):
        return type(self._lt_loader)

    def __repr__(self) -> str:
        return f"<loadertop {self._lt_record.name!r} {self._lt_loader!r}>"

    @property
    def loadertop_source(self) -> str:
        """The source id viewers show for this loader (host:pid:name)."""
        return self._lt_record.source


def instrument(loader, *, name: str | None = None, endpoint: str | None = None,
               autotune: bool = False):
    """Wrap `loader` so every batch's wait is measured and published; see docs/contract.md §1.

    `endpoint` overrides LOADERTOP_ENDPOINT for this process's publisher (the first call that
    starts the publisher decides). With LOADERTOP_DISABLE=1 the loader is returned untouched.
    `autotune`: tune its num_workers between epochs and inside long ones, as `run --autotune`
    does (§10).
    """
    if environment.disabled():
        return loader
    if isinstance(loader, InstrumentedDataLoader):
        return loader  # already instrumented: never measure twice
    try:
        publisher = get_publisher(endpoint)
        record = publisher.reuse_named(loader, name) if name is not None else None
        if record is None:
            record = publisher.register(loader, publisher.unique_name(name))
    except Exception as exc:  # never let observing break training
        warn_once(f"instrumentation disabled: {exc!r}")
        return loader
    if autotune and record.autotune is None:
        record.start_autotune(loader)
    return InstrumentedDataLoader(loader, record, publisher.worker_endpoint)
