"""The HTML report's plots: a `Timeline`'s series drawn by matplotlib as static SVG, inlined in
the page (no script, nothing fetched when it is opened).

matplotlib is the optional extra `loadertop[report]`: imported only here, through `pyplot`-free
objects (`Figure` and the SVG canvas), so no display and no global backend is involved.
Text is drawn as paths (`svg.fonttype: path`): the page looks the same on a machine without
matplotlib's fonts. No text of the recording goes into a plot (a GPU's name, a loader's: the page
says them around the plots, escaped), only numbers and the report's own words.

Colours: each diagnosis category in its colour on the TUI, mapped from the terminal's colour
names to shades readable on paper (`views.palette.category_colour`, which the notebook's panel
shares); the categories that share a colour there
(the two input-bound ones, the three red ones, the two grey ones) are told apart by a hatch and by
their words in the legend and in the bands wide enough to hold them.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from typing import Any

from loadertop import diagnosis
from loadertop.recording.series import MachineSeries, Series, SourceSeries, Timeline
from loadertop.views.palette import category_colour, category_style


class PlottingUnavailable(Exception):
    """matplotlib is not installed (or broken): the message is the one line to print."""


INSTALL_HINT = "the report needs matplotlib: pip install 'loadertop[report]'"

#: A hatch for each category that shares its TUI colour with another (a purely visual choice).
CATEGORY_HATCHES = {
    diagnosis.INPUT_BOUND_IO: "////",
    diagnosis.EPOCH_START_BOUND: "\\\\\\\\",
    diagnosis.MEMORY_PRESSURE: "xxxx",
    diagnosis.STALLED: "....",
    diagnosis.INSUFFICIENT_DATA: "////",
}

LINE = "#1f5fa8"  # a source's own figures (wait, rate)
SECOND_LINE = "#c2571a"  # a second figure on the same axes (I/O wait, swap)
THRESHOLD = "#8a8a8a"
#: One colour per worker or GPU (matplotlib's tab10 without its grey and its olive, which read
#: like the idle verdict and like the I/O one).
SERIES_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                  "#17becf")
#: Up to this many workers are drawn one line each; more are drawn as their median and spread.
MAX_WORKER_LINES = len(SERIES_COLOURS)

WIDTH_IN = 10.0
LEFT_IN, RIGHT_IN = 0.95, 0.2  # fixed margins: the time axes of every plot line up on the page
ROW_IN = {"plot": 1.6, "band": 0.32}  # the height of each kind of axes
LEGEND_IN = 0.3  # the room for a legend above an axes
GAP_IN = 0.1  # between axes without a legend
BOTTOM_IN = 0.5  # the time labels under the last axes
BOTTOM_LEGEND_IN = 0.3  # ... and the verdicts' legend under them
Y_HEADROOM = 1.04  # a percentage axis goes a little past 100: a line at 100 % is not the frame
#: A band's category words are written in it when it spans at least this share of the time axis.
BAND_LABEL_MIN_SHARE = 0.12
#: The time axis' tick spacings, in seconds: the smallest that gives at most `MAX_TICKS` ticks.
TICK_STEPS_S = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800,
                21600, 43200, 86400)
MAX_TICKS = 10

_RC = {
    "font.size": 9.0,
    "axes.titlesize": 9.0,
    "axes.labelsize": 9.0,
    "legend.fontsize": 8.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e6e6e6",
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.4,
    "svg.fonttype": "path",
    "svg.hashsalt": "loadertop-report",  # the same recording gives the same file
    "text.parse_math": False,  # a "$" in a name is a dollar sign, not math
    "path.simplify": True,
}


def _matplotlib() -> tuple[Any, Any, Any]:
    try:
        import matplotlib
        from matplotlib.backends.backend_svg import FigureCanvasSVG
        from matplotlib.figure import Figure
    except ImportError:
        raise PlottingUnavailable(INSTALL_HINT) from None
    return matplotlib, Figure, FigureCanvasSVG


def require_matplotlib() -> None:
    """Raise `PlottingUnavailable` unless the report can draw its plots."""
    _matplotlib()


# --------------------------------------------------------------------------- the time axis


def tick_step(duration_s: float) -> int:
    for step in TICK_STEPS_S:
        if duration_s / step <= MAX_TICKS:
            return step
    return TICK_STEPS_S[-1]


def elapsed_words(seconds: float, long: bool) -> str:
    """12:05 (m:ss), or 1:02:05 (h:mm:ss) when the recording is an hour or longer."""
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if long:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{hours * 60 + minutes}:{secs:02d}"


def _values(series: Series, scale: float = 1.0) -> list[float]:
    return [math.nan if v is None else v * scale for v in series]


def _finite_max(*series: Sequence[float]) -> float:
    values = [v for s in series for v in s if not math.isnan(v)]
    return max(values, default=0.0)


class _Plot:
    """One figure: stacked axes sharing the time axis (elapsed seconds since the recording's
    start), the last of them labelled with it."""

    def __init__(self, timeline: Timeline, rows: Sequence[tuple[str, bool]], start_words: str,
                 *, bottom_legend: bool = False) -> None:
        """`rows`: (kind of axes, whether a legend goes above it), top to bottom."""
        self.matplotlib, figure_class, self._canvas_class = _matplotlib()
        self.timeline = timeline
        self.x = [t - timeline.start for t in timeline.times]
        self.duration = max(1.0, timeline.end - timeline.start)
        bottom = BOTTOM_IN + (BOTTOM_LEGEND_IN if bottom_legend else 0.0)
        height = bottom + sum(ROW_IN[kind] + (LEGEND_IN if legend else GAP_IN) for kind, legend in rows)
        self.figure = figure_class(figsize=(WIDTH_IN, height))
        # Placed in inches, not by a layout engine: every figure's axes start at the same x, so the
        # time axes line up down the page whatever the width of their labels.
        self.axes: list[Any] = []
        top = height
        for kind, legend in rows:
            top -= LEGEND_IN if legend else GAP_IN
            box = [LEFT_IN / WIDTH_IN, (top - ROW_IN[kind]) / height,
                   (WIDTH_IN - LEFT_IN - RIGHT_IN) / WIDTH_IN, ROW_IN[kind] / height]
            self.axes.append(self.figure.add_axes(box, sharex=self.axes[0] if self.axes else None))
            top -= ROW_IN[kind]
        self.bottom_legend_y = 0.02 / height
        long = self.duration >= 3600
        ticker = self.matplotlib.ticker
        last = self.axes[-1]
        last.set_xlim(0, self.duration)
        last.xaxis.set_major_locator(ticker.MultipleLocator(tick_step(self.duration)))
        last.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: elapsed_words(v, long)))
        for ax in self.axes[:-1]:
            ax.tick_params(labelbottom=False)
        last.set_xlabel(f"time since the recording's start ({start_words}), "
                        + ("h:mm:ss" if long else "m:ss"))

    def percent_axis(self, ax: Any, label: str) -> None:
        ax.set_ylim(0, 100 * Y_HEADROOM)
        ax.set_yticks([0, 20, 40, 60, 80, 100])
        ax.set_ylabel(label)

    def line(self, ax: Any, series: Series, label: str, colour: str, scale: float = 1.0,
             **style: Any) -> list[float]:
        values = _values(series, scale)
        ax.plot(self.x, values, color=colour, label=label, **style)
        return values

    def threshold(self, ax: Any, value: float, label: str) -> None:
        ax.axhline(value, color=THRESHOLD, linewidth=0.9, linestyle=(0, (2, 2)), label=label)

    def legend_above(self, ax: Any, ncol: int | None = None) -> None:
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(handles, labels, loc="lower left", bbox_to_anchor=(0.0, 1.0), frameon=False,
                      ncol=ncol or len(handles), borderaxespad=0.2, handlelength=1.8,
                      columnspacing=1.4)

    def settings_marks(self, src: SourceSeries) -> None:
        """A dashed line where the loader was re-created with another num_workers, labelled."""
        for t, before, after in src.setting_changes(self.timeline.times):
            x = t - self.timeline.start
            for ax in self.axes:
                ax.axvline(x, color="#555555", linewidth=0.9, linestyle=(0, (4, 2)))
            self.axes[0].annotate(f"num_workers {before} → {after}", xy=(x, 1.0),
                                  xycoords=("data", "axes fraction"), xytext=(3, -11),
                                  textcoords="offset points", fontsize=8, color="#333333")

    def verdict_band(self, ax: Any, categories: Sequence[str | None]) -> list[str]:
        """The verdict as coloured spans (one per run of the same category); the categories drawn,
        in the order they first appear (the legend reads like the band, left to right)."""
        ends = self.x[1:] + [self.duration]
        runs: list[tuple[str, float, float]] = []
        for category, start, end in zip(categories, self.x, ends):
            if category is None:
                continue
            if runs and runs[-1][0] == category and math.isclose(runs[-1][2], start):
                runs[-1] = (category, runs[-1][1], end)
            else:
                runs.append((category, start, end))
        for category, start, end in runs:
            colour = category_colour(category)
            ax.axvspan(start, end, facecolor=colour, edgecolor=_darker(colour), linewidth=0,
                       hatch=CATEGORY_HATCHES.get(category))
            if (end - start) / self.duration >= BAND_LABEL_MIN_SHARE:
                ax.text((start + end) / 2, 0.5, category_style(category).words, ha="center",
                        va="center", fontsize=7.5, color="#1a1a1a", transform=ax.get_xaxis_transform(),
                        clip_on=True, bbox={"boxstyle": "round,pad=0.15", "facecolor": "white",
                                            "edgecolor": "none", "alpha": 0.8})
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.grid(False)
        for side in ("left", "top", "right"):
            ax.spines[side].set_visible(False)
        ax.set_ylabel("verdict", rotation=0, ha="right", va="center")
        return list(dict.fromkeys(c for c, _s, _e in runs))

    def category_legend(self, categories: Sequence[str]) -> None:
        patches = self.matplotlib.patches
        handles = [patches.Patch(facecolor=category_colour(c), edgecolor=_darker(category_colour(c)),
                                 linewidth=0, hatch=CATEGORY_HATCHES.get(c),
                                 label=category_style(c).words) for c in categories]
        if handles:
            self.figure.legend(handles=handles, loc="lower left", frameon=False, ncol=len(handles),
                               bbox_to_anchor=(LEFT_IN / WIDTH_IN, self.bottom_legend_y), borderaxespad=0.1,
                               handlelength=1.6, columnspacing=1.2)

    def svg(self) -> str:
        buffer = io.StringIO()
        self._canvas_class(self.figure)
        self.figure.savefig(buffer, format="svg", metadata={"Date": None})
        return _inline_svg(buffer.getvalue())


def _darker(colour: str) -> str:
    """The hatch lines' colour: the fill, darker (a hex colour; anything else is left)."""
    if not re.fullmatch(r"#[0-9a-fA-F]{6}", colour):
        return colour
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return "#{:02x}{:02x}{:02x}".format(*(round(c * 0.6) for c in (r, g, b)))


