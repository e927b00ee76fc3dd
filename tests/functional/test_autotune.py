"""`loadertop run --autotune` end to end (docs/contract.md §10): a plain torch job with no loadertop
import (`tests/workloads/autotune_jobs.py`), whose storage serves SLOTS reads at once, so that
samples/s grow with num_workers up to SLOTS and stay flat after.

- started at 2 workers, it settles within EPOCH_BUDGET epochs on a count at the knee (every count
  from SLOTS on is the best static setting there is: the store serves no more);
- every epoch yields each sample index exactly once, in the sampler's order (a shuffled run gives
  the same sequence as the same job without --autotune), with persistent workers and without,
  forked and spawned;
- an IterableDataset is told about at start; the exit line says where each loader settled.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import REPO, WORKLOADS, clean_env, short_tmpdir, wait_for

pytestmark = pytest.mark.slow

PY = sys.executable
JOB = str(WORKLOADS / "autotune_jobs.py")
SLOTS = 4
EPOCH_BUDGET = 9  # 2 epochs pooled per count: 2, 4, 6 climbing, 3 refining, then the pick
# Only tells a hang from a slow run (spawned workers import torch at each start); under
# pytest-timeout's 120 s, so that a hang shows the job's own output.
TIMEOUT_S = 110.0


def run_job(tmp: Path, *args: str, autotune: bool = True, env: dict[str, str] | None = None,
            launcher: bool = True, cgroup: Path | None = None) -> tuple[list[dict], str]:
    out = tmp / "epochs.jsonl"
    run = [PY, "-m", "loadertop", "run", "-q", *(["--autotune"] if autotune else []), "--"]
    command = [*(run if launcher else []), PY, JOB, "--out", str(out), *args]
    procs = cgroup / "cgroup.procs" if cgroup is not None else None

    def enter_the_cgroup() -> None:
        if procs is not None:
            procs.write_text(str(os.getpid()))

    proc = subprocess.run(command, env=env or clean_env(short_tmpdir()), cwd=REPO,
                          capture_output=True, text=True, timeout=TIMEOUT_S,
                          stdin=subprocess.DEVNULL, preexec_fn=enter_the_cgroup)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in out.read_text().splitlines()], proc.stderr


def test_a_job_started_at_two_workers_settles_at_the_knee_within_the_budget(tmp_path):
    epochs, stderr = run_job(tmp_path, "--epochs", str(EPOCH_BUDGET + 1), "--workers", "2",
                             "--slots", str(SLOTS), "--samples", "320", "--read-ms", "5",
                             "--persistent")
    counts = [e["num_workers"] for e in epochs]
    assert counts[:2] == [2, 2], counts  # the program's own count is measured first
    assert max(counts) > 2, counts
    assert SLOTS <= counts[EPOCH_BUDGET] <= SLOTS + 2, counts
    for e in epochs:
        assert sorted(e["indices"]) == list(range(320))
    line = re.search(r"autotune of 'loader': settled on num_workers=(\d+) \((\d+) samples/s, "
                     r"\+(\d+)% over the program's 2\)", stderr)
    assert line is not None, stderr
    assert SLOTS <= int(line.group(1)) <= SLOTS + 2
    assert int(line.group(3)) >= 40  # the store serves twice the reads of 2 workers


@pytest.mark.parametrize("options", [(), ("--persistent", "--spawn"), ("--instrument",)],
                         ids=["fork", "spawn-persistent", "instrument-autotune"])
def test_every_epoch_yields_each_index_once(tmp_path, options):
    """(Forked persistent workers: the next test.) `instrument(loader, autotune=True)` tunes
    without `run`."""
    # spawned workers each import torch: start from 1 (then 3) to keep the test short
    start = "1" if "--spawn" in options else "2"
    epochs, _ = run_job(tmp_path, "--epochs", "3", "--workers", start, "--slots", "8",
                        "--samples", "48", "--read-ms", "4", "--shuffle", *options,
                        launcher="--instrument" not in options)
    assert len({e["num_workers"] for e in epochs}) == 2  # the program's count measured, then another
    for e in epochs:
        assert sorted(e["indices"]) == list(range(48))


def test_restarted_persistent_workers_keep_the_samplers_order_and_the_programs_random_stream(
        tmp_path):
    """torch draws a new iterator's worker seed from the generator the shuffle uses (the global
    one here): the restart must not, or every later epoch's order would shift."""
    job = ("--epochs", "4", "--workers", "2", "--slots", "8", "--samples", "64", "--read-ms", "4",
           "--shuffle", "--persistent")
    tuned, _ = run_job(tmp_path, *job)
    plain, stderr = run_job(tmp_path, *job, autotune=False)
    assert "autotune" not in stderr
    assert len({e["num_workers"] for e in tuned}) >= 2
    assert {e["num_workers"] for e in plain} == {2}  # without --autotune nothing changes
    for e in tuned:
        assert sorted(e["indices"]) == list(range(64))
    assert [e["indices"] for e in tuned] == [e["indices"] for e in plain]
    assert [e["program_random"] for e in tuned] == [e["program_random"] for e in plain]


