"""Reading a job's black box (docs/contract.md §9): its recording, and how its run ended.

`statedir` says where a job's files lie and whether its process still runs; this module reads
them for the commands that look back (`ls`, `snapshot --from last`, `replay last`, `report last`)
and for a viewer that sees its trainer die:

- `read_job(job)`: every segment of the job merged into one `Recording` (frames by receive time, a
  frame kept in two segments read once; a torn segment read up to its last whole record);
- `ending_of(job, recording)`: how the run ended, as the contract's string — `running`,
  `finished`, `exception: TYPE: message`, `signal: NAME`, `killed: SIGKILL (OOM killer: …)` or
  `killed: unknown cause`.

A process killed by SIGKILL writes nothing: a job whose pid no longer runs (with its start time)
and whose meta has no `ended` died without a goodbye. Whether the OOM killer did it is read where
an unprivileged user can read it: the job's memory cgroups' OOM-kill counters now against the
ones its meta took at start (v1 `memory.oom_control`, v2 `memory.events`); failing those (a
cgroup removed since, a kernel without the counter), the last recorded memory against the cgroup's
or the machine's limit.
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass, field
from typing import Literal

from loadertop import statedir, wire
from loadertop.client.document import Finding
from loadertop.client.units import fmt_bytes, say_bytes
from loadertop.recording.file import Frame, Recording, RecordingError, read

TYPE_CHECKING = False
if TYPE_CHECKING:
    from loadertop.recording.playback import Playback

#: The last recorded memory at or above this share of a limit makes the OOM killer "likely": the
#: probe samples memory every few seconds, so the last figure is taken before the final climb.
OOM_LIKELY_SHARE = 0.9
#: ... read from the recording's last this-many seconds (the black box keeps the machine's figures
#: every 10 s with no viewer).
LAST_MEMORY_S = 60.0
#: Frames of one report kept in two segments (a rotation's overlap) carry the same receive time
#: and bytes; they are read once.
EndKind = Literal["running", "finished", "exception", "signal", "killed"]


class JobError(Exception):
    """`last` or a pid that names no job in the state directory, or a job with no readable
    recording; the message is one line for the user."""


@dataclass(frozen=True)
class Ending:
    """How a job's run ended. `text` is the contract's string (what `ls` shows); `cause`, for a
    kill, what the evidence says ("OOM killer: its cgroup's limit 1.1 GiB was reached")."""

    kind: EndKind
    text: str
    cause: str | None = None
    at: float | None = None  # when it ended, as far as known (Unix time)
    oom: bool = False  # the OOM killer, certainly (its cgroup counted the kill)

    def sentence(self, pid: int) -> str:
        """The ending said of `pid` in one line, as a viewer that saw it die says it."""
        if self.kind == "killed":
            if self.oom:
                return f"pid {pid} died without a goodbye: killed by the OOM killer — {self.cause}"
            if self.cause is not None:
                return f"pid {pid} died without a goodbye: killed, likely by the OOM killer — {self.cause}"
            return (f"pid {pid} died without a goodbye: killed (SIGKILL, or a signal Python could not "
                    "handle), cause unknown — neither its cgroup's OOM-kill counter nor its last "
                    "memory points to the OOM killer")
        if self.kind == "running":
            return f"pid {pid} is running"
        return f"pid {pid} ended: {self.text}"


@dataclass(frozen=True)
class LastMemory:
    """The last memory figure recorded before the end, and the limit it is judged against."""

    used_bytes: int
    limit_bytes: int
    of_cgroup: bool  # the limit is the cgroup's (else the machine's)


# ---- reading ----------------------------------------------------------------------------------


@dataclass
class JobRecording(Recording):
    """A job's black box read as one recording, with the job it is of."""

    job: statedir.Job | None = field(default=None)


#: The probe names the segments that hold its last minutes in full so (probe/blackbox.py): what
#: needs only the end of a run (the worst finding, the last memory) reads just those.
RECENT_MARK = "-recent-"


