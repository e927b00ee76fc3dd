"""Name the bottleneck: pure functions from a window of figures to a verdict.

No I/O, no state kept between calls and no torch / textual / zmq here (the standard library, the
document's types and the units' wording only), so the viewer, `snapshot --json` and the tests all
judge alike.

    verdict = diagnose(source, system, previous=stabilizer.shown_category(source_id))
    shown = stabilizer.update(source_id, verdict, now,        # client.hysteresis, between refreshes
                              partial(restate, source=source, system=system))  # held: today's words
    top = overall([(source_id, shown), ...], system, ranks)    # the most urgent, plus "source"
                                                               # (with ranks: the straggler's)

`source` is a `SourceFigures` and `system` a `SystemFigures` (or None) of `loadertop.client.document`;
a verdict is a frozen `Verdict`: category, summary, evidence, advice (docs/contract.md §3/§4).
Every figure may be None (unknown) or, from a broken reading, not finite: a rule treats both as
"no evidence" and never invents a value.

The rooms:

* `categories/`: one module per category: its rule, its rank, its words and its colour;
* `registry`: the categories collected from one line each, the precedence ladder (`diagnose`) and
  the orders and sets derived from them; how to add a category is in its docstring;
* `overall`: the top-level verdict (the most urgent, or the straggler's);
* `thresholds`: every threshold, one module; `facts`: the figures the rules read;
  `readings`: one figure read safely; `capacity`: the worker-count model `loadertop tune` shares,
  `worker_advice` its words, `advised` its count; `loop_waits`: what the categories in which the
  loop waits share; `slow_worker`: one worker far slower than the others (also a finding).

Two layers of hysteresis keep a steady workload from flickering between categories:

* **margins** (in the rules, given the category shown now as ``previous``): a threshold is crossed
  at one value and crossed back only past a second one, e.g. the loop becomes input-bound at a wait
  fraction >= 10 % but goes back to compute-bound only below 7 %. The evidence names the threshold
  a user should read (10 %), and the margin only when it decided ("held until below 7 %");
* **persistence** (`loadertop.client.hysteresis.VerdictStabilizer`, stateful, so not here): a new
  category replaces the shown one only after `STABLE_UPDATES` consecutive updates (or
  `STABLE_SECONDS` over at least two), except the urgent ones (`stalled`, `memory_pressure`),
  which show at once. While it holds a category, the verdict shown is that category's words for
  today's figures (`restate`), with the category waiting to replace it as `pending`.

See docs/diagnosis.md for the rules and docs/thresholds.md for every threshold and its reason.
"""

from __future__ import annotations

from typing import Final

