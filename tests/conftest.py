"""Shared fixtures and helpers: private discovery directories, training workloads in subprocesses,
`loadertop snapshot --json` runs, and a validator of the docs/contract.md §3 document (a strict decode into
`loadertop.client.document`'s types).

Everything is real: workloads are `tests/workloads/train.py` in their own process (own session, so
the whole process group, workers included, is killed at teardown), forked by a zygote that imported
torch once (`tests/workloads/zygote.py`: `import torch` is 3.4 s of CPU here, and the functional
suite starts dozens of jobs), viewers are `python -m loadertop ...` subprocesses. Synchronisation
is by polling with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import psutil
import pytest

from loadertop.client.document import Document, Source, Stats, SystemFigures, decode_json

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
WORKLOADS = TESTS / "workloads"
TRAIN = WORKLOADS / "train.py"
VIEWER = WORKLOADS / "viewer.py"

# `import torch` alone takes ~1.5 s here; a workload with spawn workers or a busy machine more.
START_TIMEOUT_S = 60.0
# A job that its test kills once done (a pool's close, the `workload` fixture) runs at most this
# long (--duration): a cap on a lost one, never shorter than the waits of the test that watches it.
ALIVE_S = 600.0


def short_tmpdir() -> Path:
    """A fresh private directory under /tmp with a short path (ipc paths must stay < ~100 chars)."""
    return Path(tempfile.mkdtemp(prefix="lt", dir="/tmp"))


def wait_for(predicate, timeout: float, what: str = "a condition", interval: float = 0.02):
    """Poll `predicate` until it returns something truthy (returned) or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a child started in its own session, with everything it started, and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def state_dir_of(directory: Path | str) -> Path:
    """The black boxes' state directory of the jobs of discovery directory `directory`: in it,
    named as the tests' own files there are ("w…", as a Workload's work directory: what a job
    leaves in its discovery directory is checked without them), so it goes when it goes."""
    return Path(directory) / "w-state"


def clean_env(directory: Path | str, **extra: str) -> dict:
    env = os.environ.copy()
    for var in ("LOADERTOP_ENDPOINT", "LOADERTOP_DISABLE", "PYTHONPROFILEIMPORTTIME"):
        env.pop(var, None)
    env["LOADERTOP_DIR"] = str(directory)
    # The jobs and viewers of one discovery directory share a state directory of their own: a
    # viewer with no live job names the last ended one (docs/contract.md §9), so another test's
    # jobs must not be in it.
    env["LOADERTOP_STATE_DIR"] = str(state_dir_of(directory))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


# The end-to-end tests that judge a CPU figure, a verdict read from one, a rate or a wall-clock bound
# that load would break run one at a time, after the rest (`-m serial`): a neighbour's load would
# change what they measure. The rest run on three processes (`-m "not serial" -n 3`, the README's
# test command); their deadlines only tell a hang from a slow start. A test judged by such a figure
# joins the rest only once it has held on a saturated machine (two processes burning both cores
# beside it, twice) and among the rest: the publisher's lifecycle, the torchrun straggler, the
# quiet start's two timed tests and the notebook's panel (its verdict against snapshot's) did.
# The single-process stage pairing (a 3 ms sleep measured past its 20 ms bound) and the
# Prometheus exporter's (its p95 wait further from the snapshot's than a bucket's width) held
# beside the two burning processes but not among the rest.
# A file of tests/functional named with None: all its tests; else the tests named (those sharing a
# module-scoped job: all of them, so that it starts once).
_FLEET = frozenset({  # test_e2e_snapshot's `fleet`: CPU fractions, fetch times and rates
    "test_every_document_has_the_contract_shape", "test_io_workers_pids_fetch_time_and_low_cpu_fraction",
    "test_batch_counts_and_rate_match_the_script", "test_explicit_endpoint_sees_the_same_source",
    "test_text_report_is_readable", "test_the_viewer_prints_the_report_once_or_when_not_on_a_terminal",
    "test_cpu_burning_worker_has_high_cpu_fraction", "test_num_workers_zero_reports_the_loop_as_fetcher",
    "test_killed_worker_shows_dead_with_signal_exit_code", "test_tcp_endpoint_from_env_and_pid_argument",
})
SERIAL: dict[str, frozenset[str] | None] = {
    "test_autotune.py": frozenset({  # the epochs' rates decide where the tuner settles
        "test_a_job_started_at_two_workers_settles_at_the_knee_within_the_budget",
        "test_more_workers_whose_memory_would_pass_the_margin_are_never_tried"}),
    "test_advice_experiments.py": None,
    "test_attach.py": frozenset({  # seen in a snapshot within 5 s of the attach
        "test_attach_mid_epoch_measures_then_detaches_and_the_job_stays_its_own"}),
    "test_e2e_diagnosis.py": None,
    "test_e2e_snapshot.py": _FLEET,
    "test_export_prometheus.py": None,  # the p95 wait of two windows within one bucket
    "test_e2e_recording.py": frozenset({  # the replay's verdict is the live viewers' verdict
        "test_a_recording_says_what_the_live_viewers_said"}),
    "test_stage_pairing.py": frozenset({  # each fetch of 2 items of 3 ms within 5-20 ms
        "test_single_process_loader_times_its_stages"}),
    "test_stages.py": frozenset({  # stage times within 20 %, verdicts
        "test_fetch_and_collate_times_match_the_known_costs",
        "test_a_sleeping_dataset_waits_for_production",
        "test_many_small_tensors_make_the_handoff_the_limit",
        "test_a_worker_holding_the_gil_delivers_late_and_is_not_main_process_bound"}),
    "test_tune.py": frozenset({  # the trials' rates
        "test_the_search_finds_a_known_knee",
        "test_a_failing_trial_is_listed_the_rest_go_on_and_ctrl_c_prints_what_was_measured",
        "test_an_iterable_that_every_worker_yields_whole_is_not_tuned",
    }),
}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        # by its folder and name: the names in SERIAL are those of tests/functional's files (no
        # test file's name is repeated across the folders, which run in one pytest session)
        if item.path.parent != TESTS / "functional" or item.path.name not in SERIAL:
            continue
        names = SERIAL[item.path.name]
        if names is None or item.originalname in names:
            item.add_marker(pytest.mark.serial)


