"""History for the graphs: the series each panel declares, and the store the app fills.

A panel says which figures it graphs as class attributes, and reads them back by the same object:

    class DiskPanel(MachinePanel):
        IOWAIT = MachineSeries("iowait", lambda system: system.iowait_percent)
        SERIES = (IOWAIT,)
        ...  history.machine(self.IOWAIT)

The app collects every mounted panel's `SERIES` into one `History` and calls `record(doc)` when a
new document is shown; no name is written in one file and read in another. Two kinds of series:

* `LoaderSeries` — a figure of one source: one point per recorded document, per source id; the
  points of a source that left the document are forgotten with it.
* `MachineSeries` — a figure of the machine: one point per machine *sample*. The probe samples at
  1 Hz and `SystemFigures.sent_at` names the sample, so a 10 Hz screen does not draw each sample
  ten times. A reader may return a mapping (e.g. GPU index → utilisation): each key then has its
  own line of points.

Pure (no Textual).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadertop.client.document import Document, Source, SystemFigures

#: Points kept per series: wider than any graph drawn.
HISTORY_LEN = 300

Value = float | None


@dataclass(frozen=True, eq=False)
class LoaderSeries:
    """A figure of one source over time. Identity is the key: declare it once, as a class attribute."""

    label: str
    read: Callable[[Source], Value]


@dataclass(frozen=True, eq=False)
class MachineSeries:
    """A figure of the machine over time, one point per machine sample; `read` may return a
    mapping (one line of points per key, e.g. per GPU)."""

    label: str
    read: Callable[[SystemFigures], Value | Mapping[Hashable, Value]]


Series = LoaderSeries | MachineSeries
_EMPTY: Sequence[Value] = ()


class History:
    """The points of every declared series. `version` grows whenever a point was added, so a graph
    can tell without comparing values whether it has something new to draw."""

    def __init__(self, series: Iterable[Series] = (), maxlen: int = HISTORY_LEN) -> None:
        self.maxlen = maxlen
        self.loader_series: list[LoaderSeries] = []
        self.machine_series: list[MachineSeries] = []
        self.version = 0
        self._loader: dict[str, dict[LoaderSeries, deque[Value]]] = {}
        self._machine: dict[tuple[MachineSeries, Hashable], deque[Value]] = {}
        self._machine_points = 0  # samples recorded (keys that appear later are padded to it)
        self._last_doc: Document | None = None
        self._last_sample: tuple[str, float] | None = None
        self.track(series)

    def track(self, series: Iterable[Series]) -> None:
        for s in series:
            target: list[Any] = self.loader_series if isinstance(s, LoaderSeries) else self.machine_series
            if s not in target:
                target.append(s)

    # ------------------------------------------------------------------ recording

    def record(self, doc: Document) -> bool:
        """Take the points of a newly shown document: one per source, and one per machine sample
        not seen before. Recording the same document twice adds nothing. Returns whether any
        point was added."""
        if doc is self._last_doc:
            return False
        self._last_doc = doc
        added = False
        present = set()
        for src in doc.sources:
            present.add(src.id)
            store = self._loader.setdefault(src.id, {})
            for series in self.loader_series:
                points = store.get(series)
                if points is None:
                    points = store[series] = deque(maxlen=self.maxlen)
                points.append(series.read(src))
                added = True
        for sid in [sid for sid in self._loader if sid not in present]:
            del self._loader[sid]  # the source went away: so does its history
        system = doc.system
        if system is not None and (system.host, system.sent_at) != self._last_sample:
            self._last_sample = (system.host, system.sent_at)
            self._record_machine(system)
            added = True
        if added:
            self.version += 1
        return added

    def _record_machine(self, system: SystemFigures) -> None:
        self._machine_points += 1
        for series in self.machine_series:
            value = series.read(system)
            if isinstance(value, Mapping):
                seen = set()
                for key, v in value.items():
                    self._points(series, key).append(v)
                    seen.add(key)
                for (s, key), points in self._machine.items():
                    if s is series and key is not None and key not in seen:
                        points.append(None)  # that key (a GPU) was missing from this sample
            else:
                self._points(series, None).append(value)

    def _points(self, series: MachineSeries, key: Hashable) -> deque[Value]:
        points = self._machine.get((series, key))
        if points is None:
            points = self._machine[(series, key)] = deque(maxlen=self.maxlen)
            # A key seen for the first time: its earlier samples are unknown, not zero.
            points.extend([None] * min(self.maxlen, self._machine_points - 1))
        return points

    # ------------------------------------------------------------------ reading

    def loader(self, series: LoaderSeries, source_id: str | None) -> Sequence[Value]:
        """The points of ``series`` for one source, oldest first (empty when none)."""
        if source_id is None:
            return _EMPTY
        return self._loader.get(source_id, {}).get(series, _EMPTY)

    def machine(self, series: MachineSeries, key: Hashable = None) -> Sequence[Value]:
        """The points of a machine series (of one ``key`` of a mapping series), oldest first."""
        return self._machine.get((series, key), _EMPTY)

    def sources(self) -> set[str]:
        """The source ids that have history (tests: forgotten sources are gone)."""
        return set(self._loader)
