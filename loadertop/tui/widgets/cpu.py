"""The CPU panel: the machine's CPU, cores (and the cgroup's limit), load, a graph of the total and
a bar per core."""

from __future__ import annotations

from loadertop.client.document import SystemFigures
from loadertop.client.units import MISSING, fmt_float, fmt_pct
from loadertop.tui.theme import ACCENT, DIM, load_colour
from loadertop.tui.widgets import graphics
from loadertop.tui.widgets.graphics import Line, Span
from loadertop.tui.widgets.history import MachineSeries
from loadertop.tui.widgets.panel import MachinePanel


class CpuPanel(MachinePanel):
    TITLE = "CPU"
    ID = "cpu"

    NAME = "CPU"
    TOTAL = MachineSeries("CPU total", lambda system: system.cpu_percent)
    SERIES = (TOTAL,)

    def machine_lines(self, system: SystemFigures, width: int) -> list[Line]:
        total = system.cpu_percent
        head: list[Span] = [("CPU ", "bold"), (fmt_pct(total), f"bold {load_colour(total)}"),
                            (f"  {system.cpu_count} cores", DIM)]
        avail = system.cores_available
        if avail is not None and avail != system.cpu_count:
            # Only a limit is worth the room (a cgroup's version or usage is not news here).
            quota = system.cgroup is not None and system.cgroup.cpu_quota_cores is not None
            head.append((f" ({avail:g} available{', cgroup quota' if quota else ''})", DIM))
        head += [("  load ", DIM), (fmt_float(system.load_avg_1m, 1), "")]
        per_cpu = list(system.per_cpu_percent or ())
        if self.compact:
            room = width - graphics.line_len(tuple(head)) - 2
            if per_cpu and room >= 4:
                shown = per_cpu[:room]
                head += [("  ", ""), (graphics.sparkline(shown, len(shown), top=100.0), ACCENT)]
            return [tuple(head)]
        points = self._history.machine(self.TOTAL)
        out: list[Line] = [tuple(head),
                           (("total ", DIM), (graphics.sparkline(points, max(4, width - 6), top=100.0),
                                              ACCENT))]
        out += graphics.core_grid(per_cpu, width, load_colour, DIM, ACCENT, MISSING)
        return out
