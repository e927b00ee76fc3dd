"""The black box: every instrumented process keeps a bounded recording of its own reports on disk
(docs/contract.md §9, docs/blackbox.md), so that what happened when nobody watched can be read
after the fact (`loadertop ls`, `snapshot --from last`, `replay last`, `report last`).

What it keeps: the very frames the publisher sends (`wire.encode`d reports, the machine's figures,
goodbyes), in the recording format (`loadertop.recfile`, docs/recordings.md), as segments of one
job in the state directory (`loadertop.statedir`):

    <stem>.<writer>-recent-<n>.ltrec   every frame; a new segment every SEGMENT_S or when one
                                       reaches its share of the budget; the last RECENT_SEGMENTS
                                       kept (the last minutes at full detail)
    <stem>.<writer>-run.ltrec          the whole run decimated: per loader one report every
                                       `every_s` (at first DECIMATE_S, preferring one that carries
                                       the slow readings), more often while something is wrong (a
                                       stack, an error, a dead worker); when it outgrows its share
                                       it is rewritten with every other one and `every_s` doubles

Where the work runs: the publisher thread only appends (frame, message) to a bounded deque (no
lock, no I/O: a full deque drops the oldest); this module's own daemon thread wakes every
FLUSH_S, compresses, writes and flushes (Z_SYNC_FLUSH: a SIGKILL loses at most FLUSH_S), rotates
and thins. Everything on disk happens on that thread: creating the directory, pruning old runs,
the job's meta file. A disk that is full, read-only or refuses us (any OSError) turns the black
box off with one line on stderr; training never sees it.

At exit (atexit, registered before the publisher's own, so it runs after the publisher said
goodbye and those frames are in): how the run ended is decided on the exiting thread (an uncaught
exception leaves `sys.last_value`, set by the interpreter before atexit runs, CPython 3.10-3.13),
then the thread writes the rest, ends the segments and rewrites the meta with `ended`, waited for
at most EXIT_WAIT_S.
"""

from __future__ import annotations

import atexit
import encodings.ascii  # noqa: F401  (see below)
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from loadertop import environment, recfile, statedir, wire
from loadertop._version import __version__
from loadertop.discovery import ensure_private_dir
from loadertop.probe import stacks
from loadertop.probe.memory_watch import NEAR_SHARE, MemoryWatch, next_reading_s
from loadertop.system.cgroup import Cgroup, oom_counts

# The per-process budget (docs/blackbox.md says why). The last minutes in full are bounded by
# time (RECENT_SEGMENTS + 1 segments of SEGMENT_S) and, for a very fast loader, by RECENT_SHARE
# of the budget; the rest is the whole run's, decimated.
BUDGET_BYTES = 8 * 1024 * 1024
RECENT_SHARE = 0.25
RECENT_SEGMENTS = 4  # kept besides the one being written
SEGMENT_S = 60.0
DECIMATE_S = 10.0  # the run's file: one report per loader this often, at first
NOTABLE_S = 2.0  # ... and this often while a report carries a stack, an error or a dead worker
SYSTEM_S = 10.0  # the machine's figures, when no viewer asks for them every second
RESOURCE_WAIT_S = 6.0  # longer than the slow readings' period (probe/resources.py RESOURCE_S)
FLUSH_S = 2.0
QUEUE_FRAMES = 4096  # frames waiting for the black box's thread; beyond, the oldest are dropped
EXIT_WAIT_S = 1.0  # at exit, the longest the black box holds the process
SIGNAL_WAIT_S = 0.5
# Retention (at each job's start): ended jobs beyond these are removed, oldest first.
KEEP_RUNS = 50
KEEP_BYTES = 256 * 1024 * 1024
MAX_MESSAGE = 1024  # an exception's message kept in the meta

THREAD_NAME = "loadertop-blackbox"
# Everything the black box's thread runs is imported here, on the training thread: a fork (the
# DataLoader's workers, right after the probe starts) while another thread holds an import lock
# leaves it held in the child. statedir reads /proc and the cgroup files as ASCII, and that codec's
# module is otherwise imported at its first use (CPython 3.11), on that thread: hence the import
# of encodings.ascii above. tests/unit/test_blackbox_thread.py checks that the thread imports nothing.


def budget_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """LOADERTOP_BLACKBOX_MIB (a positive number of MiB), else BUDGET_BYTES."""
    raw = environ.get(environment.LOADERTOP_BLACKBOX_MIB)
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        value = 0.0
    return int(value * 1024 * 1024) if 0 < value <= 1024 * 1024 else BUDGET_BYTES


