"""The snapshot document as a readable plain-text report (`loadertop snapshot`, `--once`).

Also the one reading of "where the time goes" (`time_shares`), of how a loop ended
(`shown_state`) and of a finding's stack (`finding_stack`, `split_frame`): the screen draws the
same, so the screen and the report never disagree.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from loadertop import diagnosis
from loadertop.client.document import (
    SEVERITIES,
    Document,
    Finding,
    OverallVerdict,
    Source,
    StackFigures,
    Stats,
    SystemFigures,
    Verdict,
    encode_json,
)
from loadertop.client.model import MIN_PAIRED_BATCHES
from loadertop.client.units import (
    MISSING,
    fmt_bytes,
    fmt_float,
    fmt_frac_pct,
    fmt_ms,
    fmt_pct,
    fmt_per_s,
    fmt_rate,
)
from loadertop.views.palette import category_style, pending_words, source_title

# --------------------------------------------------------------------------- where the time goes

#: Why the probe paired no batch with the moment its worker produced it (docs/contract.md §5
#: `stages.unpaired`), as the screen and the report say it after "split unknown: ".
UNPAIRED_WORDS = {
    "in_order_false": "in_order=False",
    "iterable_ended": "iterable dataset ended",
    "unreadable": "iterator unreadable",
    "lost_count": "batch count lost",
    "overflow": "too many pending",
    "inconsistent": "inconsistent stamps",
    "workers_unhooked": "workers predate attach",
}


class TimeShares(NamedTuple):
    """Of the window's wall time: the loop's own step (everything outside next()) and its wait,
    split — where the probe measured it — into waiting for the batch to be produced and the
    handoff after (moving it over, unpickling, pin_memory, in-order delivery). The shares add up
    to 1. With the split unknown `producing`/`handoff` are None and `unknown` says why."""

    step: float
    wait: float
    producing: float | None
    handoff: float | None
    producing_label: str  # "waiting for workers", or "fetching in the loop" (num_workers=0)
    unknown: str | None


def split_unknown_reason(src: Source) -> str:
    """Why `src.stages.wait_split` is None, in a few words."""
    stages = src.stages
    if stages.unpaired is not None:
        return UNPAIRED_WORDS.get(stages.unpaired, stages.unpaired.replace("_", " "))
    if src.batches == 0:
        return "no batch received"
    if stages.batches_paired == 0:
        return "not measured"
    if stages.batches_paired < MIN_PAIRED_BATCHES:
        return f"only {stages.batches_paired} batches paired"
    return "no wait measured"


def time_shares(src: Source) -> TimeShares | None:
    """Where the window's time went, or None when the loop did not iterate (no batch and not
    blocked in next()) or its wait is unknown."""
    wait = src.wait_fraction
    if wait is None or (src.batches == 0 and src.blocked_ms is None):
        return None
    label = "waiting for workers" if src.config.num_workers else "fetching in the loop"
    split = src.stages.wait_split
    if split is None:
        return TimeShares(1.0 - wait, wait, None, None, label, split_unknown_reason(src))
    return TimeShares(1.0 - wait, wait, wait * split.producing, wait * split.handoff, label, None)


# --------------------------------------------------------------------------- how a loop ended


def shown_state(src: Source) -> str:
    """The source's state as the screen and the report say it: "crashed" where an exception left
    the loop's next() (or ended its process), "stopped" where a signal did, "died" where its
    process died without a goodbye (`end.how`), else the document's `state` (docs/contract.md §3)."""
    if src.end is not None and src.end.how in ("crashed", "stopped", "died"):
        return src.end.how
    return src.state


def end_words(src: Source) -> str | None:
    """How the loop's job ended, in the words `loadertop ls` says it with (`end.ended`, made by
    `client.ending` for every screen: "finished", "exception: RuntimeError: …", "signal: SIGTERM",
    "killed: SIGKILL (OOM killer: …)"), or None while it runs."""
    end = src.end
    if end is None:
        return None
    return end.ended or end.error or end.how


# --------------------------------------------------------------------------- stacks


class FindingStack(NamedTuple):
    """A finding's stack, innermost frame last (as the document has it), and the index of the
    innermost frame of the user's own code in it (None: unknown, or every frame a library's)."""

    frames: tuple[str, ...]
    user_frame: int | None


