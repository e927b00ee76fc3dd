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

from loadertop.viewer.widgets.banner import Banner
from loadertop.viewer.widgets.cpu import CpuPanel
from loadertop.viewer.widgets.disk import DiskPanel
from loadertop.viewer.widgets.findings import FindingsBar, FindingsScreen
from loadertop.viewer.widgets.gpu import GpuPanel
from loadertop.viewer.widgets.header import HeaderBar
from loadertop.viewer.widgets.help import HelpScreen
from loadertop.viewer.widgets.history import History, LoaderSeries, MachineSeries
from loadertop.viewer.widgets.loader import LoaderPanel
from loadertop.viewer.widgets.memory import MemoryPanel
from loadertop.viewer.widgets.overview import OverviewTable
from loadertop.viewer.widgets.panel import MachinePanel, Panel
from loadertop.viewer.widgets.workers import WorkersTable

__all__ = [
    "Banner", "CpuPanel", "DiskPanel", "FindingsBar", "FindingsScreen", "GpuPanel", "HeaderBar",
    "HelpScreen", "History", "LoaderPanel", "LoaderSeries", "MachinePanel", "MachineSeries",
    "MemoryPanel", "OverviewTable", "Panel", "WorkersTable",
]
