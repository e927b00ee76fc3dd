"""slow_worker: one worker far slower per batch than the others holds the in-order queue back
(the rule is the diagnosis' own: `loadertop.diagnosis.slow_worker`)."""

from __future__ import annotations

from typing import Final

from loadertop import diagnosis
from loadertop.client.document import (
    Finding,
    SourceFigures,
    SystemFigures,
)
from loadertop.client.units import say_fraction
from loadertop.findings._common import finding

KIND: Final = "slow_worker"


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    return _slow_worker(source)


def _slow_worker(source: SourceFigures) -> list[Finding]:
    slow = diagnosis.slow_worker(source) if source.config.num_workers > 1 else None
    if slow is None:
        return []
    w = slow.worker
    evidence = [diagnosis.slow_worker_line(slow),
                f"the loop waits {say_fraction(source.wait_fraction or 0.0)} of the time "
                "(in-order delivery: every round waits for the slowest worker)"]
    ratio = diagnosis.slow_ratio_text(slow).replace("far more than", "far")
    return [finding("slow_worker", "warning", source.id, w.id,
                    f"worker {w.id} is {ratio} slower per batch than the others and holds the "
                    "in-order queue back", evidence, [diagnosis.slow_worker_advice(slow)])]
