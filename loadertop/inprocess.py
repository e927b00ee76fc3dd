"""This process's own loaders as the viewers see them, with no socket: the probe's reports, read
from a tap on the publisher (`probe/taps.py`), fed to the client's `Model` — the code the TUI,
`snapshot` and `export` compute every figure and verdict with (docs/contract.md §12).

    view = inprocess.shared_view()
    doc = view.document()          # the §3 document of this process's loaders, as of now

One view per process, shared by whoever reads in-process (the notebook's panel): its model is
advanced at most once per `REFRESH_S`, however often and from however many threads it is asked,
so the verdict's hysteresis counts refreshes at the viewers' default pace (client/hysteresis.py),
and a caller that asks often pays for a lock and a drain, not for a new document.

Opening the view opens the tap, which counts as a viewer: the publisher then samples the queue and
the machine as it does for a subscribed viewer (probe/publisher.py), from that moment on (the
model starts empty: the figures fill their window over its first seconds). Here, at the top of
the package: it joins the probe (which may not import the client) to the client (which may not
import the probe). Importing it imports neither torch nor zmq.
"""

from __future__ import annotations

import os
import threading
import time

from loadertop.client.document import Document
from loadertop.client.model import Model
from loadertop.probe import taps

WINDOW_S = 3.0  # the viewers' default window (`loadertop --window`, `snapshot --seconds`)
REFRESH_S = 1.0  # the viewers' default refresh (`loadertop --refresh`)


class InProcessView:
    """A model fed by a tap on this process's publisher."""

    def __init__(self, window_s: float = WINDOW_S, refresh_s: float = REFRESH_S) -> None:
        self.refresh_s = refresh_s
        self.model = Model(window_s)
        self._lock = threading.Lock()
        self._document: Document | None = None
        self._advanced_at = 0.0
        self._tap: taps.Tap | None = taps.open_tap()

    def document(self, now: float | None = None) -> Document:
        """The document as of now: what the publisher sent since the last call is taken in, and
        the model advanced when the last advance is `refresh_s` old (else the same document)."""
        with self._lock:
            now = time.time() if now is None else now
            if self._tap is not None:
                model = self.model
                for at, message, endpoint in self._tap.drain():
                    model.ingest(message, at, endpoint)
            if self._document is None or now - self._advanced_at >= self.refresh_s:
                self._document = self.model.advance(now)
                self._advanced_at = now
            return self._document

    def close(self) -> None:
        """Stop reading (the publisher stops sampling for it once no tap is open)."""
        with self._lock:
            if self._tap is not None:
                taps.close_tap(self._tap)
                self._tap = None

    @property
    def closed(self) -> bool:
        return self._tap is None


_lock = threading.Lock()
_shared: tuple[int, InProcessView] | None = None  # (the pid it was opened in, the view)


def shared_view() -> InProcessView:
    """This process's view, opened at the first call (again in a forked child, whose publisher
    is its own)."""
    global _shared
    with _lock:
        if _shared is None or _shared[0] != os.getpid() or _shared[1].closed:
            _shared = (os.getpid(), InProcessView())
        return _shared[1]
