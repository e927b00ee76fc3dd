"""`loadertop demo --once`: the bundled job runs, a report names it, and nothing is left behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import psutil
import pytest

pytestmark = pytest.mark.slow


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_demo_once_reports_and_stops_its_job():
    env = {k: v for k, v in os.environ.items() if k not in ("LOADERTOP_DIR", "LOADERTOP_ENDPOINT")}
    # stdout is a pipe, not a terminal: the demo prints reports instead of opening the screen.
    proc = subprocess.run(
        [sys.executable, "-m", "loadertop", "demo", "--phase-seconds", "2", "--seconds", "1.5"],
        capture_output=True, text=True, timeout=90, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "== demo phase 1/4: healthy" in out
    assert re.search(r"^train · \S+:\d+ · ", out, re.M), out  # the demo's source, by name
    job_pid = int(re.search(r"demo job \(pid (\d+)\) stopped\n", out).group(1))
    worker_pids = [int(p) for p in re.findall(r"^  \d+\s+(\d+)\s+(?:alive|dead)", out, re.M)]
    assert worker_pids, out
    # Stopped and reaped (not a zombie, not an orphan), its DataLoader workers too.
    assert _gone(job_pid)
    assert all(_gone(pid) for pid in worker_pids), worker_pids
