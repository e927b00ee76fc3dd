"""Persistent workers stop when their loader is dropped, as in plain torch, on every path that
instruments (`loadertop run`, `loadertop.instrument`, `loadertop attach`), fork and spawn.

torch 2.13 shuts a persistent loader's workers down in `_MultiProcessingDataLoaderIter.__del__`:
only when nothing else holds the loader (which holds the iterator). The job is
`tests/workloads/loader_lifetime.py`: it builds persistent loaders, iterates each once, drops it,
`gc.collect()`s and joins each worker for up to 5 s, and prints how many were still alive. Under
`run` both workers of every loader used to stay alive (the frame that named the loader kept a
snapshot of its locals). Twenty loaders in a row under `run` and `instrument`: none left.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import WORKLOADS, clean_env, kill_group, loadertop_cmd, short_tmpdir

JOB = str(WORKLOADS / "loader_lifetime.py")
pytestmark = pytest.mark.slow


def outcome(command: list[str], timeout: float = 120) -> dict:
    directory = short_tmpdir()
    out = subprocess.run(command, env=clean_env(directory), capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def assert_none_left(result: dict, loaders: int) -> None:
    assert result["workers"] == 2 * loaders
    assert result["alive_after_each"] == [0] * loaders, result
    assert result["alive_at_end"] == 0, result


@pytest.mark.parametrize("context, loaders", [("fork", 20), ("spawn", 1)])
def test_a_dropped_persistent_loader_stops_its_workers_under_run(context, loaders):
    command = loadertop_cmd("run", "-q", "--", sys.executable, JOB, "--context", context,
                            "--loaders", str(loaders))
    assert_none_left(outcome(command), loaders)


@pytest.mark.parametrize("context, loaders", [("fork", 20), ("spawn", 1)])
def test_a_dropped_persistent_loader_stops_its_workers_when_instrumented(context, loaders):
    command = [sys.executable, JOB, "--instrument", "--context", context, "--loaders", str(loaders)]
    assert_none_left(outcome(command), loaders)


def test_plain_torch_is_the_reference():
    assert_none_left(outcome([sys.executable, JOB, "--loaders", "3"]), 3)


def test_torchdata_stateful_loaders_stop_their_workers_under_run():
    command = loadertop_cmd("run", "-q", "--", sys.executable, JOB, "--stateful", "--loaders", "3")
    assert_none_left(outcome(command), 3)


@pytest.mark.skipif(sys.platform != "linux", reason="attach is Linux-only")
def test_a_dropped_persistent_loader_stops_its_workers_after_attach():
    """Attached while the first loader's loop runs (its iterator adopted through the frame that
    holds the loader), then two more loaders made and dropped while attached."""
    import shutil

    if shutil.which("gdb") is None and not hasattr(sys, "remote_exec"):
        pytest.skip("gdb is not installed (.ci/run installs it)")
    directory = short_tmpdir()
    flag = directory / "go"
    job = subprocess.Popen([sys.executable, JOB, "--loaders", "3", "--wait-for", str(flag)],
                           env=clean_env(directory), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        assert job.stdout.readline() == "up\n", job.stderr.read()
        attached = subprocess.run(loadertop_cmd("attach", str(job.pid)), env=clean_env(directory),
                                  capture_output=True, text=True, timeout=90)
        assert attached.returncode == 0, attached.stderr
        flag.write_text("")
        out, err = job.communicate(timeout=90)
        assert job.returncode == 0, err
        assert_none_left(json.loads(out.strip().splitlines()[-1]), 3)
    finally:
        kill_group(job)