def read_job(job: statedir.Job, *, recent_only: bool = False) -> JobRecording:
    """All of `job`'s segments as one recording, frames in receive order. Raises JobError when
    none of them can be read. A segment's notes (a torn tail: the process was killed mid-write)
    are kept, named by segment. `recent_only`: only the segments of the last minutes in full, where
    it has them (not the whole run's decimated one, most of the bytes of a long run)."""
    merged: JobRecording | None = None
    seen: set[tuple[float, bytes]] = set()
    frames: list[Frame] = []
    errors: list[str] = []
    paths = job.recordings
    if recent_only:
        paths = tuple(p for p in paths if RECENT_MARK in p.name) or paths
    for path in paths:
        try:
            segment = read(str(path))
        except RecordingError as exc:
            errors.append(str(exc))
            continue
        if merged is None:
            merged = JobRecording(path=str(job.meta_path), header=segment.header, job=job)
        for frame in segment.frames:
            key = (frame.received_at, frame.frame)
            if key not in seen:
                seen.add(key)
                frames.append(frame)
        for endpoint in segment.endpoints:
            if endpoint not in merged.endpoints:
                merged.endpoints.append(endpoint)
        if segment.end_reason is not None:
            merged.end_reason = segment.end_reason
        merged.size += segment.size
        # "no end mark" is what every segment but the last says of itself: only torn records count.
        merged.notes.extend(f"{path.name}: {note}" for note in segment.notes
                            if not note.startswith("no end mark"))
    if merged is None:
        if errors:
            raise JobError(f"pid {job.pid}: its black box cannot be read ({errors[-1]})")
        raise JobError(f"pid {job.pid}: its black box holds no recording ({job.meta_path})")
    frames.sort(key=lambda f: f.received_at)
    merged.frames = frames
    merged.path = recording_label(job)
    return merged


def recording_label(job: statedir.Job) -> str:
    """How a job's recording is named to the user: the newest segment, or the meta file."""
    return str(job.recordings[-1] if job.recordings else job.meta_path)


def resolve(spec: str) -> statedir.Job:
    """The job `spec` names (`last`, or a pid); JobError (one line) when there is none."""
    listing = statedir.list_jobs()
    where = statedir.state_dir()
    if spec == "last":
        job = next((j for j in listing.jobs if not j.alive()), None)
        if job is None:
            live = sum(1 for j in listing.jobs if j.alive())
            raise JobError(f"last: no ended job in {where}"
                           + (f" ({live} still running: `loadertop ls`)" if live else ""))
        return job
    job = statedir.find_job(spec)
    if job is None:
        raise JobError(f"{spec}: no such file, and no job with pid {spec} in {where} (`loadertop ls`)")
    return job


# ---- how it ended -----------------------------------------------------------------------------


def last_memory(job: statedir.Job, recording: Recording | None) -> LastMemory | None:
    """The last memory figure of the job's recording (its last LAST_MEMORY_S) against its limit:
    the cgroup's usage as the probe read it (the kernel's own charge) when the cgroup has a limit;
    else the process's and its workers' RSS against the cgroup's limit in the meta (RSS counts
    pages the workers share with the main process twice: an upper bound); else the machine's
    memory in use against its total."""
    if recording is None or not recording.frames:
        return None
    rss: int | None = None
    workers_rss: dict[int, int] = {}
    cgroup_used: tuple[int, int] | None = None
    machine_used: tuple[int, int] | None = None
    since = recording.frames[-1].received_at - LAST_MEMORY_S
    for frame in reversed(recording.frames):
        if frame.received_at < since:
            break
        try:
            msg = wire.decode(frame.frame)
        except wire.WireError:
            continue
        if isinstance(msg, wire.SystemReport):
            cg = msg.cgroup
            if cgroup_used is None and cg is not None and cg.mem_used_bytes and cg.mem_limit_bytes:
                cgroup_used = (cg.mem_used_bytes, cg.mem_limit_bytes)
            total, available = msg.mem_total_bytes, msg.mem_available_bytes
            if machine_used is None and total and available is not None:
                machine_used = (max(0, total - available), total)
        elif isinstance(msg, wire.LoaderReport) and msg.pid == job.pid:
            if not workers_rss:
                workers_rss = {w.id: w.rss_bytes for w in msg.workers
                               if w.rss_bytes is not None and w.alive is not False}
            if rss is None and msg.resources is not None and msg.resources.rss_bytes is not None:
                rss = msg.resources.rss_bytes
        if cgroup_used is not None:
            break
    if cgroup_used is not None:
        return LastMemory(cgroup_used[0], cgroup_used[1], of_cgroup=True)
    limits = [c.limit_bytes for c in job.meta.cgroups if c.limit_bytes]
    own = (rss or 0) + sum(workers_rss.values())
    if limits and own:
        return LastMemory(own, min(limits), of_cgroup=True)
    if machine_used is not None:
        return LastMemory(machine_used[0], machine_used[1], of_cgroup=False)
    if own and job.meta.machine_memory_bytes:
        return LastMemory(own, job.meta.machine_memory_bytes, of_cgroup=False)
    return None


