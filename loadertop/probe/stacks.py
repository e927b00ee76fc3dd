"""Python stacks for hang forensics, read without ptrace or signals to the user's processes.

* The training loop's thread: `sys._current_frames()` from the publisher thread. A loop blocked in
  next() waits on a lock or a queue with the GIL released, so this thread can read it.
* A worker: its helper thread (`worker.WorkerWatchdog`, one per worker process) wakes once a second. When
  the worker has been inside one batch past STACK_AFTER_S it writes the worker's main-thread stack
  (`sys._current_frames()`, under the GIL: safe) to `<pid>.py.txt` in the private discovery
  directory. Each wake-up also re-arms `faulthandler.dump_traceback_later(FAULT_AFTER_S)` (~41 µs
  a second, FIELD-NOTES): CPython's C watchdog then writes every thread's stack to `<pid>.txt`
  only if this thread could not run for FAULT_AFTER_S — the worker stuck in C code holding the
  GIL. A C watchdog that dumps periodically instead (`repeat=True`) reads the frames of a running
  thread without the GIL, and crashed about one worker in ten here (CPython 3.11, within seconds);
  armed this way it fires only when no Python code has run for seconds, so the frames hold still.
  The main process reads the newer of the two files, only while a worker has been inside one
  batch for long.

A frame is `"file:line in function"`, innermost last. `user_frame` marks the innermost frame of
the user's own code: not the standard library, torch or loadertop (judged here, on the trainer's
side, where those paths are known).
"""

from __future__ import annotations

import os
import re
import sys
import time
import traceback

from loadertop import wire

# The worker's side (its watchdog) lives in probe/worker.py, which a worker imports alone.
from loadertop.probe.worker import FAULT_AFTER_S, STACK_AFTER_S, WATCHDOG_S  # noqa: F401

STACK_FILE_MAX_BYTES = 64 * 1024  # a C dump file is truncated past this
_TAIL_BYTES = 32 * 1024  # the latest dump is within this much of the file's end

# sysconfig's "stdlib" and "platstdlib" paths of the posix_prefix scheme (in a virtualenv the
# second is the venv's lib/pythonX.Y, site-packages included), without importing sysconfig
# (~1.3 ms of the probe's import here).
_PYTHON_DIR = f"python{sys.version_info[0]}.{sys.version_info[1]}"
_LIBRARY_DIRS = tuple({
    os.path.realpath(os.path.join(base, getattr(sys, "platlibdir", "lib"), _PYTHON_DIR)) + os.sep
    for base in (sys.base_prefix, sys.exec_prefix)
})
_LIBRARY_PARTS = (f"{os.sep}torch{os.sep}", f"{os.sep}numpy{os.sep}",
                  f"{os.sep}loadertop{os.sep}probe{os.sep}", f"{os.sep}loadertop{os.sep}__init__")


def is_library(path: str) -> bool:
    if path.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return True
    if any(part in path for part in _LIBRARY_PARTS):
        return True
    real = os.path.realpath(path) if os.path.isabs(path) else path
    if any(real.startswith(d) for d in _LIBRARY_DIRS):
        # The standard library, but not what pip installed under it.
        return "site-packages" not in real and "dist-packages" not in real
    return False


def make_stack(frames: list[tuple[str, int, str]], taken_at: float | None = None) -> wire.Stack:
    """(file, line, function) innermost last, as a wire Stack (the innermost MAX_FRAMES kept)."""
    frames = frames[-wire.MAX_FRAMES:]
    user = None
    for i in range(len(frames) - 1, -1, -1):
        if not is_library(frames[i][0]):
            user = i
            break
    text = [f"{path}:{line} in {func}"[: wire.MAX_TEXT] for path, line, func in frames]
    return wire.Stack(frames=text, user_frame=user,
                      taken_at=time.time() if taken_at is None else taken_at)


def thread_stack(thread_id: int) -> wire.Stack | None:
    """The stack of one thread of this process, or None when it is gone."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return None
    summary = traceback.extract_stack(frame, limit=wire.MAX_FRAMES)
    return make_stack([(f.filename, f.lineno or 0, f.name) for f in summary])


_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')


def parse_dump(text: str) -> list[tuple[str, int, str]] | None:
    """The main thread's frames (innermost last) of the latest complete faulthandler dump.

    A dump starts with "Timeout (...)!" and lists threads newest first, so the main thread (the
    first one made) comes last. The final dump in the file may still be being written: the one
    before it is used when there is one.
    """
    dumps = text.split("Timeout (")[1:]
    if not dumps:
        return None
    dump = dumps[-2] if len(dumps) >= 2 else dumps[-1]
    blocks = dump.split("\nThread 0x")
    if len(blocks) < 2:
        blocks = dump.split("Thread 0x")
    frames = []
    for line in blocks[-1].splitlines()[1:]:
        m = _FRAME.match(line)
        if m is None:
            if line.strip() in ("", "..."):
                continue
            break
        frames.append((m.group(1), int(m.group(2)), m.group(3)))
    if not frames:
        return None
    frames.reverse()  # faulthandler prints the most recent call first
    return frames


def read_dump_file(path: str, not_before: float = 0.0) -> wire.Stack | None:
    """The latest stack written to `path` (if written at `not_before`, Unix time, or later)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_mtime < not_before:
                return None
            f.seek(max(0, st.st_size - _TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    frames = parse_dump(text)
    return make_stack(frames, st.st_mtime) if frames else None


def read_worker_stack(stack_dir: str, pid: int, not_before: float) -> wire.Stack | None:
    """A worker's stack from its watchdog thread or, newer, from the C watchdog."""
    found = [s for s in (read_dump_file(os.path.join(stack_dir, f"{pid}.py.txt"), not_before),
                         read_dump_file(os.path.join(stack_dir, f"{pid}.txt"), not_before))
             if s is not None]
    return max(found, key=lambda s: s.taken_at) if found else None


def trim_dump_file(path: str) -> None:
    try:
        if os.stat(path).st_size > STACK_FILE_MAX_BYTES:
            os.truncate(path, 0)
    except OSError:
        pass


def remove_worker_files(stack_dir: str, pid: int) -> None:
    # .py.txt.tmp: a worker killed between writing its Python stack and renaming it leaves one
    for name in (f"{pid}.txt", f"{pid}.py.txt", f"{pid}.py.txt.tmp"):
        try:
            os.unlink(os.path.join(stack_dir, name))
        except OSError:
            pass

