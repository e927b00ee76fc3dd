"""`run --autotune`'s switch of `num_workers` inside an epoch (docs/autotune.md, "Inside an
epoch"; docs/contract.md §10): the loop's iterator goes on from torch's iterator with the old
count to one with the new count, and the loop receives exactly the batches, in the order and with
the content, it would have received without the switch.

How, on torch 2.13's `_MultiProcessingDataLoaderIter` (torchdata 0.11's
`_StatefulMultiProcessingDataLoaderIter` is a fork of it and works the same way here):

- An iterator pulls the epoch's indices from `_sampler_iter` (one iterator over the loader's
  sampler or batch sampler, made at `iter()`), one per task, in `_try_put_index`: `prefetch_factor
  × num_workers` of them when it starts, then one per batch it yields (`_process_data`). The tasks
  sent and not yet yielded are the keys of `_task_info`.
- A switch is asked for by putting a `Trigger` in place of the old iterator's `_sampler_iter` (one
  attribute assignment, from the publisher thread). Its `__next__` runs on the training thread, in
  the old iterator's next `_try_put_index`; from then on the old iterator pulls no index: its
  `_try_put_index` meets StopIteration and returns, as near the end of an epoch.
- Until the old iterator's tasks are all yielded, the loop iterator's per-batch callable is the
  `Switch`. Its first call makes the new iterator, whose workers start while the old ones finish
  their tasks; its `_sampler_iter` is the same sampler iterator, so its tasks are the indices right
  after the old iterator's last. It yields the old iterator's tasks (their workers have them), in
  their order, and then the new iterator's.
- Then the old workers are shut down the way torch shuts them down at an epoch's end
  (`_shutdown_workers`, also what its `__del__` calls), the new iterator takes the old one's place
  (`loader._iterator`, where the loader keeps one: persistent workers, torchdata), and the loop
  iterator calls the new iterator's `__next__` directly again: nothing is added per batch.

The new iterator is made from a view of the loader (`LoaderView`) with the new count, an empty
index sampler and a generator of its own: making it then pulls no index (and does not call the
loader's sampler's `iter()`, which for torchdata's RandomSampler draws a permutation from the
sampler's generator) and does not draw its workers' base seed from `loader.generator` or the global
generator (`_BaseDataLoaderIter.__init__`), so neither the shuffle of later epochs nor the
program's random stream moves. It is then given the loader's index sampler and the epoch's sampler
iterator, and primed as torch primes one.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any, Protocol

# The iterator classes whose switch is known exact (module, class name): torch 2.13's own, and
# torchdata 0.11's fork of it. A loader whose `_get_iterator` makes another class (a subclass that
# may keep state of its own) stays at epoch boundaries.
SWITCHABLE = (("torch.utils.data.dataloader", "_MultiProcessingDataLoaderIter"),
              ("torchdata.stateful_dataloader.stateful_dataloader",
               "_StatefulMultiProcessingDataLoaderIter"))


class SwitchOwner(Protocol):
    """What a Switch tells the loader's tuner (probe/autotune.py), on the training thread."""

    def switch_started(self, switch: Switch) -> None: ...

    def switch_done(self, switch: Switch) -> None: ...

    def switch_dropped(self, switch: Switch, why: str, error: BaseException | None) -> None: ...


def why_not_switchable(loader: Any, iterator: Any) -> str | None:
    """Why this loader's count cannot change inside an epoch (None: it can)."""
    kind = type(iterator)
    if (kind.__module__, kind.__qualname__) not in SWITCHABLE:  # torch is imported if it is
        return f"its iterator is a {kind.__qualname__}, not torch's own"
    try:
        from torch.utils.data import IterableDataset
        from torch.utils.data.datapipes.datapipe import MapDataPipe

        if isinstance(getattr(loader, "dataset", None), IterableDataset):
            return "its dataset is an IterableDataset (sharded by worker id)"
        if isinstance(loader.dataset, MapDataPipe):
            return "its dataset is a MapDataPipe (sharded by worker id)"
        if getattr(iterator, "_shared_seed", None) is not None:
            return "its dataset shares a seed across workers"
        len(iterator)  # the epoch's length: how much of it a switch would still serve
    except TypeError:
        return "its sampler has no length"
    except Exception as exc:  # a torch without these names: stay at epoch boundaries
        return f"its iterator cannot be read ({exc!r})"
    return None


class LoaderView:
    """What torch's iterator reads of its loader while it is made (torch 2.13
    `_BaseDataLoaderIter.__init__`, `_MultiProcessingDataLoaderIter.__init__`; torchdata 0.11 reads
    `snapshot_every_n_steps` too): the loader's own attributes, but for the few given here. The
    iterator keeps no reference to it."""

    def __init__(self, loader: Any, **overrides: Any) -> None:
        self.__dict__.update(overrides)
        self.__dict__["_lt_loader"] = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_lt_loader"], name)


