"""The slow readings' findings from real jobs (issue 10): copy_on_read, fd_low,
threads_oversubscribed and shm_low, each from a job that really has the pitfall
(`tests/workloads/resource_jobs.py`), and none of them from a healthy job.

The jobs run at once, each in its own LOADERTOP_DIR, with LOADERTOP_RESOURCE_S=0.5: the probe
then takes its slow readings (USS/PSS, fds, threads) at every 1 s tick instead of every 5 s, and
without its CPU share for USS. Each is watched by one `loadertop snapshot --json` (with no black
box, LOADERTOP_BLACKBOX=0: the readings are taken only while a viewer is subscribed, and the
memory trends are that viewer's).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from loadertop import environment, statedir
from loadertop.client import resources as vr
from loadertop.findings import _trends, copy_on_read, threads_oversubscribed

from conftest import (
    START_TIMEOUT_S,
    WORKLOADS,
    SnapshotRun,
    WorkloadPool,
    check_document,
    kill_group,
    short_tmpdir,
    source_of,
    wait_for,
)

pytestmark = pytest.mark.slow

JOBS = WORKLOADS / "resource_jobs.py"
OURS = {"copy_on_read", "memory_growth", "fd_low", "threads_oversubscribed", "shm_low"}
RESOURCE_S = "0.5"  # below the publisher's 1 s tick: a reading every tick
# copy_on_read: the trend is the later half of what the snapshot watched, after 2 readings:
# ~9 readings a second apart in 18 s. Each worker reads 2500 strings a second by its own clock,
# one page each (--pages-per-s): ~9.8 MiB/s, whatever the loop's rate, ~60 MiB over a trend of
# 6 s (the threshold is COW_MIN_GROWTH_BYTES, 32 MiB); the loop's own reads (128 items every 35 ms
# over 2 workers, shuffled) add theirs. The growth of the loop's reads alone depended on how fast
# a loaded machine let the loop go. 130k items (520 MB) last each worker more than 30 s: longer
# than the job's start and its snapshot.
COW_PAGES_PER_S = 2500
COW_SNAPSHOT_S = 18.0
SNAPSHOT_S = 5.0
FD_LIMIT = 256
TMPFS_MIB = 16


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _can_mount_tmpfs() -> str | None:
    """None if a job can mount a tmpfs in a mount namespace of its own here, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    target = tempfile.mkdtemp(prefix="ltm", dir="/tmp")
    try:
        cmd = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
        cmd += ["--", "sh", "-c", f"mount -t tmpfs -o size=1m loadertop-test {target}"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        return None if res.returncode == 0 else f"cannot mount a tmpfs: {res.stderr.strip()}"
    finally:
        os.rmdir(target)


class Job:
    """A resource job in its own LOADERTOP_DIR, with its own status file."""

    def __init__(self, pool: WorkloadPool, kind: str, *args: object, env: dict | None = None):
        self.kind = kind
        self.dir = short_tmpdir()
        self.status_path = self.dir / "status.json"
        # Without a black box: the readings and the trends judged here are the snapshot's own
        # (a viewer starting from a job's black box is tests/unit/test_blackbox_reader.py's).
        extra = {environment.LOADERTOP_RESOURCE_S: RESOURCE_S, statedir.LOADERTOP_BLACKBOX: "0",
                 **(env or {})}
        self.wl = pool(kind, "--duration", 120, "--status", self.status_path, *args,
                       directory=self.dir, env=extra, script=JOBS)

    def status(self) -> dict:
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}

    def running(self) -> bool:
        if not self.wl.alive():
            raise AssertionError(f"{self.kind} job exited ({self.wl.proc.returncode}):\n"
                                 f"{self.wl.stderr()[-3000:]}")
        st = self.status()
        return st.get("phase") == "running" and st.get("batches", 0) >= 3


@pytest.fixture(scope="module")
def jobs():
    pool = WorkloadPool()
    why_no_tmpfs = _can_mount_tmpfs()
    shm_dir = short_tmpdir()
    try:
        started = {
            "healthy": Job(pool, "healthy"),
            "copy_on_read": Job(pool, "copy_on_read", "--items", 130_000, "--batch-size", 128,
                                "--step-ms", 35, "--pages-per-s", COW_PAGES_PER_S),
            "fd_low": Job(pool, "fd_low", "--fd-limit", FD_LIMIT, "--fd-share", 0.85),
            "threads": Job(pool, "threads", "--threads", 2 * _cores() + 8),
        }
        if why_no_tmpfs is None:
            started["shm_low"] = Job(pool, "shm_low", "--tmpfs-mib", TMPFS_MIB, "--tmpfs-dir",
                                     shm_dir, "--shm-free-mib", 1,
                                     env={environment.LOADERTOP_SHM_PATH: str(shm_dir)})
        # Each job is watched from the moment it runs (copy_on_read's list is read once per
        # epoch: its growth must not end before its snapshot does).
        runs: dict[str, SnapshotRun] = {}

        def snap_the_running() -> bool:
            for name, job in started.items():
                if name not in runs and job.running():
                    seconds = COW_SNAPSHOT_S if name == "copy_on_read" else SNAPSHOT_S
                    runs[name] = SnapshotRun(job.dir, seconds=seconds)
            return len(runs) == len(started)

        wait_for(snap_the_running, START_TIMEOUT_S, "every job running", interval=0.1)
        # Each job killed once its document is in: the 5 s ones would otherwise run until the
        # copy_on_read watch ends, taking the CPU that job and the tests beside these need.
        docs = {}
        for name in sorted(runs, key=lambda n: runs[n].started + runs[n].seconds):
            docs[name] = runs[name].document()
            kill_group(started[name].wl.proc)
        yield {"jobs": started, "docs": docs, "no_tmpfs": why_no_tmpfs}
    finally:
        pool.close()
        for job in pool.started:
            shutil.rmtree(job.dir, ignore_errors=True)
        shutil.rmtree(shm_dir, ignore_errors=True)


