"""`loadertop attach PID` / `--detach`: real jobs started without loadertop, attached mid-epoch.

The job is `tests/workloads/plain_train.py` (plain torch; it never imports loadertop): a shuffled
train loader with 2 workers, and a val loader made anew each epoch (a loader created after the
attach, and a second loader). One job per worker context carries every assertion about it, in
order: attach; `snapshot --json` within 5 s; attaching twice; detach seen by a watching viewer
as `finished`; training going on; its exit code and its printed checksums against a run without
attach. The errors use cheap targets (`sleep`, a Python without torch) and poll with deadlines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from loadertop.attach import (
    EXIT_ALREADY,
    EXIT_EXITED,
    EXIT_NO_GDB,
    EXIT_NO_LOADERTOP,
    EXIT_NO_PROCESS,
    EXIT_NO_TORCH,
    EXIT_NOT_ATTACHED,
    EXIT_NOT_PYTHON,
    EXIT_PTRACE,
    EXIT_TIMEOUT,
)

from conftest import (
    REPO,
    WORKLOADS,
    Workload,
    check_document,
    clean_env,
    kill_group,
    loadertop_cmd,
    short_tmpdir,
    snapshot,
    wait_for,
)
from test_run import Viewer

PLAIN = WORKLOADS / "plain_train.py"
START_S = 60.0
needs_gdb = pytest.mark.skipif(shutil.which("gdb") is None and not hasattr(sys, "remote_exec"),
                               reason="gdb is not installed (.ci/run installs it)")
pytestmark = [pytest.mark.slow, needs_gdb]


def attach(directory, *args, env=None, timeout=90) -> subprocess.CompletedProcess:
    return subprocess.run(loadertop_cmd("attach", *map(str, args)), env=env or clean_env(directory),
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def batch_lines(w: Workload) -> list[list[str]]:
    return [line.split() for line in w.stdout().splitlines() if line.startswith("batch ")]


def wait_train_batches(w: Workload, n: int, timeout: float = START_S) -> list[list[str]]:
    def enough():
        if not w.alive():
            raise AssertionError(f"job exited {w.proc.returncode}:\n{w.stderr()[-3000:]}")
        lines = [r for r in batch_lines(w) if r[1] == "train"]
        return lines if len(lines) >= n else None
    return wait_for(enough, timeout, f"{n} train batches")


def largest_gaps(rows: list[list[str]], k: int = 3) -> list[float]:
    stamps = [int(r[5]) for r in rows if r[1] == "train"]
    return sorted(((b - a) / 1e6 for a, b in zip(stamps, stamps[1:])), reverse=True)[:k]


@pytest.mark.parametrize("context,persistent", [("fork", False), ("spawn", True)],
                         ids=["fork", "spawn-persistent"])
def test_attach_mid_epoch_measures_then_detaches_and_the_job_stays_its_own(context, persistent,
                                                                           record_property):
    directory = short_tmpdir()
    stop = directory / "stop"
    argv = ["--workers", "2", "--context", context, "--items", "400", "--stop", str(stop)]
    if persistent:
        argv.append("--persistent")
    w = Workload(*argv, directory=directory, script=PLAIN)
    try:
        wait_train_batches(w, 5)
        pid = w.pid
        # The job's processes from here on, sampled every 10 ms: epochs here can end twice within
        # a few seconds, and without persistent workers each has new processes.
        children: set[int] = set()
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.01):
                try:
                    children.update(p.pid for p in psutil.Process(pid).children())
                except psutil.Error:
                    return
        sampler = threading.Thread(target=sample)
        sampler.start()
        # A viewer (in-process, the model snapshot uses) looking at the directory from before the
        # attach: what is timed below is the job's registering and reporting, not a viewer
        # process's start (a `loadertop snapshot` started per look: seconds of a loaded machine).
        watcher = Viewer(directory=directory)
        try:
            t0 = time.monotonic()
            lines_before = len(batch_lines(w))
            done = attach(directory, pid)
            attach_s = time.monotonic() - t0
            lines_after = len(batch_lines(w))
            assert done.returncode == 0, done.stderr
            assert f"attached to pid {pid}" in done.stdout and "--detach" in done.stdout
            attached_at = time.monotonic()
            entry = directory / f"{pid}.json"
            assert entry.exists()

            # Within 5 s of the attach: its loader, with batches, the right config and live workers.
            def train_seen(d: dict) -> bool:
                src = {s["name"]: s for s in d["sources"] if s["pid"] == pid}.get("train_loader")
                return bool(src and src["batches"] > 0 and src["workers"])
            doc = watcher.until(train_seen, 15, "the attached loader")
            visible_s = time.monotonic() - attached_at
        finally:
            watcher.close()
            sampling.set()
            sampler.join()
        sources = {s["name"]: s for s in doc["sources"] if s["pid"] == pid}
        assert visible_s < 5.0, f"seen {visible_s:.1f} s after the attach"
        check_document(doc, system_required=False)  # the machine's figures come at 1 Hz
        train = sources["train_loader"]
        cfg = train["config"]
        assert (cfg["num_workers"], cfg["batch_size"], cfg["worker_context"], cfg["dataset"],
                cfg["persistent_workers"], cfg["prefetch_factor"]) == \
            (2, 4, context, "Items", persistent, 2), cfg
        live = [wk for wk in train["workers"] if wk["alive"]]
        assert len(live) == 2 and {wk["pid"] for wk in live} <= children, (train["workers"], children)
        if persistent:
            # Started before the attach: never hooked. Their stage figures are null, not invented.
            assert all(wk["fetch_ms"] is None for wk in train["workers"]), train["workers"]
            assert train["stages"]["fetch_ms"] is None
            assert train["stages"]["unpaired"] == "workers_unhooked", train["stages"]

        # Attaching twice: refused (by the discovery entry; with another directory, by the
        # target itself), and the job is untouched.
        again = attach(directory, pid)
        assert again.returncode == EXIT_ALREADY and "already" in again.stderr, again.stderr
        other = short_tmpdir()
        again = attach(other, pid)
        shutil.rmtree(other, ignore_errors=True)
        assert again.returncode == EXIT_ALREADY and "already attached" in again.stderr, again.stderr

        # The val loader is made after the attach, each epoch: one more source, named after it.
        def val_seen():
            if "val_loader" in sources:
                return sources["val_loader"]
            rc, doc, _o, err = snapshot(directory, seconds=1.0)
            assert rc == 0, err
            return next((s for s in doc["sources"] if s["pid"] == pid and s["name"] == "val_loader"),
                        None)
        val = wait_for(val_seen, 20, "the val loader created after the attach")
        assert val["config"]["num_workers"] == 0 and val["batches_total"] > 0

        # Detach while a viewer watches: it sees the sources finish; training goes on. The viewer
        # (in-process, the same model as snapshot's) watches until they have: a snapshot's fixed
        # 4 s window had to hold the whole detach, gdb's start included, which a loaded machine
        # makes longer.
        viewer = Viewer(directory=directory)
        try:
            viewer.until(lambda d: any(s["pid"] == pid and s["name"] == "train_loader"
                                       for s in d["sources"]), 30, "the job's reports")
            before = len(batch_lines(w))
            t0 = time.monotonic()
            gone = attach(directory, "--detach", pid)
            detach_s = time.monotonic() - t0
            after = len(batch_lines(w))
            assert gone.returncode == 0, gone.stderr
            assert "said goodbye" in gone.stdout, gone.stdout
            assert not entry.exists()

            def train_state(d: dict) -> str | None:
                return {s["name"]: s["state"] for s in d["sources"] if s["pid"] == pid}.get(
                    "train_loader")
            viewer.until(lambda d: train_state(d) == "finished", 30, "the train loader finished")
        finally:
            viewer.close()
        wait_for(lambda: len(batch_lines(w)) > before + 10, 30, "training to go on after --detach")
        assert attach(directory, "--detach", pid).returncode == EXIT_NOT_ATTACHED

        stop.write_text("")
        assert w.wait(60) == 7  # the job's own exit code
        rows = batch_lines(w)
        epochs = max(int(r[2]) for r in rows) + 1
        from workloads import plain_train

        expected = plain_train.reference(argv, epochs)
        got = [" ".join(r[:5]) for r in rows] + [w.stdout().splitlines()[-1]]
        assert got == expected, "the batches, their order or the RNG streams changed"
        # What the job felt: the longest wait between two train batches while attach / detach
        # ran, against the whole run's median (epoch starts and a busy machine included).
        at_attach = largest_gaps(rows[lines_before:lines_after + 2], 1)
        at_detach = largest_gaps(rows[before:after + 2], 1)
        everywhere = sorted(largest_gaps(rows, len(rows)))
        median = everywhere[len(everywhere) // 2]
        record_property("attach_s", round(attach_s, 2))
        record_property("detach_s", round(detach_s, 2))
        print(f"\n{context}: attach {attach_s:.2f} s, {done.stdout.splitlines()[0].split('(the job ')[-1]}"
              f"; longest gap between batches during attach {at_attach} ms, during detach "
              f"{at_detach} ms (median {median:.1f} ms, run's max {everywhere[-1]:.0f} ms)")
    finally:
        w.kill()


def _python_target(directory: Path, code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], env=clean_env(directory),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


NO_TORCH = "import time\nprint('up', flush=True)\nwhile True:\n    time.sleep(0.02)\n"
# The main thread sits in os.read (C, no bytecode: no pending call runs) until a line comes.
BLOCKED = ("import os, sys\nprint('up', flush=True)\nos.read(0, 1)\n"
           "print('woke', flush=True)\nimport time\ntime.sleep(0.5)\n")
# Exits as soon as an attach puts its bootstrap into the directory (the main thread is blocked).
EXITS = ("import glob, os, threading, time\nd = os.environ['LOADERTOP_DIR']\n"
         "def watch():\n    while not glob.glob(d + '/*-attach-*.py'):\n        time.sleep(0.005)\n"
         "    os._exit(0)\nthreading.Thread(target=watch, daemon=True).start()\n"
         "print('up', flush=True)\nr, w = os.pipe()\nos.read(r, 1)\n")


def test_attach_errors_are_one_line_with_their_own_exit_codes():
    directory = short_tmpdir()
    procs: list[subprocess.Popen] = []
    try:
        gone = subprocess.Popen(["true"])
        gone.wait()
        sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
        procs.append(sleeper)
        plain = _python_target(directory, NO_TORCH)
        procs.append(plain)
        assert plain.stdout.readline() == b"up\n"

        def check(result, code, *words):
            err = result.stderr.strip()
            assert result.returncode == code, (result.returncode, err)
            assert err.count("\n") == 0 and "Traceback" not in err, err
            for word in words:
                assert word in err, (word, err)

        check(attach(directory, gone.pid), EXIT_NO_PROCESS, f"no process with pid {gone.pid}")
        check(attach(directory, sleeper.pid), EXIT_NOT_PYTHON, "not a CPython process")
        check(attach(directory, plain.pid), EXIT_NO_TORCH, "never imported torch's DataLoader")
        check(attach(directory, "--detach", plain.pid), EXIT_NOT_ATTACHED, "not attached")
        no_gdb = clean_env(directory, PATH=str(directory))
        if not hasattr(sys, "remote_exec"):
            check(attach(directory, plain.pid, env=no_gdb), EXIT_NO_GDB, "apt-get install gdb")
        if os.geteuid() == 0 and shutil.which("setpriv"):
            # The unprivileged user runs a copy of the package from a directory it can read: the
            # checkout may lie in a private one (a clone under `mktemp -d`, mode 0700), where
            # uid 65534 would fail to import loadertop before reaching ptrace.
            readable = short_tmpdir()
            readable.chmod(0o755)
            shutil.copytree(REPO / "loadertop", readable / "loadertop",
                            ignore=shutil.ignore_patterns("__pycache__"))
            nobody = subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                 *loadertop_cmd("attach", str(plain.pid))],
                env=clean_env(short_tmpdir(), PYTHONPATH=str(readable)), capture_output=True,
                text=True, timeout=60, cwd=readable)
            shutil.rmtree(readable, ignore_errors=True)
            check(nobody, EXIT_PTRACE, "ptrace not permitted", "CAP_SYS_PTRACE",
                  "kernel.yama.ptrace_scope", "--cap-add=SYS_PTRACE")

        exits = _python_target(directory, EXITS)
        procs.append(exits)
        assert exits.stdout.readline() == b"up\n"
        check(attach(directory, exits.pid), EXIT_EXITED, "exited during the attach")

        # A main thread that runs no Python code: a timeout, and the late pending call does nothing.
        blocked = subprocess.Popen([sys.executable, "-c", BLOCKED], env=clean_env(directory),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, start_new_session=True)
        procs.append(blocked)
        assert blocked.stdout.readline() == b"up\n"
        check(attach(directory, "--timeout", "1", blocked.pid), EXIT_TIMEOUT, "nothing was changed")
        assert not list(directory.glob("*-attach-*")), list(directory.iterdir())
        out, err = blocked.communicate(b"x", timeout=30)
        assert blocked.returncode == 0 and out == b"woke\n" and err == b"", (out, err)
    finally:
        for proc in procs:
            kill_group(proc)
        shutil.rmtree(directory, ignore_errors=True)


def test_a_job_without_loadertop_in_its_environment_is_told_what_to_install_and_left_alone():
    directory = short_tmpdir()
    stop = directory / "stop"
    w = Workload("--workers", "0", "--hide-loadertop", "--stop", str(stop), directory=directory,
                 script=PLAIN)
    try:
        wait_train_batches(w, 3)
        done = attach(directory, w.pid)
        assert done.returncode == EXIT_NO_LOADERTOP, done.stderr
        assert "pip install" in done.stderr and sys.executable in done.stderr, done.stderr
        assert not (directory / f"{w.pid}.json").exists()
        before = len(batch_lines(w))
        wait_for(lambda: len(batch_lines(w)) > before + 5, 30, "training to go on")
        stop.write_text("")
        assert w.wait(60) == 7 and "loadertop" not in w.stderr(), w.stderr()
    finally:
        w.kill()


# Vector arithmetic in the main thread (torch's AVX kernels where the CPU has them), checked
# against its first result at every round: registers that gdb failed to restore would show.
VECTORS = ("import os, sys, torch\n"
           "x = torch.arange(4096, dtype=torch.float64)\n"
           "first = float((x * 1.5 + 0.25).sum())\n"
           "print('up', flush=True)\n"
           "rounds = bad = 0\n"
           "while not os.path.exists(sys.argv[1]):\n"
           "    rounds += 1\n"
           "    if float((x * 1.5 + 0.25).sum()) != first:\n"
           "        bad += 1\n"
           "print('rounds', rounds, 'bad', bad, flush=True)\n")


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed (.ci/run installs it)")
@pytest.mark.parametrize("sse_only", [False, True], ids=["full-registers", "sse-only"])
def test_gdb_schedules_with_either_register_set_and_the_job_computes_on(sse_only, tmp_path):
    """Both of gdb's ways: the full XSAVE area (or, where gdb 13 cannot write it, as on a CPU
    with AMX, an answer that leaves the job untouched) and the core + SSE registers that attach
    falls back to. Five schedules each, into a job doing vector arithmetic in its main thread:
    every statement runs once and no result changes."""
    from loadertop.attach import inject
    from loadertop.attach.target import inspect

    marks, stop = tmp_path / "marks", tmp_path / "stop"
    job = subprocess.Popen([sys.executable, "-c", VECTORS, str(stop)], env=clean_env(tmp_path),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        assert job.stdout.readline() == "up\n"
        target = inspect(job.pid)
        gdb = shutil.which("gdb")
        assert gdb is not None
        scheduled = 0
        for _ in range(5):
            run = inject._run_gdb(gdb, target, f"open({str(marks)!r}, 'a').write('x')",
                                  sse_only=sse_only)
            if not run.scheduled:  # the full set where gdb cannot write it back: nothing done
                assert not sse_only and "extended state" in run.message, run.message
                assert job.poll() is None
                continue
            scheduled += 1
            assert run.stopped_ms is not None and run.stopped_ms > 0
            wait_for(lambda n=scheduled: marks.exists() and len(marks.read_text()) == n, 30,
                     f"{scheduled} statements run")
        stop.touch()
        out, err = job.communicate(timeout=60)
        assert job.returncode == 0, err[-3000:]
        rounds, bad = out.split()[1], out.split()[3]
        assert int(rounds) > 0 and bad == "0", out
        assert (len(marks.read_text()) if marks.exists() else 0) == scheduled
        if sse_only:
            assert scheduled == 5
    finally:
        kill_group(job)
