"""loadertop in a real notebook (docs/notebook.md): a real Jupyter kernel (ipykernel) driven by
nbclient executes a notebook built here, cell by cell, as a person would: `%load_ext loadertop`,
`%loadertop on`, a loader with two persistent workers, `loadertop.show()`, then a training cell
of about 8 s while `loadertop snapshot --json` watches the kernel from outside; then the loader
cell three times again, `%loadertop off` and a new loader, and a word the magic does not know.

One kernel serves every test here (its start and torch's import are most of the time): the
fixture runs the whole notebook once and keeps what each test asserts on. The kernel runs with
the test's own discovery and state directories (tests/conftest.py's `clean_env`), so the viewers
started beside it find it as they find any instrumented job.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest

from conftest import START_TIMEOUT_S, SnapshotRun, clean_env, short_tmpdir, wait_for
from notebook_kernel import kernel_manager
from recorded import needed

pytestmark = pytest.mark.slow

STEP_S = 0.06  # the training cell's step: far slower than the loader, so the verdict is clear
TRAIN_BEFORE_SNAPSHOT_S = 4.0  # trained this long when the snapshot starts (its window: 3 s)
RERUNS = 3

SETUP = "%load_ext loadertop\n%loadertop on"
LOADER = """\
import time, torch
from torch.utils.data import DataLoader, Dataset