def start(*, pid: int, started_at: float, how: str,
          warn: Callable[[str], None] | None = None) -> BlackBox | None:
    """The black box of this process, started; None when LOADERTOP_BLACKBOX=0. Called on the
    training thread at the publisher's start: no I/O here (the thread does it)."""
    if not statedir.blackbox_enabled():
        return None
    box = BlackBox(statedir.state_dir(), pid=pid, started_at=started_at, how=how,
                   budget=budget_bytes(), warn=warn)
    box.start()
    return box


class _Segment:
    """One open recording file. Made under a hidden name and renamed once its header is written:
    a reader listing the directory never finds a segment without its header."""

    __slots__ = ("path", "writer", "opened_at")

    def __init__(self, path: Path, argv: list[str]) -> None:
        self.path = path
        hidden = path.with_name(f".{path.name}.new")
        _unlink(hidden)  # one left by a process killed at this very point (its pid was reused)
        self.writer = recfile.RecordingWriter(str(hidden), argv=argv, mode=0o600,
                                              clock=time.monotonic)
        os.replace(hidden, path)
        self.writer.path = str(path)
        self.opened_at = time.monotonic()

    def size(self) -> int:
        return self.writer.written


class BlackBox:
    def __init__(self, directory: Path, *, pid: int, started_at: float, how: str,
                 budget: int = BUDGET_BYTES, warn: Callable[[str], None] | None = None) -> None:
        self.directory = directory
        self.pid = pid
        self.started_at = started_at
        self.how = how if how in ("instrument", "run", "attach") else "instrument"
        self.budget = budget
        self.stem = statedir.stem_for(pid, started_at)
        # Two black boxes in one process (attach, detach, attach again) write segments of their own.
        self._writer_id = f"{int(time.time() * 1000) % 10**9:09d}"
        self.meta_path = directory / f"{self.stem}{statedir.META_SUFFIX}"
        self.endpoint: str | None = None  # set by the publisher once it listens
        self.on = True  # False once the disk refused us (or at the end): add() then does nothing
        self.dropped = 0
        self._queue: deque[tuple[float, bytes, object]] = deque(maxlen=QUEUE_FRAMES)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ended: statedir.Ended | None = None
        self._loop_error: wire.LoopError | None = None  # the last one a goodbye carried
        self._memory: MemoryWatch | None = None
        self._finished = threading.Event()
        self._meta: statedir.JobMeta | None = None
        self._argv = _command_line()
        self._recent: list[Path] = []  # closed recent segments, oldest first
        self._current: _Segment | None = None
        self._run: _Segment | None = None
        self._recent_n = 0
        self._recent_cap = max(4096, int(budget * RECENT_SHARE / (RECENT_SEGMENTS + 1)))
        self._run_cap = max(8192, budget - self._recent_cap * (RECENT_SEGMENTS + 1))
        self.every_s = DECIMATE_S
        self.notable_s = NOTABLE_S
        self.thinnings = 0
        self._thin_at = self._run_cap
        self._kept_at: dict[str, float] = {}  # source (or "system") -> when the run file kept one
        self.warning: str | None = None
        # The publisher's warn_once: the shim says one line at most, whatever went wrong first.
        self._warn = warn or _print_warning

    # ------------------------------------------------------------ the publisher's side
    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=THREAD_NAME, daemon=True)
        self._thread.start()
        atexit.register(self.finish)

    def add(self, frame: bytes, msg: object) -> None:
        """One frame the publisher sent (or would have): never blocks, never raises."""
        if self.on:
            if len(self._queue) == QUEUE_FRAMES:
                self.dropped += 1
            self._queue.append((time.time(), frame, msg))
            if type(msg) is wire.Goodbye and msg.error is not None:
                self._loop_error = msg.error  # a SystemExit out of next(): how the process exits

    def finish(self, ended: statedir.Ended | None = None, wait_s: float = EXIT_WAIT_S) -> None:
        """End the recording: how the run ended (by default read from the exiting interpreter),
        the frames still queued, the segments' end marks, the meta. Waits at most `wait_s`."""
        if self.pid != os.getpid() or self._finished.is_set() or self._ended is not None:
            return
        try:
            self._ended = ended if ended is not None else how_it_ended(self._loop_error)
        except Exception:
            self._ended = statedir.Ended(kind="finished", at=time.time())
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._finished.wait(wait_s)

    # ------------------------------------------------------------ the black box's thread
    def _main(self) -> None:
        try:
            self._open()
        except Exception as exc:
            self._fail(exc)
            return
        try:
            next_flush = time.monotonic() + FLUSH_S
            wait = min(FLUSH_S, self._read_memory()) if self._memory is not None else FLUSH_S
            while True:
                if self._stop.wait(wait):
                    self._write_queued()
                    self._close()
                    return
                reading_s = self._read_memory() if self._memory is not None else FLUSH_S
                now = time.monotonic()
                if now >= next_flush:
                    self._write_queued()
                    self._flush()
                    next_flush = now + FLUSH_S
                wait = max(0.0, min(next_flush - now, reading_s))
        except Exception as exc:
            self._fail(exc)
        finally:
            self._finished.set()

    def _open(self) -> None:
        ensure_private_dir(self.directory)
        try:
            statedir.prune(self.directory, KEEP_RUNS, KEEP_BYTES, protect=self.stem)
        except OSError:
            pass
        self._meta = statedir.JobMeta(
            format=statedir.STATE_FORMAT, pid=self.pid, started_at=self.started_at,
            start_ticks=statedir.process_start_ticks(self.pid), boot_id=statedir.boot_id(),
            host=statedir.hostname(), argv=self._argv, cwd=_cwd(), how=self.how,  # type: ignore[arg-type]
            loadertop_version=__version__, budget_bytes=self.budget,
            machine_memory_bytes=_machine_memory(), **self._cgroups())
        statedir.write_meta(self.meta_path, self._meta)
        self._current = self._new_recent()
        self._run = _Segment(self._segment_path("run"), self._argv)

    def _cgroups(self) -> dict[str, Any]:
        """The job's memory cgroup directories (innermost first), each with its limit and OOM-kill
        counters now (the reader compares them later to tell an OOM kill); and the watch of the
        binding limit (`probe/memory_watch.py`)."""
        try:
            group = Cgroup.detect()
        except Exception:
            return {}
        found = []
        for directory in group.memory_dirs[:64]:
            limit = Cgroup(version=group.version, memory_dirs=(directory,)).mem_limit_bytes()
            counts = oom_counts(directory, group.version)
            found.append(statedir.CgroupAtStart(path=directory[:4096], limit_bytes=limit,
                                                oom_kills=counts.kills,
                                                oom_group_kills=counts.group_kills))
        self._memory = MemoryWatch.of(group)
        return {"cgroup_version": group.version, "cgroups": found}

    def _read_memory(self) -> float:
        """Read the memory cgroup's usage; near its limit, keep the reading in the meta (taken
        off again once usage falls back). Returns how soon to read again."""
        assert self._memory is not None
        reading = self._memory.read()
        meta = self._meta
        if reading is None or meta is None:
            return FLUSH_S
        used, limit = reading
        if used >= NEAR_SHARE * limit:
            near: statedir.MemoryReading | None = statedir.MemoryReading(
                at=time.time(), used_bytes=used, limit_bytes=limit)
        elif meta.near_limit is not None:
            near = None
        else:
            return next_reading_s(used, limit, FLUSH_S)
        self._meta = msgspec.structs.replace(meta, near_limit=near)
        statedir.write_meta(self.meta_path, self._meta)
        return next_reading_s(used, limit, FLUSH_S)

    def _segment_path(self, part: str) -> Path:
        return self.directory / f"{self.stem}.{self._writer_id}-{part}{statedir.RECORDING_SUFFIX}"

    def _new_recent(self) -> _Segment:
        self._recent_n += 1
        return _Segment(self._segment_path(f"recent-{self._recent_n:05d}"), self._argv)

    def _write_queued(self) -> None:
        current, run = self._current, self._run
        if current is None or run is None:
            return
        endpoint = self.endpoint
        queue = self._queue
        while queue:
            at, frame, msg = queue.popleft()
            current.writer.add(frame, at, endpoint)
            if self._keep_in_run(msg, at):
                run.writer.add(frame, at, endpoint)

    def _keep_in_run(self, msg: object, at: float) -> bool:
        """Whether the run's decimated file keeps this frame too."""
        if isinstance(msg, wire.LoaderReport):
            key = msg.source
            since = at - self._kept_at.get(key, float("-inf"))
            if _notable(msg):
                due = since >= min(self.every_s, self.notable_s)
            elif msg.resources is not None:
                due = since >= self.every_s
            else:  # wait a little for one that carries the slow readings: the memory trends
                due = since >= self.every_s + RESOURCE_WAIT_S
        elif isinstance(msg, wire.SystemReport):
            key = "system"
            due = at - self._kept_at.get(key, float("-inf")) >= self.every_s
        else:
            return True  # goodbyes: rare, and they say how a loader ended
        if due:
            self._kept_at[key] = at
        return due

    def _flush(self) -> None:
        current, run = self._current, self._run
        if current is None or run is None:
            return
        current.writer.flush()
        run.writer.flush()
        if current.size() >= self._recent_cap or time.monotonic() - current.opened_at >= SEGMENT_S:
            current.writer.close("rotated")
            self._recent.append(current.path)
            self._current = self._new_recent()
            while len(self._recent) > RECENT_SEGMENTS:
                _unlink(self._recent.pop(0))
        if run.size() > self._thin_at:
            self._thin_run()

    def _thin_run(self) -> None:
        """The run's file outgrew its share: keep every other report of it, and from now on keep
        half as many (`every_s` and `notable_s` double: a hang of hours, whose every report
        carries a stack, is thinned too)."""
        run = self._run
        assert run is not None
        run.writer.flush()
        self.every_s *= 2
        self.notable_s *= 2
        self.thinnings += 1
        tmp = self.directory / f".{run.path.name}.thin"
        thinned = _Segment(tmp, self._argv)
        kept: dict[str, float] = {}
        for frame in recfile.iter_frames(str(run.path)):
            try:
                msg = wire.decode(frame.frame)
            except wire.WireError:
                continue
            key = msg.source if isinstance(msg, wire.LoaderReport) else \
                "system" if isinstance(msg, wire.SystemReport) else None
            if key is not None:
                every = self.notable_s if isinstance(msg, wire.LoaderReport) and _notable(msg) \
                    else self.every_s
                if frame.received_at - kept.get(key, float("-inf")) < every:
                    continue
                kept[key] = frame.received_at
            thinned.writer.add(frame.frame, frame.received_at, frame.endpoint)
        thinned.writer.flush()
        os.replace(tmp, run.path)  # the open file descriptor follows the file
        thinned.path = run.path
        thinned.writer.path = str(run.path)
        run.writer.abandon()  # its file is gone from the directory
        self._run = thinned
        # Thinned again only once it has grown by a quarter of its share: never at every flush,
        # whatever the thinning could not remove.
        self._thin_at = max(self._run_cap, thinned.size() + self._run_cap // 4)

    def _close(self) -> None:
        self.on = False
        for segment in (self._current, self._run):
            if segment is not None:
                segment.writer.close("exit")
        if self._meta is not None and self._ended is not None:
            statedir.write_meta(self.meta_path, msgspec.structs.replace(self._meta, ended=self._ended))

    def _fail(self, exc: BaseException) -> None:
        self.on = False
        self._queue.clear()
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        self.warning = f"the black box is off: cannot write to {self.directory} ({reason}); " \
                       "training continues"
        self._warn(self.warning)
        for segment in (self._current, self._run):
            if segment is not None:
                segment.writer.abandon()
        self._finished.set()


def _print_warning(message: str) -> None:
    try:
        print(f"loadertop: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass


def _notable(msg: wire.LoaderReport) -> bool:
    if msg.error is not None or msg.loop_stack is not None:
        return True
    return any(w.stack is not None or w.alive is False for w in msg.workers)


def how_it_ended(loop_error: wire.LoopError | None = None) -> statedir.Ended:
    """What the exiting interpreter says: an uncaught exception left `sys.last_value` (set before
    atexit handlers run); else it finished. The exit code is not known here (CPython 3.10-3.13
    keeps an uncaught SystemExit nowhere atexit can read), except when `loop_error`, the last
    exception a loop's next() let out, is the SystemExit the process exits with (a signal's
    handler raising `SystemExit(128 + signum)` while the loop waits for a batch)."""
    now = time.time()
    exc = getattr(sys, "last_value", None)
    if isinstance(exc, SystemExit):
        return statedir.Ended(kind="finished", at=now, exit_code=statedir.system_exit_code(str(exc)))
    if exc is None:
        if loop_error is not None and loop_error.type == "SystemExit":
            return statedir.Ended(kind="finished", at=now,
                                  exit_code=statedir.system_exit_code(loop_error.message))
        return statedir.Ended(kind="finished", at=now)
    try:
        message = str(exc)
    except Exception:
        message = "<str() failed>"
    frames = traceback.extract_tb(getattr(sys, "last_traceback", None))
    stack = stacks.make_stack([(f.filename, f.lineno or 0, f.name) for f in frames], now)
    frame = None
    if stack.frames:
        frame = stack.frames[stack.user_frame if stack.user_frame is not None else -1]
    return statedir.Ended(kind="exception", at=now, exc_type=type(exc).__name__[:256],
                          message=message[:MAX_MESSAGE], frame=frame)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _command_line() -> list[str]:
    """This process's argv as the kernel has it (the interpreter and its options included), else
    Python's."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read(256 * 1024).rstrip(b"\0").split(b"\0")]
    except OSError:
        argv = [sys.executable, *sys.argv]
    return [a[:4096] for a in argv][:256]


def _cwd() -> str:
    try:
        return os.getcwd()[:4096]
    except OSError:
        return ""


def _machine_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
