"""loadertop: `top` for PyTorch input pipelines.

`loadertop.instrument(loader)` is the whole in-process API. Importing this package never imports
torch (the viewer side must start instantly); the probe is loaded on first use.
"""

from typing import Any

from loadertop._version import __version__

__all__ = ["instrument", "__version__"]


def instrument(loader: Any, *, name: str | None = None, endpoint: str | None = None,
               autotune: bool = False) -> Any:
    """Wrap a DataLoader (or any loader-like iterable) so its input pipeline can be watched.

    Returns an object that iterates exactly like `loader` (same batches, order and exceptions),
    supports len() and passes attribute access through. `name` labels it in viewers (default
    loader0, loader1, …); `endpoint` overrides LOADERTOP_ENDPOINT for this process. With
    LOADERTOP_DISABLE=1 `loader` itself is returned. `autotune=True`: its num_workers is tuned
    between epochs and inside long ones, as under `loadertop run --autotune` (docs/contract.md
    §10).
    """
    if _instrument is None:
        # The first call imports the probe and starts the publisher, counted out of the
        # program's next full garbage collection (loadertop/probe/quiet_start.py).
        from loadertop.probe import quiet_start

        return quiet_start.call(_first_instrument, loader, name, endpoint, autotune)
    return _instrument(loader, name=name, endpoint=endpoint, autotune=autotune)


_instrument: Any = None  # loadertop.probe.loader.instrument, once imported


def _first_instrument(loader: Any, name: str | None, endpoint: str | None,
                      autotune: bool = False) -> Any:
    global _instrument
    from loadertop.probe.loader import instrument

    _instrument = instrument
    return instrument(loader, name=name, endpoint=endpoint, autotune=autotune)
