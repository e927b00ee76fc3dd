"""The machine's figures as a wire message, sampled on the trainer's side of the wire."""

from __future__ import annotations

import time

import msgspec

from loadertop import wire
from loadertop.system import SystemSampler


class SystemFeed:
    def __init__(self, host: str) -> None:
        self.host = host
        self.seq = 0
        self.sampler = SystemSampler()

    def report(self) -> wire.SystemReport | None:
        doc = self.sampler.sample()
        doc.pop("host", None)
        msg = msgspec.convert(
            {**doc, "host": self.host, "seq": self.seq, "sent_at": time.time()},
            wire.SystemReport,
        )
        self.seq += 1
        return msg
