"""The notebook's live panel (docs/notebook.md): a document as one block of HTML for a cell's
output — the verdict banner in its colour with its evidence and advice, each loader's rate, wait,
where the time goes, stage times and queue, its workers, and the findings.

Pure: a `Document` in, a string out; the notebook extension (`integrations/notebook.py`) displays
it and replaces it every second. The words are the text report's and the screen's
(`views.text`, `client.units`), the colours the palette's page colours (`views.palette`), so the
panel, the TUI, `snapshot` and the HTML report say the same thing the same way.

What a cell's output must survive decides the markup: it is shown by JupyterLab, Notebook 7,
VS Code, Colab and GitHub's notebook view, some of which sanitize saved outputs (no script, no
`<style>` element kept, only some CSS properties) and any of which may be dark. So every style is
inline and common (flex, borders, padding), the text keeps the front end's own colour, colours
are borders, chips and faint tints of the verdict's colour, and long words wrap: nothing is wider
than the output area, from a narrow side panel to a wide window. Every text from the document
(names, commands, summaries, stacks) is HTML-escaped here.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable

from loadertop import diagnosis
from loadertop.client.document import Document, Finding, OverallVerdict, Source, Stats, Verdict
from loadertop.client.units import (
    MISSING,
    fmt_bytes,
    fmt_float,
    fmt_frac_pct,
    fmt_ms,
    fmt_pct,
    fmt_per_s,
)
from loadertop.views.palette import (
    DIM,
    STAGE_PARTS,
    STATE_COLOURS,
    category_colour,
    category_style,
    paper_colour,
    severity_style,
)
from loadertop.views.text import (
    autotune_words,
    earlier_settings_words,
    end_words,
    finding_stack,
    process_cpu_words,
    severity_counts,
    shown_state,
    time_shares,
)

#: The banner's evidence and advice, as many as the TUI's wide banner shows.
EVIDENCE_SHOWN, ADVICE_SHOWN = 3, 2
#: Worker rows listed; more are counted in one line (the TUI's table scrolls, a cell's output
#: should not grow without end).
MAX_WORKER_ROWS = 16
#: A finding's evidence lines shown, and its stack's innermost frames.
FINDING_EVIDENCE_SHOWN, STACK_FRAMES_SHOWN = 3, 8

#: The panel's type, and the bar and tints: what the front end's theme leaves alone.
#: (Single quotes only: these go inside double-quoted style attributes.)
FONT = ("font-family: -apple-system, BlinkMacSystemFont, 'Segoe UI', Roboto, 'DejaVu Sans', "
        "'Liberation Sans', Arial, sans-serif; font-size: 13px; line-height: 1.45")
MONO = ("font-family: 'DejaVu Sans Mono', 'Liberation Mono', Menlo, Consolas, monospace; "
        "font-size: 12px")
RULE = "rgba(127, 127, 127, 0.35)"  # table rules and the bar's frame: grey on light and dark
TINT = 0.13  # the banner's background: its colour at this opacity
MUTED = "opacity: 0.72"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _tint(colour: str, alpha: float = TINT) -> str:
    """"#2e9d4a" as rgba() at `alpha` (another form of colour is returned as it is)."""
    if len(colour) == 7 and colour.startswith("#"):
        try:
            r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
        except ValueError:
            return colour
        return f"rgba({r}, {g}, {b}, {alpha})"
    return colour


def _muted(text: str, extra: str = "") -> str:
    return f'<span style="{MUTED}{"; " + extra if extra else ""}">{text}</span>'


def _chip(colour: str) -> str:
    return (f'<span style="display: inline-block; width: 0.75em; height: 0.75em; border-radius: 2px; '
            f'background: {colour}; margin-right: 0.35em; vertical-align: -0.05em"></span>')


def _pill(text: str, colour: str) -> str:
    """A word in a rounded box of its colour: readable whatever the colour and the theme (yellow
    text on white is not)."""
    return (f'<span style="border: 1px solid {colour}; background: {_tint(colour, 0.18)}; '
            f'border-radius: 8px; padding: 0 6px; font-size: 12px; font-weight: 600">{_e(text)}</span>')


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def render(doc: Document, *, note: str | None = None, clock: bool = True) -> str:
    """The panel of `doc`. `note`: one more line at its foot (the extension says there that this
    panel stopped updating); `clock`: say when the document was taken (without it, the same
    figures give the same string: the extension compares them to skip sending what did not
    change)."""
    category = doc.diagnosis.category if doc.sources else None
    # data-: what a program reading a saved notebook looks for (the tests do)
    taken = f' data-taken-at="{doc.taken_at}"' if clock else ""
    parts = [f'<div class="loadertop-panel" data-category="{_e(category or "")}"{taken} '
             f'style="{FONT}; max-width: 1100px; box-sizing: border-box; overflow-wrap: anywhere; '
             f'padding: 2px 0">']
    parts.append(_banner(doc))
    many = len(doc.sources) > 1
    for src in doc.sources:
        parts.append(_source(src, many))
    machine_findings = [f for f in doc.findings if f.source is None]
    if machine_findings:
        parts.append(_findings(machine_findings, None, "the machine"))
    parts.append(_machine(doc))
    parts.append(_foot(doc, note, clock))
    parts.append("</div>")
    return "".join(parts)


def _banner(doc: Document) -> str:
    if not doc.sources:
        colour = paper_colour(DIM)
        return (f'<div style="border-left: 6px solid {colour}; background: {_tint(colour)}; '
                f'padding: 6px 10px; margin: 0 0 8px; border-radius: 3px">'
                f"<b>WAITING FOR A LOADER</b> "
                + _muted("— no instrumented DataLoader has reported in this kernel yet: "
                         "<code>%loadertop on</code>, then iterate one (or wrap it in "
                         "<code>loadertop.instrument</code>)")
                + "</div>")
    verdict = doc.diagnosis
    about = next((s for s in doc.sources if s.id == verdict.source), None)
    where = f" [{_e(about.name)}]" if about is not None and len(doc.sources) > 1 else ""
    return _verdict_block(verdict, where, big=True)


def _verdict_block(verdict: Verdict | OverallVerdict, where: str = "", *, big: bool) -> str:
    style = category_style(verdict.category)
    colour = category_colour(verdict.category)
    size = "font-size: 14px; " if big else ""
    out = [f'<div style="border-left: {6 if big else 4}px solid {colour}; background: {_tint(colour)}; '
           f'padding: {"6px 10px" if big else "3px 8px"}; margin: {"0 0 8px" if big else "4px 0"}; '
           f'border-radius: 3px">',
           f'<div style="{size}">{_chip(colour)}<b>{_e(style.words.upper())}</b>{where} '
           f"{_muted(_e(verdict.category), MONO)}"
           f"<br>{_e(verdict.summary)}</div>"]
    evidence = verdict.evidence[:EVIDENCE_SHOWN if big else 1]
    if evidence:
        out.append("<div>" + _muted("evidence ") + "; ".join(_e(ev) for ev in evidence) + "</div>")
    for advice in verdict.advice[:ADVICE_SHOWN if big else 1]:
        out.append(f'<div><b style="color: {colour}">→</b> {_e(advice)}</div>')
    out.append("</div>")
    return "".join(out)


# --------------------------------------------------------------------------- a loader


def _source(src: Source, many: bool) -> str:
    cfg = src.config
    state = shown_state(src)
    state_colour = paper_colour(STATE_COLOURS.get(state, DIM))
    rank = f" rank {src.rank}" if src.rank is not None else ""
    workers = f"{cfg.num_workers} worker" + ("" if cfg.num_workers == 1 else "s")
    batch = f" · batch {cfg.batch_size}" if cfg.batch_size is not None else ""
    head = (f'<div style="margin-top: 10px; font-size: 14px">{_chip(category_colour(src.diagnosis.category))}'
            f"<b>{_e(src.name)}</b>{_e(rank)} "
            f"{_pill(state, state_colour)} "
            + _muted(f"· {_e(workers)}{_e(batch)} · {_e(cfg.dataset)} · pid {src.pid}")
            + "</div>")
    out = [head]
    if many and src.diagnosis.category != diagnosis.IDLE:
        out.append(_verdict_block(src.diagnosis, big=False))
    out.append(_tiles(src))
    out.append(_time_bar(src))
    out.extend(_detail_lines(src))
    if src.workers:
        out.append(_workers(src))
    if src.findings:
        out.append(_findings(src.findings, src, src.name))
    return "".join(out)


def _p(stats: Stats | None, key: str) -> float | None:
    return None if stats is None else float(getattr(stats, key))


def _ms(*values: float | None) -> str:
    """"72.0 / 258 ms": times in ms as the text report writes them; one of 10 s or more is said
    in seconds by `fmt_ms` ("38 s"), and then each carries its own unit."""
    texts = [fmt_ms(v) for v in values]
    if all(t == MISSING for t in texts):
        return MISSING
    if any(t.endswith(" s") for t in texts):
        return " / ".join(t if t.endswith(" s") or t == MISSING else f"{t} ms" for t in texts)
    return " / ".join(texts) + " ms"


def _tiles(src: Source) -> str:
    """The figures a glance needs, each a label over its value; they wrap to the width."""
    q = src.queue
    queue = (f"{_q(q.ready)} / {_q(q.in_flight)} / {_q(q.capacity)}" if src.config.num_workers
             else MISSING)
    blocked = f"blocked now {_ms(src.blocked_ms)}" if src.blocked_ms is not None else ""
    tiles = [
        ("batches/s", fmt_per_s(src.batches_per_s), ""),
        ("samples/s", fmt_per_s(src.samples_per_s), ""),
        ("waiting", fmt_frac_pct(src.wait_fraction), blocked),
        ("wait p50 / p95", _ms(_p(src.wait_ms, "p50"), _p(src.wait_ms, "p95")), ""),
        ("step p50", _ms(_p(src.step_ms, "p50")), ""),
        ("queue ready / in flight / capacity", queue, ""),
        ("batches", f"{src.batches_total}", f"epoch {src.epoch}"),
    ]
    cells = "".join(
        f'<div style="flex: 0 1 auto; min-width: 6.5em; padding: 2px 0">'
        f'<div style="{MUTED}; font-size: 11.5px">{_e(label)}</div>'
        f'<div style="font-size: 15px; font-weight: 600">{_e(value)}</div>'
        + (f'<div style="{MUTED}; font-size: 11.5px">{_e(sub)}</div>' if sub else "")
        + "</div>" for label, value, sub in tiles)
    return f'<div style="display: flex; flex-wrap: wrap; gap: 2px 22px; margin: 4px 0 2px">{cells}</div>'


def _q(value: int | None) -> str:
    return MISSING if value is None else str(value)


def _time_bar(src: Source) -> str:
    """Where the window's time went: the loop's step, waiting while the batch is produced, the
    handoff after (`views.text.time_shares`), as a bar in the screen's colours and a legend."""
    shares = time_shares(src)
    label = _muted("where the time goes ")
    if shares is None:
        why = "not iterated in the window" if src.wait_fraction is not None else MISSING
        return f"<div>{label}{_muted(_e(why))}</div>"
    parts: list[tuple[str, str, float]] = [("step", "step", shares.step)]
    if shares.producing is None or shares.handoff is None:
        parts.append(("wait", "waiting", shares.wait))
    else:
        parts += [("producing", shares.producing_label, shares.producing),
                  ("handoff", "handoff", shares.handoff)]
    segments = "".join(
        f'<div style="width: {share * 100:.2f}%; background: {paper_colour(STAGE_PARTS[key].colour)}" '
        f'title="{_e(words)} {_e(fmt_frac_pct(share))}"></div>'
        for key, words, share in parts if share > 0)
    bar = (f'<div style="display: flex; box-sizing: border-box; width: 100%; max-width: 460px; '
           f'height: 10px; margin: 3px 0; border: 1px solid {RULE}; border-radius: 2px; '
           f'overflow: hidden">{segments}</div>')
    legend = " · ".join(
        f"{_chip(paper_colour(STAGE_PARTS[key].colour))}{_e(words)} <b>{_e(fmt_frac_pct(share))}</b>"
        for key, words, share in parts)
    if shares.unknown is not None:
        legend += " · " + _muted(f"split unknown: {_e(shares.unknown)}")
    return f'<div style="margin-top: 4px">{label}{bar}<div>{legend}</div></div>'


