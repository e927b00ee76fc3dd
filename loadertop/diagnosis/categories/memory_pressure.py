"""memory_pressure: the machine is short of memory or swapping (cgroup-aware figures)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from loadertop.client.document import (
    Category,
    SystemFigures,
    Verdict,
)
from loadertop.client.units import (
    say_bytes,
    say_fraction,
)
from loadertop.diagnosis.facts import Facts, make_verdict
from loadertop.diagnosis.readings import finite
from loadertop.diagnosis.thresholds import (
    MEM_AVAILABLE_LEAVE_FRACTION,
    MEM_AVAILABLE_MIN_FRACTION,
    MEM_AVAILABLE_SWAP_OUT_FRACTION,
    SWAP_RATE_MIN_BYTES_PER_S,
)

CATEGORY: Final = "memory_pressure"
#: How the screen and the report name and colour it (a Rich colour; `views.palette` reads these).
WORDS: Final = "Memory pressure"
COLOUR: Final = "red"
LEVEL: Final = "bad"  # the banner's CSS class suffix: ok / warn / bad / none
#: Its place in `overall`'s order, most urgent first: the OOM killer or swapping is next, and it slows
#: every process on the machine.
RANK: Final = 20
#: Shown at once by the verdict's hysteresis (`client.hysteresis`), without waiting to persist.
URGENT: Final = True
#: The loop waits for data in it (the margin on the wait fraction applies when it is shown).
LOOP_WAITS: Final = False


def judge(facts: Facts) -> Verdict | None:
    memory = memory_findings(facts.system, facts.previous)
    if memory is None:
        return None
    return make_verdict(CATEGORY, memory.summary, memory.evidence + worker_rss_evidence(facts),
                        memory_advice(facts))


def restate(facts: Facts) -> Verdict | None:
    """Its words for today's figures while the hysteresis holds it (`client.hysteresis`): only
    while its condition still holds; once it is over there is nothing true to say under it, and
    the change shows at once (docs/diagnosis.md, "Hysteresis")."""
    return judge(facts)


@dataclass
class MemoryFindings:
    summary: str
    evidence: list[str]


def memory_findings(system: SystemFigures, previous: Category | None) -> MemoryFindings | None:
    total = system.mem_total_bytes
    available = system.mem_available_bytes
    swap_in = finite(system.swap_in_bytes_per_s)
    swap_out = finite(system.swap_out_bytes_per_s)
    fraction = available / total if total and available is not None else None
    held = previous == CATEGORY
    threshold = MEM_AVAILABLE_LEAVE_FRACTION if held else MEM_AVAILABLE_MIN_FRACTION

    low = fraction is not None and fraction < threshold
    swapping_in = swap_in is not None and swap_in >= SWAP_RATE_MIN_BYTES_PER_S
    swapping_out = (swap_out is not None and swap_out >= SWAP_RATE_MIN_BYTES_PER_S
                    and fraction is not None and fraction < MEM_AVAILABLE_SWAP_OUT_FRACTION)
    if not (low or swapping_in or swapping_out):
        return None
    evidence = []
    if fraction is not None and total is not None and available is not None:
        margin = (f", held until {say_fraction(MEM_AVAILABLE_LEAVE_FRACTION)} available"
                  if low and fraction >= MEM_AVAILABLE_MIN_FRACTION else "")
        evidence.append(f"memory available {say_fraction(fraction)} ({say_bytes(available)} of "
                        f"{say_bytes(total)}; threshold {say_fraction(MEM_AVAILABLE_MIN_FRACTION)}{margin})")
    if swap_in is not None and (swapping_in or swapping_out):
        evidence.append(f"swap in {say_bytes(swap_in)}/s "
                        f"(threshold {say_bytes(SWAP_RATE_MIN_BYTES_PER_S)}/s)")
    if swap_out and (swapping_in or swapping_out):
        evidence.append(f"swap out {say_bytes(swap_out)}/s")
    if low and fraction is not None and available is not None:
        summary = f"memory nearly exhausted: {say_fraction(fraction)} available ({say_bytes(available)})"
        if swapping_in or swapping_out:
            summary += " and swapping"
    else:
        rate = max(swap_in or 0.0, swap_out or 0.0)
        summary = f"the machine is swapping ({say_bytes(rate)}/s)"
    return MemoryFindings(summary, evidence)


def worker_rss_evidence(facts: Facts) -> list[str]:
    rss = facts.worker_rss()
    if not rss:
        return []
    total = sum(rss)
    count = len(rss)
    text = (f"{count} workers use {say_bytes(total)} RSS" if count != 1
            else f"1 worker uses {say_bytes(total)} RSS")
    if count > 1:
        text += f" ({say_bytes(total / count)} each; shared pages count once per worker)"
    return [text]


def memory_advice(facts: Facts) -> list[str]:
    config = facts.source.config
    advice = []
    workers = facts.worker_count
    if workers >= 2:
        rss = facts.worker_rss()
        each = f" (each holds ~{say_bytes(sum(rss) / len(rss))} RSS)" if rss else ""
        advice.append(f"fewer workers: try num_workers={max(1, workers // 2)}{each}")
    prefetch = config.prefetch_factor
    if facts.uses_workers and prefetch is not None and prefetch > 1:
        advice.append(f"fewer batches in flight: try prefetch_factor=1 (now {prefetch}: "
                      f"{prefetch * max(workers, 1)} batches held at once)")
    batch_size = config.batch_size
    if batch_size is not None and batch_size >= 2:
        advice.append(f"smaller batches: try batch_size={batch_size // 2}")
    if facts.uses_workers:
        advice.append("if worker memory grows over time, it is copy-on-read of Python objects "
                      "(pytorch#13246): keep the dataset in numpy arrays or tensors, not lists/dicts")
    if not advice:
        advice.append("find the processes using the memory (top -o %MEM)")
    return advice