def finding_stack(finding: Finding, src: Source | None) -> FindingStack | None:
    """The stack of ``finding`` (None when it has none). The probe judged which frame is the
    user's (`StackFigures.user_frame`); a finding carries only the frames, so the index is taken
    from the source's stack of the same thread when that stack is the one the finding quotes."""
    if not finding.stack:
        return None
    live: StackFigures | None = None
    if src is not None:
        if finding.kind == "loop_hung":
            live = src.loop_stack
        elif finding.worker is not None:
            live = next((w.stack for w in src.workers if w.id == finding.worker), None)
    user = None
    if live is not None and live.user_frame is not None:
        # A finding quotes the innermost frames of the stack: the same thread's when they end it.
        skipped = len(live.frames) - len(finding.stack)
        if skipped >= 0 and live.frames[skipped:] == finding.stack and live.user_frame >= skipped:
            user = live.user_frame - skipped
    return FindingStack(finding.stack, user)


def split_frame(frame: str) -> tuple[str, str]:
    """``"file:line in function"`` as ``(function, "file:line")`` (py-spy's order); a frame in
    another form is its own location, with no function."""
    location, sep, function = frame.rpartition(" in ")
    if not sep or not location:
        return "", frame
    return function, location


#: Path parts after which a frame's file is shown (py-spy shortens the same way: a library's
#: path from its package, the standard library's from its module).
_PATH_ROOTS = ("/site-packages/", "/dist-packages/")
_STDLIB_ROOT = "/lib/python3"
#: Other paths keep this many trailing parts.
SHORT_PATH_PARTS = 3


def short_location(location: str) -> str:
    """``"/usr/lib/python3.12/threading.py:320"`` → ``"threading.py:320"``,
    ``".../site-packages/torch/utils/data/_utils/fetch.py:52"`` → ``"torch/utils/data/_utils/fetch.py:52"``,
    ``"/home/me/work/proj/data/train.py:42"`` → ``"…/proj/data/train.py:42"``."""
    for root in _PATH_ROOTS:
        i = location.rfind(root)
        if i >= 0:
            return location[i + len(root):]
    i = location.rfind(_STDLIB_ROOT)
    if i >= 0:
        rest = location[i + len(_STDLIB_ROOT):]
        slash = rest.find("/")
        if slash >= 0:
            return rest[slash + 1:]
    parts = location.split("/")
    if len(parts) > SHORT_PATH_PARTS + 1:
        return "…/" + "/".join(parts[-SHORT_PATH_PARTS:])
    return location


def severity_counts(findings: tuple[Finding, ...]) -> str:
    """"1 critical, 2 warning" (severities present, most severe first)."""
    return ", ".join(f"{n} {sev}" for sev in SEVERITIES
                     if (n := sum(1 for f in findings if f.severity == sev)))


def process_cpu_words(src: Source, lead: str = "") -> str:
    """The training process's CPU, e.g. " · training process 0.06 cores (its loop 0.04)"; ""
    while unknown. The advice subtracts it from the cores before it counts workers."""
    cores = src.process.cpu_cores
    if cores is None:
        return ""
    loop = src.process.loop_cpu_cores
    return (f"{lead}training process {fmt_float(cores, 2)} cores"
            + (f" (its loop {fmt_float(loop, 2)})" if loop is not None else ""))


def earlier_settings_words(src: Source) -> str:
    """What each earlier setting of this loader gave, e.g. "2 workers 311 samples/s, fetch 22 ms
    a batch"."""
    parts = []
    for setting in src.earlier_settings:
        rate = (f"{fmt_per_s(setting.samples_per_s)} samples/s" if setting.samples_per_s is not None
                else f"{fmt_per_s(setting.batches_per_s)} batches/s")
        fetch = f", fetch {fmt_ms(setting.fetch_ms)} ms a batch" if setting.fetch_ms is not None else ""
        workers = f"{setting.num_workers} worker" + ("" if setting.num_workers == 1 else "s")
        parts.append(f"{workers} {rate}{fetch}")
    return "; ".join(parts)


