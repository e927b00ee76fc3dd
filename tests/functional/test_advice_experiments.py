"""Advice followed by experiment (issue 15), for a loader the program re-creates with more workers.

A storage that serves 2 reads at once (a semaphore shared by the workers): with 2 workers the
advice asks for more only conditionally and points to `loadertop tune`; the program then re-creates
its loader with 6 workers (one viewer watching both phases) and the advice says that 2 gave as
much, with the fetch time that rose. The claim is checked by the loop's own clock (`train.py`'s
`phases`, after a 1 s warm-up): 6 were no faster than 2, and the 2 it names, run again, are as
fast as the 6.

And the main process as the limit: batches of 64 unstacked tensors, 2 workers — the advice says more
workers will not help; 4, run alone, are no faster than 2 run alone. (The cpu and io cases follow
their advice in `test_e2e_diagnosis.py`, on the same runs whose verdicts are judged there.)

When the figures look wrong *and* other processes took a sizeable share of the CPU meanwhile, the
test is skipped with the figures (a shared CI runner), not failed."""

from __future__ import annotations

import json
import os
import re

import psutil
import pytest

from conftest import CpuMeter, SnapshotRun, WorkloadPool, check_document, source_of

pytestmark = pytest.mark.slow

RUN_S = 4.5  # a run: 1 s of warm-up (excluded from its rate), then the measurement
SNAP_S = 3.0
FOREIGN_CORES_TOLERATED = 0.3
FLAT = 1.15  # "did not rise": at most this factor where the advice said more would not help
ROSE = 1.4  # "rose": at least this factor where the advice was followed (test_e2e_diagnosis's)

MAIN = ("--kind", "cheap", "--batch-size", 64, "--list-batches")
STORE = ("--kind", "store", "--ms", 5, "--store-slots", 2, "--batch-size", 4, "--step-ms", 2)
TRY = re.compile(r"^(?:use workers at all: )?try num_workers=(\d+)")


class Run:
    """One workload: its snapshots (if any), the loop's own throughput, the machine's load."""

    def __init__(self, pool: WorkloadPool, *args, duration: float = RUN_S,
                 snapshots: tuple[float, ...] = ()) -> None:
        self.args = args
        self.wl = pool(*args, "--duration", duration)
        self.duration = duration
        self.snapshot_seconds = snapshots
        self.docs: list[dict] = []
        self.load: dict = {}
        self.output = self.errors = ""

    def start_snapshots(self) -> list[SnapshotRun]:
        self.wl.wait_discovery()
        self.wl.wait_batches(5)
        return [SnapshotRun(self.wl.dir, seconds=s) for s in self.snapshot_seconds]

    def documents(self, runs: list[SnapshotRun]) -> None:
        self.docs = [run.document() for run in runs]
        for doc in self.docs:
            check_document(doc)

    def near_end(self) -> None:
        """Wait until the run is about to end (the machine's load is read while it runs)."""
        self.wl.wait_status(lambda st: st.get("phase") == "done"
                            or st.get("t", 0) - st.get("started_at", 0) >= self.duration - 0.5,
                            timeout=self.duration + 30, what="the end of the run")

    def finish(self) -> None:
        assert self.wl.wait(30) == 0, self.wl.stderr()[-3000:]
        self.output, self.errors = self.wl.stdout(), self.wl.stderr()

    @property
    def phases(self) -> list[dict]:
        for line in reversed(self.output.splitlines()):
            if line.startswith("{"):
                return json.loads(line)["phases"]
        raise AssertionError(f"no result line from {self.args}: {self.errors[-3000:]}")

    def rate(self, phase: int = -1) -> float:
        rate = self.phases[phase]["batches_per_s"]
        assert rate, self.phases
        return rate

    def source(self, i: int = 0) -> dict:
        return source_of(self.docs[i], self.wl.pid)


def run_group(*runs_args: tuple) -> list[Run]:
    """Start every run of a group at once, take their snapshots, wait for them to end."""
    pool = WorkloadPool()
    try:
        runs = [Run(pool, *args, **kwargs) for args, kwargs in runs_args]
        meter = CpuMeter()
        snaps = [run.start_snapshots() for run in runs]
        pids = [r.wl.pid for r in runs] + [s.proc.pid for ss in snaps for s in ss] + [os.getpid()]
        meter.start(pids)
        for run, ss in zip(runs, snaps):
            run.documents(ss)
        for run in runs:
            run.near_end()
        load = meter.stop(pids)
        for run in runs:
            run.finish()
            run.load = load
        return runs
    finally:
        pool.close()


def advised_count(src: dict) -> int | None:
    found = TRY.match(src["diagnosis"]["advice"][0])
    return int(found.group(1)) if found else None


def check_or_skip(ok: bool, message: str, *runs: Run) -> None:
    """Fail with the figures — unless other processes took the CPU meanwhile (then skip)."""
    if ok:
        return
    foreign = max(r.load.get("foreign_cores", 0.0) for r in runs)
    if foreign > FOREIGN_CORES_TOLERATED:
        pytest.skip(f"{message} while other processes used {foreign} cores of "
                    f"{psutil.cpu_count()}: this experiment needs a quiet machine")
    raise AssertionError(message)


def figures(run: Run) -> str:
    return f"{run.args}: {run.phases} (machine {run.load})"


# ------------------------------------------------------------------------------- the cases

