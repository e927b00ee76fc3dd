"""Reading a job's black box (docs/contract.md §9): its recording, and how its run ended.

`statedir` says where a job's files lie and whether its process still runs; this module reads
them for the commands that look back (`ls`, `snapshot --from last`, `replay last`, `report last`)
and for a viewer that sees its trainer die:

- `read_job(job)`: every segment of the job merged into one `Recording` (frames by receive time, a
  frame kept in two segments read once; a torn segment read up to its last whole record);
- `ending_of(job, recording)`: how the run ended, as a `client.ending.Ending` — the one set of
  words every screen says it with: `running`, `finished`, `exception: TYPE: message`, `signal:
  NAME`, `killed: SIGKILL (OOM killer: …)` or `killed: unknown cause`.

A process killed by SIGKILL writes nothing: a job whose pid no longer runs (with its start time)
and whose meta has no `ended` died without a goodbye. Whether the OOM killer did it is read from
the best evidence there is, in this order: the OOM-kill counters of its memory cgroup as `loadertop
run`'s launcher read them the moment it died (`JobMeta.cgroup_at_death`: kept, as the cgroup is
not); the counters now against those at its start, where the cgroup still exists (v1
`memory.oom_control`, v2 `memory.events`); its memory near the cgroup's limit in the probe's last
reading (`JobMeta.near_limit`: every 0.25 s that near); the last recorded memory against the
cgroup's or the machine's limit.
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass, field

from loadertop import statedir, wire
from loadertop.client.document import Finding
from loadertop.client.ending import RUNNING, Ending, finished, killed, raised, signalled
from loadertop.client.units import fmt_bytes, say_bytes, say_fraction
from loadertop.recording.file import Frame, Recording, RecordingError, read
from loadertop.system.cgroup import OomCounts, oom_counts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from loadertop.recording.playback import Playback

#: The last recorded memory at or above this share of a limit makes the OOM killer "likely": the
#: probe samples memory every few seconds, so the last figure is taken before the final climb.
OOM_LIKELY_SHARE = 0.9
#: ... read from the recording's last this-many seconds (the black box keeps the machine's figures
#: every 10 s with no viewer).
LAST_MEMORY_S = 60.0


class JobError(Exception):
    """`last` or a pid that names no job in the state directory, or a job with no readable
    recording; the message is one line for the user."""


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
    when nothing better tells an OOM kill; `alive`: whether its process runs, when the caller
    has just looked."""
    ended = job.meta.ended
    # `loadertop run`'s launcher records a SIGKILL it saw as a signal: who sent it is still the
    # question the OOM-kill counters and the memory answer, as for a job nobody saw end.
    sigkill = ended is not None and ended.kind == "signal" and ended.signal == "SIGKILL"
    if ended is not None and not sigkill:
        return recorded_ending(ended)
    if not sigkill and (job.alive() if alive is None else alive):
        return RUNNING
    at = recording.end if recording is not None and recording.frames else None
    if ended is not None:
        at = ended.at
    elif job.meta.cgroup_at_death is not None:
        at = job.meta.cgroup_at_death.at
    return kill_of(job, recording, at)


def recorded_ending(ended: statedir.Ended) -> Ending:
    """The end the process (or its launcher) recorded, in the contract's words."""
    if ended.kind == "exception":
        return raised(ended.exc_type, ended.message, ended.at)
    if ended.kind == "signal":
        return signalled(ended.signal or "?", ended.at)
    return finished(ended.at, ended.exit_code)


def kill_of(job: statedir.Job, recording: Recording | None, at: float | None) -> Ending:
    """Why a job that died without a goodbye died, from the best evidence there is (see the
    module's docstring). A counter its launcher read at the death and found unchanged rules the
    OOM killer out: the memory figures are not weighed then."""
    meta = job.meta
    death = meta.cgroup_at_death
    limit = (death.limit_bytes if death is not None else None) or min(
        (c.limit_bytes for c in meta.cgroups if c.limit_bytes), default=None)
    near = near_limit_words(meta, at)
    counted = oom_counted(job)
    if counted:
        cause = (f"its cgroup's limit {say_bytes(limit)} was reached" if limit
                 else "its cgroup counted an OOM kill")
        if death is not None and death.oom_group_kills:
            cause += ", and the cgroup was killed whole (memory.oom.group)"
        return killed(cause, at, oom="counted", evidence=tuple(
            e for e in (near, peak_words(death)) if e is not None))
    if counted is False and death is not None:
        return killed(None, at, note="its cgroup counted no OOM kill as it died: not the OOM killer")
    if meta.near_limit is not None and near is not None and \
            meta.near_limit.used_bytes >= OOM_LIKELY_SHARE * meta.near_limit.limit_bytes:
        return killed(near, at, oom="likely")
    memory = last_memory(job, recording)
    if memory is not None and memory.used_bytes >= OOM_LIKELY_SHARE * memory.limit_bytes:
        of = "the cgroup's" if memory.of_cgroup else "the machine's"
        cause = (f"memory was at {fmt_bytes(memory.used_bytes)} of {of} "
                 f"{say_bytes(memory.limit_bytes)} limit")
        return killed(cause, at, oom="likely")
    return killed(None, at)


