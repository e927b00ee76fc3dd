"""`loadertop export --tensorboard DIR`: the sources watched, as TensorBoard scalars.

One run per source, `DIR/<host>-<pid>-<loader>`, so that `tensorboard --logdir DIR` (or a logdir
above it that holds the training's own runs) shows them beside the training's curves. Every
`every_s` seconds the writer's thread takes the exporter's latest document (the same immutable
object a scrape reads: nothing is shared with the receive loop but that reference) and appends
one event per source: the scalars of `client.tracker_keys` — the keys `loadertop.metrics()`
logs, `loadertop/<loader>/wait_fraction`, … — at step = the source's batches so far, then flushes
every file it wrote to. `close()` writes the latest document once more and closes the files:
`loadertop export` calls it on SIGINT/SIGTERM, so what was watched up to the end is on disk
(TensorBoard's own writer keeps up to 120 s in memory).

The step is the source's `batches_total` (for a training loader, the optimizer's steps times
the gradient accumulation), never going back within a run: TensorBoard drops every point at and
after a step that is written again lower (it takes that for a restart). A source that is gone or
finished gets one last point, then none; one that leaves the document closes its file.

Everything here came from sockets: the run's name is the source's host, pid and name with
anything but letters, digits, `.`, `_` and `-` replaced, so a peer cannot name a path outside
DIR. A write that fails (a full disk, a directory that cannot be made) is one line on stderr —
until a write succeeds again — and is tried again at the next round, in a new file (a partly
written record ends the one it was in); the exporter and its Prometheus side go on.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Final

from loadertop.client.document import Document, Source
from loadertop.client.tracker_keys import DOWN_STATES, prefix_of, source_metrics
from loadertop.exporter.event_file import record, scalars_event, version_event

WRITE_EVERY_S: Final = 5.0
MAX_OPEN_RUNS: Final = 256  # event files kept open between rounds
MAX_RUN_NAME: Final = 200  # characters of a run's directory name
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]")


def run_name(source: Source) -> str:
    """`<host>-<pid>-<loader>`, safe as one directory name."""
    name = _UNSAFE.sub("_", f"{source.host}-{source.pid}-{source.name}")[:MAX_RUN_NAME]
    return "_" + name[1:] if name.startswith(".") else name


class _Run:
    """One source's run: its directory, its current event file, where its steps stand."""

    __slots__ = ("directory", "path", "file", "step", "down_written", "files")

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path: Path | None = None  # the event file written to (reopened to append)
        self.file: BinaryIO | None = None  # open, or None (closed to keep MAX_OPEN_RUNS)
        self.step = 0
        self.down_written = False  # the last point of a source gone or finished is written
        self.files = 0  # event files begun so far (their names' last part)

    def open(self, wall_time: float) -> BinaryIO:
        if self.file is not None:
            return self.file
        if self.path is not None:
            self.file = open(self.path, "ab")
            return self.file
        self.directory.mkdir(parents=True, exist_ok=True)
        # TensorBoard reads every file of a run whose name holds "tfevents", in name order.
        path = self.directory / (f"events.out.tfevents.{int(wall_time):010d}."
                                 f"{socket.gethostname()}.{os.getpid()}.{self.files}")
        self.files += 1
        file = open(path, "ab")
        try:
            file.write(record(version_event(wall_time)))
        except OSError:
            file.close()
            raise
        self.path, self.file = path, file
        return file

    def close(self, failed: bool = False) -> None:
        """Closed (reopened to append at the next point); `failed`: the next point begins a new
        file, a partly written record having ended this one for TensorBoard."""
        file, self.file = self.file, None
        if failed:
            self.path = None
        if file is not None:
            try:
                file.close()
            except OSError:
                self.path = None  # what its buffer held is lost: begin anew


class TensorBoardWriter:
    """Writes the sources of `latest()`'s document under `directory`, every `every_s` seconds on
    its own thread (`start`), and once more at `close`."""

    def __init__(self, directory: Path, latest: Callable[[], Document | None], *,
                 every_s: float = WRITE_EVERY_S,
                 warn: Callable[[str], None] | None = None) -> None:
        self.directory = directory
        self.every_s = every_s
        self._latest = latest
        self._warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        self._runs: dict[str, _Run] = {}  # by source id
        self._names: dict[str, str] = {}  # run name -> the source id that has it
        self._written: Document | None = None
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one round at a time (the thread's, close()'s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="loadertop-tensorboard",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.write()

    def close(self) -> None:
        """The latest document written, every file closed (the thread stopped first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.write()
        with self._lock:
            for run in self._runs.values():
                run.close()

    def _run(self, source: Source) -> _Run:
        run = self._runs.get(source.id)
        if run is None:
            base = name = run_name(source)
            n = 1
            while self._names.get(name, source.id) != source.id:  # taken by another source
                n += 1
                name = f"{base}-{n}"
            self._names[name] = source.id
            run = self._runs[source.id] = _Run(self.directory / name)
        return run

    def write(self) -> None:
        """One round: a point per source of the latest document (if not written already), then
        every file written to flushed."""
        document = self._latest()
        with self._lock:
            if document is None or document is self._written:
                return
            self._written = document
            wall_time = document.taken_at
            written: list[_Run] = []
            errors: list[str] = []
            for source in document.sources:
                run = self._run(source)
                if source.state in DOWN_STATES:
                    if run.down_written:
                        continue
                    run.down_written = True
                else:
                    run.down_written = False
                run.step = max(run.step, source.batches_total)
                event = scalars_event(wall_time, run.step,
                                      source_metrics(source, prefix_of(source)).items())
                try:
                    run.open(wall_time).write(record(event))
                    written.append(run)
                except OSError as exc:
                    run.close(failed=True)
                    errors.append(f"{run.directory}: {exc.strerror or exc}")
            for run in written:
                try:
                    if run.file is not None:
                        run.file.flush()
                except OSError as exc:
                    run.close(failed=True)
                    errors.append(f"{run.directory}: {exc.strerror or exc}")
            self._forget(document)
            if errors and not self._failing:
                more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
                self._warn(f"loadertop export: cannot write TensorBoard events to {errors[0]}"
                           f"{more}; trying again every {self.every_s:g} s")
            self._failing = bool(errors)

    def _forget(self, document: Document) -> None:
        """Close the runs of sources no longer in the document, and beyond MAX_OPEN_RUNS open
        files the runs first seen (their next point reopens their file)."""
        present = {source.id for source in document.sources}
        for source_id in [s for s in self._runs if s not in present]:
            self._runs.pop(source_id).close()
        self._names = {name: s for name, s in self._names.items() if s in present}
        open_runs = [run for run in self._runs.values() if run.file is not None]
        for run in open_runs[:max(0, len(open_runs) - MAX_OPEN_RUNS)]:
            run.close()
