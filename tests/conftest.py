"""Shared fixtures and helpers: private discovery directories, training workloads in subprocesses,
`loadertop snapshot --json` runs, and a validator of the CONTRACT §3 document.

Everything is real: workloads are `tests/workloads/train.py` in their own process (own session, so
the whole process group, workers included, is killed at teardown), viewers are `python -m
loadertop ...` subprocesses. Synchronisation is by polling with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
WORKLOADS = TESTS / "workloads"
TRAIN = WORKLOADS / "train.py"
VIEWER = WORKLOADS / "viewer.py"

SNAPSHOT_SCHEMA = "loadertop.snapshot/1"
STATES = {"running", "waiting", "stalled", "idle", "finished", "gone"}
CATEGORIES = {"idle", "insufficient_data", "compute_bound", "input_bound_io", "input_bound_cpu",
              "cpu_saturated", "main_process_bound", "memory_pressure", "stalled"}
# `import torch` alone takes ~1.5 s here; a workload with spawn workers or a busy machine more.
START_TIMEOUT_S = 60.0


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


def clean_env(directory: Path | str, **extra: str) -> dict:
    env = os.environ.copy()
    for var in ("LOADERTOP_ENDPOINT", "LOADERTOP_DISABLE", "PYTHONPROFILEIMPORTTIME"):
        env.pop(var, None)
    env["LOADERTOP_DIR"] = str(directory)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


# --------------------------------------------------------------------------- in-process publisher
@pytest.fixture(scope="session", autouse=True)
def _session_loadertop_dir():
    """The in-process publisher (transparency tests) is a per-process singleton that keeps the
    directory it was created with: give the whole pytest process one private, short one."""
    directory = short_tmpdir()
    saved = {v: os.environ.get(v) for v in ("LOADERTOP_DIR", "LOADERTOP_ENDPOINT", "LOADERTOP_DISABLE")}
    os.environ["LOADERTOP_DIR"] = str(directory)
    os.environ.pop("LOADERTOP_ENDPOINT", None)
    os.environ.pop("LOADERTOP_DISABLE", None)
    yield directory
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


# --------------------------------------------------------------------------- workloads
class Workload:
    """`tests/workloads/train.py ARGS` in its own session, with its own LOADERTOP_DIR."""

    def __init__(self, *args: str, directory: Path | None = None, env: dict | None = None,
                 script: Path = TRAIN) -> None:
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
        """{worker id: {"wall_ns", "cpu_ns", "n", "t", "pid"}}: the dataset's own cumulative
        measure of time spent in __getitem__ (see lt_data._FetchClock)."""
        out: dict = {}
        for name in os.listdir(self.piddir):
            if not (name.startswith("t") and name.endswith(".json")):
                continue
            wid, _, pid = name[1:-len(".json")].partition(".")
            try:
                doc = json.loads((self.piddir / name).read_text())
            except (OSError, ValueError):
                continue
            doc["pid"] = int(pid)
            out[int(wid) if wid.isdigit() else wid] = doc
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


class SnapshotRun:
    """`loadertop snapshot [--json] --seconds S ARGS` started in the background."""

    def __init__(self, directory: Path | str, *endpoints: str, seconds: float = 3.0,
                 as_json: bool = True, env: dict | None = None) -> None:
        args = ["snapshot", "--seconds", f"{seconds:g}", *endpoints]
        if as_json:
            args.insert(1, "--json")
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
                raise AssertionError(f"snapshot did not finish:\n{err.decode(errors='replace')}")
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
             env: dict | None = None):
    """Run `loadertop snapshot` to completion: (returncode, document or None, stdout, stderr)."""
    return SnapshotRun(directory, *endpoints, seconds=seconds, as_json=as_json, env=env).result()


def measured_cpu_fraction(before: dict, after: dict, worker) -> float | None:
    """CPU / wall time the dataset itself measured in one worker between two `fetch_clock()`s."""
    a, b = before.get(worker), after.get(worker)
    if not a or not b or a["pid"] != b["pid"] or b["wall_ns"] <= a["wall_ns"]:
        return None
    return (b["cpu_ns"] - a["cpu_ns"]) / (b["wall_ns"] - a["wall_ns"])


def source_of(doc: dict, pid: int) -> dict:
    matches = [s for s in doc["sources"] if s["pid"] == pid]
    assert len(matches) == 1, f"expected one source of pid {pid}, got {[s['id'] for s in doc['sources']]}"
    return matches[0]


# --------------------------------------------------------------------------- §3 document shape
def _is_num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _num_or_none(value, where: str, lo: float | None = None, hi: float | None = None) -> None:
    if value is None:
        return
    assert _is_num(value), f"{where}: {value!r} is not a number"
    if lo is not None:
        assert value >= lo, f"{where}: {value!r} < {lo}"
    if hi is not None:
        assert value <= hi, f"{where}: {value!r} > {hi}"


def _keys(obj, keys: set, where: str) -> None:
    assert isinstance(obj, dict), f"{where}: not an object: {obj!r}"
    missing = keys - set(obj)
    assert not missing, f"{where}: missing keys {sorted(missing)}"


def _stats(obj, where: str) -> None:
    if obj is None:
        return
    _keys(obj, {"mean", "p50", "p95", "p99", "max"}, where)
    for k in ("mean", "p50", "p95", "p99", "max"):
        _num_or_none(obj[k], f"{where}.{k}", lo=0)
        assert obj[k] is not None, f"{where}.{k} is null inside a present stats object"
    assert obj["p50"] <= obj["p95"] <= obj["p99"] <= obj["max"], f"{where}: percentiles unordered {obj}"
    assert obj["mean"] <= obj["max"] + 1e-6, f"{where}: mean above max {obj}"


def _verdict(obj, where: str) -> None:
    _keys(obj, {"category", "summary", "evidence", "advice"}, where)
    assert obj["category"] in CATEGORIES, f"{where}.category: {obj['category']!r}"
    assert isinstance(obj["summary"], str) and obj["summary"], f"{where}.summary: {obj['summary']!r}"
    for k in ("evidence", "advice"):
        assert isinstance(obj[k], list) and all(isinstance(x, str) for x in obj[k]), f"{where}.{k}"


SOURCE_KEYS = {"id", "host", "pid", "rank", "name", "state", "config", "batches", "batches_total",
               "batches_per_s", "samples_per_s", "wait_ms", "step_ms", "wait_fraction", "queue",
               "workers", "diagnosis"}
CONFIG_KEYS = {"num_workers", "batch_size", "prefetch_factor", "pin_memory", "persistent_workers",
               "dataset", "worker_context"}
WORKER_KEYS = {"id", "pid", "alive", "exitcode", "cpu_percent", "rss_bytes", "batches", "fetch_ms",
               "cpu_fraction"}
SYSTEM_KEYS = {"cpu_count", "cpu_percent", "per_cpu_percent", "iowait_percent", "load_avg_1m",
               "mem_total_bytes", "mem_available_bytes", "mem_used_percent", "swap_total_bytes",
               "swap_used_bytes", "swap_in_bytes_per_s", "swap_out_bytes_per_s",
               "disk_read_bytes_per_s", "disk_write_bytes_per_s", "gpu_status", "gpus"}
GPU_KEYS = {"index", "name", "util_percent", "mem_used_bytes", "mem_total_bytes", "temperature_c",
            "power_w"}


def check_source(src: dict, where: str = "source") -> None:
    _keys(src, SOURCE_KEYS, where)
    assert isinstance(src["id"], str) and src["id"].count(":") >= 2, f"{where}.id {src['id']!r}"
    assert isinstance(src["host"], str) and src["host"]
    assert isinstance(src["pid"], int) and src["pid"] > 0
    assert src["rank"] is None or (isinstance(src["rank"], int) and src["rank"] >= 0)
    assert isinstance(src["name"], str) and src["name"]
    assert src["id"] == f"{src['host']}:{src['pid']}:{src['name']}", f"{where}.id {src['id']!r}"
    assert src["state"] in STATES, f"{where}.state {src['state']!r}"
    cfg = src["config"]
    _keys(cfg, CONFIG_KEYS, f"{where}.config")
    assert isinstance(cfg["num_workers"], int) and cfg["num_workers"] >= 0
    assert cfg["batch_size"] is None or (isinstance(cfg["batch_size"], int) and cfg["batch_size"] > 0)
    if cfg["num_workers"] == 0:
        assert cfg["prefetch_factor"] is None and cfg["worker_context"] is None, cfg
    else:
        assert isinstance(cfg["prefetch_factor"], int) and cfg["prefetch_factor"] >= 1, cfg
        assert cfg["worker_context"] in ("fork", "spawn", "forkserver"), cfg
    assert isinstance(cfg["pin_memory"], bool) and isinstance(cfg["persistent_workers"], bool)
    assert isinstance(cfg["dataset"], str) and cfg["dataset"]
    for k in ("batches", "batches_total"):
        assert isinstance(src[k], int) and src[k] >= 0, f"{where}.{k} {src[k]!r}"
    assert src["batches"] <= src["batches_total"], f"{where}: window batches above the total"
    _num_or_none(src["batches_per_s"], f"{where}.batches_per_s", lo=0)
    _num_or_none(src["samples_per_s"], f"{where}.samples_per_s", lo=0)
    _stats(src["wait_ms"], f"{where}.wait_ms")
    _stats(src["step_ms"], f"{where}.step_ms")
    _num_or_none(src["wait_fraction"], f"{where}.wait_fraction", lo=0, hi=1)
    q = src["queue"]
    _keys(q, {"ready", "in_flight", "capacity"}, f"{where}.queue")
    for k in ("ready", "in_flight", "capacity"):
        assert q[k] is None or (isinstance(q[k], int) and q[k] >= 0), f"{where}.queue.{k} {q[k]!r}"
    if cfg["num_workers"] > 0 and q["capacity"] is not None:
        assert q["capacity"] == cfg["num_workers"] * cfg["prefetch_factor"], q
    assert isinstance(src["workers"], list)
    for i, w in enumerate(src["workers"]):
        ww = f"{where}.workers[{i}]"
        _keys(w, WORKER_KEYS, ww)
        assert isinstance(w["id"], int) and w["id"] >= 0
        assert w["pid"] is None or (isinstance(w["pid"], int) and w["pid"] > 0)
        assert w["alive"] in (True, False, None), ww
        assert w["exitcode"] is None or isinstance(w["exitcode"], int), ww
        if w["alive"]:
            assert w["exitcode"] is None, f"{ww}: a live worker with an exit code"
        _num_or_none(w["cpu_percent"], f"{ww}.cpu_percent", lo=0)
        assert w["rss_bytes"] is None or (isinstance(w["rss_bytes"], int) and w["rss_bytes"] > 0)
        assert isinstance(w["batches"], int) and w["batches"] >= 0
        _stats(w["fetch_ms"], f"{ww}.fetch_ms")
        _num_or_none(w["cpu_fraction"], f"{ww}.cpu_fraction", lo=0, hi=1)
    ids = [w["id"] for w in src["workers"]]
    assert len(ids) == len(set(ids)), f"{where}: duplicate worker ids {ids}"
    _verdict(src["diagnosis"], f"{where}.diagnosis")


def check_system(system, where: str = "system") -> None:
    _keys(system, SYSTEM_KEYS, where)
    assert isinstance(system["cpu_count"], int) and system["cpu_count"] >= 1
    _num_or_none(system["cpu_percent"], f"{where}.cpu_percent", lo=0, hi=100)
    if system["per_cpu_percent"] is not None:
        assert isinstance(system["per_cpu_percent"], list)
        for v in system["per_cpu_percent"]:
            _num_or_none(v, f"{where}.per_cpu_percent", lo=0, hi=100)
    _num_or_none(system["iowait_percent"], f"{where}.iowait_percent", lo=0, hi=100)
    _num_or_none(system["load_avg_1m"], f"{where}.load_avg_1m", lo=0)
    _num_or_none(system["mem_used_percent"], f"{where}.mem_used_percent", lo=0, hi=100)
    for k in ("mem_total_bytes", "mem_available_bytes", "swap_total_bytes", "swap_used_bytes",
              "swap_in_bytes_per_s", "swap_out_bytes_per_s", "disk_read_bytes_per_s",
              "disk_write_bytes_per_s"):
        _num_or_none(system[k], f"{where}.{k}", lo=0)
    if system["mem_total_bytes"] is not None and system["mem_available_bytes"] is not None:
        assert system["mem_available_bytes"] <= system["mem_total_bytes"]
    status = system["gpu_status"]
    assert status in ("ok", "no_nvml", "no_gpu") or (isinstance(status, str) and status.startswith("error:")), status
    assert isinstance(system["gpus"], list)
    if status != "ok":
        assert system["gpus"] == [], "GPU figures without gpu_status ok"
    for i, g in enumerate(system["gpus"]):
        _keys(g, GPU_KEYS, f"{where}.gpus[{i}]")


def check_document(doc: dict, *, system_required: bool = True) -> None:
    """Validate the CONTRACT §3 shape: every key, types, fractions in 0..1, null where unknown."""
    _keys(doc, {"schema", "taken_at", "window_s", "sources", "system", "diagnosis"}, "document")
    assert doc["schema"] == SNAPSHOT_SCHEMA
    assert _is_num(doc["taken_at"]) and abs(doc["taken_at"] - time.time()) < 600
    assert _is_num(doc["window_s"]) and doc["window_s"] > 0
    assert isinstance(doc["sources"], list)
    for i, src in enumerate(doc["sources"]):
        check_source(src, f"sources[{i}]")
    if system_required or doc["system"] is not None:
        check_system(doc["system"])
    _verdict(doc["diagnosis"], "diagnosis")
    assert "source" in doc["diagnosis"]
    ids = {s["id"] for s in doc["sources"]}
    assert doc["diagnosis"]["source"] is None or doc["diagnosis"]["source"] in ids
