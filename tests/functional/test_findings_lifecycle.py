"""Findings from timing (issue 10), each from a real job judged through `loadertop snapshot
--json` (the killed ones through an in-process viewer, the same model, watching until their end):
a worker SIGKILLed while training crashes at once, a loop blocked in next() with num_workers=0,
workers stuck in their very first batch, one slow worker, a dataset's generator shared by every
worker (and the same dataset seeded per worker), and epochs that re-create spawned workers. The
hang of a worker later in its epoch and the death by an exit code are checked in
test_e2e_diagnosis (the same workloads as the stalled verdict)."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch.utils.data import DataLoader
from workloads.lt_data import WorkloadDataset, seed_worker_rng

import loadertop

from conftest import (
    WorkloadPool,
    check_document,
    kill_group,
    snapshot,
    source_of,
    wait_for,
)
from test_run import Viewer

pytestmark = pytest.mark.slow


def _findings(src: dict, kind: str) -> list[dict]:
    return [f for f in src["findings"] if f["kind"] == kind]


def _source_when(wl, ready, seconds: float = 3.0, timeout: float = 90.0) -> dict:
    def attempt():
        if not wl.alive():
            raise AssertionError(f"the workload exited ({wl.proc.returncode}):\n"
                                 f"{wl.stderr()[-3000:]}")
        rc, doc, _out, err = snapshot(wl.dir, seconds=seconds)
        if rc != 0:
            return None
        check_document(doc)
        src = source_of(doc, wl.pid)
        return src if ready(src) else None
    return wait_for(attempt, timeout, "the findings")


JOBS = {
    # The loop SIGKILLs worker 0 after 1000 batches, ~5 s in (what the OOM killer does), once its
    # viewer has its reports (told by a file: on a loaded machine a viewer started after the job's
    # discovery found it already gone); torch raises at once and the process dies of it.
    "killed": ("--kind", "sleep", "--ms", 5, "--workers", 2, "--batch-size", 2,
               "--kill-worker-after", 1000, "--kill-when-told", "--crash", "--duration", 120),
    # The same kill, then the loop sleeps in its step: torch's error comes from its SIGCHLD
    # handler there, not from next() (in a real job the loop is mostly in its step).
    "killed_in_step": ("--kind", "sleep", "--ms", 5, "--workers", 2, "--batch-size", 2,
                       "--kill-worker-after", 1000, "--kill-when-told", "--sleep-after-kill-s", 5,
                       "--crash", "--duration", 120),
    # num_workers=0: the loop fetches itself, so its own stack names the dataset's function.
    "hang0": ("--kind", "hang", "--workers", 0, "--batch-size", 2, "--after", 10,
              "--duration", 120),
    # Worker 0 takes 40 ms per sample, the three others 2 ms; the dataset draws from one numpy
    # Generator made in __init__, so every worker starts with the same state.
    "slow": ("--kind", "sleep", "--ms", 2, "--slow-worker-ms", 38, "--rng", "init",
             "--workers", 4, "--batch-size", 4, "--duration", 120),
    # The same generator, seeded per worker by worker_init_fn: no finding.
    "seeded": ("--kind", "sleep", "--ms", 2, "--rng", "per-worker", "--workers", 2,
               "--batch-size", 4, "--duration", 120),
    # Both workers stuck in their first batch: neither ever sends its start message (it goes
    # after the first batch), so their stack files are found among their open files.
    "hang_first": ("--kind", "hang", "--workers", 2, "--batch-size", 2, "--after", 0,
                   "--duration", 120),
    # spawn without persistent workers: every epoch starts two fresh interpreters, each at least
    # a second (its worker_init_fn sleeps 1.1 s): a spawned start alone (import torch) can take
    # under EPOCH_START_SLOW_MS on a fast machine, and the finding would not be there to judge.
    "epochs": ("--kind", "cheap", "--workers", 2, "--context", "spawn", "--epochs", 40,
               "--batches", 5, "--worker-init-s", 1.1, "--duration", 120),
}


def _killed(wl) -> dict:
    """Watched by an in-process viewer until the job's end is in (no window: a snapshot watched a
    fixed 8 s, which had to hold the job's 1000 batches, the kill and the crash, and a loaded
    machine made them slower); told to kill once the viewer has its reports, so that its
    subscription is through and the last report and the goodbye reach it."""
    wl.wait_discovery()
    viewer = Viewer(directory=wl.dir)
    try:
        viewer.until(lambda d: any(s["pid"] == wl.pid for s in d["sources"]), 60,
                     "the job's reports")
        wl.tell("kill")
        doc = viewer.until(lambda d: any(s["pid"] == wl.pid and s["state"] == "finished"
                                         for s in d["sources"]), 90, "the job's end")
    finally:
        viewer.close()
    return {"doc": doc, "rc": wl.wait(30), "status": wl.status(), "pids": wl.worker_pids()}


def _hang0(wl) -> dict:
    wl.wait_batches(10)
    # blocked since the 10th batch: a 3 s snapshot from 2.5 s on sees it past STALL_MIN_MS (5 s)
    wait_for(lambda: time.time() >= wl.status()["last_batch_at"] + 2.5, 30, "the hang's start")
    return _source_when(wl, lambda s: bool(_findings(s, "loop_hung")))


def _hang_first(wl) -> dict:
    wl.wait_discovery()
    return _source_when(wl, lambda s: len(_findings(s, "worker_hung")) == 2)


def _slow(wl) -> dict:
    wl.wait_batches(12)
    return _source_when(wl, lambda s: bool(_findings(s, "slow_worker")) and
                        bool(_findings(s, "duplicate_rng")))


def _seeded(wl) -> dict:
    wl.wait_batches(12)
    return _source_when(wl, lambda s: s["rng"]["checked_workers"] == 2)


def _epochs(wl) -> dict:
    wl.wait_status(lambda st: st.get("epoch", 0) >= 1, what="a second epoch")
    return _source_when(wl, lambda s: bool(_findings(s, "epoch_start_slow")))


def _stopped_when_judged(step, wl):
    """`step(wl)`, then the job killed: the jobs judged early would otherwise run until the last
    (hang_first: 30 s without a batch) is, the spawning one starting two interpreters an epoch,
    taking the CPU that the tests beside these need."""
    try:
        return step(wl)
    finally:
        kill_group(wl.proc)


@pytest.fixture(scope="module")
def jobs():
    """All the jobs at once (they sleep or wait, mostly): each test reads its own result."""
    pool = WorkloadPool()
    try:
        wls = {name: pool(*args) for name, args in JOBS.items()}
        steps = {"killed": _killed, "killed_in_step": _killed, "hang0": _hang0,
                 "hang_first": _hang_first, "slow": _slow, "seeded": _seeded, "epochs": _epochs}
        with ThreadPoolExecutor(len(steps)) as ex:
            futures = {name: ex.submit(_stopped_when_judged, step, wls[name])
                       for name, step in steps.items()}
            for future in futures.values():
                future.exception()  # wait for all; a failure is raised in its own test
        yield {name: (future, wls[name]) for name, future in futures.items()}
    finally:
        pool.close()


def test_a_worker_killed_while_training_crashes_is_seen_dead(jobs):
    future, wl = jobs["killed"]
    result = future.result()
    doc = result["doc"]
    assert result["rc"] != 0, "the workload should have crashed"
    check_document(doc, system_required=False)  # the process may be gone before a machine report
    src = source_of(doc, wl.pid)
    assert result["status"]["batches"] >= 1000, result["status"]  # + batches already fetched
    assert src["state"] == "finished", src["state"]
    assert src["end"]["how"] == "crashed", src["end"]
    # The end is what the loop raised, as the loop itself caught it. Which error that is, is
    # torch's race: its _try_get_data (2.13) raises "DataLoader worker ... exited unexpectedly"
    # once it sees the worker dead, but re-raises the transport's own error when the dead worker's
    # batch failed to arrive (its shared-memory fd: ConnectionResetError) before the worker was
    # reaped, as on a loaded machine.
    status = result["status"]
    assert src["end"]["error"] == f"{status['error_type']}: {status['error']}"[:2000], (src["end"], status)
    assert (status["error_type"] == "RuntimeError" and "DataLoader worker" in status["error"]
            or status["error_type"] == "ConnectionResetError"), status
    (victim,) = result["pids"][0]
    dead = {w["id"]: w for w in src["workers"]}[0]
    assert (dead["pid"], dead["alive"], dead["exitcode"]) == (victim, False, -9), dead
    (died,) = _findings(src, "worker_died")
    assert died["worker"] == 0 and died["severity"] == "critical", died
    assert "SIGKILL" in died["summary"] and "OOM" in died["summary"], died
    assert any("dmesg" in a for a in died["advice"]), died["advice"]
    assert [f["kind"] for f in doc["findings"]] == ["worker_died"], doc["findings"]


def test_a_worker_killed_while_the_loop_is_in_its_step_is_still_a_crash(jobs):
    """torch raises the worker's death from its SIGCHLD handler wherever the main thread is; here
    in the step, so the iterator never sees it: the probe reads it at exit (sys.last_value)."""
    future, wl = jobs["killed_in_step"]
    result = future.result()
    assert result["rc"] != 0 and result["status"].get("raised_in") == "step", result["status"]
    src = source_of(result["doc"], wl.pid)
    (victim,) = result["pids"][0]
    assert src["end"]["how"] == "crashed", src["end"]
    assert src["end"]["error"].startswith(f"RuntimeError: DataLoader worker (pid {victim})"), \
        src["end"]
    dead = {w["id"]: w for w in src["workers"]}[0]
    assert (dead["pid"], dead["alive"], dead["exitcode"]) == (victim, False, -9), dead


def test_a_loop_blocked_in_next_shows_where_it_waits(jobs):
    src = jobs["hang0"][0].result()
    (hung,) = _findings(src, "loop_hung")
    assert hung["severity"] == "critical" and hung["worker"] is None
    assert hung["stack"][-1].endswith("in hang_forever"), hung["stack"][-3:]
    assert hung["stack"][hung["user_frame"]].endswith("in hang_forever")
    assert "hang_forever" in hung["summary"], hung["summary"]
    assert src["loop_stack"]["frames"][src["loop_stack"]["user_frame"]].endswith("in hang_forever")
    assert src["diagnosis"]["category"] == "stalled"
    assert not _findings(src, "worker_hung")


def test_workers_stuck_in_their_first_batch_show_their_stacks(jobs):
    src = jobs["hang_first"][0].result()
    assert src["batches_total"] == 0
    hung = _findings(src, "worker_hung")
    assert sorted(f["worker"] for f in hung) == [0, 1], src["findings"]
    for f in hung:
        assert f["stack"][-1].endswith("in hang_forever"), f["stack"][-3:]
    assert {w["id"] for w in src["workers"] if w["stack"]} == {0, 1}


def test_one_slow_worker_and_a_shared_generator_are_named(jobs):
    src = jobs["slow"][0].result()
    (slow,) = _findings(src, "slow_worker")
    assert slow["worker"] == 0 and slow["severity"] == "warning", slow
    assert "worker 0" in slow["summary"]
    (dup,) = _findings(src, "duplicate_rng")
    assert "dataset.rng (numpy Generator)" in dup["summary"] and "0, 1, 2, 3" in dup["summary"]
    assert any("default_rng" in a for a in dup["advice"]), dup["advice"]
    # more workers do not fix one slow worker: the verdict says so first, and an input-bound one
    # (the CPU left: these workers sleep) gives no worker count
    verdict = src["diagnosis"]
    assert "worker 0" in verdict["advice"][0], verdict
    assert any("worker 0 takes" in line for line in verdict["evidence"]), verdict
    if verdict["category"] in ("input_bound_io", "input_bound_cpu"):
        assert "num_workers=" not in " ".join(verdict["advice"]), verdict


def test_a_generator_seeded_per_worker_is_no_finding(jobs):
    src = jobs["seeded"][0].result()
    assert src["rng"]["shared"] == [] and src["findings"] == [], src["findings"]


def test_spawned_workers_recreated_every_epoch_are_a_slow_epoch_start(jobs):
    src = jobs["epochs"][0].result()
    (slow,) = _findings(src, "epoch_start_slow")
    assert slow["severity"] == "info"
    assert all(v >= 1000 for v in src["epoch_starts_ms"][-2:]), src["epoch_starts_ms"]
    assert any("persistent_workers=True" in a for a in slow["advice"]), slow["advice"]


def _batches(loader) -> list[list[int]]:
    return [b.tolist() for b in loader]


def test_the_rng_check_never_changes_what_a_dataset_returns(tmp_path, monkeypatch):
    # The digests read every generator's state at each worker's start; a draw there would shift
    # every later "augmentation". Same loader, plain and instrumented: identical batches.
    monkeypatch.setenv("LOADERTOP_DIR", str(tmp_path))

    def loader(**kw):
        return DataLoader(WorkloadDataset("cheap", length=32, rng="init"), batch_size=4,
                          num_workers=2, multiprocessing_context="fork",
                          generator=torch.Generator().manual_seed(7), **kw)

    plain = _batches(loader())
    seeded_plain = _batches(loader(worker_init_fn=seed_worker_rng))
    measured = _batches(loadertop.instrument(loader(), name="rng"))
    seeded = _batches(loadertop.instrument(loader(worker_init_fn=seed_worker_rng),
                                           name="rng-seeded"))
    assert measured == plain
    assert seeded == seeded_plain
    assert plain != seeded_plain  # the draws really differ between the two set-ups


STUCK_IN_C = """
import ctypes, os, sys, time
from loadertop.probe import worker

