"""A recording played through the live viewer's own `Model`, to any point of its time.

Every frame goes through `wire.decode` and `Model.ingest` with its recorded receive time, and the
model is advanced at recorded times, so a replay, `snapshot --from` and the report see the figures,
verdicts and findings that today's loadertop computes from those messages (a recording made by an
older loadertop shows today's diagnosis).

The model is advanced at least every `STEP_S` of recording time, whatever the playback speed, so
the verdict stabilizer and the findings' lingering (both count refreshes or seconds) behave as
they did for a viewer watching at its default refresh. Seeking back rebuilds the model from
`REBUILD_S` before the point: everything a document shows rests on at most `HISTORY_S` (120 s) of
reports, so the rebuilt figures are the same; only a finding's `since` cannot reach further back
than that, and a source finished more than `REBUILD_S` before the point is no longer listed.

A job's black box is played with the job's end (`ending`: `recording.blackbox.ending_of`): at the
recording's end its sources end as the job did, as a viewer that watched it die would have said
(docs/contract.md §9: one end per job, and the findings it makes, an OOM kill's).
"""

from __future__ import annotations

import bisect

from loadertop import wire
from loadertop.client.document import Document
from loadertop.client.ending import Ending
from loadertop.client.model import HISTORY_S, Model
from loadertop.recording.file import Frame, Recording

STEP_S = 1.0  # the model is advanced at least this often (recording time): the TUI's default refresh
REBUILD_S = HISTORY_S + 30.0  # a seek further than this (back, or forward) rebuilds the model


class Playback:
    """`document_at(t)`: the document as it stood at recording time `t` (Unix time)."""

    def __init__(self, recording: Recording, *, window_s: float = 3.0,
                 ending: tuple[int, Ending] | None = None) -> None:
        if not recording.frames:
            raise ValueError("a recording without frames")
        self.recording = recording
        self.window_s = window_s
        self.ending = ending  # (pid, how its job ended), told its sources at the recording's end
        self.frames: list[Frame] = recording.frames
        self._times = [f.received_at for f in self.frames]
        self.ingested = 0  # frames fed to a model so far (a far seek feeds only REBUILD_S of them)
        self.start = self._times[0]
        self.end = self._times[-1]
        self._reset(self.start)

    def _reset(self, at: float) -> None:
        self.model = Model(window_s=self.window_s)
        for endpoint in self.recording.endpoints:
            self.model.add_endpoint(endpoint)
        self._next = bisect.bisect_left(self._times, at)  # the next frame to ingest
        self._advanced: float | None = None  # the recording time of the last advance
        self._document: Document | None = None

    def _feed_until(self, t: float) -> None:
        frames, model = self.frames, self.model
        i = self._next
        while i < len(frames) and frames[i].received_at <= t:
            f = frames[i]
            i += 1
            try:
                msg = wire.decode(f.frame)
            except wire.WireError as exc:  # e.g. a schema this loadertop no longer reads
                model.reject(exc.reason)
                continue
            model.ingest(msg, f.received_at, f.endpoint)
        self.ingested += i - self._next
        self._next = i

    def document_at(self, t: float) -> Document:
        """The document at `t` (clamped to the recording). Cheap when `t` moves forward a little."""
        t = min(max(t, self.start), self.end)
        if self._advanced is not None and t == self._advanced and self._document is not None:
            return self._document
        if self._advanced is None or t < self._advanced or t - self._advanced > REBUILD_S:
            self._reset(max(self.start, t - REBUILD_S))
            self._advanced = max(self.start, t - REBUILD_S) - STEP_S
        assert self._advanced is not None
        while self._advanced + STEP_S < t:
            self._advance(self._advanced + STEP_S)
        return self._advance(t)

    def _advance(self, t: float) -> Document:
        self._feed_until(t)
        if self.ending is not None and t >= self.end:
            pid, ending = self.ending
            ended = [sid for sid, state in self.model.sources.items()
                     if state.last is not None and state.last.pid == pid and state.ending is None]
            if ended:
                # The job's last reports are judged live first, as a viewer watching it judged them
                # before it noticed the death: a hang first past its threshold in the very last
                # report (killed before the next) is a finding, and lingers into the end's document.
                self.model.advance(t)
            for sid in ended:
                self.model.mark_ended(sid, ending)
        self._advanced = t
        self._document = self.model.advance(t)
        return self._document

    def documents(self, every_s: float) -> list[Document]:
        """Documents from the start to the end, one every `every_s` of recording time (the last
        one at the end), advancing the model in between as `document_at` does."""
        out: list[Document] = []
        self._reset(self.start)
        t = self.start
        while True:
            out.append(self.document_at(t))
            if t >= self.end:
                return out
            t = min(self.end, t + every_s)
