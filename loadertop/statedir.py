"""The black box's home: where every instrumented job keeps its own recording (docs/contract.md §9).

Shared by the probe (which writes a job's files) and the readers (`ls`, `last`, a viewer that sees
its trainer die): stdlib and msgspec only, no psutil, zmq or torch.

    <state dir>/                                   0700, on disk (not the runtime tmpfs)
        <stem>.job.json                            0600: `JobMeta`, rewritten (atomically) at exit
                                                   with `ended`
        <stem>.<anything>.ltrec                    0600: the job's recording segments, each a
                                                   docs/recordings.md file; a reader merges every
                                                   one of a job's segments (frames by receive time,
                                                   a frame kept in two segments read once)

`<stem>` is `<started, ms since the epoch, 13 digits>-<pid>`, so names sort by start and a pid
reused later gets a new stem. A job is live while its pid runs with the same start time (from
/proc/<pid>/stat) in the same boot; a job that is not live and has no `ended` died without a
goodbye (SIGKILL, or a signal whose default action ends the process without Python's atexit).

Nothing read back here is trusted: a meta file is size-bounded and validated into `JobMeta`; a bad
one is skipped by `list_jobs` and counted.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from loadertop.wire import Count
from loadertop.wire import Text as ShortText

STATE_FORMAT = 1
LOADERTOP_STATE_DIR = "LOADERTOP_STATE_DIR"
LOADERTOP_BLACKBOX = "LOADERTOP_BLACKBOX"
META_SUFFIX = ".job.json"
RECORDING_SUFFIX = ".ltrec"
MAX_META_BYTES = 64 * 1024

Pid = Annotated[int, Meta(ge=1, lt=2**32)]  # a job's own pid: never 0, unlike a wire worker's


class Ended(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """How a run ended, as far as someone who saw it could tell.

    kind "finished": the interpreter exited normally (`exit_code` when known);
    "exception": an uncaught exception (`exc_type`, `message`, `frame`: the innermost frame of the
    user's code, "path:line in function"); "signal": a signal ended it (`signal`, e.g. "SIGTERM"),
    recorded by whoever saw it (`loadertop run`'s launcher for its child).
    """

    kind: Literal["finished", "exception", "signal"]
    at: float
    exit_code: int | None = None
    exc_type: ShortText | None = None
    message: ShortText | None = None
    frame: ShortText | None = None
    signal: ShortText | None = None
    recorded_by: Literal["process", "launcher"] = "process"


class CgroupAtStart(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One memory cgroup directory of the job (innermost first) and its OOM-kill counters at start
    (v1 `memory.oom_control` `oom_kill`, v2 `memory.events` `oom_kill` and `oom_group_kill`; None
    where the kernel does not count: `system.cgroup.oom_counts`)."""

    path: ShortText
    limit_bytes: Count | None = None
    oom_kills: Count | None = None
    oom_group_kills: Count | None = None


class CgroupAtDeath(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """What `loadertop run`'s launcher (or `demo`'s), which outlives its child, read of the child's
    memory cgroup the moment the child died: the OOM kills counted there since the child started
    (None where the kernel keeps no such count), the limit (the smallest along its ancestry) and
    the peak usage (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`; None where not kept). Kept
    because the cgroup is not: a container runtime, Kubernetes or Slurm removes it as the job ends."""

    at: float
    path: ShortText
    oom_kills: Count | None = None
    oom_group_kills: Count | None = None
    limit_bytes: Count | None = None
    peak_bytes: Count | None = None


class MemoryReading(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """The probe's latest reading of its memory cgroup while usage was near the limit (the black
    box reads it every 0.25 s from 80 % of the limit, docs/blackbox.md), taken off the meta again
    once usage falls back."""

    at: float
    used_bytes: Count
    limit_bytes: Count


class JobMeta(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    format: Annotated[int, Meta(ge=1)]
    pid: Pid
    started_at: float
    start_ticks: Count | None = None  # /proc/<pid>/stat field 22: tells a reused pid apart
    boot_id: ShortText = ""
    host: ShortText = ""
    argv: Annotated[list[ShortText], Meta(max_length=256)] = []
    cwd: ShortText = ""
    how: Literal["instrument", "run", "attach"] = "instrument"
    loadertop_version: ShortText = ""
    cgroup_version: int | None = None
    cgroups: Annotated[list[CgroupAtStart], Meta(max_length=64)] = []
    machine_memory_bytes: Count | None = None
    budget_bytes: Count | None = None
    ended: Ended | None = None
    cgroup_at_death: CgroupAtDeath | None = None
    near_limit: MemoryReading | None = None


_decoder = msgspec.json.Decoder(JobMeta)


# ---- where ------------------------------------------------------------------------------------


def state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """LOADERTOP_STATE_DIR, else $XDG_STATE_HOME/loadertop, else ~/.local/state/loadertop (the
    XDG base directory spec's state home: kept across logins and reboots, unlike the runtime dir)."""
    explicit = environ.get(LOADERTOP_STATE_DIR)
    if explicit:
        return Path(explicit)
    xdg = environ.get("XDG_STATE_HOME")
    if xdg and os.path.isabs(xdg):  # the spec: a relative value is invalid and is ignored
        return Path(xdg) / "loadertop"
    return Path(os.path.expanduser("~")) / ".local" / "state" / "loadertop"


def blackbox_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """LOADERTOP_BLACKBOX=0 turns the black box off; anything else (or unset) leaves it on."""
    return environ.get(LOADERTOP_BLACKBOX, "").strip() != "0"


def stem_for(pid: int, started_at: float) -> str:
    return f"{int(started_at * 1000):013d}-{pid}"


# ---- this process -----------------------------------------------------------------------------


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot), None when unreadable. The command
    name (field 2) may hold spaces and parentheses: split after its last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read(64).strip()
    except OSError:
        return ""


def hostname() -> str:
    return socket.gethostname()


def system_exit_code(message: str | None) -> int:
    """The exit code of a `SystemExit` whose str() is `message`, as Python exits with it: none
    (`sys.exit()`) is 0, a number its low 8 bits (the kernel keeps those), any other text 1
    (Python prints it and exits 1)."""
    text = (message or "").strip()
    if text in ("", "None"):
        return 0
    try:
        return int(text) & 0xFF
    except ValueError:
        return 1


# ---- meta files -------------------------------------------------------------------------------


def write_meta(path: Path, meta: JobMeta) -> None:
    """Write `meta` to `path` atomically (a reader sees the old file or the new one), 0600."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, msgspec.json.encode(meta))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_meta(path: Path) -> JobMeta:
    """The validated meta at `path`; OSError or ValueError (with what was wrong) otherwise."""
    with open(path, "rb") as f:
        data = f.read(MAX_META_BYTES + 1)
    if len(data) > MAX_META_BYTES:
        raise ValueError(f"{path.name}: larger than {MAX_META_BYTES} bytes")
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as e:
        raise ValueError(f"{path.name}: {e}") from None


# ---- jobs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One job's files in the state directory."""

    stem: str
    meta_path: Path
    meta: JobMeta
    recordings: tuple[Path, ...]  # every segment, in name order

    @property
    def pid(self) -> int:
        return self.meta.pid

    def alive(self) -> bool:
        """Its pid runs, started at the same tick, in this boot."""
        if self.meta.boot_id and self.meta.boot_id != boot_id():
            return False
        ticks = process_start_ticks(self.meta.pid)
        if ticks is None:
            return False
        return self.meta.start_ticks is None or ticks == self.meta.start_ticks

    def size_bytes(self) -> int:
        total = 0
        for path in (self.meta_path, *self.recordings):
            try:
                total += path.stat().st_size
            except OSError:
                pass
        return total


@dataclass
class Listing:
    jobs: list[Job]  # newest first
    unreadable: int = 0  # meta files skipped as bad or unreadable


def list_jobs(directory: Path | None = None) -> Listing:
    """Every job with a readable meta file in `directory` (default: `state_dir()`), newest first."""
    directory = state_dir() if directory is None else directory
    listing = Listing(jobs=[])
    try:
        names = sorted(os.listdir(directory), reverse=True)
    except OSError:
        return listing
    segments: dict[str, list[Path]] = {}
    for name in names:
        if name.endswith(RECORDING_SUFFIX) and not name.startswith("."):
            segments.setdefault(name.split(".", 1)[0], []).append(directory / name)
    for name in names:
        if not name.endswith(META_SUFFIX) or name.startswith("."):
            continue
        stem = name[: -len(META_SUFFIX)]
        try:
            meta = read_meta(directory / name)
        except (OSError, ValueError):
            listing.unreadable += 1
            continue
        listing.jobs.append(Job(stem, directory / name, meta, tuple(sorted(segments.get(stem, ())))))
    listing.jobs.sort(key=lambda job: job.meta.started_at, reverse=True)
    return listing


def find_job(spec: str, directory: Path | None = None) -> Job | None:
    """`last`: the newest job that is no longer running; a pid: the newest job of that pid.
    None when there is no such job."""
    jobs = list_jobs(directory).jobs
    if spec == "last":
        return next((job for job in jobs if not job.alive()), None)
    if spec.isascii() and spec.isdigit():
        pid = int(spec)
        return next((job for job in jobs if job.meta.pid == pid), None)
    return None


def is_job_spec(spec: str) -> bool:
    """`last` or a pid: what a command that takes a recording file also takes (§9)."""
    return spec == "last" or (spec.isascii() and spec.isdigit() and not os.path.exists(spec))


def prune(directory: Path, keep_runs: int, keep_bytes: int, *, protect: str | None = None) -> list[str]:
    """Remove the oldest ended jobs' files until at most `keep_runs` ended jobs and `keep_bytes`
    of all jobs remain; live jobs (and the stem `protect`, the caller's own) are never removed.
    Returns the stems removed."""
    jobs = list_jobs(directory).jobs  # newest first
    live = [job for job in jobs if job.stem == protect or job.alive()]
    ended = [job for job in jobs if job not in live]
    total = sum(job.size_bytes() for job in jobs)
    removed: list[str] = []
    while ended and (len(ended) > keep_runs or total > keep_bytes):
        job = ended.pop()  # the oldest
        total -= job.size_bytes()
        for path in (*job.recordings, job.meta_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                break
        removed.append(job.stem)
    return removed

