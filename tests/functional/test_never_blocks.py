"""The shim never blocks or breaks training (docs/contract.md §1): no viewer, a viewer frozen by SIGSTOP, a
viewer killed mid-run, a transport that cannot be set up. Only completion is asserted here;
throughput with a frozen viewer is measured by tests/benchmarks/overhead.py."""

from __future__ import annotations

import shutil
import signal
import time

import pytest

from conftest import VIEWER, SnapshotRun, Workload, short_tmpdir

pytestmark = pytest.mark.slow

FINISH_S = 60.0  # generous: a loaded 2-core machine; a blocked loop would never finish at all


def _shim_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "loadertop" in line.lower()]


def _assert_finished(wl: Workload, batches: int | None = None) -> dict:
    rc = wl.wait(FINISH_S)
    st = wl.status()
    assert rc == 0, f"rc {rc}\n{wl.stderr()[-3000:]}"
    assert st["phase"] == "done", st
    if batches is not None:
        assert st["batches"] == batches
    return st


def test_training_finishes_with_no_viewer_and_with_broken_transports(workload, request):
    def request_cleanup(path):
        request.addfinalizer(lambda: shutil.rmtree(path, ignore_errors=True))

    args = ("--kind", "cheap", "--workers", 2, "--batch-size", 2, "--batches", 300, "--duration", 120)
    parent = short_tmpdir()
    request_cleanup(parent)
    long_dir = parent / ("d" * 120)  # an ipc path longer than a unix socket allows
    runs = {
        "no viewer": workload(*args),
        "unbindable endpoint": workload(*args, env={"LOADERTOP_ENDPOINT": "tcp://256.1.1.1:1"}),
        "not an endpoint": workload(*args, env={"LOADERTOP_ENDPOINT": "bogus"}),
        "dir is a file": workload(*args, env={"LOADERTOP_DIR": "/dev/null/lt"}),
        "ipc path too long": workload(*args, env={"LOADERTOP_DIR": str(long_dir)}),
    }
    for name, wl in runs.items():
        _assert_finished(wl, 300)
        lines = _shim_lines(wl.stderr())
        if name == "no viewer":
            assert lines == [], lines
            assert not wl.entry_path.exists()  # removed at exit
        else:
            assert len(lines) <= 1, f"{name}: more than one warning: {lines}"


def _start_viewers(wl: Workload, endpoint: str, *, read: bool):
    viewer = Workload(endpoint, *(["--read"] if read else []), script=VIEWER)
    snap = SnapshotRun(wl.dir, seconds=60)
    return viewer, snap


@pytest.mark.parametrize("fate", ["frozen", "killed"])
def test_training_finishes_despite_a_frozen_or_killed_viewer(workload, fate):
    # The job runs until told (a 4 s job ended before its viewers were frozen or killed where
    # they took long to start); FINISH_S caps it.
    wl = workload("--kind", "cheap", "--workers", 2, "--batch-size", 1, "--stop-when-told",
                  "--duration", FINISH_S, "--batches", 10**9)
    entry = wl.wait_discovery()
    viewer, snap = _start_viewers(wl, entry["endpoint"], read=(fate == "killed"))
    try:
        # the subscription is established once the viewer got its first frame
        deadline = time.monotonic() + 30
        while "first" not in viewer.stdout():
            assert viewer.alive(), viewer.stdout() + viewer.stderr()
            assert time.monotonic() < deadline, "the viewer never received a frame"
            time.sleep(0.02)
        if fate == "frozen":
            viewer.send(signal.SIGSTOP)
            snap.proc.send_signal(signal.SIGSTOP)
        else:
            viewer.send(signal.SIGKILL)
            snap.proc.kill()
        frozen_at = wl.status().get("batches", 0)
        # the loop keeps going while the viewers are frozen / dead ...
        wl.wait_status(lambda st: st["batches"] >= frozen_at + 200, timeout=FINISH_S,
                       what="progress after the viewer stopped")
        # ... finishes, and exits promptly (no linger on the stuck subscribers)
        wl.tell("stop")
        done = wl.wait_status(lambda st: st["phase"] == "done", timeout=FINISH_S, what="the end")
        rc = wl.wait(FINISH_S)
        assert rc == 0, wl.stderr()[-3000:]
        assert time.time() - done["t"] < 15, "exit was held up"
        assert done["batches"] > frozen_at
        assert _shim_lines(wl.stderr()) == []
    finally:
        viewer.kill()
        snap.proc.kill()
        snap.proc.wait()
