"""Loader figures where people already look (issue 48, docs/trackers.md): Lightning's callback
through its TensorBoard and CSV loggers, Hugging Face's through the Trainer's `report_to`
TensorBoard, and `wandb.log(loadertop.metrics())` from a plain loop, W&B offline — each read back
with the tracker's own reader (TensorBoard's EventAccumulator, the CSV file, wandb's records).

Real parts: the real frameworks and trackers, real workers; missing packages skip here and fail in
CI (`LOADERTOP_CI`). Jobs are started afresh (not forked by the zygote: these import frameworks
the zygote never imported). Small models, few steps, 2 workers: each test a few seconds of CPU.
"""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

from loadertop.client.tracker_keys import FIGURES

from conftest import WORKLOADS, SnapshotRun, Workload, short_tmpdir, wait_for
from recorded import needed
from tensorboard_runs import scalars
from wandb_runs import history

DONE_S = 180.0  # a framework's import and its steps, on a loaded 2-core machine


def _needs(*modules: str) -> None:
    for module in modules:
        needed(importlib.util.find_spec(module), f"{module} is not installed (the `test` extra has it)")


def _figures(keys, loader: str, prefix: str = "loadertop") -> set[str]:
    """The figures logged for `loader` among `keys` (`<prefix>/<loader>/<figure>`)."""
    head = f"{prefix}/{loader}/"
    return {k[len(head):] for k in keys if k.startswith(head)}


def _finished(job: Workload) -> str:
    assert job.wait(DONE_S) == 0, job.stderr()[-3000:]
    assert "Traceback" not in job.stderr(), job.stderr()[-3000:]
    return job.stdout()


@pytest.mark.slow
def test_lightning_callback_logs_through_tensorboard_and_csv_at_lightning_s_steps():
    _needs("lightning", "tensorboard")
    directory = short_tmpdir()
    out = directory / "fit"
    job = Workload(str(out), "--loggers", "tensorboard,csv", "--callback", "--stop",
                   str(directory / "stop"), "--log-every", "2", directory=directory,
                   script=WORKLOADS / "lightning_fit.py", fresh=True)
    # A snapshot of the same job while it fits: its figures and the logged ones are one computation.
    wait_for(lambda: job.entry() is not None or not job.alive(), DONE_S, "the job's publisher")
    taken: list[dict] = []

    def both_loaders_seen() -> bool:
        assert job.alive(), job.stderr()[-3000:]
        taken.append(SnapshotRun(directory, seconds=2.0).document())
        names = {s["name"]: s for s in taken[-1]["sources"]}
        return "val_dataloader" in names and bool(names.get("train_dataloader", {}).get("batches"))

    wait_for(both_loaders_seen, DONE_S, "a snapshot of both loaders, the training one iterating")
    doc = taken[-1]
    (directory / "stop").write_text("")
    _finished(job)

    rows = list(csv.DictReader((out / "csv" / "version_0" / "metrics.csv").open()))
    ours = [r for r in rows if r.get("loadertop/train_dataloader/wait_fraction")]
    assert len(ours) >= 2, rows[-3:]
    lightning_steps = {r["step"] for r in rows if r.get("loss")}
    assert {r["step"] for r in ours} <= lightning_steps
    run = next((out / "tb").glob("version_*"))
    tb = scalars(run)
    assert {step for step, _, _ in tb["loadertop/train_dataloader/wait_fraction"]} == \
        {int(r["step"]) for r in ours}
    logged = _figures(tb, "train_dataloader")
    assert logged <= set(FIGURES) and {"num_workers", "workers_alive", "batches_per_s"} <= logged
    assert _figures(tb, "val_dataloader")  # the validation loader too, named after its hook

    sources = {s["name"]: s for s in doc["sources"]}
    assert set(sources) == {"train_dataloader", "val_dataloader"}
    train = sources["train_dataloader"]
    known = {f for f in FIGURES if not f.startswith("bottleneck/")} - {"workers_alive"}
    snapshot_figures = {"wait_fraction": train["wait_fraction"],
                        "batches_per_s": train["batches_per_s"],
                        "samples_per_s": train["samples_per_s"],
                        "fetch_ms_p50": (train["stages"]["fetch_ms"] or {}).get("p50"),
                        "collate_ms_p50": (train["stages"]["collate_ms"] or {}).get("p50"),
                        "handoff_ms_p50": (train["stages"]["handoff_ms"] or {}).get("p50"),
                        "num_workers": train["config"]["num_workers"],
                        "queue_ready_mean": train["queue"]["ready_mean"]}
    assert set(snapshot_figures) == known
    # every figure the snapshot knew was logged, and the settings read the same
    assert {f for f, v in snapshot_figures.items() if v is not None} <= logged
    last = {k.split("/", 2)[2]: v for k, v in ours[-1].items() if k.startswith("loadertop/train_") and v}
    assert float(last["num_workers"]) == train["config"]["num_workers"] == 2
    assert float(last["samples_per_s"]) == pytest.approx(16 * float(last["batches_per_s"]), abs=0.01)
    assert train["samples_per_s"] == pytest.approx(16 * train["batches_per_s"], abs=0.01)
    assert sum(float(v) for k, v in last.items() if k.startswith("bottleneck/")) == 1.0
    texts = tb_texts(run)
    assert texts and texts[0].split("  ")[0].isupper(), texts  # the banner's words, in capitals


