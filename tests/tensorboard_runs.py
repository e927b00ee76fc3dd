"""TensorBoard's own reading of event files (`EventAccumulator`), for `loadertop export
--tensorboard`'s tests: what `tensorboard --logdir` would show.

`tensorboard` is a test dependency (pyproject's test extra, installed with torch held by the
constraint); where it is missing a test skips, and under CI (LOADERTOP_CI) fails (`needed`).
"""

from __future__ import annotations

from pathlib import Path

from recorded import needed

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:  # a developer's machine without it: the tests that read runs skip
    EventAccumulator = None


def scalars(run: Path) -> dict[str, list[tuple[int, float, float]]]:
    """{tag: [(step, value, wall_time), ...]} of one run directory, as TensorBoard reads it
    (every point kept: no sampling)."""
    needed(EventAccumulator is not None, "tensorboard is not installed (pip install tensorboard)")
    accumulator = EventAccumulator(str(run), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}
