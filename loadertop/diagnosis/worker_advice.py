"""The worker-count advice in words, shared by the categories in which the loop waits for data:
one recommendation first (a count, or why more workers will not help), then its reason and the
alternatives. The figures come from the capacity model (`capacity`).
"""

from __future__ import annotations

from loadertop.client.units import (
    say_bytes,
    say_core_share,
    say_cores,
    say_fraction,
    say_ms,
    say_number,
    say_percent,
    say_workers,
)
from loadertop.diagnosis.capacity import (
    CpuBudget,
    MoreDidNotHelp,
    fewer_workers_target,
    more_did_not_help,
    worker_limit,
    worker_plan,
)
from loadertop.diagnosis.facts import Facts
from loadertop.diagnosis.readings import finite
from loadertop.diagnosis.thresholds import (
    DISK_NEAR_PEAK_SHARE,
    DISK_READ_NOTABLE_BYTES_PER_S,
    FETCH_ROSE_FACTOR,
    IO_CPU_FRACTION,
    IO_WORKERS_PER_CORE_MAX,
    IOWAIT_HIGH_PERCENT,
    MAIN_BUSY_CORES,
    MORE_WORKERS_GAIN_MIN,
)


def rate_text(rate: float, batch_size: int | None) -> str:
    if batch_size:
        return f"{say_number(rate * batch_size)} samples/s"
    return f"{say_number(rate)} batches/s"


def more_did_not_help_advice(facts: Facts, seen: MoreDidNotHelp, kind: str) -> list[str]:
    earlier, batch_size = seen.earlier, facts.source.config.batch_size
    now_rate = finite(facts.source.batches_per_s) or 0.0
    sign = "+" if seen.gain >= 0 else "−"
    as_much = "as much" if seen.gain < MORE_WORKERS_GAIN_MIN else "nearly as much"
    advice = [f"num_workers={earlier.num_workers} gave {as_much}: "
              f"{rate_text(earlier.batches_per_s, batch_size)} with "
              f"{say_workers(earlier.num_workers)} earlier in this run, "
              f"{rate_text(now_rate, batch_size)} now with {say_workers(facts.worker_count)} "
              f"({sign}{say_fraction(abs(seen.gain))}): more workers do not help here"]
    if seen.gain >= MORE_WORKERS_GAIN_MIN and earlier.num_workers:
        ratio = facts.worker_count / earlier.num_workers
        advice.append(f"{say_number(ratio)} × the workers would give up to "
                      f"+{say_fraction(ratio - 1.0)} if each kept its earlier fetch time: the knee lies "
                      f"between {earlier.num_workers} and {facts.worker_count}")
    if seen.fetch_rose is not None and seen.fetch_rose >= FETCH_ROSE_FACTOR and \
            earlier.fetch_ms is not None:
        fraction, _ = facts.cpu_fraction()
        cpu = f" while the workers' CPU share stayed at {fraction:.2f}" \
            if fraction is not None and fraction < IO_CPU_FRACTION else ""
        queue = ("they queue for the storage (or the service): it serves fewer reads at once"
                 if kind == "io" else "they queue for the CPU")
        advice.append(f"a batch took {say_ms(earlier.fetch_ms)} with "
                      f"{say_workers(earlier.num_workers)} and takes {say_ms(facts.fetch_ms('mean') or 0)}"
                      f" now{cpu}: {queue}")
    advice.append(TUNE_TEXT)
    return advice


TUNE_TEXT = ("`loadertop tune -- COMMAND` runs the program with one worker count after another "
              "and finds the knee")


def io_saturation_signs(facts: Facts) -> list[str]:
    """The measured signs that the storage may already give all it has."""
    sysd = facts.system
    signs = []
    iowait = finite(sysd.iowait_percent)
    if iowait is not None and iowait >= IOWAIT_HIGH_PERCENT:
        signs.append(f"iowait is {say_percent(iowait)}")
    rate, peak = finite(sysd.disk_read_bytes_per_s), finite(sysd.disk_read_peak_bytes_per_s)
    if rate is not None and peak is not None and peak >= DISK_READ_NOTABLE_BYTES_PER_S \
            and rate >= DISK_NEAR_PEAK_SHARE * peak:
        signs.append(f"disk reads run at {say_bytes(rate)}/s, {say_fraction(rate / peak)} of the most seen "
                     f"in this run ({say_bytes(peak)}/s)")
    return signs