def _source(jobs, name: str) -> tuple[dict, dict]:
    doc = jobs["docs"][name]
    check_document(doc)
    return doc, source_of(doc, jobs["jobs"][name].wl.pid)


def _ours(findings: list[dict]) -> list[dict]:
    return [f for f in findings if f["kind"] in OURS]


def _one(findings: list[dict], kind: str) -> dict:
    hits = [f for f in findings if f["kind"] == kind]
    assert len(hits) == 1, findings
    f = hits[0]
    assert f["severity"] == "warning" and f["summary"] and f["evidence"] and f["advice"], f
    assert any("threshold" in line for line in f["evidence"]), f["evidence"]
    return f


def test_a_healthy_job_has_none_of_these_findings(jobs):
    doc, src = _source(jobs, "healthy")
    # the readings were there to judge by
    process = src["process"]
    assert process["rss_bytes"] and process["uss_bytes"] and process["fds"] and process["threads"]
    for w in src["workers"]:
        assert w["uss_bytes"] and w["pss_bytes"] and w["fds"] and w["threads"], w
    assert doc["system"]["shm"] is not None
    assert _ours(src["findings"]) == [] and _ours(doc["findings"]) == [], doc["findings"]


def test_copy_on_read_from_a_list_of_python_strings(jobs):
    doc, src = _source(jobs, "copy_on_read")
    figures = [(w["id"], w["uss_trend"], w["rss_trend"]) for w in src["workers"]]
    assert any(f["kind"] == "copy_on_read" for f in src["findings"]), (figures, src["findings"])
    f = _one(src["findings"], "copy_on_read")
    assert f["source"] == src["id"]
    assert "numpy" in f["advice"][0] and "pytorch#13246" in f["advice"][0]
    # the figures behind it: USS up by the threshold, RSS flat, in both workers
    grown = []
    for w in src["workers"]:
        uss, rss = w["uss_trend"], w["rss_trend"]
        assert uss is not None and rss is not None, w
        assert uss["samples"] >= _trends.TREND_MIN_SAMPLES, uss
        growth = uss["slope_bytes_per_s"] * uss["over_s"]
        grown.append(growth)
        assert rss["slope_bytes_per_s"] * rss["over_s"] <= copy_on_read.COW_RSS_SHARE_MAX * growth, w
    assert max(grown) >= copy_on_read.COW_MIN_GROWTH_BYTES, grown
    # the warm-up: the first readings and the first half of the watch are not in the trend
    trend = src["workers"][0]["uss_trend"]
    assert trend["over_s"] <= COW_SNAPSHOT_S * (1 - vr.WARMUP_SHARE) + 1, trend
    # and nothing else of ours: the main process's memory is flat (its USS rises back as the
    # workers copy pages it shared with them: that is no growth)
    assert [x["kind"] for x in _ours(doc["findings"])] == ["copy_on_read"], doc["findings"]


def test_fd_low_under_a_lowered_rlimit(jobs):
    doc, src = _source(jobs, "fd_low")
    assert src["process"]["fd_limit"] == FD_LIMIT
    f = _one(src["findings"], "fd_low")
    assert f["evidence"][0].startswith("training process: fds ")
    assert f"of limit {FD_LIMIT} (threshold 80 %)" in f["evidence"][0], f["evidence"]
    assert "set_sharing_strategy('file_system')" in f["advice"][0]
    assert [x["kind"] for x in _ours(doc["findings"])] == ["fd_low"], doc["findings"]


def test_threads_oversubscribed_by_an_openmp_pool_per_worker(jobs):
    doc, src = _source(jobs, "threads")
    f = _one(src["findings"], "threads_oversubscribed")
    pool_from = threads_oversubscribed.WORKER_OWN_THREADS + threads_oversubscribed.POOL_MIN_THREADS
    assert all(w["threads"] > pool_from
               for w in src["workers"]), src["workers"]
    assert "cv2.setNumThreads(0)" in f["advice"][0]
    assert [x["kind"] for x in _ours(doc["findings"])] == ["threads_oversubscribed"]


def test_shm_low_on_a_nearly_full_tmpfs(jobs):
    if jobs["no_tmpfs"] is not None:
        pytest.skip(jobs["no_tmpfs"])
    doc, src = _source(jobs, "shm_low")
    shm = doc["system"]["shm"]
    assert shm["total_bytes"] == TMPFS_MIB * 1024 * 1024, shm
    assert shm["free_bytes"] <= 2 * 1024 * 1024, shm
    f = _one(doc["findings"], "shm_low")
    assert f["source"] is None and f["worker"] is None
    assert Path(shm["path"]).name in f["summary"]
    assert "--shm-size" in f["advice"][0]
    assert _ours(src["findings"]) == []  # the machine's finding, not the source's
