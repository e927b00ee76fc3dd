"""epoch_start_slow: each epoch's first batch takes long (workers started anew, imports)."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import (
    Finding,
    SourceFigures,
    SystemFigures,
)
from loadertop.client.units import say_ms
from loadertop.findings._common import finding

KIND: Final = "epoch_start_slow"

# The first batch of each of the last EPOCH_START_EPOCHS epochs took this long (the first epoch
# alone is not it: caches are cold once).
EPOCH_START_SLOW_MS: Final = 1000.0
EPOCH_START_EPOCHS: Final = 2


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    return _epoch_start_slow(source)


def _epoch_start_slow(source: SourceFigures) -> list[Finding]:
    recent = source.epoch_starts_ms[-EPOCH_START_EPOCHS:]
    if len(recent) < EPOCH_START_EPOCHS or min(recent) < EPOCH_START_SLOW_MS:
        return []
    config = source.config
    shown = ", ".join(say_ms(v) for v in source.epoch_starts_ms[-4:])
    evidence = [f"first batch of the last {len(source.epoch_starts_ms[-4:])} epochs: {shown} "
                f"(threshold {say_ms(EPOCH_START_SLOW_MS)} in each of the last "
                f"{EPOCH_START_EPOCHS})"]
    advice = []
    if config.num_workers and not config.persistent_workers:
        evidence.append(f"persistent_workers=False: {config.num_workers} workers are started "
                        f"anew each epoch ({config.worker_context or 'fork'})")
        advice.append("persistent_workers=True keeps the workers (and their open files and "
                      "caches) from one epoch to the next")
    if config.worker_context in ("spawn", "forkserver"):
        advice.append(f"each {config.worker_context} worker imports torch and your script's "
                      "modules again: keep the training script's top level light")
    advice.append("open files / build indexes lazily in the worker, not in the dataset's "
                  "__init__ or worker_init_fn, and cache what the next epoch needs again")
    return [finding("epoch_start_slow", "info", source.id, None,
                    f"each epoch's first batch takes {say_ms(recent[-1])}", evidence, advice)]
