"""After the fact (issue 39, docs/contract.md §9): real jobs end badly with no viewer — a worker
SIGKILLed, the trainer killed by the kernel's OOM killer inside a memory cgroup the test makes —
and `loadertop snapshot --from last`, `ls --json` and a pid name what happened from the job's
own black box; a viewer that watches a trainer SIGKILLed says so at once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import WORKLOADS, Workload, loadertop_cmd, short_tmpdir, wait_for

pytestmark = pytest.mark.slow

OOM_JOB = WORKLOADS / "blackbox_jobs.py"


@pytest.fixture
def state() -> Path:
    return short_tmpdir() / "state"


def loadertop(state: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, LOADERTOP_STATE_DIR=str(state))
    return subprocess.run(loadertop_cmd(*args), env=env, capture_output=True, text=True, timeout=timeout)


def test_a_worker_sigkilled_with_no_viewer_is_named_afterwards(state):
    job = Workload("--kind", "sleep", "--ms", "2", "--workers", "2", "--batch-size", "4",
                   "--kill-worker-after", "150", "--crash", env={"LOADERTOP_STATE_DIR": str(state)})
    try:
        assert job.wait(60) != 0
    finally:
        job.kill()
    out = loadertop(state, "snapshot", "--from", "last")
    assert out.returncode == 0, out.stderr
    first, *rest = out.stdout.splitlines()
    assert first.startswith(f"pid {job.pid} (")
    # torch says it one of two ways, depending on which of its checks saw the death first
    assert re.search(r"ended: exception: RuntimeError: DataLoader worker \(pid(\(s\))? \d+\) (is killed "
                     r"by signal: Killed\.|exited unexpectedly)", first), first
    assert re.search(r"^  worker 0 \(pid \d+\) was killed by SIGKILL", rest[0]), out.stdout
    by_pid = loadertop(state, "snapshot", "--from", str(job.pid))
    assert by_pid.returncode == 0 and by_pid.stdout == out.stdout
    listed = loadertop(state, "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["pid"] == job.pid and row["ended"].startswith("exception: RuntimeError: DataLoader worker")
    assert row["recording"].startswith(str(state))


def _memory_cgroup() -> tuple[Path, int] | None:
    """A fresh memory cgroup under this process's own (v1 or v2), or None where none can be made."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    name = f"lt-oom-{uuid.uuid4().hex[:8]}"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            parent, version = Path("/sys/fs/cgroup/memory") / path.lstrip("/"), 1
            break
    else:
        parent, version = Path("/sys/fs/cgroup") / next(
            (entry.split(":", 2)[2] for entry in lines if entry.startswith("0::")), "/").lstrip("/"), 2
    try:
        group = parent / name
        group.mkdir()
    except OSError:
        return None
    try:
        if version == 1:
            (group / "memory.limit_in_bytes").write_text(str(300 * 1024 * 1024))
            (group / "memory.swappiness").write_text("0")
        else:
            (group / "memory.max").write_text(str(300 * 1024 * 1024))
            (group / "memory.swap.max").write_text("0")
    except OSError:
        group.rmdir()
        return None
    return group, version


def test_the_trainer_killed_by_the_oom_killer_is_named_so(state):
    made = _memory_cgroup()
    if made is None:
        pytest.skip("no memory cgroup can be created here")
    group, version = made
    try:
        env = dict(os.environ, LOADERTOP_STATE_DIR=str(state), PYTHONUNBUFFERED="1")
        procs = group / "cgroup.procs"

        def enter_the_cgroup() -> None:
            procs.write_text(str(os.getpid()))

        proc = subprocess.run([sys.executable, str(OOM_JOB), "oom"], env=env, capture_output=True,
                              text=True, timeout=90, preexec_fn=enter_the_cgroup)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        out = loadertop(state, "snapshot", "--from", "last")
        assert out.returncode == 0, out.stderr
        first, second = out.stdout.splitlines()[:2]
        assert first.endswith("ended: killed: SIGKILL (OOM killer: its cgroup's limit 300 MiB was reached)")
        assert second.endswith("died without a goodbye: killed by the OOM killer — its cgroup's limit "
                               "300 MiB was reached")
        (row,) = json.loads(loadertop(state, "ls", "--json").stdout)
        assert row["ended"] == "killed: SIGKILL (OOM killer: its cgroup's limit 300 MiB was reached)"
    finally:
        for _ in range(50):  # the killed job's last pages are uncharged asynchronously
            try:
                group.rmdir()
                break
            except OSError:
                wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), 5, "an empty cgroup")


