"""torchdata's StatefulDataLoader under `loadertop run`: measured, and nothing else changes.

StatefulDataLoader (torchdata 0.11) subclasses DataLoader but overrides `__iter__`,
`_get_iterator` and `__init__`, and never calls DataLoader's `__iter__`: `run` wraps a subclass's
own `__iter__` (probe/autoinstrument.py). The job `tests/workloads/stateful_resume.py` checkpoints
mid-epoch and resumes; its batches, state_dict keys, subclass body calls and isinstance are the
same with and without `run`. A second job is watched by `loadertop snapshot --json`: its queue,
stages and workers are read off torchdata's own iterator.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import WORKLOADS, clean_env, kill_group, loadertop_cmd, short_tmpdir, snapshot, wait_for

pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = pytest.mark.slow
RESUME = str(WORKLOADS / "stateful_resume.py")


def resume_run(command: list[str]) -> dict:
    out = subprocess.run(command, env=clean_env(short_tmpdir()), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("workers, persistent", [(2, True), (2, False), (0, False)])
def test_a_resumed_stateful_loader_yields_the_same_batches_under_run(workers, persistent):
    args = [RESUME, "--workers", str(workers)] + (["--persistent"] if persistent else [])
    plain = resume_run([sys.executable, *args])
    under_run = resume_run(loadertop_cmd("run", "-q", "--", sys.executable, *args))
    assert plain["iterator"].startswith("_Stateful")
    assert under_run["iterator"] in ("_InstrumentedIterator", "_SingleProcessIterator"), \
        "the loop's iterator is not loadertop's: StatefulDataLoader was not instrumented"
    for key in ("before", "after", "state_keys", "iter_calls", "isinstance"):
        assert under_run[key] == plain[key], key
    assert plain["isinstance"] and plain["iter_calls"] == 3  # the subclass's body, once an epoch
    assert len(plain["before"]) == 5 and sum(map(len, plain["after"])) == 7 + 12


WATCHED = textwrap.dedent("""
    import os, time, torch
    from torch.utils.data import Dataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    class Slow(Dataset):
        def __len__(self):
            return 100000
        def __getitem__(self, i):
            time.sleep(0.004)
            return torch.tensor([i])

    train_loader = StatefulDataLoader(Slow(), batch_size=4, num_workers=2)
    for batch in train_loader:
        time.sleep(0.002)
        if os.path.exists(os.environ["STOP_FILE"]):
            break
""")


def test_a_stateful_loader_under_run_has_its_queue_stages_and_workers():
    directory = short_tmpdir()
    stop = directory / "stop"
    job = subprocess.Popen(loadertop_cmd("run", "-q", "--", sys.executable, "-c", WATCHED),
                           env=clean_env(directory, STOP_FILE=str(stop)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for(lambda: any(directory.glob("*.json")) or job.poll() is not None, 60,
                 "the job's discovery entry")
        assert job.poll() is None, job.stderr.read()
        code, doc, _, err = snapshot(directory, seconds=3)
        assert code == 0, err
        src = next(s for s in doc["sources"] if s["name"] == "train_loader")
        assert src["config"]["num_workers"] == 2 and src["config"]["dataset"] == "Slow"
        assert src["batches"] > 0
        assert src["queue"]["capacity"] == 4 and src["queue"]["in_flight"] is not None
        assert len(src["workers"]) == 2 and all(w["alive"] and w["pid"] for w in src["workers"])
        assert all(w["batches"] > 0 and w["fetch_ms"] is not None for w in src["workers"])
        stages = src["stages"]
        assert stages["fetch_ms"]["p50"] >= 4 * 4 * 0.9  # four items of >= 4 ms each
        assert stages["handoff_ms"] is not None and stages["wait_split"] is not None
        stop.write_text("")
        assert job.wait(60) == 0
    finally:
        kill_group(job)
