"""What the categories in which the loop waits for data share (main_process_bound, cpu_saturated,
input_bound_io, input_bound_cpu): the wait fraction's line, the measured split of the wait, the
starved GPUs, the stage that costs most, and whether the fetching side mostly waits on I/O.

Their rules come after compute_bound in the ladder (`registry`): they may take it that the loop
waits at least the input-bound share of the time.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadertop.client.units import (
    say_bytes,
    say_fraction,
    say_ms,
    say_percent,
)
from loadertop.diagnosis.facts import Facts, source_gpus
from loadertop.diagnosis.readings import finite, stat
from loadertop.diagnosis.slow_worker import slow_worker_line
from loadertop.diagnosis.thresholds import (
    DISK_READ_NOTABLE_BYTES_PER_S,
    HANDOFF_MAIN_BOUND,
    IO_CPU_FRACTION,
    IO_CPU_FRACTION_MARGIN,
    IOWAIT_HIGH_PERCENT,
    WAIT_FRACTION_COMPUTE_BOUND,
    WAIT_FRACTION_INPUT_BOUND,
)


def wait_line(facts: Facts) -> str:
    """"wait fraction 12 % (threshold 10 %)", with the margin when only the margin decided."""
    wait_fraction = facts.wait_fraction
    line = (f"wait fraction {say_fraction(wait_fraction)} "
            f"(threshold {say_fraction(WAIT_FRACTION_INPUT_BOUND)}")
    if wait_fraction < WAIT_FRACTION_INPUT_BOUND:  # only the margin kept it input-bound
        line += f", held until below {say_fraction(WAIT_FRACTION_COMPUTE_BOUND)}"
    return line + ")"


def waits_text(facts: Facts) -> str:
    return f"the loop waits {say_fraction(facts.wait_fraction)} of the time"


def gpu_lines(facts: Facts) -> list[str]:
    return [f"GPU {g.index} util {say_percent(u)} (starved)"
            for g in source_gpus(facts) if (u := finite(g.util_percent)) is not None]


def producing_evidence(facts: Facts) -> list[str]:
    """The slow worker (where there is one), then the measured split of the wait."""
    lines = producing_lines(facts)
    slow = facts.slow_worker
    return [slow_worker_line(slow), *lines] if slow is not None else lines


@dataclass(frozen=True)
class IoReading:
    """Whether the fetching side mostly waits on I/O, and the lines that say why."""

    io_bound: bool
    fraction_line: str
    io_lines: list[str]


def io_reading(facts: Facts) -> IoReading:
    """I/O-bound when the workers (or the main process, fetching itself) are busy on CPU less
    than IO_CPU_FRACTION of the time they spend producing a batch, with a margin on the side
    shown now; without that figure iowait decides."""
    sysd = facts.system
    previous = facts.previous
    fraction, origin = facts.cpu_fraction()
    iowait = finite(sysd.iowait_percent)
    disk_read = finite(sysd.disk_read_bytes_per_s)
    io_lines = []
    if iowait is not None and iowait >= IOWAIT_HIGH_PERCENT:
        io_lines.append(f"iowait {say_percent(iowait)} (threshold {say_percent(IOWAIT_HIGH_PERCENT)})")
    if disk_read is not None and disk_read >= DISK_READ_NOTABLE_BYTES_PER_S:
        io_lines.append(f"disk reads {say_bytes(disk_read)}/s")

    if fraction is not None:
        boundary = IO_CPU_FRACTION
        if previous == "input_bound_io":
            boundary += IO_CPU_FRACTION_MARGIN
        elif previous == "input_bound_cpu":
            boundary -= IO_CPU_FRACTION_MARGIN
        io_bound = fraction < boundary
        fraction_line = f"{origin} {fraction:.2f} (I/O-bound below {IO_CPU_FRACTION:.2f}"
        if io_bound and fraction >= IO_CPU_FRACTION:  # only the margin kept it I/O-bound
            fraction_line += f", held until {boundary:.2f}"
        elif not io_bound and fraction < IO_CPU_FRACTION:  # only the margin kept it CPU-bound
            fraction_line += f", CPU-bound held down to {boundary:.2f}"
        fraction_line += ")"
    else:
        # No CPU figure for the fetching side: iowait decides; without it the CPU case is assumed
        # (its advice, more workers, also helps I/O) and the evidence says the figure is missing.
        fraction_line = "worker cpu_fraction unknown: judged by iowait"
        io_bound = iowait is not None and iowait >= IOWAIT_HIGH_PERCENT
        if not io_bound and iowait is None:
            fraction_line = "worker cpu_fraction and iowait unknown: CPU-bound assumed"
    return IoReading(io_bound, fraction_line, io_lines)


def producing_lines(facts: Facts) -> list[str]:
    """An input-bound verdict's measured share: how much of the wait was for production."""
    split = facts.source.stages.wait_split
    handoff = facts.handoff_share()
    producing = finite(split.producing) if split is not None else None
    if handoff is None or producing is None:
        return []
    if late_delivery(facts):
        ready = finite(facts.source.queue.ready_when_waiting)
        queue_text = (f"a second batch was ready in only {say_fraction(ready)} of the samples while the "
                      "loop waited" if ready is not None else "the loop waited")
        return [f"{say_fraction(handoff)} of the wait came after the batch was produced, yet "
                f"{queue_text}: the batches leave the workers late"]
    if facts.uses_workers:
        return [f"{say_fraction(producing)} of the wait came before the batch was produced: "
                "the workers are the limit"]
    return [f"{say_fraction(producing)} of the wait went to fetching and collating in the loop"]


def late_delivery(facts: Facts) -> bool:
    """Most of the wait came after production, yet the main process was not the limit (see
    `main_bound_evidence`): the batches leave the workers late."""
    handoff = facts.handoff_share()
    return facts.uses_workers and handoff is not None and handoff >= HANDOFF_MAIN_BOUND


def stage_advice(facts: Facts) -> list[str]:
    """Name the stage that costs most of producing a batch, where it is not the fetch."""
    stages = facts.source.stages
    advice = []
    if late_delivery(facts):
        advice.append("a finished batch waits in its worker until the worker's queue feeder thread "
                      "can send it: per-item work in pure Python holds the GIL that thread needs "
                      "(numpy / torch / PIL operations release it), and a busy CPU delays it too")
    fetch, collate = stat(stages.fetch_ms, "mean"), stat(stages.collate_ms, "mean")
    if fetch is None or collate is None or collate <= fetch:
        return advice
    return [*advice, f"collate_fn takes {say_ms(collate)} per batch, more than getting the items "
            f"({say_ms(fetch)}): make it cheaper (stack arrays once with torch.stack or numpy, no "
            "per-item Python work), or do the per-item part in the dataset's __getitem__"]

