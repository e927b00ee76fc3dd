"""`commands.view.run_until_exit`: SIGTERM and SIGHUP end a Textual app as `q` does, and where that
exit hangs (Textual's shutdown waiting on a terminal that is gone) the process still ends, after
the grace period, having called `on_stuck` (the demo stops its job there). Each case runs a real
Textual app (headless) in a child process, signalled as a closed terminal or a `kill` signals it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, wait_for

HUNG_S = 60.0  # tells a hang from a slow exit; the cases' outcomes do not depend on the machine

CHILD = textwrap.dedent("""
    import sys, threading
    from textual.app import App
    from loadertop.commands.view import run_until_exit

    stuck, grace, marker = sys.argv[1] == "stuck", float(sys.argv[2]), sys.argv[3]

    class Probe(App):
        def run(self, **kw):
            return super().run(headless=True, **kw)

        def on_mount(self):
            print("ready", flush=True)

        def on_unmount(self):
            if stuck:  # as Textual 8.2's LinuxDriver.close waited on a terminal that was gone
                threading.Event().wait()

    def on_stuck():
        open(marker, "w").write("stopped")

    run_until_exit(Probe(), on_stuck, grace_s=grace)
    print("returned", flush=True)
""")


def _start(case: str, grace_s: float, marker) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, case, str(grace_s), str(marker)],
                            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    wait_for(lambda: proc.stdout.readline().strip() == "ready" or proc.poll() is not None,
             HUNG_S, "the app's mount")
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    return proc


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_an_exit_that_hangs_still_ends_the_process_after_stopping_what_it_must(tmp_path, signum):
    marker = tmp_path / "on_stuck"
    proc = _start("stuck", 0.5, marker)
    try:
        proc.send_signal(signum)
        assert proc.wait(HUNG_S) == 128 + signum, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.kill()
        proc.wait()
    assert marker.read_text() == "stopped"


def test_an_exit_that_completes_returns_and_never_calls_on_stuck(tmp_path):
    marker = tmp_path / "on_stuck"
    proc = _start("leaves", HUNG_S, marker)
    try:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=HUNG_S)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert out.strip().endswith("returned"), (out, err)
    assert not marker.exists()
