"""End to end diagnosis (issue 3): one real workload per category this machine can produce, judged
through `loadertop snapshot --json`, twice in a row (the verdict must appear within a few seconds of
steady state and stay put).

The workloads run in three sequential groups, in parallel inside a group, chosen so that no
workload disturbs another's verdict on a 2-core machine:

1. sleeping dataset (input_bound_io) and cheap dataset + 50 ms step (compute_bound): light;
   one CPU-burning worker (input_bound_cpu: it needs a core left free, which the light two
   leave); a worker that calls os._exit(3) (stalled naming exit code 3; idle once torch raised);
2. tiny batches with no step (main_process_bound: robust to load) and a dataset that hangs
   (stalled once the loop is blocked > STALL_MIN_MS = 5 s; it uses no CPU);
3. four CPU-burning workers plus a busy loop (cpu_saturated), alone, so that the saturation is
   its own doing.

The two stalled jobs (exit, hang) use no CPU once stalled: they start before the first group and
stall while its jobs reach steady state, and are snapshotted with their own group.

Two of them are then followed by an experiment (issue 15; the main-process and store cases are
in `test_advice_experiments.py`): the advice is read, the same job runs again,
alone, with the setting it implies, and the throughput the loop itself measured (train.py's
`phases`, after a 1 s warm-up) is compared — it must rise where more workers were advised (cpu,
io).

The verdicts that depend on free CPU (io, cpu, compute) are only as good as the machine is quiet:
while a snapshot runs, the CPU used by processes that are not ours is measured, and when the verdict
differs *and* other processes took a sizeable share of the CPU, the test is skipped with the
figures (a shared CI runner), not failed.
"""

from __future__ import annotations

import os
import re
import time

import psutil
import pytest

from conftest import CpuMeter, SnapshotRun, WorkloadPool, check_document, source_of

pytestmark = pytest.mark.slow

SNAP_S = 3.0
STEADY_BATCHES = 20
FOREIGN_CORES_TOLERATED = 0.3  # CPU taken by other processes above which a CPU-sensitive verdict
                               # is not held against loadertop

WORKLOADS = {
    "io": ("--kind", "sleep", "--ms", 5, "--workers", 2, "--batch-size", 4),
    "compute": ("--kind", "cheap", "--workers", 2, "--batch-size", 4, "--step-ms", 50),
    "exit": ("--kind", "exit", "--exit-code", 3, "--workers", 2, "--batch-size", 2, "--after", 10,
             "--idle-after-error", 120),  # alive until killed: it is started early
    # the job of issue 15: 6 ms of CPU an item, batch 8, a 3 ms step (1 worker measured 19.8
    # batches/s, 2 workers 38.2 with plain torch)
    "cpu": ("--kind", "cpu", "--ms", 6, "--workers", 1, "--batch-size", 8, "--step-ms", 3),
    "hang": ("--kind", "hang", "--workers", 2, "--batch-size", 2, "--after", 10),
    "main": ("--kind", "cheap", "--workers", 2, "--batch-size", 1),
    # CPU-burning workers plus a busy loop: more CPU-hungry processes than the 2 cores.
    "saturated": ("--kind", "cpu", "--ms", 10, "--workers", 4, "--batch-size", 4,
                  "--busy-step-ms", 5),
}
GROUPS = (("io", "compute", "cpu", "exit"), ("main", "hang"), ("saturated",))
STALLED_EARLY = ("exit", "hang")  # started with the first group, snapshotted with their own
EXPECTED = {"io": "input_bound_io", "compute": "compute_bound", "exit": "stalled",
            "cpu": "input_bound_cpu", "hang": "stalled", "main": "main_process_bound",
            "saturated": "cpu_saturated"}
CPU_SENSITIVE = {"io", "compute", "cpu"}
AFTER_S = 4.5  # an experiment's second run: 1 s of warm-up (not counted), then its rate
ROSE = 1.4  # "rose by a meaningful margin": at least this factor where more workers were advised
TRY = re.compile(r"^(?:use workers at all: )?try num_workers=(\d+)")


