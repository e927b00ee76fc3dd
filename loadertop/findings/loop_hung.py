"""loop_hung: the training loop blocked in next() far longer than its recent waits."""

from __future__ import annotations

from typing import Final

from loadertop import diagnosis
from loadertop.client.document import (
    Finding,
    SourceFigures,
    SystemFigures,
)
from loadertop.client.units import say_ms
from loadertop.findings._common import LIVE_STATES, finding, where_in

KIND: Final = "loop_hung"


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    return _loop_hung(source) if source.state in LIVE_STATES else []


def _loop_hung(source: SourceFigures) -> list[Finding]:
    blocked = source.blocked_ms
    if blocked is None:
        return []
    threshold = diagnosis.stall_threshold_ms(source.wait_ms, source.batches_total)
    if blocked < threshold:
        return []
    where = where_in(source.loop_stack)
    summary = f"the training loop has been blocked in next() for {say_ms(blocked)}"
    summary += f", at {where}" if where else ""
    evidence = [f"blocked in next() for {say_ms(blocked)} (threshold {say_ms(threshold)})"]
    busy = [w for w in source.workers if w.busy_ms is not None and w.alive is not False]
    if source.config.num_workers:
        if busy:
            evidence.append("workers inside a batch: " + ", ".join(
                f"{w.id} for {say_ms(w.busy_ms or 0.0)}" for w in busy[:8]))
        elif source.queue.ready:
            evidence.append(f"{source.queue.ready} batches ready: the main process itself is "
                            "stuck (receiving, unpickling, pin_memory)")
    advice = ["the stack shows where the loop waits"]
    if busy:
        advice.append("the loop waits for a worker: see that worker's finding for its stack")
    advice.append("pass timeout=SECONDS to the DataLoader to turn a hang into an error")
    return [finding("loop_hung", "critical", source.id, None, summary, evidence, advice,
                    source.loop_stack)]