def autotune_words(src: Source) -> str | None:
    """`run --autotune`'s one line, e.g. "autotune · epoch 7 · trying 6 workers · 5 gave 244
    samples/s, +150 % over the program's 2" (None without --autotune)."""
    tune = src.autotune
    if tune is None:
        return None
    prefetch = (f", prefetch_factor {tune.prefetch_factor}"
                if tune.prefetch_factor != tune.program_prefetch_factor else "")
    doing = {"settled": f"settled on {tune.num_workers} workers{prefetch}",
             "backing_off": f"backing off to {tune.num_workers} workers"}.get(
                 tune.state, f"trying {tune.num_workers} workers")
    words = f"autotune · epoch {tune.epoch} · {doing}"
    best = tune.best
    if best is not None and best.samples_per_s is not None:
        words += f" · {best.num_workers} gave {fmt_per_s(best.samples_per_s)} samples/s"
        own = next((t.samples_per_s for t in tune.tried
                    if t.num_workers == tune.program_num_workers and t.samples_per_s), None)
        if own and best.num_workers != tune.program_num_workers:
            words += (f", {best.samples_per_s / own - 1:+.0%} over the program's "
                      f"{tune.program_num_workers}").replace("%", " %")
    return words


def switch_words(src: Source) -> str | None:
    """`run --autotune`'s latest switch inside an epoch, e.g. "2 → 4 workers at batch 1,234 of
    epoch 0: +88 %" (the gain once both counts are measured), and how many there were; None
    where there was none."""
    tune = src.autotune
    if tune is None or not tune.switches:
        return None
    last = tune.switches[-1]
    workers = (f"{last.from_workers} → {last.to_workers} workers" if last.from_workers != last.to_workers
               else f"{last.to_workers} workers")
    if last.prefetch_factor is not None:
        workers += f", prefetch_factor {last.prefetch_factor}"
    words = f"{workers} at batch {last.batch:,} of epoch {last.epoch}"
    if last.gain is not None:
        words += f": {last.gain:+.0%}".replace("%", " %")
    if tune.switch_count > 1:
        words += f" ({tune.switch_count} switches)"
    return words


def _stats(stats: Stats | None) -> str:
    if stats is None:
        return MISSING
    return f"{stats.p50:.2f} / {stats.p95:.2f} / {stats.p99:.2f}"


def render_json(doc: Document) -> str:
    return encode_json(doc).decode()


def render_text(doc: Document) -> str:
    lines = []
    taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(doc.taken_at))
    lines.append(f"loadertop snapshot · {taken} · {doc.window_s:g} s window")
    lines.append("")
    lines.append(_verdict_line(doc.diagnosis, doc.diagnosis.source))
    if doc.findings:
        lines.append(f"FINDINGS: {severity_counts(doc.findings)} (listed with their source)")
    for src in doc.sources:
        lines.append("")
        lines.extend(_source_lines(src, with_verdict=len(doc.sources) > 1))
    lines.append("")
    lines.extend(_system_lines(doc.system))
    machine = [f for f in doc.findings if f.source is None]
    if machine:
        lines.append(f"  findings of the machine ({len(machine)}):")
        for finding in machine:
            lines.extend(_finding_lines(finding, None, "    "))
    known = {s.id for s in doc.sources}
    elsewhere = [f for f in doc.findings if f.source is not None and f.source not in known]
    for finding in elsewhere:  # a source no longer in the document (should not happen)
        lines.extend(_finding_lines(finding, None, "  "))
    viewer = doc.viewer
    bad = viewer.bad_messages + viewer.wrong_version
    if bad:
        lines.append(f"dropped {bad} invalid message(s) ({viewer.wrong_version} of another schema "
                     "version)")
    return "\n".join(lines) + "\n"


#: Evidence items the banner's text gives (the TUI's wide banner: tui/widgets/banner.py).
BANNER_EVIDENCE = 3


def banner_text(doc: Document) -> str:
    """The banner's words as plain text, as the TUI's banner shows them: the category in
    capitals, the source it is about and the summary; the deciding evidence; the first advice
    (`loadertop.verdict()`, the integrations' text: docs/contract.md §11)."""
    verdict = doc.diagnosis
    head = category_style(verdict.category).words.upper()
    if verdict.pending is not None:  # a change the hysteresis holds back, as the TUI's banner says it
        head += f" · {pending_words(verdict.pending, verdict.category)}"
    about = next((s for s in doc.sources if s.id == verdict.source), None)
    if about is not None:
        head += f"  [{source_title(about.name, about.rank)}]"
    lines = [f"{head}  {verdict.summary}"]
    if verdict.evidence:
        lines.append("evidence " + "; ".join(verdict.evidence[:BANNER_EVIDENCE]))
    if verdict.advice:
        lines.append(f"→ {verdict.advice[0]}")
    return "\n".join(lines)


