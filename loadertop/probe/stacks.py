"""Python stacks for hang forensics, read without ptrace.

* The training loop's thread: `sys._current_frames()` from the publisher thread. A loop blocked in
  next() waits on a lock or a queue with the GIL released, so this thread can read it.
* A worker: no thread of ours runs there (see probe/worker.py: a thread in a forked worker costs
  CPU at every epoch start). Its hook registers CPython's faulthandler for STACK_SIGNAL
  (SIGURG, ignored by default) with an anonymous memory file (read here as /proc/<pid>/fd/<fd>;
  `<pid>.txt` in the private discovery directory where there is no memfd), and names it in its
  start message, sent after its first batch; for a worker stuck before that, the main process
  finds it among the worker's open files (`find_worker_stack_file`). When torch's `_task_info`
  shows that worker inside one batch for STACK_AFTER_S and a viewer is subscribed, the main
  process sends it STACK_SIGNAL
  (`ask_worker_stack`), again after 1, 2 and 4 s, then every 8 s while it stays there (hang_forensics.py
  `_worker_stack`); the C handler writes the stack of the thread it
  interrupts (the worker's main thread, torch's worker loop) even while it is stuck in C holding
  the GIL, and the frames it reads hold still: it runs on that very thread. A watchdog that
  dumped from another thread (`dump_traceback_later(repeat=True)`) read a *running* thread's
  frames and crashed workers (CPython 3.11; docs/performance.md).
  The main process reads the file's latest dump written since it asked.

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

# The worker's side lives in probe/worker.py, which a worker imports alone.
from loadertop.probe.worker import STACK_AFTER_S as STACK_AFTER_S
from loadertop.probe.worker import STACK_MEMFD_NAME as STACK_MEMFD_NAME
from loadertop.probe.worker import STACK_REFRESH_S as STACK_REFRESH_S
from loadertop.probe.worker import STACK_SIGNAL as STACK_SIGNAL
from loadertop.probe.worker import stack_file_in as stack_file_in

STACK_FILE_MAX_BYTES = 64 * 1024  # a C dump file is truncated past this
_TAIL_BYTES = 32 * 1024  # the latest dump is within this much of the file's end

# sysconfig's "stdlib" and "platstdlib" paths of the posix_prefix scheme (in a virtualenv the
# second is the venv's lib/pythonX.Y, site-packages included), without importing sysconfig
# (a noticeable part of the probe's import: docs/performance.md).
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
    # arg-type: lists go out as tuples do (msgpack arrays), wire's types are as decoded
    return wire.Stack(frames=text, user_frame=user,  # type: ignore[arg-type]
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
    """The frames (innermost last) of the latest complete faulthandler dump in `text`.

    A dump asked for with STACK_SIGNAL starts with "Stack (most recent call first):" and lists
    the interrupted thread alone; one from `dump_traceback_later` ("Timeout (...)!") lists every
    thread, newest first, so its main thread (the first one made) comes last. The final dump in
    the file may still be being written: the one before it is used when there is one.
    """
    dumps = [d for d in re.split(r"^(?=Stack \(|Timeout \()", text, flags=re.M)
             if d.startswith(("Stack (", "Timeout ("))]
    if not dumps:
        return None
    for dump in dumps[-2:]:
        frames = _main_thread_frames(dump)
        if frames:
            return frames
    return None


def _main_thread_frames(dump: str) -> list[tuple[str, int, str]] | None:
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
            if st.st_mtime < not_before or st.st_size == 0:
                return None
            f.seek(max(0, st.st_size - _TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    frames = parse_dump(text)
    return make_stack(frames, st.st_mtime) if frames else None


def is_worker_stack_file(path: str, pid: int, stack_dir: str | None) -> bool:
    """`path` is what `arm_stack_dump` makes for `pid`: its memfd, or its file in `stack_dir`."""
    if re.fullmatch(rf"/proc/{pid}/fd/\d{{1,9}}", path):
        return True
    return bool(stack_dir and path == stack_file_in(stack_dir, pid))


MAX_FDS_SEARCHED = 4096  # a worker's open files looked at for its memfd, lowest numbers first


def find_worker_stack_file(pid: int, stack_dir: str | None) -> str | None:
    """The stack file `arm_stack_dump` made in worker `pid`, found without its start message:
    a worker sends that after its first batch, so one stuck in that batch never does. Its memfd
    (named STACK_MEMFD_NAME; made before the worker's other files, so among its lowest fds) as
    /proc/<pid>/fd/<fd>, else its file in `stack_dir`; None where it has neither: nothing armed,
    or the program took STACK_SIGNAL and the worker withdrew it (worker._stack_file)."""
    fd_dir = f"/proc/{pid}/fd"
    memfd = f"/memfd:{STACK_MEMFD_NAME}"
    try:
        fds = sorted(int(name) for name in os.listdir(fd_dir) if name.isdigit())
    except OSError:
        fds = []
    for fd in fds[:MAX_FDS_SEARCHED]:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target in (memfd, f"{memfd} (deleted)"):
            return f"{fd_dir}/{fd}"
    if stack_dir:
        path = stack_file_in(stack_dir, pid)
        if os.path.exists(path):
            return path
    return None


def ask_worker_stack(pid: int) -> bool:
    """Send STACK_SIGNAL to a worker that announced its handler; False when it is gone. The
    caller checks that `pid` is a live worker of its loader first; SIGURG does nothing to a
    process that has no handler for it (a pid reused in between)."""
    try:
        os.kill(pid, STACK_SIGNAL)
        return True
    except OSError:
        return False


def trim_dump_file(path: str) -> None:
    try:
        if os.stat(path).st_size > STACK_FILE_MAX_BYTES:
            os.truncate(path, 0)
    except OSError:
        pass


def remove_worker_files(stack_dir: str, pid: int) -> None:
    try:
        os.unlink(stack_file_in(stack_dir, pid))
    except OSError:
        pass

