"""The snapshot document as a readable plain-text report (`loadertop snapshot`, `--once`)."""

from __future__ import annotations

import json
import time

from loadertop import diagnosis
from loadertop.viewer.units import (
    MISSING,
    fmt_bytes,
    fmt_float,
    fmt_frac_pct,
    fmt_pct,
    fmt_per_s,
    fmt_rate,
)


def _stats(stats: dict | None) -> str:
    if not stats:
        return MISSING
    return f"{stats['p50']:.2f} / {stats['p95']:.2f} / {stats['p99']:.2f}"


def render_json(doc: dict) -> str:
    return json.dumps(doc, indent=2)


def render_text(doc: dict) -> str:
    lines = []
    taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(doc["taken_at"]))
    lines.append(f"loadertop snapshot · {taken} · {doc['window_s']:g} s window")
    top = doc.get("diagnosis") or {}
    if top:
        lines.append("")
        lines.append(_verdict_line(top, top.get("source")))
    for src in doc["sources"]:
        lines.append("")
        lines.extend(_source_lines(src, with_verdict=len(doc["sources"]) > 1))
    lines.append("")
    lines.extend(_system_lines(doc.get("system")))
    viewer = doc.get("viewer") or {}
    bad = viewer.get("bad_messages", 0) + viewer.get("wrong_version", 0)
    if bad:
        lines.append(f"dropped {bad} invalid message(s) ({viewer.get('wrong_version', 0)} of another schema version)")
    return "\n".join(lines) + "\n"


def _verdict_line(verdict: dict, source: str | None = None) -> str:
    cat = verdict.get("category", "?")
    where = f" [{source}]" if source else ""
    out = f"DIAGNOSIS{where}: {cat} — {verdict.get('summary', '')}"
    for ev in verdict.get("evidence", [])[:3]:
        out += f"\n  evidence: {ev}"
    for adv in verdict.get("advice", [])[:2]:
        out += f"\n  → {adv}"
    return out


def _source_lines(src: dict, with_verdict: bool) -> list[str]:
    cfg = src["config"]
    rank = f" rank {src['rank']}" if src.get("rank") is not None else ""
    q = src["queue"]
    out = [
        f"{src['name']}{rank} · {src['host']}:{src['pid']} · {src['state']} · "
        f"{cfg['num_workers']} workers · batch {cfg['batch_size']} · {cfg['dataset']}",
        f"  batches {src['batches']} in window ({src['batches_total']} total) · "
        f"{fmt_per_s(src['batches_per_s'])} batches/s · {fmt_per_s(src['samples_per_s'])} samples/s",
        f"  wait p50/p95/p99 {_stats(src['wait_ms'])} ms · waiting {fmt_frac_pct(src['wait_fraction'])} of the time"
        + (f" · blocked now {src['blocked_ms']:.0f} ms" if src.get("blocked_ms") is not None else ""),
        f"  step p50/p95/p99 {_stats(src['step_ms'])} ms",
        f"  queue ready {_q(q['ready'])} · in flight {_q(q['in_flight'])} · capacity {_q(q['capacity'])}",
    ]
    loop = src.get("loop") or {}
    if loop.get("fetch_ms"):
        out.append(f"  main process fetch p50/p95 {loop['fetch_ms']['p50']:.2f} / "
                   f"{loop['fetch_ms']['p95']:.2f} ms · cpu_fraction {fmt_float(loop['cpu_fraction'])}")
    if src["workers"]:
        out.append("  worker  pid      state        fetch p50/p95 ms   cpu_frac  CPU %   RSS")
    for w in src["workers"]:
        if w["alive"] is False:
            state = f"dead ({w['exitcode']})" if w["exitcode"] is not None else "dead"
        else:
            state = "alive" if w["alive"] else "?"
        fetch = w["fetch_ms"]
        fetch_txt = f"{fetch['p50']:.1f} / {fetch['p95']:.1f}" if fetch else MISSING
        out.append(
            f"  {w['id']:<6}  {w['pid'] or '–':<7}  {state:<11}  {fetch_txt:<17}  "
            f"{fmt_float(w['cpu_fraction']):<8}  {fmt_float(w['cpu_percent'], 0):<6}  {fmt_bytes(w['rss_bytes'])}")
    verdict = src.get("diagnosis")
    if with_verdict and verdict and verdict.get("category") not in (None, diagnosis.IDLE):
        out.append("  " + _verdict_line(verdict).replace("\n", "\n  "))
    return out


def _q(value) -> str:
    return MISSING if value is None else str(value)


def _system_lines(system: dict | None) -> list[str]:
    if not system:
        return ["machine: no figures yet"]
    out = [
        f"machine {system.get('host', '?')}: CPU {fmt_pct(system.get('cpu_percent'))} of "
        f"{system.get('cpu_count')} cores · iowait {fmt_pct(system.get('iowait_percent'), 1)} · "
        f"load {fmt_float(system.get('load_avg_1m'))}",
        f"  RAM {fmt_bytes(system.get('mem_available_bytes'))} available of "
        f"{fmt_bytes(system.get('mem_total_bytes'))} · swap {fmt_bytes(system.get('swap_used_bytes'))} used, "
        f"in {fmt_rate(system.get('swap_in_bytes_per_s'))} out {fmt_rate(system.get('swap_out_bytes_per_s'))}",
        f"  disk read {fmt_rate(system.get('disk_read_bytes_per_s'))} · write "
        f"{fmt_rate(system.get('disk_write_bytes_per_s'))}",
    ]
    status = system.get("gpu_status")
    if status == "ok":
        for gpu in system.get("gpus", []):
            out.append(f"  GPU{gpu['index']} {gpu['name']}: util {fmt_pct(gpu.get('util_percent'))} · "
                       f"mem {fmt_bytes(gpu.get('mem_used_bytes'))} / {fmt_bytes(gpu.get('mem_total_bytes'))}")
    else:
        words = {"no_nvml": "NVML not available", "no_gpu": "no GPU found"}.get(status, status)
        out.append(f"  GPU: {words}")
    return out
