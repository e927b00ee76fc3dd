"""insufficient_data: too few batches in the window to judge (or the wait fraction unknown)."""

from __future__ import annotations

import math
from typing import Final

from loadertop.client.document import Verdict
from loadertop.client.units import say_ms
from loadertop.diagnosis.categories.stalled import stall_threshold_ms
from loadertop.diagnosis.facts import Facts, make_verdict
from loadertop.diagnosis.readings import finite, stat
from loadertop.diagnosis.thresholds import (
    MIN_BATCHES,
    MIN_BATCHES_SLOW,
    SLOW_WINDOW_MIN_MS,
)

CATEGORY: Final = "insufficient_data"
#: How the screen and the report name and colour it (a Rich colour; `views.palette` reads these).
WORDS: Final = "Gathering data"
COLOUR: Final = "#9e9e9e"
LEVEL: Final = "none"  # the banner's CSS class suffix: ok / warn / bad / none
#: Its place in `overall`'s order, most urgent first: after compute_bound (which says more), before
#: idle (which says less).
RANK: Final = 80
#: Shown at once by the verdict's hysteresis (`client.hysteresis`), without waiting to persist.
URGENT: Final = False
#: The loop waits for data in it (the margin on the wait fraction applies when it is shown).
LOOP_WAITS: Final = False


def judge(facts: Facts) -> Verdict | None:
    """Judged after `idle`: with no batch in the window, the loop is waiting for one."""
    src = facts.source
    batches = src.batches
    blocked = finite(src.blocked_ms)
    if not batches and blocked is not None:
        threshold = stall_threshold_ms(src.wait_ms, src.batches_total)
        return make_verdict(CATEGORY, f"waiting for a batch for {say_ms(blocked)}",
                            ["0 batches in the window", f"blocked in next() for {say_ms(blocked)} "
                             f"(stall threshold {say_ms(threshold)})"],
                            ["wait: workers may still be starting"])
    covered = None
    wait_mean, step_mean = stat(src.wait_ms, "mean"), stat(src.step_ms, "mean")
    if wait_mean is not None and step_mean is not None:
        covered = batches * (wait_mean + step_mean)
    slow_enough = (batches >= MIN_BATCHES_SLOW and covered is not None
                   and covered >= SLOW_WINDOW_MIN_MS)
    if batches < MIN_BATCHES and not slow_enough:
        return make_verdict(CATEGORY,
                            f"{batches} batches in the window: too few to judge",
                            [f"{batches} batches (need {MIN_BATCHES})"], ["wait for more batches"])
    if math.isnan(facts.wait_fraction):
        return make_verdict(CATEGORY, "the wait fraction is unknown",
                            [f"{batches} batches, wait fraction unknown"],
                            ["wait for the next refresh"])
    return None


def restate(facts: Facts) -> Verdict | None:
    """Its words for today's figures while the hysteresis holds it (`client.hysteresis`): only
    while its condition still holds; once it is over there is nothing true to say under it, and
    the change shows at once (docs/diagnosis.md, "Hysteresis")."""
    return judge(facts)
