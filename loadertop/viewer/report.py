"""The snapshot document as a readable plain-text report (`loadertop snapshot`, `--once`).

Also the one reading of "where the time goes" (`time_shares`): the loader panel draws the same
shares as a bar, so the screen and the report never disagree.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from loadertop import diagnosis
from loadertop.document import (
    Document,
    OverallVerdict,
    Source,
    Stats,
    SystemFigures,
    Verdict,
    encode_json,
)
from loadertop.viewer.model import MIN_PAIRED_BATCHES
from loadertop.viewer.units import (
    MISSING,
    fmt_bytes,
    fmt_float,
    fmt_frac_pct,
    fmt_ms,
    fmt_pct,
    fmt_per_s,
    fmt_rate,
)

# --------------------------------------------------------------------------- where the time goes

#: Why the probe paired no batch with the moment its worker produced it (CONTRACT §5
#: `stages.unpaired`), as the screen and the report say it after "split unknown: ".
UNPAIRED_WORDS = {
    "in_order_false": "in_order=False",
    "iterable_ended": "iterable dataset ended",
    "unreadable": "iterator unreadable",
    "lost_count": "batch count lost",
    "overflow": "too many pending",
    "inconsistent": "inconsistent stamps",
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
    for src in doc.sources:
        lines.append("")
        lines.extend(_source_lines(src, with_verdict=len(doc.sources) > 1))
    lines.append("")
    lines.extend(_system_lines(doc.system))
    viewer = doc.viewer
    bad = viewer.bad_messages + viewer.wrong_version
    if bad:
        lines.append(f"dropped {bad} invalid message(s) ({viewer.wrong_version} of another schema "
                     "version)")
    return "\n".join(lines) + "\n"


def _verdict_line(verdict: Verdict | OverallVerdict, source: str | None = None) -> str:
    where = f" [{source}]" if source else ""
    out = f"DIAGNOSIS{where}: {verdict.category} — {verdict.summary}"
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
        f"{src.name}{rank} · {src.host}:{src.pid} · {src.state} · "
        f"{cfg.num_workers} workers · batch {cfg.batch_size} · {cfg.dataset}",
        f"  batches {src.batches} in window ({src.batches_total} total) · "
        f"{fmt_per_s(src.batches_per_s)} batches/s · {fmt_per_s(src.samples_per_s)} samples/s",
        f"  wait p50/p95/p99 {_stats(src.wait_ms)} ms · waiting {fmt_frac_pct(src.wait_fraction)} of the time"
        + (f" · blocked now {src.blocked_ms:.0f} ms" if src.blocked_ms is not None else ""),
        f"  step p50/p95/p99 {_stats(src.step_ms)} ms",
        f"  queue ready {_q(q.ready)} · in flight {_q(q.in_flight)} · capacity {_q(q.capacity)}",
    ]
    out.extend(_time_lines(src))
    fetch = src.loop.fetch_ms
    if fetch is not None:
        out.append(f"  main process fetch p50/p95 {fetch.p50:.2f} / {fetch.p95:.2f} ms · "
                   f"cpu_fraction {fmt_float(src.loop.cpu_fraction)}")
    if src.workers:
        out.append("  worker  pid      state        fetch p50/p95 ms   collate p50/p95 ms  cpu_frac  "
                   "CPU %   RSS")
    for w in src.workers:
        if w.alive is False:
            state = f"dead ({w.exitcode})" if w.exitcode is not None else "dead"
        else:
            state = "alive" if w.alive else "?"
        out.append(
            f"  {w.id:<6}  {w.pid or '–':<7}  {state:<11}  {_p50_p95(w.fetch_ms):<17}  "
            f"{_p50_p95(w.collate_ms):<18}  {fmt_float(w.cpu_fraction):<8}  "
            f"{fmt_float(w.cpu_percent, 0):<6}  {fmt_bytes(w.rss_bytes)}")
    if with_verdict and src.diagnosis.category != diagnosis.IDLE:
        out.append("  " + _verdict_line(src.diagnosis).replace("\n", "\n  "))
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
