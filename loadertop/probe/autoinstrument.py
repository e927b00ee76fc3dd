"""Zero-code instrumentation for `loadertop run`: a class-level patch of `DataLoader.__iter__`.

`install()` never imports torch. If `torch.utils.data.dataloader` is already imported it patches
at once; otherwise a one-shot `sys.meta_path` finder lets the normal import machinery find that
module and patches `DataLoader` right after the module has executed (before
`torch.utils.data/__init__` re-exports it: the class object is the same, so every alias sees it).

The patched `__iter__` runs once per epoch, never per batch. It leaves alone:
- iteration from inside `loadertop.instrument`'s proxy (`loader._inside.active` is set there), so
  a program that instruments its own loaders is measured once;
- DataLoader worker processes (`get_worker_info()` is set there): a worker never publishes;
- everything, when LOADERTOP_DISABLE=1;
- a loader not measured yet, after `%loadertop off` in a notebook (`instrument_new_loaders`).
Otherwise it gets or creates the loader's `LoaderRecord` and returns the same wrapped iterator
`instrument()` would, built from the *original* `__iter__` (a subclass's own `__iter__` body runs
once, not twice).

The notebook extension (`%loadertop on`, integrations/notebook.py) installs this same patch in the
kernel, and asks for one more thing (`continue_sources_by_name`): a loader named as a dead one
continues its source wherever it is iterated, since a notebook's cells rebind its variables.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref

from loadertop import environment

TARGET = "torch.utils.data.dataloader"

_SKIP = object()  # a loader we decided not to instrument (a worker, a failed registration)

_lock = threading.Lock()
# loader -> (pid, LoaderRecord, worker endpoint) or _SKIP; weak, so a loader's death frees it.
_records: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# (pid, filename, line, name) of the frame that named it (probe/naming.py) -> record: a loader
# created anew each epoch at the same place reuses its predecessor's record (once that loader is
# gone) instead of adding a source.
_by_call_site: dict[tuple, object] = {}
# record -> perf_counter_ns() of its latest epoch's start (see _succeeds)
_epoch_began: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_probe = None  # loadertop.probe.loader, imported at the first iteration (never at torch import)
# `%loadertop off` in a notebook (integrations/notebook.py): a loader not measured yet is left
# alone from then on; the ones measured already still are.
_new_loaders = True
# In a notebook, a loader takes over the source of a dead loader of the same name wherever it is
# iterated: a cell that rebinds `train_loader` and a training cell edited since (a new call site)
# stay one source (see _find_or_create).
_by_name = False


# ---------------------------------------------------------------------------- installing
class _DataLoaderFinder:
    """Finds nothing itself: asks the other finders for torch's dataloader module and arranges
    for the patch to run right after that module's code has executed. Removes itself once done."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self or isinstance(finder, _DataLoaderFinder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                spec = find(fullname, path, target)
            except Exception:
                spec = None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None  # let the import system do what it would have done without us
        _remove_finder()
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            try:
                original_exec(module)
            finally:
                try:
                    del loader.exec_module  # the instance attribute set below; the class's stays
                except AttributeError:
                    pass
            if getattr(module, "__name__", None) != TARGET:
                return  # a loader shared by several modules (a zip): only ours is patched
            try:
                patch(module)
            except Exception as exc:  # observing must never break `import torch`
                _warn(f"could not instrument DataLoaders: {exc!r}")

        try:
            loader.exec_module = exec_module  # this loader instance serves this one module only
        except AttributeError:
            return None
        return spec


def _remove_finder() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _DataLoaderFinder)]