class Squares(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return torch.full((16,), float(i))

train_loader = DataLoader(Squares(), batch_size=32, num_workers=2, persistent_workers=True)
first = next(iter(train_loader))  # its workers start here, and its source
"""
SHOW = "import loadertop\nloadertop.show()"
TRAIN = """\
import pathlib
stop, ready = pathlib.Path({stop!r}), pathlib.Path({ready!r})
started = time.monotonic()
deadline = started + 120  # the test says stop well before: this only ends a forgotten run
while not stop.exists() and time.monotonic() < deadline:
    for batch in train_loader:
        time.sleep({step})  # the training step
        if not ready.exists() and time.monotonic() - started >= {before}:
            ready.touch()
        if stop.exists() or time.monotonic() >= deadline:
            break
"""
STATE = """\
import json, os
from loadertop.integrations import notebook
names = [s.name for s in notebook.KernelView().document().sources]
original = DataLoader.__dict__["__iter__"]._loadertop_original  # torch's, under one wrapper
print(json.dumps({"pid": os.getpid(), "workers": [w.pid for w in train_loader._iterator._workers],
                  "sources": names, "updates": notebook.live_panel().updates,
                  "patched_once": not hasattr(original, "_loadertop_original")}))
"""
OFF = """\
%loadertop off
other_loader = DataLoader(Squares(), batch_size=8)
print(type(iter(other_loader)).__name__)
"""


@dataclass
class Run:
    """What the notebook's run left for the tests."""

    nb: Any
    panel_at_show: dict
    panel_after_training: dict
    training_s: tuple[float, float]  # when the training cell started and ended (time.time())
    snapshot: dict  # `snapshot --json` taken while the training cell ran
    after_training: dict  # STATE right after training
    reruns: list[dict] = field(default_factory=list)  # STATE after each loader cell run again
    children: set[int] = field(default_factory=set)  # the kernel's processes after the reruns
    snapshot_after_reruns: dict = field(default_factory=dict)
    off_iterator: str = ""
    usage_error: str = ""
    wall_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


def _state(cell) -> dict:
    return json.loads(_stdout(cell).strip().splitlines()[-1])


@pytest.fixture(scope="module")
def run():
    needed(importlib.util.find_spec("nbclient") and importlib.util.find_spec("ipykernel")
           and importlib.util.find_spec("nbformat"),
           "no nbclient/ipykernel/nbformat (pip install -e '.[test]')")
    import nbformat
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    directory = short_tmpdir()
    work = directory / "w-notebook"
    work.mkdir()
    stop, ready = work / "stop", work / "ready"
    cells = {
        "setup": new_code_cell(SETUP),
        "loader": new_code_cell(LOADER),
        "show": new_code_cell(SHOW),
        "train": new_code_cell(TRAIN.format(stop=str(stop), ready=str(ready), step=STEP_S,
                                            before=TRAIN_BEFORE_SNAPSHOT_S)),
        "state": new_code_cell(STATE),
        "off": new_code_cell(OFF),
        # the cell fails (its reply's status), what it shows is one line on stderr
        "bogus": new_code_cell("%loadertop sideways", metadata={"tags": ["raises-exception"]}),
    }
    nb = new_notebook(cells=list(cells.values()))
    index = {name: i for i, name in enumerate(cells)}
    env = clean_env(directory)
    client = NotebookClient(nb, km=kernel_manager(work / "kernels"), timeout=180,
                            shutdown_kernel="immediate", resources={"metadata": {"path": str(work)}})
    phases: dict[str, float] = {}

    def execute(name: str):
        t = time.monotonic()
        try:
            return client.execute_cell(nb.cells[index[name]], index[name])
        finally:
            phases[name] = phases.get(name, 0.0) + time.monotonic() - t

    started = time.monotonic()
    try:
        # cleanup_kc: the kernel is shut down at the end (nbclient leaves one it did not make)
        with client.setup_kernel(env=env, cleanup_kc=True):
            phases["kernel start"] = time.monotonic() - started
            execute("setup")
            execute("setup")  # again: the extension is loaded once, the class patched once
            execute("loader")
            execute("show")
            panel_at_show = copy.deepcopy(nb.cells[index["show"]].outputs[0])

            beside: dict[str, Any] = {}

            def snapshot_beside() -> None:
                try:
                    wait_for(ready.exists, START_TIMEOUT_S, f"{TRAIN_BEFORE_SNAPSHOT_S:g} s of training")
                    beside["doc"] = SnapshotRun(directory, seconds=3.0).document()
                except BaseException as exc:  # re-raised below, on the test's thread
                    beside["error"] = exc
                finally:
                    stop.touch()

            helper = threading.Thread(target=snapshot_beside)
            helper.start()
            t0 = time.time()
            try:
                execute("train")
            finally:
                stop.touch()
                helper.join(60)
            t1 = time.time()
            if "error" in beside:
                raise beside["error"]
            panel_after_training = copy.deepcopy(nb.cells[index["show"]].outputs[0])
            execute("state")
            after_training = _state(nb.cells[index["state"]])
            result = Run(nb=nb, panel_at_show=panel_at_show, panel_after_training=panel_after_training,
                         training_s=(t0, t1), snapshot=beside["doc"], after_training=after_training)

            for _ in range(RERUNS):
                execute("loader")
                execute("state")
                result.reruns.append(_state(nb.cells[index["state"]]))
            # torch shuts a dropped loader's persistent workers down (and joins them) in its
            # iterator's __del__, as the loader cell rebinds the variable: gone by the cell's end
            kernel = psutil.Process(result.reruns[-1]["pid"])
            result.children = {p.pid for p in kernel.children(recursive=True)}
            result.snapshot_after_reruns = SnapshotRun(directory, seconds=1.5).document()

            execute("off")
            result.off_iterator = _stdout(nb.cells[index["off"]]).strip().splitlines()[-1]
            execute("bogus")
            result.usage_error = "".join(o.get("text", "") for o in nb.cells[index["bogus"]].outputs)
        result.wall_s = time.monotonic() - started
        result.phases = phases
        nbformat.write(nb, str(work / "run.ipynb"))  # to read by hand when a test fails
        yield result
    finally:
        stop.touch()
        shutil.rmtree(directory, ignore_errors=True)


def _category(panel: dict) -> str:
    return re.search(r'data-category="([a-z_]*)"', panel["data"]["text/html"]).group(1)


def test_the_panel_updates_while_a_later_cell_trains_and_says_what_snapshot_says(run):
    # CI's budget: -s shows it
    print(f"the notebook's run took {run.wall_s:.1f} s:",
          ", ".join(f"{k} {v:.1f} s" for k, v in run.phases.items()))
    assert _category(run.panel_at_show) == "", "the panel had figures before anything reported"
    assert "WAITING FOR A LOADER" in run.panel_at_show["data"]["text/html"]

    panel = run.panel_after_training["data"]["text/html"]
    category = _category(run.panel_after_training)
    doc = run.snapshot
    kernel_pid = run.after_training["pid"]
    sources = [s for s in doc["sources"] if s["pid"] == kernel_pid]
    assert [s["name"] for s in sources] == ["train_loader"], doc["sources"]
    assert category == doc["diagnosis"]["category"] == sources[0]["diagnosis"]["category"]
    assert category not in ("idle", "insufficient_data"), category
    # The update applied is one made while the training cell ran (update_display_data, applied by
    # nbclient to the output of the cell before).
    taken_at = float(re.search(r'data-taken-at="([0-9.]+)"', panel).group(1))
    t0, t1 = run.training_s
    assert t0 <= taken_at <= t1 + 1.0, (t0, taken_at, t1)
    assert "train_loader" in panel and "where the time goes" in panel
    assert "train_loader" in run.panel_after_training["data"]["text/plain"]
    assert run.after_training["updates"] >= 2  # sent by the panel's thread, one per change
    assert run.after_training["sources"] == ["train_loader"]


def test_rerunning_the_loader_cell_leaves_one_source_and_only_its_workers(run):
    earlier = {pid for state in [run.after_training, *run.reruns[:-1]] for pid in state["workers"]}
    last = run.reruns[-1]
    assert len(last["workers"]) == 2 and not earlier & set(last["workers"])
    assert run.children == set(last["workers"]), "workers of a dropped loader are still alive"
    for pid in earlier:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    for state in run.reruns:
        assert state["sources"] == ["train_loader"], state
        assert state["patched_once"]
    names = [s["name"] for s in run.snapshot_after_reruns["sources"] if s["pid"] == last["pid"]]
    assert names == ["train_loader"]


def test_off_leaves_a_new_loader_alone(run):
    assert run.off_iterator == "_SingleProcessDataLoaderIter"  # torch's own, not ours


def test_a_word_the_magic_does_not_know_is_one_usage_line(run):
    # IPython says a magic's UsageError in one line on stderr, no traceback
    assert run.usage_error == "UsageError: %loadertop on | off | show   (docs/notebook.md)\n"
