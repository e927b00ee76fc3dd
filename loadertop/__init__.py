"""loadertop: `top` for PyTorch input pipelines.

`loadertop.instrument(loader)` is the whole in-process API. Importing this package never imports
torch (the viewer side must start instantly); the probe is loaded on first use.
"""

from loadertop._version import __version__

__all__ = ["instrument", "__version__"]


def instrument(loader, *, name=None, endpoint=None):
    """Wrap a DataLoader (or any loader-like iterable) so its input pipeline can be watched.

    Returns an object that iterates exactly like `loader` (same batches, order and exceptions),
    supports len() and passes attribute access through. `name` labels it in viewers (default
    loader0, loader1, …); `endpoint` overrides LOADERTOP_ENDPOINT for this process. With
    LOADERTOP_DISABLE=1 `loader` itself is returned.
    """
    from loadertop.probe.loader import instrument as _instrument

    return _instrument(loader, name=name, endpoint=endpoint)