@pytest.fixture(scope="module")
def store_experiment():
    """The program re-creates its loader with more workers (a 3 s viewer during its first phase,
    an 8 s one across both); then the count the advice names runs again."""
    (store,) = run_group(((*STORE, "--workers", 2, "--then-workers", 6, "--then-after", 4.0),
                          {"duration": 9.0, "snapshots": (SNAP_S, 8.0)}))
    names = [int(n) for n in re.findall(r"^num_workers=(\d+) gave (?:nearly )?as much",
                                        store.source(1)["diagnosis"]["advice"][0])]
    after = run_group(((*STORE, "--workers", names[0]), {}))[0] if names else None
    return store, names, after


def test_a_store_serving_two_reads_at_once_more_workers_do_not_help(store_experiment):
    store, names, after = store_experiment
    # with 2 workers: any count asked for is conditional on the storage, and tune is named
    early = store.source(0)
    assert early["config"]["num_workers"] == 2, early["config"]
    advice = early["diagnosis"]["advice"]
    if advised_count(early) is not None:
        assert "if the storage serves" in advice[0], advice
        assert any("loadertop tune" in a for a in advice), advice
    # after the program re-created its loader with 6: the earlier setting is the evidence
    later = store.source(1)
    assert later["config"]["num_workers"] == 6, later["config"]
    assert [s["num_workers"] for s in later["earlier_settings"]] == [2], later["earlier_settings"]
    advice = later["diagnosis"]["advice"]
    print(f"\nstore: earlier {later['earlier_settings']}\n  now {later['batches_per_s']} batches/s, "
          f"{later['workers'][0]['fetch_ms']}")
    assert names == [2], advice
    assert "more workers do not help" in advice[0], advice
    assert any("they queue for the storage" in a for a in advice), advice
    assert not any(TRY.match(a) for a in advice), advice
    # the claim checked by the loop's own clock: 6 workers were not faster than 2 ...
    phase2, phase6 = store.rate(0), store.rate(1)
    # ... and the advised 2, run again, are as fast as the 6
    rerun = after.rate()
    print(f"\nstore: advice {advice[0]!r}\n  phases {figures(store)}\n  re-run {figures(after)}")
    check_or_skip(phase6 <= FLAT * phase2, f"store: 6 workers {phase6} vs 2 {phase2}", store)
    check_or_skip(rerun >= phase6 / FLAT, f"store: the advised 2 gave {rerun} vs 6 {phase6}",
                  store, after)


@pytest.fixture(scope="module")
def main_experiment():
    """The advice from a watched run of 2 workers; the rates from 2 and 4 run alone, twice each
    (2, 4, 4, 2: a drift of the machine's speed cancels).

    The watched run's rate is not compared: its snapshot takes CPU from the loop on a 2-core
    machine (a clean-clone CI measured 2 watched against 4 alone as ×1.17)."""
    (before,) = run_group(((*MAIN, "--workers", 2), {"snapshots": (SNAP_S,)}))
    runs = [run_group(((*MAIN, "--workers", n), {}))[0] for n in (2, 4, 4, 2)]
    return before, (runs[0], runs[3]), (runs[1], runs[2])


@pytest.fixture(scope="module")
def shared_by_name():
    """The same job, 2 workers, run alone with the file_system sharing strategy."""
    (run,) = run_group(((*MAIN, "--workers", 2, "--sharing", "file_system"), {}))
    return run


def test_main_process_bound_more_workers_do_not_help(main_experiment):
    before, alone, after = main_experiment
    src = before.source()
    advice = src["diagnosis"]["advice"]
    check_or_skip(src["diagnosis"]["category"] == "main_process_bound",
                  f"main: {src['diagnosis']}", before)
    assert any(a.startswith("more workers will not help") for a in advice), advice
    assert not any(TRY.match(a) for a in advice), advice
    # The best of each against each other, judged beside the spread of each pair (an A/A). The
    # loop's thread was on a CPU only ~0.52 of the time here: it also waits for a worker to hand
    # over each tensor's file descriptor (torch's file_descriptor sharing strategy), so a run's
    # rate moves with how soon the workers get scheduled: 2 workers alone gave 47-53 batches/s
    # in three runs in a row here.
    gain = max(r.rate() for r in after) / max(r.rate() for r in alone)
    spread = max(max(r.rate() for r in pair) / min(r.rate() for r in pair) for pair in (alone, after))
    print(f"\nmain: advice {advice!r}\n  2 workers {[figures(r) for r in alone]}\n  4 workers "
          f"{[figures(r) for r in after]}\n  ×{gain:.2f} (A/A spread ×{spread:.2f})")
    check_or_skip(gain <= FLAT * spread,
                  f"main: 4 workers gave ×{gain:.2f}, beyond ×{FLAT} and the runs' own spread "
                  f"×{spread:.2f}", *alone, *after)


def test_main_process_bound_by_small_tensors_shares_them_by_name_as_advised(main_experiment,
                                                                           shared_by_name):
    """The second advice for this batch (its tensors kept as they are), followed: torch's
    file_system sharing strategy gave 42-47 -> 146-165 batches/s here in scripts of its own, and
    ×2.94 and ×3.19 over the best of 2 alone in this test."""
    before, alone, _ = main_experiment
    src = before.source()
    advice = src["diagnosis"]["advice"]
    check_or_skip(src["diagnosis"]["category"] == "main_process_bound",
                  f"main: {src['diagnosis']}", before)
    assert advice[0].startswith("a batch holds 64 tensors"), advice
    assert "set_sharing_strategy('file_system')" in advice[1], advice
    gain = shared_by_name.rate() / max(r.rate() for r in alone)
    print(f"\nfile_system: {figures(shared_by_name)}\n  ×{gain:.2f} over the best of 2 alone")
    check_or_skip(gain >= ROSE, f"main: file_system gave ×{gain:.2f}", *alone, shared_by_name)
