"""`run --autotune` switching num_workers inside an epoch (docs/contract.md §10, docs/autotune.md
"Inside an epoch"): the loop gets exactly the batches it gets without --autotune.

The switches are forced where told (LOADERTOP_AUTOTUNE_SCHEDULE: at a batch of an epoch, to a
count, up and down), so what is judged does not depend on the machine's speed. The job
(`tests/workloads/autotune_jobs.py --compare`, forked by the zygote) runs its loader as written,
then under `instrument(loader, autotune=True)`, both from the same seed: every epoch's indices,
a digest of every batch's content in order, and a number the program draws from the global
generator after the epoch must be the same. With torchdata's StatefulDataLoader a state_dict
taken after every batch (before, during and after each switch) must load into the program as
written and give the rest of the epoch.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from test_autotune import run_job

from conftest import REPO, WORKLOADS, Workload, clean_env, short_tmpdir

pytestmark = pytest.mark.slow

JOB = WORKLOADS / "autotune_jobs.py"
# Only tells a hang from a slow run (spawned workers import torch at each start); under
# pytest-timeout's 120 s, so that a hang shows the job's own output.
TIMEOUT_S = 110.0
# 24 batches of 4 an epoch (reads of 1 ms through 8 slots): 2 -> 3 workers at batch 5 and -> 1 at
# batch 14 in epoch 0, and -> 2 at batch 6 in epoch 1 (the count epoch 0 ended with goes on).
FORK_SCHEDULE = "0:5:3,0:14:1,1:6:2"
# spawned workers each import torch before their first batch: one epoch, 1 -> 2 -> 1
SPAWN_SCHEDULE = "0:4:2,0:12:1"
JOB_ARGS = ("--slots", "8", "--samples", "96", "--batch-size", "4", "--read-ms", "1", "--shuffle")


def compare(*args: str, schedule: str) -> tuple[dict[str, list[dict]], str]:
    """The job's lines by run ("plain", "tuned", "resumed"), and its stderr."""
    directory = short_tmpdir()
    out = directory / "epochs.jsonl"
    job = Workload("--compare", *JOB_ARGS, *args, "--out", str(out), directory=directory,
                   script=JOB, env={"LOADERTOP_AUTOTUNE_SCHEDULE": schedule})
    try:
        assert job.wait(TIMEOUT_S) == 0, job.stderr()[-3000:]
        runs: dict[str, list[dict]] = {}
        for line in out.read_text().splitlines():
            entry = json.loads(line)
            runs.setdefault(entry["run"], []).append(entry)
        return runs, job.stderr()
    finally:
        job.kill()


def switches(stderr: str) -> int:
    found = re.search(r"autotune of 'loader0': .*, (\d+) switches inside epochs", stderr)
    assert found is not None, stderr
    return int(found.group(1))


@pytest.mark.parametrize("context, persistent", [
    ("fork", False), ("fork", True), ("spawn", False), ("spawn", True)],
    ids=["fork", "fork-persistent", "spawn", "spawn-persistent"])
def test_switches_inside_an_epoch_give_the_same_batches_and_random_stream(context, persistent):
    spawn = context == "spawn"
    args = ["--epochs", "1" if spawn else "2", "--workers", "1" if spawn else "2",
            *(["--spawn"] if spawn else []), *(["--persistent"] if persistent else [])]
    runs, stderr = compare(*args, schedule=SPAWN_SCHEDULE if spawn else FORK_SCHEDULE)
    plain, tuned = runs["plain"], runs["tuned"]
    assert switches(stderr) == (2 if spawn else 3)
    assert [e["num_workers"] for e in tuned] == ([1] if spawn else [1, 2])  # where each epoch ended
    assert {e["num_workers"] for e in plain} == {1 if spawn else 2}
    for p, t in zip(plain, tuned, strict=True):
        assert sorted(t["indices"]) == list(range(96))
        assert t["indices"] == p["indices"]
        assert t["digest"] == p["digest"]
        assert t["program_random"] == p["program_random"]  # the program's random stream


def test_with_in_order_false_every_batch_comes_once():
    """Batches come in the order their workers finish them (with or without the tuner): what
    holds is each of the epoch's batches exactly once."""
    runs, stderr = compare("--epochs", "2", "--workers", "2", "--out-of-order",
                           schedule=FORK_SCHEDULE)
    assert switches(stderr) == 3
    for p, t in zip(runs["plain"], runs["tuned"], strict=True):
        assert sorted(t["indices"]) == sorted(p["indices"]) == list(range(96))
        assert t["program_random"] == p["program_random"]


