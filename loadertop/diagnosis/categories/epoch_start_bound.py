"""epoch_start_bound: the loop waits for data, and mostly for each epoch's first batch — workers
started anew every epoch (`persistent_workers=False`), a costly `worker_init_fn`, a dataset slow
to pickle or unpickle under spawn, or set-up that every epoch's start does again.

Judged over the latest epochs that ended (`SourceFigures.epochs`, docs/contract.md §5), not the
window: an epoch's start is one long wait every epoch, which a few seconds' window either holds
whole or misses, and part of it (torch starting the workers in `iter()`, spawn pickling the
dataset to each) is not inside `next()`, so not in the window's wait fraction at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from loadertop.client.document import EpochFigures, Verdict
from loadertop.client.units import say_fraction, say_ms, say_workers
from loadertop.diagnosis.facts import Facts, make_verdict
from loadertop.diagnosis.readings import finite
from loadertop.diagnosis.thresholds import (
    EPOCH_START_FETCHES,
    EPOCH_START_LEAVE,
    EPOCH_START_SHARE,
    WAIT_FRACTION_COMPUTE_BOUND,
    WAIT_FRACTION_INPUT_BOUND,
)

CATEGORY: Final = "epoch_start_bound"
#: How the screen and the report name and colour it (a Rich colour; `views.palette` reads these).
WORDS: Final = "Input-bound: epoch start-up"
COLOUR: Final = "yellow"
LEVEL: Final = "warn"  # the banner's CSS class suffix: ok / warn / bad / none
#: Its place in `overall`'s order, most urgent first: after main_process_bound, before the
#: steady-state input-bound categories, whose figures its starts would mislead (a loader
#: waiting for its workers to start reads as CPU- or I/O-bound), and one setting often fixes it.
RANK: Final = 45
#: Shown at once by the verdict's hysteresis (`client.hysteresis`), without waiting to persist.
URGENT: Final = False
#: The loop waits for data in it (the margin on the wait fraction applies when it is shown).
LOOP_WAITS: Final = True


@dataclass(frozen=True)
class EpochStarts:
    """The latest ended epochs the rule reads, summed: their starts apart from the rest."""

    epochs: tuple[EpochFigures, ...]

    @property
    def start_ms(self) -> float:
        """From each epoch's iter() to its first batch: all of it the loop waiting for the loader."""
        return sum(e.start_ms for e in self.epochs)

    @property
    def in_next_ms(self) -> float:
        """... of which in the first next() (the rest: in iter(), where torch starts the workers)."""
        return sum(min(e.first_wait_ms, e.start_ms) for e in self.epochs)

    @property
    def run_ms(self) -> float:
        return sum(e.run_ms for e in self.epochs)

    @property
    def run_wait_ms(self) -> float:
        return sum(e.run_wait_ms for e in self.epochs)

    @property
    def mean_start_ms(self) -> float:
        return self.start_ms / len(self.epochs)

    @property
    def share(self) -> float:
        """Of the loop's wait in these epochs, the share at their starts."""
        wait = self.start_ms + self.run_wait_ms
        return self.start_ms / wait if wait > 0 else 0.0

    @property
    def time_fraction(self) -> float:
        """Of the loop's time in these epochs, the share spent starting them."""
        total = self.start_ms + self.run_ms
        return self.start_ms / total if total > 0 else 0.0

    @property
    def wait_fraction(self) -> float:
        """Of the loop's time in these epochs, the share it waited for the loader, starts included."""
        total = self.start_ms + self.run_ms
        return (self.start_ms + self.run_wait_ms) / total if total > 0 else 0.0

    @property
    def steady_wait_fraction(self) -> float | None:
        """Between the starts: the loop's wait over its time from each first batch to the last."""
        return min(1.0, self.run_wait_ms / self.run_ms) if self.run_ms > 0 else None


def epoch_starts(facts: Facts) -> EpochStarts | None:
    """The ended epochs the rule reads, or None without any. The loader's first epoch counts only
    where every epoch starts the same way (workers started anew each epoch): with persistent
    workers, or none, the first start is paid once whatever the settings (the workers' own
    start, cold caches)."""
    config = facts.source.config
    repeats = config.num_workers > 0 and not config.persistent_workers
    epochs = tuple(e for e in facts.source.epochs if repeats or e.epoch > 1)
    return EpochStarts(epochs) if epochs else None


def judge(facts: Facts) -> Verdict | None:
    """Epoch starts take at least WAIT_FRACTION_INPUT_BOUND of the loop's time (the starts alone
    make it input-bound) and at least EPOCH_START_SHARE of its wait, each start being at least
    EPOCH_START_FETCHES × a batch's fetch (beyond the first batch's own fetch: prefetching does
    not cross epochs). Once shown it holds down to WAIT_FRACTION_COMPUTE_BOUND and
    EPOCH_START_LEAVE. Only while the loop iterates this loader (idle's rule comes first)."""
    starts = _iterating_starts(facts)
    if starts is None:
        return None
    held = facts.previous == CATEGORY
    if starts.time_fraction < (WAIT_FRACTION_COMPUTE_BOUND if held else WAIT_FRACTION_INPUT_BOUND):
        return None
    if starts.share < (EPOCH_START_LEAVE if held else EPOCH_START_SHARE):
        return None
    fetch = facts.fetch_ms()
    if fetch is not None and starts.mean_start_ms < EPOCH_START_FETCHES * fetch:
        return None
    return _verdict(facts, starts)


def restate(facts: Facts) -> Verdict | None:
    """Its words for today's figures while the hysteresis holds it (`client.hysteresis`): the
    latest epochs' split, on whichever side of its thresholds."""
    starts = _iterating_starts(facts)
    return _verdict(facts, starts) if starts is not None else None


