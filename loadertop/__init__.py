"""loadertop: `top` for PyTorch input pipelines.

`loadertop.instrument(loader)` instruments a loader; `loadertop.metrics()` and
`loadertop.verdict()` read its figures in the training process (for a tracker: W&B, TensorBoard,
MLflow); in a notebook, `%load_ext loadertop` and `loadertop.show()` (docs/notebook.md). Importing
this package never imports torch (the viewer side must start instantly) nor IPython; the probe is
loaded on first use.
"""

from collections.abc import Callable
from typing import Any

from loadertop._version import __version__

__all__ = ["instrument", "metrics", "verdict", "show", "__version__"]


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


def metrics() -> dict[str, float]:
    """The current figures of every loader this process instruments, as a tracker's flat keys:
    `loadertop/<loader>/<figure>` (`loadertop/rank<N>/<loader>/…` where a rank is known):
    wait_fraction, batches_per_s, samples_per_s, fetch_ms_p50, collate_ms_p50, handoff_ms_p50,
    num_workers, queue_ready_mean, `bottleneck/<category>` (1.0 for the loader's verdict, 0.0 for
    the others) and workers_alive; a figure not known now is left out (docs/contract.md §11).

    Computed by the viewers' own code from this process's reports, refreshed once a second off
    the training thread; a call copies the latest dict. The first call starts that viewer (its
    figures follow within a second or two): {} until then, before any loader is instrumented,
    and with LOADERTOP_DISABLE=1. `wandb.log({**loadertop.metrics(), "loss": loss})`.
    """
    if _metrics is None:
        return _first_metrics()
    return _metrics()


def verdict() -> str:
    """The banner's text for this process's loaders (the category, the loader it is about and
    the summary; the deciding evidence; the first advice), as of the last refresh; "" before
    the first (see `metrics`)."""
    if _metrics is None:
        _first_metrics()
    return _import_metrics().verdict()  # type: ignore[no-any-return]


_metrics: Callable[[], dict[str, float]] | None = None  # integrations.metrics.metrics, once imported


def _first_metrics() -> dict[str, float]:
    global _metrics
    # The client's model and diagnosis are imported on this thread (the publisher thread, which
    # runs them, must import nothing: a fork meanwhile would inherit a held import lock), out of
    # the program's next full garbage collection (loadertop/probe/quiet_start.py).
    from loadertop.probe import quiet_start

    module = quiet_start.call(_import_metrics)
    _metrics = module.metrics
    return _metrics()


def _import_metrics() -> Any:
    # By name: the probe imports this package's root (`from loadertop import environment`), and
    # import-linter would read a static import here as the probe importing the client. The probe
    # never calls metrics(); the program does.
    import importlib

    return importlib.import_module("loadertop.integrations.metrics")


def show() -> None:
    """In a notebook: draw the live panel of this kernel's loaders in the cell's output — the
    verdict, each loader's rate, wait, stages, queue and workers, and the findings — refreshed
    every second from a thread of its own while this cell or a later one trains
    (docs/notebook.md). A later `show()` takes over from this one."""
    from loadertop.integrations import notebook

    notebook.show()


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext loadertop`: the `%loadertop on|off|show` magic (docs/notebook.md)."""
    from loadertop.integrations import notebook

    notebook.load(ipython)
