"""The widgets of the loadertop screen, one module per panel or table, plus what they share:

- `theme` — the one home of presentation: category words and colours keyed by the diagnosis'
  constants, colour bands derived from its thresholds, freshness marks, the help's figures;
- `graphics` — pure text graphics (sparklines, bars, the core grid, lines fitted to a width);
- `history` — the series each panel declares and the store the app fills;
- `lines` — `LineWidget`, the line-API base that repaints only the lines that changed;
- `panel` — `Panel` / `MachinePanel`, the bordered panels built on it;
- `header`, `banner`, `loader`, `gpu`, `cpu`, `memory`, `disk` — the panels;
- `findings` — the findings under the banner (a hang's stack with them) and their list (`e`);
- `tables` — `LineTable`, the line-API table; `workers`, `overview` — the two tables on it;
- `help` — the help screen.

They only render what the app hands them (one document per refresh tick): nothing here talks to the
network, keeps a clock or computes a figure the model already computed.
"""

from loadertop.tui.widgets.banner import Banner
from loadertop.tui.widgets.cpu import CpuPanel
from loadertop.tui.widgets.disk import DiskPanel
from loadertop.tui.widgets.findings import FindingsBar, FindingsScreen
from loadertop.tui.widgets.gpu import GpuPanel
from loadertop.tui.widgets.header import HeaderBar
from loadertop.tui.widgets.help import HelpScreen
from loadertop.tui.widgets.history import History, LoaderSeries, MachineSeries
from loadertop.tui.widgets.loader import LoaderPanel
from loadertop.tui.widgets.memory import MemoryPanel
from loadertop.tui.widgets.overview import OverviewTable
from loadertop.tui.widgets.panel import MachinePanel, Panel
from loadertop.tui.widgets.workers import WorkersTable

#: The machine column, top to bottom: one line per panel. How to add a panel: a module here with a
#: `MachinePanel` subclass (its `TITLE`, `ID`, `SERIES` and `lines`), its line below (and its name
#: in the imports above); the layout in `loadertop.tcss` styles every panel by its class already.
MACHINE_PANELS: tuple[type[MachinePanel], ...] = (
    GpuPanel,
    CpuPanel,
    MemoryPanel,
    DiskPanel,
)

__all__ = [
    "Banner", "CpuPanel", "DiskPanel", "FindingsBar", "FindingsScreen", "GpuPanel", "HeaderBar",
    "HelpScreen", "History", "LoaderPanel", "LoaderSeries", "MACHINE_PANELS", "MachinePanel", "MachineSeries",
    "MemoryPanel", "OverviewTable", "Panel", "WorkersTable",
]
