"""The snapshot document as a readable plain-text report (`loadertop snapshot`, `--once`)."""

from __future__ import annotations

import time

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
from loadertop.viewer.units import (
    MISSING,
    fmt_bytes,
    fmt_float,
    fmt_frac_pct,
    fmt_pct,
    fmt_per_s,
    fmt_rate,
)


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
    fetch = src.loop.fetch_ms
    if fetch is not None:
        out.append(f"  main process fetch p50/p95 {fetch.p50:.2f} / {fetch.p95:.2f} ms · "
                   f"cpu_fraction {fmt_float(src.loop.cpu_fraction)}")
    if src.workers:
        out.append("  worker  pid      state        fetch p50/p95 ms   cpu_frac  CPU %   RSS")
    for w in src.workers:
        if w.alive is False:
            state = f"dead ({w.exitcode})" if w.exitcode is not None else "dead"
        else:
            state = "alive" if w.alive else "?"
        fetch_txt = f"{w.fetch_ms.p50:.1f} / {w.fetch_ms.p95:.1f}" if w.fetch_ms else MISSING
        out.append(
            f"  {w.id:<6}  {w.pid or '–':<7}  {state:<11}  {fetch_txt:<17}  "
            f"{fmt_float(w.cpu_fraction):<8}  {fmt_float(w.cpu_percent, 0):<6}  {fmt_bytes(w.rss_bytes)}")
    if with_verdict and src.diagnosis.category != diagnosis.IDLE:
        out.append("  " + _verdict_line(src.diagnosis).replace("\n", "\n  "))
    return out


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
