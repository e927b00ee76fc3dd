"""The notebook's panel (docs/contract.md §12, `integrations/notebook.py`) under a real IPython
shell, whose display messages are captured: what it draws (this process's document, from the
in-process viewer that `loadertop.metrics()` shares, integrations/metrics.py), when it updates,
its thread, the magic. The panel in a real kernel: tests/functional/test_notebook.py."""

from __future__ import annotations

import html
import importlib.util
import threading
import time

import msgspec
import pytest

from loadertop import wire
from loadertop.client.document import Document
from loadertop.client.model import Model
from loadertop.integrations import metrics

from conftest import wait_for
from fakes import MACHINE_S, REPORT_S, LoaderSim, MachineSim
from recorded import needed


@pytest.fixture
def shell():
    """IPython's own shell (not a kernel; the test extra installs IPython, with ipykernel), with
    no history (its thread and file), and this process as it was afterwards: the shell puts its
    own `__main__` in sys.modules and names in builtins, and stays IPython's current one."""
    needed(importlib.util.find_spec("IPython"), "no IPython (pip install -e '.[test]')")
    import builtins
    import sys

    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    main, names = sys.modules["__main__"], set(vars(builtins))
    config = Config()
    config.HistoryManager.enabled = False
    try:
        yield InteractiveShell.instance(config=config)
    finally:
        InteractiveShell.clear_instance()
        sys.modules["__main__"] = main
        for name in set(vars(builtins)) - names:
            delattr(builtins, name)


def _messages(start: float, end: float, loader: LoaderSim | None = None):
    """(sent at, message, endpoint) of one loader and its machine, as the publisher sends them."""
    loader = loader or LoaderSim()
    machine = MachineSim()
    ticks = round((end - start) / REPORT_S)
    for k in range(1, ticks + 1):
        t = start + k * REPORT_S
        yield t, loader.report(t, end), loader.endpoint
        if k % round(MACHINE_S / REPORT_S) == 0:
            yield t, machine.report(t), loader.endpoint


def test_importing_loadertop_and_the_in_process_viewer_imports_no_ipython_torch_or_zmq():
    import subprocess
    import sys

    code = ("import sys, loadertop, loadertop.integrations.metrics\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'IPython', 'torch', 'zmq'}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True).stdout.strip()
    assert out == "[]"


def test_the_kernel_view_draws_the_in_process_viewer_s_document_and_waits_without_one(monkeypatch):
    from loadertop.integrations import notebook

    monkeypatch.setattr(metrics, "viewer", lambda: None)  # no loader instrumented yet
    waiting = notebook.KernelView().document()
    assert not waiting.sources and waiting.diagnosis.category == "idle"

    viewer = metrics.InProcessViewer()
    now = time.time()
    for _at, message, _endpoint in _messages(now - 5, now):
        viewer.add(wire.encode(message))  # the publisher thread's frames
    viewer.refresh()  # ... and its refresh, once a second
    monkeypatch.setattr(metrics, "viewer", lambda: viewer)
    doc = notebook.KernelView().document()
    assert doc is viewer.document and doc.sources[0].name == "train"
    # the same document the viewers compute: the model's, as of that refresh
    assert msgspec.json.encode(doc) == msgspec.json.encode(viewer.model.document())


# --------------------------------------------------------------------------- the panel


class FedView:
    """A panel's view fed by the test: a viewers' model of its own, advanced at every read."""

    def __init__(self) -> None:
        self.model = Model(metrics.WINDOW_S)

    def document(self) -> Document:
        return self.model.advance(time.time())


@pytest.fixture
def view():
    return FedView()


def _feed(view: FedView, loader: LoaderSim) -> None:
    """The last 5 s of `loader`'s reports, as if sent until now."""
    now = time.time()
    for at, message, endpoint in _messages(now - 5, now, loader):
        view.model.ingest(message, at, endpoint)


def test_the_panel_is_displayed_then_updated_only_when_it_changes(shell, view):
    from IPython.utils.capture import capture_output

    from loadertop.integrations import notebook

    loader = LoaderSim(name="train_loader")
    with capture_output() as captured:
        panel = notebook.Panel(view, refresh_s=3600.0)  # refreshed by hand here
        first = captured.outputs[0]
        display_id = first.transient["display_id"]
        assert not first.update and "WAITING FOR A LOADER" in first.data["text/html"]
        assert "no instrumented DataLoader" in first.data["text/plain"]  # the text report's words

        _feed(view, loader)
        assert panel.refresh()
        update = captured.outputs[-1]
        assert update.update and update.transient["display_id"] == display_id
        assert "train_loader" in update.data["text/html"] and "train_loader" in update.data["text/plain"]
        assert not panel.refresh()  # the same figures: nothing sent
        assert panel.updates == 1 and len(captured.outputs) == 2

        panel.stop(notebook.SUPERSEDED)
        assert html.escape(notebook.SUPERSEDED) in captured.outputs[-1].data["text/html"]


def test_the_panels_thread_refreshes_it_and_ends_when_stopped(shell, view):
    from IPython.utils.capture import capture_output

    from loadertop.integrations import notebook

    loader = LoaderSim(name="train_loader")
    with capture_output():
        panel = notebook.Panel(view, refresh_s=0.02)
        panel.start()
        assert panel.thread is not None and panel.thread.name == notebook.THREAD_NAME
        _feed(view, loader)
        wait_for(lambda: panel.updates >= 1, 10, "the panel's first update")
        panel.stop()
        assert not panel.thread.is_alive()
        assert panel.thread is not threading.current_thread()


def test_show_outside_a_kernel_says_where_it_draws(shell, capsys):
    import loadertop

    assert loadertop.show() is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "loadertop.show() draws in a notebook's cell" in err


def test_the_magic_says_its_usage_for_a_word_it_does_not_know(shell):
    from IPython.core.error import UsageError

    shell.run_line_magic("load_ext", "loadertop")
    with pytest.raises(UsageError, match="%loadertop on | off | show"):
        shell.run_line_magic("loadertop", "sideways")