path = worker.arm_stack_dump(sys.argv[1])
assert path is not None and worker._stack_file() == path, (path, worker._stack_file())
# A PyDLL keeps the GIL during the call: no Python code can run. The function is looked up here,
# not at the call: ctypes resolves a symbol in Python code of its own (CDLL.__getattr__), where a
# stack dump asked for just after the print below would otherwise find it on a loaded machine.
c_read = ctypes.PyDLL(None).read
byte = ctypes.create_string_buffer(1)

def stuck_in_c():
    print(path, flush=True)
    # In C until the test writes a byte to stdin (once it has read the dump): no window of time
    # that a loaded machine could let pass before the dump is asked for.
    while c_read(0, byte, 1) < 0:  # a read ended early by a handler (EINTR) is retried, as C does
        pass
    print(time.time(), flush=True)  # the GIL is free again from here on

stuck_in_c()
"""


def test_a_worker_stuck_in_c_holding_the_gil_writes_its_stack_when_asked(tmp_path):
    import subprocess

    from loadertop.probe import stacks

    script = tmp_path / "stuck.py"
    script.write_text(STUCK_IN_C)
    dumps = tmp_path / "stacks"
    dumps.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), str(dumps)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        dump = proc.stdout.readline().strip()  # its memfd (/proc/<pid>/fd/<fd>), else a file
        assert stacks.is_worker_stack_file(dump, proc.pid, str(dumps)), proc.stderr.read()
        asked = time.time()
        assert stacks.ask_worker_stack(proc.pid)
        stack = wait_for(lambda: stacks.read_dump_file(dump), 30, "the dump")  # it waits in C
        out, err = proc.communicate("x", timeout=30)  # the byte it waits for: out of the C call
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err  # the signal neither killed nor broke it
    assert stack is not None
    assert stack.frames[-1].endswith("in stuck_in_c"), stack.frames
    assert stack.user_frame == len(stack.frames) - 1
    released = float(out.split()[-1])
    assert asked - 1 <= stack.taken_at < released  # written while it was inside the C call


OWN_HANDLER = """
import os, signal, sys
from loadertop.probe import stacks, worker

signal.signal(signal.SIGURG, lambda *a: None)  # the program's own: never replaced, never sent
print(worker.arm_stack_dump(sys.argv[1]))
print(stacks.find_worker_stack_file(os.getpid(), sys.argv[1]))
signal.signal(signal.SIGURG, signal.SIG_DFL)
path = worker.arm_stack_dump(sys.argv[1])
print(path is not None, worker._stack_file() == path,
      stacks.find_worker_stack_file(os.getpid(), sys.argv[1]) == path)
signal.signal(signal.SIGURG, lambda *a: None)  # set after the hook (a worker_init_fn's own)
print(worker._stack_file())
print(stacks.find_worker_stack_file(os.getpid(), sys.argv[1]))  # withdrawn: not found either
"""


def test_a_program_s_own_stack_signal_handler_is_left_alone(tmp_path):
    import subprocess

    script = tmp_path / "own.py"
    script.write_text(OWN_HANDLER)
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:5] == ["None", "None", "True True True", "None", "None"], \
        out.stdout