def _verdict_line(verdict: Verdict | OverallVerdict, source: str | None = None) -> str:
    where = f" [{source}]" if source else ""
    # A change the hysteresis holds back, by its category's name as the line names the shown one.
    pending = f" · changing to {verdict.pending}?" if verdict.pending is not None else ""
    out = f"DIAGNOSIS{where}: {verdict.category}{pending} — {verdict.summary}"
    for ev in verdict.evidence[:3]:
        out += f"\n  evidence: {ev}"
    for adv in verdict.advice[:2]:
        out += f"\n  → {adv}"
    return out


def _source_lines(src: Source, with_verdict: bool) -> list[str]:
    cfg = src.config
    rank = f" rank {src.rank}" if src.rank is not None else ""
    q = src.queue
    out = [
        f"{src.name}{rank} · {src.host}:{src.pid} · {shown_state(src)} · "
        f"{cfg.num_workers} workers · batch {cfg.batch_size} · {cfg.dataset}",
        f"  batches {src.batches} in window ({src.batches_total} total) · "
        f"{fmt_per_s(src.batches_per_s)} batches/s · {fmt_per_s(src.samples_per_s)} samples/s",
        f"  wait p50/p95/p99 {_stats(src.wait_ms)} ms · waiting {fmt_frac_pct(src.wait_fraction)} of the time"
        + (f" · blocked now {src.blocked_ms:.0f} ms" if src.blocked_ms is not None else ""),
        f"  step p50/p95/p99 {_stats(src.step_ms)} ms" + process_cpu_words(src, " · "),
        f"  queue ready {_q(q.ready)} · in flight {_q(q.in_flight)} · capacity {_q(q.capacity)}",
    ]
    out.extend(_time_lines(src))
    tuned = autotune_words(src)
    if tuned is not None and src.autotune is not None:
        out.append(f"  {tuned}")
        out.append(f"    why: {src.autotune.reason}")
        switched = switch_words(src)
        if switched is not None:
            out.append(f"    last switch: {switched}")
    if src.earlier_settings:
        out.append("  earlier in this run: " + earlier_settings_words(src))
    fetch = src.loop.fetch_ms
    if fetch is not None:
        out.append(f"  main process fetch p50/p95 {fetch.p50:.2f} / {fetch.p95:.2f} ms · "
                   f"cpu_fraction {fmt_float(src.loop.cpu_fraction)}")
    if src.workers:
        out.append("  worker  pid      state        fetch p50/p95 ms   collate p50/p95 ms  cpu_frac  "
                   "CPU %   RSS")
    hung = {f.worker for f in src.findings if f.kind == "worker_hung"}
    for w in src.workers:
        if w.alive is False:
            state = f"dead ({w.exitcode})" if w.exitcode is not None else "dead"
        elif w.id in hung:
            state = f"hung {fmt_ms(w.busy_ms)}" if w.busy_ms is not None else "hung"
        else:
            state = "alive" if w.alive else "?"
        out.append(
            f"  {w.id:<6}  {w.pid or '–':<7}  {state:<11}  {_p50_p95(w.fetch_ms):<17}  "
            f"{_p50_p95(w.collate_ms):<18}  {fmt_float(w.cpu_fraction):<8}  "
            f"{fmt_float(w.cpu_percent, 0):<6}  {fmt_bytes(w.rss_bytes)}")
    ended = end_words(src)
    if ended is not None and src.end is not None:
        at = f" at {_clock(src.end.at)}" if src.end.at is not None else ""
        out.append(f"  ended{at}: {ended}")
        if src.end.how == "died" and src.end.error:  # what the viewer found, as §9 words it
            out.append(f"    {src.end.error}")
    if src.findings:
        out.append(f"  findings ({len(src.findings)}):")
        for finding in src.findings:
            out.extend(_finding_lines(finding, src, "    "))
    if with_verdict and src.diagnosis.category != diagnosis.IDLE:
        out.append("  " + _verdict_line(src.diagnosis).replace("\n", "\n  "))
    return out


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _finding_lines(finding: Finding, src: Source | None, indent: str) -> list[str]:
    """One finding: "CRITICAL worker_died [worker 2] since 17:23:08: summary", its evidence,
    advice and (for a hang) its stack, most recent call last as Python prints a traceback."""
    about = f" [worker {finding.worker}]" if finding.worker is not None else ""
    if finding.source is not None and src is None:
        about = f" [{finding.source}]" + about
    out = [f"{indent}{finding.severity.upper()} {finding.kind}{about} since "
           f"{_clock(finding.since)}: {finding.summary}"]
    out += [f"{indent}  evidence: {ev}" for ev in finding.evidence]
    out += [f"{indent}  → {adv}" for adv in finding.advice]
    stack = finding_stack(finding, src)
    if stack is not None:
        out.append(f"{indent}  stack ({len(stack.frames)} frames, most recent call last):")
        for i, frame in enumerate(stack.frames):
            mark = "   ← your code" if i == stack.user_frame else ""
            out.append(f"{indent}    {frame}{mark}")
    return out


