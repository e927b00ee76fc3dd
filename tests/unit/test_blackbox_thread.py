"""The black box's writer (loadertop/probe/blackbox.py) driven directly: real wire frames, real
files in a temporary state directory, the thread's steps called in order with chosen times."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from loadertop import statedir, wire
from loadertop.probe import blackbox
from loadertop.recording.file import read

from fakes import goodbye, loader_report, system_report


def _box(directory: Path, budget: int = blackbox.BUDGET_BYTES) -> blackbox.BlackBox:
    box = blackbox.BlackBox(directory, pid=os.getpid(), started_at=1_700_000_000.0, how="instrument",
                            budget=budget)
    box._open()
    return box


def _frames(directory: Path) -> list:
    seen, out = set(), []
    for path in sorted(directory.glob("*.ltrec")):
        for frame in read(str(path)).frames:
            key = (frame.received_at, frame.frame)
            if key not in seen:
                seen.add(key)
                out.append(frame)
    return sorted(out, key=lambda f: f.received_at)


def test_the_budget_holds_the_last_minutes_in_full_and_the_whole_run_decimated(tmp_path):
    budget = 96 * 1024
    box = _box(tmp_path, budget)
    t0 = 1_700_000_000.0
    seconds = 4 * 3600  # four hours of one loader's reports (4 a second) and the machine's (0.1)
    for i in range(seconds * 4):
        at = t0 + i * 0.25
        resources = wire.ResourceReport(sampled_at=at, rss_bytes=10**9 + i) if i % 20 == 0 else None
        msg = loader_report(seq=i, sent_at=at, batches_total=i * 10, resources=resources)
        box._queue.append((at, wire.encode(msg), msg))
        if i % 40 == 0:
            sysmsg = system_report(seq=i, sent_at=at)
            box._queue.append((at, wire.encode(sysmsg), sysmsg))
        if i % 8 == 7:  # a flush every 2 s of the run
            box._write_queued()
            box._flush()
    box._write_queued()
    box._flush()
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    # within the budget, give or take what one flush adds to each open segment
    assert total <= budget + 2 * 4096, (total, sorted(p.name for p in tmp_path.iterdir()))
    assert box.every_s > blackbox.DECIMATE_S  # the run's file was thinned to stay in its share
    segments = sorted(tmp_path.glob("*-recent-*.ltrec"))
    assert 1 <= len(segments) <= blackbox.RECENT_SEGMENTS + 1
    reports = [wire.decode(f.frame) for f in _frames(tmp_path)]
    loader = [m for m in reports if isinstance(m, wire.LoaderReport)]
    # the whole run: from its first minutes to its end...
    assert loader[0].sent_at - t0 < 3600 and loader[-1].seq == seconds * 4 - 1
    # ...and its last stretch in full: every report, none missing
    tail = [m.seq for m in loader[-200:]]
    assert tail == list(range(tail[0], tail[0] + 200))
    # the decimated part keeps the reports with the slow readings (the memory trends)
    early = [m for m in loader if m.sent_at < loader[-1].sent_at - 3600]
    assert early and sum(m.resources is not None for m in early) >= 0.9 * len(early)
    assert any(isinstance(m, wire.SystemReport) for m in reports)


def test_files_are_private_and_the_meta_says_who_and_how_it_ended(tmp_path):
    directory = tmp_path / "state"
    box = _box(directory)
    msg = loader_report()
    box._queue.append((1_700_000_001.0, wire.encode(msg), msg))
    box._write_queued()
    box._ended = statedir.Ended(kind="finished", at=1_700_000_002.0)
    box._close()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for path in directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    (job,) = statedir.list_jobs(directory).jobs
    assert job.meta.pid == os.getpid() and job.meta.how == "instrument"
    assert job.meta.budget_bytes == blackbox.BUDGET_BYTES and job.meta.ended is not None
    assert job.meta.ended.kind == "finished" and len(job.recordings) == 2
    assert all(read(str(p)).end_reason == "exit" for p in job.recordings)


def test_an_uncaught_exception_names_the_users_innermost_frame(monkeypatch):
    def users_step():
        import json

        json.loads("{not json")  # the standard library's frames are not the user's

    try:
        users_step()
    except ValueError as exc:
        caught = exc
    monkeypatch.setattr(sys, "last_value", caught, raising=False)
    monkeypatch.setattr(sys, "last_traceback", caught.__traceback__, raising=False)
    ended = blackbox.how_it_ended()
    assert ended.kind == "exception" and ended.exc_type == "JSONDecodeError"
    assert ended.message and ended.message.startswith("Expecting property name")
    assert ended.frame is not None and ended.frame.endswith("in users_step")
    assert "test_blackbox_thread.py:" in ended.frame
    monkeypatch.setattr(sys, "last_value", SystemExit(3), raising=False)
    assert (blackbox.how_it_ended().kind, blackbox.how_it_ended().exit_code) == ("finished", 3)


def test_a_system_exit_out_of_next_is_the_exit_code_the_process_ends_with(tmp_path, monkeypatch):
    # A SIGTERM handler raising SystemExit(143) while the loop waits for a batch (issue 50 §2):
    # CPython keeps an uncaught SystemExit nowhere atexit can read, but the goodbye carried it.
    monkeypatch.delattr(sys, "last_value", raising=False)
    box = _box(tmp_path)
    error = wire.LoopError(type="SystemExit", message="143", at=1_700_000_001.0)
    bye = goodbye(error=error)
    box.add(wire.encode(bye), bye)
    box.finish()
    assert box._ended is not None and (box._ended.kind, box._ended.exit_code) == ("finished", 143)
    assert blackbox.how_it_ended().exit_code is None  # no such exception: the code is not known


def test_a_state_dir_it_cannot_use_turns_it_off_with_one_line(tmp_path, capsys):
    blocker = tmp_path / "state"
    blocker.write_text("a file where the directory should be")
    box = blackbox.BlackBox(blocker, pid=os.getpid(), started_at=1_700_000_000.0, how="run")
    box._main()  # the thread's body, here: it fails at once
    msg = loader_report()
    box.add(wire.encode(msg), msg)
    assert not box.on and not box._queue
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("loadertop: the black box is off: cannot write to")


@pytest.mark.parametrize("raw, expected", [("", blackbox.BUDGET_BYTES), ("0.5", 512 * 1024),
                                           ("x", blackbox.BUDGET_BYTES), ("-1", blackbox.BUDGET_BYTES)])
def test_the_budget_can_be_set_in_mib(raw, expected):
    assert blackbox.budget_bytes({"LOADERTOP_BLACKBOX_MIB": raw}) == expected


def test_the_thread_imports_nothing(tmp_path, capsys):
    """A fork while another thread imports leaves the import lock held in the child: everything the
    black box's thread runs (its start, writes, rotation, thinning, end and failure) must already
    be imported by the module itself."""
    code = f"""
