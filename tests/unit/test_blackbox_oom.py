"""An OOM kill named after its cgroup is gone (issue 46 §1, docs/contract.md §9): the evidence taken
when the death happens and kept in the black box — by `run`'s launcher (the OOM-kill counters at
the child's death against those at its start, the limit, the peak) and by the probe (its memory
readings near the limit) — and the reader preferring it. On fixture trees of both cgroup layouts
(v1 `memory.oom_control`, `memory.max_usage_in_bytes`; v2 `memory.events`, `memory.peak`),
written into temporary directories and removed before reading, as a container runtime removes
the job's cgroup."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from loadertop import statedir
from loadertop.launch import ChildWatch
from loadertop.probe import blackbox as writer
from loadertop.probe import memory_watch
from loadertop.recording import blackbox
from loadertop.system.cgroup import Cgroup, OomCounts, oom_counts, peak_bytes

from fakes import GIB, MIB

LIMIT = round(1.1 * GIB)
HOST = statedir.hostname()


class Tree:
    """A memory cgroup `job` under a fixture mount `root`, v1 or v2, and the /proc/<pid>/cgroup
    file that names it."""

    def __init__(self, tmp_path: Path, version: int) -> None:
        self.version = version
        base = tmp_path / "sys-fs-cgroup"
        self.proc_cgroup = tmp_path / "proc-cgroup"
        if version == 1:
            self.root, self.mount = base, base / "memory"
            self.proc_cgroup.write_text("4:memory:/job\n1:cpu:/\n0::/\n")
            self.mount.mkdir(parents=True)
            (self.mount / "memory.limit_in_bytes").write_text("9223372036854771712\n")
        else:
            self.root = self.mount = base
            self.proc_cgroup.write_text("0::/job\n")
            base.mkdir()
            (base / "cgroup.controllers").write_text("cpu memory\n")
        self.job = self.mount / "job"
        self.job.mkdir()
        self.set(limit=LIMIT, used=100 * MIB, kills=0, group_kills=0, peak=100 * MIB)

    def set(self, *, limit: int | None = None, used: int | None = None, kills: int | None = None,
            group_kills: int = 0, peak: int | None = None, inactive_file: int = 0) -> None:
        job = self.job
        v1 = self.version == 1
        if limit is not None:
            (job / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(f"{limit}\n")
        if used is not None:
            (job / ("memory.usage_in_bytes" if v1 else "memory.current")).write_text(f"{used}\n")
            key = "total_inactive_file" if v1 else "inactive_file"
            (job / "memory.stat").write_text(f"cache 0\nrss {used}\n{key} {inactive_file}\n")
        if kills is not None:
            if v1:
                (job / "memory.oom_control").write_text(
                    f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n")
            else:
                (job / "memory.events").write_text(
                    f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {kills}\noom_group_kill {group_kills}\n")
        if peak is not None:
            (job / ("memory.max_usage_in_bytes" if v1 else "memory.peak")).write_text(f"{peak}\n")

    def cgroup(self) -> Cgroup:
        return Cgroup.detect(str(self.root), str(self.proc_cgroup))

    def remove(self) -> None:
        """What a container runtime, Kubernetes or Slurm does as the job ends."""
        shutil.rmtree(self.root)


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
def tree(request, tmp_path) -> Tree:
    return Tree(tmp_path, request.param)


@pytest.fixture
def state(private_state_dir) -> Path:
    return private_state_dir


def write_job(state: Path, tree: Tree | None, *, pid: int = 41234, ended: statedir.Ended | None = None,
              near_limit: statedir.MemoryReading | None = None, how: str = "run",
              started: float | None = None) -> statedir.Job:
    """A job that no longer runs (a start tick no process has), its cgroup as its probe took it."""
    started = time.time() if started is None else started
    cgroups = []
    if tree is not None:
        counts = oom_counts(str(tree.job), tree.version)
        cgroups = [statedir.CgroupAtStart(path=str(tree.job), limit_bytes=LIMIT, oom_kills=counts.kills,
                                          oom_group_kills=counts.group_kills)]
    meta = statedir.JobMeta(format=statedir.STATE_FORMAT, pid=pid, started_at=started, start_ticks=2**62,
                            boot_id=statedir.boot_id(), host=HOST, argv=["python", "train.py"],
                            how=how, cgroup_version=tree.version if tree else None,  # type: ignore[arg-type]
                            cgroups=cgroups, ended=ended, near_limit=near_limit)
    statedir.write_meta(state / f"{statedir.stem_for(pid, started)}{statedir.META_SUFFIX}", meta)
    return reread(state, pid)


def reread(state: Path, pid: int = 41234) -> statedir.Job:
    job = statedir.find_job(str(pid), state)
    assert job is not None
    return job


# ---- the cgroup's files, both layouts ------------------------------------------------------------


def test_the_oom_counters_limit_and_peak_are_read_in_both_layouts(tree):
    tree.set(kills=2, group_kills=1, peak=900 * MIB)
    group = tree.cgroup()
    assert group.version == tree.version and group.memory_dirs[0] == str(tree.job)
    counts = oom_counts(str(tree.job), tree.version)
    assert counts == OomCounts(2, 1 if tree.version == 2 else None)
    assert counts.risen_since(OomCounts(1, 1 if tree.version == 2 else None)) == OomCounts(
        1, 0 if tree.version == 2 else None)
    assert peak_bytes(str(tree.job), tree.version) == 900 * MIB
    assert group.mem_limit_dir() == (str(tree.job), LIMIT)
    tree.remove()
    assert oom_counts(str(tree.job), tree.version) == OomCounts() and not OomCounts().any()


# ---- `run`'s launcher: the evidence at the death -------------------------------------------------


def test_the_launcher_keeps_the_oom_kill_it_read_at_the_death_after_the_cgroup_is_gone(tree, state):
    tree.set(kills=3)  # kills before this job: not its own
    watch = ChildWatch(41234, os.environ, root=str(tree.root), proc_cgroup=str(tree.proc_cgroup))
    job = write_job(state, tree)
    tree.set(used=LIMIT, kills=4, group_kills=0, peak=LIMIT - MIB)  # the kernel's OOM killer took it
    watch.record(-9)
    tree.remove()
    meta = reread(state).meta
    assert meta.ended is not None and (meta.ended.kind, meta.ended.signal) == ("signal", "SIGKILL")
    at_death = meta.cgroup_at_death
    assert at_death is not None and (at_death.oom_kills, at_death.limit_bytes, at_death.peak_bytes) == (
        1, LIMIT, LIMIT - MIB)
    ending = blackbox.ending_of(reread(state))
    assert ending.text == "killed: SIGKILL (OOM killer: its cgroup's limit 1.1 GiB was reached)"
    assert ending.oom == "counted"
    assert ending.evidence == ("its cgroup's peak usage 1.1 GiB",)
    assert ending.sentence(job.pid) == ("pid 41234 died without a goodbye: killed by the OOM killer — "
                                        "its cgroup's limit 1.1 GiB was reached")


def test_a_group_kill_is_counted_too(tmp_path, state):
    tree = Tree(tmp_path, 2)
    watch = ChildWatch(41234, os.environ, root=str(tree.root), proc_cgroup=str(tree.proc_cgroup))
    write_job(state, tree)
    tree.set(kills=0, group_kills=1)  # memory.oom.group: the cgroup killed whole
    watch.record(-9)
    tree.remove()
    assert blackbox.ending_of(reread(state)).text == (
        "killed: SIGKILL (OOM killer: its cgroup's limit 1.1 GiB was reached, and the cgroup was "
        "killed whole (memory.oom.group))")


def test_a_sigkill_its_cgroup_did_not_count_is_not_the_oom_killer(tree, state):
    watch = ChildWatch(41234, os.environ, root=str(tree.root), proc_cgroup=str(tree.proc_cgroup))
    write_job(state, tree, near_limit=statedir.MemoryReading(at=time.time(), used_bytes=LIMIT - MIB,
                                                            limit_bytes=LIMIT))
    watch.record(-9)  # `kill -9`, a scheduler's time limit: the counter did not move
    tree.remove()
    ending = blackbox.ending_of(reread(state))
    assert ending.text == "killed: unknown cause" and ending.oom is None
    assert "counted no OOM kill" in ending.sentence(41234)


def test_the_launcher_tells_the_exit_code_its_child_cannot(tree, state):
    watch = ChildWatch(41234, os.environ, root=str(tree.root), proc_cgroup=str(tree.proc_cgroup))
    write_job(state, tree, ended=statedir.Ended(kind="finished", at=time.time()))
    watch.record(128 + 15)  # a SIGTERM handler's SystemExit(143), raised outside the loop
    ended = reread(state).meta.ended
    assert ended is not None and ended.exit_code == 143
    assert blackbox.ending_of(reread(state)).text == "signal: SIGTERM"
    write_job(state, tree, pid=41235)  # os._exit(0): past its atexit, no `ended` written
    ChildWatch(41235, os.environ, root=str(tree.root), proc_cgroup=str(tree.proc_cgroup)).record(0)
    assert blackbox.ending_of(reread(state, 41235)).text == "finished"


def test_the_launcher_leaves_an_older_job_of_a_reused_pid_alone(tree, state):
    write_job(state, tree, started=time.time() - 30)  # before the launcher's child started
    watch = ChildWatch(41234, os.environ, root=str(tree.root), proc_cgroup=str(tree.proc_cgroup))
    watch.record(-9)
    assert reread(state).meta.ended is None


# ---- the probe: its memory near the limit ----------------------------------------------------------


def test_the_black_box_keeps_its_readings_near_the_limit_and_takes_them_off_below(tree, tmp_path):
    box = writer.BlackBox(tmp_path / "box", pid=os.getpid(), started_at=time.time(), how="instrument")
    box._open()
    box._memory = memory_watch.MemoryWatch.of(tree.cgroup())
    assert box._memory is not None

    def near() -> statedir.MemoryReading | None:
        return statedir.read_meta(box.meta_path).near_limit

    tree.set(used=LIMIT // 4)  # far: nothing written, read again at the usual wake-up
    assert box._read_memory() == writer.FLUSH_S and near() is None
    tree.set(used=LIMIT // 2 + MIB)  # half-way: read more often, still nothing written
    assert box._read_memory() == memory_watch.WATCH_S and near() is None
    tree.set(used=round(LIMIT * 0.97), inactive_file=0)
    assert box._read_memory() == memory_watch.NEAR_S
    reading = near()
    assert reading is not None and (reading.used_bytes, reading.limit_bytes) == (round(LIMIT * 0.97), LIMIT)
    # page cache the kernel drops before it kills is not pressure
    tree.set(used=round(LIMIT * 0.97), inactive_file=LIMIT // 4)
    assert box._read_memory() == memory_watch.WATCH_S and near() is None


def test_no_launcher_and_no_cgroup_left_the_last_reading_near_the_limit_tells(state):
    reading = statedir.MemoryReading(at=time.time() - 5, used_bytes=round(LIMIT * 0.97), limit_bytes=LIMIT)
    job = write_job(state, None, near_limit=reading, how="instrument")
    ending = blackbox.ending_of(job)
    assert ending.text == ("killed: SIGKILL (OOM killer: likely — memory at 97 % of its cgroup's 1.1 GiB "
                           "limit in its last reading)")
    assert ending.oom == "likely"
    low = statedir.MemoryReading(at=time.time() - 5, used_bytes=round(LIMIT * 0.85), limit_bytes=LIMIT)
    lower = write_job(state, None, pid=41235, near_limit=low)
    assert blackbox.ending_of(lower).text == "killed: unknown cause"


def test_with_its_launcher_the_reading_says_how_long_before_it_died(tree, state):
    watch = ChildWatch(41234, os.environ, root=str(tree.root), proc_cgroup=str(tree.proc_cgroup))
    now = time.time()
    write_job(state, tree, near_limit=statedir.MemoryReading(at=now - 0.3, used_bytes=round(LIMIT * 0.97),
                                                            limit_bytes=LIMIT))
    tree.set(kills=1)
    watch.record(-9)
    tree.remove()
    ending = blackbox.ending_of(reread(state))
    assert ending.oom == "counted"
    (near, _peak) = ending.evidence
    assert near.startswith("memory at 97 % of its cgroup's 1.1 GiB limit ")
    assert near.endswith(" s before it died")