@pytest.mark.parametrize("persistent, every", [(False, 1), (True, 3)],
                         ids=["snapshot-every-batch", "persistent-snapshot-every-3"])
def test_a_state_dict_taken_around_a_switch_resumes_in_the_program_as_written(persistent, every):
    """torchdata asserts a state_dict's num_workers is the loader's: every one taken under the
    tuner, whatever its count, loads into the program's own 2 workers and gives the rest of the
    epoch exactly."""
    pytest.importorskip("torchdata.stateful_dataloader")
    runs, stderr = compare("--epochs", "1", "--workers", "2", "--stateful", "--snapshot-every",
                           str(every), *(["--persistent"] if persistent else []),
                           schedule="0:5:3,0:14:1")
    assert switches(stderr) == 2
    (plain,), (tuned,) = runs["plain"], runs["tuned"]
    assert tuned["indices"] == plain["indices"] and tuned["digest"] == plain["digest"]
    resumed = runs["resumed"]
    assert [r["at"] for r in resumed] == list(range(1, 25))
    for r in resumed:
        assert r["indices"] == plain["indices"][4 * r["at"]:], f"resumed after batch {r['at']}"


def test_under_run_the_switches_are_in_the_document_and_the_black_box(tmp_path):
    """`loadertop run --autotune` itself (the class-level patch, the black box): the same
    sequence as the program without it, and `snapshot --from last` lists each switch."""
    env = clean_env(short_tmpdir(), LOADERTOP_AUTOTUNE_SCHEDULE=FORK_SCHEDULE)
    job = ("--epochs", "2", "--workers", "2", *JOB_ARGS, "--persistent")
    tuned, stderr = run_job(tmp_path, *job, env=env)
    plain, _ = run_job(tmp_path, *job, autotune=False)
    assert [e["indices"] for e in tuned] == [e["indices"] for e in plain]
    assert [e["program_random"] for e in tuned] == [e["program_random"] for e in plain]
    assert "3 switches inside epochs" in stderr
    snapshot = subprocess.run([sys.executable, "-m", "loadertop", "snapshot", "--from", "last",
                               "--json"], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=60)
    assert snapshot.returncode == 0, snapshot.stderr
    tune = json.loads(snapshot.stdout)["sources"][0]["autotune"]
    assert tune["switch_count"] == 3 and tune["fixed"] is None
    assert [(s["epoch"], s["batch"], s["from"], s["to"]) for s in tune["switches"]] == [
        (0, 5, 2, 3), (0, 14, 3, 1), (1, 6, 1, 2)]
    assert all(s["reason"].startswith("scheduled") for s in tune["switches"])


@pytest.mark.parametrize("stop_at", [2, 5], ids=["armed", "handing-over"])
def test_a_loop_that_breaks_around_a_switch_keeps_no_iterator_or_worker_alive(monkeypatch, stop_at):
    """The loop drops its iterator while a switch is armed (its Trigger in the old iterator's
    sampler iterator) or under way (old and new iterators both live): with the garbage collector
    off, reference counting alone frees every torch iterator and torch's `__del__` ends every
    worker, as without --autotune."""
    import gc
    import weakref

    import torch
    from torch.utils.data import DataLoader

    import loadertop

    monkeypatch.setenv("LOADERTOP_AUTOTUNE_SCHEDULE", "0:4:3")
    loader = loadertop.instrument(DataLoader(torch.arange(64), batch_size=2, num_workers=2),
                                  name=f"breaks-{stop_at}", autotune=True)
    gc.disable()
    try:
        it = iter(loader)
        for _ in range(stop_at):
            next(it)
        switch = it._next if not hasattr(it._next, "__self__") else None
        inners = [weakref.ref(it._inner)]
        workers = list(it._inner._workers)
        if switch is not None:  # under way: the new iterator and its workers too
            assert switch.new is not None
            inners.append(weakref.ref(switch.new))
            workers += list(switch.new._workers)
            del switch
        assert len(inners) == (2 if stop_at == 5 else 1)
        del it
        assert [ref() for ref in inners] == [None] * len(inners)
        for w in workers:
            w.join(10)
            assert w.exitcode == 0
    finally:
        gc.enable()
