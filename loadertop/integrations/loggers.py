"""What the frameworks' callbacks share: instrumenting the loaders, reading `loadertop.metrics()`
and `loadertop.verdict()`, and writing to a tracker so that its failure costs one line on stderr,
once per tracker, and never the training (docs/contract.md §11)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import loadertop
from loadertop import environment


class TrackerWriter:
    """`who`: the integration, as the warning line names it."""

    def __init__(self, who: str) -> None:
        self.who = who
        self._failed: set[tuple[str, str]] = set()

    def start(self) -> None:
        """Instrument every DataLoader the program iterates from now on (`loadertop run`'s
        class-level patch; loaders instrumented already are left as they are) and start the
        in-process viewer, so that the figures are there by the first log."""
        if environment.disabled():
            return
        try:
            from loadertop.probe import autoinstrument

            autoinstrument.install()
            loadertop.metrics()
        except Exception as exc:
            self._warn("instrumenting the loaders", exc)

    def read(self) -> tuple[dict[str, float], str]:
        """(`loadertop.metrics()`, `loadertop.verdict()`); ({}, "") if they fail."""
        try:
            return loadertop.metrics(), loadertop.verdict()
        except Exception as exc:
            self._warn("loadertop.metrics()", exc)
            return {}, ""

    def call(self, tracker: Any, method: str, *args: Any, **kwargs: Any) -> None:
        """`tracker.method(*args, **kwargs)`, guarded (see `guarded`)."""
        self.guarded(tracker, method, lambda: getattr(tracker, method)(*args, **kwargs))

    def text(self, logger: Any, tag: str, text: str, step: int) -> None:
        """The verdict's text where a Lightning logger takes text: TensorBoard's `add_text`, W&B's
        table (`log_text`), MLflow's run tag; nothing for the others (CSV)."""
        kind = type(logger).__name__

        def write() -> None:
            if kind == "TensorBoardLogger":
                logger.experiment.add_text(tag, text, step)
            elif kind == "WandbLogger":
                logger.log_text(key=tag, columns=["verdict"], data=[[text]], step=step)
            elif kind == "MLFlowLogger":
                logger.experiment.set_tag(logger.run_id, tag, text)

        self.guarded(logger, "text", write)

    def guarded(self, tracker: Any, what: str, write: Callable[[], object]) -> None:
        """`write()`; its failure one line on stderr (once per tracker class and `what`) and
        nothing more: a full disk or a bad directory never stops the training."""
        key = (type(tracker).__name__, what)
        try:
            write()
        except Exception as exc:
            if key not in self._failed:
                self._failed.add(key)
                self._warn(f"{key[0]}.{what}", exc)

    def _warn(self, what: str, exc: BaseException) -> None:
        try:
            print(f"loadertop: {self.who}: {what} failed ({exc!r}); the training goes on without it",
                  file=sys.stderr, flush=True)
        except Exception:
            pass