def _take_snapshots(group_workloads: dict, extra_wait: dict) -> dict:
    """Two consecutive snapshots of every workload of a group, all workloads at once."""
    out = {name: {"docs": [], "load": []} for name in group_workloads}
    for round_ in range(2):
        # a workload may ask to be snapshotted only from some time on (the hang: >= 5 s blocked)
        for when in extra_wait.values():
            if round_ == 0 and when is not None:
                delay = when() - time.time()
                if delay > 0:
                    time.sleep(delay)  # waiting for a wall-clock moment, not synchronising
        runs = {name: SnapshotRun(wl.dir, seconds=SNAP_S) for name, wl in group_workloads.items()}
        meter = CpuMeter()
        pids = [wl.pid for wl in group_workloads.values()] + [r.proc.pid for r in runs.values()]
        meter.start(pids + [os.getpid()])
        docs = {name: run.document() for name, run in runs.items()}
        load = meter.stop(pids + [os.getpid()])
        for name, doc in docs.items():
            out[name]["docs"].append(doc)
            out[name]["load"].append(load)
    return out


@pytest.fixture(scope="module")
def verdicts():
    results: dict = {}
    # The stalled jobs use no CPU once stalled: started before the first group, they reach their
    # state while its jobs reach steady state, instead of each making its own group wait for it.
    early = WorkloadPool()
    try:
        stalled = {name: early(*WORKLOADS[name], "--duration", 120) for name in STALLED_EARLY}
        for wl in stalled.values():
            wl.wait_discovery()
        for group in GROUPS:
            pool = WorkloadPool()
            try:
                wls = {name: stalled[name] if name in stalled else
                       pool(*WORKLOADS[name], "--duration", 120) for name in group}
                for wl in wls.values():
                    wl.wait_discovery()
                extra_wait = {}
                for name, wl in wls.items():
                    if name == "exit":
                        wl.wait_status(lambda st: st["phase"] == "error", what="the worker's exit")
                    elif name == "hang":
                        wl.wait_batches(10)
                        # blocked since the 10th batch: snapshot once that is >= 3 s old, so the
                        # document (3 s later) sees a loop blocked > STALL_MIN_MS = 5 s
                        extra_wait[name] = lambda wl=wl: wl.status()["last_batch_at"] + 3.0
                    else:
                        wl.wait_batches(STEADY_BATCHES)
                # the early jobs stalled before the first group's snapshots: idle while any is taken
                if group is GROUPS[0]:
                    stalled["exit"].wait_status(lambda st: st["phase"] == "error",
                                                what="the worker's exit")
                    stalled["hang"].wait_batches(10)
                steady_at = time.monotonic()
                snaps = _take_snapshots(wls, extra_wait)
                for name, wl in wls.items():
                    results[name] = {"snaps": snaps[name], "workload": wl, "status": wl.status(),
                                     "pids": wl.worker_pids(),
                                     "steady_after_s": time.monotonic() - steady_at}
            finally:
                pool.close()
    finally:
        early.close()
    return results


def _verdict_of(result: dict, i: int) -> tuple[dict, dict]:
    doc = result["snaps"]["docs"][i]
    check_document(doc)
    src = source_of(doc, result["workload"].pid)
    return src, doc


def _check_category(name: str, verdicts: dict) -> list[dict]:
    """Both snapshots show the expected category (the verdict appears at once and stays put)."""
    result = verdicts[name]
    expected = EXPECTED[name]
    sources = []
    for i in range(2):
        src, doc = _verdict_of(result, i)
        got = src["diagnosis"]["category"]
        load = result["snaps"]["load"][i]
        if got != expected and name in CPU_SENSITIVE and load["foreign_cores"] > FOREIGN_CORES_TOLERATED:
            pytest.skip(f"{name}: {got} instead of {expected} while other processes used "
                        f"{load['foreign_cores']} cores of {psutil.cpu_count()} ({load}); "
                        f"this verdict needs a quiet machine")
        assert got == expected, (
            f"{name}, snapshot {i + 1}: {got} instead of {expected}\n"
            f"summary: {src['diagnosis']['summary']}\nevidence: {src['diagnosis']['evidence']}\n"
            f"machine load during the snapshot: {load}\nsystem: cpu {doc['system']['cpu_percent']} "
            f"load {doc['system']['load_avg_1m']}")
        assert src["diagnosis"]["summary"] and src["diagnosis"]["evidence"]
        sources.append(src)
    return sources


