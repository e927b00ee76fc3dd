"""Slow readings of the training process and its workers, on the publisher thread only.

Every `RESOURCE_S`, while a viewer is subscribed, the publisher calls `ResourceSampler.sample`
with the current epoch's (worker id, pid) pairs. Per process: RSS, open file descriptors (the
entries of ``/proc/PID/fd``) and threads, and for the main process the soft ``RLIMIT_NOFILE``
(their cost per process: docs/performance.md).

USS and PSS (psutil ``memory_full_info``, the kernel's ``/proc/PID/smaps_rollup``) are the dear
part: the kernel visits every resident page to tell private from shared, so their cost grows with
the resident size (a worker of a large in-memory dataset pays most; docs/performance.md). So they
are read only as often as `USS_CPU_SHARE` of one
core allows: after a round of them the next waits ``cost / USS_CPU_SHARE`` (at least
`RESOURCE_S`); the rounds in between report them as None. The kernel does the work inside
``read()``, with the GIL released (a thread reading it nonstop left a counting loop in the main
thread most of its pace: docs/performance.md): the training thread is not held up.

The main process's own USS/PSS, which no finding needs, only every `MAIN_USS_S`.

``LOADERTOP_RESOURCE_S`` (read once, at import) is a test hook: the interval in seconds, with
every round a full one (no CPU share, the main process's USS every round too). The publisher
samples at most once a `SLOW_S` tick (1 s).

Never raises: a process that vanishes mid-read, or that we may not read, gives None figures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Final

from loadertop import environment, wire

# psutil, given by the publisher thread when a viewer first subscribes (publisher._loading):
# only a viewer reads these figures (and the workers' CPU and RSS in worker_resources.py, which reads this
# name too), and a program nobody watches does not import it.
psutil: Any = None  # the module, once given (it has no type information)


def use_psutil(module: Any) -> None:
    global psutil
    psutil = module

try:  # Unix only
    import resource as _resource
except ImportError:  # pragma: no cover - Windows
    _resource = None  # type: ignore[assignment]


def _interval_override() -> float | None:
    raw = os.environ.get(environment.LOADERTOP_RESOURCE_S)
    try:
        value = float(raw) if raw else None
    except ValueError:
        return None
    return value if value is not None and 0 < value <= 3600 else None


_OVERRIDE: Final = _interval_override()

#: One sample every this many seconds, while a viewer is subscribed.
RESOURCE_S: Final = _OVERRIDE if _OVERRIDE is not None else 5.0
#: USS/PSS reads use at most this share of one core, averaged over the rounds (0: every round).
USS_CPU_SHARE: Final = 0.0 if _OVERRIDE is not None else 0.0005
#: The same while the black box records (docs/contract.md §9): a viewer that attaches later starts
#: from its history, and the copy-on-read finding needs TREND_MIN_SAMPLES (4) USS readings, which
#: at USS_CPU_SHARE take a worker of a large in-memory dataset several minutes; at this share they
#: are there by minute 2, and the publisher thread, black box included, stays within its budget
#: (docs/performance.md).
USS_CPU_SHARE_RECORDED: Final = 0.0 if _OVERRIDE is not None else 0.002
#: The main process's USS/PSS (no finding rests on them: copy-on-read is the workers', memory
#: growth is judged by RSS) is read in a full round only once this long: in a training process
#: (CUDA, the model) it is the largest walk, and the share is better spent on the workers.
MAIN_USS_S: Final = 0.0 if _OVERRIDE is not None else 60.0
#: Calls closer together than this are one round (one per loader at the same tick): the main
#: process is read once and the round's USS decision is shared.
ROUND_S: Final = 0.5


class _Reading:
    __slots__ = ("rss", "uss", "pss", "fds", "threads")

    def __init__(self) -> None:
        self.rss: int | None = None
        self.uss: int | None = None
        self.pss: int | None = None
        self.fds: int | None = None
        self.threads: int | None = None


class ResourceSampler:
    """Reads the slow figures; keeps one `psutil.Process` per pid (dropped once it is gone)."""

    def __init__(self, uss_cpu_share: float = USS_CPU_SHARE, interval_s: float = RESOURCE_S,
                 main_uss_s: float = MAIN_USS_S, clock: Callable[[], float] = time.monotonic,
                 cpu_clock: Callable[[], float] = time.thread_time) -> None:
        self._share = uss_cpu_share
        self._interval = interval_s
        self._main_uss_s = main_uss_s
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._procs: dict[int, Any] = {}  # pid -> psutil.Process
        self._uss_due = float("-inf")  # monotonic time from which a round may read USS/PSS
        self._round_at = float("-inf")
        self._round_full = False
        self._round_cost = 0.0  # CPU seconds this round's USS/PSS reads took
        self._main: tuple[int, _Reading, int | None] | None = None  # this round's: pid, figures
        self._seen: set[int] = set()  # pids asked for in this round
        self._main_uss_at = float("-inf")  # when the main process's USS was last read

    def set_cpu_share(self, share: float) -> None:
        """From the next round on, USS/PSS reads use at most `share` of one core."""
        self._share = share

    def sample(self, workers: list[tuple[int, int]]) -> wire.ResourceReport:
        """The main process and `workers` ((worker id, pid) pairs) now."""
        if psutil is None:  # called before any viewer subscribed (tests): on this thread
            import psutil as module

            use_psutil(module)
        try:
            return self._sample(workers)
        except Exception:  # the probe never breaks training over a figure
            return wire.ResourceReport(sampled_at=time.time())

    # ---------------------------------------------------------------- parts
    def _sample(self, workers: list[tuple[int, int]]) -> wire.ResourceReport:
        now = self._clock()
        if now - self._round_at > ROUND_S:
            self._new_round(now)
        full = self._round_full
        pid = os.getpid()
        if self._main is None or self._main[0] != pid:
            main_full = full and now - self._main_uss_at >= self._main_uss_s
            if main_full:
                self._main_uss_at = now
            self._main = (pid, self._read(pid, main_full), _fd_limit())
        _, main, limit = self._main
        self._seen.add(pid)
        out = []
        for wid, wpid in workers[:wire.MAX_WORKERS]:
            if wpid == pid or wpid <= 0:
                continue
            self._seen.add(wpid)
            r = self._read(wpid, full)
            out.append(wire.WorkerResources(id=wid, pid=wpid, uss_bytes=r.uss, pss_bytes=r.pss,
                                            rss_bytes=r.rss, fds=r.fds, threads=r.threads))
        if full and self._share > 0:
            self._uss_due = self._round_at + max(self._interval, self._round_cost / self._share)
        # arg-type: lists go out as tuples do (msgpack arrays), wire's types are as decoded
        return wire.ResourceReport(sampled_at=time.time(), rss_bytes=main.rss,
                                   uss_bytes=main.uss, fds=main.fds, fd_limit=limit,
                                   threads=main.threads, workers=out)  # type: ignore[arg-type]

    def _new_round(self, now: float) -> None:
        # Forget the processes the last round did not ask for (ended workers, old epochs).
        for gone in set(self._procs) - self._seen:
            del self._procs[gone]
        self._seen = set()
        self._round_at = now
        self._round_full = now >= self._uss_due
        self._round_cost = 0.0
        self._main = None

    def _process(self, pid: int) -> Any:
        proc = self._procs.get(pid)
        if proc is not None:
            # psutil compares the start time it recorded: a reused pid is another process.
            if proc.is_running():
                return proc
            del self._procs[pid]
            return None
        try:
            proc = self._procs[pid] = psutil.Process(pid)
        except (psutil.Error, OSError, ValueError):
            return None
        return proc

    def _read(self, pid: int, full: bool) -> _Reading:
        r = _Reading()
        try:
            proc = self._process(pid)
            if proc is None:
                return r
            with proc.oneshot():
                if full:
                    c0 = self._cpu_clock()
                    try:
                        mem = proc.memory_full_info()
                    except (psutil.AccessDenied, AttributeError, NotImplementedError):
                        mem = proc.memory_info()  # smaps unreadable: RSS still is
                    finally:
                        self._round_cost += self._cpu_clock() - c0
                    r.uss, r.pss = getattr(mem, "uss", None), getattr(mem, "pss", None)
                else:
                    mem = proc.memory_info()
                r.rss = int(mem.rss)
                r.threads = _optional(proc.num_threads)
                r.fds = _optional(proc.num_fds)  # Linux: the entries of /proc/PID/fd
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._procs.pop(pid, None)
            return _Reading()  # gone mid-read: no half a reading
        except Exception:
            pass
        r.uss = _count(r.uss)
        r.pss = _count(r.pss)
        return r


def _optional(read: Callable[[], int]) -> int | None:
    try:
        return _count(read())
    except (psutil.AccessDenied, AttributeError, NotImplementedError):
        return None  # psutil.NoSuchProcess goes up: the whole reading is void


def _count(value: object) -> int | None:
    return int(value) if isinstance(value, int) and value >= 0 else None


def _fd_limit() -> int | None:
    """The soft RLIMIT_NOFILE (what `open` runs into); None when unlimited or unknown."""
    try:
        soft, _hard = _resource.getrlimit(_resource.RLIMIT_NOFILE)
    except (AttributeError, OSError, ValueError):  # AttributeError: no `resource` (Windows)
        return None
    return soft if 0 <= soft != _resource.RLIM_INFINITY else None
