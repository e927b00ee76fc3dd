"""After the fact (issue 39, docs/contract.md §9): real jobs end badly with no viewer — a worker
SIGKILLed, the trainer killed by the kernel's OOM killer inside a memory cgroup the test makes —
and `loadertop snapshot --from last`, `ls --json` and a pid name what happened from the job's
own black box; a viewer that watches a trainer SIGKILLed says so at once."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from workloads.recorded_job import holds_a_report

from conftest import ALIVE_S, WORKLOADS, Workload, loadertop_cmd, short_tmpdir, wait_for

pytestmark = pytest.mark.slow

JOBS = WORKLOADS / "blackbox_jobs.py"


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


OOM_LIMIT_BYTES = 300 * 1024 * 1024


def _make_memory_cgroup() -> tuple[Path, int] | None:
    """A fresh memory cgroup under this process's own (v1 or v2), limited to OOM_LIMIT_BYTES with
    no swap, or None where none can be made."""
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
            (group / "memory.limit_in_bytes").write_text(str(OOM_LIMIT_BYTES))
            (group / "memory.swappiness").write_text("0")
        else:
            (group / "memory.max").write_text(str(OOM_LIMIT_BYTES))
            (group / "memory.swap.max").write_text("0")
    except OSError:
        group.rmdir()
        return None
    return group, version


def remove_cgroup(group: Path) -> None:
    """What a container runtime, Kubernetes or Slurm does as a job ends: its cgroup removed, once
    nothing runs in it (what still does, this test's own job, is killed first)."""
    if not group.exists():
        return
    procs = group / "cgroup.procs"
    for pid in procs.read_text().split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not procs.read_text().strip(), 30, "an empty cgroup")

    def removed() -> bool:
        try:
            group.rmdir()  # EBUSY for a moment: a killed job's last pages are uncharged asynchronously
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    wait_for(removed, 30, f"the removal of {group}", interval=0.1)


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A fresh memory cgroup limited to OOM_LIMIT_BYTES (skipped where none can be made), removed
    afterwards whatever the test's outcome."""
    made = _make_memory_cgroup()
    if made is None:
        pytest.skip("no memory cgroup can be created here")
    group, _ = made
    try:
        yield group
    finally:
        remove_cgroup(group)


def _in(group: Path):
    procs = group / "cgroup.procs"

    def enter_the_cgroup() -> None:  # in the child, before exec: all it starts is in it too
        procs.write_text(str(os.getpid()))

    return enter_the_cgroup


def test_the_trainer_killed_by_the_oom_killer_is_named_so(state, memory_cgroup):
    env = dict(os.environ, LOADERTOP_STATE_DIR=str(state), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(JOBS), "oom"], env=env, capture_output=True,
                          text=True, timeout=120, preexec_fn=_in(memory_cgroup))
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    out = loadertop(state, "snapshot", "--from", "last")
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()[:2]
    assert first.endswith("ended: killed: SIGKILL (OOM killer: its cgroup's limit 300 MiB was reached)")
    assert second.endswith("died without a goodbye: killed by the OOM killer — its cgroup's limit "
                           "300 MiB was reached")
    (row,) = json.loads(loadertop(state, "ls", "--json").stdout)
    assert row["ended"] == "killed: SIGKILL (OOM killer: its cgroup's limit 300 MiB was reached)"


def test_an_oom_kill_under_run_is_named_after_its_cgroup_is_removed(state, memory_cgroup):
    # `loadertop run`'s launcher outlives its child: it reads the cgroup's OOM-kill counter the
    # moment the child dies and keeps it in the black box, which outlives the cgroup (issue 46).
    env = dict(os.environ, LOADERTOP_STATE_DIR=str(state), PYTHONUNBUFFERED="1")
    proc = subprocess.run(loadertop_cmd("run", "-q", "--", sys.executable, str(JOBS), "oom"),
                          env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=_in(memory_cgroup))
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    remove_cgroup(memory_cgroup)  # as the job's runtime does, before anyone reads
    assert not memory_cgroup.exists()
    listed = loadertop(state, "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    ended = "killed: SIGKILL (OOM killer: its cgroup's limit 300 MiB was reached)"
    assert row["ended"] == ended
    assert row["worst_finding"] is not None, row
    assert (row["worst_finding"]["kind"], row["worst_finding"]["severity"]) == ("oom_killed", "critical")
    out = loadertop(state, "snapshot", "--from", "last")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].endswith(f"ended: {ended}"), lines[0]
    assert lines[1].endswith("killed by the OOM killer — its cgroup's limit 300 MiB was reached")
    # then what else the launcher and the probe read: the peak usage, and (where the probe's
    # black box thread read it as the memory climbed past 80 % of the limit) the last reading
    evidence = list(itertools.takewhile(lambda line: line.startswith("    "), lines[2:]))
    assert any(re.fullmatch(r"    its cgroup's peak usage \d+(\.\d+)? MiB", line) for line in evidence), lines
    assert any(line.startswith("  - critical oom_killed: ") for line in lines), out.stdout
    assert re.search(r"^  ended at \d\d:\d\d:\d\d: " + re.escape(ended) + "$", out.stdout, re.M), out.stdout


def test_an_oom_kill_with_no_launcher_reads_its_memory_near_the_limit(state, memory_cgroup):
    # A plain instrument() job: nobody outlives it, and its cgroup is gone by the time anyone
    # reads. Its black box kept its memory readings near the limit (every 0.25 s from 80 % of it).
    env = dict(os.environ, LOADERTOP_STATE_DIR=str(state), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(JOBS), "oom-near-limit"], env=env,
                          capture_output=True, text=True, timeout=180, preexec_fn=_in(memory_cgroup))
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    remove_cgroup(memory_cgroup)
    (row,) = json.loads(loadertop(state, "ls", "--json").stdout)
    said = re.fullmatch(r"killed: SIGKILL \(OOM killer: likely — memory at (\d+(?:\.\d+)?) % of its "
                        r"cgroup's 300 MiB limit in its last reading\)", row["ended"])
    assert said is not None, row["ended"]
    assert float(said.group(1)) >= 92  # the workload waited there for the reading
    assert row["worst_finding"] is not None and row["worst_finding"]["kind"] == "oom_killed", row
    first = loadertop(state, "snapshot", "--from", "last").stdout.splitlines()[0]
    assert first.endswith(f"ended: {row['ended']}"), first


