"""`loadertop run` on the frameworks' own training loops (issue 50 §4): Hugging Face's `Trainer`
(transformers 5.x, its loaders made by accelerate 1.x around a batch sampler) and Lightning's
(its loaders made by the module's hooks, iterated ~16 frames inside Lightning). Each loader is
named as the program knows it and its batch size is known, so samples/s is too.

Real parts: the real packages (a tiny model built from a config, nothing downloaded), real
workers, a real viewer (Subscriber + Model); missing packages skip here and fail in CI.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from recorded import needed
from test_run import START_S, Viewer, by_name, jobs  # noqa: F401  (jobs: a fixture)

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
WATCH_S = START_S + 60.0  # transformers' or Lightning's import and first steps on a busy machine


def _needs(module: str) -> None:
    needed(importlib.util.find_spec(module), f"{module} is not installed (the `test` extra has it)")


def _counted(source: dict, batch_size: int) -> bool:
    rate = source["batches_per_s"]
    return source["config"]["batch_size"] == batch_size and bool(rate) and \
        source["samples_per_s"] == pytest.approx(rate * batch_size, abs=0.002)


def _watch(job, names: dict[str, int]) -> set[str]:
    """Every source name seen until each loader in `names` (name -> batch size) was seen counting
    (not necessarily at once: Lightning validates 2 batches between epochs)."""
    viewer = Viewer(directory=job.dir)
    seen: set[str] = set()
    counted: set[str] = set()

    def check(doc: dict) -> bool:
        seen.update(by_name(doc))
        counted.update(n for n, b in names.items()
                       if n in by_name(doc) and _counted(by_name(doc)[n], b))
        return counted == set(names)

    try:
        viewer.until(check, WATCH_S, f"sources {sorted(names)} counting at their batch sizes", job)
    finally:
        viewer.close()
    return seen


@pytest.mark.slow
def test_hugging_face_trainer_loaders_are_named_train_and_eval_and_counted(jobs):  # noqa: F811
    _needs("transformers")
    _needs("accelerate")
    job = jobs(["python", str(WORKLOADS / "hf_trainer.py"), "train-out", "--stop", "stop",  # job.stop's file
                "--eval-steps", "3"], env={"HF_HUB_OFFLINE": "1"})
    names = _watch(job, {"train_dataloader": 8, "eval_dataloader": 8})
    assert "base_dataloader" not in names and not any(n.startswith("loader") for n in names), names
    assert job.stop(timeout=60) == 0, job.stderr()[-3000:]


@pytest.mark.slow
def test_lightning_loaders_are_named_after_their_hooks_and_counted(jobs):  # noqa: F811
    _needs("lightning")
    job = jobs(["python", str(WORKLOADS / "lightning_fit.py"), "train-out", "--stop", "stop"])
    names = _watch(job, {"train_dataloader": 16, "val_dataloader": 16})
    assert not any(n.startswith("loader") for n in names), names
    assert job.stop(timeout=60) == 0, job.stderr()[-3000:]