def _detail_lines(src: Source) -> list[str]:
    """One batch's stages, the training process's CPU, autotune, earlier settings, the main
    process's own fetch, and how the loop ended: the lines the text report has for them."""
    lines: list[str] = []
    stages = src.stages
    if any(st is not None for st in (stages.fetch_ms, stages.collate_ms, stages.handoff_ms)):
        per_batch = " · ".join(f"{name} {_ms(_p(st, 'p50'))}" for name, st in (
            ("fetch", stages.fetch_ms), ("collate", stages.collate_ms), ("handoff", stages.handoff_ms)))
        line = f"{_muted('per batch p50 ')}{_e(per_batch)}"
        tensors, size = stages.tensors_per_batch, stages.bytes_per_batch
        if tensors and size is not None:
            line += _muted(f" · {tensors} tensor{'s' if tensors != 1 else ''}, {_e(fmt_bytes(size))} a batch")
        lines.append(line)
    fetch = src.loop.fetch_ms
    if fetch is not None:
        lines.append(f"{_muted('main process fetch p50 / p95 ')}{_e(_ms(fetch.p50, fetch.p95))} · "
                     f"cpu_fraction {_e(fmt_float(src.loop.cpu_fraction))}")
    cpu = process_cpu_words(src)
    if cpu:
        lines.append(_muted(_e(cpu)))
    tuned = autotune_words(src)
    if tuned is not None:
        lines.append(_e(tuned))
    if src.earlier_settings:
        lines.append(_muted("earlier in this run: ") + _e(earlier_settings_words(src)))
    ended = end_words(src)
    if ended is not None:
        colour = paper_colour(STATE_COLOURS.get(shown_state(src), DIM))
        lines.append(f'<b style="color: {colour}">ended</b> {_e(ended)}')
    return [f"<div>{line}</div>" for line in lines]


