"""Every threshold of the diagnosis, in one module: the only place each is defined.

docs/thresholds.md repeats them with the reasons (a test checks its table against this
module), and the viewer derives its colour bands from them. Each rule
(`loadertop.diagnosis.categories`) and the capacity model (`capacity`) read them from here.
"""

from __future__ import annotations

# Judge a window only with at least this many batches: 1-4 waits are dominated by chance (one slow
# file, the first batch of an epoch).
MIN_BATCHES = 5
# ... unless the loop is slow (steps of seconds, big models): 2 batches covering this much loop time
# (wait + step) are judged too, or such a loop would never leave insufficient_data.
MIN_BATCHES_SLOW = 2
SLOW_WINDOW_MIN_MS = 2000.0

# The loop is input-bound at a wait fraction (waiting / wall time) >= 10 %. PyTorch's profiler
# plugin flagged loading above 5 % of *step* time; 10 % of wall time leaves room for the ordinary
# sub-millisecond cost of next() (unpickling, fd passing) that no setting removes.
WAIT_FRACTION_INPUT_BOUND = 0.10
# ... and goes back to compute-bound only below 7 %: a margin against flicker near 10 %.
WAIT_FRACTION_COMPUTE_BOUND = 0.07

# A GPU busy less than this while the loader keeps up: the step itself leaves it idle.
GPU_UNDERUSED_PERCENT = 70.0

# Batches already fetched and ready in >= 50 % of the samples taken while the loop was blocked in
# next(): the workers are ahead, the main process (receive, unpickle, collate, pin) is the limit.
READY_WHEN_WAITING_MAIN_BOUND = 0.5
READY_WHEN_WAITING_LEAVE = 0.4  # margin: leave main_process_bound only below this
# ... unless the loop's thread was measured off the CPU 3/4 of the time inside next(): blocked on the
# next in-order batch (the "ready" ones arrived out of order or sit in a worker's send buffer) or
# starved of CPU by busy workers — the workers or the CPU are the limit, not the main process.
LOOP_CPU_MAIN_BOUND_MIN = 0.25
# Where stages are measured (docs/contract.md §5) the split of the loop's wait decides, with the queue
# samples above as a check (see `_main_bound_evidence`): main-process-bound when at least this
# share of the wait came after the batch was produced (receiving, unpickling, pin_memory,
# in-order waiting).
HANDOFF_MAIN_BOUND = 0.5
HANDOFF_LEAVE = 0.4  # margin: leave main_process_bound only below this
# A handoff is "many small tensors" when a batch holds at least this many tensors averaging under
# SMALL_TENSOR_BYTES: each crosses processes with its own shared-memory handle.
MANY_TENSORS_PER_BATCH = 32
SMALL_TENSOR_BYTES = 64 * 1024

# The machine's CPU (or our workers' share of the cores available to us) is busy >= 90 %: every
# core is in use and one more worker only time-slices with the others.
CPU_SATURATED_PERCENT = 90.0
CPU_SATURATED_LEAVE_PERCENT = 85.0  # margin: leave cpu_saturated only below this
# load_avg_1m >= this x cores_available counts as saturated only when cpu_percent is unknown (first
# sample): Linux's load counts tasks blocked on disk (D state) and, in a container, the whole host,
# and it lags a minute, so it is weaker evidence than a CPU percentage.
LOAD_SATURATED_PER_CORE = 1.0

# Workers busy on CPU less than half of the time they spend producing a batch mostly wait on
# storage, network, sleep or locks: I/O-bound; at or above it they compute.
IO_CPU_FRACTION = 0.5
IO_CPU_FRACTION_MARGIN = 0.05  # the shown side holds until the fraction is 0.05 past the boundary
# iowait at or above this backs an I/O verdict (and decides it when worker CPU figures are missing).
IOWAIT_HIGH_PERCENT = 10.0
# Disk reads at or above this are worth naming in the evidence.
DISK_READ_NOTABLE_BYTES_PER_S = 1024.0 * 1024.0

