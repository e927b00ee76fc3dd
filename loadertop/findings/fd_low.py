"""fd_low: a process close to its open-file limit."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import (
    Finding,
    ProcessFigures,
    SourceFigures,
    SystemFigures,
    WorkerFigures,
)
from loadertop.client.units import say_fraction
from loadertop.findings._common import finding, names, one, resource_workers

KIND: Final = "fd_low"

#: Open file descriptors at this share of the soft RLIMIT_NOFILE.
FD_USED_SHARE: Final = 0.8


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    workers = resource_workers(source)
    found = _fd_low(source, source.process, workers) if workers is not None else None
    return [found] if found is not None else []


def _fd_low(source: SourceFigures, process: ProcessFigures,
           workers: list[WorkerFigures]) -> Finding | None:
    limit = process.fd_limit
    if not limit:
        return None
    threshold = FD_USED_SHARE * limit
    main = process.fds is not None and process.fds >= threshold
    hit = [w for w in workers if w.fds is not None and w.fds >= threshold]
    if not main and not hit:
        return None
    evidence = []
    who = []
    if main:
        who.append("the training process")
        evidence.append(f"training process: fds {process.fds} of limit {limit} "
                        f"(threshold {say_fraction(FD_USED_SHARE)})")
    for w in hit:
        evidence.append(f"worker {w.id}: fds {w.fds} of limit {limit}, the training process's "
                        f"(threshold {say_fraction(FD_USED_SHARE)})")
    ids = [w.id for w in hit]
    if hit:
        who.append(names(ids))
    summary = (f"{' and '.join(who)} {'is' if len(who) == 1 and len(ids) <= 1 else 'are'} "
               "close to the open-file limit (\"received 0 items of ancdata\", "
               "\"Too many open files\")")
    advice = [
        "torch.multiprocessing.set_sharing_strategy('file_system') at the top of the training "
        "script (module level, so that spawn and forkserver workers run it too: each process has "
        "its own setting): a tensor then crosses to the main process by a file name, not a file "
        "descriptor",
        f"or raise the limit (now {limit}): ulimit -n 65536 before starting, or "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard)) at the start",
    ]
    if source.config.num_workers:
        advice.append("fewer tensors in flight: collate a batch into a few large tensors, or a "
                      "smaller prefetch_factor")
    worker = one(ids) if not main else None
    return finding("fd_low", "warning", source.id, worker, summary, evidence, advice)
