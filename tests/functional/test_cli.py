"""`loadertop --help`, `--version`, `snapshot --help` answer at once and never import torch
(docs/contract.md §2); neither do the viewer-side modules."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import loadertop

from conftest import REPO, clean_env, short_tmpdir

CONSOLE_SCRIPT = Path(sys.executable).parent / "loadertop"


def _run(cmd: list[str], **env) -> subprocess.CompletedProcess:
    directory = short_tmpdir()
    try:
        return subprocess.run(cmd, env=clean_env(directory, **env), capture_output=True, text=True,
                              timeout=60, cwd=REPO, stdin=subprocess.DEVNULL)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _imported_modules(profile_stderr: str) -> set[str]:
    """Module names from PYTHONPROFILEIMPORTTIME output ('import time: self | cumulative | name')."""
    names = set()
    for line in profile_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name and name != "imported package":
                names.add(name)
    return names


def _entry_points():
    yield pytest.param([sys.executable, "-m", "loadertop"], id="python-m")
    yield pytest.param([str(CONSOLE_SCRIPT)], id="console-script",
                       marks=pytest.mark.skipif(not CONSOLE_SCRIPT.exists(),
                                                reason="console script not installed next to python"))


@pytest.mark.parametrize("entry", _entry_points())
@pytest.mark.parametrize("args, expect", [
    (["--help"], "usage: loadertop"),
    (["-h"], "usage: loadertop"),
    (["--version"], f"loadertop {loadertop.__version__}"),
    (["snapshot", "--help"], "usage: loadertop snapshot"),
    (["record", "--help"], "usage: loadertop record"),
    (["replay", "--help"], "usage: loadertop replay"),
    (["attach", "--help"], "usage: loadertop attach"),
])
def test_answers_without_importing_torch(entry, args, expect):
    proc = _run(entry + args, PYTHONPROFILEIMPORTTIME="1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert expect in proc.stdout
    modules = _imported_modules(proc.stderr)
    assert "loadertop.cli" in modules or "loadertop" in modules, "import profiling did not work"
    heavy = sorted(m for m in modules if m == "torch" or m.startswith("torch.")
                   or m in ("textual", "numpy") or m.startswith("textual."))
    assert heavy == [], f"`loadertop {' '.join(args)}` imported {heavy[:5]}"
    non_profile = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert non_profile == []


def test_help_documents_the_commands():
    out = _run([sys.executable, "-m", "loadertop", "--help"]).stdout
    for word in ("snapshot", "run", "demo", "ENDPOINT", "--version"):
        assert word in out, word
    snap = _run([sys.executable, "-m", "loadertop", "snapshot", "--help"]).stdout
    for word in ("--json", "--seconds", "ENDPOINT"):
        assert word in snap, word


def test_version_matches_the_package():
    from loadertop._version import __version__

    out = _run([sys.executable, "-m", "loadertop", "--version"]).stdout.strip()
    assert out == f"loadertop {__version__}"
    assert __version__ and __version__[0].isdigit()


def test_unknown_option_is_a_usage_error_without_traceback():
    proc = _run([sys.executable, "-m", "loadertop", "snapshot", "--no-such-option"])
    assert proc.returncode == 2
    assert "usage:" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("module", [
    "loadertop",
    "loadertop.cli",
    "loadertop.wire",
    "loadertop.diagnosis",
    "loadertop.client.model",
    "loadertop.client.subscriber",
    "loadertop.views.text",
    "loadertop.tui.app",
    "loadertop.commands.snapshot",
    "loadertop.commands.record",
    "loadertop.commands.replay",
    "loadertop.commands.attach",
    "loadertop.attach.inject",
    "loadertop.recording.playback",
    "loadertop.tui.replay",
    "loadertop.commands.export",
    "loadertop.exporter.server",
    "loadertop.exporter.tensorboard",
    "loadertop.client.tracker_keys",
    "loadertop.system",
])
def test_viewer_side_modules_leave_torch_out(module):
    code = (f"import sys, {module}\n"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
            "print(len(bad), bad[:3])\n")
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("0 "), f"importing {module} imported torch: {proc.stdout}"


def test_instrument_is_importable_without_torch_until_used():
    """`import loadertop` stays light; the probe (and torch) load on the first instrument()."""
    code = ("import sys, loadertop\n"
            "assert 'torch' not in sys.modules\n"
            "assert 'loadertop.probe.loader' not in sys.modules\n"
            "print('ok')\n")
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


# argparse's own --help swallows the write error (exit 0); loadertop's own output exits as a writer
# killed by SIGPIPE would (141).
@pytest.mark.parametrize("args, code", [(["--help"], 0),
                                        (["keys", "{dir}", "--name", "viewer"], 128 + signal.SIGPIPE)])
def test_a_reader_that_went_away_is_no_traceback(args, code, tmp_path):
    """`loadertop ... | head`: the pipe closes before loadertop is done writing."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE (Python ignores SIGPIPE)
    try:
        proc = subprocess.run([sys.executable, "-m", "loadertop", *(a.format(dir=tmp_path) for a in args)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
                              env=clean_env(short_tmpdir()))
    finally:
        os.close(write_end)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