# Workers are never advised beyond this many per core available: a worker that waits on I/O needs
# no core, but each one costs memory and start-up time.
IO_WORKERS_PER_CORE_MAX = 4
# A worker count is advised only when the model of the loop (see `_WorkerPlan`) predicts at least
# this gain over the current count: below it, a measurement's noise and each worker's memory win.
WORKER_GAIN_MIN = 0.10
# The count advised is the smallest whose predicted throughput is within this of the best count's.
NEAR_BEST = 0.05
# An earlier setting of the same loader with fewer workers that gave throughput within this of
# the current one shows that the extra workers did not help.
MORE_WORKERS_GAIN_MIN = 0.10
# Fetch per batch this many times the earlier setting's, with more workers now: they queue.
FETCH_ROSE_FACTOR = 1.3
# ... and then a gain below this share of what the added workers would give if each kept its
# earlier fetch time (2 -> 6 workers: up to +200 %) says that they mostly queue, even when the gain
# itself is above MORE_WORKERS_GAIN_MIN (seen live: 2 -> 6 workers on a 2-slot store, +5-10 %).
QUEUE_GAIN_SHARE = 0.25
# The training process using this much CPU (in cores) is named as what limits the workers' CPU.
MAIN_BUSY_CORES = 0.5
# The CPU's cap on throughput within this of the rate a worker count is predicted to give: the
# CPU is (nearly) the limit too, so the advice shows the budget it rests on. Measured readings
# move by several percent, so a cap just above the prediction may be the limit in fact.
CPU_NEAR_CAP = 0.15
# Disk reads at this share of the highest rate seen in the run: the disk may be at its limit.
DISK_NEAR_PEAK_SHARE = 0.8
# Many small batches: each costs ~0.5-0.8 ms to receive in the main process (FIELD-NOTES), so from
# 200 batches/s on that overhead alone is >= 10 % of wall time.
TINY_BATCHES_PER_S = 200.0

# Memory: available below 5 % of total (cgroup-aware figures) leaves the kernel reclaiming pages
# and the OOM killer one allocation away.
MEM_AVAILABLE_MIN_FRACTION = 0.05
MEM_AVAILABLE_LEAVE_FRACTION = 0.07  # margin: leave memory_pressure only above this
# Swapping: >= 1 MiB/s (256 pages/s) read back from swap means the working set does not fit.
SWAP_RATE_MIN_BYTES_PER_S = 1024.0 * 1024.0
# Swap-*out* alone counts only when available memory is also below this: with plenty available the
# kernel pushes cold pages out to make room for page cache (e.g. while a dataset is read), harmless.
MEM_AVAILABLE_SWAP_OUT_FRACTION = 0.10

# A loop blocked in next() for >= max(STALL_MIN_MS, STALL_FACTOR x recent p99 wait) is stalled.
# 5 s is above the per-epoch worker start-up of spawn without persistent workers (1.5-3.5 s on the
# reference machine), so a new epoch is not a stall; 10x p99 leaves room for a slow but live tail.
STALL_MIN_MS = 5000.0
STALL_FACTOR = 10.0
# Before the first batch ever (batches_total == 0) there is no history: worker start-up, dataset
# init and (spawn) re-importing torch in every worker take seconds; give it this long.
STALL_NO_HISTORY_MS = 30000.0

# slow_worker (also a finding): one worker's batch time (items + collate, p50) at least this many
# times the median of the others', and above an absolute floor (scheduling noise at tiny times),
# from at least this many batches of each; only while the loop waits for data (it holds it back).
SLOW_WORKER_FACTOR = 3.0
SLOW_WORKER_MIN_MS = 2.0
SLOW_WORKER_MIN_BATCHES = 3

# epoch_start_bound: of the loop's wait over the latest ended epochs, at least this share was at
# their starts (from iter() to the first batch): most of it ...
EPOCH_START_SHARE = 0.5
EPOCH_START_LEAVE = 0.4  # margin: leave epoch_start_bound only below this
# ... each start taking at least this many times a batch's fetch: more than the first batch's own
# fetch, which every epoch waits for (prefetching does not cross epochs), so short epochs of a
# slow loader are not taken for slow starts.
EPOCH_START_FETCHES = 3.0

# VerdictStabilizer: a new (non-urgent) category must be seen in this many consecutive updates ...
STABLE_UPDATES = 3
# ... or over this many seconds (at least two consecutive updates) before it is shown.
STABLE_SECONDS = 5.0
