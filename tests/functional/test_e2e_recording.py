"""Recordings end to end: a real instrumented job, `loadertop record` and the TUI's `--record` as
real processes on the real sockets, then `snapshot --from` against what a live `snapshot --json`
said over the same seconds, and a recorder killed with SIGKILL mid-write."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time

import pytest

from loadertop.recording.file import read
from loadertop.recording.playback import Playback

from conftest import (
    ALIVE_S,
    REPO,
    SnapshotRun,
    check_document,
    clean_env,
    kill_group,
    loadertop_cmd,
    source_of,
    wait_for,
)

pytestmark = pytest.mark.slow

# Killed by the `workload` fixture once its test is done: 40 s, its former life, was shorter than
# the waits of the tests that watch it (60 s for its start, 30 s for each of their steps).
JOB = ("--kind", "sleep", "--ms", "4", "--workers", "2", "--batch-size", "8", "--step-ms", "8",
       "--duration", ALIVE_S)


def _run(directory, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(loadertop_cmd(*args), env=clean_env(directory), capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL)


def _frames(path) -> int:
    try:
        return len(read(str(path)).frames)
    except Exception:
        return 0


def _last_received(path) -> float:
    try:
        return read(str(path)).end or 0.0
    except Exception:
        return 0.0


def _tui_in_a_pty(directory, *args: str) -> tuple[subprocess.Popen, int]:
    """The live TUI in a real pseudo-terminal of 120×40 (its output read and dropped)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = clean_env(directory, TERM="xterm-256color")
    proc = subprocess.Popen(loadertop_cmd(*args), env=env, stdin=follower, stdout=follower,
                            stderr=follower, cwd=REPO, start_new_session=True)
    os.close(follower)
    os.set_blocking(leader, False)
    return proc, leader


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass


def _wait_draining(proc: subprocess.Popen, fd: int, timeout: float) -> int:
    """Wait for `proc` while reading its terminal: a full pty would block its last writes."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError("the TUI did not exit")
        select.select([fd], [], [], 0.1)
        _drain(fd)
    return proc.returncode


def test_a_recording_says_what_the_live_viewers_said(workload, tmp_path):
    job = workload(*JOB)
    job.wait_discovery()
    job.wait_batches(20)
    endpoint = job.entry()["endpoint"]
    recorded = tmp_path / "job.ltrec"
    tui_recorded = tmp_path / "tui.ltrec"
    recorder = subprocess.Popen(loadertop_cmd("record", "-o", str(recorded)),
                                env=clean_env(job.dir), cwd=REPO, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tui, tty = _tui_in_a_pty(job.dir, "--record", str(tui_recorded), endpoint)
    try:
        wait_for(lambda: _frames(recorded) >= 4, 30, "the recorder's first flushed frames")
        live = SnapshotRun(job.dir, seconds=3.0)
        doc = check_document(live.document())
        wait_for(lambda: (_drain(tty), _frames(tui_recorded) >= 12)[1], 30,
                 "the TUI's recording")
        wait_for(lambda: _last_received(recorded) >= doc.taken_at, 30,
                 "the recording to pass the live snapshot's moment")
    finally:
        recorder.send_signal(signal.SIGINT)  # Ctrl-C: a clean stop with an end mark
        tui.send_signal(signal.SIGTERM)  # what a closed terminal or `kill` does
        out, err = recorder.communicate(timeout=30)
        _wait_draining(tui, tty, 30)
        os.close(tty)
    assert recorder.returncode == 0, err
    assert "recorded " in err and "Traceback" not in err
    assert tui.returncode == 0

    rec = read(str(recorded))
    assert rec.end_reason == "stopped" and rec.notes == []
    tui_rec = read(str(tui_recorded))
    assert tui_rec.end_reason == "stopped" and tui_rec.endpoints == [endpoint]

    live_src = next(s for s in doc.sources if s.pid == job.pid)
    at = doc.taken_at - rec.start
    result = _run(job.dir, "snapshot", "--json", "--from", str(recorded), "--at", f"{at:.3f}")
    assert result.returncode == 0, result.stderr
    replayed_doc = check_document(json.loads(result.stdout), recent=False)
    src = next(s for s in replayed_doc.sources if s.pid == job.pid)
    # The same reports over the same seconds: the window's edge may take or leave one report
    # (0.25 s) differently in the two processes, and no more.
    assert src.config == live_src.config and src.name == live_src.name
    assert abs(src.batches - live_src.batches) <= max(3, 0.15 * live_src.batches)
    assert src.batches_per_s == pytest.approx(live_src.batches_per_s, rel=0.15)
    assert src.wait_ms.p50 == pytest.approx(live_src.wait_ms.p50, rel=0.25, abs=1.0)
    assert src.step_ms.p50 == pytest.approx(live_src.step_ms.p50, rel=0.1)
    assert [w.pid for w in src.workers] == [w.pid for w in live_src.workers]
    assert replayed_doc.diagnosis.category == doc.diagnosis.category
    assert replayed_doc.system is not None and replayed_doc.system.cpu_count == doc.system.cpu_count


def test_a_recorder_killed_mid_write_loses_at_most_its_last_second(workload, tmp_path):
    job = workload(*JOB)
    job.wait_discovery()
    recorded = tmp_path / "killed.ltrec"
    recorder = subprocess.Popen(loadertop_cmd("record", "-o", str(recorded)), env=clean_env(job.dir),
                                cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: _frames(recorded) >= 16, 30, "16 flushed frames")
        before = read(str(recorded))
        killed_at = time.time()
        os.kill(recorder.pid, signal.SIGKILL)
        recorder.wait(10)
    finally:
        kill_group(recorder)
    rec = read(str(recorded))
    assert [f.frame for f in rec.frames[:len(before.frames)]] == [f.frame for f in before.frames]
    assert rec.end_reason is None and any("no end mark" in n for n in rec.notes)
    # the probe reports every 0.25 s: what was received in the last second before the kill is
    # all that can be missing (the writer flushes every 0.5 s, the loop polls every 0.1 s)
    assert rec.end >= killed_at - 1.0
    # a tear inside the last record (a kill in the middle of a write) is skipped with a note
    torn = tmp_path / "torn.ltrec"
    data = recorded.read_bytes()
    torn.write_bytes(data[:-100])  # inside the last flush's compressed block
    for path in (recorded, torn):
        result = _run(job.dir, "snapshot", "--json", "--from", str(path))
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr and result.stderr.count("\n") <= 2, result.stderr
        doc = json.loads(result.stdout)
        check_document(doc, recent=False)
        assert source_of(doc, job.pid)["batches_total"] > 0
    report = _run(job.dir, "report", str(torn), "-o", str(tmp_path / "torn.html"))
    assert report.returncode == 0, report.stderr
    assert "cut off" in report.stderr and "Traceback" not in report.stderr
    assert "<svg" in (tmp_path / "torn.html").read_text()
    torn_rec = read(str(torn))
    assert len(rec.frames) - 3 <= len(torn_rec.frames) < len(rec.frames) and torn_rec.notes
    playback = Playback(torn_rec)  # what replay plays
    assert playback.document_at(playback.end).sources