def ending_of(job: statedir.Job, recording: Recording | None = None, *,
              alive: bool | None = None) -> Ending:
    """How `job` ended (or `running`). `recording`: its black box, for the last memory figures
    when the OOM-kill counters cannot tell; `alive`: whether its process runs, when the caller
    has just looked."""
    ended = job.meta.ended
    # `loadertop run`'s launcher records a SIGKILL it saw as a signal: who sent it is still the
    # question the OOM-kill counters and the last memory answer, as for a job nobody saw end.
    killed = ended is not None and ended.kind == "signal" and ended.signal == "SIGKILL"
    if ended is not None and not killed:
        if ended.kind == "exception":
            text = f"exception: {ended.exc_type or 'Exception'}"
            if ended.message:
                text += f": {_one_line(ended.message)}"
            return Ending("exception", text, at=ended.at)
        if ended.kind == "signal":
            return Ending("signal", f"signal: {ended.signal or '?'}", at=ended.at)
        text = "finished"
        if ended.exit_code:
            text += f" (exit code {ended.exit_code})"
        return Ending("finished", text, at=ended.at)
    if not killed and (job.alive() if alive is None else alive):
        return Ending("running", "running")
    at = recording.end if recording is not None and recording.frames else None
    if killed and ended is not None:
        at = ended.at
    for cgroup in job.meta.cgroups:
        before = cgroup.oom_kills
        now = statedir.oom_kills(cgroup.path, job.meta.cgroup_version)
        if before is not None and now is not None and now > before:
            limit = cgroup.limit_bytes or min((c.limit_bytes for c in job.meta.cgroups if c.limit_bytes),
                                              default=None)
            cause = (f"its cgroup's limit {say_bytes(limit)} was reached" if limit
                     else "its cgroup counted an OOM kill")
            return Ending("killed", f"killed: SIGKILL (OOM killer: {cause})", cause, at, oom=True)
    memory = last_memory(job, recording)
    if memory is not None and memory.used_bytes >= OOM_LIKELY_SHARE * memory.limit_bytes:
        of = "the cgroup's" if memory.of_cgroup else "the machine's"
        cause = (f"memory was at {fmt_bytes(memory.used_bytes)} of {of} "
                 f"{say_bytes(memory.limit_bytes)} limit")
        return Ending("killed", f"killed: SIGKILL (OOM killer: likely — {cause})", cause, at)
    return Ending("killed", "killed: unknown cause", None, at)


# torch (2.13, _utils/signal_handling.py and dataloader.py) says a worker's death in one of two
# ways, depending on which of its checks saw it first: its SIGCHLD handler ("is killed by signal:
# Killed.") or the loop's timeout check ("pid(s) 4285, 4286) exited unexpectedly").
_TORCH_WORKER_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.]+)")
_TORCH_WORKERS_EXITED = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")


