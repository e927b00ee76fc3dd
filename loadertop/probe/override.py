"""`loadertop tune`'s trials: every DataLoader built with the trial's `num_workers`, no code change.

`loadertop tune` starts each trial like `loadertop run` (the same start-up hook) and sets
LOADERTOP_TUNE_NUM_WORKERS=N. When torch's dataloader module has executed, `autoinstrument.patch`
calls `install` here, which wraps `DataLoader.__init__` (the class itself, so subclasses that call
`super().__init__` — Lightning's re-instantiated loaders, HF Trainer's — are covered too) and
replaces the `num_workers` argument *before* torch validates the arguments. The user's other
arguments are kept, except those torch refuses without workers (checked in torch 2.13's
`DataLoader.__init__` and its `multiprocessing_context` setter): with N = 0, `prefetch_factor`,
`persistent_workers=True` and `multiprocessing_context` raise ValueError, so they go back to their
defaults. With N > 0 nothing else changes (`prefetch_factor=None` becomes torch's default 2).

Nothing happens without the variable; a call that does not fit the signature (a wrong argument)
goes to torch unchanged, which raises its own error.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from loadertop import environment

# Arguments torch accepts only with num_workers > 0 (torch 2.13): dropped for 0, so their defaults
# (None, False, None) apply.
WORKER_ONLY_ARGUMENTS = ("prefetch_factor", "persistent_workers", "multiprocessing_context")


def install(module: ModuleType, environ: Mapping[str, str] = os.environ) -> bool:
    """Wrap `module.DataLoader.__init__` to impose LOADERTOP_TUNE_NUM_WORKERS; False when the
    variable is unset, the class is not what we know, or it is wrapped already."""
    num_workers = environment.tune_num_workers(environ)
    cls = getattr(module, "DataLoader", None)
    original = cls.__dict__.get("__init__") if isinstance(cls, type) else None
    if num_workers is None or original is None or getattr(original, "_loadertop_original", None):
        return False
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        return False

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        args, kwargs = overridden_arguments(signature, (self, *args), kwargs, num_workers)
        original(*args, **kwargs)

    __init__.__name__ = original.__name__
    __init__.__qualname__ = getattr(original, "__qualname__", "DataLoader.__init__")
    __init__.__doc__ = original.__doc__
    # Torch's class is patched at run time: attributes and methods mypy takes as fixed.
    # inspect.signature(DataLoader) still shows torch's own through __wrapped__.
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__._loadertop_original = original  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    return True


def uninstall(module: ModuleType) -> None:
    """Restore the original `__init__` (tests)."""
    cls = getattr(module, "DataLoader", None)
    current = cls.__dict__.get("__init__") if isinstance(cls, type) else None
    original = getattr(current, "_loadertop_original", None)
    if original is not None:
        cls.__init__ = original  # type: ignore[misc]


def overridden_arguments(signature: inspect.Signature, args: tuple[Any, ...],
                         kwargs: dict[str, Any],
                         num_workers: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) of a `DataLoader.__init__(self, ...)` call with `num_workers` replaced, and
    the worker-only arguments dropped when it is 0. A call that does not bind is returned as it
    came: torch then reports the caller's own mistake."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return args, kwargs
    bound.arguments["num_workers"] = num_workers
    if num_workers == 0:
        for name in WORKER_ONLY_ARGUMENTS:
            bound.arguments.pop(name, None)
    return bound.args, bound.kwargs
