"""The in-process reading of this process's loaders (docs/contract.md §12): the publisher's taps
(`probe/taps.py`), the view that feeds them to the viewers' model (`loadertop.inprocess`), and the
notebook's panel that displays it (`integrations/notebook.py`) under a real IPython shell, whose
display messages are captured. The panel in a real kernel: tests/functional/test_notebook.py."""

from __future__ import annotations

import html
import importlib.util
import os
import threading
import time

import msgspec
import pytest

from loadertop import inprocess
from loadertop.client.model import Model
from loadertop.probe import taps

from conftest import wait_for
from fakes import MACHINE_S, REPORT_S, T0, LoaderSim, MachineSim
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


def test_importing_loadertop_and_the_view_imports_no_ipython_torch_or_zmq():
    import subprocess
    import sys

    code = ("import sys, loadertop, loadertop.inprocess\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'IPython', 'torch', 'zmq'}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True).stdout.strip()
    assert out == "[]"


def test_a_tap_receives_every_message_in_order_and_keeps_the_newest_when_its_reader_lags():
    messages = [m for _, m, _ in _messages(T0 - 2, T0)]
    assert not taps.watching()
    tap = taps.open_tap(maxlen=3)
    try:
        assert taps.watching()
        for m in messages:
            taps.deliver(m, "ipc:///x.sock")
        drained = tap.drain()
        assert [m for _, m, _ in drained] == messages[-3:]
        assert all(e == "ipc:///x.sock" for _, _, e in drained)
        assert tap.drain() == []
    finally:
        taps.close_tap(tap)
    assert not taps.watching()
    taps.deliver(messages[0], "ipc:///x.sock")
    assert tap.drain() == []


def test_a_forked_child_inherits_no_tap():
    tap = taps.open_tap()
    read, write = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # the child: says whether it would sample for a reader, and leaves
            os.write(write, b"1" if taps.watching() else b"0")
            os._exit(0)
        os.close(write)
        assert os.read(read, 1) == b"0"
        os.waitpid(pid, 0)
        assert taps.watching()
    finally:
        os.close(read)
        taps.close_tap(tap)


def test_the_view_computes_what_a_viewer_computes_and_advances_once_a_refresh():
    view = inprocess.InProcessView()
    model = Model(inprocess.WINDOW_S)
    try:
        assert view._tap is not None
        for at, message, endpoint in _messages(T0 - 5, T0):
            view._tap.put(message, at, endpoint)  # as `deliver` does, at the times they were sent
            model.ingest(message, at, endpoint)
        doc = view.document(now=T0)
        assert msgspec.json.encode(doc) == msgspec.json.encode(model.advance(T0))
        assert doc.sources[0].name == "train" and doc.system is not None
        assert view.document(now=T0 + 0.5) is doc  # within a refresh: the same document
        assert view.document(now=T0 + inprocess.REFRESH_S) is not doc
    finally:
        view.close()
    assert view.closed and not taps.watching()


# --------------------------------------------------------------------------- the panel


@pytest.fixture
def view():
    view = inprocess.InProcessView()
    yield view
    view.close()


def _feed(view: inprocess.InProcessView, loader: LoaderSim) -> None:
    """The last 5 s of `loader`'s reports, as if sent until now; the view then advances at every
    read (its refresh is the caller's)."""
    assert view._tap is not None
    now = time.time()
    for at, message, endpoint in _messages(now - 5, now, loader):
        view._tap.put(message, at, endpoint)
    view.refresh_s = 0.0


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