def test_sleeping_dataset_is_input_bound_io(verdicts):
    for src in _check_category("io", verdicts):
        assert src["wait_fraction"] > 0.5
        assert all(w["cpu_fraction"] < 0.3 for w in src["workers"])
        assert src["diagnosis"]["advice"]


def test_one_cpu_burning_worker_is_input_bound_cpu_with_a_worker_count(verdicts):
    for src in _check_category("cpu", verdicts):
        assert src["workers"][0]["cpu_fraction"] > 0.7
        advice = " ".join(src["diagnosis"]["advice"])
        # concrete, from the figures (tests/functional/test_advice_experiments.py follows it)
        assert "worker" in advice and any(ch.isdigit() for ch in advice), advice


def test_cheap_dataset_with_slow_step_is_compute_bound(verdicts):
    for src in _check_category("compute", verdicts):
        assert src["wait_fraction"] < 0.1
        assert src["step_ms"]["p50"] >= 50


def test_tiny_batches_without_step_are_main_process_bound(verdicts):
    for src in _check_category("main", verdicts):
        assert src["queue"]["ready_when_waiting"] >= 0.5


def test_many_cpu_burning_workers_on_two_cores_are_cpu_saturated(verdicts):
    """Four CPU-burning workers and a busy main loop on 2 cores.

    Batches that arrived out of order (or still sit in a busy worker's send buffer) count as
    ready, so `ready_when_waiting` is often high here too; what tells this from main_process_bound is the
    loop's own thread, measured mostly off-CPU inside next() (blocked, or starved by the workers),
    or the measured split of the wait (most of it before the batch was produced). The probe
    samples the loop's CPU only while waits with batches ready are frequent, so a window may lack
    that figure: then the split must be what decided.

    When neither is there to tell (no loop CPU figure, most of the wait after production, batches
    piling up: a clean-clone CI saw 71 % handoff and 64 % ready), the verdict is
    main_process_bound, and then it must say that the CPU is saturated too, with its figure, and
    advise on it: what a user needs from this machine either way."""
    result = verdicts["saturated"]
    for i in range(2):
        src, _ = _verdict_of(result, i)
        diagnosis = src["diagnosis"]
        assert diagnosis["summary"] and diagnosis["evidence"]
        assert src["config"]["num_workers"] == 4
        if diagnosis["category"] == "main_process_bound":
            assert any(e.startswith("CPU ") and "(threshold 90 %)" in e
                       for e in diagnosis["evidence"]), diagnosis
            assert any(a.startswith("the CPU is saturated too") for a in diagnosis["advice"]), \
                diagnosis
            continue
        assert diagnosis["category"] == "cpu_saturated", (
            f"snapshot {i + 1}: {diagnosis}\nmachine load: {result['snaps']['load'][i]}")
        loop_cpu = src["queue"]["loop_cpu_when_waiting"]
        split = src["stages"]["wait_split"]
        blocked = loop_cpu is not None and loop_cpu < 0.25  # LOOP_CPU_MAIN_BOUND_MIN
        producing = split is not None and split["handoff"] < 0.5  # HANDOFF_MAIN_BOUND
        # ... or, the split near its threshold, the queue samples that must agree with it
        ready = src["queue"]["ready_when_waiting"]
        not_piling_up = ready is not None and ready < 0.5  # READY_WHEN_WAITING_MAIN_BOUND
        assert blocked or producing or not_piling_up, (loop_cpu, split, src["queue"])
        doc_cpu = verdicts["saturated"]["snaps"]["docs"][0]["system"]["cpu_percent"]
        assert doc_cpu is None or doc_cpu >= 85


