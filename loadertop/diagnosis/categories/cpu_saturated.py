"""cpu_saturated: the loop waits for data and every core available to the job is busy: one more
worker only time-slices with the others."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import (
    Category,
    Verdict,
)
from loadertop.client.units import (
    say_cores,
    say_percent,
)
from loadertop.diagnosis.facts import Facts, make_verdict
from loadertop.diagnosis.loop_waits import (
    gpu_lines,
    producing_evidence,
    stage_advice,
    wait_line,
    waits_text,
)
from loadertop.diagnosis.readings import finite
from loadertop.diagnosis.slow_worker import slow_worker_advice
from loadertop.diagnosis.thresholds import (
    CPU_NEAR_CAP,
    CPU_SATURATED_LEAVE_PERCENT,
    CPU_SATURATED_PERCENT,
    IO_CPU_FRACTION,
    LOAD_SATURATED_PER_CORE,
)
from loadertop.diagnosis.worker_advice import (
    busy_main_advice,
    fewer_workers_text,
)

CATEGORY: Final = "cpu_saturated"
#: How the screen and the report name and colour it (a Rich colour; `views.palette` reads these).
WORDS: Final = "CPU saturated"
COLOUR: Final = "red"
LEVEL: Final = "bad"  # the banner's CSS class suffix: ok / warn / bad / none
#: Its place in `overall`'s order, most urgent first: machine-wide, and its advice ("fewer workers")
#: overrides other sources' "more".
RANK: Final = 30
#: Shown at once by the verdict's hysteresis (`client.hysteresis`), without waiting to persist.
URGENT: Final = False
#: The loop waits for data in it (the margin on the wait fraction applies when it is shown).
LOOP_WAITS: Final = True


def judge(facts: Facts) -> Verdict | None:
    saturation = cpu_saturation(facts, facts.previous)
    return _saturated_verdict(facts, *saturation) if saturation is not None else None


def restate(facts: Facts) -> Verdict | None:
    """Its words for today's figures while the hysteresis holds it (`client.hysteresis`): the CPU
    readings it quotes are today's, however busy (docs/diagnosis.md, "Hysteresis")."""
    if not facts.window_judged:
        return None
    saturation = cpu_saturation(facts, facts.previous) or _cpu_readings(facts)
    return _saturated_verdict(facts, *saturation) if saturation is not None else None


def _saturated_verdict(facts: Facts, evidence: list[str], busy_text: str) -> Verdict:
    slow = facts.slow_worker
    slow_advice = [slow_worker_advice(slow)] if slow is not None else []
    return make_verdict(CATEGORY,
                        f"{waits_text(facts)} for data and every core is busy ({busy_text})",
                        [wait_line(facts), *producing_evidence(facts), *evidence, *gpu_lines(facts)],
                        slow_advice + cpu_saturated_advice(facts) + stage_advice(facts))


