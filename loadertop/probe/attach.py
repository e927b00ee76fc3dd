"""What `loadertop attach` installs inside a running training process (its main thread, at a safe
point, from `loadertop/attach/bootstrap.py`), and what `--detach` takes out again.

`attach()` does what `loadertop run`'s start-up hook does, then reaches the loops already running:
- the publisher and its discovery entry (in the attaching side's discovery directory, on its
  `--listen` endpoint), started and bound before anything is patched;
- `DataLoader.__iter__` patched (`autoinstrument.patch`): every epoch from now on is measured as
  under `run`, worker hooks included, loaders named after their variable;
- `_BaseDataLoaderIter.__next__` replaced on the class. Assigning a type's `__next__` updates its
  `tp_iternext` slot and those of the subclasses that inherit it (`_SingleProcessDataLoaderIter`,
  `_MultiProcessingDataLoaderIter`), so a `for` loop that is already running enters the new
  function at its next batch. The first call on an iterator adopts it (once): the loader is
  looked for in the calling frames (the object whose `_index_sampler` the iterator copied, or
  whose `_iterator` it is, as for persistent workers) and its `run` record reused or made, else
  the figures come from the iterator itself (its `_num_workers`, `_dataset`, `_workers`, ...).
  Workers it started before the attach were never hooked: their fetch and collate times stay
  null (`stages.unpaired`: `workers_unhooked`) until they are restarted.
  Per batch after that: one dict lookup, two clock reads and two deque appends; the batch, its
  order and any exception are the iterator's own (the same object re-raised).
Iterators made by the `__iter__` patch are wrapped as under `run`, and that wrapper calls the
original `__next__` (`loader._unmeasured_next`): each batch is measured once.

`detach()` restores both methods and tells the publisher thread to stop: within REPORT_S it sends
the last report and a goodbye per loader (viewers show them `finished`), closes its sockets and
removes its files. A wrapper made for an epoch begun while attached keeps stamping a bounded deque
until that epoch ends (nobody reads it); workers hooked while attached keep sending their samples
into a socket nobody reads (dropped, never blocking) until they exit.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref

PROTOCOL = 1  # what loadertop/attach/bootstrap.py expects of this module
DATALOADER_MODULE = "torch.utils.data.dataloader"
READY_TIMEOUT_S = 2.0  # the publisher binds and writes its entry in ~ms; never wait longer
_RECORD = "_loadertop_record"  # set on adopted iterators (torch's objects, which have a __dict__)
_SKIP = object()  # an iterator adopted but not measured (a worker process, a failed registration)

_lock = threading.Lock()
_state: _Attached | None = None
_clock = time.perf_counter_ns


class _Attached:
    def __init__(self, module, original_next, publisher) -> None:
        self.pid = os.getpid()
        self.module = module
        self.base = module._BaseDataLoaderIter
        self.original_next = original_next
        self.publisher = publisher
        self.adopted: weakref.WeakSet = weakref.WeakSet()
        self.since = time.time()


def attached() -> bool:
    return _state is not None and _state.pid == os.getpid()


def attach(*, endpoint: str | None, directory: str) -> dict:
    """Install (see the module's docstring); raises on failure, after which `detach(quiet=True)`
    puts everything back."""
    global _state
    from loadertop.probe import autoinstrument
    from loadertop.probe import publisher as publisher_module

    module = sys.modules[DATALOADER_MODULE]
    base = getattr(module, "_BaseDataLoaderIter", None)
    original_next = base.__dict__.get("__next__") if isinstance(base, type) else None
    if original_next is None or getattr(original_next, "_loadertop_original", None) is not None:
        raise RuntimeError("torch's _BaseDataLoaderIter is not what loadertop knows (torch "
                           f"{getattr(sys.modules.get('torch'), '__version__', '?')})")
    publisher = publisher_module.get_publisher(endpoint, directory=directory, sigterm_cleanup=False,
                                               how="attach")
    _state = _Attached(module, original_next, publisher)
    publisher.start()
    if publisher.failed:
        raise RuntimeError(publisher.failed)
    publisher._ready.wait(READY_TIMEOUT_S)
    if publisher.failed:
        raise RuntimeError(publisher.failed)
    autoinstrument.patch(module)
    base.__next__ = _timed_next(original_next)  # type: ignore[union-attr]  # a type: checked above
    return {"ok": True, "endpoint": publisher.endpoint,
            "entry": str(publisher.entry_path) if publisher.entry_path else None}


def detach(quiet: bool = False) -> dict:
    """Undo `attach()` (also a half-done one); the loaders measured, as {name: batches}."""
    global _state
    state = _state
    if state is None:
        return {"ok": True, "sources": {}}
    from loadertop.probe import autoinstrument
    from loadertop.probe import publisher as publisher_module

    current = state.base.__dict__.get("__next__")
    if getattr(current, "_loadertop_original", None) is state.original_next:
        state.base.__next__ = state.original_next
    autoinstrument.unpatch(state.module)
    for it in list(state.adopted):
        try:
            it.__dict__.pop(_RECORD, None)
        except Exception:
            pass
    publisher = state.publisher
    with publisher._records_lock:
        records = list(publisher.records)
    # Not joined here: the thread notices within REPORT_S (its poll timeout), sends a last report
    # and a goodbye per loader, closes its sockets and removes its files by itself; the main
    # thread goes back to training at once. `loadertop attach --detach` waits for the entry to go.
    publisher._stop.set()
    if publisher._thread is None:
        publisher._remove_files()
    atexit.unregister(publisher.close)
    publisher_module.forget_publisher(publisher)
    autoinstrument._records.clear()
    autoinstrument._by_call_site.clear()
    _state = None
    return {"ok": True, "sources": {r.name: r.batches_total for r in records},
            "entry": str(publisher.entry_path) if publisher.entry_path else None}


# ---------------------------------------------------------------------------- the class patch
def _timed_next(original):
    clock = _clock

    def __next__(self):
        record = self.__dict__.get(_RECORD)
        if record is None:
            record = _adopt(self, sys._getframe(1))
        if record is _SKIP:
            return original(self)
        append = record.events.append
        append(clock())
        try:
            batch = original(self)
        except BaseException as exc:
            append(0)
            if not isinstance(exc, StopIteration):
                record.note_error(exc)
            raise
        append(-clock())
        return batch

    __next__.__name__ = original.__name__
    __next__.__qualname__ = getattr(original, "__qualname__", "_BaseDataLoaderIter.__next__")
    __next__.__doc__ = original.__doc__
    __next__.__wrapped__ = original
    __next__._loadertop_original = original
    return __next__


def _adopt(it, frame):
    """Once per iterator: its record (made or found), or _SKIP."""
    with _lock:
        record = it.__dict__.get(_RECORD)
        if record is not None:
            return record
        state = _state
        record = _SKIP
        if state is not None and state.pid == os.getpid() and not _in_worker():
            try:
                record = _register(it, frame, state)
            except Exception as exc:  # never let observing break training
                from loadertop.probe.publisher import warn_once

                warn_once(f"a running DataLoader iterator is not measured: {exc!r}")
                record = _SKIP
        try:
            it.__dict__[_RECORD] = record
            if state is not None:
                state.adopted.add(it)
        except Exception:
            pass
        return record


def _in_worker() -> bool:
    try:
        from torch.utils.data import get_worker_info

        return get_worker_info() is not None
    except Exception:
        return False


def _register(it, frame, state: _Attached):
    from loadertop import environment
    from loadertop.probe import autoinstrument, torch_internals

    if environment.disabled():
        return _SKIP
    publisher = state.publisher
    loader = _find_loader(it, frame, state.module)
    if loader is not None:
        probe = autoinstrument._probe or autoinstrument._load_probe()
        if probe is None:
            return _SKIP
        entry = autoinstrument._register(loader, probe, frame)
        if entry is autoinstrument._SKIP:
            return _SKIP
        record = entry[1]
        record.refresh_config(loader)
    else:
        record = publisher.register(_IteratorView(it), publisher.unique_name(None))
    record.unhooked_pids.update(pid for _, pid, _ in torch_internals.worker_pids(it) if pid)
    record.attach(it, None)  # not an epoch's start: no epoch-start figure, no worker pairing
    return record


def _find_loader(it, frame, module):
    """The DataLoader this iterator was made from, if a calling frame holds it (a local, an
    attribute of the caller's `self`, a global)."""
    from loadertop.probe.naming import frame_locals, items_of, outer_frames

    cls = getattr(module, "DataLoader", None)
    sampler = it.__dict__.get("_index_sampler")
    if not isinstance(cls, type):
        return None

    def made_it(value) -> bool:
        if not isinstance(value, cls):
            return False
        try:
            if value.__dict__.get("_iterator") is it:
                return True
            # a DataLoader (isinstance above): torch 2.13 gives it `_index_sampler`
            return sampler is not None and value._index_sampler is sampler  # type: ignore[attr-defined]
        except Exception:
            return False

    for f in outer_frames(frame):
        local_items = frame_locals(f)
        owner = next((v for k, v in local_items if k == "self"), None)
        attr_items = items_of(lambda owner=owner: vars(owner)) if owner is not None else []
        for items in (local_items, attr_items, items_of(lambda f=f: f.f_globals)):
            for _name, value in items:
                if made_it(value):
                    return value
    return None


class _IteratorView:
    """A loader-like object for `torch_internals.loader_config`, read off a live iterator whose
    DataLoader could not be found (torch 2.13 `_BaseDataLoaderIter.__init__` copies these)."""

    def __init__(self, it) -> None:
        d = it.__dict__
        self.num_workers = d.get("_num_workers", 0)
        self.dataset = d.get("_dataset")
        sampler = d.get("_index_sampler")
        self.batch_size = getattr(sampler, "batch_size", None) if d.get("_auto_collation") else None
        self.prefetch_factor = d.get("_prefetch_factor")
        self.pin_memory = bool(d.get("_pin_memory", False))
        self.persistent_workers = bool(d.get("_persistent_workers", False))
        self.drop_last = bool(d.get("_drop_last", False))
        self.multiprocessing_context = None
        workers = d.get("_workers") or []
        method = getattr(type(workers[0]), "_start_method", None) if workers else None
        if method:
            import multiprocessing

            self.multiprocessing_context = multiprocessing.get_context(method)
