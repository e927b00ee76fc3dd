"""`loadertop.metrics()` / `loadertop.verdict()`'s in-process viewer (integrations/metrics.py):
the probe's frames into the client's Model, the flat keys of client.tracker_keys, the banner's
text; and the integrations importing their frameworks only when used."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from loadertop import wire
from loadertop.client.tracker_keys import source_metrics
from loadertop.integrations import metrics
from loadertop.views.palette import category_style

from fakes import REPORT_S, T0, LoaderSim, MachineSim


def _fed(loaders: list[LoaderSim], seconds: float = 4.0) -> metrics.InProcessViewer:
    viewer = metrics.InProcessViewer()
    machine = MachineSim()
    ticks = round(seconds / REPORT_S)
    for k in range(1, ticks + 1):
        t = T0 + k * REPORT_S
        for loader in loaders:
            viewer.add(wire.encode(loader.report(t, T0 + seconds)))
        if k % 4 == 0:
            viewer.add(wire.encode(machine.report(t)))
    viewer.refresh()
    return viewer


def test_every_loader_s_figures_as_the_tracker_keys_with_the_rank_where_known():
    viewer = _fed([LoaderSim(name="train"), LoaderSim(name="val", rank=1, pid=41235)])
    figures, text = viewer.latest
    doc = viewer.model.document()
    by_name = {s.name: s for s in doc.sources}
    assert figures == {**source_metrics(by_name["train"], "loadertop/train"),
                       **source_metrics(by_name["val"], "loadertop/rank1/val")}
    assert figures["loadertop/train/num_workers"] == by_name["train"].config.num_workers
    assert sum(v for k, v in figures.items() if k.startswith("loadertop/train/bottleneck/")) == 1.0
    verdict = doc.diagnosis
    first = text.splitlines()[0]
    assert first.startswith(category_style(verdict.category).words.upper())
    assert verdict.summary in first
    assert text.splitlines()[-1] == f"→ {verdict.advice[0]}"


def test_a_bad_frame_is_counted_and_dropped():
    viewer = _fed([LoaderSim()])
    before = viewer.latest
    viewer.add(b"loadertop/999\0junk")
    viewer.add(b"not ours")
    assert viewer.model.rejected == {"wrong_version": 1, "not_loadertop": 1}
    assert viewer.latest is before  # nothing refreshed, nothing lost


def test_the_cache_is_replaced_whole_and_a_call_gets_its_own_copy(monkeypatch):
    viewer = _fed([LoaderSim()])
    monkeypatch.setattr(metrics, "_viewer", viewer)
    monkeypatch.setattr(metrics, "_pid", __import__("os").getpid())
    got = metrics.metrics()
    assert got == viewer.latest[0] and got is not viewer.latest[0]
    got.clear()
    assert metrics.metrics() == viewer.latest[0]  # the caller's dict is the caller's
    assert metrics.verdict() == viewer.latest[1]


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


def test_metrics_before_any_loader_and_disabled_are_empty_and_import_nothing_heavy():
    done = _python("""
        import os, sys
        import loadertop
        assert loadertop.metrics() == {} and loadertop.verdict() == ""
        heavy = [m for m in ("torch", "lightning", "transformers", "wandb", "textual")
                 if m in sys.modules]
        assert not heavy, heavy
        os.environ["LOADERTOP_DISABLE"] = "1"
        from loadertop.integrations import metrics
        metrics._off = False
        assert loadertop.metrics() == {} and metrics._off
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_an_integration_without_its_framework_imports_and_says_so_once_used():
    done = _python("""
        import sys
        for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "transformers"):
            sys.modules[name] = None  # what `import` then raises ImportError for: not installed
        import loadertop.integrations.lightning as lightning_integration
        import loadertop.integrations.transformers as transformers_integration
        for module in (lightning_integration, transformers_integration):
            try:
                module.LoadertopCallback
            except ImportError as exc:
                print(exc)
            else:
                raise SystemExit("no error")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "loadertop.integrations.lightning needs PyTorch Lightning (pip install lightning): it is "
        "not installed",
        "loadertop.integrations.transformers needs Hugging Face transformers (pip install "
        "transformers): it is not installed"]
    assert "Traceback" not in done.stderr


def test_the_publisher_thread_imports_nothing_for_the_in_process_viewer():
    """Everything the viewer runs on the publisher thread is imported by the first call, on the
    caller's thread: an import on a thread while the loop forks its workers leaves the import
    lock held in the child (probe/publisher.py). Only what any subscribed viewer makes it load
    (psutil, the machine's sampler: under the fork-holding lock) may appear."""
    done = _python("""
        import sys, time
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        import loadertop
        from loadertop.integrations import metrics
        train = loadertop.instrument(DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8),
                                     name="train")
        it = iter(train); next(it)
        loadertop.metrics()
        viewer = metrics.viewer()
        before, first = set(sys.modules), viewer.refreshes
        deadline = time.monotonic() + 60
        while viewer.refreshes < first + 3 and time.monotonic() < deadline:
            try:
                next(it)
            except StopIteration:
                it = iter(train)
            time.sleep(0.01)
        assert viewer.refreshes >= first + 3, viewer.refreshes
        new = {m for m in set(sys.modules) - before
               if not m.startswith(("psutil", "loadertop.system", "loadertop.probe.system_feed",
                                    "pynvml"))}
        assert not new, sorted(new)
        assert "loadertop/train/num_workers" in loadertop.metrics()
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
