"""The black box in real jobs (docs/contract.md §9): every instrumented process keeps its own
recording in the state directory, with no viewer; how the run ended; a disk it cannot use; a
process killed mid-write; a hang nobody watched."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loadertop import statedir, wire
from loadertop.recording.file import RecordingError, read

from conftest import REPO, START_TIMEOUT_S, short_tmpdir, wait_for

STATE = "LOADERTOP_STATE_DIR"


@pytest.fixture
def state():
    directory = short_tmpdir() / "state"
    yield directory
    shutil.rmtree(directory.parent, ignore_errors=True)


def _job(directory: Path, pid: int) -> statedir.Job:
    return next(job for job in statedir.list_jobs(directory).jobs if job.meta.pid == pid)


def _messages(job: statedir.Job) -> list:
    """Every frame of every segment of the job, read once, oldest first, decoded."""
    seen, frames = set(), []
    for path in sorted(job.meta_path.parent.glob(f"{job.stem}.*.ltrec")):
        for frame in read(str(path)).frames:
            if (frame.received_at, frame.frame) not in seen:
                seen.add((frame.received_at, frame.frame))
                frames.append(frame)
    frames.sort(key=lambda f: f.received_at)
    return [wire.decode(f.frame) for f in frames]


def test_a_job_nobody_watched_keeps_a_private_recording_with_its_memory_and_its_end(workload, lt_dir,
                                                                                    state):
    w = workload("--kind", "cheap", "--workers", "2", "--batch-size", "1", "--step-ms", "2",
                 "--stop-when-told", "--duration", START_TIMEOUT_S, directory=lt_dir,
                 env={STATE: str(state), "LOADERTOP_RESOURCE_S": "1"})

    def _worker_memory(reports) -> tuple[bool, bool]:
        return (any(wk.rss_bytes for m in reports for wk in m.workers),
                any(r.resources is not None and any(wr.uss_bytes for wr in r.resources.workers)
                    for r in reports))

    def memory_recorded() -> bool:
        jobs = [j for j in statedir.list_jobs(state).jobs if j.meta.pid == w.pid]
        return bool(jobs) and all(_worker_memory(
            [m for m in _messages(jobs[0]) if isinstance(m, wire.LoaderReport)]))

    # The job runs until its black box holds the workers' memory (the slow readings begin
    # BLACKBOX_TOOLS_AFTER_S into the run), then ends as told: a run of a fixed 5 s left them to
    # whatever a loaded machine let the publisher thread do in it.
    wait_for(memory_recorded, START_TIMEOUT_S, "the workers' RSS and USS in the black box",
             interval=0.5)
    w.tell("stop")
    assert w.wait(START_TIMEOUT_S) == 0, w.stderr()
    assert "black box" not in w.stderr()
    job = _job(state, w.pid)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for path in state.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    meta = job.meta
    assert meta.ended is not None and meta.ended.kind == "finished", meta.ended
    assert meta.how == "instrument" and meta.budget_bytes and job.size_bytes() <= meta.budget_bytes
    assert meta.start_ticks and meta.boot_id and not job.alive()
    for cgroup in meta.cgroups:  # where the machine has a memory cgroup: its OOM count at start
        assert cgroup.path.startswith("/sys/fs/cgroup")
    assert all(read(str(p)).end_reason == "exit" for p in job.recordings)
    messages = _messages(job)
    reports = [m for m in messages if isinstance(m, wire.LoaderReport) and m.name == "train"]
    assert reports[-1].batches_total == w.status()["batches"]
    assert any(isinstance(m, wire.Goodbye) for m in messages)
    # what the findings need, taken with no viewer: the workers' RSS and USS, their liveness
    assert _worker_memory(reports) == (True, True), "no worker RSS or USS recorded"


def test_off_writes_nothing(workload, lt_dir, state):
    w = workload("--kind", "cheap", "--workers", "0", "--duration", "1", directory=lt_dir,
                 env={STATE: str(state), "LOADERTOP_BLACKBOX": "0"})
    assert w.wait(START_TIMEOUT_S) == 0, w.stderr()
    assert not state.exists()


def test_a_state_dir_it_cannot_create_turns_it_off_with_one_line_and_training_goes_on(workload, lt_dir,
                                                                                       state):
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text("a file where the directory should be")
    w = workload("--kind", "cheap", "--workers", "2", "--duration", "1", directory=lt_dir,
                 env={STATE: str(state)})
    assert w.wait(START_TIMEOUT_S) == 0, w.stderr()
    assert w.status()["phase"] == "done"
    lines = [line for line in w.stderr().splitlines() if line.startswith("loadertop:")]
    assert len(lines) == 1 and "the black box is off: cannot write to" in lines[0], w.stderr()


def test_a_disk_that_fills_up_mid_run_turns_it_off_with_one_line(workload, lt_dir, state):
    state.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k,mode=0700", "tmpfs", str(state)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        # three files of a page each fill it; the recording outgrows its page as it goes: the
        # job runs until that is said, then is told to stop (a run of a fixed 6 s left it to how
        # much a loaded machine let the black box write in it)
        w = workload("--kind", "cheap", "--workers", "0", "--batch-size", "1", "--stop-when-told",
                     "--duration", START_TIMEOUT_S, directory=lt_dir, env={STATE: str(state)})
        wait_for(lambda: "the black box is off" in w.stderr() or not w.alive(), START_TIMEOUT_S,
                 "the black box to fill its disk")
        w.tell("stop")
        assert w.wait(START_TIMEOUT_S) == 0, w.stderr()
        assert w.status()["phase"] == "done"
        lines = [line for line in w.stderr().splitlines() if line.startswith("loadertop:")]
        assert len(lines) == 1 and "the black box is off" in lines[0], w.stderr()
        assert "No space left on device" in lines[0]
    finally:
        subprocess.run(["umount", "-l", str(state)], capture_output=True)


def test_an_uncaught_exception_is_recorded_with_the_users_frame(workload, lt_dir, state):
    w = workload("--kind", "cheap", "--workers", "0", "--duration", "0.5", "--end", "raise",
                 directory=lt_dir, env={STATE: str(state)})
    assert w.wait(START_TIMEOUT_S) == 1
    assert w.stderr().rstrip().endswith("SystemError: workload ends with an exception")  # unchanged
    ended = _job(state, w.pid).meta.ended
    assert ended is not None and ended.kind == "exception", ended
    assert ended.exc_type == "SystemError" and ended.message == "workload ends with an exception"
    assert ended.frame is not None and "train.py:" in ended.frame and ended.frame.endswith("in main")


def test_a_job_killed_mid_write_is_read_up_to_its_last_whole_frame(workload, lt_dir, state, tmp_path):
    w = workload("--kind", "cheap", "--workers", "0", "--batch-size", "1", "--duration", "60",
                 directory=lt_dir, env={STATE: str(state)})

    def some_frames():
        jobs = [j for j in statedir.list_jobs(state).jobs if j.meta.pid == w.pid]
        if jobs and jobs[0].recordings:
            recent = [p for p in jobs[0].recordings if "-recent-" in p.name]
            try:  # a segment is renamed into place with its header: always a recording
                return recent and len(read(str(recent[-1])).frames) >= 8 and recent[-1]
            except RecordingError as exc:
                raise AssertionError(f"a segment without its header: {exc}") from None
        return None

    segment = wait_for(some_frames, START_TIMEOUT_S, "the black box's first flushes")
    w.kill()  # SIGKILL: no goodbye, no end mark, maybe a flush cut short
    whole = read(str(segment))
    assert whole.frames and whole.end_reason is None
    assert any("no end mark" in note or "cut off" in note for note in whole.notes)
    assert _job(state, w.pid).meta.ended is None
    # a write torn anywhere in its last stretch: everything before the tear is read
    data = segment.read_bytes()
    torn = tmp_path / "torn.ltrec"
    previous = None
    for cut in range(len(data), len(data) - 1500, -37):
        torn.write_bytes(data[:cut])
        rec = read(str(torn))
        assert all(wire.decode(f.frame) for f in rec.frames)
        assert previous is None or len(rec.frames) <= previous
        assert len(rec.frames) >= len(whole.frames) - 8
        previous = len(rec.frames)


def test_a_hang_nobody_watched_leaves_the_loops_and_the_workers_stacks(workload, lt_dir, state):
    w = workload("--kind", "hang", "--after", "3", "--workers", "1", "--batch-size", "1",
                 "--duration", "120", directory=lt_dir, env={STATE: str(state)})

    def stacks():
        jobs = [j for j in statedir.list_jobs(state).jobs if j.meta.pid == w.pid]
        if not jobs:
            return None
        reports = [m for m in _messages(jobs[0]) if isinstance(m, wire.LoaderReport)]
        loop = next((r.loop_stack for r in reversed(reports) if r.loop_stack), None)
        worker = next((wk.stack for r in reversed(reports) for wk in r.workers if wk.stack), None)
        return loop and worker and (loop, worker)

    loop, worker = wait_for(stacks, 45, "the hang's stacks in the black box", interval=0.5)
    assert any("in hang_forever" in frame for frame in worker.frames), worker.frames
    assert any("train.py" in frame for frame in loop.frames), loop.frames


RUN_CHILD = textwrap.dedent("""
    import glob, os, signal, time, torch
    from torch.utils.data import DataLoader, TensorDataset
    for i, batch in enumerate(DataLoader(TensorDataset(torch.arange(64.0)), batch_size=4)):
        if i == 8:
            # The black box's thread writes the job's meta soon after the first loader starts;
            # under load that may be after batch 8: die only once it is there to be completed.
            pattern = os.path.join(os.environ["LOADERTOP_STATE_DIR"], f"*-{os.getpid()}.job.json")
            deadline = time.monotonic() + 60
            while not glob.glob(pattern) and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGABRT)  # its default action: no atexit, no goodbye
""")


def test_run_records_the_signal_its_child_died_of(lt_dir, state):
    env = {**os.environ, "LOADERTOP_DIR": str(lt_dir), STATE: str(state), "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "loadertop", "run", "-q", "--", sys.executable, "-c",
                          RUN_CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 128 + 6, res.stderr
    (job,) = statedir.list_jobs(state).jobs
    assert job.meta.how == "run"
    ended = job.meta.ended
    assert ended is not None and ended.kind == "signal" and ended.signal == "SIGABRT"
    assert ended.recorded_by == "launcher"