# --------------------------------------------------------------------------- in-process publisher
@pytest.fixture(scope="session", autouse=True)
def _session_loadertop_dir():
    """The in-process publisher (transparency tests) is a per-process singleton that keeps the
    directory it was created with: give the whole pytest process one private, short one. The
    black boxes of every job the tests start go to a private state directory too, never the
    user's (a test that reads them sets LOADERTOP_STATE_DIR of its own)."""
    directory = short_tmpdir()
    saved = {v: os.environ.get(v) for v in ("LOADERTOP_DIR", "LOADERTOP_ENDPOINT", "LOADERTOP_DISABLE",
                                            "LOADERTOP_STATE_DIR")}
    os.environ["LOADERTOP_DIR"] = str(directory)
    os.environ["LOADERTOP_STATE_DIR"] = str(directory / "state")
    os.environ.pop("LOADERTOP_ENDPOINT", None)
    os.environ.pop("LOADERTOP_DISABLE", None)
    yield directory
    from loadertop.probe import publisher  # this process's own black box ends before its directory

    if publisher._publisher is not None and publisher._publisher.blackbox is not None:
        publisher._publisher.blackbox.finish()
    for var, value in saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def lt_dir():
    """A per-test private LOADERTOP_DIR (for subprocesses: pass it in their environment)."""
    directory = short_tmpdir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def private_state_dir(tmp_path, monkeypatch) -> Path:
    """A state directory of the test's own (the black boxes', docs/contract.md §9), 0700, which
    LOADERTOP_STATE_DIR names for the test's process."""
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("LOADERTOP_STATE_DIR", str(directory))
    return directory


@pytest.fixture
def reports(monkeypatch):
    """Every LoaderReport the publisher thread of this process builds during the test (for tests
    that instrument a loader in-process)."""
    from loadertop.probe.record import LoaderRecord

    out = []
    original = LoaderRecord.report

    def spy(self, *args, **kwargs):
        msg = original(self, *args, **kwargs)
        out.append(msg)
        return msg

    monkeypatch.setattr(LoaderRecord, "report", spy)
    return out