def test_an_iterable_dataset_is_told_about_at_start_and_the_black_box_keeps_the_decisions(
        tmp_path):
    env = clean_env(short_tmpdir())
    epochs, stderr = run_job(tmp_path, "--epochs", "4", "--workers", "2", "--samples", "64",
                             "--read-ms", "2", "--iterable", env=env)
    assert "IterableDataset" in stderr and "should not use --autotune" in stderr
    assert stderr.count("IterableDataset") == 1
    for e in epochs:
        assert sorted(e["indices"]) == list(range(64))  # this dataset shards by worker id
    snapshot = subprocess.run([PY, "-m", "loadertop", "snapshot", "--from", "last", "--json"],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert snapshot.returncode == 0, snapshot.stderr
    tune = json.loads(snapshot.stdout)["sources"][0]["autotune"]
    assert tune["program_num_workers"] == 2 and tune["state"] in ("exploring", "settled")
    assert [t["num_workers"] for t in tune["tried"]][:2] == [2, 4]
    assert tune["tried"][0]["epochs"] == 2 and tune["tried"][0]["samples_per_s"] > 0
    assert tune["best"]["num_workers"] in (2, 4) and tune["reason"]


def _v1_memory_cgroup(limit_mib: int) -> Path | None:
    """A fresh v1 memory cgroup under this process's own (as test_blackbox_endings makes one), or
    None where none can be made."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        path = next(line.split(":", 2)[2] for line in lines
                    if "memory" in line.split(":", 2)[1].split(","))
        group = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / f"lt-at-{uuid.uuid4().hex[:8]}"
        group.mkdir()
    except (OSError, StopIteration):
        return None
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_mib * 1024 * 1024))
        (group / "memory.swappiness").write_text("0")
    except OSError:
        group.rmdir()
        return None
    return group


def _remove(group: Path) -> None:
    for _ in range(50):  # the last pages are uncharged asynchronously
        try:
            group.rmdir()
            return
        except OSError:
            wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), 5, "an empty cgroup")


def test_memory_pressure_backs_off_at_once_and_that_count_is_never_tried_again(tmp_path):
    """From worker id 2 on, the job's workers fill its memory cgroup to 93 %: the epoch at 4
    workers ends under the 10 % margin, so the tuner goes back to 2 and never tries 4 (or more)."""
    group = _v1_memory_cgroup(1024)
    if group is None:
        pytest.skip("no v1 memory cgroup can be created here")
    try:
        epochs, stderr = run_job(tmp_path, "--epochs", "5", "--workers", "2", "--slots", "8",
                                 "--samples", "48", "--read-ms", "4", "--persistent",
                                 "--fill-cgroup-from-worker", "2", cgroup=group)
    finally:
        _remove(group)
    counts = [e["num_workers"] for e in epochs]
    assert counts == [2, 2, 4, 2, 2], (counts, stderr)
    assert "settled on num_workers=2" in stderr


def test_more_workers_whose_memory_would_pass_the_margin_are_never_tried(tmp_path):
    """Each worker holds 200 MiB of its own: in a 1200 MiB cgroup, 6 workers cannot fit at all.
    Without the cgroup this job climbs to 6 and beyond (its store serves 16 reads at once); the
    tuner predicts a count's memory from its workers' USS before it tries it, so the climb stops
    below, and no count ever presses memory (a back-off would note it "memory")."""
    group = _v1_memory_cgroup(1200)
    if group is None:
        pytest.skip("no v1 memory cgroup can be created here")
    env = clean_env(short_tmpdir())
    try:
        epochs, stderr = run_job(tmp_path, "--epochs", "10", "--workers", "2", "--slots", "16",
                                 "--samples", "320", "--read-ms", "5", "--persistent",
                                 "--worker-ballast-mib", "200", env=env, cgroup=group)
    finally:
        _remove(group)
    counts = [e["num_workers"] for e in epochs]
    assert max(counts) >= 3 and max(counts) < 6, (counts, stderr)
    snapshot = subprocess.run([PY, "-m", "loadertop", "snapshot", "--from", "last", "--json"],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert snapshot.returncode == 0, snapshot.stderr
    tune = json.loads(snapshot.stdout)["sources"][0]["autotune"]
    assert all(t["note"] is None for t in tune["tried"]), tune
