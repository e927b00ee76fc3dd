"""The loader panel: the selected source's state (and how its loop ended), waits, throughput, queue
and their graphs."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from loadertop.client.document import Source, Stats
from loadertop.client.units import MISSING, fmt_bytes, fmt_float, fmt_frac_pct, fmt_ms, fmt_per_s
from loadertop.tui.theme import (
    ACCENT,
    BAD,
    BLOCKED_SHOW_MS,
    DIM,
    END_MARKS,
    STAGE_PARTS,
    STATE_COLOURS,
    category_style,
    queue_colour,
    source_title,
    wait_colour,
)
from loadertop.tui.widgets import graphics
from loadertop.tui.widgets.graphics import Line, Span
from loadertop.tui.widgets.history import History, LoaderSeries
from loadertop.tui.widgets.panel import Panel
from loadertop.views.text import (
    TimeShares,
    autotune_words,
    earlier_settings_words,
    end_words,
    process_cpu_words,
    shown_state,
    switch_words,
    time_shares,
)

if TYPE_CHECKING:
    from textual.widget import Widget

#: A graph is at most this tall: taller is a wall of blocks, not more information.
MAX_GRAPH_ROWS = 8
#: Rows the workers table keeps below the panel at least (its header, a few rows, its border).
MIN_TABLE_ROWS = 6
#: Of the rows left for graphs, the wait graph takes this share, the rate graph the rest.
WAIT_GRAPH_SHARE = 0.6
#: The "where the time goes" bar: at least this wide, at most this wide; narrower than
#: `TIME_BAR_LONG_LABELS`, the labels get shorter first.
TIME_BAR_MIN, TIME_BAR_MAX, TIME_BAR_LONG_LABELS = 6, 50, 20
#: Its labels said shorter, one more each time, for a bar of TIME_BAR_LONG_LABELS cells ...
TERSE_LABELS = (("waiting for workers", "workers"), ("fetching in the loop", "fetching"))
#: ... and these too, only where the line would not fit at all.
SQUEEZED_LABELS = (("waiting", "wait"), ("split unknown:", "unknown:"))


def stats_spans(stats: Stats | None, keys: tuple[str, ...] = ("p50", "p95", "p99")) -> list[Span]:
    out: list[Span] = []
    for key in keys:
        out += [(f"{key} ", DIM), (fmt_ms(None if stats is None else getattr(stats, key)), ""), ("  ", "")]
    out.append(("ms", DIM))
    return out


class LoaderPanel(Panel):
    """The selected source (`Source`; None before any): state and rate, wait percentiles, the wait
    fraction, where the time goes (a bar of the loop's step, its wait for workers and the handoff,
    then the stages of a batch), step, the queue (or the main process' own fetch with
    num_workers=0), and two graphs: the wait p95 and the batch rate."""

    WAIT_P95 = LoaderSeries("wait p95", lambda src: None if src.wait_ms is None else src.wait_ms.p95)
    RATE = LoaderSeries("batches/s", lambda src: src.batches_per_s)
    SERIES = (WAIT_P95, RATE)

    def show(self, data: Source | None, history: History) -> None:
        if data is None:
            self.set_title("Loader")
        else:
            cat = category_style(data.diagnosis.category)
            self.set_title(f"Loader · {source_title(data.name, data.rank)} · [{cat.colour}]{cat.words}[/]")
        super().show(data, history)

    def build(self, width: int) -> list[Line]:
        src: Source | None = self._data
        if src is None:
            return [(("No instrumented DataLoader yet. Start your job with loadertop.instrument() "
                      "or `loadertop run`.", DIM),)]
        out: list[Line] = [self._rate_line(src)]
        ended = self._end_lines(src, width)
        out += ended
        category = src.diagnosis.category
        wf = src.wait_fraction
        out.append((("wait  ", "bold"), *stats_spans(src.wait_ms), ("   waiting ", DIM),
                    (fmt_frac_pct(wf), f"bold {wait_colour(wf, category)}"), (" of the time", DIM)))
        blocked = src.blocked_ms is not None and src.blocked_ms >= BLOCKED_SHOW_MS
        if blocked:
            out.append(((f"blocked in next() for {fmt_ms(src.blocked_ms)}", f"bold {BAD}"),))
        out += self._time_lines(src, width)
        out.append(self._stages_line(src, width))
        if not self.compact:
            process = process_cpu_words(src, "   ")
            out.append((("step  ", "bold"), *stats_spans(src.step_ms, ("p50", "p95")),
                        (process, DIM)))
        out.append(self._queue_line(src, width))
        tuned = autotune_words(src)
        if tuned is not None:
            out.append(((tuned[:width], ACCENT),))
            switched = switch_words(src)
            if switched is not None and not self.compact:
                out.append(((f"  last switch: {switched}"[:width], DIM),))

        waits = self._history.loader(self.WAIT_P95, src.id)
        rates = self._history.loader(self.RATE, src.id)
        colour = wait_colour(wf, category)
        if self.compact and (blocked or ended):
            return out  # 80×24 has no row to spare: the blocked or crashed line took the graph's
        if self.compact:
            label_w = 13
            graph_w = max(4, width - label_w - 12)
            peak = graphics.peak(waits, graph_w)
            out.append((("wait p95 ms".ljust(label_w), DIM), (graphics.sparkline(waits, graph_w), colour),
                        (f" {fmt_ms(peak) if peak is not None else MISSING} max", DIM)))
            return out
        # Wide: each graph under a caption, full width, sharing the rows the workers table leaves
        # (60/40); the panel is as tall as its content, the table takes the rest.
        room = self._graph_room(len(out) + 3, len(src.workers))
        wait_room = min(MAX_GRAPH_ROWS, max(1, math.ceil(room * WAIT_GRAPH_SHARE)))
        rate_room = min(MAX_GRAPH_ROWS, max(1, room - wait_room))
        out += self._graph("wait p95", waits, width, wait_room, "ms", fmt_ms, colour)
        out += self._graph("batches/s", rates, width, rate_room, "", fmt_per_s, ACCENT)
        out.append(((self._config_text(src), DIM),))
        if src.earlier_settings:
            out.append((("earlier ", DIM), (earlier_settings_words(src), "")))
        return out

    # ------------------------------------------------------------------ pieces

    def _end_lines(self, src: Source, width: int) -> list[Line]:
        """How the loop's job ended, under the state line's "crashed", "stopped" or "died", in the
        words of `loadertop ls`: "✖ exception: RuntimeError: DataLoader worker (pid 4321) is
        killed by signal: Killed." (wide: wrapped onto a second row where needed)."""
        end = src.end
        words = end_words(src)
        if end is None or end.how not in END_MARKS or not words:
            return []
        mark, colour = END_MARKS[end.how]
        line: Line = ((f"{mark} ", f"bold {colour}"), (words, colour))
        if self.compact:
            return [line]
        return graphics.wrap(line, width, indent=2)[:2]

    @staticmethod
    def _rate_line(src: Source) -> Line:
        total = src.batches_total
        state = shown_state(src)
        return ((state, STATE_COLOURS.get(state, DIM)), ("  batch ", DIM),
                (f"{src.batches}" + (f"/{total}" if total else ""), ""), ("  ", ""),
                (fmt_per_s(src.batches_per_s), "bold"), (" batches/s  ", DIM),
                (fmt_per_s(src.samples_per_s), "bold"), (" samples/s", DIM))

    def _time_lines(self, src: Source, width: int) -> list[Line]:
        """Where the window's time went, as htop draws a meter: the loop's own step, waiting for
        the batch to be produced, the handoff after — then each share, in its part's colour.
        With the split unknown, the step and the whole wait, and why (on a line of its own where
        a wide panel is too narrow for it beside the bar)."""
        head: Line = (("time  ", "bold"),)
        shares = time_shares(src)
        if shares is None:
            why = "not iterated in the window" if src.wait_fraction is not None else MISSING
            return [(*head, ("▕", DIM), *graphics.stacked_bar((), TIME_BAR_MIN, DIM), ("▏ ", DIM),
                     (why, DIM))]

        def room(legend: Line) -> int:
            return width - graphics.line_len(head) - 3 - graphics.line_len(legend)

        # The longest labels that leave the bar TIME_BAR_LONG_LABELS cells; else the reason of
        # an unknown split below the bar (wide); else any that leave TIME_BAR_MIN.
        terse = TERSE_LABELS + SQUEEZED_LABELS
        inline = [self._legend(shares, dict(terse[:n])) for n in range(len(terse) + 1)]
        legend = next((leg for leg in inline[:len(TERSE_LABELS) + 1]
                       if room(leg) >= TIME_BAR_LONG_LABELS), None)
        apart = False
        if legend is None and not self.compact and shares.unknown is not None:
            legend = self._legend(shares, apart=True)
            apart = room(legend) >= TIME_BAR_LONG_LABELS
        if not apart and legend is None or legend is not None and room(legend) < TIME_BAR_MIN:
            legend = next((leg for leg in inline if room(leg) >= TIME_BAR_MIN), inline[-1])
        assert legend is not None  # set above by every path: `apart` only with a legend
        bar_w = max(TIME_BAR_MIN, min(TIME_BAR_MAX, room(legend)))
        parts = [(shares.step, *STAGE_PARTS["step"])]
        if shares.producing is None or shares.handoff is None:
            parts.append((shares.wait, *STAGE_PARTS["wait"]))
        else:
            parts += [(shares.producing, *STAGE_PARTS["producing"]),
                      (shares.handoff, *STAGE_PARTS["handoff"])]
        lines: list[Line] = [(*head, ("▕", DIM), *graphics.stacked_bar(parts, bar_w, DIM),
                              ("▏ ", DIM), *legend)]
        if apart:
            lines.append((("      ", ""), ("split unknown: ", DIM), (shares.unknown or MISSING, "")))
        return lines

    @staticmethod
    def _legend(shares: TimeShares, words: dict[str, str] | None = None, apart: bool = False) -> Line:
        """"█ step 62 %  ▓ waiting for workers 30 %  ▒ handoff 8 %", its labels said as ``words``
        says (e.g. "waiting for workers" → "workers"); ``apart``: without the reason of an
        unknown split (said on a line of its own)."""
        words = words or {}

        def part(key: str, label: str, share: float) -> list[Span]:
            glyph, colour = STAGE_PARTS[key]
            return [(f"{glyph} ", colour), (f"{words.get(label, label)} ", DIM),
                    (fmt_frac_pct(share), f"bold {colour}")]

        out = part("step", "step", shares.step)
        if shares.producing is None or shares.handoff is None:
            out += [("  ", ""), *part("wait", "waiting", shares.wait)]
            if not apart:
                out += [(f"  {words.get('split unknown:', 'split unknown:')} ", DIM),
                        (shares.unknown or MISSING, "")]
            return tuple(out)
        out += [("  ", ""), *part("producing", shares.producing_label, shares.producing),
                ("  ", ""), *part("handoff", "handoff", shares.handoff)]
        return tuple(out)

    def _stages_line(self, src: Source, width: int) -> Line:
        """One batch's stages (p50): getting the items, collate_fn, the handoff to the loop; wide
        and where it fits, what a sampled batch holds."""
        stages = src.stages
        line: list[Span] = [("batch ", "bold"), ("p50 ", DIM)]
        for name, stats in (("fetch", stages.fetch_ms), ("collate", stages.collate_ms),
                            ("handoff", stages.handoff_ms)):
            line += [(f"{name} ", DIM), (fmt_ms(None if stats is None else stats.p50), ""), ("  ", "")]
        line.append(("ms", DIM))
        tensors, size = stages.tensors_per_batch, stages.bytes_per_batch
        if not self.compact and tensors and size is not None:
            noun = " tensors · " if tensors != 1 else " tensor · "
            extra: list[Span] = [("   ", ""), (str(tensors), ""), (noun, DIM), (fmt_bytes(size), "")]
            if graphics.line_len(tuple(line)) + graphics.line_len(tuple(extra)) <= width:
                line += extra
        return tuple(line)

    def _queue_line(self, src: Source, width: int) -> Line:
        queue = src.queue
        capacity = queue.capacity
        if not capacity:
            loop = src.loop
            return (("main process loads (num_workers=0)  ", "bold"), ("fetch ", DIM),
                    *stats_spans(loop.fetch_ms, ("p50", "p95")), ("  cpu ", DIM),
                    (fmt_float(loop.cpu_fraction), ""))
        ready, in_flight = queue.ready, queue.in_flight
        fill = None if ready is None else ready / capacity
        bar_w = max(8, min(capacity * 2, width // 4))
        line: list[Span] = [("queue ", "bold"), ("▕", DIM),
                            *graphics.bar_spans(fill, bar_w, queue_colour(fill), DIM), ("▏ ", DIM),
                            (MISSING if ready is None else str(ready), ""), (" ready · ", DIM),
                            (MISSING if in_flight is None else str(in_flight), ""),
                            (" in flight", DIM), (f" / {capacity}", "")]
        if not self.compact and queue.ready_mean is not None:
            extra: list[Span] = [("   avg ", DIM), (fmt_float(queue.ready_mean, 1), ""), (" ready", DIM)]
            if queue.ready_when_waiting is not None:
                extra += [(" · ready while waiting ", DIM), (fmt_frac_pct(queue.ready_when_waiting), "")]
            if graphics.line_len(tuple(line)) + graphics.line_len(tuple(extra)) <= width:
                line += extra  # the extra detail only when it fits
        return tuple(line)

    def _graph_room(self, fixed_lines: int, workers: int) -> int:
        """Rows left for the two graphs: the column's height less the table's and our own text."""
        # The panel sits in a column container (a Widget), whose content size Textual keeps.
        parent = cast("Widget | None", self.parent)
        column = parent.content_size.height if parent is not None else 0
        if column <= 0:
            return 2
        table = max(MIN_TABLE_ROWS, workers + 3)
        border = self.styles.gutter.height  # our border and padding
        return max(2, column - table - border - fixed_lines)

    @staticmethod
    def _graph(name: str, values: Sequence[float | None], width: int, room: int, unit: str,
               fmt: Callable[[float | None], str], colour: str) -> list[Line]:
        """A caption ("wait p95  73.2 ms   max 114"), then the graph; rows a young graph does not
        use yet stay blank above it, so the panel keeps its height while the history grows (a
        height change lays out the whole screen again)."""
        now = values[-1] if values else None
        peak = graphics.peak(values, width)
        caption: list[Span] = [(name, "bold"), ("  ", ""), (fmt(now), f"bold {colour}")]
        if unit:
            caption.append((f" {unit}", DIM))
        if peak is not None:
            caption.append((f"   max {fmt(peak)}", DIM))
        height = graphics.known_height(values, width, room, most=MAX_GRAPH_ROWS)
        rows = graphics.sparkline_rows(values, width, height)
        return [tuple(caption), *([()] * (room - height)), *[((row, colour),) for row in rows]]

    @staticmethod
    def _config_text(src: Source) -> str:
        cfg = src.config
        parts = [f"{cfg.num_workers} workers"]
        if cfg.prefetch_factor:
            parts.append(f"prefetch {cfg.prefetch_factor}")
        parts.append(f"batch {MISSING if cfg.batch_size is None else cfg.batch_size}")
        if cfg.pin_memory:
            parts.append("pin_memory")
        if cfg.persistent_workers:
            parts.append("persistent")
        if cfg.worker_context:
            parts.append(cfg.worker_context)
        if cfg.dataset:
            parts.append(cfg.dataset)
        return " · ".join(parts)
