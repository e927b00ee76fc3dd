"""How loadertop starts a program: the environment `run` and `tune`'s trials give it, the
session `tune`'s trials and `demo`'s job run in, and the exit status `run` reports.

The child's PYTHONPATH starts with `loadertop/probe/_bootstrap`, whose `sitecustomize` (every
Python started below the command imports it at startup: scripts, `python -m`, torchrun's ranks)
patches `DataLoader.__iter__` when torch's dataloader module is imported, and then chains to any
other `sitecustomize` on the path. It is a no-op unless LOADERTOP_RUN=1, which only this
environment sets. Kept free of heavy imports (subprocess is imported where a session is started):
`run` starts before the job and its own start-up is added to every job's.
"""

from __future__ import annotations

import os
import signal

from loadertop import environment

TYPE_CHECKING = False  # not typing's: `run` imports this module, and typing costs its start-up
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping, Sequence
    from typing import IO

    from loadertop.statedir import CgroupAtDeath
    from loadertop.system.cgroup import OomCounts

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe", "_bootstrap")


def child_env(environ: Mapping[str, str], listen: str | None) -> dict[str, str]:
    """`environ` with the start-up hook first on PYTHONPATH and LOADERTOP_RUN set; `listen`, when
    given, is the endpoint the job publishes on."""
    env = dict(environ)
    env[environment.LOADERTOP_RUN] = "1"
    env.pop(environment.LOADERTOP_RUN_WARNED, None)
    env.pop(environment.LOADERTOP_RUN_PORT_BASE, None)  # a nested run starts from its own --listen
    env.pop(environment.LOADERTOP_AUTOTUNE, None)  # only `run --autotune` sets it, for its own child
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *parts])
    if listen:
        env[environment.LOADERTOP_ENDPOINT] = listen
    return env


def start_in_session(command: Sequence[str], env: Mapping[str, str], *, stdout: IO[bytes] | int,
                     stderr: IO[bytes] | int) -> subprocess.Popen[bytes]:
    """COMMAND in a session of its own, stdin from /dev/null. Its own session (and so its own
    process group, whose id is its pid) keeps a terminal's signals (Ctrl-C, SIGHUP) to us, who
    stop it in order, and lets the whole group — its DataLoader workers, torchrun's ranks — be
    signalled with `signal_group`. OSError (not found, not executable) is the caller's to word."""
    import subprocess

    return subprocess.Popen(list(command), env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=stderr, start_new_session=True)


def signal_group(pgid: int, sig: int) -> None:
    """os.killpg, quiet when the group is gone (or was never ours to signal)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def exit_status(returncode: int) -> int:
    """The shell's convention: a child killed by signal N makes 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class ChildWatch:
    """What a launcher that outlives its child (`run`, `demo`) keeps for the child's black box
    (docs/contract.md §9), since the child cannot: how it ended when its atexit never ran (a
    signal killed it; `os._exit`) and its exit code, and — read the moment it died, against the
    values at its start — its memory cgroup's OOM-kill counters, limit and peak usage. The
    cgroup itself does not outlive the job: a container runtime, Kubernetes or Slurm removes it
    as the job ends, before anyone reads. Never raises: the job's exit status is all that matters.

    `root` and `proc_cgroup` (the cgroup mount and a /proc/<pid>/cgroup file) let tests point it
    at a tree of their own; the child starts in the launcher's own cgroup, so /proc/self's."""

    def __init__(self, pid: int, env: Mapping[str, str], *, root: str | None = None,
                 proc_cgroup: str | None = None) -> None:
        import time

        self.pid = pid
        self.env = env
        self.started_at = time.time()
        self.directory: str | None = None
        self.version: int | None = None
        self.limit_bytes: int | None = None
        self.at_start: OomCounts | None = None
        try:
            from loadertop import statedir
            from loadertop.system import cgroup

            if not statedir.blackbox_enabled(env):
                return
            group = cgroup.Cgroup.detect(root or cgroup.DEFAULT_ROOT,
                                         proc_cgroup or cgroup.DEFAULT_PROC_CGROUP)
            if group.memory_dirs:
                self.directory, self.version = group.memory_dirs[0], group.version
                self.limit_bytes = group.mem_limit_bytes()
                self.at_start = cgroup.oom_counts(self.directory, self.version)
        except Exception:
            self.directory = None

    def evidence(self) -> CgroupAtDeath | None:
        """The child's memory cgroup read now (None without one)."""
        import time

        from loadertop import statedir
        from loadertop.system import cgroup

        if self.directory is None or self.at_start is None:
            return None
        counted = cgroup.oom_counts(self.directory, self.version).risen_since(self.at_start)
        return statedir.CgroupAtDeath(
            at=time.time(), path=self.directory[:4096], oom_kills=counted.kills,
            oom_group_kills=counted.group_kills, limit_bytes=self.limit_bytes,
            peak_bytes=cgroup.peak_bytes(self.directory, self.version))

    def record(self, returncode: int) -> None:
        """The child ended with `returncode` (-N: killed by signal N): its cgroup read at once,
        then what its own black box could not say written into its meta. Only for the child
        itself (a Python the command started in turn has another pid)."""
        try:
            import time

            import msgspec

            from loadertop import statedir

            if not statedir.blackbox_enabled(self.env):
                return
            at_death = self.evidence()  # first: the cgroup as the death left it
            now = time.time()
            job = next((j for j in statedir.list_jobs(statedir.state_dir(self.env)).jobs
                        if j.meta.pid == self.pid), None)
            if job is None or job.meta.started_at < self.started_at - 1:
                return  # it kept no black box (an older job of a reused pid is not it)
            ended = job.meta.ended
            if returncode < 0 and ended is None:
                try:
                    name = signal.Signals(-returncode).name
                except ValueError:
                    name = f"signal {-returncode}"
                ended = statedir.Ended(kind="signal", at=now, signal=name, recorded_by="launcher")
            elif returncode >= 0 and ended is None:  # it exited past its atexit (os._exit)
                ended = statedir.Ended(kind="finished", at=now, exit_code=returncode,
                                       recorded_by="launcher")
            elif returncode >= 0 and ended is not None and ended.kind == "finished":
                ended = msgspec.structs.replace(ended, exit_code=returncode)  # ours to tell
            statedir.write_meta(job.meta_path, msgspec.structs.replace(
                job.meta, ended=ended, cgroup_at_death=at_death))
        except Exception:
            pass
