"""The machine's figures as a wire message, sampled on the trainer's side of the wire."""

from __future__ import annotations

import os
import time

import msgspec

from loadertop import environment, wire
from loadertop.system import SystemSampler
from loadertop.system.host import DEFAULT_SHM_PATH, shm_figures

SHM_PATH_MAX = 256


class SystemFeed:
    def __init__(self, host: str) -> None:
        self.host = host
        self.seq = 0
        self.sampler = SystemSampler()
        # Where workers' shared memory lives; a test points it at a small file system.
        self.shm_path = os.environ.get(environment.LOADERTOP_SHM_PATH) or DEFAULT_SHM_PATH

    def report(self) -> wire.SystemReport | None:
        doc = self.sampler.sample()
        doc.pop("host", None)
        doc.update(shm_figures(self.shm_path))
        doc["shm_path"] = doc["shm_path"][:SHM_PATH_MAX]  # the wire's ShortText: never fail on it
        msg = msgspec.convert(
            {**doc, "host": self.host, "seq": self.seq, "sent_at": time.time()},
            wire.SystemReport,
        )
        self.seq += 1
        return msg
