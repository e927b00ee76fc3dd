"""`Panel`: a bordered line-API panel that shows one object of the document and its history.

The app hands each panel what it shows (`show(data, history)`); the panel builds its lines from
typed attributes of the document (`loadertop.client.document`) and reads its graphs from the `History`
by the series it declares in `SERIES`. Adding a panel is one module with a `Panel` subclass and one
line in the app's `compose`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from loadertop.client.document import Document, Source, SystemFigures
from loadertop.tui.theme import DIM
from loadertop.tui.widgets.graphics import Line
from loadertop.tui.widgets.history import History, Series
from loadertop.tui.widgets.lines import LineWidget


class Panel(LineWidget):
    """Shows ``data`` (a part of the document) at its width; compact: fewer, shorter lines."""

    #: The history series this panel graphs (collected by the app into its `History`).
    SERIES: ClassVar[tuple[Series, ...]] = ()
    #: Its border title and DOM id (a machine panel is built from these: `MACHINE_PANELS`).
    TITLE: ClassVar[str] = ""
    ID: ClassVar[str] = ""

    def __init__(self, title: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.compact = False
        self.set_title(title)
        self._data: Any = None
        self._history = History()

    def data_of(self, doc: Document | None, source: Source | None) -> Any:
        """What this panel shows of the document, given the selected source (by default: that
        source)."""
        return source

    def show(self, data: Any, history: History) -> None:
        self._data = data
        self._history = history
        self.update_lines()

    def set_compact(self, compact: bool) -> None:
        if compact != self.compact:
            self.compact = compact
            self.set_class(compact, "-compact")
            self._built_width = -1  # rebuild at the next layout
            self.refresh(layout=True)


class MachinePanel(Panel):
    """A panel of the trainer's machine (`SystemFigures`; None before the first machine report)."""

    #: The panel's name in its "waiting for system data" line.
    NAME: ClassVar[str] = ""

    def data_of(self, doc: Document | None, source: Source | None) -> SystemFigures | None:
        return doc.system if doc is not None else None

    def build(self, width: int) -> list[Line]:
        system: SystemFigures | None = self._data
        if system is None:
            return [((f"{self.NAME}: waiting for system data", DIM),)]
        return self.machine_lines(system, width)

    def machine_lines(self, system: SystemFigures, width: int) -> list[Line]:  # pragma: no cover
        raise NotImplementedError
