"""The rolling state of everything a viewer has received, and the one computation of each figure.

`Model.document(now, window_s)` builds the CONTRACT §3 snapshot document (plus the extras the
TUI shows); `loadertop snapshot`, `--once` and the TUI all read that document, so a figure means
the same everywhere. No torch, no zmq, no textual: messages come in already decoded.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from loadertop import diagnosis, wire
from loadertop.viewer import ranks

SNAPSHOT_SCHEMA = "loadertop.snapshot/1"
HISTORY_S = 120.0  # reports kept per source (the window a viewer can ask for)
GONE_AFTER_S = 3.0  # no report for this long (reports come every 0.25 s): the source is gone
FORGET_AFTER_S = 600.0  # finished/gone sources stay visible this long, then are dropped
SYSTEM_STALE_S = 10.0  # machine figures older than this are not shown as current
LATE_REPORT_S = 1.0  # a report this old says the probe's thread is starved or frozen
LOOP_CPU_MIN_WALL_NS = 100_000_000  # loop CPU share while waiting: only from >= 100 ms of long waits
WAITING_FRACTION = 0.5  # the state is `waiting` when the loop waits at least this share of the time
WAITING_BLOCKED_MS = 1000.0  # ... or has been blocked in next() this long right now


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in 0..100."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def stats_ms(samples_us: list[int]) -> dict | None:
    """{mean, p50, p95, p99, max} in ms, or None without samples (never a made-up 0)."""
    if not samples_us:
        return None
    values = sorted(v / 1000.0 for v in samples_us)
    return {
        "mean": _round(sum(values) / len(values)),
        "p50": _round(percentile(values, 50)),
        "p95": _round(percentile(values, 95)),
        "p99": _round(percentile(values, 99)),
        "max": _round(values[-1]),
    }


def _ratio(num: float, den: float, *, min_denominator: float = 0) -> float | None:
    """A CPU-time / wall-time fraction in 0..1 (the contract's range), None without wall time.

    CPU time can exceed wall time by a hair (clock granularity, measured 1.001) or by more when a
    dataset decodes in threads; either way the figure means "computing all the time": 1."""
    if den <= 0 or den < min_denominator:
        return None
    return _round(min(1.0, max(0.0, num / den)), 3)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class SourceState:
    source: str
    reports: deque = field(default_factory=deque)  # (received_at, LoaderReport)
    last: wire.LoaderReport | None = None
    last_received: float = 0.0
    first_received: float = 0.0
    endpoint: str | None = None
    missed: int = 0  # reports lost on the way (sequence gaps)
    finished_at: float | None = None
    batches_total: int = 0

    def add(self, msg: wire.LoaderReport, now: float) -> None:
        if self.last is not None:
            if msg.seq > self.last.seq + 1:
                self.missed += msg.seq - self.last.seq - 1
            elif msg.seq <= self.last.seq and msg.sent_at >= self.last.sent_at:
                self.missed = 0  # the process restarted its numbering (a new run, same id)
        else:
            self.first_received = now
        self.reports.append((now, msg))
        self.last = msg
        self.last_received = now
        self.batches_total = msg.batches_total
        self.finished_at = None

    def prune(self, now: float) -> None:
        while self.reports and self.reports[0][0] < now - HISTORY_S:
            self.reports.popleft()


class Model:
    def __init__(self) -> None:
        self.sources: dict[str, SourceState] = {}
        self.systems: dict[str, tuple[float, wire.SystemReport]] = {}
        self.rejected: Counter[str] = Counter()
        self.received = 0
        self.endpoints: dict[str, float | None] = {}  # endpoint -> last time it delivered
        self.discovery_dir: str | None = None
        self.stabilizer = diagnosis.VerdictStabilizer()

    # ------------------------------------------------------------ ingest
    def ingest(self, msg: wire.Message, now: float, endpoint: str | None = None) -> None:
        self.received += 1
        if endpoint is not None:
            self.endpoints[endpoint] = now
        if isinstance(msg, wire.LoaderReport):
            state = self.sources.get(msg.source)
            if state is None:
                state = self.sources[msg.source] = SourceState(msg.source, endpoint=endpoint)
            state.add(msg, now)
            state.prune(now)
        elif isinstance(msg, wire.SystemReport):
            self.systems[msg.host] = (now, msg)
        elif isinstance(msg, wire.Goodbye):
            state = self.sources.get(msg.source)
            if state is not None:
                state.finished_at = now
                state.batches_total = max(state.batches_total, msg.batches_total)

    def reject(self, reason: str) -> None:
        self.rejected[reason] += 1

    def add_endpoint(self, endpoint: str) -> None:
        self.endpoints.setdefault(endpoint, None)

    def forget_old(self, now: float) -> None:
        for sid, state in list(self.sources.items()):
            if now - state.last_received > FORGET_AFTER_S:
                del self.sources[sid]
                self.stabilizer.forget(sid)

    # ------------------------------------------------------------ figures
    def source_figures(self, state: SourceState, now: float, window_s: float) -> dict:
        last = state.last
        assert last is not None
        window = [m for t, m in state.reports if t >= now - window_s] or []
        batches = sum(m.batches for m in window)
        covered = sum(m.interval_s for m in window)
        wait_us = [v for m in window for v in m.wait_us]
        step_us = [v for m in window for v in m.step_us]
        wait_ns = sum(m.wait_ns for m in window)
        rate = batches / covered if covered > 0 else None
        batch_size = last.config.batch_size
        age = max(0.0, now - state.last_received)
        live = state.finished_at is None and age <= GONE_AFTER_S
        blocked_ms = None
        if last.blocked_ms is not None and live:
            # Reports arrive every 0.25 s; only a late one means the loop is still blocked now.
            late = age if age > LATE_REPORT_S else 0.0
            blocked_ms = _round(last.blocked_ms + late * 1000.0, 1)
        fig = {
            "id": state.source,
            "host": last.host,
            "pid": last.pid,
            "rank": last.rank,
            "name": last.name,
            "state": None,
            "config": {
                "num_workers": last.config.num_workers,
                "batch_size": batch_size,
                "prefetch_factor": last.config.prefetch_factor,
                "pin_memory": last.config.pin_memory,
                "persistent_workers": last.config.persistent_workers,
                "dataset": last.config.dataset,
                "worker_context": last.config.worker_context,
            },
            "batches": batches,
            "batches_total": state.batches_total,
            "batches_per_s": _round(rate),
            "samples_per_s": _round(rate * batch_size) if rate is not None and batch_size else None,
            "wait_ms": stats_ms(wait_us),
            "step_ms": stats_ms(step_us),
            "wait_fraction": _round(min(1.0, wait_ns / (covered * 1e9))) if covered > 0 else None,
            "blocked_ms": blocked_ms,
            "queue": self._queue(last, window),
            "workers": self._workers(last, window),
            "loop": self._loop(last, window),
            "epoch": last.epoch,
            "command": last.command,
            "endpoint": state.endpoint,
            "started_at": last.process_started_at,
            "age_s": _round(age, 2),
            "window_s": _round(covered, 3),
            "dropped": state.missed + last.dropped,
            "probe_cpu_fraction": _round(last.probe_cpu_fraction, 4),
        }
        fig["state"] = self._state(fig, state, live)
        return fig

    @staticmethod
    def _queue(last: wire.LoaderReport, window: list[wire.LoaderReport]) -> dict:
        samples = sum(m.queue.samples for m in window)
        waiting = sum(m.queue.waiting_samples for m in window)
        q = last.queue
        return {
            "ready": q.ready,
            "in_flight": q.in_flight,
            "capacity": q.capacity,
            "ready_mean": _round(sum(m.queue.ready_sum for m in window) / samples, 2) if samples else None,
            "in_flight_mean": _round(sum(m.queue.in_flight_sum for m in window) / samples, 2) if samples else None,
            "ready_when_waiting": _round(sum(m.queue.waiting_ready_samples for m in window) / waiting, 3) if waiting else None,
            "waiting_samples": waiting,
            "loop_cpu_when_waiting": _ratio(sum(m.queue.waiting_cpu_ns for m in window),
                                            sum(m.queue.waiting_wall_ns for m in window),
                                            min_denominator=LOOP_CPU_MIN_WALL_NS),
        }

    @staticmethod
    def _workers(last: wire.LoaderReport, window: list[wire.LoaderReport]) -> list[dict]:
        out = []
        for w in last.workers:
            fetch_us: list[int] = []
            batches = wall = cpu = 0
            for m in window:
                for mw in m.workers:
                    # Same id and same process: a worker of an earlier epoch is another process.
                    if mw.id == w.id and (mw.pid == w.pid or w.pid is None):
                        fetch_us.extend(mw.fetch_us)
                        batches += mw.batches
                        wall += mw.fetch_wall_ns
                        cpu += mw.fetch_cpu_ns
            out.append({
                "id": w.id,
                "pid": w.pid,
                "alive": w.alive,
                "exitcode": w.exitcode,
                "cpu_percent": _round(w.cpu_percent, 1),
                "rss_bytes": w.rss_bytes,
                "batches": batches,
                "fetch_ms": stats_ms(fetch_us),
                "cpu_fraction": _ratio(cpu, wall),
            })
        return out

    @staticmethod
    def _loop(last: wire.LoaderReport, window: list[wire.LoaderReport]) -> dict:
        if last.config.num_workers != 0:
            return {"fetch_ms": None, "cpu_fraction": None}
        # With num_workers=0 the loop's wait in next() *is* the fetch; its CPU share is sampled.
        fetch = [v for m in window for v in m.wait_us]
        wall = sum(m.loop_fetch_wall_ns for m in window)
        cpu = sum(m.loop_fetch_cpu_ns for m in window)
        return {"fetch_ms": stats_ms(fetch), "cpu_fraction": _ratio(cpu, wall)}

    @staticmethod
    def _state(fig: dict, state: SourceState, live: bool) -> str:
        if state.finished_at is not None:
            return "finished"
        if not live:
            return "gone"
        blocked = fig["blocked_ms"]
        if blocked is not None and blocked >= diagnosis.stall_threshold_ms(fig):
            return "stalled"
        if any(w["alive"] is False and w["exitcode"] not in (0, None) for w in fig["workers"]):
            return "stalled"
        if fig["batches"] == 0 and blocked is None:
            return "idle"
        if (fig["wait_fraction"] or 0) >= WAITING_FRACTION or (blocked or 0) >= WAITING_BLOCKED_MS:
            return "waiting"
        return "running"

    def system_figures(self, host: str | None, now: float) -> dict | None:
        entry = self.systems.get(host) if host is not None else None
        if entry is None and self.systems:
            entry = max(self.systems.values(), key=lambda e: e[0])
        if entry is None or now - entry[0] > SYSTEM_STALE_S:
            return None
        received, msg = entry
        import msgspec

        doc = msgspec.to_builtins(msg)
        doc.pop("type", None)
        doc.pop("seq", None)
        doc["age_s"] = _round(now - received, 2)
        return doc

    # ------------------------------------------------------------ the document
    def document(self, now: float | None = None, window_s: float = 3.0) -> dict:
        now = time.time() if now is None else now
        self.forget_old(now)
        sources = []
        verdicts = []
        for sid in sorted(self.sources, key=lambda s: _sort_key(self.sources[s])):
            state = self.sources[sid]
            if state.last is None:
                continue
            fig = self.source_figures(state, now, window_s)
            system = self.system_figures(fig["host"], now)
            verdict = diagnosis.diagnose(fig, system, self.stabilizer.shown_category(sid))
            fig["diagnosis"] = self.stabilizer.update(sid, verdict, now)
            verdicts.append((sid, fig["diagnosis"]))
            sources.append(fig)
        hosts = [s["host"] for s in sources if s["state"] not in ("gone", "finished")]
        system = self.system_figures(hosts[0] if hosts else None, now)
        last_data = max(self.endpoints.values(), default=None, key=lambda t: t or 0)
        return {
            "schema": SNAPSHOT_SCHEMA,
            "taken_at": round(now, 3),
            "window_s": window_s,
            "sources": sources,
            "system": system,
            "diagnosis": diagnosis.overall(verdicts, system),
            "ranks": ranks.overview(sources),  # the straggler among ranks (viewer/ranks.py)
            "viewer": {
                "endpoints": sorted(self.endpoints),
                "connected": last_data is not None and now - last_data <= GONE_AFTER_S,
                "received": self.received,
                "bad_messages": sum(v for k, v in self.rejected.items() if k != "wrong_version"),
                "wrong_version": self.rejected.get("wrong_version", 0),
                "discovery_dir": self.discovery_dir,
            },
        }


def _sort_key(state: SourceState):
    last = state.last
    return (last.rank if last and last.rank is not None else -1, last.host if last else "",
            last.pid if last else 0, state.first_received)
