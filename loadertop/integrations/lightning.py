"""`LoadertopCallback` for PyTorch Lightning: the loaders' figures through the Trainer's own loggers.

    trainer = L.Trainer(callbacks=[LoadertopCallback()], logger=TensorBoardLogger("runs"))

At `setup` it instruments the DataLoaders the Trainer will iterate (the class-level patch that
`loadertop run` installs, probe/autoinstrument.py: each loader named as the program knows it,
`train_dataloader`, `val_dataloader`; under `run`, or for loaders wrapped with
`loadertop.instrument`, they are found instrumented already) and starts `loadertop.metrics()`.
Then, whenever Lightning logs its own training metrics (every `log_every_n_steps`, the Trainer's
`_logger_connector.should_update_logs`, as Lightning 2.x's DeviceStatsMonitor does), it logs
`loadertop.metrics()` through every logger the Trainer has (TensorBoard, W&B, CSV, MLflow…) at
the same step (`fit_loop.epoch_loop._batches_that_stepped`), and the verdict's text, when it
changed, where the logger takes text: TensorBoard (`add_text`), W&B (`log_text`), MLflow (a tag).

Lightning is imported when the callback is first asked for (`from
loadertop.integrations.lightning import LoadertopCallback`), from the package the program uses
(`lightning.pytorch`, else `pytorch_lightning`): without either, that import raises one clear
ImportError. A logger that refuses the figures costs one line on stderr, once, never the fit.
"""

from __future__ import annotations

import sys
from typing import Any

VERDICT_TAG = "loadertop/verdict"
_PACKAGES = ("lightning.pytorch", "pytorch_lightning")
_classes: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    if name != "LoadertopCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return callback_class()


def callback_class(package: str | None = None) -> type:
    """The callback class for `package` (default: the Lightning the program imported, else the
    first installed of `lightning.pytorch`, `pytorch_lightning`)."""
    if package is None:
        package = next((p for p in _PACKAGES if p in sys.modules), None)
    candidates = (package,) if package is not None else _PACKAGES
    for candidate in candidates:
        found = _classes.get(candidate)
        if found is not None:
            return found
        try:
            module = __import__(candidate, fromlist=["Callback"])
        except ImportError:
            continue
        _classes[candidate] = made = _make(module.Callback)
        return made
    raise ImportError("loadertop.integrations.lightning needs PyTorch Lightning "
                      "(pip install lightning): it is not installed")


def _make(base: type) -> type:
    from loadertop.integrations.loggers import TrackerWriter

    class LoadertopCallback(base):  # type: ignore[misc]
        """Logs `loadertop.metrics()` and the verdict through the Trainer's loggers (see the
        module's docstring)."""

        def __init__(self) -> None:
            super().__init__()
            self._writer = TrackerWriter("the Lightning callback")
            self._verdict = ""

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            self._writer.start()

        def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            if not trainer._logger_connector.should_update_logs:
                return
            step = trainer.fit_loop.epoch_loop._batches_that_stepped
            self._log(trainer, step)

        def _log(self, trainer: Any, step: int) -> None:
            figures, verdict = self._writer.read()
            for logger in trainer.loggers:
                if figures:
                    self._writer.call(logger, "log_metrics", figures, step=step)
                if verdict and verdict != self._verdict:
                    self._writer.text(logger, VERDICT_TAG, verdict, step)
            if verdict:
                self._verdict = verdict

    return LoadertopCallback