class Trigger:
    """Stands in for the old iterator's `_sampler_iter` (see the module's docstring). Once (its
    first `__next__` on the training thread) it hands the switch over; with `at_batch`, only once
    the loop has had that many batches of the epoch, passing the indices through until then (the
    forced schedule of tests: LOADERTOP_AUTOTUNE_SCHEDULE). Anything else read of it is the
    sampler iterator's own: torchdata 0.11 serializes `_sampler_iter` into its snapshots
    (`state_dict()`, where it has one) at every index it pulls."""

    __slots__ = ("_switch", "_real", "_at_batch")

    def __init__(self, switch: Switch, real: Any, at_batch: int | None = None) -> None:
        self._switch: Switch | None = switch
        self._real = real
        self._at_batch = at_batch

    def __iter__(self) -> Trigger:
        return self

    def __getattr__(self, name: str) -> Any:
        # object.__getattribute__: an instance made without __init__ (a copy) raises, never loops
        return getattr(object.__getattribute__(self, "_real"), name)

    def __next__(self) -> Any:
        switch = self._switch
        if switch is None:
            raise StopIteration
        # torch 2.13 counts the batch being yielded after `_process_data`, which calls this
        if self._at_batch is not None and switch.yielded() + 1 < self._at_batch:
            return next(self._real)  # StopIteration at the epoch's end: no switch then
        self._switch = None
        if switch.fire():
            raise StopIteration  # the old iterator pulls no more indices
        return next(self._real)