def _iterating_starts(facts: Facts) -> EpochStarts | None:
    src = facts.source
    if not src.batches and finite(src.blocked_ms) is None:
        return None  # not iterating this loader now
    return epoch_starts(facts)


def _verdict(facts: Facts, starts: EpochStarts) -> Verdict:
    config = facts.source.config
    workers = config.num_workers
    if workers and not config.persistent_workers:
        why = f"its {say_workers(workers)} start anew every epoch"
    elif workers:
        why = "each epoch's start is slow though the workers persist"
    else:
        why = "the main process starts each epoch slowly"
    n = len(starts.epochs)
    over = "the last epoch" if n == 1 else f"the last {n} epochs"
    summary = (f"the loop waits {say_fraction(starts.wait_fraction)} of the time over {over}, "
               f"{say_fraction(starts.share)} of it for each epoch's first batch "
               f"({say_ms(starts.mean_start_ms)}): {why}")
    return make_verdict(CATEGORY, summary, _evidence(facts, starts), _advice(facts, starts))


def _evidence(facts: Facts, starts: EpochStarts) -> list[str]:
    n = len(starts.epochs)
    held = facts.previous == CATEGORY
    # the margin, where it decided (a restated verdict may be past it: the threshold alone)
    share_margin = (f", held until below {say_fraction(EPOCH_START_LEAVE)}"
                    if held and EPOCH_START_LEAVE <= starts.share < EPOCH_START_SHARE else "")
    time_margin = (f", held until below {say_fraction(WAIT_FRACTION_COMPUTE_BOUND)}"
                   if held and WAIT_FRACTION_COMPUTE_BOUND <= starts.time_fraction
                   < WAIT_FRACTION_INPUT_BOUND else "")
    whose, their, between = (("the last epoch's", "its start", "after it") if n == 1 else
                             (f"the last {n} epochs'", "their starts", "between them"))
    evidence = [
        f"{whose} wait: {say_ms(starts.start_ms)} at {their} (from iter() to the first batch), "
        f"{say_ms(starts.run_wait_ms)} {between}: {say_fraction(starts.share)} at the start"
        f"{'' if n == 1 else 's'} (threshold {say_fraction(EPOCH_START_SHARE)}{share_margin})"]
    steady = starts.steady_wait_fraction
    evidence.append(
        f"the starts take {say_fraction(starts.time_fraction)} of the loop's time (threshold "
        f"{say_fraction(WAIT_FRACTION_INPUT_BOUND)}{time_margin})"
        + (f"; between them the loop waits {say_fraction(steady)}" if steady is not None else ""))
    in_iter = max(0.0, starts.start_ms - starts.in_next_ms) / n
    fetch = facts.fetch_ms()
    evidence.append(
        f"each start: {say_ms(starts.mean_start_ms)} on average, {say_ms(in_iter)} in iter() (where "
        f"torch starts the workers) and {say_ms(starts.in_next_ms / n)} in the first next()"
        + (f"; a batch takes {say_ms(fetch)} to make" if fetch is not None else ""))
    config = facts.source.config
    if config.num_workers and not config.persistent_workers:
        evidence.append(f"persistent_workers=False: {say_workers(config.num_workers)} "
                        f"({config.worker_context or 'fork'}) start anew each epoch")
    return evidence


def _advice(facts: Facts, starts: EpochStarts) -> list[str]:
    config = facts.source.config
    workers, context = config.num_workers, config.worker_context or "fork"
    advice = []
    if workers and not config.persistent_workers:
        advice.append(f"persistent_workers=True: the workers, and what they set up when they "
                      f"start, last from one epoch to the next, so only the first epoch waits for "
                      f"them (now every epoch waits {say_ms(starts.mean_start_ms)})")
    if workers and context in ("spawn", "forkserver"):
        if starts.start_ms - starts.in_next_ms >= starts.in_next_ms:
            # Most of the start inside iter(): torch's Process.start() of a spawn worker writes
            # the pickled dataset into a pipe, and waits while the new process imports the
            # script's modules before it reads it (CPython 3.11 multiprocessing.popen_spawn_posix).
            advice.append(f"{context} pickles the dataset to every worker inside iter(), one "
                          "worker after the other: keep the dataset small to pickle (paths in a "
                          "numpy array, data loaded lazily in the worker)")
        advice.append(f"each {context} worker imports torch and the training script's modules "
                      "again, and unpickles the dataset: keep the script's top level light and "
                      "the dataset cheap to unpickle (open files and load data lazily, in the "
                      "worker)")
    if workers:
        advice.append("move the costly set-up out of the workers' start: worker_init_fn runs in "
                      "every worker each time it starts; open files and build indexes lazily, "
                      "once per worker, and keep them")
    if workers and config.persistent_workers:
        advice.insert(0, "the workers persist, so the wait is each epoch's own start: an "
                         "IterableDataset's __iter__, the sampler, or set-up redone every epoch "
                         "(set_epoch, shuffling a large index): do it once and keep it")
    if not workers:
        advice.append("the main process starts each epoch itself: move the costly set-up (the "
                      "dataset's __iter__, the sampler, opening files) out of the epoch's start, "
                      "do it once and keep it (or load in workers with persistent_workers=True: "
                      "they start once)")
    steady = starts.steady_wait_fraction
    if steady is not None and steady >= WAIT_FRACTION_INPUT_BOUND:
        advice.append(f"between epoch starts the loop still waits {say_fraction(steady)} of the "
                      "time: once the starts are fixed, the verdict names what limits that")
    return advice
