"""input_bound_io: the loop waits for data; the workers (or the main process, fetching itself) wait
on storage or network."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import Verdict
from loadertop.diagnosis.facts import Facts, make_verdict
from loadertop.diagnosis.loop_waits import (
    IoReading,
    gpu_lines,
    io_reading,
    producing_evidence,
    stage_advice,
    wait_line,
    waits_text,
)
from loadertop.diagnosis.slow_worker import slow_worker_advice
from loadertop.diagnosis.worker_advice import worker_count_advice

CATEGORY: Final = "input_bound_io"
#: How the screen and the report name and colour it (a Rich colour; `views.palette` reads these).
WORDS: Final = "Input-bound: waiting on I/O"
COLOUR: Final = "yellow"
LEVEL: Final = "warn"  # the banner's CSS class suffix: ok / warn / bad / none
#: Its place in `overall`'s order, most urgent first: before input_bound_cpu: the storage fix
#: (format, caching) is the longer job and a slow disk slows every reader of it.
RANK: Final = 50
#: Shown at once by the verdict's hysteresis (`client.hysteresis`), without waiting to persist.
URGENT: Final = False
#: The loop waits for data in it (the margin on the wait fraction applies when it is shown).
LOOP_WAITS: Final = True


def judge(facts: Facts) -> Verdict | None:
    reading = io_reading(facts)
    return _io_verdict(facts, reading) if reading.io_bound else None


def restate(facts: Facts) -> Verdict | None:
    """Its words for today's figures while the hysteresis holds it (`client.hysteresis`): the
    fetching side's CPU share it quotes is today's, on whichever side of the boundary."""
    return _io_verdict(facts, io_reading(facts)) if facts.window_judged else None


def _io_verdict(facts: Facts, reading: IoReading) -> Verdict:
    slow = facts.slow_worker
    advice = [slow_worker_advice(slow)] if slow is not None else worker_count_advice(facts, "io")
    who = "the workers" if facts.uses_workers else "the main process, fetching itself,"
    return make_verdict(CATEGORY,
                        f"{waits_text(facts)} for data; {who} "
                        f"wait{'s' if not facts.uses_workers else ''} on storage or network",
                        [wait_line(facts), *producing_evidence(facts), reading.fraction_line,
                         *reading.io_lines, *gpu_lines(facts)],
                        advice + stage_advice(facts))