_NUMBER = re.compile(r"(\d+\.\d\d)\d+")
_PATH_DATA = re.compile(r'(\sd=")([^"]*)(")')


def _inline_svg(document: str) -> str:
    """matplotlib's SVG file as an element for the page: from `<svg` on (no XML prolog or
    doctype), its path coordinates to 1/100 pt (matplotlib writes 6 decimals: a third of an
    hour's plot is those digits)."""
    start = document.find("<svg")
    element = document[start:] if start >= 0 else document
    return _PATH_DATA.sub(lambda m: m.group(1) + _NUMBER.sub(r"\1", m.group(2)) + m.group(3), element)


# --------------------------------------------------------------------------- the figures


def _rc(function: Any) -> Any:
    """Run a figure builder under the report's matplotlib settings."""

    def run(*args: Any, **kwargs: Any) -> Any:
        matplotlib, _figure, _canvas = _matplotlib()
        with matplotlib.rc_context(_RC):
            return function(*args, **kwargs)

    run.__doc__ = function.__doc__
    return run


@_rc
def source_figure(timeline: Timeline, src: SourceSeries, start_words: str) -> str:
    """The loop's wait fraction, its samples/s (batches/s without a batch size) and its verdict."""
    plot = _Plot(timeline, [("plot", True), ("plot", False), ("band", False)], start_words,
                 bottom_legend=True)
    wait_ax, rate_ax, band_ax = plot.axes
    plot.line(wait_ax, src.wait_fraction, "loop waiting for data", LINE, scale=100.0)
    plot.threshold(wait_ax, diagnosis.WAIT_FRACTION_INPUT_BOUND * 100,
                   f"input-bound from {diagnosis.WAIT_FRACTION_INPUT_BOUND * 100:.0f} %")
    plot.percent_axis(wait_ax, "wait\n(% of time)")
    plot.legend_above(wait_ax)
    if src.has_samples:
        rate = plot.line(rate_ax, src.samples_per_s, "samples/s", LINE)
        rate_ax.set_ylabel("samples/s")
    else:
        rate = plot.line(rate_ax, src.batches_per_s, "batches/s", LINE)
        rate_ax.set_ylabel("batches/s")
    rate_ax.set_ylim(0, max(1.0, _finite_max(rate) * 1.15))
    plot.settings_marks(src)
    plot.category_legend(plot.verdict_band(band_ax, src.categories))
    return plot.svg()