class Switch:
    """One switch of the loop iterator `wrapper` (loader.py's tuned iterator: `_inner`, the torch
    iterator it wraps; `_lt_follow(fn)`, its per-batch callable becomes fn; `_lt_unmeasured(it)`,
    the callable for a torch iterator) from torch's iterator `old` to a new one with `count`
    workers (and `prefetch` tasks per worker: by default the old iterator's). Made by the tuner,
    which puts a Trigger in `old._sampler_iter`; from the trigger's `fire` to the old iterator's
    last task it is the wrapper's per-batch callable. Holds the wrapper, the loader and the tuner
    weakly: nothing is kept alive by a switch that the loop dropped."""

    def __init__(self, *, owner: SwitchOwner, wrapper: Any, old: Any, loader: Any, count: int,
                 worker_hook: Callable[[Any], Any], base_seed: int, reason: str,
                 prefetch: int | None = None, token: int = 0) -> None:
        self._owner = weakref.ref(owner)
        self._wrapper = weakref.ref(wrapper)
        self._loader = weakref.ref(loader)
        # Until the Trigger fires, `old` (whose `_sampler_iter` is the Trigger, which holds this
        # switch) is held weakly: a loop that drops it then leaves no cycle keeping it alive.
        self._old = weakref.ref(old)
        self.old: Any = None
        self.new: Any = None
        self.count = count
        self.old_count = int(old._num_workers)
        self.old_prefetch = int(old._prefetch_factor)
        self.prefetch = prefetch if prefetch is not None else self.old_prefetch
        self.reason = reason
        self.token = token  # the owner's name for the epoch it was asked in
        self._worker_hook = worker_hook  # worker_hook(view): the new workers' worker_init_fn
        self._base_seed = base_seed
        self._real: Any = None  # the epoch's sampler iterator
        self._old_next: Callable[[], Any] | None = None
        self._new_next: Callable[[], Any] | None = None
        self.fired_ns: int | None = None
        self.done_ns: int | None = None
        self.at_batch: int | None = None  # the batches of the epoch the loop had at the fire
        self.handed_over: int | None = None  # ... when the new iterator yields its first

    # ------------------------------------------------------------------ asking
    def arm(self, at_batch: int | None = None) -> bool:
        """Put the Trigger in place of the old iterator's sampler iterator (called with the
        tuner's switch lock held: no `iter()` of the loader runs meanwhile). False if the old
        iterator has none to replace (shut down, or not torch's)."""
        old = self._old()
        real = getattr(old, "_sampler_iter", None)
        if old is None or real is None or getattr(old, "_shutdown", True) \
                or isinstance(real, Trigger):
            return False
        self._real = real
        old._sampler_iter = Trigger(self, real, at_batch)
        return True

    def yielded(self) -> int:
        """The old iterator's batches of the epoch (torch's `_num_yielded`)."""
        old = self._old()
        return int(old._num_yielded) if old is not None else 0

    # ------------------------------------------------------------------ training thread
    def fire(self) -> bool:
        """In the old iterator's `_try_put_index`: take over the wrapper's per-batch callable.
        False (nothing changes) if the loop iterator moved on from `old` or is gone, or if the
        epoch's indices are all sent already. Never raises into torch's iterator."""
        old = self._old()
        if old is None:  # cannot be: the old iterator is calling
            return False
        try:
            return self._fire(old)
        except Exception as exc:
            old._sampler_iter = self._real
            self._drop("the switch could not begin", exc)
            return False

    def _fire(self, old: Any) -> bool:
        import time

        wrapper = self._wrapper()
        if wrapper is None or wrapper._inner is not old or self._loader() is None:
            old._sampler_iter = self._real
            self._drop("the loop's iterator moved on", None)
            return False
        try:  # indices pulled: the batches yielded, the one being yielded, the tasks outstanding
            left = len(old) - (old._num_yielded + 1) - len(old._task_info)
        except TypeError:
            left = 1
        if left <= 0:
            old._sampler_iter = self._real
            self._drop("the epoch's indices were all sent", None)
            return False
        old._sampler_iter = iter(())  # from here the old iterator pulls nothing
        self.old = old
        self.fired_ns = time.perf_counter_ns()
        self.at_batch = int(old._num_yielded) + 1  # the batch being yielded now counts
        self._old_next = wrapper._next
        wrapper._lt_follow(self)
        return True

    def __call__(self) -> Any:
        """The loop iterator's per-batch callable during the switch."""
        if self.new is None and not self._start():
            return self._old_next()  # type: ignore[misc]  # set by fire()
        old = self.old
        if old._task_info:  # tasks the old workers have and the loop has not had
            return self._old_next()  # type: ignore[misc]
        self._finish()
        return self._new_next()  # type: ignore[misc]  # set by _start()

    def _start(self) -> bool:
        """Make the new iterator (its workers start now) and prime it; False when it could not
        be made: the old iterator goes on as before, with the count it has."""
        import torch

        old = self.old
        loader = self._loader()
        if loader is None:
            self._cancel("the loader is gone", None)
            return False
        view = LoaderView(loader, num_workers=self.count, prefetch_factor=self.prefetch,
                          _index_sampler=(),
                          generator=torch.Generator().manual_seed(self._base_seed))
        view.__dict__["worker_init_fn"] = self._worker_hook(view)  # chained to the loader's own
        owner = self._owner()
        if owner is not None:
            owner.switch_started(self)
        try:
            if hasattr(old, "_snapshot"):  # torchdata's: (loader, next_iter_state)
                new = type(old)(view, None)
            else:
                new = type(old)(view)
        except Exception as exc:  # the count's workers cannot start: the old ones go on
            self._cancel(f"{self.count} workers could not start", exc)
            return False
        # The loader's own index sampler: len() of the iterator, and the sampler iterator
        # `_reset` makes at a persistent iterator's next epoch.
        new._index_sampler = old._index_sampler
        new._sampler_iter = self._real
        if hasattr(old, "_sampler_iter_yielded"):
            # torchdata counts the indices pulled in the epoch: its snapshots (every
            # `snapshot_every_n_steps`) are taken where that count and the batches yielded meet
            new._sampler_iter_yielded = old._sampler_iter_yielded
        for _ in range(new._prefetch_factor * new._num_workers):
            new._try_put_index()
        self.new = new
        wrapper = self._wrapper()
        self._new_next = type(wrapper)._lt_unmeasured(new) if wrapper is not None else new.__next__
        return True

    def _finish(self) -> None:
        """Every task of the old iterator was yielded: the new one takes its place."""
        import time

        old, new = self.old, self.new
        self.old = None
        new._num_yielded = old._num_yielded  # torch's count of the epoch's batches goes on
        if hasattr(old, "_snapshot"):
            # torchdata: the latest snapshot of the epoch is the old iterator's until the new one
            # takes its own (a state_dict meanwhile: the batches since counted from it)
            new._snapshot = old._snapshot
        loader = self._loader()
        if loader is not None:
            if getattr(loader, "_iterator", None) is old:
                loader._iterator = new
            loader.num_workers = self.count
            loader.prefetch_factor = self.prefetch
        self.handed_over = int(old._num_yielded)
        wrapper = self._wrapper()
        if wrapper is not None:
            wrapper._inner = new
            wrapper._lt_follow(self._new_next)
        self.done_ns = time.perf_counter_ns()
        try:
            # As torch ends an iterator's workers at its epoch's end (StopIteration) or in
            # __del__; the batches go on from the new iterator whatever happens here.
            old._shutdown_workers()
            owner = self._owner()
            if owner is not None:
                owner.switch_done(self)
        except Exception as exc:
            print(f"loadertop: autotune: after a switch ({exc!r})", file=sys.stderr, flush=True)

    def _cancel(self, why: str, error: BaseException | None) -> None:
        """Give the old iterator its sampler iterator back and top its tasks up again (the one
        `_try_put_index` the Trigger answered): it goes on as if nothing happened."""
        old = self.old
        old._sampler_iter = self._real
        if old._tasks_outstanding < old._prefetch_factor * old._num_workers:
            old._try_put_index()
        wrapper = self._wrapper()
        if wrapper is not None and self._old_next is not None:
            wrapper._lt_follow(self._old_next)
        self._drop(why, error)

    def _drop(self, why: str, error: BaseException | None) -> None:
        owner = self._owner()
        if owner is not None:
            owner.switch_dropped(self, why, error)
        elif error is not None:
            print(f"loadertop: autotune: {why} ({error!r})", file=sys.stderr, flush=True)