# --------------------------------------------------------------------------- workloads
class _Zygote:
    """`tests/workloads/zygote.py`, started once per test process on first use: it has imported
    torch, and forks each workload from there (see that module for what differs from a fresh
    `python train.py`). LOADERTOP_TEST_ZYGOTE=0 starts every workload fresh."""

    def __init__(self) -> None:
        self.dir = short_tmpdir()
        self.path = str(self.dir / "zygote.sock")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKLOADS / "zygote.py"), self.path], cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=None, start_new_session=True)
        line = self.proc.stdout.readline()  # blocks until torch is imported and it listens
        if line.strip() != b"ready":
            raise RuntimeError(f"the workload zygote did not start (exit {self.proc.wait()})")

    def spawn(self, argv: list[str], env: dict, cwd: Path, stdout: Path, stderr: Path) -> ForkedProcess:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        request = {"argv": argv, "env": env, "cwd": str(cwd), "stdout": str(stdout),
                   "stderr": str(stderr)}
        conn.sendall(json.dumps(request).encode() + b"\n")
        return ForkedProcess(conn)

    def close(self) -> None:
        kill_group(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


_zygote: _Zygote | None = None


def _the_zygote() -> _Zygote | None:
    global _zygote
    if os.environ.get("LOADERTOP_TEST_ZYGOTE", "1") == "0":
        return None
    if _zygote is None or _zygote.proc.poll() is not None:
        _zygote = _Zygote()
    return _zygote


@pytest.fixture(scope="session", autouse=True)
def _close_the_zygote():
    yield
    if _zygote is not None:
        _zygote.close()


class ForkedProcess:
    """What `subprocess.Popen` offers the tests (pid, poll, wait, returncode, send_signal, kill)
    for a workload the zygote forked: its exit status comes back on the request's connection."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._buffer = b""
        self.returncode: int | None = None
        self.pid = self._read_message(None)["pid"]

    def _read_message(self, timeout: float | None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._conn.settimeout(left)
            try:
                chunk = self._conn.recv(4096)
            except (TimeoutError, BlockingIOError):  # a timeout of 0 is a non-blocking recv
                raise subprocess.TimeoutExpired(["zygote child", str(getattr(self, "pid", "?"))],
                                                timeout) from None
            if not chunk:
                raise RuntimeError("the workload zygote went away")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self._ended(self._read_message(0.0)["returncode"])
            except subprocess.TimeoutExpired:
                return None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._ended(self._read_message(timeout)["returncode"])
        return self.returncode

    def _ended(self, returncode: int) -> None:
        # Closed here: left to the garbage collector, the socket's ResourceWarning landed in
        # whichever test was recording warnings at the time (test_transparency compares them).
        self.returncode = returncode
        self._conn.close()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def accepted(pid: int, path: str) -> int:
    """Connections the job's publisher holds on its ipc socket (the listening one included): a
    client's own end shows no path in /proc/net/unix, the accepted end does."""
    try:
        return sum(c.laddr == path for c in psutil.Process(pid).net_connections(kind="unix"))
    except psutil.Error:
        return 0


class Workload:
    """`tests/workloads/train.py ARGS` in its own session, with its own LOADERTOP_DIR."""

    def __init__(self, *args: str, directory: Path | None = None, env: dict | None = None,
                 script: Path = TRAIN, fresh: bool = False) -> None:
        """`fresh`: a new `python script ...` even where the zygote could fork it (a test that
        reads the process's command line)."""
        self.dir = Path(directory) if directory is not None else short_tmpdir()
        self._own_dir = directory is None
        self.work = Path(tempfile.mkdtemp(prefix="w", dir=self.dir))
        self.status_path = self.work / "status.json"
        self.piddir = self.work / "pids"
        self.piddir.mkdir()
        self.args = [str(a) for a in args]
        cmd = [sys.executable, str(script), *self.args]
        if script == TRAIN:
            cmd += ["--status", str(self.status_path), "--piddir", str(self.piddir)]
        self.env = clean_env(self.dir, **(env or {}))
        self._out = open(self.work / "stdout", "wb")
        self._err = open(self.work / "stderr", "wb")
        zygote = None if fresh else _the_zygote()
        self.proc: subprocess.Popen | ForkedProcess
        if zygote is not None:
            self.proc = zygote.spawn(cmd[1:], self.env, REPO, self.work / "stdout", self.work / "stderr")
        else:
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=self._out, stderr=self._err,
                                         stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True)
        self.pid = self.proc.pid

    # ---- what the workload tells
    @property
    def entry_path(self) -> Path:
        return self.dir / f"{self.pid}.json"

    def entry(self) -> dict | None:
        try:
            return json.loads(self.entry_path.read_text())
        except (OSError, ValueError):
            return None

    def wait_discovery(self, timeout: float = START_TIMEOUT_S) -> dict:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"workload exited ({self.proc.returncode}) before registering:"
                                     f"\n{self.stderr()[-3000:]}")
            return self.entry()
        return wait_for(ready, timeout, f"the discovery file of pid {self.pid}")

    def status(self) -> dict:
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}

    def wait_status(self, predicate, timeout: float = START_TIMEOUT_S, what: str = "status") -> dict:
        def check():
            st = self.status()
            if st and predicate(st):
                return st
            if self.proc.poll() is not None:
                st = self.status()
                if st and predicate(st):
                    return st
                raise AssertionError(f"workload exited ({self.proc.returncode}) while waiting for "
                                     f"{what}; status {st}\n{self.stderr()[-3000:]}")
            return None
        return wait_for(check, timeout, f"{what} of pid {self.pid}")

    def wait_batches(self, n: int, timeout: float = START_TIMEOUT_S) -> dict:
        return self.wait_status(lambda st: st.get("batches", 0) >= n, timeout, f"{n} batches")

    def tell(self, what: str) -> None:
        """Write the file `what` beside the status file (train.py reads `kill` with
        --kill-when-told, `stop` with --stop-when-told)."""
        (self.work / what).write_text("")

    def watched(self) -> bool:
        """A viewer's connection is accepted on the job's ipc socket (beside the listening one)."""
        entry = self.entry()
        if entry is None or not entry.get("endpoint", "").startswith("ipc://"):
            return False
        return accepted(self.pid, entry["endpoint"][len("ipc://"):]) > 1

    def worker_pids(self) -> dict:
        """{worker id: {pids}} as written by the dataset in each worker process."""
        out: dict = {}
        for name in os.listdir(self.piddir):
            wid, _, pid = name.partition(".")
            if pid.isdigit():
                key = int(wid) if wid.isdigit() else wid
                out.setdefault(key, set()).add(int(pid))
        return out

    def fetch_clock(self) -> dict:
        """{worker id: [{"wall_ns", "cpu_ns", "n", "t", "pid"}, ...]}: the dataset's own cumulative
        measure of time spent in __getitem__, oldest first (see lt_data._FetchClock)."""
        out: dict = {}
        for name in os.listdir(self.piddir):
            if not (name.startswith("t") and name.endswith(".jsonl")):
                continue
            wid, _, pid = name[1:-len(".jsonl")].partition(".")
            try:
                lines = (self.piddir / name).read_text().splitlines()
            except OSError:
                continue
            history = []
            for line in lines:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue        # the torn last line of a write in progress
                entry["pid"] = int(pid)
                history.append(entry)
            out[int(wid) if wid.isdigit() else wid] = history
        return out

    def stdout(self) -> str:
        self._out.flush()
        return (self.work / "stdout").read_text(errors="replace")

    def stderr(self) -> str:
        self._err.flush()
        return (self.work / "stderr").read_text(errors="replace")

    # ---- control
    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"workload pid {self.pid} did not finish within {timeout:g} s; "
                                 f"status {self.status()}\n{self.stderr()[-3000:]}") from None

    def send(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole process group (a hung worker would otherwise outlive the test)."""
        kill_group(self.proc)
        for fh in (self._out, self._err):
            fh.close()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class WorkloadPool:
    """Starts workloads and kills every one of them (and their workers) at close()."""

    def __init__(self) -> None:
        self.started: list[Workload] = []

    def __call__(self, *args, **kwargs) -> Workload:
        w = Workload(*args, **kwargs)
        self.started.append(w)
        return w

    def close(self) -> None:
        for w in self.started:
            w.kill()


@pytest.fixture
def workload():
    """Factory: `w = workload("--kind", "sleep", ...)`; all are killed at teardown."""
    pool = WorkloadPool()
    yield pool
    pool.close()


# --------------------------------------------------------------------------- the viewer side
def loadertop_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "loadertop", *args]


class CpuMeter:
    """Busy cores of the whole machine vs. of our own processes (the workloads, their workers,
    the snapshot viewers, this test) over an interval, from psutil's counters."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.busy0 = self._busy()
        self.ours0: dict[int, float] = {}

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) \
            - getattr(t, "guest_nice", 0.0)

    @staticmethod
    def _tree(pids) -> dict[int, float]:
        out = {}
        for pid in pids:
            try:
                root = psutil.Process(pid)
                procs = [root] + root.children(recursive=True)
            except psutil.Error:
                continue
            for p in procs:
                try:
                    t = p.cpu_times()
                    out[p.pid] = t.user + t.system
                except psutil.Error:
                    pass
        return out

    def start(self, pids) -> None:
        self.t0 = time.monotonic()
        self.busy0 = self._busy()
        self.ours0 = self._tree(pids)

    def stop(self, pids) -> dict:
        wall = time.monotonic() - self.t0
        busy = (self._busy() - self.busy0) / wall
        now = self._tree(pids)
        ours = sum(v - self.ours0.get(pid, 0.0) for pid, v in now.items()) / wall
        return {"busy_cores": round(busy, 2), "our_cores": round(ours, 2),
                "foreign_cores": round(max(0.0, busy - ours), 2)}