def oom_counted(job: statedir.Job) -> bool | None:
    """Whether the job's memory cgroup counted an OOM kill while it ran: as its launcher read it
    the moment it died, else its counters now against those at its start (where the cgroup
    still exists). None where neither can tell. Only the innermost cgroup counts: the kernel
    counts a kill in the victim's own (v1 nowhere else; v2 in its ancestors too, with their
    other children's), whichever limit set the killer off (`system.cgroup.oom_counts`)."""
    death = job.meta.cgroup_at_death
    if death is not None and (death.oom_kills is not None or death.oom_group_kills is not None):
        return bool(death.oom_kills) or bool(death.oom_group_kills)
    if not job.meta.cgroups:
        return None
    own = job.meta.cgroups[0]
    before = OomCounts(own.oom_kills, own.oom_group_kills)
    risen = oom_counts(own.path, job.meta.cgroup_version).risen_since(before)
    if risen.kills is None and risen.group_kills is None:
        return None
    return risen.any() or None  # unchanged now: the cgroup may have been made anew since


def near_limit_words(meta: statedir.JobMeta, died_at: float | None) -> str | None:
    """"memory at 97 % of its cgroup's 1.1 GiB limit 0.3 s before it died" from the probe's last
    reading near the limit ("in its last reading" where nobody saw when it died)."""
    reading = meta.near_limit
    if reading is None or not reading.limit_bytes:
        return None
    share = say_fraction(reading.used_bytes / reading.limit_bytes)
    words = f"memory at {share} of its cgroup's {say_bytes(reading.limit_bytes)} limit"
    witnessed = meta.cgroup_at_death is not None or (
        meta.ended is not None and meta.ended.recorded_by == "launcher")
    if witnessed and died_at is not None and died_at >= reading.at:
        return f"{words} {died_at - reading.at:.1f} s before it died"
    return f"{words} in its last reading"


def peak_words(death: statedir.CgroupAtDeath | None) -> str | None:
    if death is None or not death.peak_bytes:
        return None
    return f"its cgroup's peak usage {say_bytes(death.peak_bytes)}"


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
        if oom_counted(job):
            return line + ": by the OOM killer (its cgroup counted an OOM kill)"
        return line + " — most often the OOM killer (`dmesg -T | grep -i oom`)"
    return line


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
    ending = ended_job_ending(job)
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


def ended_job_ending(job: statedir.Job) -> Ending:
    """How a job that no longer runs ended; its last minutes are read only where they can tell
    (a death without a goodbye: its last memory)."""
    recording = None
    ended = job.meta.ended
    if ended is None or (ended.kind == "signal" and ended.signal == "SIGKILL"):
        try:
            recording = read_job(job, recent_only=True)
        except JobError:
            recording = None
    return ending_of(job, recording, alive=False)


def death_of(pid: int, host: str) -> Ending | None:
    """How a process of `pid` that stopped reporting ended: None while it runs (or is on another
    machine, or this one cannot tell), else from its black box when it has one."""
    if host != statedir.hostname():
        return None
    job = statedir.find_job(str(pid))
    if job is not None and job.meta.host in ("", host):
        return None if job.alive() else ended_job_ending(job)
    if statedir.process_start_ticks(pid) is not None:
        return None  # it runs (or its pid was reused: then it ended, but we cannot tell when)
    return killed(None, note="it kept no black box to tell why")


def recorded_end_of(pid: int, host: str) -> Ending | None:
    """How the job of `pid` ended as its black box records it, for a source that said goodbye:
    None while the process runs, or where no black box of it is on this machine."""
    if host != statedir.hostname() or statedir.process_start_ticks(pid) is not None:
        return None  # elsewhere, or it runs (a reused pid: too late to tell)
    job = statedir.find_job(str(pid))
    if job is None or job.meta.host not in ("", host) or job.meta.ended is None or job.alive():
        return None  # no black box, or its end not written yet
    ended = job.meta.ended
    if job.meta.how == "run" and ended.kind == "finished" and ended.exit_code is None:
        return None  # `run`'s launcher is about to write the exit code, which may say a signal
    return ended_job_ending(job)


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
        lines.extend(f"    {line}" for line in ending.evidence)
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

    def death(self, pid: int, host: str) -> Ending | None:
        return death_of(pid, host)

    def ended(self, pid: int, host: str) -> Ending | None:
        return recorded_end_of(pid, host)
