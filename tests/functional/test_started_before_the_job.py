"""Viewers started before the training job (issue 37): a script or CI starts `loadertop snapshot`,
`record` or `export` in the same breath as the job, which registers in the discovery directory
only at its first instrumented iter(), seconds later (import torch, the dataset). Each must pick
the job up when it appears and report it from then on, within its window.

Real processes on real sockets. The snapshot's and the recorder's jobs are made ready first (torch
imported, the dataset made: train.py --start-when-told) and told to start once the viewer is
running: what falls in the viewer's window is the job's registration and first reports, not its
imports, which a loaded machine makes as long as it likes.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from loadertop import wire
from loadertop.recording.file import read

from conftest import (
    REPO,
    SnapshotRun,
    clean_env,
    kill_group,
    loadertop_cmd,
    wait_for,
)

pytestmark = pytest.mark.slow

JOB_AFTER_S = 1.5  # the job starts this long after the viewer (which finds nothing meanwhile)
SECONDS = 4.0
JOB = ("--kind", "sleep", "--ms", 2, "--workers", 1, "--batch-size", 4, "--step-ms", 10,
       "--duration", 30)


def _has_imported_zmq(pid: int) -> bool:
    """The viewer process has loaded pyzmq: it is past its imports, a few ms from its first look
    at the discovery directory (Linux: its memory map)."""
    try:
        return "zmq" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _ready_job(workload, directory: Path):
    """The job, its imports done and its dataset made, waiting for the word to start."""
    job = workload(*JOB, "--start-when-told", directory=directory)
    job.wait_status(lambda st: st["phase"] == "ready", what="the job to be ready")
    return job


def _start_job_after(job, started: float, ready) -> float:
    """Once `ready()` (the viewer runs, or has ended) and JOB_AFTER_S after `started`: the job
    told to start; the wall time just before it was told."""
    wait_for(lambda: ready() and time.monotonic() - started >= JOB_AFTER_S, 30,
             "the viewer to start")
    before = time.time()
    job.tell("start")
    return before


def test_snapshot_started_before_the_job_reports_it_from_when_it_appeared(workload, lt_dir):
    directory = lt_dir
    job = _ready_job(workload, directory)
    run = SnapshotRun(directory, seconds=SECONDS)
    try:
        job_started = _start_job_after(
            job, time.monotonic(), lambda: run.proc.poll() is not None or _has_imported_zmq(run.proc.pid))
        rc, doc, _out, err = run.result()
        assert rc == 0, f"snapshot exited {rc}: {err}"
        entry = job.wait_discovery(timeout=1)  # it registered, within the window
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
    assert job_started < entry["written_at"] < doc["taken_at"]
    (src,) = [s for s in doc["sources"] if s["pid"] == job.pid]
    assert src["batches"] > 0 and src["batches_total"] > 0
    assert doc["window_s"] == SECONDS
    # Reported from the moment it appeared: its figures cover the part of the window after its
    # registration (one report of 0.25 s may predate the entry's write by a little).
    print(f"registered {entry['written_at'] - job_started:.2f} s after its start, "
          f"{doc['taken_at'] - entry['written_at']:.2f} s before the window's end; "
          f"reported over {src['window_s']} s")
    assert 0 < src["window_s"] <= doc["taken_at"] - entry["written_at"] + 0.3, \
        (src["window_s"], doc["taken_at"] - entry["written_at"])


def test_record_started_before_the_job_records_it_to_the_end(workload, lt_dir, tmp_path):
    directory = lt_dir
    recorded = tmp_path / "late.ltrec"
    err_path = tmp_path / "record.err"
    job = _ready_job(workload, directory)
    started = time.monotonic()
    with open(err_path, "wb") as err_file:
        recorder = subprocess.Popen(
            loadertop_cmd("record", "-o", str(recorded), "--seconds", f"{SECONDS:g}"),
            env=clean_env(directory), cwd=REPO, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=err_file)
    try:
        # Its first line is printed once it has looked at the directory (and found nothing).
        _start_job_after(job, started, lambda: recorder.poll() is not None
                         or b"recording every" in err_path.read_bytes())
        rc = recorder.wait(SECONDS + 30)
    finally:
        if recorder.poll() is None:
            recorder.kill()
            recorder.wait()
    err = err_path.read_text()
    assert rc == 0, err
    entry = job.wait_discovery(timeout=1)
    rec = read(str(recorded))
    assert rec.end_reason == "seconds" and rec.notes == []
    assert rec.endpoints == [entry["endpoint"]]
    ours = [f for f in rec.frames
            if isinstance(msg := wire.decode(f.frame), wire.LoaderReport) and msg.pid == job.pid]
    assert ours, f"no report of pid {job.pid} in {len(rec.frames)} frames: {err}"
    # Picked up soon after it registered (the directory is looked at every 0.1 s while nothing
    # is found; a report every 0.25 s), and recorded until the recorder's --seconds ran out.
    assert entry["written_at"] - 0.3 <= ours[0].received_at <= entry["written_at"] + 1.0
    assert ours[-1].received_at >= rec.end - 0.5
    assert "recorded " in err and "from 1 source " in err and "Traceback" not in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metrics(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read().decode()
    except (OSError, urllib.error.URLError):
        return None


def test_export_started_before_the_job_serves_it(workload, lt_dir):
    directory = lt_dir
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    exporter = subprocess.Popen(loadertop_cmd("export", "--listen", f"127.0.0.1:{port}"),
                                env=clean_env(directory), cwd=REPO, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
    try:
        def serving():
            if exporter.poll() is not None:
                raise AssertionError(f"export exited {exporter.returncode}: "
                                     f"{exporter.stderr.read().decode()}")
            return _metrics(url)
        first = wait_for(serving, 30, "export to serve /metrics", interval=0.05)
        assert "loadertop_source_up{" not in first  # nothing to serve yet
        job = workload(*JOB, directory=directory)
        up = f'pid="{job.pid}"'
        body = wait_for(lambda: (b := serving()) and any(
            line.startswith("loadertop_source_up{") and up in line and line.endswith(" 1.0")
            for line in b.splitlines()) and b, 30, f"pid {job.pid} in /metrics")
        assert any(line.startswith("loadertop_batches_total{") and up in line
                   for line in body.splitlines())
        exporter.send_signal(signal.SIGTERM)
        assert exporter.wait(30) == 0
    finally:
        kill_group(exporter)
        exporter.stderr.close()
