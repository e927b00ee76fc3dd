"""The probe's start stays light: it does not bring the program's next full garbage collection
forward (loadertop/probe/quiet_start.py), under `loadertop run` and with `loadertop.instrument`,
and what only a viewer needs is loaded when one subscribes (probe/publisher.py, `_loading`).

The collection tests run a fresh interpreter that puts itself MARGIN objects short of a full collection
(CPython: one is made once the objects promoted to the oldest generation since the last exceed a
quarter of what it held then), starts the probe, then makes cyclic garbage enough for many young
collections. Started without care, the probe promotes several thousand objects (psutil, msgspec,
pyzmq, the schema, the publisher) and the program makes a full collection it would not have made.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import SnapshotRun, clean_env, wait_for

MARGIN = 1500  # objects short of the next full collection; the probe's start promotes > 5,000

PROGRAM = textwrap.dedent("""
    import gc, sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    full = []
    gc.callbacks.append(lambda phase, info: phase == "stop" and info["generation"] == 2
                        and full.append(info["collected"]))
    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=2)
    gc.collect()
    kept = [[] for _ in range(len(gc.get_objects(2)) // 4 - {margin})]
    gc.collect(1)  # promoted: the program is now {margin} objects short of a full collection
    full.clear()
    if sys.argv[1] == "instrument":
        import loadertop
        loader = loadertop.instrument(loader, name="quiet")
    batches = [b.tolist() for (b,) in loader]
    assert batches == [[0, 1], [2, 3], [4, 5], [6, 7]], batches
    for _ in range(300_000):  # cyclic garbage: ~430 young collections, ~40 of the middle one
        cycle = []
        cycle.append(cycle)
    counts = gc.get_stats()
    print("full", len(full), "young", counts[0]["collections"], "enabled", gc.isenabled(),
          "frozen", gc.get_freeze_count())
""").format(margin=MARGIN)


def _run(mode: str, lt_dir) -> dict:
    command = [sys.executable, "-c", PROGRAM, mode]
    if mode == "run":
        command = [sys.executable, "-m", "loadertop", "run", "-q", "--", *command]
    env = clean_env(lt_dir)
    env.pop("LOADERTOP_RUN", None)
    res = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    words = res.stdout.split()
    return dict(zip(words[::2], words[1::2]))


@pytest.mark.parametrize("mode", ["run", "instrument"])
def test_the_probe_start_makes_no_full_collection_the_program_would_not_make(mode, lt_dir):
    plain = _run("plain", lt_dir)
    assert plain["full"] == "0", plain  # the program itself stays short of one
    measured = _run(mode, lt_dir)
    assert measured["full"] == "0", measured
    assert measured["enabled"] == "True" and measured["frozen"] == "0", measured


WATCHED_LATER = textwrap.dedent("""
    import json, os, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    import loadertop

    class Slow(Dataset):
        def __len__(self):
            return 16
        def __getitem__(self, i):
            time.sleep(0.005)
            return i

    def loaded():
        names = ("psutil", "loadertop.system", "loadertop.probe.system_feed", "sysconfig")
        return json.dumps({name: name in sys.modules for name in names})

    loader = loadertop.instrument(DataLoader(Slow(), batch_size=4, num_workers=2,
                                             persistent_workers=True), name="light")
    for _ in loader:
        pass
    print(loaded(), flush=True)
    while not os.path.exists(sys.argv[1]):
        for _ in loader:
            pass
    print(loaded(), flush=True)
""")


def test_what_only_a_viewer_needs_is_loaded_when_one_subscribes(lt_dir):
    # With the black box off: the black box samples what the findings need with no viewer, and
    # loads these for it (tests/functional/test_blackbox_writer.py).
    stop = lt_dir / "stop"
    proc = subprocess.Popen([sys.executable, "-c", WATCHED_LATER, str(stop)],
                            env=clean_env(lt_dir, LOADERTOP_BLACKBOX="0"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        unwatched = json.loads(proc.stdout.readline() or "null")
        assert unwatched == {"psutil": False, "loadertop.system": False,
                             "loadertop.probe.system_feed": False, "sysconfig": False}, \
            proc.stderr.read() if unwatched is None else unwatched
        def with_viewer_figures():
            code, doc, _out, _err = SnapshotRun(lt_dir, str(proc.pid), seconds=2.0).result()
            if code != 0:  # the loading, done before the first report to a new viewer, took
                return False  # the window: nothing received yet
            (src,) = [s for s in doc["sources"] if s["name"] == "light"]
            # psutil's figures, from the 1 Hz ticks after the subscription, and the machine's
            # sampler's (its rates need two of its readings): how many ticks a 2 s window holds
            # once the loading is done is the loaded machine's, so the snapshots are repeated
            # until they come (the loading itself is judged below, by what the job imported)
            workers = {w["id"]: w for w in src["workers"]}
            return (set(workers) == {0, 1} and all(w["alive"] and w["rss_bytes"] for w in workers.values())
                    and doc["system"] is not None and doc["system"]["cpu_percent"] is not None)
        wait_for(with_viewer_figures, 60, "psutil's and the machine's figures in a snapshot")
        stop.touch()
        watched = json.loads(proc.stdout.readline())
        assert watched["psutil"] and watched["loadertop.probe.system_feed"], watched
        assert proc.wait(30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


FORK_DURING_LOADING = textwrap.dedent("""
    import os, threading, time
    from loadertop.probe import publisher

    holding, forking = threading.Event(), threading.Event()
    loaded = []

    def load():  # what the publisher thread does at a first subscription
        with publisher._loading:
            holding.set()
            forking.wait()  # the main thread is about to fork ...
            time.sleep(0.3)  # ... which, if it did not wait, would be done by now
            loaded.append(True)

    threading.Thread(target=load).start()
    holding.wait()
    forking.set()
    pid = os.fork()
    if pid == 0:  # the child's memory is the parent's at the fork: the loading done, or not
        os._exit(0 if loaded and publisher._loading.acquire(timeout=5) else 1)  # released too
    assert os.waitpid(pid, 0)[1] == 0
    assert loaded and publisher._loading.acquire(timeout=5)  # and in the parent
    print("forked after the loading")
""")


def test_a_fork_waits_for_the_publisher_threads_loading():
    res = subprocess.run([sys.executable, "-c", FORK_DURING_LOADING], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr  # the child saw the loading done: the fork waited
    assert res.stdout.strip() == "forked after the loading"
