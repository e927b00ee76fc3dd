"""`loadertop export --tensorboard DIR` on two live jobs, read back by TensorBoard's own
`EventAccumulator` (issue 48, docs/contract.md §11).

Two real instrumented jobs (tests/workloads/train.py: 2 and 3 workers, a 20 ms step) in one
discovery directory, watched by the real `loadertop export`:

- written every second while it runs (each run readable meanwhile), one run per source named
  `<host>-<pid>-<loader>`, the tracker keys at steps that never go back, with figures that agree
  with `loadertop snapshot --json` of the same jobs in kind (num_workers exact, rates alike, the
  wait a share, one category at a time); SIGTERM ends it with exit 0;
- beside `--listen`, with points far apart: SIGTERM writes the last one, so nothing watched is lost;
- a directory that cannot be written: one line on stderr, and /metrics goes on.

Where `tensorboard` is missing a local run skips; under CI (LOADERTOP_CI) it fails.
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from loadertop.client.tracker_keys import CATEGORIES

from conftest import (
    REPO,
    SnapshotRun,
    Workload,
    clean_env,
    kill_group,
    loadertop_cmd,
    short_tmpdir,
    source_of,
    wait_for,
)
from prometheus_server import http_get
from tensorboard_runs import scalars

pytestmark = pytest.mark.slow

WORKERS = {"train": 2, "val": 3}
EXIT_TIMEOUT_S = 30.0  # only tells a hang from a slow exit


@pytest.fixture(scope="module")
def jobs():
    directory = short_tmpdir()
    started = {name: Workload("--kind", "cheap", "--workers", n, "--batch-size", 4, "--step-ms", 20,
                              "--duration", 120, "--name", name, directory=directory)
               for name, n in WORKERS.items()}
    try:
        for job in started.values():
            job.wait_discovery()
            job.wait_batches(1)
        yield directory, started
    finally:
        for job in started.values():
            job.kill()
        shutil.rmtree(directory, ignore_errors=True)


class Export:
    """`loadertop export ARGS` watching `directory`, its stderr in a file."""

    def __init__(self, directory: Path, *args: str) -> None:
        self.err_path = Path(directory) / f"export-{len(list(Path(directory).iterdir()))}.err"
        self.err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(loadertop_cmd("export", *args), env=clean_env(directory),
                                     stdout=subprocess.DEVNULL, stderr=self.err,
                                     stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True)

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"export exited {self.proc.returncode}: {self.stderr()}")
        return True

    def url(self) -> str:
        found = re.search(r"serving (http://\S+/metrics)", self.stderr())
        return found.group(1) if found and self.alive() else ""

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(EXIT_TIMEOUT_S)
        finally:
            kill_group(self.proc)
            self.err.close()


def run_of(board: Path, job: Workload, name: str) -> Path:
    return board / f"{socket.gethostname()}-{job.pid}-{name}"


def points(run: Path, figure: str, name: str) -> list[tuple[int, float, float]]:
    return scalars(run).get(f"loadertop/{name}/{figure}", []) if run.is_dir() else []


def serves_both(url: str, jobs: dict) -> bool:
    body = http_get(url, timeout=2.0) if url else None
    return body is not None and all(
        re.search(rf'loadertop_source_up{{[^}}]*pid="{job.pid}"[^}}]*}} 1\.0'.encode(), body)
        for job in jobs.values())


def served_batches(url: str, job: Workload) -> int:
    body = http_get(url, timeout=2.0) or b""
    found = re.search(rf'loadertop_batches_total{{[^}}]*pid="{job.pid}"[^}}]*}} (\S+)'.encode(), body)
    assert found, body[-2000:]
    return int(float(found.group(1)))


def test_two_live_jobs_are_written_every_second_and_agree_with_the_snapshot(jobs):
    directory, started = jobs
    board = Path(directory) / "tb-live"
    export = Export(directory, "--tensorboard", str(board), "--tensorboard-every", "1")
    try:
        runs = {name: run_of(board, job, name) for name, job in started.items()}
        # readable while it runs: flushed at every point
        wait_for(lambda: export.alive() and all(len(points(runs[n], "num_workers", n)) >= 3
                                                for n in runs),
                 60.0, "three points of each job", interval=0.5)
        doc = SnapshotRun(directory, seconds=3.0).document()
        wait_for(lambda: export.alive() and all(points(runs[n], "num_workers", n)[-1][2]
                                                > doc["taken_at"] for n in runs),
                 60.0, "a point after the snapshot", interval=0.5)
        assert export.terminate() == 0
    finally:
        kill_group(export.proc)
    lines = export.stderr().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loadertop: writing TensorBoard runs to "), lines
    assert sorted(p.name for p in board.iterdir()) == sorted(p.name for p in runs.values())
    for name, job in started.items():
        got = scalars(runs[name])
        prefix = f"loadertop/{name}/"
        src = source_of(doc, job.pid)
        for figure in ("wait_fraction", "batches_per_s", "samples_per_s", "fetch_ms_p50",
                       "collate_ms_p50", "num_workers", "queue_ready_mean", "workers_alive",
                       *(f"bottleneck/{c}" for c in CATEGORIES)):
            assert prefix + figure in got, (figure, sorted(got))
        steps = [step for step, _, _ in got[prefix + "num_workers"]]
        assert steps == sorted(steps) and steps[-1] <= job.status()["batches"], steps
        assert len(set(steps)) >= 3  # the batches so far, moving
        # num_workers exact, in every point and in the snapshot
        assert {v for _, v, _ in got[prefix + "num_workers"]} == {float(WORKERS[name])}
        assert src["config"]["num_workers"] == WORKERS[name]
        assert all(0.0 <= v <= 1.0 for _, v, _ in got[prefix + "wait_fraction"])
        assert all(v <= WORKERS[name] for _, v, _ in got[prefix + "workers_alive"])
        assert got[prefix + "workers_alive"][-1][1] == WORKERS[name]
        # one category at a time
        flags = [got[prefix + f"bottleneck/{c}"] for c in CATEGORIES]
        assert all(sum(point[1] for point in at) == 1.0 for at in zip(*flags))
        # the rate of the point nearest the snapshot is the snapshot's, in kind (the same loop,
        # windows a second or so apart: a loaded machine may stall one of them, hence the
        # factor); samples/s is it times the batch size
        rates = got[prefix + "batches_per_s"]
        near = min(rates, key=lambda p: abs(p[2] - doc["taken_at"]))[1]
        assert src["batches_per_s"] / 3 <= near <= src["batches_per_s"] * 3, (near, src)
        samples = dict((wall, v) for _, v, wall in got[prefix + "samples_per_s"])
        for _, rate, wall in rates:
            assert samples[wall] == pytest.approx(4 * rate, rel=1e-3)


def test_beside_listen_sigterm_writes_the_last_point(jobs):
    """Points 10 minutes apart: the only one written is SIGTERM's, of the latest figures."""
    directory, started = jobs
    board = Path(directory) / "tb-end"
    export = Export(directory, "--listen", "127.0.0.1:0", "--tensorboard", str(board),
                    "--tensorboard-every", "600")
    try:
        url = wait_for(export.url, 60.0, "the exporter's address", interval=0.1)
        wait_for(lambda: serves_both(url, started), 60.0, "both jobs served", interval=0.2)
        assert not board.exists()  # nothing written yet
        served = {name: served_batches(url, job) for name, job in started.items()}
        assert export.terminate() == 0
    finally:
        kill_group(export.proc)
    assert "serving http://127.0.0.1:" in export.stderr()
    assert "writing TensorBoard runs to" in export.stderr()
    for name, job in started.items():
        (point,) = points(run_of(board, job, name), "num_workers", name)
        step, value, _ = point
        # the figures of the end: at least as far as what /metrics served just before
        assert value == WORKERS[name] and step >= served[name] > 0


def test_a_directory_that_cannot_be_written_is_one_line_and_metrics_go_on(jobs):
    directory, started = jobs
    blocked = Path(directory) / "tb-blocked"
    blocked.write_text("a file where the runs' directory would be")
    export = Export(directory, "--listen", "127.0.0.1:0", "--tensorboard", str(blocked / "runs"),
                    "--tensorboard-every", "1")
    try:
        url = wait_for(export.url, 60.0, "the exporter's address", interval=0.1)
        wait_for(lambda: serves_both(url, started), 60.0, "both jobs served", interval=0.2)
        wait_for(lambda: export.alive() and "cannot write TensorBoard" in export.stderr(), 60.0,
                 "the line about the directory", interval=0.2)
        # later rounds fail too (every second), silently; the metrics keep moving
        before = started["train"].status()["batches"]
        started["train"].wait_batches(before + 60)
        assert serves_both(url, started)
        assert export.terminate() == 0
    finally:
        kill_group(export.proc)
    lines = export.stderr().splitlines()
    assert len(lines) == 2, lines
    assert lines[1].startswith(f"loadertop export: cannot write TensorBoard events to {blocked}")
    assert blocked.is_file()