from loadertop.diagnosis.advised import advised_num_workers as advised_num_workers
from loadertop.diagnosis.categories import (
    compute_bound,
    cpu_saturated,
    epoch_start_bound,
    idle,
    input_bound_cpu,
    input_bound_io,
    insufficient_data,
    main_process_bound,
    memory_pressure,
    stalled,
)
from loadertop.diagnosis.categories.stalled import describe_exit as describe_exit
from loadertop.diagnosis.categories.stalled import exit_advice as exit_advice
from loadertop.diagnosis.categories.stalled import short_frame as short_frame
from loadertop.diagnosis.categories.stalled import stall_threshold_ms as stall_threshold_ms
from loadertop.diagnosis.categories.stalled import user_frame as user_frame
from loadertop.diagnosis.overall import overall as overall
from loadertop.diagnosis.registry import CATEGORIES as CATEGORIES
from loadertop.diagnosis.registry import INPUT_BOUND_CATEGORIES as INPUT_BOUND_CATEGORIES
from loadertop.diagnosis.registry import LADDER as LADDER
from loadertop.diagnosis.registry import OVERALL_RANK as OVERALL_RANK
from loadertop.diagnosis.registry import URGENT_CATEGORIES as URGENT_CATEGORIES
from loadertop.diagnosis.registry import CategoryRule as CategoryRule
from loadertop.diagnosis.registry import diagnose as diagnose
from loadertop.diagnosis.registry import restate as restate
from loadertop.diagnosis.slow_worker import SlowWorker as SlowWorker
from loadertop.diagnosis.slow_worker import slow_ratio_text as slow_ratio_text
from loadertop.diagnosis.slow_worker import slow_worker as slow_worker
from loadertop.diagnosis.slow_worker import slow_worker_advice as slow_worker_advice
from loadertop.diagnosis.slow_worker import slow_worker_line as slow_worker_line
from loadertop.diagnosis.thresholds import (
    CPU_NEAR_CAP as CPU_NEAR_CAP,
)
from loadertop.diagnosis.thresholds import (
    CPU_SATURATED_LEAVE_PERCENT as CPU_SATURATED_LEAVE_PERCENT,
)
from loadertop.diagnosis.thresholds import (
    CPU_SATURATED_PERCENT as CPU_SATURATED_PERCENT,
)
from loadertop.diagnosis.thresholds import (
    DISK_NEAR_PEAK_SHARE as DISK_NEAR_PEAK_SHARE,
)
from loadertop.diagnosis.thresholds import (
    DISK_READ_NOTABLE_BYTES_PER_S as DISK_READ_NOTABLE_BYTES_PER_S,
)
from loadertop.diagnosis.thresholds import (
    EPOCH_START_FETCHES as EPOCH_START_FETCHES,
)
from loadertop.diagnosis.thresholds import (
    EPOCH_START_LEAVE as EPOCH_START_LEAVE,
)
from loadertop.diagnosis.thresholds import (
    EPOCH_START_SHARE as EPOCH_START_SHARE,
)
from loadertop.diagnosis.thresholds import (
    FETCH_ROSE_FACTOR as FETCH_ROSE_FACTOR,
)
from loadertop.diagnosis.thresholds import (
    GPU_UNDERUSED_PERCENT as GPU_UNDERUSED_PERCENT,
)
from loadertop.diagnosis.thresholds import (
    HANDOFF_LEAVE as HANDOFF_LEAVE,
)
from loadertop.diagnosis.thresholds import (
    HANDOFF_MAIN_BOUND as HANDOFF_MAIN_BOUND,
)
from loadertop.diagnosis.thresholds import (
    IO_CPU_FRACTION as IO_CPU_FRACTION,
)
from loadertop.diagnosis.thresholds import (
    IO_CPU_FRACTION_MARGIN as IO_CPU_FRACTION_MARGIN,
)
from loadertop.diagnosis.thresholds import (
    IO_WORKERS_PER_CORE_MAX as IO_WORKERS_PER_CORE_MAX,
)
from loadertop.diagnosis.thresholds import (
    IOWAIT_HIGH_PERCENT as IOWAIT_HIGH_PERCENT,
)
from loadertop.diagnosis.thresholds import (
    LOAD_SATURATED_PER_CORE as LOAD_SATURATED_PER_CORE,
)
from loadertop.diagnosis.thresholds import (
    LOOP_CPU_MAIN_BOUND_MIN as LOOP_CPU_MAIN_BOUND_MIN,
)
from loadertop.diagnosis.thresholds import (
    MAIN_BUSY_CORES as MAIN_BUSY_CORES,
)
from loadertop.diagnosis.thresholds import (
    MANY_TENSORS_PER_BATCH as MANY_TENSORS_PER_BATCH,
)
from loadertop.diagnosis.thresholds import (
    MEM_AVAILABLE_LEAVE_FRACTION as MEM_AVAILABLE_LEAVE_FRACTION,
)
from loadertop.diagnosis.thresholds import (
    MEM_AVAILABLE_MIN_FRACTION as MEM_AVAILABLE_MIN_FRACTION,
)
from loadertop.diagnosis.thresholds import (
    MEM_AVAILABLE_SWAP_OUT_FRACTION as MEM_AVAILABLE_SWAP_OUT_FRACTION,
)
from loadertop.diagnosis.thresholds import (
    MIN_BATCHES as MIN_BATCHES,
)
from loadertop.diagnosis.thresholds import (
    MIN_BATCHES_SLOW as MIN_BATCHES_SLOW,
)
from loadertop.diagnosis.thresholds import (
    MORE_WORKERS_GAIN_MIN as MORE_WORKERS_GAIN_MIN,
)
from loadertop.diagnosis.thresholds import (
    NEAR_BEST as NEAR_BEST,
)
from loadertop.diagnosis.thresholds import (
    QUEUE_GAIN_SHARE as QUEUE_GAIN_SHARE,
)
from loadertop.diagnosis.thresholds import (
    READY_WHEN_WAITING_LEAVE as READY_WHEN_WAITING_LEAVE,
)
from loadertop.diagnosis.thresholds import (
    READY_WHEN_WAITING_MAIN_BOUND as READY_WHEN_WAITING_MAIN_BOUND,
)
from loadertop.diagnosis.thresholds import (
    SLOW_WINDOW_MIN_MS as SLOW_WINDOW_MIN_MS,
)
from loadertop.diagnosis.thresholds import (
    SLOW_WORKER_FACTOR as SLOW_WORKER_FACTOR,
)
from loadertop.diagnosis.thresholds import (
    SLOW_WORKER_MIN_BATCHES as SLOW_WORKER_MIN_BATCHES,
)
from loadertop.diagnosis.thresholds import (
    SLOW_WORKER_MIN_MS as SLOW_WORKER_MIN_MS,
)
from loadertop.diagnosis.thresholds import (
    SMALL_TENSOR_BYTES as SMALL_TENSOR_BYTES,
)
from loadertop.diagnosis.thresholds import (
    STABLE_SECONDS as STABLE_SECONDS,
)
from loadertop.diagnosis.thresholds import (
    STABLE_UPDATES as STABLE_UPDATES,
)
from loadertop.diagnosis.thresholds import (
    STALL_FACTOR as STALL_FACTOR,
)
from loadertop.diagnosis.thresholds import (
    STALL_MIN_MS as STALL_MIN_MS,
)
from loadertop.diagnosis.thresholds import (
    STALL_NO_HISTORY_MS as STALL_NO_HISTORY_MS,
)
from loadertop.diagnosis.thresholds import (
    SWAP_RATE_MIN_BYTES_PER_S as SWAP_RATE_MIN_BYTES_PER_S,
)
from loadertop.diagnosis.thresholds import (
    TINY_BATCHES_PER_S as TINY_BATCHES_PER_S,
)
from loadertop.diagnosis.thresholds import (
    WAIT_FRACTION_COMPUTE_BOUND as WAIT_FRACTION_COMPUTE_BOUND,
)
from loadertop.diagnosis.thresholds import (
    WAIT_FRACTION_INPUT_BOUND as WAIT_FRACTION_INPUT_BOUND,
)
from loadertop.diagnosis.thresholds import (
    WORKER_GAIN_MIN as WORKER_GAIN_MIN,
)

# The category names (docs/contract.md §4), as the rest of loadertop spells them.
IDLE: Final = idle.CATEGORY
INSUFFICIENT_DATA: Final = insufficient_data.CATEGORY
COMPUTE_BOUND: Final = compute_bound.CATEGORY
INPUT_BOUND_IO: Final = input_bound_io.CATEGORY
INPUT_BOUND_CPU: Final = input_bound_cpu.CATEGORY
CPU_SATURATED: Final = cpu_saturated.CATEGORY
MAIN_PROCESS_BOUND: Final = main_process_bound.CATEGORY
MEMORY_PRESSURE: Final = memory_pressure.CATEGORY
STALLED: Final = stalled.CATEGORY
EPOCH_START_BOUND: Final = epoch_start_bound.CATEGORY
