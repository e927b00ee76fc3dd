"""A whole `loadertop tune` run: the strategy's trials one after another, and the document.

    result = tune(["python", "train.py"], TuneOptions(), progress=StderrProgress())
    result.document          # loadertop.tune/1
    result.exit_code         # 0, 1 (nothing measured, no DataLoader), 130 (Ctrl-C)

`CannotStart` (the command cannot be executed) propagates: the command turns it into exit 2.
Ctrl-C ends the current trial's program (its whole process group) and returns what the trials
before it measured, `interrupted` set.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from loadertop import diagnosis
from loadertop.client.document import SourceFigures, SystemFigures
from loadertop.system.host import cores_available
from loadertop.tuning import strategy
from loadertop.tuning.document import TUNE_SCHEMA, TrialFigures, TrialReason, TuneDocument
from loadertop.tuning.recommendation import recommend
from loadertop.tuning.trial import TrialOutcome, TrialSettings, check_command, run_trial

EXIT_OK, EXIT_NOTHING, EXIT_INTERRUPTED = 0, 1, 130
STARTUP_GUESS_S = 3.0  # a trial's start (import torch, first batch) and end, before one was timed

Advice = Callable[[SourceFigures, SystemFigures | None], "int | None"]


class Progress(Protocol):
    def trial_started(self, index: int, num_workers: int | None, reason: TrialReason,
                      left_s: float | None, trials_left: int) -> None: ...
    def trial_phase(self, phase: str) -> None: ...
    def trial_done(self, index: int, trial: TrialFigures) -> None: ...


class SilentProgress:
    def trial_started(self, index: int, num_workers: int | None, reason: TrialReason,
                      left_s: float | None, trials_left: int) -> None:
        pass

    def trial_phase(self, phase: str) -> None:
        pass

    def trial_done(self, index: int, trial: TrialFigures) -> None:
        pass


@dataclass(frozen=True)
class TuneOptions:
    listed: tuple[int, ...] | None = None  # --workers
    max_workers: int | None = None  # --max-workers (default: strategy.default_max_workers)
    settings: TrialSettings = field(default_factory=TrialSettings)


@dataclass(frozen=True)
class TuneResult:
    document: TuneDocument
    exit_code: int
    error: str | None = None  # the one line to print on stderr (no DataLoader, nothing measured)


def live_advice() -> Advice:
    """The live advice's worker count for a measured source (None: it advises none)."""
    return diagnosis.advised_num_workers


