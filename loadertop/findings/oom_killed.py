"""oom_killed: the training process was killed by the kernel's OOM killer — its memory cgroup
counted the kill — or likely so (it died without a goodbye with its memory near a limit). Read
from the source's `end` (docs/contract.md §9): its black box, its launcher and its cgroup tell it."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import Finding, SourceFigures, SystemFigures
from loadertop.findings._common import finding

KIND: Final = "oom_killed"


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    end = source.end
    if end is None or end.how != "died" or end.oom_killer is None:
        return []
    who = f"the training process (pid {source.pid})"
    if end.oom_killer == "counted":
        summary = f"{who} was killed by the kernel's OOM killer"
        advice = []
    else:
        summary = f"{who} was killed, likely by the kernel's OOM killer"
        advice = ["confirm it: `dmesg -T | grep -i -E 'out of memory|killed process'` (or the "
                  "container's OOM events)"]
    advice += [
        "what filled the memory: the memory_growth and copy_on_read findings before the end, and "
        "the memory plots of `loadertop report last`",
        "each worker copies what it reads from lists or dicts of Python objects (copy-on-read, "
        "pytorch#13246): keep the dataset in numpy arrays or tensors; fewer workers or a smaller "
        "prefetch_factor / batch_size hold less",
        "or give the job more memory: its cgroup's limit (the container's, the pod's, Slurm's --mem)",
    ]
    return [finding(KIND, "critical", source.id, None, summary, [end.error or end.ended], advice)]
