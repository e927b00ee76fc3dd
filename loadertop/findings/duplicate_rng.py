"""duplicate_rng: workers started with the same random state, so their augmentations repeat."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import (
    Finding,
    SourceFigures,
    SystemFigures,
)
from loadertop.findings._common import finding

KIND: Final = "duplicate_rng"


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    return _duplicate_rng(source)


def _duplicate_rng(source: SourceFigures) -> list[Finding]:
    out = []
    for share in source.rng.shared:
        workers = ", ".join(str(w) for w in share.workers)
        global_state = share.state in ("random", "numpy global", "torch")
        summary = (f"workers {workers} started with the same {share.state} state: their random "
                   "augmentations repeat")
        evidence = [f"{len(share.workers)} of the {source.rng.checked_workers} workers read "
                    f"started with an identical {share.state} state (digests compared once per "
                    "worker start, never drawn from)"]
        if global_state:
            advice = ["torch seeds random, numpy and torch differently in every worker: a "
                      "worker_init_fn re-seeds them alike; derive the seed from "
                      "torch.initial_seed() (e.g. np.random.seed(torch.initial_seed() % 2**32))"]
        else:
            advice = ["make the generator inside each worker: in __getitem__, "
                      "`if self.rng is None: self.rng = np.random.default_rng(torch.initial_seed())`"
                      " (torch gives every worker its own seed)",
                      "or in a worker_init_fn: `info = torch.utils.data.get_worker_info(); "
                      "info.dataset.rng = np.random.default_rng(info.seed)` (seed §5.3)"]
        out.append(finding("duplicate_rng", "warning", source.id, None, summary, evidence, advice))
    return out