import os, sys
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
from loadertop import wire
from loadertop.probe import blackbox
from fakes import goodbye, loader_report, system_report
box = blackbox.BlackBox(Path({str(tmp_path / "state")!r}), pid=os.getpid(), started_at=1.7e9,
                        how="run", budget=20000)
messages = [loader_report(seq=i, sent_at=1.7e9 + i) for i in range(3000)] + [system_report()]
before = set(sys.modules)
box._open()
for i, m in enumerate(messages):
    box._queue.append((1.7e9 + i * 0.25, wire.encode(m), m))
    if i % 8 == 0:
        box._write_queued()
        box._flush()
box._ended = blackbox.how_it_ended()
box._close()
box._fail(OSError(28, "No space left on device"))
print(sorted(set(sys.modules) - before))
"""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=env, check=True).stdout
    assert out.strip() == "[]"


def test_a_hang_of_hours_is_thinned_too_and_never_at_every_flush(tmp_path):
    """Every report of a hung loop carries its stack (notable: kept more often); the run's file
    still stays in its share, and a thinning is not repeated at each flush."""
    budget = 64 * 1024
    box = _box(tmp_path, budget)
    t0 = 1_700_000_000.0
    stack = wire.Stack(frames=("train.py:10 in main", "lt_data.py:91 in hang_forever"), user_frame=0)
    flushes = 0
    for i in range(6 * 3600 * 4):  # six hours
        at = t0 + i * 0.25
        msg = loader_report(seq=i, sent_at=at, loop_stack=stack, blocked_ms=i * 250.0)
        box._queue.append((at, wire.encode(msg), msg))
        if i % 8 == 7:
            box._write_queued()
            box._flush()
            flushes += 1
    box._write_queued()
    box._flush()
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert total <= budget + 2 * 4096 + budget // 4, total
    assert 1 <= box.thinnings <= 12, (box.thinnings, flushes)
    reports = [wire.decode(f.frame) for f in _frames(tmp_path)]
    assert reports[0].sent_at - t0 < 3600 and reports[-1].loop_stack is not None