def killed_worker(job: statedir.Job, recording: Recording | None) -> str | None:
    """"worker 0 (pid 4242) was killed by SIGKILL — …" when the run ended with torch's message of
    a worker's death: the worker's id (and, when torch's message does not say it, its signal) from
    the recorded reports; the OOM killer named when the job's cgroup counted a kill."""
    ended = job.meta.ended
    if ended is None or ended.kind != "exception" or not ended.message:
        return None
    name: str | None = None
    killed = _TORCH_WORKER_KILLED.search(ended.message)
    if killed is not None:
        pids = [int(killed.group(1))]
        description = killed.group(2).strip()
        name = next((s.name for s in signal.Signals if signal.strsignal(s) == description), description)
    else:
        exited = _TORCH_WORKERS_EXITED.search(ended.message)
        if exited is None:
            return None
        pids = [int(p) for p in exited.group(1).replace(",", " ").split()]
    pid, wid, exitcode = pids[0], None, None
    for frame in reversed(recording.frames if recording is not None else []):
        try:
            msg = wire.decode(frame.frame)
        except wire.WireError:
            continue
        if isinstance(msg, wire.LoaderReport):
            for w in msg.workers:
                if w.pid in pids:
                    pid, wid = w.pid, w.id
                    if w.exitcode is not None:
                        exitcode = w.exitcode
                        break
            if exitcode is not None or (wid is not None and name is not None):
                break
    if name is None and exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
    worker = f"worker {wid} (pid {pid})" if wid is not None else f"worker (pid {pid})"
    if name is None:
        code = (f" with exit code {exitcode}" if exitcode is not None
                else " (its exit status was not recorded)")
        return f"{worker} exited unexpectedly{code}"
    line = f"{worker} was killed by {name}"
    if name == "SIGKILL":
        if _oom_counted(job):
            return line + ": by the OOM killer (its cgroup counted an OOM kill)"
        return line + " — most often the OOM killer (`dmesg -T | grep -i oom`)"
    return line


def _oom_counted(job: statedir.Job) -> bool:
    for cgroup in job.meta.cgroups:
        now = statedir.oom_kills(cgroup.path, job.meta.cgroup_version)
        if cgroup.oom_kills is not None and now is not None and now > cgroup.oom_kills:
            return True
    return False


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


# ---- what `ls` and the no-job messages say --------------------------------------------------


def printable(text: str) -> str:
    """`text` on one line: a run of whitespace as one space, another unprintable character as "?"."""
    return "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))


def command_of(job: statedir.Job, limit: int = 60) -> str:
    """The job's command line on one line, shortened to `limit` characters: a run of whitespace
    (a `python -c` program's newlines) is one space, another unprintable character a "?" (the meta
    file is not trusted to write to a terminal)."""
    text = printable(" ".join(job.meta.argv)) or "?"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def ago(seconds: float) -> str:
    """"12 s ago", "3 min ago", "2 h ago", "4 days ago"."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def last_ended_line(now: float | None = None) -> str | None:
    """"the last job, pid 25598 (python train.py), ended 3 min ago: killed: … — loadertop snapshot
    --from last", or None when the state directory has no ended job (or cannot be read)."""
    try:
        jobs = statedir.list_jobs().jobs
    except OSError:
        return None
    job = next((j for j in jobs if not j.alive()), None)
    if job is None:
        return None
    recording = None
    if job.meta.ended is None:  # the figures only matter to tell an OOM kill
        try:
            recording = read_job(job, recent_only=True)
        except JobError:
            recording = None
    ending = ending_of(job, recording, alive=False)
    now = time.time() if now is None else now
    when = ending.at or _last_written(job)
    return (f"the last job, pid {job.pid} ({command_of(job)}), ended {ago(now - when)}: "
            f"{ending.text} — loadertop snapshot --from last")


def _last_written(job: statedir.Job) -> float:
    """When the job last wrote a segment (its meta's start when none can be read)."""
    for path in reversed(job.recordings):
        try:
            return path.stat().st_mtime
        except OSError:
            continue
    return job.meta.started_at