def worker_count_advice(facts: Facts, kind: str) -> list[str]:
    """One recommendation first (a count, or why more workers will not help), then its reason and
    the alternatives."""
    workers = facts.worker_count
    if kind == "io":
        cheaper = ("cache the data (local disk, RAM, page cache) or store it in a faster format "
                   "(fewer, larger files: WebDataset shards, LMDB, memory-mapped arrays)")
    else:
        cheaper = "make transforms cheaper (or move them to the GPU, or pre-process offline)"
    seen = more_did_not_help(facts)
    if seen is not None:
        return [*more_did_not_help_advice(facts, seen, kind), cheaper]

    plan = worker_plan(facts)
    rate_now = finite(facts.source.batches_per_s)
    advice: list[str] = []
    if plan is None:
        limit = worker_limit(facts)
        target = max(2 * workers, workers + 1)
        if limit is not None:
            target = min(target, limit)
        if target > workers:
            advice.append(f"try num_workers={target} (fetch or step time unknown: doubling)")
        advice.append(cheaper)
        return advice

    budget = plan.budget
    if plan.count is not None:
        count = plan.count
        lead = f"try num_workers={count}" if workers else \
            f"use workers at all: try num_workers={count}"
        if kind == "io":
            lead += f", if the storage serves {count} read{'' if count == 1 else 's'} at once"
        reason = [plan.basis()]
        if budget is not None and (plan.cpu_near() or budget.main_cores >= MAIN_BUSY_CORES):
            reason.append(budget.text())
        if plan.limit is not None and count == plan.limit and plan.bound == "workers":
            reason.append(f"at most {IO_WORKERS_PER_CORE_MAX} per core on "
                          f"{say_cores(facts.cores or 0)}")
        advice.append(f"{lead}: {plan.rate_text(rate_now)} ({'; '.join(reason)})")
        if kind == "io":
            signs = io_saturation_signs(facts)
            if signs:
                advice.append(f"the storage may already be near its limit ({', '.join(signs)}): "
                              "more workers would then only queue")
            advice.append("the live view cannot tell how many reads the storage serves at once: "
                          + TUNE_TEXT)
            advice.append(cheaper)
            advice.append("workers waiting on I/O need no core, but each one costs memory")
        else:
            advice.append(cheaper)
        if facts.cores is None:
            advice.append("core count unknown: the worker count is not capped")
        return advice

    # More workers are not predicted to help: say what limits.
    if plan.bound == "cpu" and budget is not None:
        # The CPU caps the rate near what the workers give at full speed. The verdict is not
        # cpu_saturated (it would not ask for a count), so by the same figure CPU is left (issue
        # 37): the cap is what the advice names, not "no CPU left".
        cap = budget.max_batches_per_s() or 0.0
        full = plan.now * 1000.0 / plan.fetch_ms if plan.now else 0.0
        who = say_workers(plan.now)
        reach = (f"which {who} reach{'es' if plan.now == 1 else ''} at full speed" if full >= cap
                 else f"and {who} give{'s' if plan.now == 1 else ''} ~{say_number(full)} at full speed")
        advice.append(f"more workers would add little: {budget.cap_text(rate_now)}, {reach} "
                      f"({plan.basis()})")
        advice.extend(busy_main_advice(budget))
        advice.append(cheaper)
        return advice
    if plan.limit is not None and workers >= plan.limit:
        advice.append(f"{say_workers(workers)} is already {IO_WORKERS_PER_CORE_MAX} per core on "
                      f"{say_cores(facts.cores or 0)}: {cheaper}")
        return advice
    prefetch = facts.source.config.prefetch_factor or 2
    advice.append(f"{say_workers(workers)} keep{'s' if workers == 1 else ''} up on average "
                  f"({plan.basis()}): the waits come in bursts; try prefetch_factor={prefetch * 2}")
    advice.append(cheaper)
    return advice


def fewer_workers_text(facts: Facts) -> str:
    fewer = fewer_workers_target(facts)
    if fewer is None:
        return "more workers will not help"
    target, budget = fewer
    return (f"num_workers={facts.worker_count} exceeds the {say_cores(facts.cores or 0)} available: "
            f"try num_workers={target} ({budget.text()})")


def busy_main_advice(budget: CpuBudget) -> list[str]:
    if budget.main_cores < MAIN_BUSY_CORES or not budget.main_measured:
        return []
    share = say_core_share(budget.main_cores)
    return [f"the training process itself uses {share} core{'' if share == '1' else 's'}: what it "
            "does besides waiting (the step, logging, pin_memory) takes CPU the workers need"]
