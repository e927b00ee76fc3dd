"""What `loadertop tune` prints: a progress line per trial (stderr), then the table, the plot of
samples/s against num_workers (plotext, imported only here and only when a plot is drawn), and
the recommendation (stdout).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from loadertop.client.units import MISSING, fmt_bytes, fmt_frac_pct, fmt_pct
from loadertop.tuning.document import TrialFigures, TrialReason, TuneDocument
from loadertop.tuning.recommendation import fmt_rate, fmt_spread
from loadertop.tuning.strategy import points, usable

REASON_TEXT: dict[str, str] = {
    "own_setting": "the program's own setting",
    "start": "start",
    "climb": "+2 workers",
    "refine": "refine",
    "repeat": "repeat: within noise of its neighbour",
    "listed": "listed",
}
PLOT_MAX_WIDTH = 100
PLOT_HEIGHT = 16


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "time left unknown"
    seconds = max(0, round(seconds))
    if seconds >= 90:
        return f"about {round(seconds / 60)} min left"
    return f"about {seconds} s left"


class StderrProgress:
    """One line when a trial starts (which, what runs, about how long is left) and one with its
    result; nothing between, so the lines read the same in a terminal and in a log."""

    def __init__(self, command: Sequence[str], stream: TextIO | None = None) -> None:
        import shlex

        self.command = shlex.join(command)
        self.stream = stream or sys.stderr
        self.started = 0.0

    def _line(self, text: str) -> None:
        print(f"loadertop tune: {text}", file=self.stream, flush=True)

    def trial_started(self, index: int, num_workers: int | None, reason: TrialReason,
                      left_s: float | None, trials_left: int) -> None:
        self.started = time.monotonic()
        count = "its own num_workers" if num_workers is None else f"num_workers={num_workers}"
        more = f"~{trials_left} trial{'s' if trials_left != 1 else ''}"
        self._line(f"trial {index}: {self.command} with {count} ({REASON_TEXT[reason]}); "
                   f"{fmt_eta(left_s)} ({more} to go)")

    def trial_phase(self, phase: str) -> None:
        pass

    def trial_done(self, index: int, trial: TrialFigures) -> None:
        took = time.monotonic() - self.started
        self._line(f"trial {index}: {trial_summary(trial)} ({took:.0f} s)")


def trial_summary(trial: TrialFigures) -> str:
    count = f"num_workers={trial.num_workers}" if trial.num_workers is not None else "its own setting"
    if trial.samples_per_s is None:
        return f"{count}: {trial.exit or trial.problem or 'no figure'}"
    spread = f" ±{fmt_spread(trial.spread_samples_per_s)}" if trial.spread_samples_per_s else ""
    unit = "samples/s" if trial.batch_size else "batches/s"
    text = (f"{count}: {_rate(trial.samples_per_s)}{spread} {unit}, wait "
            f"{fmt_frac_pct(trial.wait_fraction)}, CPU {fmt_pct(trial.cpu_percent)}")
    if trial.exit or trial.problem:
        text += f" — {trial.exit or trial.problem}"
    return text


def _rate(rate: float | None) -> str:
    return MISSING if rate is None else fmt_rate(rate)


# ------------------------------------------------------------------------------- the report
def render_report(doc: TuneDocument, *, width: int | None = None, color: bool = False) -> str:
    """The table, the plot and the recommendation, as one string."""
    parts = [render_table(doc)]
    plot = render_plot(doc, width=width, color=color)
    if plot:
        parts.append(plot)
    parts.append(f"→ {doc.recommendation}")
    if doc.stopped_because:
        parts.append(f"  (search ended: {doc.stopped_because}; {len(doc.trials)} trial"
                     f"{'s' if len(doc.trials) != 1 else ''} in {doc.duration_s:.0f} s)")
    return "\n\n".join(parts) + "\n"


TABLE_COLUMNS = ("workers", "RATE", "±", "wait", "CPU", "mem avail", "worker RSS", "verdict", "note")


def render_table(doc: TuneDocument) -> str:
    """One row per num_workers (its runs merged: the rate is their mean, ± the spread), in
    worker order; the recommended count marked."""
    pts = points(doc.trials)
    best = doc.best.num_workers if doc.best is not None else None
    rows: list[tuple[str, ...]] = []
    by_count: dict[int | None, list[TrialFigures]] = {}
    for trial in doc.trials:
        by_count.setdefault(trial.num_workers, []).append(trial)
    for count in sorted(by_count, key=lambda c: -1 if c is None else c):
        runs = by_count[count]
        last = runs[-1]
        point = pts.get(count) if count is not None else None
        rate = point.rate if point is not None and point.usable else None
        spread = point.spread if point is not None and point.usable else None
        good = [t for t in runs if usable(t)] or runs
        notes = []
        if len(runs) > 1:
            notes.append(f"{len(runs)} runs")
        if any(t.reason == "own_setting" for t in runs):
            notes.append("own setting")
        notes.extend(t.exit or t.problem or "" for t in runs if t.exit or t.problem)
        if any(t.memory_short for t in runs):
            notes.append("memory short")
        marker = "▶ " if count == best and count is not None else "  "
        rows.append((
            marker + (MISSING if count is None else str(count)),
            _rate(rate),
            fmt_spread(spread) if spread else MISSING,
            fmt_frac_pct(_mean([t.wait_fraction for t in good])),
            fmt_pct(_mean([t.cpu_percent for t in good])),
            fmt_bytes(_min([t.mem_available_bytes for t in good])),
            fmt_bytes(_mean([t.worker_rss_bytes for t in good])),
            last.category or MISSING,
            "; ".join(n for n in notes if n),
        ))
    header = tuple(doc.rate_unit if c == "RATE" else c for c in TABLE_COLUMNS)
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i])
              for i in range(len(header))]
    right = {1, 2, 3, 4, 5, 6}

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            if i == len(cells) - 1:
                out.append(cell)
            else:
                out.append(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def render_plot(doc: TuneDocument, *, width: int | None = None, color: bool = False) -> str | None:
    """samples/s against num_workers, drawn by plotext to the terminal's width (or `width`);
    plain characters unless `color`. None with fewer than two measured counts."""
    pts = [p for p in points(doc.trials).values() if p.usable and p.rate is not None]
    if len(pts) < 2:
        return None
    import plotext  # imported here only: `loadertop --help` and `--json` never pay for it

    columns = width or shutil.get_terminal_size((80, 24)).columns
    fig = plotext.figure
    fig.clear()
    xs = [p.num_workers for p in pts]
    ys = [round(p.rate or 0.0, 2) for p in pts]
    curve = fig.signal(xs, ys, marker="dot")
    curve.lines()
    fig.draw(curve)
    fig.draw(fig.signal(xs, ys, marker="circle"))  # the measured counts over the line between them
    if doc.best is not None:
        fig.draw(fig.signal([doc.best.num_workers], [doc.best.samples_per_s], marker="diamond"))
    fig.title(f"{doc.rate_unit} against num_workers"
              + (f" (◆ num_workers={doc.best.num_workers})" if doc.best is not None else ""))
    fig.label("num_workers", axis="x")
    fig.ruler("x").ticks(xs, [str(x) for x in xs])
    fig.ruler("y").lim(0, None)
    fig.plot_size(max(30, min(columns, PLOT_MAX_WIDTH)), PLOT_HEIGHT)
    if not color:
        fig.theme("colorless")
    text = fig.build().string(colorless=not color)
    fig.clear()
    return "\n".join(line.rstrip() for line in text.splitlines())


def _mean(values: Sequence[float | int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _min(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None
