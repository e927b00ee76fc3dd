"""`loadertop demo`: run the bundled synthetic training job and open the viewer on it.

The job (`loadertop.examples.demo_train`, shipped inside the package so an installed wheel has it)
runs as a child process with a private discovery directory and an explicit ipc endpoint in a
fresh 0700 temporary directory; the viewer subscribes to exactly that endpoint, so other
instrumented jobs of the same user never show up in the demo, and the demo never shows up in
theirs. The child runs in its own session (process group): on quit — or when the TUI crashes —
it gets SIGTERM, then SIGKILL for the whole group after `STOP_GRACE_S`. Should this process die
without cleaning up, the child notices its parent is gone and exits by itself (`--parent-pid`).

With `--once`, or when stdout is not a terminal, no screen is opened: the job runs for
`--seconds` (default: one pass through all phases) and one report per phase is printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from loadertop import environment
from loadertop.commands.common import print_error
from loadertop.commands.view import MIN_REFRESH_S
from loadertop.examples import demo_train  # imports no torch: the job does, in its own process
from loadertop.launch import ChildWatch, signal_group, start_in_session

if TYPE_CHECKING:
    from loadertop.client.document import Document
    from loadertop.client.subscriber import Subscriber

JOB_MODULE = "loadertop.examples.demo_train"
STOP_GRACE_S = 5.0  # SIGTERM, then this long for the job to stop its workers, then SIGKILL
STARTUP_TIMEOUT_S = 60.0  # --once: no data by then is an error (importing torch takes seconds)
# The job's exit codes after we stopped it: its SIGTERM handler exits 128 + 15; killed: -15 / -9.
STOPPED_CODES = (0, 128 + signal.SIGTERM, -signal.SIGTERM, -signal.SIGKILL)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loadertop demo",
        description="Run a synthetic training job (CPU only, offline) whose input pipeline goes "
                    "through phases — healthy, I/O-bound, CPU-bound, CPU saturated — and watch "
                    "it in the loadertop viewer. Quit with q; the job stops with the viewer.")
    demo_train.add_phase_arguments(p)
    p.add_argument("--refresh", type=float, default=1.0, metavar="S",
                   help="seconds between screen refreshes (default 1)")
    p.add_argument("--no-color", action="store_true", help="no colours (also: NO_COLOR=1)")
    p.add_argument("--once", action="store_true",
                   help="no screen: run the job and print a report per phase (also when stdout "
                        "is not a terminal)")
    p.add_argument("--seconds", type=float, default=None, metavar="S",
                   help="with --once: how long to watch once data flows (default: every phase once)")
    return p


class DemoJob:
    """The child training process, its private directory, and how to stop it."""

    def __init__(self, *, phase_seconds: float, phases: tuple[demo_train.Phase, ...]) -> None:
        self.phase_seconds = phase_seconds
        self.phases = phases
        # mkdtemp creates the directory 0700: only we can connect to the job's ipc sockets.
        self.directory = Path(tempfile.mkdtemp(prefix="loadertop-demo-"))
        self.endpoint = f"ipc://{self.directory}/demo.sock"
        self.phase_file = self.directory / "phase.json"
        self.log_path = self.directory / "demo.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.watch: ChildWatch | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ)
        env.pop(environment.LOADERTOP_DISABLE, None)
        env[environment.LOADERTOP_DIR] = str(self.directory)
        env[environment.LOADERTOP_ENDPOINT] = self.endpoint
        env.setdefault("PYTHONWARNINGS", "ignore")  # e.g. torch's "Failed to initialize NumPy"
        cmd = [sys.executable, "-m", JOB_MODULE,
               *demo_train.phase_command_line(self.phase_seconds, self.phases),
               "--phase-file", str(self.phase_file), "--parent-pid", str(os.getpid())]
        self._log = log = open(self.log_path, "wb")
        # Its output goes to a log (the screen is the viewer's); its own session keeps terminal
        # signals (Ctrl-C, SIGHUP) to us, who stop it in order, and lets us kill its workers too.
        self.proc = start_in_session(cmd, env, stdout=log, stderr=subprocess.STDOUT)
        # Its black box hears from us how it ended: stopped by our SIGTERM, its handler exits
        # 128 + 15, which the job's own atexit cannot tell from a normal exit (docs/contract.md §9).
        self.watch = ChildWatch(self.proc.pid, env)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def phase(self) -> dict[str, Any] | None:
        """The phase the job announced last (None before it started iterating)."""
        try:
            with open(self.phase_file) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def note(self) -> str | None:
        """One line for the viewer's header: which phase runs, what it should look like."""
        code = self.exit_code()
        if code is not None:
            return f"demo job exited (code {code}); q quits"
        ph = self.phase()
        if ph is None:
            return "demo: starting the job…"
        left = max(0.0, float(ph.get("ends_at", 0)) - time.time())
        return (f"demo phase {ph.get('index', 0) + 1}/{ph.get('count', '?')}: {ph.get('title')}"
                f" · next in {left:.0f} s")

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> int | None:
        """SIGTERM, wait up to STOP_GRACE_S, then SIGKILL the job's process group. Idempotent."""
        proc = self.proc
        code = None
        if proc is not None:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    _kill_group(proc.pid)
                    proc.wait()
            code = proc.returncode
            if self.watch is not None:
                self.watch.record(code)
                self.watch = None
            # Workers exit with their parent (torch checks every 5 s); don't leave them that long.
            _kill_group(proc.pid)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def cleanup(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    # The group's id is the job's pid (its own session); the kernel keeps that id from being
    # reused while any member of the group lives, and once none does this is ESRCH.
    signal_group(pgid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    once = args.once or not sys.stdout.isatty()
    if not once and args.refresh < MIN_REFRESH_S:
        print_error(f"--refresh must be at least {MIN_REFRESH_S} s")
        return 2
    if args.seconds is not None and args.seconds <= 0:
        print_error("--seconds must be positive")
        return 2
    # The job runs in this very Python (sys.executable): without torch here it cannot start.
    if importlib.util.find_spec("torch") is None:
        print(f"loadertop demo: the demo's training job needs torch, which this Python "
              f"({sys.executable}) does not have: pip install torch (watching other jobs needs "
              f"none)", file=sys.stderr)
        return 1

    job = DemoJob(phase_seconds=args.phase_seconds, phases=args.phases)
    try:
        job.start()  # first: its torch import overlaps with ours of textual
        if once:
            seconds = args.seconds if args.seconds is not None else \
                args.phase_seconds * len(args.phases)
            return run_once(job, seconds)
        return run_screen(job, refresh_s=args.refresh, no_color=environment.no_color(args.no_color))
    finally:
        job.stop()
        job.cleanup()


def _subscriber(job: DemoJob, window_s: float = 3.0) -> Subscriber:
    from loadertop.client.model import Model
    from loadertop.client.subscriber import Subscriber

    # Exactly the job's endpoint, no discovery: other jobs of this user stay out of the demo.
    # (An ipc connect before the job binds is retried by ZeroMQ until the socket appears.)
    return Subscriber(Model(window_s=window_s), [job.endpoint], directory=job.directory,
                      discover=False)


def run_screen(job: DemoJob, *, refresh_s: float, no_color: bool) -> int:
    from loadertop.commands.view import run_app

    run_app(_subscriber(job), refresh_s=refresh_s, no_color=no_color, note=job.note,
            on_stuck=job.stop)  # a screen that cannot leave (its terminal gone) still stops the job
    code = job.exit_code()
    if code not in (None, 0):
        print_error(f"the demo job exited with code {code}; its last output:\n{job.log_tail()}")
        return 1
    return 0


def run_once(job: DemoJob, seconds: float) -> int:
    """Watch `seconds` from the first data on; print a report at the end of each phase."""
    from loadertop.views.text import render_text

    # Judge often enough for the verdict's hysteresis (3 updates) to settle inside a short phase.
    step_s = min(1.0, job.phase_seconds / 6)
    sub = _subscriber(job, window_s=min(3.0, job.phase_seconds * 0.6))
    model = sub.model
    reports: list[str] = []
    current: tuple[dict[str, Any] | None, Document] | None = None  # (phase, its last document)
    try:
        start = time.monotonic()
        first_data: float | None = None
        next_doc = 0.0
        while True:
            sub.poll(timeout_ms=50)
            now_m = time.monotonic()
            code = job.exit_code()
            if code is not None:
                print_error(f"the demo job exited early (code {code}); its last output:\n"
                            f"{job.log_tail()}")
                return 1
            if first_data is None:
                if any(s.last is not None for s in model.sources.values()):
                    first_data = now_m
                elif now_m - start > STARTUP_TIMEOUT_S:
                    print_error(f"no data from the demo job within {STARTUP_TIMEOUT_S:g} s; its "
                                f"output:\n{job.log_tail()}")
                    return 1
                continue
            if now_m < next_doc:
                if now_m - first_data >= seconds:
                    break
                continue
            next_doc = now_m + step_s
            doc = model.advance(time.time())
            phase = job.phase()
            key = (phase or {}).get("started_at")
            if current is not None and current[0] is not None and \
                    current[0].get("started_at") != key:
                reports.append(_phase_report(current[0], current[1], render_text))
            current = (phase, doc)
            if now_m - first_data >= seconds:
                break
        if current is not None:
            reports.append(_phase_report(current[0], current[1], render_text))
    finally:
        sub.close()
    code = job.stop()
    sys.stdout.write("\n".join(reports))
    sys.stdout.write(f"\ndemo job (pid {job.pid}) stopped"
                     f"{'' if code is None or code in STOPPED_CODES else f', exit code {code}'}\n")
    return 0


def _phase_report(phase: dict[str, Any] | None, doc: Document,
                  render_text: Callable[[Document], str]) -> str:
    if phase is None:
        head = "== demo: starting =="
    else:
        shown = doc.diagnosis.category
        head = (f"== demo phase {phase.get('index', 0) + 1}/{phase.get('count', '?')}: "
                f"{phase.get('title')} — expected {phase.get('expect')}, diagnosed {shown} ==")
    return head + "\n" + render_text(doc)