def _p50_p95(stats: Stats | None) -> str:
    return f"{stats.p50:.1f} / {stats.p95:.1f}" if stats is not None else MISSING


def _time_lines(src: Source) -> list[str]:
    """"where the time goes: step 60 % · waiting for workers 6.4 % · handoff 34 %" and, under
    it where any is known, the stages of one batch: "per batch p50: fetch 11.5 · collate 0.60 ·
    handoff 10.8 ms"."""
    shares = time_shares(src)
    if shares is None:
        parts = ["not iterated in the window" if src.wait_fraction is not None else MISSING]
    elif shares.producing is None or shares.handoff is None:
        parts = [f"step {fmt_frac_pct(shares.step)}", f"waiting {fmt_frac_pct(shares.wait)} "
                 f"(split unknown: {shares.unknown})"]
    else:
        parts = [f"step {fmt_frac_pct(shares.step)}",
                 f"{shares.producing_label} {fmt_frac_pct(shares.producing)}",
                 f"handoff {fmt_frac_pct(shares.handoff)}"]
    stages = src.stages
    per_batch = " · ".join(f"{name} {fmt_ms(None if st is None else st.p50)}" for name, st in (
        ("fetch", stages.fetch_ms), ("collate", stages.collate_ms), ("handoff", stages.handoff_ms)))
    lines = [f"  where the time goes: {' · '.join(parts)}"]
    if any(st is not None for st in (stages.fetch_ms, stages.collate_ms, stages.handoff_ms)):
        second = f"    per batch p50: {per_batch} ms"
        tensors, size = stages.tensors_per_batch, stages.bytes_per_batch
        if tensors and size is not None:
            second += f" · {tensors} tensor{'s' if tensors != 1 else ''}, {fmt_bytes(size)} a batch"
        lines.append(second)
    return lines


def _q(value: int | None) -> str:
    return MISSING if value is None else str(value)


def _system_lines(system: SystemFigures | None) -> list[str]:
    if system is None:
        return ["machine: no figures yet"]
    out = [
        f"machine {system.host}: CPU {fmt_pct(system.cpu_percent)} of "
        f"{system.cpu_count} cores · iowait {fmt_pct(system.iowait_percent, 1)} · "
        f"load {fmt_float(system.load_avg_1m)}",
        f"  RAM {fmt_bytes(system.mem_available_bytes)} available of "
        f"{fmt_bytes(system.mem_total_bytes)} · swap {fmt_bytes(system.swap_used_bytes)} used, "
        f"in {fmt_rate(system.swap_in_bytes_per_s)} out {fmt_rate(system.swap_out_bytes_per_s)}",
        f"  disk read {fmt_rate(system.disk_read_bytes_per_s)} · write "
        f"{fmt_rate(system.disk_write_bytes_per_s)}",
    ]
    if system.gpu_status == "ok":
        for gpu in system.gpus:
            out.append(f"  GPU{gpu.index} {gpu.name}: util {fmt_pct(gpu.util_percent)} · "
                       f"mem {fmt_bytes(gpu.mem_used_bytes)} / {fmt_bytes(gpu.mem_total_bytes)}")
    else:
        words = {"no_nvml": "NVML not available", "no_gpu": "no GPU found"}.get(
            system.gpu_status, system.gpu_status)
        out.append(f"  GPU: {words}")
    return out
