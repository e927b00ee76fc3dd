"""compute_bound: the loader keeps up; the training step is the limit (healthy)."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import Verdict
from loadertop.client.units import (
    say_fraction,
    say_ms,
    say_number,
    say_percent,
)
from loadertop.diagnosis.facts import Facts, make_verdict, source_gpus
from loadertop.diagnosis.readings import finite
from loadertop.diagnosis.thresholds import (
    GPU_UNDERUSED_PERCENT,
    WAIT_FRACTION_COMPUTE_BOUND,
    WAIT_FRACTION_INPUT_BOUND,
)

CATEGORY: Final = "compute_bound"
#: How the screen and the report name and colour it (a Rich colour; `views.palette` reads these).
WORDS: Final = "Healthy: compute-bound"
COLOUR: Final = "green"
LEVEL: Final = "ok"  # the banner's CSS class suffix: ok / warn / bad / none
#: Its place in `overall`'s order, most urgent first: healthy, but running: it says more than
#: insufficient_data.
RANK: Final = 70
#: Shown at once by the verdict's hysteresis (`client.hysteresis`), without waiting to persist.
URGENT: Final = False
#: The loop waits for data in it (the margin on the wait fraction applies when it is shown).
LOOP_WAITS: Final = False


def judge(facts: Facts) -> Verdict | None:
    """The loop waits less than WAIT_FRACTION_INPUT_BOUND of the time; once it was shown waiting
    for data, it comes back only below WAIT_FRACTION_COMPUTE_BOUND (a margin against flicker)."""
    threshold = (WAIT_FRACTION_COMPUTE_BOUND if facts.previous_loop_waits
                 else WAIT_FRACTION_INPUT_BOUND)
    if facts.wait_fraction < threshold:
        return _compute_bound_verdict(facts)
    return None


def restate(facts: Facts) -> Verdict | None:
    """Its words for today's figures while the hysteresis holds it (`client.hysteresis`): the
    wait fraction it quotes is the window's, whatever it is now (docs/diagnosis.md,
    "Hysteresis")."""
    return _compute_bound_verdict(facts) if facts.window_judged else None


def _compute_bound_verdict(facts: Facts) -> Verdict:
    wait_fraction = facts.wait_fraction
    evidence = [f"wait fraction {say_fraction(wait_fraction)} "
                f"(threshold {say_fraction(WAIT_FRACTION_INPUT_BOUND)})"]
    queue = facts.source.queue
    ready_mean, capacity = finite(queue.ready_mean), queue.capacity
    if ready_mean is not None and capacity:
        evidence.append(f"queue {say_number(ready_mean)} of {capacity} batches ready on average")
    if facts.step_ms is not None:
        evidence.append(f"step p50 {say_ms(facts.step_ms)}")
    summary = (f"the loader keeps up (the loop waits {say_fraction(wait_fraction)}): the training step "
               "is the limit")
    advice = ["nothing to fix in loading"]
    idle_gpus = []
    for gpu in source_gpus(facts):
        util = finite(gpu.util_percent)
        if util is not None:
            evidence.append(f"GPU {gpu.index} util {say_percent(util)} "
                            f"(threshold {say_percent(GPU_UNDERUSED_PERCENT)})")
            if util < GPU_UNDERUSED_PERCENT:
                idle_gpus.append(gpu.index)
    if idle_gpus:
        summary = (f"the loader keeps up, but the step itself leaves GPU "
                   f"{', '.join(str(i) for i in idle_gpus)} idle")
        advice = ["nothing to fix in loading: the step itself leaves the GPU idle; profile it "
                  "(torch.profiler): host-side Python, .item()/.cpu() syncs, many small kernels",
                  "try a larger batch_size, mixed precision (torch.autocast) or torch.compile"]
    return make_verdict(CATEGORY, summary, evidence, advice)

