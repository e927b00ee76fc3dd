"""`loadertop.metrics()` and `loadertop.verdict()`: the figures of this process's loaders, inside
the training process, computed by the same client code the viewers use (docs/contract.md §11).

The first call makes an in-process viewer: a `Model` (client/model.py) that the probe's publisher
thread feeds every frame it publishes (`Publisher.add_reader`: the very bytes a subscriber gets,
decoded by `wire.decode` as a subscriber decodes them) and asks, once a second (a viewer's default
refresh), to build its document: its sources' flat figures (`client.tracker_keys`) and the
banner's text (`views.text.banner_text`) are kept as one tuple, replaced whole. A call reads that
tuple: no lock, no socket, nothing on the per-batch path; what it costs is a copy of the dict.
The document itself is kept too (`InProcessViewer.document`): the notebook's panel draws it
(integrations/notebook.py), one viewer for every in-process reader.

While the viewer is there the publisher thread samples what a subscribed viewer gets (the
queues, the machine): its cost is a viewer's (docs/performance.md). Its figures come from the
next refresh on: the first calls, and any call before a loader is instrumented, return {}.
Whatever fails here costs one line on stderr (the probe's voice) and {} from then on, never the
training.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Final

from loadertop import environment, wire
from loadertop.client.document import Document, Source
from loadertop.client.model import Model
from loadertop.client.tracker_keys import ROOT, prefix_of, source_metrics
from loadertop.views.text import banner_text

WINDOW_S: Final = 3.0  # the viewers' window (loadertop's default)


def metric_prefix(source: Source) -> str:
    """`loadertop/<loader>`, or `loadertop/rank<N>/<loader>` where the source's rank is known
    (each rank logs its own loaders: a run that gathers the ranks' keys keeps them apart)."""
    if source.rank is None:
        return prefix_of(source)
    return f"{ROOT}/rank{source.rank}/{source.name}"


def flat_metrics(doc: Document) -> dict[str, float]:
    """Every source's figures as a tracker's flat keys (client/tracker_keys.py)."""
    out: dict[str, float] = {}
    for source in doc.sources:
        out.update(source_metrics(source, metric_prefix(source)))
    return out


class InProcessViewer:
    """A viewer inside the training process. `add` and `refresh` run on the publisher thread
    only (its Reader); `latest` is read from any thread."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.model = Model(window_s=window_s)
        self.latest: tuple[dict[str, float], str] = ({}, "")
        self.document: Document | None = None  # the latest refresh's, whole (the notebook's panel)
        self.refreshes = 0

    def add(self, frame: bytes) -> None:
        try:
            msg = wire.decode(frame)
        except wire.WireError as exc:  # never expected from our own publisher: counted, dropped
            self.model.reject(exc.reason)
            return
        try:
            self.model.ingest(msg, time.time())
        except Exception:
            self.latest, self.document = ({}, ""), None  # the publisher drops this reader: nothing
            raise  # stale stays

    def refresh(self) -> None:
        try:
            doc = self.model.advance(time.time())
            self.latest = (flat_metrics(doc), banner_text(doc) if doc.sources else "")
            self.document = doc
        except Exception:
            self.latest, self.document = ({}, ""), None
            raise
        self.refreshes += 1


_lock = threading.Lock()
_viewer: InProcessViewer | None = None
_pid: int | None = None  # the process `_viewer` belongs to (a forked child starts its own)
_off = False  # LOADERTOP_DISABLE, or a failure: {} from now on


def viewer() -> InProcessViewer | None:
    """This process's in-process viewer, started when its publisher runs (a loader was
    instrumented); None until then, and with LOADERTOP_DISABLE=1."""
    found = _viewer
    if found is not None and _pid == os.getpid():
        return found
    return None if _off else _start()


def _start() -> InProcessViewer | None:
    global _viewer, _pid, _off
    with _lock:
        if _viewer is not None and _pid == os.getpid():
            return _viewer
        if environment.disabled():
            _off = True
            return None
        if "loadertop.probe.publisher" not in sys.modules:
            return None  # no loader instrumented in this process yet: asked again next call
        from loadertop.probe import publisher as publisher_module

        publisher = publisher_module._publisher
        if publisher is None or publisher.pid != os.getpid() or publisher.reader is not None:
            return None
        try:
            made = InProcessViewer()
            if not publisher.add_reader(made):
                return None
        except Exception as exc:  # never into the training loop
            _off = True
            publisher_module.warn_once(f"loadertop.metrics() is off: {exc!r}")
            return None
        _viewer, _pid = made, os.getpid()
        return made


def metrics() -> dict[str, float]:
    """See `loadertop.metrics`."""
    found = _viewer if _pid == os.getpid() else None
    if found is None:
        found = viewer()
        if found is None:
            return {}
    return dict(found.latest[0])


def verdict() -> str:
    """See `loadertop.verdict`."""
    found = viewer()
    return found.latest[1] if found is not None else ""
