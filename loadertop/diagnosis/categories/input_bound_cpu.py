"""input_bound_cpu: the loop waits for data; the workers (or the main process, fetching itself)
compute, and CPU is left. The last rule of the ladder: it always gives a verdict."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import Verdict
from loadertop.client.units import (
    say_cores,
    say_percent,
)
from loadertop.diagnosis.facts import Facts, make_verdict
from loadertop.diagnosis.loop_waits import (
    gpu_lines,
    io_reading,
    producing_evidence,
    stage_advice,
    wait_line,
    waits_text,
)
from loadertop.diagnosis.readings import finite
from loadertop.diagnosis.slow_worker import slow_worker_advice
from loadertop.diagnosis.worker_advice import worker_count_advice

CATEGORY: Final = "input_bound_cpu"
#: How the screen and the report name and colour it (a Rich colour; `views.palette` reads these).
WORDS: Final = "Input-bound: workers CPU-limited"
COLOUR: Final = "yellow"
LEVEL: Final = "warn"  # the banner's CSS class suffix: ok / warn / bad / none
#: Its place in `overall`'s order, most urgent first: usually fixed with one number.
RANK: Final = 60
#: Shown at once by the verdict's hysteresis (`client.hysteresis`), without waiting to persist.
URGENT: Final = False
#: The loop waits for data in it (the margin on the wait fraction applies when it is shown).
LOOP_WAITS: Final = True


def judge(facts: Facts) -> Verdict:
    """The rest, once every rule above declined: the loop waits and the workers compute."""
    reading = io_reading(facts)
    evidence = [wait_line(facts), *producing_evidence(facts), reading.fraction_line]
    busy = finite(facts.system.cpu_percent)
    if busy is not None:
        cores_text = f" ({say_cores(facts.cores)} available)" if facts.cores else ""
        evidence.append(f"CPU {say_percent(busy)} busy{cores_text}")
    computes = "the workers compute" if facts.uses_workers else "the main process fetches itself"
    slow = facts.slow_worker
    advice = [slow_worker_advice(slow)] if slow is not None else worker_count_advice(facts, "cpu")
    return make_verdict(CATEGORY, f"{waits_text(facts)} for data; {computes} and CPU is left",
                        evidence + reading.io_lines + gpu_lines(facts), advice + stage_advice(facts))


def restate(facts: Facts) -> Verdict | None:
    """Its words for today's figures while the hysteresis holds it (`client.hysteresis`)."""
    return judge(facts) if facts.window_judged else None
