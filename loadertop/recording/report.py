"""`loadertop report`: a recording as one self-contained HTML page to attach to a bug report.

    recording → Playback (the live Model) → documents every `series.sample_step` →
    `series.Timeline` → `plots` (matplotlib SVG) → `html_report` (this module) → one string

The page needs nothing when it is opened: its style is inline, its plots are inline SVG, it has no
script. Every text that comes from the recording (commands, names, hosts, finding texts, stacks,
the header's argv) is HTML-escaped here; the plots carry no recording text as markup (see `plots`).
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence

from loadertop._version import __version__
from loadertop.client.document import Finding
from loadertop.recording import plots
from loadertop.recording.file import Recording
from loadertop.recording.playback import Playback
from loadertop.recording.series import SeenFinding, SourceSeries, Timeline, timeline
from loadertop.views.palette import category_colour, category_style, paper_colour, severity_style
from loadertop.views.text import finding_stack, render_text

_STYLE = """
body { font: 14px/1.45 -apple-system, "Segoe UI", "DejaVu Sans", "Liberation Sans", Arial, sans-serif;
       color: #1a1a1a; background: #fff; margin: 0 auto; padding: 16px 24px 40px; max-width: 1060px; }
h1 { font-size: 21px; margin: 8px 0 4px; }
h2 { font-size: 17px; margin: 28px 0 6px; border-bottom: 1px solid #ddd; padding-bottom: 3px; }
h3 { font-size: 14px; margin: 16px 0 2px; }
code, pre { font: 12.5px/1.4 "DejaVu Sans Mono", "Liberation Mono", Menlo, Consolas, monospace; }
pre { background: #f6f6f6; border: 1px solid #e3e3e3; padding: 8px 10px; overflow-x: auto;
      white-space: pre-wrap; word-break: break-word; }
table.meta { border-collapse: collapse; margin: 6px 0 4px; }
table.meta th { text-align: left; vertical-align: top; padding: 2px 14px 2px 0; color: #555;
                font-weight: normal; white-space: nowrap; }
table.meta td { padding: 2px 0; word-break: break-word; }
.verdict { border-left: 6px solid var(--c); padding: 6px 10px; background: #fafafa; margin: 8px 0; }
.chip { display: inline-block; width: 0.8em; height: 0.8em; border-radius: 2px; background: var(--c);
        vertical-align: -0.05em; margin-right: 0.3em; }
.muted { color: #666; }
figure { margin: 4px 0 10px; }
figure svg { width: 100%; height: auto; display: block; }
figcaption { color: #555; font-size: 12.5px; }
.finding { border-left: 4px solid var(--c); padding: 4px 10px; margin: 10px 0; background: #fcfcfc; }
.finding ul { margin: 2px 0 2px 1.2em; padding: 0; }
.sev { font-weight: bold; color: var(--c); }
.user-frame { background: #fff3b0; font-weight: bold; }
"""


def build(recording: Recording, playback: Playback, lead: Sequence[str] = ()) -> str:
    """The report of `recording` (played by `playback`) as one HTML page. `lead`: what the page
    leads with, one line each (an ended job's black box: how it ended and the findings of its last
    minutes, `blackbox.postmortem_lines`)."""
    plots.require_matplotlib()
    ended = playback.ending[1].text if playback.ending is not None else None
    return html_report(recording, timeline(playback), lead, ended)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _clock(at: float, with_date: bool = False) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(at))


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _elapsed(timeline: Timeline, at: float) -> str:
    return plots.elapsed_words(max(0.0, at - timeline.start), timeline.end - timeline.start >= 3600)


def _colour_var(colour: str) -> str:
    return f'style="--c: {_e(colour)}"'


def html_report(recording: Recording, timeline: Timeline, lead: Sequence[str] = (),
                ended: str | None = None) -> str:
    """The page; `ended`, for a job's black box, how the job ended (`client.ending`'s words: the
    header says it rather than how the recording's last file ended)."""
    start_words = _clock(timeline.start)
    names = ", ".join(dict.fromkeys(s.name for s in timeline.sources)) or "no loader"
    hosts = list(dict.fromkeys([s.host for s in timeline.sources] + timeline.machine.hosts))
    title = f"loadertop report: {names} on {', '.join(hosts) or recording.header.host or '?'}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # Nothing may be fetched: no network access even if some markup slipped through.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; img-src data:\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        *(['<h2 id="end">How it ended</h2>', f'<pre class="summary">{_e(chr(10).join(lead))}</pre>']
           if lead else []),
        _header(recording, timeline, ended),
        _verdict_summary(timeline),
    ]
    for src in timeline.sources:
        parts.append(_source_section(timeline, src, start_words))
    parts.append(_machine_section(timeline, start_words))
    parts.append(_findings_section(timeline))
    parts.append('<h2 id="summary">Final summary</h2>')
    parts.append(f'<p class="muted">The document at the recording\'s end, as '
                 f"<code>loadertop snapshot --from {_e(recording.path)}</code> prints it.</p>")
    parts.append(f'<pre class="summary">{_e(render_text(timeline.final))}</pre>')
    parts.append(f'<p class="muted">Made by loadertop {_e(__version__)} at '
                 f"{_e(_clock(time.time(), with_date=True))}.</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _header(recording: Recording, timeline: Timeline, job_ended: str | None = None) -> str:
    header = recording.header
    rows: list[tuple[str, str]] = []
    for src in timeline.sources:
        commands = "<br>".join(f"<code>{_e(c)}</code>" for c in src.commands) or "?"
        rank = f", rank {src.rank}" if src.rank is not None else ""
        rows.append((f"{_e(src.name)} (pid {src.pid}{rank} on {_e(src.host)})", commands))
    utc = time.strftime("%z", time.localtime(timeline.start))
    rows.append(("recorded", f"{_e(_clock(timeline.start, with_date=True))} → "
                 f"{_e(_clock(timeline.end))} (UTC{_e(utc[:3])}:{_e(utc[3:])}), "
                 f"{_e(_duration(timeline.end - timeline.start))}"))
    recorder = " ".join(header.argv) if header.argv else "?"
    rows.append(("recorder", f"<code>{_e(recorder)}</code> on {_e(header.host or '?')}, loadertop "
                 f"{_e(header.loadertop_version or '?')} (wire schema {_e(header.wire_version)})"))
    ended = {"stopped": "stopped", "seconds": "its --seconds ran out",
             "max_size": "its --max-size was reached"}
    end = ended.get(recording.end_reason or "", recording.end_reason) if recording.end_reason else \
        "no end mark (the recorder was killed or still runs)"
    if job_ended is not None:
        end = job_ended  # a job's black box: one end per job (docs/contract.md §9)
    rows.append(("file", f"<code>{_e(recording.path)}</code>, {_e(_size(recording.size))}, "
                 f"{len(recording.frames)} messages; ended: {_e(end)}"))
    rows.append(("sampled", f"{timeline.documents} documents, one every {timeline.step_s:g} s, each "
                 f"over a {timeline.window_s:g} s window (the verdicts as this loadertop, "
                 f"{_e(__version__)}, computes them)"))
    for note in recording.notes:
        rows.append(("note", _e(note)))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="meta">{body}</table>'


def _size(n: int) -> str:
    for unit, size in (("GB", 1024**3), ("MB", 1024**2), ("kB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _verdict_summary(timeline: Timeline) -> str:
    verdict = timeline.final.diagnosis
    style = category_style(verdict.category)
    colour = category_colour(verdict.category)
    out = [f'<div class="verdict" {_colour_var(colour)}><b>At the end: {_e(style.words)}</b> '
           f"<code>{_e(verdict.category)}</code> — {_e(verdict.summary)}"]
    if verdict.advice:
        out.append("<br>→ " + _e(verdict.advice[0]))
    out.append("</div>")
    for src in timeline.sources:
        shares = " · ".join(
            f'<span class="chip" {_colour_var(category_colour(c))}></span>'
            f"{_e(category_style(c).words)} {share:.0%}" for c, share in src.category_shares())
        out.append(f"<div><b>{_e(src.name)}</b> over the recording: {shares}</div>")
    counts = _severity_counts(timeline.findings)
    if counts:
        out.append(f'<div>Findings: <a href="#findings">{_e(counts)}</a></div>')
    return "\n".join(out)


def _severity_counts(findings: Sequence[SeenFinding]) -> str:
    counts: dict[str, int] = {}
    for seen in findings:
        counts[seen.finding.severity] = counts.get(seen.finding.severity, 0) + 1
    return ", ".join(f"{n} {severity}" for severity, n in counts.items())


def _figure(svg: str | None, plot_id: str, caption: str) -> str:
    if svg is None:
        return ""
    return f'<figure id="{_e(plot_id)}" class="plot">{svg}<figcaption>{caption}</figcaption></figure>'


def _source_section(timeline: Timeline, src: SourceSeries, start_words: str) -> str:
    index = timeline.sources.index(src)
    config = src.final.config
    batch = f", batch_size {config.batch_size}" if config.batch_size is not None else ""
    parts = [f'<h2 id="source-{index}">Loader {_e(src.name)} '
             f'<span class="muted">{_e(src.id)}</span></h2>',
             f'<p class="muted">{_e(config.dataset)}, num_workers {config.num_workers}{batch} '
             f"(at its last report); {src.final.batches_total} batches in all.</p>"]
    rate = "samples/s" if src.has_samples else "batches/s (no batch size known)"
    parts.append(_figure(
        plots.source_figure(timeline, src, start_words), f"plot-loader-{index}",
        f"The training loop's share of time blocked in <code>next()</code>, the {rate} it got, and "
        f"its verdict, each over the {timeline.window_s:g} s before the point."))
    if len(src.workers) > plots.MAX_WORKER_LINES:
        drawn = ("the median of the workers' p50 (line) and the range from the fastest worker's "
                 "to the slowest's (shade)")
    else:
        drawn = "its median (thick) and 95th percentile (thin)"
    parts.append(_figure(
        plots.workers_figure(timeline, src, start_words), f"plot-workers-{index}",
        f"Each worker's time to fetch one batch's items (collate excluded) over the window: {drawn}."))
    return "\n".join(parts)


def _machine_section(timeline: Timeline, start_words: str) -> str:
    machine = timeline.machine
    hosts = ", ".join(machine.hosts) or "?"
    parts = [f'<h2 id="machine">Machine <span class="muted">{_e(hosts)}</span></h2>']
    svg = plots.machine_figure(timeline, start_words)
    if svg is None:
        parts.append('<p class="muted">No machine figures were received.</p>')
    else:
        swap = "" if machine.has_swap else " The machine has no swap."
        parts.append(_figure(svg, "plot-machine", "CPU in use and I/O wait (of all cores), memory "
                             f"and swap in use.{_e(swap)}"))
    gpu_svg = plots.gpu_figure(timeline, start_words)
    if gpu_svg is not None:
        more = len(machine.gpus) - len(plots.SERIES_COLOURS)
        extra = f" ({more} more GPUs not drawn)" if more > 0 else ""
        names = "; ".join(f"GPU {g.index}: {_e(g.name)}" for g in machine.gpus)
        parts.append(_figure(gpu_svg, "plot-gpu",
                             f"Each GPU's utilisation and memory in use{extra}. {names}."))
    else:
        statuses = ", ".join(machine.gpu_statuses) or "not reported"
        parts.append(f'<p class="muted">No GPU figures (GPU status: {_e(statuses)}).</p>')
    return "\n".join(parts)


def _findings_section(timeline: Timeline) -> str:
    parts = ['<h2 id="findings">Findings</h2>']
    if not timeline.findings:
        parts.append('<p class="muted">No finding over the whole recording.</p>')
        return "\n".join(parts)
    parts.append('<p class="muted">Every finding of the recording, most severe first; '
                 "<i>since</i> is when its condition began, as elapsed time and clock time.</p>")
    sources = {s.id: s for s in timeline.sources}
    for seen in timeline.findings:
        parts.append(_finding(timeline, seen, sources.get(seen.finding.source or "")))
    return "\n".join(parts)


def _finding(timeline: Timeline, seen: SeenFinding, src: SourceSeries | None) -> str:
    f: Finding = seen.finding
    sev = severity_style(f.severity)
    colour = paper_colour(sev.colour)
    about = (f" · {_e(src.name if src is not None else f.source)}" if f.source is not None
             else " · the machine")
    if f.worker is not None:
        about += f" · worker {f.worker}"
    if f.since < timeline.start - 1.0:  # its condition held before the recording began
        since = f"since before the recording ({_e(_clock(f.since))})"
    else:
        since = f"since {_e(_elapsed(timeline, f.since))} ({_e(_clock(f.since))})"
    until = (f", listed until {_e(_elapsed(timeline, seen.last_seen))}"
             if seen.last_seen < timeline.end else ", still listed at the end")
    out = [f'<div class="finding" {_colour_var(colour)}>',
           f'<div><span class="sev">{_e(sev.glyph)} {_e(f.severity.upper())}</span> '
           f"<code>{_e(f.kind)}</code>{about} · {since}{until}</div>",
           f"<div><b>{_e(f.summary)}</b></div>"]
    if f.evidence:
        out.append("<ul>" + "".join(f"<li>{_e(ev)}</li>" for ev in f.evidence) + "</ul>")
    if f.advice:
        out.append("<ul>" + "".join(f"<li>→ {_e(a)}</li>" for a in f.advice) + "</ul>")
    stack = finding_stack(f, src.final if src is not None else None)
    if stack is not None:
        user = f.user_frame if f.user_frame is not None else stack.user_frame
        lines = []
        for i, frame in enumerate(stack.frames):
            if i == user:
                lines.append(f'<span class="user-frame">{_e(frame)}   ← your code</span>')
            else:
                lines.append(_e(frame))
        out.append(f"<div class=\"muted\">stack ({len(stack.frames)} frames, most recent call "
                   f"last):</div><pre class=\"stack\">{chr(10).join(lines)}</pre>")
    out.append("</div>")
    return "\n".join(out)