def test_hanging_dataset_is_stalled(verdicts):
    result = verdicts["hang"]
    assert result["status"]["batches"] == 10 and result["status"]["phase"] == "running"
    for src in _check_category("hang", verdicts):
        assert src["state"] == "stalled"
        assert src["blocked_ms"] >= 5000
        assert "blocked in next()" in src["diagnosis"]["summary"]
        assert src["batches_total"] == 10
        # every worker is alive: the hang is not a death
        assert all(w["alive"] for w in src["workers"])
    # The findings of a hang (issue 10): the stuck workers' and the loop's stacks, by faulthandler
    # and sys._current_frames(), naming the function the dataset blocks in.
    src, doc = _verdict_of(result, 1)
    kinds = {(f["kind"], f["worker"]): f for f in src["findings"]}
    assert ("loop_hung", None) in kinds, src["findings"]
    hung = [f for (kind, _), f in kinds.items() if kind == "worker_hung"]
    assert hung, src["findings"]
    for f in hung:
        assert f["severity"] == "critical" and f["stack"], f
        assert f["stack"][-1].endswith("in hang_forever"), f["stack"][-3:]
        assert "lt_data.py" in f["summary"] and "hang_forever" in f["summary"], f["summary"]
    loop = kinds[("loop_hung", None)]
    assert any("train.py" in frame and "in main" in frame for frame in loop["stack"]), loop["stack"]
    # the stalled verdict quotes the innermost frame of the user's code
    assert "hang_forever" in src["diagnosis"]["summary"], src["diagnosis"]
    assert {f["kind"] for f in doc["findings"]} >= {"loop_hung", "worker_hung"}


def test_exiting_worker_is_stalled_naming_its_exit_code(verdicts):
    result = verdicts["exit"]
    status = result["status"]
    assert status["phase"] == "error" and "exited unexpectedly" in status["error"]
    (victim_pid,) = result["pids"][0]  # batch 10 (sample 20) goes to worker 0: n % 2
    assert str(victim_pid) in status["error"]
    for src in _check_category("exit", verdicts):
        assert src["state"] == "stalled"
        verdict = src["diagnosis"]
        assert "exited with code 3" in verdict["summary"], verdict
        assert any(str(victim_pid) in line and "code 3" in line for line in verdict["evidence"]), verdict
        dead = {w["id"]: w for w in src["workers"]}[0]
        assert dead["alive"] is False and dead["exitcode"] == 3 and dead["pid"] == victim_pid
        died = [f for f in src["findings"] if f["kind"] == "worker_died"]
        assert [(f["worker"], f["severity"]) for f in died] == [(0, "critical")], src["findings"]
        assert "exited with code 3" in died[0]["summary"]
        assert src["end"]["how"] == "crashed" and "exited unexpectedly" in src["end"]["error"]


@pytest.mark.parametrize("name", ["io", "compute", "cpu"])
def test_healthy_io_and_cpu_bound_jobs_show_no_findings(verdicts, name):
    for i in range(2):
        src, doc = _verdict_of(verdicts[name], i)
        assert src["findings"] == [] and doc["findings"] == [], src["findings"]
        assert src["end"] is None


def test_top_level_diagnosis_names_the_source(verdicts):
    for result in verdicts.values():
        for doc in result["snaps"]["docs"]:
            top = doc["diagnosis"]
            (src,) = doc["sources"]
            assert top["source"] == src["id"]
            assert top["category"] == src["diagnosis"]["category"]


# ------------------------------------------------------------------ advice followed by experiment

def _loop_rate(status: dict) -> float | None:
    """The batches/s the training loop itself measured (train.py's `phases`, warm-up excluded)."""
    phases = status.get("phases") or []
    return phases[-1]["batches_per_s"] if phases else None


def _advised(src: dict) -> int | None:
    found = TRY.match(src["diagnosis"]["advice"][0])
    return int(found.group(1)) if found else None


