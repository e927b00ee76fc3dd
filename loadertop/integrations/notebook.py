"""loadertop in a Jupyter kernel (docs/notebook.md, docs/contract.md §12): `%load_ext loadertop`
registers the `%loadertop` magic; `%loadertop on` instruments every DataLoader iterated from then
on, `%loadertop off` leaves the ones not measured yet alone, and `loadertop.show()` (or
`%loadertop show`) draws the live panel in the cell's output.

- **on/off** install `loadertop run`'s own patch of `DataLoader.__iter__` in the kernel
  (`probe/autoinstrument.py`: the same code, so a loader is named after its variable as `run`
  names it), with one notebook rule added: a loader named as a dead one continues its source
  wherever it is iterated, so a cell re-run that rebinds `train_loader` (its old loader, its
  workers and its iterator going with the old object, as torch has them) stays one source.
- **show** displays the panel (`views/notebook_panel.py`) with `display(..., display_id=True)`
  and starts a daemon thread that every `REFRESH_S` reads this process's own document (the
  in-process viewer of `loadertop.metrics()`, integrations/metrics.py: the viewers' model, fed the
  probe's reports and refreshed by its publisher thread) and, when the panel changed, replaces it
  with `update_display_data` (`DisplayHandle.update`). The thread never touches the training
  thread or the loaders: the training loop, in this cell or a later one, runs as it would
  without it. Front ends apply the update wherever the output is, and keep the
  last one in the saved notebook. A later `show()` takes over: the earlier panel gets a last
  update saying so and its thread ends.

IPython is imported here only, and this module only when the extension is loaded or `show()`
called (`loadertop/__init__.py`): `import loadertop` stays free of it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Protocol

from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import DisplayHandle, display

from loadertop.client.document import Document
from loadertop.client.model import Model
from loadertop.integrations import metrics
from loadertop.views.notebook_panel import render
from loadertop.views.text import render_text

REFRESH_S = 1.0  # the viewers' default refresh (`loadertop --refresh`): the panel is one of them
THREAD_NAME = "loadertop-panel"
#: Updates that failed in a row (the kernel shutting down, a front end's channel gone) after
#: which the panel's thread gives up.
MAX_FAILURES = 5
USAGE = "%loadertop on | off | show   (docs/notebook.md)"
SUPERSEDED = "This panel stopped updating: a later loadertop.show() shows this kernel's loaders."


def load(ipython: Any) -> None:
    """`%load_ext loadertop` (IPython calls `loadertop.load_ipython_extension`)."""
    ipython.register_magics(LoadertopMagics)


@magics_class
class LoadertopMagics(Magics):
    @line_magic
    def loadertop(self, line: str) -> None:
        """%loadertop on | off | show: instrument the DataLoaders iterated from now on (on), stop
        instrumenting new ones (off), draw the live panel in this cell (show)."""
        word = line.strip()
        if word == "on":
            on()
        elif word == "off":
            off()
        elif word == "show":
            show()
        else:
            raise UsageError(USAGE)


def on() -> None:
    from loadertop.probe import autoinstrument

    if not autoinstrument.install():
        print("loadertop: LOADERTOP_DISABLE is set: DataLoaders are left as they are")
        return
    autoinstrument.continue_sources_by_name(True)
    autoinstrument.instrument_new_loaders(True)
    print("loadertop: every DataLoader iterated from now on is measured, named after its variable; "
          "loadertop.show() draws the live panel")


def off() -> None:
    from loadertop.probe import autoinstrument

    autoinstrument.instrument_new_loaders(False)
    print("loadertop: DataLoaders not measured yet are left alone from now on (those measured "
          "already still are)")


_lock = threading.Lock()
_live: Panel | None = None


def show() -> None:
    """Draw the live panel in the running cell's output; the panel drawn before stops updating."""
    global _live
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        print("loadertop.show() draws in a notebook's cell (a Jupyter kernel); in a terminal run "
              "`loadertop` or `loadertop snapshot` beside the job", file=sys.stderr)
        return
    panel = Panel(KernelView())
    with _lock:
        previous, _live = _live, panel
    if previous is not None:
        previous.stop(SUPERSEDED)
    panel.start()


def _bundle(doc: Document, html: str) -> dict[str, str]:
    # text/plain: what a front end without HTML shows (a console, a plain-text export)
    return {"text/html": html, "text/plain": render_text(doc)}


class View(Protocol):
    def document(self) -> Document: ...


class KernelView:
    """This kernel's document as the viewers compute it: the in-process viewer's latest (started
    here if `loadertop.metrics()` has not started it: its model, fed by the probe's publisher
    thread, refreshed there once a second), or before a loader is instrumented an empty model's
    (the panel then says it waits for a loader)."""

    def __init__(self) -> None:
        self._empty = Model(metrics.WINDOW_S)

    def document(self) -> Document:
        viewer = metrics.viewer()
        doc = viewer.document if viewer is not None else None
        return doc if doc is not None else self._empty.advance(time.time())


class Panel:
    """One displayed panel and the thread that refreshes it."""

    def __init__(self, view: View, refresh_s: float = REFRESH_S) -> None:
        self.view = view
        self.refresh_s = refresh_s
        self.updates = 0  # update_display_data messages sent (tests, the benchmark)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0
        doc = view.document()
        self._shown = render(doc, clock=False)
        # IPython 9's display functions carry no annotations: hence the ignores here and below.
        handle = display(_bundle(doc, render(doc)), raw=True, display_id=True)  # type: ignore[no-untyped-call]
        assert isinstance(handle, DisplayHandle)  # display_id=True returns one
        self.handle = handle

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def stop(self, note: str | None = None) -> None:
        """End the thread; with `note`, one last update says it at the panel's foot."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2 * self.refresh_s)
        if note is not None:
            self.refresh(note)

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.refresh()
            if self._failures >= MAX_FAILURES:
                return

    def refresh(self, note: str | None = None) -> bool:
        """Replace the panel if what it shows changed (the clock aside); True when it was."""
        try:
            doc = self.view.document()
            key = render(doc, note=note, clock=False)
            if key == self._shown:
                return False
            self.handle.update(_bundle(doc, render(doc, note=note)), raw=True)  # type: ignore[no-untyped-call]
        except Exception as exc:  # a panel never raises into the kernel; it says so once
            self._failures += 1
            if self._failures == MAX_FAILURES:
                print(f"loadertop: the panel stopped updating: {exc!r}", file=sys.stderr)
            return False
        self._failures = 0
        self._shown = key
        self.updates += 1
        return True


def live_panel() -> Panel | None:
    """The panel updating now, if any."""
    return _live