class SnapshotRun:
    """`loadertop snapshot [--json] --seconds S ARGS` started in the background; `command`
    ("--once", or nothing: the viewer with its output not a terminal) for the viewer's report."""

    def __init__(self, directory: Path | str, *endpoints: str, seconds: float = 3.0,
                 as_json: bool = True, env: dict | None = None,
                 command: tuple[str, ...] = ("snapshot",)) -> None:
        args = [*command, "--seconds", f"{seconds:g}", *endpoints]
        if as_json:
            args.insert(len(command), "--json")
        self.seconds = seconds
        self.started = time.time()
        self.proc = subprocess.Popen(loadertop_cmd(*args), env=clean_env(directory, **(env or {})),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, cwd=REPO)
        self.as_json = as_json
        self._result = None

    def result(self, timeout: float | None = None):
        """(returncode, document or None, stdout, stderr)."""
        if self._result is None:
            try:
                out, err = self.proc.communicate(timeout=timeout or self.seconds + 30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, err = self.proc.communicate()
                raise AssertionError(
                    f"snapshot did not finish:\n{err.decode(errors='replace')}") from None
            out_s, err_s = out.decode(errors="replace"), err.decode(errors="replace")
            doc = None
            if self.as_json and self.proc.returncode == 0:
                doc = json.loads(out_s)
            self._result = (self.proc.returncode, doc, out_s, err_s)
        return self._result

    def document(self) -> dict:
        rc, doc, _out, err = self.result()
        assert rc == 0, f"snapshot exited {rc}: {err}"
        return doc


def snapshot(directory: Path | str, *endpoints: str, seconds: float = 3.0, as_json: bool = True,
             env: dict | None = None, command: tuple[str, ...] = ("snapshot",)):
    """Run `loadertop snapshot` (or `command`) to completion: (returncode, document or None,
    stdout, stderr)."""
    return SnapshotRun(directory, *endpoints, seconds=seconds, as_json=as_json, env=env,
                       command=command).result()


def measured_cpu_fraction(clock: dict, worker, start: float, end: float) -> float | None:
    """CPU / wall time the dataset itself measured in one worker from about `start` to about `end`
    (wall-clock seconds), from the entries of its `fetch_clock()` history nearest those times."""
    history = clock.get(worker) or []
    if len(history) < 2:
        return None
    a = min(history, key=lambda e: abs(e["t"] - start))
    b = min(history, key=lambda e: abs(e["t"] - end))
    if a["pid"] != b["pid"] or b["wall_ns"] <= a["wall_ns"]:
        return None
    return (b["cpu_ns"] - a["cpu_ns"]) / (b["wall_ns"] - a["wall_ns"])


def document_window(doc: dict, src: dict) -> tuple[float, float]:
    """The wall-clock seconds a source's figures cover: its window, ending at its last report."""
    end = doc["taken_at"] - src["age_s"]
    return end - src["window_s"], end


def source_of(doc: dict, pid: int) -> dict:
    matches = [s for s in doc["sources"] if s["pid"] == pid]
    assert len(matches) == 1, f"expected one source of pid {pid}, got {[s['id'] for s in doc['sources']]}"
    return matches[0]


# --------------------------------------------------------------------------- a browser
#: Headless Chromium (Debian's `chromium`; `.ci/run` installs it) for the pages loadertop makes:
#: `--proxy-server` to a closed port and no bypass, so whatever a page asked for could not leave.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                  "--no-default-browser-check", "--disable-extensions", "--disable-sync",
                  "--disable-background-networking", "--disable-component-update",
                  "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


# --------------------------------------------------------------------------- §3 document shape
def typed_document(doc: dict) -> Document:
    """The document decoded strictly into `loadertop.client.document.Document`: every key of the
    contract present with its type and range (fractions in 0..1, counts >= 0, categories and
    states by name), and no key the types do not describe (the round trip gives it back whole)."""
    raw = json.dumps(doc).encode()
    try:
        typed = decode_json(raw)
    except msgspec.ValidationError as exc:
        raise AssertionError(f"the document does not fit the contract's types: {exc}") from None
    again = json.loads(msgspec.json.encode(typed))
    assert again == doc, ("keys the types do not describe, or values they change: "
                          f"{_first_difference(doc, again)}")
    return typed


def _first_difference(a, b, where: str = "$") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in b:
                return f"{where}.{key} is not in the types"
            if key not in a:
                return f"{where}.{key} missing"
            if a[key] != b[key]:
                return _first_difference(a[key], b[key], f"{where}.{key}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{where}[{i}]")
    return f"{where}: {a!r} != {b!r}"


def _stats(stats: Stats | None, where: str) -> None:
    if stats is None:
        return
    assert stats.p50 <= stats.p95 <= stats.p99 <= stats.max, f"{where}: percentiles unordered {stats}"
    assert stats.mean <= stats.max + 1e-6, f"{where}: mean above max {stats}"


def check_source(src: Source, where: str = "source") -> None:
    """What the types cannot say about a source: identity, and figures that must agree."""
    assert src.id == f"{src.host}:{src.pid}:{src.name}", f"{where}.id {src.id!r}"
    assert src.host and src.name and src.pid > 0, where
    cfg = src.config
    assert cfg.batch_size is None or cfg.batch_size > 0, cfg
    if cfg.num_workers == 0:
        assert cfg.prefetch_factor is None and cfg.worker_context is None, cfg
    else:
        assert cfg.prefetch_factor is not None and cfg.prefetch_factor >= 1, cfg
        assert cfg.worker_context in ("fork", "spawn", "forkserver"), cfg
    assert cfg.dataset, cfg
    assert src.batches <= src.batches_total, f"{where}: window batches above the total"
    _stats(src.wait_ms, f"{where}.wait_ms")
    _stats(src.step_ms, f"{where}.step_ms")
    q = src.queue
    if cfg.num_workers > 0 and q.capacity is not None:
        assert q.capacity == cfg.num_workers * (cfg.prefetch_factor or 0), q
    for i, w in enumerate(src.workers):
        ww = f"{where}.workers[{i}]"
        assert w.pid is None or w.pid > 0, ww
        if w.alive:
            assert w.exitcode is None, f"{ww}: a live worker with an exit code"
        assert w.rss_bytes is None or w.rss_bytes > 0, ww
        _stats(w.fetch_ms, f"{ww}.fetch_ms")
        _stats(w.collate_ms, f"{ww}.collate_ms")
    st = src.stages
    for name in ("fetch_ms", "collate_ms", "handoff_ms"):
        _stats(getattr(st, name), f"{where}.stages.{name}")
    if st.wait_split is not None:
        total = st.wait_split.producing + st.wait_split.handoff
        assert abs(total - 1.0) < 1e-6, f"{where}.stages.wait_split adds up to {total}"
        assert st.batches_paired > 0, f"{where}.stages: a split resting on no batch"
    if st.batches_paired == 0:
        assert st.wait_split is None and st.handoff_ms is None, f"{where}.stages: figures unpaired"
    else:
        assert st.unpaired is None, f"{where}.stages: paired batches and a reason for none"
    ids = [w.id for w in src.workers]
    assert len(ids) == len(set(ids)), f"{where}: duplicate worker ids {ids}"
    assert src.diagnosis.summary and "\n" not in src.diagnosis.summary, f"{where}.diagnosis"


def check_system(system: SystemFigures, where: str = "system") -> None:
    assert system.cpu_count >= 1, where
    if system.mem_total_bytes is not None and system.mem_available_bytes is not None:
        assert system.mem_available_bytes <= system.mem_total_bytes, where
    status = system.gpu_status
    assert status in ("ok", "no_nvml", "no_gpu") or status.startswith("error:"), status
    if status != "ok":
        assert system.gpus == (), "GPU figures without gpu_status ok"


def check_document(doc: dict, *, system_required: bool = True, recent: bool = True) -> Document:
    """Validate a docs/contract.md §3 document (as parsed from `snapshot --json`) and return it typed:
    the strict decode above, then what the types cannot check. `recent`: taken just now."""
    typed = typed_document(doc)
    if recent:
        assert abs(typed.taken_at - time.time()) < 600, typed.taken_at
    assert typed.window_s > 0
    for i, src in enumerate(typed.sources):
        check_source(src, f"sources[{i}]")
    if system_required:
        assert typed.system is not None, "no machine figures"
    if typed.system is not None:
        check_system(typed.system)
    assert typed.diagnosis.summary
    ids = {s.id for s in typed.sources}
    assert typed.diagnosis.source is None or typed.diagnosis.source in ids
    return typed