def death_of(pid: int, host: str) -> str | None:
    """What a viewer says of a source of `pid` that stopped reporting: None while the process
    runs (or is on another machine, or this one cannot tell), else one line on how it ended, from
    its black box when it has one."""
    if host != statedir.hostname():
        return None
    job = statedir.find_job(str(pid))
    if job is not None and job.meta.host in ("", host):
        if job.alive():
            return None
        recording = None
        if job.meta.ended is None:
            try:
                recording = read_job(job, recent_only=True)
            except JobError:
                recording = None
        return ending_of(job, recording, alive=False).sentence(pid)
    if statedir.process_start_ticks(pid) is not None:
        return None  # it runs (or its pid was reused: then it ended, but we cannot tell when)
    return f"pid {pid} died without a goodbye (it kept no black box to tell why)"


# ---- the post-mortem --------------------------------------------------------------------------

#: The post-mortem's findings are those of the run's last minutes (what preceded the end).
LAST_MINUTES_S = 300.0
LAST_MINUTES_STEP_S = 5.0


def postmortem_lines(recording: JobRecording, playback: Playback) -> list[str]:
    """What an ended run's view leads with: how it ended, then the findings of its last minutes
    (memory growth before an OOM kill, a hang's stack), each once, most severe first."""
    from loadertop import findings as finding_rules
    from loadertop.client.units import fmt_duration

    job = recording.job
    if job is None:
        return []
    ending = ending_of(job, recording)
    end = ending.at or playback.end
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.meta.started_at))
    lines = [f"pid {job.pid} ({command_of(job, 80)}) · started {started} · ran "
             f"{fmt_duration(end - job.meta.started_at)} · ended: {ending.text}"]
    if ending.kind == "killed":
        lines.append(f"  {ending.sentence(job.pid)}")
    worker_line = killed_worker(job, recording)
    if worker_line is not None:
        lines.append(f"  {worker_line}")
    seen: dict[tuple[str, str | None, int | None], Finding] = {}
    t = max(playback.start, playback.end - LAST_MINUTES_S)
    while True:
        for finding in playback.document_at(t).findings:
            seen[(finding.kind, finding.source, finding.worker)] = finding  # the latest wording
        if t >= playback.end:
            break
        t = min(playback.end, t + LAST_MINUTES_STEP_S)
    span = min(LAST_MINUTES_S, playback.end - playback.start)
    last = f"its last {span / 60:.0f} min" if span >= 90 else f"its last {fmt_duration(span)}"
    if not seen:
        lines.append(f"  no finding in {last}")
        return lines
    lines.append(f"  findings of {last}:")
    for finding in finding_rules.ordered(seen.values()):
        worker = f" (worker {finding.worker})" if finding.worker is not None else ""
        lines.append(f"  - {finding.severity} {finding.kind}{worker}: {finding.summary}")
        if finding.stack:
            # The innermost frames, and the user's own frame (where a library's are innermost).
            shown = list(range(max(0, len(finding.stack) - 2), len(finding.stack)))
            if finding.user_frame is not None and finding.user_frame not in shown:
                shown.insert(0, finding.user_frame)
            for i in shown:
                mark = "  ◀ your code" if i == finding.user_frame else ""
                lines.append(f"      {finding.stack[i]}{mark}")
    return lines


def replay_name(recording: JobRecording) -> str:
    """What `replay last` calls the recording in its header: the job and how it ended."""
    job = recording.job
    if job is None:
        return recording.path
    return f"pid {job.pid} ({command_of(job, 40)}) · {ending_of(job, recording).text}"


# ---- what a live viewer asks ------------------------------------------------------------------

#: A late viewer is seeded with at most this much of a job's history: the memory trends look back
#: this far (`client.resources.HISTORY_S`); the model keeps less of everything else.
SEED_S = 1800.0


class BlackBoxHistory:
    """`client.subscriber.History` read from this machine's state directory: a source first seen
    live starts from its job's recorded frames; a source that falls silent is looked up here."""

    def frames(self, pid: int, host: str, source: str, before: float) -> list[tuple[float, bytes]]:
        if host != statedir.hostname():
            return []
        job = statedir.find_job(str(pid))
        if job is None or not job.alive():
            return []
        try:
            recording = read_job(job)
        except JobError:
            return []
        return [(f.received_at, f.frame) for f in recording.frames
                if before - SEED_S <= f.received_at < before]

    def death(self, pid: int, host: str) -> str | None:
        return death_of(pid, host)
