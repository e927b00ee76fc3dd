"""Recordings made of the fakes' real wire messages: `LoaderSim`/`MachineSim` reports, encoded by
`wire.encode` and written by the real `RecordingWriter` with their send times as receive times,
so a test reads them back through `recording.file.read` and `Playback` as it would a file
`loadertop record` wrote.

    rec = Recorder(path, [LoaderSim()], [MachineSim()])
    rec.run(T0, T0 + 30)          # 30 s of reports (4 a second per loader, 1 per machine)
    loader.wait_fraction = 0.6    # change what the loader does, then go on
    rec.run(T0 + 30, T0 + 60)
    rec.close()

Also `needed`: what a recording test needs from outside Python (matplotlib, a browser) skips the
test where it is missing on a developer's machine, and fails it in CI (`.ci/run` sets
LOADERTOP_CI=1 after installing them), so CI never passes by skipping.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from loadertop import wire
from loadertop.recording.file import RecordingWriter

from fakes import MACHINE_S, REPORT_S, LoaderSim, MachineSim


class Recorder:
    def __init__(self, path: Path | str, loaders: Sequence[LoaderSim], machines: Sequence[MachineSim],
                 *, argv: Sequence[str] = ("loadertop", "record", "-o", "run.ltrec")) -> None:
        self.path = str(path)
        self.loaders = list(loaders)
        self.machines = list(machines)
        self.writer = RecordingWriter(self.path, argv=list(argv))

    def add(self, msg: wire.Message, at: float, endpoint: str | None) -> None:
        self.writer.add(wire.encode(msg), at, endpoint)

    def run(self, start: float, end: float) -> None:
        """Every report sent in (start, end], as `fakes.Scenario.run` delivers them."""
        ticks = round((end - start) / REPORT_S)
        for k in range(1, ticks + 1):
            t = start + k * REPORT_S
            for loader in self.loaders:
                self.add(loader.report(t, end), t, loader.endpoint)
            if k % round(MACHINE_S / REPORT_S) == 0:
                for machine in self.machines:
                    sender = next((s for s in self.loaders if s.host == machine.host), None)
                    self.add(machine.report(t), t, sender.endpoint if sender else None)

    def close(self) -> None:
        self.writer.close()


def needed(available: object, reason: str) -> None:
    """Skip the test unless `available`; in CI (LOADERTOP_CI set) fail it instead."""
    if available:
        return
    if os.environ.get("LOADERTOP_CI"):
        pytest.fail(f"{reason} (CI installs it: this test must run there)")
    pytest.skip(reason)