@_rc
def workers_figure(timeline: Timeline, src: SourceSeries, start_words: str) -> str | None:
    """Each worker's fetch time per batch (p50 thick, p95 thin); with more workers than
    colours, their median and the range from the fastest to the slowest."""
    if not src.workers:
        return None
    plot = _Plot(timeline, [("plot", True)], start_words)
    ax = plot.axes[0]
    tops: list[list[float]] = []
    if len(src.workers) <= MAX_WORKER_LINES:
        for i, worker in enumerate(src.workers):
            colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
            label = f"worker {worker.id}" if worker.id is not None else "main process (num_workers=0)"
            plot.line(ax, worker.fetch_p50_ms, label, colour)
            # p95 thin and faint: shades of several workers would mix into one muddy colour.
            tops.append(plot.line(ax, worker.fetch_p95_ms, "_p95", colour, linewidth=0.8, alpha=0.5))
        note = "thick: p50 · thin: p95"
    else:
        medians, lows, highs = [], [], []
        for i in range(len(plot.x)):
            values = sorted(v for w in src.workers if (v := w.fetch_p50_ms[i]) is not None)
            medians.append(values[len(values) // 2] if values else math.nan)
            lows.append(values[0] if values else math.nan)
            highs.append(values[-1] if values else math.nan)
        ax.plot(plot.x, medians, color=LINE, label=f"median of {len(src.workers)} workers")
        ax.fill_between(plot.x, lows, highs, color=LINE, alpha=0.16, linewidth=0,
                        label="fastest to slowest worker")
        tops.append(highs)
        note = "p50 of each worker"
    ax.set_ylim(0, max(1.0, _finite_max(*tops) * 1.12))
    ax.set_ylabel("fetch per batch\n(ms)")
    plot.legend_above(ax)
    ax.text(1.0, 1.0, note, transform=ax.transAxes, ha="right", va="bottom", fontsize=8,
            color="#555555")
    return plot.svg()


@_rc
def machine_figure(timeline: Timeline, start_words: str) -> str | None:
    """The machine's CPU and I/O wait, its memory and swap in use, and swap traffic if any."""
    machine: MachineSeries = timeline.machine
    if not any(v is not None for v in machine.cpu_percent + machine.mem_used_percent):
        return None
    rows = [("plot", True), ("plot", True)] + ([("plot", True)] if machine.has_swap_traffic else [])
    plot = _Plot(timeline, rows, start_words)
    cpu_ax, mem_ax = plot.axes[0], plot.axes[1]
    plot.line(cpu_ax, machine.cpu_percent, "CPU busy", LINE)
    plot.line(cpu_ax, machine.iowait_percent, "I/O wait", SECOND_LINE)
    plot.threshold(cpu_ax, diagnosis.CPU_SATURATED_PERCENT,
                   f"saturated from {diagnosis.CPU_SATURATED_PERCENT:.0f} %")
    cores = f" of {machine.cpu_count} cores" if machine.cpu_count else ""
    plot.percent_axis(cpu_ax, f"CPU\n(%{cores})")
    plot.legend_above(cpu_ax)
    plot.line(mem_ax, machine.mem_used_percent, "memory used", LINE)
    if machine.has_swap:
        plot.line(mem_ax, machine.swap_used_percent, "swap used", SECOND_LINE)
    plot.threshold(mem_ax, (1 - diagnosis.MEM_AVAILABLE_MIN_FRACTION) * 100,
                   f"pressure from {(1 - diagnosis.MEM_AVAILABLE_MIN_FRACTION) * 100:.0f} % used")
    plot.percent_axis(mem_ax, "memory\n(% used)")
    plot.legend_above(mem_ax)
    if machine.has_swap_traffic:
        swap_ax = plot.axes[2]
        swap_in = plot.line(swap_ax, machine.swap_in_bytes_per_s, "swap in", LINE, scale=1 / 2**20)
        swap_out = plot.line(swap_ax, machine.swap_out_bytes_per_s, "swap out", SECOND_LINE,
                             scale=1 / 2**20)
        swap_ax.set_ylim(0, max(0.1, _finite_max(swap_in, swap_out) * 1.15))
        swap_ax.set_ylabel("swap traffic\n(MiB/s)")
        plot.legend_above(swap_ax)
    return plot.svg()


@_rc
def gpu_figure(timeline: Timeline, start_words: str) -> str | None:
    """Each GPU's utilisation and memory in use (None: no GPU was reported)."""
    gpus = timeline.machine.gpus
    if not gpus:
        return None
    plot = _Plot(timeline, [("plot", True), ("plot", False)], start_words)
    util_ax, mem_ax = plot.axes
    for i, gpu in enumerate(gpus[:len(SERIES_COLOURS)]):
        colour = SERIES_COLOURS[i]
        plot.line(util_ax, gpu.util_percent, f"GPU {gpu.index}", colour)  # its name: the caption
        plot.line(mem_ax, gpu.mem_used_percent, f"GPU {gpu.index}", colour)
    plot.percent_axis(util_ax, "GPU busy\n(%)")
    plot.percent_axis(mem_ax, "GPU memory\n(% used)")
    plot.legend_above(util_ax, ncol=min(4, len(gpus)))
    return plot.svg()
