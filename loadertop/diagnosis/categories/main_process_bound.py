"""main_process_bound: the loop waits although batches are ready: the main process (receiving,
unpickling, collating, pin_memory) is the limit, and more workers make it worse."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import (
    Category,
    Verdict,
)
from loadertop.client.units import (
    say_bytes,
    say_fraction,
    say_ms,
    say_number,
)
from loadertop.diagnosis.categories.cpu_saturated import cpu_saturation
from loadertop.diagnosis.facts import Facts, make_verdict
from loadertop.diagnosis.loop_waits import (
    gpu_lines,
    wait_line,
    waits_text,
)
from loadertop.diagnosis.readings import finite, stat
from loadertop.diagnosis.thresholds import (
    HANDOFF_LEAVE,
    HANDOFF_MAIN_BOUND,
    LOOP_CPU_MAIN_BOUND_MIN,
    MANY_TENSORS_PER_BATCH,
    READY_WHEN_WAITING_LEAVE,
    READY_WHEN_WAITING_MAIN_BOUND,
    SMALL_TENSOR_BYTES,
    TINY_BATCHES_PER_S,
)
from loadertop.diagnosis.worker_advice import fewer_workers_text

CATEGORY: Final = "main_process_bound"
#: How the screen and the report name and colour it (a Rich colour; `views.palette` reads these).
WORDS: Final = "Main-process-bound"
COLOUR: Final = "#ff8700"
LEVEL: Final = "warn"  # the banner's CSS class suffix: ok / warn / bad / none
#: Its place in `overall`'s order, most urgent first: the one input-bound case that more
#: workers make worse, easy to misread.
RANK: Final = 40
#: Shown at once by the verdict's hysteresis (`client.hysteresis`), without waiting to persist.
URGENT: Final = False
#: The loop waits for data in it (the margin on the wait fraction applies when it is shown).
LOOP_WAITS: Final = True


def judge(facts: Facts) -> Verdict | None:
    main_bound = main_bound_evidence(facts, facts.previous) if facts.uses_workers else None
    return _main_bound_verdict(facts, main_bound) if main_bound is not None else None


def restate(facts: Facts) -> Verdict | None:
    """Its words for today's figures while the hysteresis holds it (`client.hysteresis`): the
    split of the wait and the queue samples it quotes are today's, on whichever side of their
    thresholds (docs/diagnosis.md, "Hysteresis")."""
    if not facts.uses_workers or not facts.window_judged:
        return None
    main_bound = main_bound_evidence(facts, facts.previous)
    return _main_bound_verdict(facts, main_bound if main_bound is not None else _readings(facts))


def _main_bound_verdict(facts: Facts, main_bound: list[str]) -> Verdict:
    evidence = [wait_line(facts), *main_bound]
    advice = main_process_advice(facts)
    saturation = cpu_saturation(facts, facts.previous)
    if saturation is not None:
        evidence += saturation[0]
        fewer = fewer_workers_text(facts)
        advice.append("the CPU is saturated too: the workers compete with the main process"
                      + ("" if fewer == "more workers will not help" else f"; {fewer}"))
    return make_verdict(CATEGORY,
                        f"{waits_text(facts)} although batches are ready: the main process is the "
                        "limit", evidence + gpu_lines(facts), advice)


def main_bound_evidence(facts: Facts, previous: Category | None) -> list[str] | None:
    """Evidence that the main process is the limit, or None.

    Where stages are known the measured split of the wait decides, and the queue samples ("a
    batch was ready while the loop waited", vetoed when the loop's thread was off the CPU) must
    not contradict it: when the main process is the limit the workers run ahead and batches pile
    up. A long handoff with no batch waiting means the batches leave the workers late, not that
    the loop is slow to take them — measured here: a worker computing in pure Python (holding the
    GIL its queue's feeder thread needs) showed 75–100 % handoff, p50 about one whole fetch, and
    no second batch ready in any sample; 4 CPU-burning workers and a busy loop on 2 cores showed
    68 % handoff with the loop's thread off the CPU. Where the split is unknown (in_order=False,
    an unknown torch layout) the queue samples decide alone.
    """
    held = previous == CATEGORY
    handoff = facts.handoff_share()
    lines: list[str] = []
    if handoff is not None:
        threshold = HANDOFF_LEAVE if held else HANDOFF_MAIN_BOUND
        if handoff < threshold:
            return None
        margin = (f", held until below {say_fraction(HANDOFF_LEAVE)}" if handoff < HANDOFF_MAIN_BOUND
                  else "")
        lines = [f"{say_fraction(handoff)} of the wait came after the batch was produced: handing it "
                 f"to the loop (threshold {say_fraction(HANDOFF_MAIN_BOUND)}{margin})"]
        handoff_ms = stat(facts.source.stages.handoff_ms)
        if handoff_ms is not None:
            lines.append(f"handoff {say_ms(handoff_ms)} per batch (p50)")
    queue = facts.source.queue
    ready_when_waiting = finite(queue.ready_when_waiting)
    if ready_when_waiting is None:
        return lines or None  # no queue samples: the split alone, where there is one
    ready_threshold = READY_WHEN_WAITING_LEAVE if held else READY_WHEN_WAITING_MAIN_BOUND
    loop_cpu = finite(queue.loop_cpu_when_waiting)
    loop_blocked = loop_cpu is not None and loop_cpu < LOOP_CPU_MAIN_BOUND_MIN
    if ready_when_waiting < ready_threshold or loop_blocked:
        return None
    margin = (f", held until below {say_fraction(READY_WHEN_WAITING_LEAVE)}"
              if ready_when_waiting < READY_WHEN_WAITING_MAIN_BOUND else "")
    return [*lines, f"a batch was ready in {say_fraction(ready_when_waiting)} of the samples while "
            f"the loop waited (threshold {say_fraction(READY_WHEN_WAITING_MAIN_BOUND)}{margin})"]


def _readings(facts: Facts) -> list[str]:
    """The two figures `main_bound_evidence` decides by, beside their thresholds, whichever side
    they are on."""
    handoff = facts.handoff_share()
    ready = finite(facts.source.queue.ready_when_waiting)
    lines = []
    if handoff is not None:
        lines.append(f"{say_fraction(handoff)} of the wait came after the batch was produced "
                     f"(threshold {say_fraction(HANDOFF_MAIN_BOUND)})")
    if ready is not None:
        lines.append(f"a batch was ready in {say_fraction(ready)} of the samples while the loop "
                     f"waited (threshold {say_fraction(READY_WHEN_WAITING_MAIN_BOUND)})")
    return lines


# torch 2.13's default sharing strategy (file_descriptor) sends each tensor's storage as a file
# descriptor that the main process fetches from the worker's resource-sharer thread, one
# connection a tensor: the loop's thread sat off the CPU half of the handoff for batches of 64
# tensors of 8 B, and file_system gave 146-165 batches/s against 42-47 (2 workers, fork, spawn
# and forkserver, measured here). Each process has its own setting: spawn and forkserver workers
# take it from the script's module level, which they import again, not from the main process.
_SHARE_BY_FILE_NAME = (
    "if the batch must keep its tensors: torch.multiprocessing.set_sharing_strategy('file_system') "
    "at the top of the training script (module level, so that spawn and forkserver workers run it "
    "too): a tensor then crosses by a shared-memory file name instead of a file descriptor the main "
    "process fetches from the worker one at a time; a process killed meanwhile can leave torch_* "
    "files in /dev/shm")


def main_process_advice(facts: Facts) -> list[str]:
    config = facts.source.config
    stages = facts.source.stages
    advice = ["more workers will not help: the main process receives and unpickles every batch"]
    tensors, size = stages.tensors_per_batch, stages.bytes_per_batch
    if tensors is not None and size is not None and tensors >= MANY_TENSORS_PER_BATCH \
            and size / tensors < SMALL_TENSOR_BYTES:
        advice.insert(0, f"a batch holds {tensors} tensors of {say_bytes(size / tensors)} on average: "
                         "the handoff pays per tensor (a shared-memory handle and a file descriptor "
                         "each); stack them into a few large tensors in collate_fn")
        advice.insert(1, _SHARE_BY_FILE_NAME)
    elif tensors is None or tensors >= MANY_TENSORS_PER_BATCH:
        # Unknown (no census yet, or a batch too large to count), or many large tensors: the
        # general advice. Where the workers counted a few tensors, it would be wrong to give.
        advice.append("return fewer, larger tensors per batch (one stacked tensor instead of lists "
                      "or dicts of many small ones): each tensor crosses processes with its own "
                      "shared-memory handle")
    advice.append("use a cheap collate_fn: stack in the workers, avoid Python-object batches")
    if config.pin_memory:
        advice.append("pin_memory=True copies every batch in a thread of the main process: compare "
                      "with pin_memory=False")
    rate = finite(facts.source.batches_per_s)
    if rate is not None and rate >= TINY_BATCHES_PER_S:
        batch_size = config.batch_size
        target = f"try batch_size={batch_size * 4}" if batch_size else "increase batch_size"
        advice.append(f"{say_number(rate)} batches/s each cost ~0.5 ms to receive: {target}")
    return advice