def cpu_saturation(facts: Facts, previous: Category | None) -> tuple[list[str], str] | None:
    """(evidence, short "busy" text) when every core available to us is busy, else None.

    It reads the one CPU figure (`CpuBudget.busy_share`, from `Facts.cpu`) that the advice's
    capacity model rests on too, so a verdict that says CPU is left never advises as if none
    were (issue 37): the machine's reading, or what the job uses of the cores available to it."""
    sysd = facts.system
    held = previous == CATEGORY
    threshold = CPU_SATURATED_LEAVE_PERCENT if held else CPU_SATURATED_PERCENT

    def threshold_text(percent: float) -> str:
        margin = (f", held until below {say_percent(CPU_SATURATED_LEAVE_PERCENT)}"
                  if percent < CPU_SATURATED_PERCENT else "")
        return f"(threshold {say_percent(CPU_SATURATED_PERCENT)}{margin})"

    budget = facts.cpu
    busy = finite(sysd.cpu_percent)
    cores = facts.cores
    load = finite(sysd.load_avg_1m)
    evidence: list[str] = []
    text = ""
    share = budget.busy_share() if budget is not None else \
        (busy / 100.0 if busy is not None else None)
    if share is not None and share * 100.0 >= threshold:
        # The evidence names each reading at the threshold: the machine's, and the job's own use
        # of the cores available to it (under a cgroup quota the machine may be idle while our
        # share is full, and the machine's reading, a second's average, may lag below what the
        # batches a second and the CPU each costs fill).
        if busy is not None and busy >= threshold:
            evidence.append(f"CPU {say_percent(busy)} {threshold_text(busy)}")
            text = f"CPU {say_percent(busy)}"
        job = budget.job_share() if budget is not None else None
        if budget is not None and job is not None and job * 100.0 >= threshold:
            evidence.append(f"{budget.use_text()} {threshold_text(job * 100.0)}")
            text = text or budget.use_text(short=True)
    if busy is None and not evidence and cores and load is not None \
            and load >= LOAD_SATURATED_PER_CORE * cores:
        fraction, _ = facts.cpu_fraction()
        if fraction is None or fraction >= IO_CPU_FRACTION:  # off-CPU workers inflate load (D state)
            evidence.append(f"load {load:.1f} on {say_cores(cores)} available (CPU % not yet known)")
            text = f"load {load:.1f}"
    if not evidence:
        return None
    if facts.cpu_count and cores and cores < facts.cpu_count:
        evidence.append(f"cgroup allows {say_cores(cores)} of the machine's {say_cores(facts.cpu_count)}")
    if load is not None and not text.startswith("load"):
        evidence.append(f"load {load:.1f}")
    worker_cores = budget.workers_cores if budget is not None else facts.worker_cores_busy()
    if busy is not None and worker_cores is not None and facts.cpu_count:
        busy_cores = busy / 100.0 * facts.cpu_count
        if busy_cores > 0 and worker_cores < 0.5 * busy_cores:
            evidence.append(f"workers use {say_cores(worker_cores)} of {say_cores(busy_cores)} busy: "
                            "other processes take most of the CPU")
    return evidence, text


def _cpu_readings(facts: Facts) -> tuple[list[str], str] | None:
    """(evidence, short "busy" text): today's CPU readings beside the threshold, however busy;
    None when neither the machine's nor the job's is known."""
    budget, busy = facts.cpu, finite(facts.system.cpu_percent)
    threshold = f"(threshold {say_percent(CPU_SATURATED_PERCENT)})"
    evidence, text = [], ""
    if busy is not None:
        evidence.append(f"CPU {say_percent(busy)} {threshold}")
        text = f"CPU {say_percent(busy)}"
    if budget is not None and budget.job_share() is not None:
        evidence.append(f"{budget.use_text()} {threshold}")
        text = text or budget.use_text(short=True)
    return (evidence, text) if evidence else None


def cpu_saturated_advice(facts: Facts) -> list[str]:
    advice = [fewer_workers_text(facts)]
    if advice[0] != "more workers will not help":
        advice.append("more workers will not help")
    else:
        # The capacity model says the same as the category, with its figures: where the CPU caps
        # the rate near where it is now (others filling the machine leave a cap far above it,
        # which would only confuse).
        budget, rate = facts.cpu, finite(facts.source.batches_per_s)
        cap = budget.max_batches_per_s() if budget is not None and facts.uses_workers else None
        if budget is not None and cap is not None and rate and cap <= (1.0 + CPU_NEAR_CAP) * rate:
            advice.append(f"no CPU left for more workers: {budget.cap_text(rate)}")
            advice.extend(busy_main_advice(budget))
    advice += ["make per-sample transforms cheaper (decode at a lower resolution, fewer "
               "augmentations, vectorised ops)",
               "move augmentation to the GPU (e.g. torchvision.transforms.v2 on CUDA tensors, DALI)",
               "pre-process offline: store decoded, resized samples"]
    return advice