def test_a_viewer_watching_a_trainer_sigkilled_says_so_at_once(state, monkeypatch):
    """A viewer's own pieces (`loadertop snapshot`'s: the subscriber with the black box's
    history, the model, the text report), watched until the death is in, not for a fixed window:
    a 6 s snapshot had to hold its start, the trainer's reports, the kill and its detection, which
    a loaded machine's slow start could leave outside it."""
    from loadertop.client.model import Model
    from loadertop.client.subscriber import Subscriber
    from loadertop.recording.blackbox import BlackBoxHistory
    from loadertop.views.text import render_text

    job = Workload("--kind", "sleep", "--ms", "5", "--workers", "1", "--batch-size", "2",
                   "--duration", str(ALIVE_S), env={"LOADERTOP_STATE_DIR": str(state)})
    monkeypatch.setenv("LOADERTOP_STATE_DIR", str(state))  # where the viewer's history reads
    sub = Subscriber(Model(window_s=6.0), directory=job.dir, history=BlackBoxHistory())

    def document_where(predicate, what: str):
        def polled():
            sub.poll(50)
            doc = sub.model.advance(time.time())
            return doc if any(s.pid == job.pid and predicate(s) for s in doc.sources) else None

        return wait_for(polled, 60, what, interval=0)

    try:
        job.wait_batches(20)
        document_where(lambda s: s.batches > 0, "the trainer's reports in the viewer")
        job.send(signal.SIGKILL)
        doc = document_where(lambda s: s.end is not None and s.end.how == "died", "the death seen")
    finally:
        sub.close()
        job.kill()
    out = render_text(doc)
    assert f"pid {job.pid} died without a goodbye" in out, out
    assert "is the trainer running" not in out
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


def _stopped_by_sigterm(state: Path, command: list[str], ready: Path, pid_of_job=None) -> int:
    """Start `command`, SIGTERM it once the job is ready and its black box holds a report; its
    exit code."""
    env = dict(os.environ, LOADERTOP_STATE_DIR=str(state))
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready.exists, 60, "the job at its blocking point")
        pid = pid_of_job() if pid_of_job is not None else proc.pid
        wait_for(lambda: holds_a_report(pid, state), 30, "a report in its black box", interval=0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    return proc.returncode


def _one_end(state: Path, ended: str, capsys, monkeypatch) -> None:
    """`ls`, `ls --json`, the view's first line, every source block and the document's `end` say
    the job's one end (issue 50 §2). The commands run in this process: their start-up is not
    what is tested here."""
    from loadertop.commands import ls, snapshot

    monkeypatch.setenv("LOADERTOP_STATE_DIR", str(state))

    def run(main, *args: str) -> str:
        assert main(list(args)) == 0, capsys.readouterr().err
        return capsys.readouterr().out

    (row,) = json.loads(run(ls.main, "--json"))
    assert row["ended"] == ended
    assert ended in run(ls.main)
    out = run(snapshot.main, "--from", "last")
    lines = out.splitlines()
    assert lines[0].endswith(f"ended: {ended}"), lines[0]
    said = [line for line in lines if line.startswith("  ended at ")]
    assert said and all(line.endswith(f": {ended}") for line in said), said
    assert "crashed" not in out and "finished" not in out, out
    (src,) = json.loads(run(snapshot.main, "--from", "last", "--json"))["sources"]
    assert (src["end"]["how"], src["end"]["ended"]) == ("stopped", ended), src["end"]


def test_a_sigterm_turned_into_system_exit_in_next_is_one_end_everywhere(state, tmp_path, capsys,
                                                                        monkeypatch):
    # The handler raises SystemExit(143) where the loop waits for a batch: the probe sees it leave
    # next(), and the process exits with it (no launcher to see the exit code).
    ready = tmp_path / "ready"
    _stopped_by_sigterm(state, [sys.executable, str(JOBS), "sigterm-in-next", str(ready)], ready)
    _one_end(state, "signal: SIGTERM", capsys, monkeypatch)


def test_a_sigterm_turned_into_system_exit_in_the_step_under_run_is_one_end_everywhere(
        state, tmp_path, capsys, monkeypatch):
    # Raised in the training step, the SystemExit never passes the probe: `loadertop run`'s
    # launcher, which sees the exit code (143), tells the black box.
    from loadertop import statedir

    ready = tmp_path / "ready"
    command = loadertop_cmd("run", "-q", "--", sys.executable, str(JOBS), "sigterm-in-step", str(ready))
    _stopped_by_sigterm(state, command, ready,
                        pid_of_job=lambda: statedir.list_jobs(state).jobs[0].pid)
    _one_end(state, "signal: SIGTERM", capsys, monkeypatch)
