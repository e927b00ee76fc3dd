"""`LoadertopCallback` for Hugging Face's `Trainer`: the loaders' figures join the Trainer's own
log calls, so every `report_to` backend (TensorBoard, W&B, MLflow, …) receives them.

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[LoadertopCallback()])

At the end of the Trainer's `__init__` (`on_init_end`) it instruments the DataLoaders the Trainer
will make (the class-level patch `loadertop run` installs, probe/autoinstrument.py: the
`train_dataloader` and `eval_dataloader`; under `run` they are found instrumented already). Then
at each of the Trainer's logs (`on_log`) it adds `loadertop.metrics()` to the `logs` dict.

The order of the callbacks decides who sees the keys. transformers 5.x calls them in the order of
`trainer.callback_handler.callbacks`, which is [DefaultFlowCallback, the `report_to`
callbacks…, the program's callbacks…, the console's printer] (`Trainer.__init__`): a callback
passed in `callbacks=` runs after the backends have written `logs`. So at `on_init_end` (and
again at `on_train_begin`, for one added later with `trainer.add_callback`) this callback moves
itself right after DefaultFlowCallback, before every backend, and puts a second one right before
the console's printer (PrinterCallback, ProgressCallback) that takes the keys out again: the
backends receive them, the console line and `state.log_history` (the checkpoints'
trainer_state.json) stay as they were. The handler is the caller of the event
(`CallbackHandler.call_event` calls each callback's method itself).

transformers is imported when the callback is first asked for; without it, `from
loadertop.integrations.transformers import LoadertopCallback` raises one clear ImportError.
"""

from __future__ import annotations

import sys
from typing import Any

_PRINTERS = ("PrinterCallback", "ProgressCallback", "NotebookProgressCallback")
_made: list[type] = []


def __getattr__(name: str) -> Any:
    if name != "LoadertopCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return callback_class()


def callback_class() -> type:
    if _made:
        return _made[0]
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise ImportError("loadertop.integrations.transformers needs Hugging Face transformers "
                          "(pip install transformers): it is not installed") from None
    _made.append(_make(TrainerCallback))
    return _made[0]


def _make(base: type) -> type:
    from loadertop.integrations.loggers import TrackerWriter
    from loadertop.probe.naming import frame_locals

    class _Withdraw(base):  # type: ignore[misc]
        """Takes loadertop's keys out of `logs` before the console's printer sees them."""

        def __init__(self, keys: set[str]) -> None:
            super().__init__()
            self.keys = keys

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                   **kwargs: Any) -> None:
            if isinstance(logs, dict):
                for key in self.keys:
                    logs.pop(key, None)

    class LoadertopCallback(base):  # type: ignore[misc]
        """Adds `loadertop.metrics()` to the Trainer's logs (see the module's docstring)."""

        def __init__(self) -> None:
            super().__init__()
            self._writer = TrackerWriter("the transformers callback")
            self._added: set[str] = set()
            self._withdraw = _Withdraw(self._added)

        def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            caller = sys._getframe(1)  # CallbackHandler.call_event
            self._writer.guarded(self, "ordering", lambda: self._order(caller))
            self._writer.start()

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            caller = sys._getframe(1)
            self._writer.guarded(self, "ordering", lambda: self._order(caller))
            self._writer.start()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                   **kwargs: Any) -> None:
            if not isinstance(logs, dict):
                return
            figures, _ = self._writer.read()
            self._added.clear()
            for key, value in figures.items():
                if key not in logs:
                    logs[key] = value
                    self._added.add(key)

        def _order(self, caller: Any) -> None:
            """Itself first after DefaultFlowCallback, its `_Withdraw` right before the printer,
            in the list of the handler calling this event (`caller`: its call_event frame)."""
            handler = next((v for k, v in frame_locals(caller) if k == "self"), None)
            if handler is None:
                return
            callbacks = getattr(handler, "callbacks", None)
            if type(handler).__name__ != "CallbackHandler" or not isinstance(callbacks, list) \
                    or self not in callbacks:
                return
            # A new list: call_event goes on iterating the old one for this event (each callback
            # called once); the next events follow the new order.
            order = [c for c in callbacks if c is not self and c is not self._withdraw]
            first = 1 if order and type(order[0]).__name__ == "DefaultFlowCallback" else 0
            order.insert(first, self)
            printer = next((i for i, c in enumerate(order) if type(c).__name__ in _PRINTERS),
                           len(order))
            order.insert(printer, self._withdraw)
            handler.callbacks = order

    return LoadertopCallback
