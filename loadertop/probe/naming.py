"""How `loadertop run` names a loader it instruments: by the name the program knows it by.

Looked up once per loader, when it is first iterated, from the frames iterating it (and, for a
loader a function of the program made and returned, from where it was made). In order:

1. the program's own frames: a local, an attribute of the frame's `self`, a global holding the
   loader (`train_loader`, `self.val_loader` -> `val_loader`);
2. the function of the program that made it, when its name says it makes loaders and it takes
   nothing but `self` (a factory with parameters makes several): Lightning's
   `def val_dataloader(self): return DataLoader(...)` hooks (and a DataModule's) are
   `val_dataloader`; recorded by `note_maker` as the DataLoader is made (`autoinstrument` wraps
   `DataLoader.__init__` for that);
3. a library's frames: a local or an attribute of `self` holding the loader, or the wrapper
   right around it, under a name of its own (not `dataloader`, `loader`, `iterable`: a
   library's parameters for any loader). Hugging Face's Trainer (transformers 5.x) iterates
   accelerate's wrapper from `_run_epoch(..., train_dataloader, ...)` and `evaluate()`'s
   `eval_dataloader`;
4. the attribute a wrapper keeps it in (`base_dataloader`, accelerate 1.x's), when nothing else;
5. None: the publisher then says loader0, loader1, ...

A loader is also known through the objects that wrap it: a frame running the `__iter__` or
`__next__` of a `self` that holds the loader (or a wrapper of it) in an attribute is a wrapper's
own iteration (accelerate 1.x's `DataLoaderShard.__iter__` holds the DataLoader it made in
`base_dataloader`), so frames further out that hold that `self` hold the loader.

Frames are the program's unless their file is torch's or loadertop's (skipped: their names are
the loader's internals), or a library's: under a site-packages/dist-packages directory or the
standard library. Code without a file (`python -c`, exec) is the program's.
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any

SEARCH_FRAMES = 24  # frames looked at, outwards: Lightning 2.6 iterates ~16 frames below fit()
MAKER_FRAMES = 8  # frames above DataLoader.__init__ looked at for the function that made it

# Names at a call site that say nothing about the loader (a wrapper's parameter, a generic local).
GENERIC_NAMES = frozenset({"self", "cls", "iterable", "iterator", "it", "obj", "seq", "x", "_"})
# ... and, in a library's frames, the names a library gives any loader it is handed.
LIBRARY_GENERIC_NAMES = GENERIC_NAMES | frozenset({
    "dataloader", "data_loader", "loader", "dl", "base_dataloader", "iterables", "loaders",
    "dataloaders", "data", "source"})
_ITERATING = frozenset({"__iter__", "__next__"})

OURS, LIBRARY, PROGRAM = "ours", "library", "program"
_SITE_DIRS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_kinds: dict[str, str] = {}
_KINDS_KEPT = 4096
_our_dirs: tuple[str, ...] | None = None
_STDLIB_DIR = os.path.dirname(os.path.abspath(os.__file__)) + os.sep

Site = tuple[str, int]  # (file, line) of the frame a name was found in
# A loader -> (the name of the function of the program that made it, where it was made).
_made_by: weakref.WeakKeyDictionary[Any, tuple[str, Site]] = weakref.WeakKeyDictionary()
# A loader -> time.perf_counter_ns() when DataLoader.__init__ returned (autoinstrument._succeeds).
_made_at: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def frame_kind(filename: str) -> str:
    """OURS (torch, loadertop), LIBRARY (installed packages, the standard library) or PROGRAM."""
    kind = _kinds.get(filename)
    if kind is None:
        kind = _classify(filename)
        if len(_kinds) < _KINDS_KEPT:
            _kinds[filename] = kind
    return kind


def _classify(filename: str) -> str:
    if filename.startswith(_ours()):
        return OURS
    if filename.startswith("<"):  # <string>, <stdin>: `python -c`, exec'd code
        return PROGRAM
    if any(part in filename for part in _SITE_DIRS) or filename.startswith(_STDLIB_DIR):
        return LIBRARY
    return PROGRAM


def _ours() -> tuple[str, ...]:
    """loadertop's directory, and torch's once torch is imported (always, by the time a loader
    is made or iterated)."""
    global _our_dirs
    if _our_dirs is not None:
        return _our_dirs
    dirs = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep]
    torch = sys.modules.get("torch")
    torch_file: str | None = getattr(torch, "__file__", None) if torch is not None else None
    if torch_file:
        dirs.append(os.path.dirname(os.path.abspath(torch_file)) + os.sep)
        _our_dirs = tuple(dirs)
        _kinds.clear()
    return tuple(dirs)


def outer_frames(frame: FrameType | None, limit: int = SEARCH_FRAMES) -> Iterator[FrameType]:
    """`frame` and its callers, at most `limit` of them, less torch's and loadertop's."""
    depth = 0
    while frame is not None and depth < limit:
        if frame_kind(frame.f_code.co_filename) != OURS:
            yield frame
        frame = frame.f_back
        depth += 1


def call_site(frame: FrameType | None) -> Site | None:
    for f in outer_frames(frame):
        return (f.f_code.co_filename, f.f_lineno)
    return None


def note_maker(loader: Any, frame: FrameType | None) -> None:
    """As a DataLoader is made: remember the nearest function of the program that made it, when
    its name says it makes loaders (contains `loader`: `train_dataloader`) and it takes nothing
    but `self`.
    Libraries' frames on the way are passed (Lightning 2.6 calls its hooks with
    `DataLoader.__init__` wrapped by a function of its own), and so are `__init__`s (a
    subclass's calling its base's). Also notes when it was made (`made_at`)."""
    try:
        _made_at[loader] = time.perf_counter_ns()
    except TypeError:  # not weakly referable
        pass
    depth = 0
    while frame is not None and depth < MAKER_FRAMES:
        code = frame.f_code
        if frame_kind(code.co_filename) == PROGRAM and code.co_name != "__init__":
            name = code.co_name
            if "loader" in name.lower() and usable(name) and _stands_for_one(code):
                try:
                    _made_by[loader] = (name, (code.co_filename, frame.f_lineno))
                except TypeError:  # not weakly referable: no name from here
                    pass
            return
        frame = frame.f_back
        depth += 1


def made_at(loader: Any) -> int | None:
    """time.perf_counter_ns() when `loader` was made (DataLoader.__init__), None if unknown."""
    try:
        return _made_at.get(loader)
    except TypeError:
        return None


def _stands_for_one(code: CodeType) -> bool:
    """A function that takes nothing but its `self` (or `cls`) makes one loader each time it is
    called: a hook. One with parameters (`make_loader(split)`) makes different ones."""
    args = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & (_CO_VARARGS | _CO_VARKEYWORDS):
        return False
    return args == 0 or (args == 1 and code.co_varnames[0] in ("self", "cls"))


def name_and_site(loader: Any, frame: FrameType | None) -> tuple[str | None, Site | None]:
    """The name the program knows `loader` by (see the module's rules) and the (file, line) of
    the frame it was found in; (None, the nearest frame's site) when there is none."""
    # The loader and its wrappers, each with how many wrappers deep it holds the loader: a
    # library's name counts only for the loader or the wrapper right around it (Lightning's
    # fetcher holds a CombinedLoader holding the loader: `data_fetcher` names neither).
    holders: list[tuple[Any, int]] = [(loader, 0)]

    def depth_of(value: Any) -> int | None:
        return next((d for h, d in holders if value is h), None)

    library: tuple[str, Site] | None = None
    wrapper: tuple[str, Site] | None = None
    nearest: Site | None = None
    for f in outer_frames(frame):
        site = (f.f_code.co_filename, f.f_lineno)
        nearest = nearest or site
        program = frame_kind(site[0]) == PROGRAM
        local_items = frame_locals(f)
        owner = next((v for k, v in local_items if k == "self"), None)
        attr_items = (attributes(owner) if owner is not None and depth_of(owner) is None else [])
        if attr_items and f.f_code.co_name in _ITERATING:
            inner = next(((k, d) for k, v in attr_items if (d := depth_of(v)) is not None), None)
            if inner is not None:  # a wrapper's own iteration: `self` stands for the loader
                holders.append((owner, inner[1] + 1))
                attribute = inner[0].lstrip("_") or inner[0]
                if wrapper is None and usable(attribute):
                    wrapper = (attribute, site)
                attr_items = []
        scopes = [(local_items, False), (attr_items, True)]
        if program:
            scopes.append((items_of(f.f_globals.copy), False))
        for items, strip in scopes:
            for name, value in items:
                depth = depth_of(value)
                if depth is None or not usable(name):
                    continue
                name = (name.lstrip("_") or name) if strip else name
                if program:
                    return name, site
                if library is None and depth <= 1 and name not in LIBRARY_GENERIC_NAMES:
                    library = (name, site)
    for found in (_made_by.get(loader), library, wrapper):
        if found is not None:
            return found
    return None, nearest


# CO_OPTIMIZED (`inspect.CO_OPTIMIZED`): a function's frame, whose locals live in fast slots.
_CO_OPTIMIZED = 0x1
_CO_VARARGS, _CO_VARKEYWORDS = 0x4, 0x8  # inspect.CO_VARARGS, inspect.CO_VARKEYWORDS
_LOCALS_ARE_SNAPSHOTS = sys.version_info < (3, 13)  # PEP 667 made f_locals a live proxy


def frame_locals(frame: FrameType) -> list[tuple[str, Any]]:
    """A snapshot of a frame's local (name, value) pairs, [] when they cannot be read, leaving
    the frame holding no reference it did not hold before.

    On CPython < 3.13 reading a function frame's `f_locals` copies its fast locals into a dict
    kept on the frame, and that dict keeps every value alive until something reads `f_locals`
    again. Naming a loader from the frame that iterates it left that loader, its persistent
    iterator and so its workers alive after the program's `del loader` (torch 2.13 shuts
    persistent workers down from `_MultiProcessingDataLoaderIter.__del__`). So the dict is
    emptied again after reading, unless someone else holds it (a `locals()` the program kept:
    then it is theirs and stays as the read left it). Every reader of that dict (`locals()`,
    `f_locals`, a tracer's write-back) refreshes it from the fast locals first, so emptying it
    changes nothing they see. Module and class frames' `f_locals` are real namespaces: untouched.
    """
    try:
        namespace = frame.f_locals
        items = list(namespace.items())
    except Exception:
        return []
    if _LOCALS_ARE_SNAPSHOTS and frame.f_code.co_flags & _CO_OPTIMIZED \
            and type(namespace) is dict and sys.getrefcount(namespace) <= 3:
        # 3: the frame's own reference, `namespace`, and getrefcount's argument
        namespace.clear()
    return items


def items_of(namespace: Callable[[], Any]) -> list[tuple[str, Any]]:
    """A snapshot of a namespace's items; [] when it cannot be read (a proxy, no __dict__)."""
    try:
        return list(namespace().items())
    except Exception:
        return []


def attributes(owner: object) -> list[tuple[str, Any]]:
    """A snapshot of an object's attributes; [] without a `__dict__`."""
    return items_of(lambda: vars(owner))


def usable(name: object) -> bool:
    return isinstance(name, str) and name.isidentifier() and name not in GENERIC_NAMES \
        and not name.startswith("__") and len(name) <= 64