def _alone(name: str, workers: int) -> tuple[float | None, dict]:
    """WORKLOADS[name] with `workers`, alone on the machine: the loop's own rate, the load."""
    args = list(WORKLOADS[name])
    args[args.index("--workers") + 1] = workers
    pool = WorkloadPool()
    try:
        wl = pool(*args, "--duration", AFTER_S)
        meter = CpuMeter()
        wl.wait_discovery()
        meter.start([wl.pid, os.getpid()])
        wl.wait_status(lambda st: st.get("t", 0) - st.get("started_at", 0) >= AFTER_S - 0.5
                       or st.get("phase") == "done", timeout=AFTER_S + 30, what="the run's end")
        load = meter.stop([wl.pid, os.getpid()])
        assert wl.wait(30) == 0, wl.stderr()[-3000:]
        return _loop_rate(wl.status()), load
    finally:
        pool.close()


@pytest.fixture(scope="module")
def experiments(verdicts):
    """The cpu and io jobs again, alone, with the count their advice named (compared with their run
    above, whose neighbours are light). The main-process case is in test_advice_experiments.py:
    there the main process is the limit, a neighbour's CPU moves its rate by 20 % (measured here:
    631 batches/s beside the hang job, 800 alone), so both of its runs are alone."""
    out = {}
    for name in ("cpu", "io"):
        src, _ = _verdict_of(verdicts[name], 1)
        count = _advised(src)
        if count is None:
            out[name] = {"advice": src["diagnosis"]["advice"], "count": None}
            continue
        after, load = _alone(name, count)
        before, before_load = _loop_rate(verdicts[name]["status"]), verdicts[name]["snaps"]["load"]
        out[name] = {"advice": src["diagnosis"]["advice"], "count": count, "before": before,
                     "after": after, "load": load, "before_load": before_load}
    return out


def _experiment(experiments: dict, name: str) -> tuple[dict, float]:
    e = experiments[name]
    assert e["count"] is not None, f"{name}: no worker count advised: {e['advice']}"
    assert e["before"] and e["after"], e
    gain = e["after"] / e["before"]
    print(f"\n{name}: advice {e['advice'][0]!r}\n  before {e['before']} batches/s, with "
          f"num_workers={e['count']} {e['after']} (×{gain:.2f}); machine {e['load']}")
    return e, gain


def _judge(ok: bool, message: str, e: dict) -> None:
    if ok:
        return
    foreign = max([e["load"]["foreign_cores"]] + [x["foreign_cores"] for x in e["before_load"]])
    if foreign > FOREIGN_CORES_TOLERATED:
        pytest.skip(f"{message} while other processes used {foreign} cores: needs a quiet machine")
    raise AssertionError(message)


def test_cpu_bound_the_advised_worker_count_pays(verdicts, experiments):
    _check_category("cpu", verdicts)  # skips on a busy machine, as the verdict's own test does
    src, _ = _verdict_of(verdicts["cpu"], 1)
    advice = src["diagnosis"]["advice"]
    # the count rests on the CPU the training process measurably uses, and says so
    assert src["process"]["cpu_cores"] is not None and src["process"]["cpu_cores"] < 0.5, src
    assert "the training process" in advice[0], advice
    assert not any("cannot keep up" in a or "no free cores" in a for a in advice), advice
    e, gain = _experiment(experiments, "cpu")
    assert e["count"] >= 2, advice
    _judge(gain >= ROSE, f"cpu: num_workers={e['count']} gave ×{gain:.2f} ({e})", e)


def test_io_bound_the_advised_count_pays_where_the_storage_serves_it(verdicts, experiments):
    _check_category("io", verdicts)
    e, gain = _experiment(experiments, "io")
    advice = e["advice"]
    assert f"if the storage serves {e['count']} reads at once" in advice[0], advice
    assert any("loadertop tune" in a for a in advice), advice
    _judge(gain >= ROSE, f"io: num_workers={e['count']} gave ×{gain:.2f} ({e})", e)