def _unix_sockets_at(path: str) -> int:
    """How many unix sockets are bound to `path`: its listener, and one per accepted connection."""
    with open("/proc/net/unix") as f:
        return sum(1 for line in f if line.rstrip("\n").endswith(" " + path))


def test_a_viewer_watching_a_trainer_sigkilled_says_so_at_once(state):
    job = Workload("--kind", "sleep", "--ms", "5", "--workers", "1", "--batch-size", "2",
                   "--duration", "60", env={"LOADERTOP_STATE_DIR": str(state)})
    try:
        job.wait_batches(20)
        socket_path = job.wait_discovery()["endpoint"].removeprefix("ipc://")
        env = dict(job.env, LOADERTOP_STATE_DIR=str(state))
        viewer = subprocess.Popen(loadertop_cmd("snapshot", "--seconds", "6"), env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Connected: the trainer's socket has accepted a peer (a second entry of its path).
        wait_for(lambda: _unix_sockets_at(socket_path) >= 2, 30, "the viewer's connection")
        connected = job.status()["batches"]
        # ~1 s of batches (5 ms each): reports (every 0.25 s) have reached the viewer.
        wait_for(lambda: job.status().get("batches", 0) >= connected + 200, 30, "200 more batches")
        job.send(signal.SIGKILL)
        out, err = viewer.communicate(timeout=30)
    finally:
        job.kill()
    assert viewer.returncode == 0, err
    assert f"pid {job.pid} died without a goodbye" in out, out
    assert "is the trainer running" not in out + err
    assert re.search(r"· died · ", out), out


def test_a_hang_nobody_watched_then_killed_leads_with_its_stack(state):
    from loadertop import statedir, wire
    from loadertop.diagnosis import STALL_MIN_MS
    from loadertop.recording import blackbox

    # 40 quick batches, then a batch that never comes: hung past the stall threshold (5 s with
    # that history, diagnosis/thresholds.py) with no viewer.
    job = Workload("--kind", "hang", "--after", "40", "--workers", "1", "--batch-size", "1",
                   "--duration", "120", env={"LOADERTOP_STATE_DIR": str(state)})

    def hung_past_the_threshold() -> bool:
        found = [j for j in statedir.list_jobs(state).jobs if j.meta.pid == job.pid]
        if not found or not found[0].recordings:
            return False
        for frame in blackbox.read_job(found[0]).frames:
            msg = wire.decode(frame.frame)
            if isinstance(msg, wire.LoaderReport) and any(
                    w.stack and (w.busy_ms or 0) > STALL_MIN_MS for w in msg.workers):
                return True
        return False

    try:
        wait_for(hung_past_the_threshold, 45, "the hang's stacks in the black box", interval=0.5)
        job.send(signal.SIGKILL)  # the scheduler's time limit, in the morning
        job.wait(30)
    finally:
        job.kill()
    out = loadertop(state, "snapshot", "--from", "last")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].endswith("ended: killed: unknown cause"), lines[0]
    lead = "\n".join(lines[: lines.index("")])
    assert "worker_hung (worker 0)" in lead and "in hang_forever" in lead, lead
    assert re.search(r"train\.py:\d+ in main  ◀ your code", lead), lead  # the loop's own frame
