"""`examples/train.py`, the README's example of an instrumented loop: it trains, ends when told, and
a `loadertop snapshot --json` beside it sees its `train` loader with figures that add up."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import REPO, START_TIMEOUT_S, check_document, clean_env, snapshot, wait_for

EXAMPLE = REPO / "examples" / "train.py"
BATCH_SIZE = 64
WORKERS = 2

pytestmark = pytest.mark.slow


def _train_source(wl) -> dict | None:
    """(document, the example's `train` source) once a snapshot saw it load a few batches, else
    None."""
    rc, doc, _out, err = snapshot(wl.dir, seconds=2)
    if not wl.alive():
        raise AssertionError(f"the example exited ({wl.proc.returncode}):\n{wl.stderr()[-3000:]}")
    if rc != 0:
        return None  # nothing received yet (the loaders are still starting)
    check_document(doc)
    train = [s for s in doc["sources"] if s["name"] == "train"]
    # a step is timed from a batch to the next request: a window holding the first batch alone has
    # batches but no step yet (seen in CI), so wait for a few
    return (doc, train[0]) if train and train[0]["batches"] >= 3 else None


def test_snapshot_sees_the_example_training(workload):
    wl = workload("--epochs", "1000", "--batch-size", BATCH_SIZE, "--workers", WORKERS, script=EXAMPLE)
    wl.wait_discovery()
    doc, src = wait_for(lambda: _train_source(wl), START_TIMEOUT_S, "the example's train source")

    assert src["pid"] == wl.pid and src["id"].endswith(":train")
    config = src["config"]
    assert (config["num_workers"], config["batch_size"], config["persistent_workers"]) == \
        (WORKERS, BATCH_SIZE, True)
    assert config["dataset"] == "SyntheticImages"
    assert src["state"] in ("running", "waiting")
    assert src["batches_per_s"] > 0
    # Full batches only (50 000 samples, a short last batch once an epoch at most).
    assert src["samples_per_s"] == pytest.approx(src["batches_per_s"] * BATCH_SIZE, rel=0.01)
    assert src["step_ms"]["p50"] > 0 and src["wait_ms"]["p50"] >= 0
    assert src["queue"]["capacity"] == WORKERS * config["prefetch_factor"]
    workers = src["workers"]
    assert sorted(w["id"] for w in workers) == list(range(WORKERS))
    assert all(w["alive"] and w["pid"] not in (None, wl.pid) for w in workers), workers
    assert src["diagnosis"]["category"] != "idle"
    assert doc["diagnosis"]["source"] in {s["id"] for s in doc["sources"]}


def test_the_example_ends_by_itself_after_its_steps(lt_dir):
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--epochs", "2", "--steps", "5"],
                          env=clean_env(lt_dir), capture_output=True, text=True, timeout=120,
                          cwd=REPO, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [int(re.match(r"epoch (\d+): train loss \d+\.\d+, val accuracy \d+\.\d%$", line).group(1))
            for line in lines] == [1, 2], proc.stdout
    assert not list(lt_dir.glob("*.json")), "the discovery entry outlived the process"
