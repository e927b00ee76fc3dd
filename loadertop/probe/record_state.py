"""LoaderRecord's whole state and the methods its seams call on one another, declared for the type
checker only: each mixin of record.py derives from `RecordState` while type-checking (and from
`object` at run time, so the record's class and its attribute lookups are exactly as they would
be without it). Nothing imports this module at run time.

Each attribute is set by the seam named beside it (its `_init_*`, or record.py's `__init__`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from loadertop import wire
from loadertop.probe._hotpath import StampRing
from loadertop.probe.autotune import LoaderTuner
from loadertop.probe.hang_forensics import _StackAsk
from loadertop.probe.histograms import BucketCounts
from loadertop.probe.stage_pairing import EpochPairing
from loadertop.probe.stamp_drain import DequeStamps
from loadertop.probe.torch_internals import QueueDepth
from loadertop.probe.worker_resources import _WorkerAccum

#: (wall, cpu, fetch, collate, produced) of one num_workers=0 batch, in ns (record.py)
LoopSample = tuple[int, int, int | None, int | None, int | None]
#: (pid, alive, exitcode, cpu %, rss) of one worker at the last sample_workers()
WorkerStatus = tuple[int | None, bool | None, int | None, float | None, int | None]
#: (worker id, pid, its multiprocessing Process) of the current epoch's workers
WorkerProc = tuple[int, int | None, object]


class RecordState:
    # --- record.py: written by the training thread, and the record's identity
    events: StampRing | DequeStamps
    loop_samples: deque[LoopSample]
    _iterator_ref: Callable[[], Any] | None
    _iterator_offset: int
    _attached_pairing: EpochPairing | None
    _pairings: deque[EpochPairing | None]
    _unresolved: deque[EpochPairing]
    _iter_starts: deque[int | None]
    error: wire.LoopError | None
    autotune: LoaderTuner | None
    _error_new: bool
    _loop_thread: int | None
    unhooked_pids: set[int]
    name: str
    source: str
    host: str
    rank: int | None
    command: str
    process_started_at: float
    _loader_ref: Callable[[], Any] | None
    config: wire.LoaderConfig
    _config_key: tuple[Any, ...] | None
    _loop_cpu_clock: int | None
    retired_since: float | None

    @property
    def iterator(self) -> Any:
        raise NotImplementedError

    # --- stamp_drain.py
    epoch: int
    batches_total: int
    dropped: int
    _prev_t1: int | None
    in_next_since: int | None
    _wait_buckets: BucketCounts
    _step_buckets: BucketCounts
    _epoch_started: int | None
    _epoch_starts_ms: deque[float]
    _epochs: deque[wire.EpochReport]

    def drain(self) -> None: ...

    # --- stage_pairing.py
    _generation: int
    _pairing: EpochPairing | None
    _recent_pairings: dict[tuple[int | None, int], EpochPairing]
    _done: dict[tuple[int | None, int, int], int]
    _receipts: deque[tuple[EpochPairing, int, int, int]]
    _tensors: tuple[int, int] | None
    _count_mismatch: bool

    def _resolve_epochs(self) -> None: ...
    def _next_pairing(self) -> None: ...
    def _break_pairing(self, reason: str) -> None: ...
    def _want_stamps(self) -> bool:
        raise NotImplementedError
    def _receive(self, t0s: list[int] | None, t1s: list[int] | None, n: int) -> None: ...
    def _add_split(self, producing_ns: int, handoff_ns: int) -> None: ...
    def _check_received(self, it: Any) -> None: ...
    def match_stages(self, now_ns: int) -> None: ...
    def stage_report(self) -> wire.StageReport | None:
        raise NotImplementedError

    # --- queue_sampling.py
    _waiting_mark: tuple[int, int, int] | None

    # --- worker_resources.py
    _workers: dict[int, _WorkerAccum]
    _worker_status: dict[int, WorkerStatus]
    _psutil: dict[int, Any]
    _alive_pids: set[int]
    _worker_procs: list[WorkerProc]
    _rng: dict[int, tuple[int, dict[str, str]]]

    def sample_workers(self) -> None: ...
    def _rng_report(self) -> tuple[int, list[wire.RngShare]]:
        raise NotImplementedError

    # --- hang_forensics.py
    stack_dir: str | None
    _epoch_floor_ns: int
    _busy_since: dict[int, int]
    _idle_seen: dict[int, int]
    _worker_stacks: dict[int, _StackAsk]
    _stack_files: dict[int, str]
    _stack_search_at: dict[int, int]
    _loop_stack: tuple[int, wire.Stack | None] | None

    def _remember_stack_file(self, pid: int, path: str) -> None: ...
    def _update_busy(self, it: Any, now_ns: int) -> None: ...
    def _busy_ms(self, wid: int, now_ns: int) -> float | None:
        raise NotImplementedError
    def _worker_stack(self, wid: int, pid: int | None, now_ns: int,
                      watched: bool) -> wire.Stack | None:
        raise NotImplementedError
    def _loop_stack_now(self, now_ns: int) -> wire.Stack | None:
        raise NotImplementedError

    # --- report_assembly.py: the interval's figures (reset after each report) and the rest
    seq: int
    _interval_start_ns: int
    _cpu_mark: tuple[int, int | None, int | None]
    pending_resources: wire.ResourceReport | None
    _batches: int
    _wait_ns: int
    _step_ns: int
    _wait_samples: list[int]
    _step_samples: list[int]
    _q_samples: int
    _q_ready_sum: int
    _q_flight_sum: int
    _q_waiting: int
    _q_waiting_ready: int
    _q_waiting_cpu: int
    _q_waiting_wall: int
    _q_last: QueueDepth | None
    _loop_us: list[int]
    _loop_wall: int
    _loop_cpu: int
    _paired: int
    _producing_ns: int
    _handoff_ns: int
    _handoff_samples: list[int]
    _stage_fetch: list[int]
    _stage_collate: list[int]

    def _reset_interval(self) -> None: ...
