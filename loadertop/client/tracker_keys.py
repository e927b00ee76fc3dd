"""A source's figures as a tracker's flat scalars: the one mapping from the document to the keys
of W&B, TensorBoard, MLflow, Lightning's and Hugging Face's loggers (docs/contract.md §11).

    source_metrics(source, prefix_of(source))
    # {"loadertop/train/wait_fraction": 0.38, "loadertop/train/batches_per_s": 41.9, …,
    #  "loadertop/train/bottleneck/input_bound_io": 1.0, …, "loadertop/train/workers_alive": 4.0}

Keys are grouped the way trackers group them (the part before the last `/` is the chart's
section): `loadertop/<loader>/<figure>`. `loadertop export --tensorboard` writes these keys, and
`loadertop.metrics()` returns them, so a chart of one reads the same as the other's.

A figure the document does not know (None: a loader with no batch in the window, a stage that
could not be timed) is left out, never a made-up 0 (docs/contract.md §3); a tracker then draws a
gap. Each category has its key, 1.0 for the source's and 0.0 for the others, so a chart of one
category's key reads as the share of time the loader was in it.

Only the document's types: no torch, no textual, no sockets (both the training process and the
viewers import it).
"""

from __future__ import annotations

from typing import Final, get_args

from loadertop.client.document import Category, Source, Stats

ROOT: Final = "loadertop"
#: Every category of docs/contract.md §4, in its order (each has a `bottleneck/<category>` key).
CATEGORIES: Final[tuple[Category, ...]] = get_args(Category)
#: The states in which a source no longer reports: its workers' last readings are not news.
DOWN_STATES: Final = ("gone", "finished")
#: The figures, in the order a dict of them lists them (the categories' keys come between
#: `queue_ready_mean` and `workers_alive`).
FIGURES: Final = ("wait_fraction", "batches_per_s", "samples_per_s", "fetch_ms_p50",
                  "collate_ms_p50", "handoff_ms_p50", "num_workers", "queue_ready_mean",
                  *(f"bottleneck/{category}" for category in CATEGORIES), "workers_alive")


def prefix_of(source: Source) -> str:
    """The keys' prefix of one source: `loadertop/<loader>`."""
    return f"{ROOT}/{source.name}"


def _p50(stats: Stats | None) -> float | None:
    return None if stats is None else stats.p50


def source_metrics(source: Source, prefix: str) -> dict[str, float]:
    """The source's figures as `{prefix}/<figure>` keys (FIGURES, in that order), the unknown ones
    left out. `prefix` is the whole prefix, usually `prefix_of(source)`."""
    stages = source.stages
    known: tuple[tuple[str, float | None], ...] = (
        ("wait_fraction", source.wait_fraction),
        ("batches_per_s", source.batches_per_s),
        ("samples_per_s", source.samples_per_s),
        ("fetch_ms_p50", _p50(stages.fetch_ms)),
        ("collate_ms_p50", _p50(stages.collate_ms)),
        ("handoff_ms_p50", _p50(stages.handoff_ms)),
        ("num_workers", source.config.num_workers),
        ("queue_ready_mean", source.queue.ready_mean),
    )
    out = {f"{prefix}/{figure}": float(value) for figure, value in known if value is not None}
    current = source.diagnosis.category
    for category in CATEGORIES:
        out[f"{prefix}/bottleneck/{category}"] = 1.0 if category == current else 0.0
    up = source.state not in DOWN_STATES
    out[f"{prefix}/workers_alive"] = float(sum(1 for w in source.workers if up and w.alive))
    return out
