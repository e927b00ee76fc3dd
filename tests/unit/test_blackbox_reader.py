"""Reading a job's black box (docs/contract.md §9): merging its segments, how it ended (the OOM
killer inferred from a cgroup's counter or the last memory), `last`/pid resolution, `ls`, and
the messages that name the last ended job. Jobs here are files made with the real statedir meta
writer and the real recording writer, from the fakes' wire messages."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import msgspec
import pytest

from loadertop import statedir, wire
from loadertop.client import ending as ending_words
from loadertop.commands import ls as ls_command
from loadertop.commands import snapshot
from loadertop.recfile import RecordingWriter
from loadertop.recording import blackbox

from fakes import GIB, MIB, T0, LoaderSim, MachineSim, WorkerSim
from recorded import Recorder

HOST = statedir.hostname()
MY_TICKS = statedir.process_start_ticks(os.getpid())


@pytest.fixture
def state(private_state_dir) -> Path:
    return private_state_dir


def make_job(directory: Path, *, pid: int = 41234, started_at: float = T0 - 60, seconds: float = 30,
             alive: bool = False, ended: statedir.Ended | None = None,
             cgroups: list[statedir.CgroupAtStart] | None = None, loader: LoaderSim | None = None,
             machine: MachineSim | None = None, segments: int = 1,
             argv: tuple[str, ...] = ("python", "train.py")) -> statedir.Job:
    """A job's files: its meta and `segments` recording segments of `seconds` of reports each
    (consecutive, the last report of one repeated at the start of the next, as a rotation may)."""
    stem = statedir.stem_for(pid, started_at)
    if alive:  # this test process stands in for the job: same pid, same start tick
        pid = os.getpid()
        stem = statedir.stem_for(pid, started_at)
    # A job that ended: its pid with a start tick no process has (a pid may be reused).
    ticks = MY_TICKS if alive else 2**62
    meta = statedir.JobMeta(
        format=statedir.STATE_FORMAT, pid=pid, started_at=started_at,
        start_ticks=ticks, boot_id=statedir.boot_id(), host=HOST, argv=list(argv),
        cgroup_version=1 if cgroups else None, cgroups=cgroups or [],
        machine_memory_bytes=16 * GIB, ended=ended)
    statedir.write_meta(directory / f"{stem}{statedir.META_SUFFIX}", meta)
    loader = loader or LoaderSim(pid=meta.pid, host=HOST, started_at=started_at)
    machine = machine or MachineSim(host=HOST)
    start = started_at + 5
    for k in range(segments):
        path = directory / f"{stem}.{k:03d}{statedir.RECORDING_SUFFIX}"
        rec = Recorder(path, [loader], [machine], argv=list(argv))
        rec.run(start, start + seconds)
        start += seconds
        rec.writer.flush()  # a killed process: flushed, no end mark
        rec.writer._file.close()
    job = statedir.find_job(str(meta.pid), directory)
    assert job is not None and job.stem == stem
    return job


def test_segments_merge_in_time_order_and_overlapping_frames_are_read_once(state):
    job = make_job(state, segments=3, seconds=10)
    recording = blackbox.read_job(job)
    times = [f.received_at for f in recording.frames]
    assert times == sorted(times)
    assert len(times) == len(set(zip(times, (f.frame for f in recording.frames))))
    assert recording.duration_s == pytest.approx(30, abs=0.3)
    assert recording.job is job
    assert not recording.notes  # "no end mark" is what every live segment says: not a note here


def test_a_torn_segment_is_read_up_to_its_last_whole_record(state):
    job = make_job(state, seconds=20)
    whole = blackbox.read_job(job)
    path = job.recordings[-1]
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # the process killed mid-write
    torn = blackbox.read_job(job)
    assert 0 < len(torn.frames) <= len(whole.frames)
    assert torn.frames == whole.frames[: len(torn.frames)]


@pytest.mark.parametrize(("ended", "text"), [
    (statedir.Ended(kind="finished", at=T0, exit_code=0), "finished"),
    (statedir.Ended(kind="finished", at=T0, exit_code=3), "finished (exit code 3)"),
    (statedir.Ended(kind="exception", at=T0, exc_type="RuntimeError",
                    message="DataLoader worker (pid 4242) is killed by signal: Killed.",
                    frame="train.py:40 in main"),
     "exception: RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed."),
    (statedir.Ended(kind="signal", at=T0, signal="SIGTERM", recorded_by="launcher"), "signal: SIGTERM"),
])
def test_a_recorded_ending_is_said_as_the_contract_says(state, ended, text):
    job = make_job(state, ended=ended)
    assert blackbox.ending_of(job).text == text


def test_a_live_job_is_running(state):
    job = make_job(state, alive=True)
    assert job.alive()
    assert blackbox.ending_of(job).text == "running"


def test_no_goodbye_and_no_evidence_is_an_unknown_cause(state):
    job = make_job(state)
    ending = blackbox.ending_of(job, blackbox.read_job(job))
    assert ending.text == "killed: unknown cause"
    assert "died without a goodbye" in ending.sentence(job.pid)


def fake_cgroup(tmp_path: Path, oom_kills: int) -> str:
    cg = tmp_path / "cg"
    cg.mkdir(exist_ok=True)
    (cg / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kills}\n")
    return str(cg)


def test_the_cgroups_oom_kill_counter_risen_names_the_oom_killer(state, tmp_path):
    path = fake_cgroup(tmp_path, 0)
    limit = round(1.1 * GIB)
    job = make_job(state, cgroups=[statedir.CgroupAtStart(path=path, limit_bytes=limit, oom_kills=0)])
    assert blackbox.ending_of(job).text == "killed: unknown cause"  # not yet
    fake_cgroup(tmp_path, 1)
    ending = blackbox.ending_of(job)
    assert ending.text == "killed: SIGKILL (OOM killer: its cgroup's limit 1.1 GiB was reached)"
    assert ending.sentence(job.pid) == (f"pid {job.pid} died without a goodbye: killed by the OOM "
                                        "killer — its cgroup's limit 1.1 GiB was reached")


def test_a_sigkill_seen_by_run_s_launcher_is_still_judged_by_the_oom_evidence(state, tmp_path):
    # `loadertop run` saw its child die of SIGKILL: whether the OOM killer sent it is the question.
    path = fake_cgroup(tmp_path, 3)
    ended = statedir.Ended(kind="signal", at=T0, signal="SIGKILL", recorded_by="launcher")
    job = make_job(state, ended=ended,
                   cgroups=[statedir.CgroupAtStart(path=path, limit_bytes=round(1.1 * GIB), oom_kills=2)])
    assert blackbox.ending_of(job).text == ("killed: SIGKILL (OOM killer: its cgroup's limit 1.1 GiB "
                                            "was reached)")
    job = make_job(state, pid=41235, ended=ended)
    assert blackbox.ending_of(job, blackbox.read_job(job)).text == "killed: unknown cause"


def test_the_last_memory_near_the_limit_makes_the_oom_killer_likely(state, tmp_path):
    # The cgroup gone since (its counter unreadable): the last figures decide.
    gone = str(tmp_path / "no-such-cgroup")
    loader = LoaderSim(pid=41234, host=HOST, workers=[
        WorkerSim(rss_bytes=520 * MIB), WorkerSim(rss_bytes=530 * MIB)])
    job = make_job(state, loader=loader, cgroups=[
        statedir.CgroupAtStart(path=gone, limit_bytes=round(1.1 * GIB), oom_kills=0)])
    ending = blackbox.ending_of(job, blackbox.read_job(job))
    assert ending.text == ("killed: SIGKILL (OOM killer: likely — memory was at 1.03 GiB of the "
                           "cgroup's 1.1 GiB limit)")
    assert ending.oom == "likely"  # not counted: the cgroup is gone


def test_last_is_the_newest_ended_job_and_a_pid_its_newest_job(state):
    older = make_job(state, pid=11, started_at=T0 - 600, ended=statedir.Ended(kind="finished", at=T0 - 500))
    newer = make_job(state, pid=12, started_at=T0 - 300)
    make_job(state, alive=True, started_at=T0 - 10)  # running: never `last`
    assert blackbox.resolve("last").stem == newer.stem
    assert blackbox.resolve(str(older.pid)).stem == older.stem


def test_a_pid_with_no_job_is_one_line(state):
    with pytest.raises(blackbox.JobError) as caught:
        blackbox.resolve("999999999")
    assert str(caught.value) == (f"999999999: no such file, and no job with pid 999999999 in {state} "
                                 "(`loadertop ls`)")


def test_last_with_no_ended_job_is_one_line(state):
    with pytest.raises(blackbox.JobError, match=r"^last: no ended job in .*"):
        blackbox.resolve("last")


def test_ls_json_lists_jobs_newest_first_and_counts_bad_meta(state, capsys):
    make_job(state, pid=21, started_at=T0 - 900, ended=statedir.Ended(kind="finished", at=T0 - 800))
    make_job(state, pid=22, started_at=T0 - 300)
    (state / f"{statedir.stem_for(23, T0)}{statedir.META_SUFFIX}").write_text("{not json")
    assert ls_command.main(["--json"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert [r["ended"] for r in rows] == ["killed: unknown cause", "finished"]
    assert set(rows[0]) == {"pid", "host", "command", "started_at", "duration_s", "ended",
                            "worst_finding", "recording"}
    assert rows[0]["command"] == "python train.py"
    assert rows[0]["recording"].endswith(".ltrec")
    assert rows[1]["duration_s"] == 100.0
    assert err == f"loadertop: 1 job file in {state} could not be read (skipped)\n"
    assert ls_command.main([]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split() == ["PID", "STARTED", "DURATION", "ENDED", "WORST", "FINDING",
                                            "COMMAND"]
    assert "killed: unknown cause" in text


def test_ls_with_no_jobs_says_where_it_looked(state, capsys):
    assert ls_command.main([]) == 0
    assert capsys.readouterr().out == f"no jobs recorded in {state}\n"


def test_snapshot_from_last_leads_with_the_end(state, capsys):
    loader = LoaderSim(pid=41234, host=HOST, workers=[
        WorkerSim(), WorkerSim(alive=False, exitcode=-9, rss_bytes=None, cpu_percent=None)])
    make_job(state, loader=loader, ended=statedir.Ended(
        kind="exception", at=T0, exc_type="RuntimeError",
        message="DataLoader worker (pid 41245) is killed by signal: Killed."))
    assert snapshot.main(["--from", "last"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("pid 41234 (python train.py) · started ")
    assert first.endswith("ended: exception: RuntimeError: DataLoader worker (pid 41245) is killed "
                          "by signal: Killed.")
    assert "worker_died (worker 1)" in out
    assert "SIGKILL" in out
    assert "loadertop snapshot ·" in out  # then the usual report


def test_recording_commands_take_last_and_refuse_an_unknown_pid_in_one_line(state, capsys):
    from loadertop.commands import replay, report

    for command in (lambda a: snapshot.main(["--from", *a]), replay.main, report.main):
        assert command(["999999999"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no job with pid 999999999" in err


def test_the_no_process_message_names_the_last_ended_job(state, tmp_path, monkeypatch):
    from loadertop.commands.common import no_sources_message

    make_job(state, pid=31, ended=statedir.Ended(kind="signal", at=T0, signal="SIGTERM"))

    class NoSources:
        discover = True
        directory = tmp_path / "runtime"

    message = no_sources_message(NoSources())
    assert message.startswith("no instrumented process running; the last job, pid 31 "
                              "(python train.py), ended ")
    assert message.endswith(": signal: SIGTERM — loadertop snapshot --from last")
    assert "\n" not in message


def test_a_writer_closed_segment_is_read_too(state):
    # The process's last segment, closed at exit with the format's end mark.
    job = make_job(state, ended=statedir.Ended(kind="finished", at=T0))
    path = state / f"{job.stem}.999{statedir.RECORDING_SUFFIX}"
    writer = RecordingWriter(str(path), argv=["python", "train.py"], mode=0o600)
    loader = LoaderSim(pid=job.pid, host=HOST)
    writer.add(wire.encode(loader.report(T0 + 100, T0 + 100)), T0 + 100)
    writer.close()
    job = statedir.find_job(str(job.pid), state)
    assert job is not None
    recording = blackbox.read_job(job)
    assert recording.frames[-1].received_at == T0 + 100
    assert recording.end_reason == "stopped"


# ---- a live viewer: a late one starts from the history; a death is said at once ------------------


def cow_report(loader: LoaderSim, at: float, start: float) -> wire.LoaderReport:
    """A report of `loader` with its slow readings: both workers' USS climbing 1 MiB every 5 s
    while their RSS stays flat (copy-on-read, pytorch#13246)."""
    growth = round((at - start) / 5) * MIB
    resources = wire.ResourceReport(
        sampled_at=at, rss_bytes=2 * GIB, uss_bytes=2 * GIB, fds=40, fd_limit=1024, threads=12,
        workers=tuple(wire.WorkerResources(id=i, pid=loader.worker_pid(i), uss_bytes=60 * MIB + growth,
                                           pss_bytes=200 * MIB, rss_bytes=860 * MIB, fds=20, threads=5)
                      for i in range(2)))
    return msgspec.structs.replace(loader.report(at, at), resources=resources)


def test_a_late_viewer_starts_from_the_black_box_and_shows_copy_on_read_at_once(state):
    from loadertop.client.model import Model
    from loadertop.client.subscriber import Subscriber

    started = T0 - 600
    loader = LoaderSim(pid=os.getpid(), host=HOST, started_at=started,
                       workers=[WorkerSim(rss_bytes=860 * MIB), WorkerSim(rss_bytes=860 * MIB)])
    stem = statedir.stem_for(os.getpid(), started)
    statedir.write_meta(state / f"{stem}{statedir.META_SUFFIX}", statedir.JobMeta(
        format=statedir.STATE_FORMAT, pid=os.getpid(), started_at=started, start_ticks=MY_TICKS,
        boot_id=statedir.boot_id(), host=HOST, argv=["python", "train.py"]))
    writer = RecordingWriter(str(state / f"{stem}.000{statedir.RECORDING_SUFFIX}"), mode=0o600)
    for k in range(1, 60):  # ten minutes, decimated: one report every 10 s (the slow readings every 5 s)
        at = started + 10 * k
        writer.add(wire.encode(cow_report(loader, at, started)), at)
    writer.flush()
    sub = Subscriber(Model(window_s=3.0), [], discover=False, history=blackbox.BlackBoxHistory(),
                     clock=lambda: T0)
    try:
        live = cow_report(loader, T0, started)
        sub._seed(live, T0)
        sub.model.ingest(live, T0)
        doc = sub.model.advance(T0)
    finally:
        sub.close()
    assert [f.kind for f in doc.findings] == ["copy_on_read"]

    bare = Model(window_s=3.0)  # the same live report without the history: nothing to go on
    bare.ingest(cow_report(loader, T0, started), T0)
    assert bare.advance(T0).findings == ()


def test_a_viewer_says_at_once_that_its_trainer_died(state, tmp_path):
    from loadertop.client.model import Model
    from loadertop.client.subscriber import SILENT_S, Subscriber
    from loadertop.views.text import render_text

    path = fake_cgroup(tmp_path, 0)
    job = make_job(state, pid=41234, cgroups=[
        statedir.CgroupAtStart(path=path, limit_bytes=round(1.1 * GIB), oom_kills=0)])
    fake_cgroup(tmp_path, 1)  # the kernel's OOM killer took it
    now = [T0]
    sub = Subscriber(Model(window_s=3.0), [], discover=False, history=blackbox.BlackBoxHistory(),
                     clock=lambda: now[0])
    try:
        loader = LoaderSim(pid=job.pid, host=HOST)
        sub.model.ingest(loader.report(T0, T0), T0)
        sub._check_deaths()
        assert sub.model.advance(T0).sources[0].end is None  # not silent yet
        now[0] = T0 + SILENT_S
        sub._check_deaths()
        doc = sub.model.advance(now[0])
    finally:
        sub.close()
    src = doc.sources[0]
    said = ("pid 41234 died without a goodbye: killed by the OOM killer — its cgroup's limit "
            "1.1 GiB was reached")
    assert src.state == "gone" and src.end is not None and src.end.how == "died"
    assert src.end.error == said
    text = render_text(doc)
    assert "is the trainer running" not in text
    # The source's block says the job's end in the words `ls` says it with (one end per job)
    ended = "killed: SIGKILL (OOM killer: its cgroup's limit 1.1 GiB was reached)"
    assert src.end.ended == ended
    assert f"ended at {time.strftime('%H:%M:%S', time.localtime(T0))}: {ended}" in text
    assert [f.kind for f in doc.findings] == ["oom_killed"]
    assert doc.findings[0].summary == "the training process (pid 41234) was killed by the kernel's OOM killer"
    assert doc.findings[0].evidence == (said,)


def test_report_last_leads_with_the_end_and_replay_names_it(state, tmp_path):
    import importlib.util

    from loadertop.commands import report

    from recorded import needed

    needed(importlib.util.find_spec("matplotlib"),
           "matplotlib is not installed (pip install 'loadertop[report]')")
    job = make_job(state, ended=statedir.Ended(kind="signal", at=T0, signal="SIGTERM",
                                               recorded_by="launcher"))
    out = tmp_path / "last.html"
    assert report.main(["last", "-o", str(out)]) == 0
    page = out.read_text()
    assert page.index('<h2 id="end">How it ended</h2>') < page.index('id="source-')
    assert "ended: signal: SIGTERM" in page
    assert blackbox.replay_name(blackbox.read_job(job)) == "pid 41234 (python train.py) · signal: SIGTERM"


def test_the_screen_with_no_process_names_the_last_ended_job_in_its_header(state):
    from loadertop.commands.view import LAST_JOB_RECHECK_S, last_job_note

    class Sub:
        class model:
            sources: dict = {}

    clock = [0.0]
    note = last_job_note(Sub(), clock=lambda: clock[0])
    assert note() is None  # no job yet
    make_job(state, pid=51, ended=statedir.Ended(kind="finished", at=T0))
    assert note() is None  # looked up again only every LAST_JOB_RECHECK_S
    clock[0] += LAST_JOB_RECHECK_S
    said = note()
    assert said is not None and said.startswith("no instrumented process running; the last job, pid 51 ")
    assert said.endswith(" ago:\n  finished — loadertop snapshot --from last")
    Sub.model.sources = {"h:51:train": object()}
    assert note() is None  # a source shows: the screen is about it


def test_a_file_named_last_is_that_file(state, tmp_path, monkeypatch):
    from loadertop.commands.common import load_recording

    make_job(state, pid=61, ended=statedir.Ended(kind="finished", at=T0))
    monkeypatch.chdir(tmp_path)
    Path("last").write_bytes(b"not a recording")
    recording, error = load_recording("last")
    assert recording is None and error == "last: not a loadertop recording (make one with `loadertop record`)"


def test_the_machine_nearly_out_of_memory_makes_the_oom_killer_likely(state):
    machine = MachineSim(host=HOST, mem_total_bytes=16 * GIB, mem_available_bytes=GIB // 2)
    job = make_job(state, machine=machine)
    assert blackbox.ending_of(job, blackbox.read_job(job)).text == (
        "killed: SIGKILL (OOM killer: likely — memory was at 15.5 GiB of the machine's 16 GiB limit)")
    calm = make_job(state, pid=41235, started_at=T0 - 30)  # MachineSim's default: 88 GiB available
    assert blackbox.ending_of(calm, blackbox.read_job(calm)).text == "killed: unknown cause"


def test_a_snapshot_whose_trainer_died_before_it_delivered_says_how(state, tmp_path):
    from loadertop.client.model import Model
    from loadertop.client.subscriber import Subscriber

    make_job(state, pid=41234, ended=statedir.Ended(kind="exception", at=T0, exc_type="MemoryError"))
    endpoint = f"ipc://{tmp_path}/41234.sock"  # the pid's private socket, left behind
    sub = Subscriber(Model(window_s=3.0), [endpoint], discover=False, history=blackbox.BlackBoxHistory())
    try:
        assert sub.silent_deaths() == ["pid 41234 ended: exception: MemoryError"]
    finally:
        sub.close()


def test_the_end_of_a_run_is_read_from_its_recent_segments_alone(state):
    job = make_job(state, segments=2, seconds=10)
    first, second = job.recordings
    first.rename(first.with_name(f"{job.stem}.1-run{statedir.RECORDING_SUFFIX}"))
    second.rename(second.with_name(f"{job.stem}.1-recent-00001{statedir.RECORDING_SUFFIX}"))
    job = statedir.find_job(str(job.pid), state)
    assert job is not None
    whole = blackbox.read_job(job)
    recent = blackbox.read_job(job, recent_only=True)
    assert recent.frames == [f for f in whole.frames if f.received_at >= recent.frames[0].received_at]
    assert recent.duration_s == pytest.approx(10, abs=0.3) and whole.duration_s == pytest.approx(20, abs=0.3)


def test_a_command_is_said_on_one_line_and_never_as_terminal_controls(state):
    job = make_job(state, argv=("python", "-c", "import torch\nfor b in dl:\n    pass", "\x1b[2Jx"))
    assert blackbox.command_of(job) == "python -c import torch for b in dl: pass ?[2Jx"


# ---- one end per job (issue 50 §2): the same words on every screen --------------------------------


@pytest.mark.parametrize(("ending", "text"), [
    (ending_words.finished(T0, 128 + 15), "signal: SIGTERM"),  # a handler's SystemExit(143)
    (ending_words.finished(T0, 130), "signal: SIGINT"),
    (ending_words.finished(T0, 3), "finished (exit code 3)"),
    (ending_words.finished(T0, 255), "finished (exit code 255)"),  # 127 names no signal
    (ending_words.raised("SystemExit", "143"), "signal: SIGTERM"),
    (ending_words.raised("SystemExit", ""), "finished"),
    (ending_words.raised("SystemExit", "bye"), "finished (exit code 1)"),
    (ending_words.raised("KeyboardInterrupt", ""), "signal: SIGINT"),
    (ending_words.raised("RuntimeError", "boom\n  at x"), "exception: RuntimeError: boom at x"),
])
def test_an_end_is_said_in_one_set_of_words(ending, text):
    assert ending.text == text


def test_a_loop_stopped_by_a_signal_reads_as_the_signal_not_a_crash():
    from loadertop.client.model import Model
    from loadertop.views.text import render_text, shown_state

    from fakes import goodbye, loader_report

    model = Model(window_s=3.0)
    error = wire.LoopError(type="SystemExit", message="143", at=1_700_000_001.0)
    model.ingest(loader_report(error=error), 1_700_000_001.0)
    model.ingest(goodbye(error=error), 1_700_000_002.0)
    (src,) = model.advance(1_700_000_002.0).sources
    assert src.end is not None
    assert (src.end.how, src.end.ended, src.end.error) == ("stopped", "signal: SIGTERM", "SystemExit: 143")
    assert shown_state(src) == "stopped"
    text = render_text(model.document())
    assert "ended at " in text and text.count(": signal: SIGTERM") == 1
    assert "crashed" not in text


def test_a_job_stopped_by_sigterm_reads_the_same_in_its_header_its_blocks_and_ls(state, capsys):
    # `loadertop demo` then q (issue 50 §2): the job's SIGTERM handler raised SystemExit(143) as
    # its loop waited in next(); the probe saw it leave next() and recorded the exit code it
    # means (run's launcher, where there is one, records it too).
    loader = LoaderSim(pid=41234, host=HOST)
    job = make_job(state, loader=loader, ended=statedir.Ended(kind="finished", at=T0, exit_code=143))
    error = wire.LoopError(type="SystemExit", message="143", at=T0 - 29)
    writer = RecordingWriter(str(state / f"{job.stem}.999{statedir.RECORDING_SUFFIX}"), mode=0o600)
    writer.add(wire.encode(msgspec.structs.replace(loader.report(T0 - 29, T0 - 29), error=error)), T0 - 29)
    writer.add(wire.encode(wire.Goodbye(source=loader.source, seq=10**6, sent_at=T0 - 29,
                                        error=error)), T0 - 29)
    writer.close()
    assert ls_command.main(["--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["ended"] == "signal: SIGTERM"
    assert snapshot.main(["--from", "last"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("ended: signal: SIGTERM")
    blocks = [line for line in out.splitlines() if line.startswith("  ended at ")]
    assert blocks and all(line.endswith(": signal: SIGTERM") for line in blocks), out
    assert "crashed" not in out and "finished" not in out
    assert snapshot.main(["--from", "last", "--json"]) == 0
    (src,) = json.loads(capsys.readouterr().out)["sources"]
    assert (src["end"]["how"], src["end"]["ended"]) == ("stopped", "signal: SIGTERM")


def test_a_viewer_whose_trainer_said_goodbye_says_the_end_its_black_box_records(state):
    # The goodbye said "finished"; `run`'s launcher then recorded exit code 143 (SIGTERM, turned
    # into SystemExit by a handler in the training step): the viewer says what `ls` will say.
    from loadertop.client.model import Model
    from loadertop.client.subscriber import SILENT_S, Subscriber

    loader = LoaderSim(pid=41234, host=HOST)
    make_job(state, ended=statedir.Ended(kind="finished", at=T0, exit_code=143, recorded_by="process"))
    now = [T0]
    sub = Subscriber(Model(window_s=3.0), [], discover=False, history=blackbox.BlackBoxHistory(),
                     clock=lambda: now[0])
    try:
        sub.model.ingest(loader.report(T0, T0), T0)
        sub.model.ingest(wire.Goodbye(source=loader.source, seq=10**6, sent_at=T0), T0)
        assert sub.model.advance(T0).sources[0].end.ended == "finished"  # type: ignore[union-attr]
        now[0] = T0 + SILENT_S
        sub._check_deaths()
        (src,) = sub.model.advance(now[0]).sources
    finally:
        sub.close()
    assert src.end is not None and (src.end.how, src.end.ended) == ("stopped", "signal: SIGTERM")
    assert src.state == "finished"  # the document's state: it said goodbye (docs/contract.md §3)


def test_the_report_of_a_job_says_its_one_end(state, tmp_path):
    import importlib.util

    from loadertop.commands import report

    from recorded import needed

    needed(importlib.util.find_spec("matplotlib"),
           "matplotlib is not installed (pip install 'loadertop[report]')")
    make_job(state, ended=statedir.Ended(kind="finished", at=T0, exit_code=143, recorded_by="launcher"))
    out = tmp_path / "last.html"
    assert report.main(["last", "-o", str(out)]) == 0
    page = out.read_text()
    assert "ended: signal: SIGTERM" in page  # the lead, the file row and the source's block
    assert "ended: finished" not in page and ": finished<" not in page


# ---- snapshot --json with no live job (issue 50 §3) ---------------------------------------------


def test_snapshot_json_with_no_live_job_prints_a_document_naming_the_last_job(state, tmp_path,
                                                                              monkeypatch, capsys):
    from loadertop.client.document import decode_json

    monkeypatch.setenv("LOADERTOP_DIR", str(tmp_path / "runtime"))  # no job runs there
    make_job(state, pid=31, ended=statedir.Ended(kind="signal", at=T0, signal="SIGTERM"))
    assert ls_command.main(["--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert snapshot.main(["--json", "--seconds", "0.2"]) == 1  # as before: nothing live
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["sources"] == [] and doc["last_job"] == listed
    assert decode_json(out).last_job is not None  # the document's types hold it
    assert err.startswith("loadertop: no instrumented process running; the last job, pid 31 ")


def test_snapshot_json_with_no_job_at_all_says_null(state, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOADERTOP_DIR", str(tmp_path / "runtime"))
    assert snapshot.main(["--json", "--seconds", "0.2"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["sources"] == [] and doc["last_job"] is None