def _workers(src: Source) -> str:
    hung = {f.worker for f in src.findings if f.kind == "worker_hung"}
    cell = f"padding: 1px 10px 1px 0; border-bottom: 1px solid {RULE}; text-align: left; vertical-align: top"
    head = "".join(f'<th style="{cell}; font-weight: 600; {MUTED}">{_e(h)}</th>' for h in (
        "worker", "pid", "state", "fetch p50/p95 ms", "cpu_frac", "CPU %", "RSS"))
    rows = []
    for w in src.workers[:MAX_WORKER_ROWS]:
        if w.alive is False:
            state = f"dead ({w.exitcode})" if w.exitcode is not None else "dead"
            colour = paper_colour("red")
        elif w.id in hung:
            state = f"hung {_ms(w.busy_ms)}" if w.busy_ms is not None else "hung"
            colour = paper_colour("red")
        else:
            state, colour = ("alive" if w.alive else "?"), ""
        fetch = (f"{fmt_ms(w.fetch_ms.p50)} / {fmt_ms(w.fetch_ms.p95)}" if w.fetch_ms is not None
                 else MISSING)
        values = (str(w.id), str(w.pid or MISSING), state, fetch, fmt_float(w.cpu_fraction),
                  fmt_pct(w.cpu_percent), fmt_bytes(w.rss_bytes))
        tds = "".join(
            f'<td style="{cell}{"; color: " + colour + "; font-weight: bold" if i == 2 and colour else ""}">'
            f"{_e(v)}</td>" for i, v in enumerate(values))
        rows.append(f"<tr>{tds}</tr>")
    more = len(src.workers) - MAX_WORKER_ROWS
    tail = f"<div>{_muted(f'… and {more} more workers')}</div>" if more > 0 else ""
    # Its cells wrap at spaces only (the panel's own `overflow-wrap: anywhere` would break a pid).
    return (f'<table style="border-collapse: collapse; margin: 6px 0 2px; font-size: 12px; '
            f'font-variant-numeric: tabular-nums; overflow-wrap: normal"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>{tail}")


# --------------------------------------------------------------------------- findings


def _findings(findings: Iterable[Finding], src: Source | None, about: str) -> str:
    listed = tuple(findings)
    heading = (f'<div style="margin-top: 6px"><b>Findings</b> {_muted(_e("of " + about))} '
               f"{_muted(_e('(' + severity_counts(listed) + ')'))}</div>")
    return heading + "".join(_finding(f, src) for f in listed)


def _finding(f: Finding, src: Source | None) -> str:
    sev = severity_style(f.severity)
    colour = paper_colour(sev.colour)
    worker = f" · worker {f.worker}" if f.worker is not None else ""
    out = [f'<div style="border-left: 4px solid {colour}; padding: 2px 8px; margin: 4px 0">',
           f'<div><b style="color: {colour}">{_e(sev.glyph)} {_e(f.severity.upper())}</b> '
           f'<span style="{MONO}">{_e(f.kind)}</span>{_e(worker)} '
           f"{_muted(_e('since ' + _clock(f.since)))}</div>",
           f"<div><b>{_e(f.summary)}</b></div>"]
    for ev in f.evidence[:FINDING_EVIDENCE_SHOWN]:
        out.append(f"<div>{_muted('evidence ')}{_e(ev)}</div>")
    for advice in f.advice[:1]:
        out.append(f'<div><b style="color: {colour}">→</b> {_e(advice)}</div>')
    stack = finding_stack(f, src)
    if stack is not None:
        frames = stack.frames[-STACK_FRAMES_SHOWN:]
        skipped = len(stack.frames) - len(frames)
        user = f.user_frame if f.user_frame is not None else stack.user_frame
        lines = []
        for i, frame in enumerate(frames, start=skipped):
            if i == user:
                lines.append(f"<b>{_e(frame)}   ← your code</b>")
            else:
                lines.append(_e(frame))
        if skipped:
            lines.insert(0, _e(f"… {skipped} outer frames"))
        # Shown, not folded in a <details>: the panel is replaced every second, which would close
        # one the reader opened.
        out.append(f"<div>{_muted(f'stack ({len(stack.frames)} frames, most recent call last)')}</div>"
                   f'<pre style="{MONO}; white-space: pre-wrap; overflow-wrap: anywhere; margin: 2px 0; '
                   f'padding: 4px 6px; background: {_tint("#7f7f7f", 0.1)}">{chr(10).join(lines)}</pre>')
    out.append("</div>")
    return "".join(out)


# --------------------------------------------------------------------------- the machine, the foot


def _machine(doc: Document) -> str:
    system = doc.system
    if system is None:
        return f'<div style="margin-top: 8px">{_muted("machine: no figures yet")}</div>'
    gpu = {"ok": "", "no_nvml": "NVML not available", "no_gpu": "no GPU"}.get(
        system.gpu_status, system.gpu_status)
    parts = [f"CPU {fmt_pct(system.cpu_percent)} of {system.cpu_count} cores",
             f"iowait {fmt_pct(system.iowait_percent, 1)}",
             f"RAM {fmt_bytes(system.mem_available_bytes)} available of {fmt_bytes(system.mem_total_bytes)}"]
    if system.gpu_status == "ok":
        parts += [f"GPU{g.index} {fmt_pct(g.util_percent)}, {fmt_bytes(g.mem_used_bytes)} of "
                  f"{fmt_bytes(g.mem_total_bytes)}" for g in system.gpus]
    else:
        parts.append(f"GPU: {gpu}")
    return (f'<div style="margin-top: 8px">{_muted("machine " + _e(system.host) + " ")}'
            f"{_e(' · '.join(parts))}</div>")


def _foot(doc: Document, note: str | None, clock: bool) -> str:
    words = ["loadertop", f"{doc.window_s:g} s window"]
    if clock:
        words.append(f"as of {_clock(doc.taken_at)}")
    out = f'<div style="margin-top: 4px; font-size: 11.5px; {MUTED}">{_e(" · ".join(words))}'
    if note:
        out += f"<br>{_e(note)}"
    return out + "</div>"