def install() -> bool:
    """Patch DataLoader now if torch's dataloader module is loaded, else when it is imported.
    Returns False when disabled by LOADERTOP_DISABLE. Idempotent."""
    if environment.disabled():
        return False
    module = sys.modules.get(TARGET)
    if module is not None:
        patch(module)
        return True
    if not any(isinstance(f, _DataLoaderFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DataLoaderFinder())
    return True


def patch(module) -> bool:
    """Replace `module.DataLoader.__iter__` with the instrumenting one, and the `__iter__` of each
    subclass that defines its own (now and as later ones are created); False if already done or
    the class is not what we know (then DataLoaders simply stay uninstrumented). Under `loadertop
    tune` (LOADERTOP_TUNE_NUM_WORKERS set) `DataLoader.__init__` is wrapped too: see
    `loadertop.probe.override`; and, outside it, to note which function made each loader
    (`naming.note_maker`)."""
    from loadertop.probe import naming, override  # cheap, and only once torch is imported

    try:
        override.install(module)
    except Exception as exc:  # a trial without the override is reported by tune, not fatal here
        _warn(f"could not set num_workers for loadertop tune: {exc!r}")
    cls = getattr(module, "DataLoader", None)
    if not isinstance(cls, type) or not _patch_iter(cls):
        return False
    _patch_init(cls, naming.note_maker)
    _patch_subclass_creation(cls)
    for sub in _subclasses(cls):
        _patch_iter(sub)
    return True


def _patch_iter(cls: type) -> bool:
    """Wrap the `__iter__` that `cls` itself defines (none, or ours already: False).

    A subclass that overrides `__iter__` (torchdata 0.11's StatefulDataLoader: its own `__iter__`
    and `_get_iterator`, no `super().__iter__()`) never reaches DataLoader's, so its own is wrapped
    too. Where one `__iter__` calls another (a subclass's body calling `super().__iter__()`), the
    outermost measures and the inner ones see `loader._inside.active` and pass through: each body
    runs once, and the iterator is wrapped once. A subclass's generator `__iter__` (`yield from
    super().__iter__()`) is left alone: its body runs at the first `next()`, after this wrapper
    would have returned, so the `__iter__` it reaches inside measures instead."""
    import inspect  # here, once torch is imported: the start-up hook of every Python stays cheap

    original = cls.__dict__.get("__iter__")
    if original is None or not callable(original) or \
            getattr(original, "_loadertop_original", None) is not None or \
            inspect.isgeneratorfunction(original):
        return False

    def __iter__(self):
        return _instrumented(self, original)

    __iter__.__name__ = getattr(original, "__name__", "__iter__")
    __iter__.__qualname__ = getattr(original, "__qualname__", f"{cls.__name__}.__iter__")
    __iter__.__doc__ = original.__doc__
    # Torch's classes are patched at run time: attributes and methods mypy takes as fixed.
    __iter__.__wrapped__ = original  # type: ignore[attr-defined]
    __iter__._loadertop_original = original  # type: ignore[attr-defined]
    cls.__iter__ = __iter__  # type: ignore[attr-defined]
    return True


def _patch_init(cls: type, note_maker) -> None:
    """Wrap `cls.__init__` (torch's, or tune's override of it) so that a loader made by a
    function of the program is named after it (probe/naming.py, rule 2). Runs once per loader
    made, never per batch; the loader and what `__init__` raises are torch's own."""
    original = cls.__dict__.get("__init__")
    if original is None or getattr(original, "_loadertop_maker", False):
        return

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            note_maker(self, sys._getframe(1))
        except Exception:  # naming must never break a loader's making
            pass

    __init__.__name__ = getattr(original, "__name__", "__init__")
    __init__.__qualname__ = getattr(original, "__qualname__", f"{cls.__name__}.__init__")
    __init__.__doc__ = original.__doc__
    # As in _patch_iter: inspect.signature(DataLoader) still shows torch's through __wrapped__.
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__._loadertop_maker = original  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    todo: list[type] = list(cls.__subclasses__())
    while todo:
        sub = todo.pop()
        if sub not in found:
            found.append(sub)
            todo.extend(sub.__subclasses__())
    return found


def _patch_subclass_creation(cls: type) -> None:
    """Subclasses created from now on (a library imported after torch) get their own `__iter__`
    wrapped as the class statement ends, through `DataLoader.__init_subclass__`, which chains to
    the one it inherits (typing.Generic's in torch 2.13) or replaces."""
    own = cls.__dict__.get("__init_subclass__")
    if getattr(own, "_loadertop_original", None) is not None:
        return

    def __init_subclass__(sub, **kwargs):
        if own is not None:
            own.__func__(sub, **kwargs)
        else:
            super(cls, sub).__init_subclass__(**kwargs)
        try:
            _patch_iter(sub)
        except Exception as exc:  # observing must never break a class statement
            _warn(f"could not instrument {sub.__name__}: {exc!r}")

    # As in _patch_iter: a patched class and a function with an attribute of ours.
    __init_subclass__._loadertop_original = own if own is not None else _NO_OWN  # type: ignore[attr-defined]
    cls.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[arg-type, assignment, method-assign]


_NO_OWN = object()  # DataLoader had no __init_subclass__ of its own: unpatch deletes ours


def unpatch(module) -> None:
    """Restore the original `__iter__`s and `__init_subclass__` (tests)."""
    cls = getattr(module, "DataLoader", None)
    if not isinstance(cls, type):
        return
    for klass in [cls, *_subclasses(cls)]:
        current = klass.__dict__.get("__iter__")
        original = getattr(current, "_loadertop_original", None)
        if original is not None:
            klass.__iter__ = original  # type: ignore[attr-defined]
    init = cls.__dict__.get("__init__")
    made_by = getattr(init, "_loadertop_maker", None)
    if made_by is not None:
        cls.__init__ = made_by  # type: ignore[misc]
    hook = cls.__dict__.get("__init_subclass__")
    own = getattr(getattr(hook, "__func__", None), "_loadertop_original", None)
    if own is _NO_OWN:
        del cls.__init_subclass__
    elif own is not None:
        cls.__init_subclass__ = own  # type: ignore[method-assign]


def instrument_new_loaders(enabled: bool) -> None:
    """Whether a loader not measured yet is instrumented at its next iter() (`%loadertop on`,
    `%loadertop off`); the loaders measured already go on being measured either way."""
    global _new_loaders
    _new_loaders = bool(enabled)


def continue_sources_by_name(enabled: bool) -> None:
    """Whether a new loader named as a dead one continues its source wherever it is iterated, as
    `loadertop.instrument(name=...)` does (docs/contract.md §1), and not only at the dead one's
    call site: a notebook's loaders are its global variables, which cells rebind."""
    global _by_name
    _by_name = bool(enabled)


def apply_rank_port(environ=os.environ) -> None:
    """`run --listen tcp://H:P` over torchrun: every local rank would bind the same port, so
    rank N listens on P+N (LOCAL_RANK; `endpoints.rank_endpoint`). Idempotent in the rank's own
    children, which inherit the already-offset variable: the offset is always applied to the
    remembered base."""
    local_rank = environment.local_rank(environ)
    if local_rank is None:
        return
    # Imported only here, for ranks: every other Python under `loadertop run` skips it.
    from loadertop import endpoints

    base = environ.get(environment.LOADERTOP_RUN_PORT_BASE) or environment.endpoint(environ)
    if base is None:
        return
    try:
        shifted = endpoints.rank_endpoint(base, local_rank)
    except endpoints.EndpointError:
        return  # the rank's publisher reports the unusable endpoint itself, once
    if shifted is None:
        return  # not tcp, or any free port: each rank gets its own port anyway
    environ[environment.LOADERTOP_RUN_PORT_BASE] = base
    environ[environment.LOADERTOP_ENDPOINT] = shifted


# ---------------------------------------------------------------------------- iterating
def _instrumented(loader, original):
    if _probe is None and not _new_loaders:
        return original(loader)  # `%loadertop off` before any loader was measured
    probe = _probe or _start_probe()
    if probe is None or getattr(probe._inside, "active", False):
        return original(loader)  # loadertop.instrument's proxy is iterating: it measures
    try:
        entry = _records.get(loader)
    except TypeError:  # a subclass that is unhashable: leave it alone
        return original(loader)
    pid = os.getpid()
    if entry is None or (entry is not _SKIP and entry[0] != pid):  # new, or inherited over fork
        if not _new_loaders:
            return original(loader)  # `%loadertop off`: not registered, so `on` measures it
        entry = _register(loader, probe, sys._getframe(2))
    if entry is _SKIP:
        return original(loader)
    _, record, endpoint = entry
    _epoch_began[record] = time.perf_counter_ns()
    return probe.instrumented_iter(loader, record, endpoint, original_iter=original)


def _start_probe():
    """The first instrumented iteration of this process: the probe's import and the publisher's
    start, counted out of the program's next full garbage collection (probe/quiet_start.py)."""
    from loadertop.probe import quiet_start

    return quiet_start.call(_load_probe)


def _load_probe():
    global _probe
    try:
        from loadertop.probe import loader as probe
    except Exception as exc:
        _warn(f"DataLoaders are not instrumented: {exc!r}")
        return None
    if not environment.disabled() and not _in_dataloader_worker():
        try:
            probe.get_publisher(None).start()  # here, not at registration: see _start_probe
        except Exception as exc:  # registration says it again, and skips the loader
            probe.warn_once(f"instrumentation disabled: {exc!r}")
    _probe = probe
    return probe


def _in_dataloader_worker() -> bool:
    try:
        from torch.utils.data import get_worker_info

        return get_worker_info() is not None
    except Exception:
        return False


def _register(loader, probe, frame):
    """Once per loader (per process): its record, found or created; _SKIP when not measured."""
    with _lock:
        entry = _records.get(loader)
        if entry is not None and (entry is _SKIP or entry[0] == os.getpid()):
            return entry
        entry = _SKIP
        try:
            if not environment.disabled() and not _in_dataloader_worker():
                entry = _find_or_create(loader, probe, frame)
        except Exception as exc:  # never let observing break training
            probe.warn_once(f"instrumentation disabled for a DataLoader: {exc!r}")
            entry = _SKIP
        try:
            _records[loader] = entry
        except TypeError:
            pass
        return entry


def _find_or_create(loader, probe, frame):
    pid = os.getpid()
    publisher = probe.get_publisher(None)
    # Registered already by loadertop.instrument (and now iterated without its proxy): the same
    # record, so it is one source, counted once.
    with publisher._records_lock:
        records = list(publisher.records)
    for record in records:
        ref = getattr(record, "_loader_ref", None)
        if ref is not None and ref() is loader:
            return (pid, record, publisher.worker_endpoint)
    from loadertop.probe import naming  # here: the start-up hook of every Python stays cheap

    name, site = naming.name_and_site(loader, frame)
    key = (pid, *site, name) if site else None
    if key is not None:
        previous = _by_call_site.get(key)
        if previous is not None and (previous._loader_ref() is None
                                     or _succeeds(loader, previous, naming)):
            # The loader made here before has died, or is done: this one takes over its source.
            previous._loader_ref = weakref.ref(loader)
            publisher.ensure_registered(previous)
            return (pid, previous, publisher.worker_endpoint)
    record = publisher.reuse_named(loader, name) if _by_name and name is not None else None
    if record is None:
        record = publisher.register(loader, publisher.unique_name(name))
    if key is not None:
        _by_call_site[key] = record
    return (pid, record, publisher.worker_endpoint)


def _succeeds(loader, previous, naming) -> bool:
    """`loader` continues the source of `previous`, a loader named at the same place that is
    still alive, when it was made after `previous`'s latest epoch began and `previous` has no
    iterator now: the program makes one loader after another there and keeps the old ones.
    accelerate 1.x keeps every loader it prepares (`Accelerator._dataloaders`), and Hugging
    Face's Trainer prepares an eval loader per evaluation: one source, not one per evaluation.
    Loaders made together (a list of them, iterated in turn) stay sources of their own."""
    made = naming.made_at(loader)
    began = _epoch_began.get(previous)
    return made is not None and began is not None and made > began and previous.iterator is None


def _warn(message: str) -> None:
    try:
        from loadertop.probe.publisher import warn_once

        warn_once(message)
    except Exception:
        print(f"loadertop: {message}", file=sys.stderr, flush=True)
