"""shm_low: /dev/shm nearly full (the machine's own finding: workers hand batches over through it)."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import (
    Finding,
    SystemFigures,
)
from loadertop.client.units import say_bytes, say_fraction
from loadertop.findings._common import finding

_MIB: Final = 1024 * 1024

KIND: Final = "shm_low"

#: /dev/shm free below this share of its size ...
SHM_FREE_MIN_SHARE: Final = 0.1
#: ... or below this much (a batch of 64 RGB 224x224 images as float32 is 37 MiB).
SHM_FREE_MIN_BYTES: Final = 32 * _MIB


def detect(system: SystemFigures) -> list[Finding]:
    found = _shm_low(system)
    return [found] if found is not None else []


def _shm_low(system: SystemFigures) -> Finding | None:
    shm = system.shm
    if shm is None or shm.total_bytes <= 0:
        return None
    free = min(shm.free_bytes, shm.total_bytes)
    share = free / shm.total_bytes
    if share >= SHM_FREE_MIN_SHARE and free >= SHM_FREE_MIN_BYTES:
        return None
    summary = (f"{shm.path} is nearly full: {say_bytes(free)} free of "
               f"{say_bytes(shm.total_bytes)} (workers hand batches over through it; full, "
               "they die of SIGBUS)")
    evidence = [f"{shm.path}: {say_bytes(free)} free of {say_bytes(shm.total_bytes)}, "
                f"{say_fraction(share)} (threshold: {say_fraction(SHM_FREE_MIN_SHARE)} or "
                f"{say_bytes(SHM_FREE_MIN_BYTES)})"]
    advice = [
        "in Docker, a bigger --shm-size (the default is 64 MiB), e.g. docker run --shm-size=8g "
        "(or --ipc=host); in Kubernetes an emptyDir with medium: Memory mounted at /dev/shm",
        "fewer workers or a smaller prefetch_factor: every batch in flight lives there",
        f"files left in {shm.path} by killed jobs (torch_* with the file_system sharing "
        "strategy) hold space until removed",
    ]
    return finding("shm_low", "warning", None, None, summary, evidence, advice)