def tb_texts(run: Path) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run), size_guidance={"tensors": 0})
    accumulator.Reload()
    tags = [t for t in accumulator.Tags()["tensors"] if t.startswith("loadertop/verdict")]
    return [e.tensor_proto.string_val[0].decode() for t in tags for e in accumulator.Tensors(t)]


@pytest.mark.slow
def test_transformers_callback_s_figures_reach_report_to_tensorboard_not_the_console():
    _needs("transformers", "accelerate", "tensorboard")
    directory = short_tmpdir()
    out = directory / "hf"
    job = Workload(str(out), "--steps", "40", "--report-to", "tensorboard", "--callback",
                   "--logging-steps", "2", "--eval-steps", "15", "--sample-ms", "10",
                   directory=directory, script=WORKLOADS / "hf_trainer.py", fresh=True,
                   env={"HF_HUB_OFFLINE": "1"})
    stdout = _finished(job)
    assert "done 40" in stdout
    assert "loadertop/" not in stdout  # taken out before the console's printer
    (run,) = (out / "runs").iterdir()
    tb = scalars(run)
    # transformers' TensorBoardCallback prefixes the training logs' keys with `train/`
    loaders = {k.split("/")[2] for k in tb if k.startswith("train/loadertop/")}
    assert loaders == {"train_dataloader", "eval_dataloader"}  # one source for every evaluation
    logged = _figures(tb, "train_dataloader", "train/loadertop")
    assert {"num_workers", "workers_alive", "batches_per_s", "samples_per_s"} <= logged
    trainer_steps = {s for s, _, _ in tb["train/loss"]} | {s for s, _, _ in tb["eval/loss"]}
    ours = {s for s, _, _ in tb["train/loadertop/train_dataloader/num_workers"]}
    assert ours and ours <= trainer_steps
    for (_, rate, _), (_, samples, _) in zip(tb["train/loadertop/train_dataloader/batches_per_s"],
                                             tb["train/loadertop/train_dataloader/samples_per_s"]):
        assert samples == pytest.approx(8 * rate, rel=1e-3, abs=0.01)  # batch 8: samples/s known


@pytest.mark.slow
def test_wandb_log_of_loadertop_metrics_from_a_plain_loop_offline():
    _needs("wandb")
    directory = short_tmpdir()
    job = Workload(str(directory), "--logged", "10", directory=directory,
                   script=WORKLOADS / "wandb_loop.py", fresh=True, env={"WANDB_MODE": "offline"})
    steps, with_figures = map(int, _finished(job).split()[1:3])
    assert with_figures == 10
    (run_dir,) = (directory / "wandb").glob("offline-run-*")
    rows = history(run_dir)
    assert len(rows) == steps and all("loss" in r for r in rows)
    ours = [r for r in rows if "loadertop/train/wait_fraction" in r]
    assert len(ours) == 10
    last = ours[-1]
    assert last["loadertop/train/num_workers"] == 2 and last["loadertop/train/workers_alive"] == 2
    assert last["loadertop/train/samples_per_s"] == pytest.approx(
        8 * last["loadertop/train/batches_per_s"], abs=0.01)
    assert sum(v for k, v in last.items() if k.startswith("loadertop/train/bottleneck/")) == 1


def test_a_tracker_that_fails_costs_one_line_on_stderr_and_nothing_more(capsys):
    """A real CSVLogger whose directory cannot be made (its parent is a file): the callback's
    writes to it fail, once said, and return; a logger that takes no text is given none."""
    _needs("lightning")
    from lightning.pytorch.loggers import CSVLogger

    from loadertop.integrations.loggers import TrackerWriter

    directory = short_tmpdir()
    (directory / "a-file").write_text("")
    logger = CSVLogger(str(directory / "a-file" / "logs"))
    writer = TrackerWriter("the Lightning callback")
    for step in range(3):
        writer.call(logger, "log_metrics", {"loadertop/train/wait_fraction": 0.5}, step=step)
        writer.text(logger, "loadertop/verdict", "HEALTHY: COMPUTE-BOUND", step)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("loadertop: the Lightning callback: CSVLogger.log_metrics failed "
                             "(NotADirectoryError(") and err[0].endswith("the training goes on without it")