def tune(command: Sequence[str], options: TuneOptions, progress: Progress | None = None, *,
         environ: Mapping[str, str] = os.environ, advice: Advice | None = None,
         use_advice: bool = True, cores: float | None = None) -> TuneResult:
    check_command(command, environ.get("PATH"))
    progress = progress or SilentProgress()
    began_wall, began = time.time(), time.monotonic()
    cores = cores if cores is not None else cores_available(detect_quota=True)
    max_workers = (options.max_workers if options.max_workers is not None
                   else max(strategy.default_max_workers(cores), *(options.listed or (0,))))
    advise = advice if advice is not None else (live_advice() if use_advice else None)
    settings = options.settings
    trials: list[TrialFigures] = []
    durations: list[float] = []
    interrupted = False
    stopped_because: str | None = None
    no_loader: str | None = None
    own_setting: int | None = None
    plan = strategy.Plan(start=strategy.start_count(cores, None, max_workers),
                         max_workers=max_workers, listed=options.listed)

    def one(num_workers: int | None, reason: TrialReason) -> TrialOutcome:
        run = 1 + sum(1 for t in trials if t.num_workers == num_workers and num_workers is not None)
        left = strategy.trials_left(trials, plan) if reason != "own_setting" else 1
        per_trial = (sum(durations) / len(durations) if durations
                     else settings.trial_s + settings.warmup + STARTUP_GUESS_S)
        progress.trial_started(len(trials) + 1, num_workers, reason, per_trial * max(1, left), left)
        outcome = run_trial(command, num_workers, reason, settings, run=run, environ=environ,
                            on_phase=progress.trial_phase)
        durations.append(outcome.duration_s)
        trials.append(outcome.figures)
        progress.trial_done(len(trials), outcome.figures)
        return outcome

    try:
        if options.listed is None and advise is not None:
            # A first trial at the program's own setting gives the live advice its fetch and step
            # times; its estimate is where the climb starts.
            outcome = one(None, "own_setting")
            own_setting = outcome.figures.num_workers
            if outcome.no_loader:
                no_loader = _no_loader_line(outcome.figures, settings)
            else:
                plan = strategy.Plan(start=strategy.start_count(
                    cores, _advised(advise, outcome), max_workers), max_workers=max_workers)
        while no_loader is None:
            step = strategy.next_trial(trials, plan)
            if isinstance(step, strategy.Stop):
                stopped_because = step.why
                break
            outcome = one(step.num_workers, step.reason)
            if outcome.no_loader and not any(strategy.usable(t) for t in trials):
                if outcome.figures.exit_code in (None, 0):
                    # No DataLoader within the start time, or a program that ended without one:
                    # every other count would wait as long for nothing.
                    no_loader = _no_loader_line(outcome.figures, settings)
    except KeyboardInterrupt:
        interrupted = True
        stopped_because = "interrupted (Ctrl-C)"
    if no_loader is not None:
        stopped_because = no_loader
    unsafe = strategy.duplicated_iterable(trials)
    unit: Literal["samples/s", "batches/s"] = "samples/s"
    measured = [t for t in trials if strategy.usable(t)]
    if measured and all(t.batch_size is None for t in measured):
        unit = "batches/s"
    best, text = recommend(trials, max_workers=max_workers, unsafe=unsafe, unit=unit,
                           own_setting=own_setting)
    if no_loader is not None:
        text = f"no recommendation: {no_loader}"
    elif unsafe is None and best is not None:
        caution = _iterable_caution(trials)
        if caution:
            text = f"{text}. {caution}"
    if interrupted:
        text = f"interrupted after {len(trials)} trial{'s' if len(trials) != 1 else ''}: {text}"
    document = TuneDocument(
        schema=TUNE_SCHEMA, command=shlex.join(command), trials=tuple(trials), best=best,
        recommendation=text, rate_unit=unit,
        strategy="listed" if options.listed is not None else "default",
        cores_available=round(cores, 2), max_workers=max_workers,
        trial_seconds=settings.trial_s, started_at=round(began_wall, 3),
        duration_s=round(time.monotonic() - began, 2), interrupted=interrupted,
        stopped_because=stopped_because, unsafe=unsafe)
    if interrupted:
        return TuneResult(document, EXIT_INTERRUPTED)
    if no_loader is not None:
        return TuneResult(document, EXIT_NOTHING, no_loader)
    if best is None and unsafe is None:
        return TuneResult(document, EXIT_NOTHING, text)
    return TuneResult(document, EXIT_OK)


def _advised(advise: Advice, outcome: TrialOutcome) -> int | None:
    if outcome.source is None or not strategy.usable(outcome.figures):
        return None
    try:
        count = advise(outcome.source, outcome.system)
    except Exception:  # the advice is a hint for the start; the procedure does not need it
        return None
    return count if isinstance(count, int) and count >= 0 else None


def _no_loader_line(trial: TrialFigures, settings: TrialSettings) -> str:
    if trial.exit_code is not None and trial.exit_code != 0:
        return f"the program failed before its first DataLoader batch ({trial.exit})"
    if trial.exit_code == 0:
        return "the program ended without creating a DataLoader (is it a PyTorch training job?)"
    return (f"no DataLoader created within {settings.start_s:g} s (--start-seconds): "
            "the program made none, or took longer to reach its first batch")


def _iterable_caution(trials: Sequence[TrialFigures]) -> str | None:
    """An iterable main loader whose epochs were too long to compare across trials: the
    duplicate check could not run, so say what to check."""
    measured = [t for t in trials if strategy.usable(t)]
    if measured and any(t.iterable for t in measured) and \
            sum(1 for t in measured if t.batches_per_epoch) < 2:
        return ("The main loader's dataset is an IterableDataset and no epoch ended within a "
                "trial: check that it splits its data by get_worker_info(), or more workers "
                "repeat it")
    return None
