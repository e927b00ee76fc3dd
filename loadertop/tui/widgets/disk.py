"""The disk panel: iowait and the machine's disk reads and writes, each with its graph."""

from __future__ import annotations

from loadertop.client.document import SystemFigures
from loadertop.client.units import fmt_pct, fmt_rate
from loadertop.tui.theme import ACCENT, DIM, iowait_colour
from loadertop.tui.widgets import graphics
from loadertop.tui.widgets.graphics import Line
from loadertop.tui.widgets.history import MachineSeries
from loadertop.tui.widgets.panel import MachinePanel

VALUE_WIDTH = 12
LABEL_WIDTH = 8


class DiskPanel(MachinePanel):
    TITLE = "Disk I/O"
    ID = "disk"

    NAME = "I/O"
    IOWAIT = MachineSeries("iowait", lambda system: system.iowait_percent)
    READ = MachineSeries("disk read", lambda system: system.disk_read_bytes_per_s)
    WRITE = MachineSeries("disk write", lambda system: system.disk_write_bytes_per_s)
    SERIES = (IOWAIT, READ, WRITE)

    def machine_lines(self, system: SystemFigures, width: int) -> list[Line]:
        iowait = system.iowait_percent
        rd, wr = system.disk_read_bytes_per_s, system.disk_write_bytes_per_s
        if self.compact:
            return [(("I/O ", "bold"), ("iowait ", DIM), (fmt_pct(iowait, 1), iowait_colour(iowait)),
                     ("  read ", DIM), (fmt_rate(rd), ""), ("  write ", DIM), (fmt_rate(wr), ""))]
        graph_w = max(4, width - LABEL_WIDTH - VALUE_WIDTH)

        def row(name: str, value: str, series: MachineSeries, style: str = "",
                top: float | None = None) -> Line:
            points = self._history.machine(series)
            return ((name.ljust(LABEL_WIDTH), DIM), (value.rjust(VALUE_WIDTH - 1), style), (" ", ""),
                    (graphics.sparkline(points, graph_w, top=top), ACCENT))

        return [row("iowait", fmt_pct(iowait, 1), self.IOWAIT, iowait_colour(iowait), top=100.0),
                row("read", fmt_rate(rd), self.READ),
                row("write", fmt_rate(wr), self.WRITE)]
