"""`loadertop run --autotune`'s strategy: which num_workers the loader gets next, from what was
measured so far. Pure (no clock, no process, no torch): the probe feeds it one measurement at a
time — an ended epoch (`EpochTuner.observe`), or inside a long epoch a window of its batches
(`observe_window`) — and applies the count it answers at the next epoch boundary, or inside the
epoch where that pays (`worth_switching`); the viewer side only reads what the probe publishes.
See docs/contract.md §10 and docs/autotune.md.

The procedure is the tuning guide's §4.3, as `loadertop tune` runs it (loadertop/tuning/strategy.py),
with epochs in place of whole runs:

* **measure** a count over at least `MIN_EPOCHS` epochs (short epochs pooled), or one epoch of
  `LONG_EPOCH_S` or more; inside a long epoch, over at least `MIN_WINDOWS` windows of its batches
  (`MIN_MEASURE_S` in all) until the noise can tell a `GAIN_MIN` step (`NOISE_TARGET`) or the
  comparison with the count it climbed from is decided either way, at most `LONG_EPOCH_S`; its
  rate is the mean of its epochs' (windows') samples/s, its noise the standard error of that mean
  relative to it;
* **climb** from the program's own count `CLIMB_STEP` workers at a time while a step gains at least
  `GAIN_MIN` (5 %) and more than `NOISE_SIGMAS` times the noise of the comparison;
* **refine** around the best: the pick is the smallest count within `GAIN_MIN` of the best rate;
  one below the pick is tried while counts stay within 5 %, one above only when nothing above the
  pick was measured;
* **settle** on the pick, and **watch**: when each of the last `REEXPLORE_EPOCHS` epochs (inside an
  epoch: watch periods of `WATCH_MIN_S`, doubling up to `WATCH_MAX_S` while the rate holds) is below
  the pick's rate by more than the noise (and 5 %), explore again from the current count;
* **memory**: no count above `memory_cap` (the probe's prediction from the workers' measured
  memory) is tried;
* **prefetch_factor**: where most measurements of the settled count found its workers idle while
  the loop waited (`Epoch.starved`: with in-order batches a slow batch holds the loop, and the
  others' workers finish their `prefetch_factor` tasks and wait for more), its prefetch_factor is
  doubled, up to `PREFETCH_MAX`, while a doubling gains GAIN_MIN beyond the noise; one that does
  not is undone;
* **back off** at once on memory pressure: to the best count measured below, and no count from
  the one that pressed upward is tried again in the run; a count whose workers could not start is
  reverted and not tried again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GAIN_MIN = 0.05  # the guide's stop rule: a step that gains less than 5 % is not worth its workers
CLIMB_STEP = 2  # workers added per climbing step (the guide's)
NOISE_SIGMAS = 2.0  # a gain must exceed this many standard errors of the comparison
MIN_EPOCHS = 2  # short epochs pooled per count
LONG_EPOCH_S = 10.0  # an epoch at least this long is a measurement by itself
MIN_BATCHES = 4  # an epoch with fewer batches (a loop that broke at once) is not a measurement
REEXPLORE_EPOCHS = 3  # settled epochs below the pick's rate, in a row, before exploring again
# Inside a long epoch (docs/autotune.md, "Inside an epoch"):
MIN_WINDOWS = 3  # windows per count at least: their scatter is the noise
MIN_MEASURE_S = 1.5  # ... and this many seconds of them
# the noise at which a count's rate tells a GAIN_MIN step by NOISE_SIGMAS (both counts' noise alike)
NOISE_TARGET = GAIN_MIN / NOISE_SIGMAS / math.sqrt(2)
WATCH_MIN_S = 2.0  # a settled count's watch period, doubling while the rate holds ...
WATCH_MAX_S = 32.0  # ... up to this
EXPLORE_RUNWAY = 4.0  # a trial inside an epoch needs this many times its cost and measuring left
PREFETCH_MAX = 8  # prefetch_factor is doubled up to this
# A measurement is "starved" where the loop waited at least STARVED_WAIT of the time while the
# workers were busy at most STARVED_BUSY of theirs (the probe's figures: the loop's waits, the
# workers' fetch times).
STARVED_WAIT = 0.10
STARVED_BUSY = 0.80

EXPLORING = "exploring"
SETTLED = "settled"
BACKING_OFF = "backing_off"


@dataclass
class Setting:
    """One num_workers and the epochs measured with it."""

    num_workers: int
    rates: list[float] = field(default_factory=list)  # samples/s, one per epoch (or window)
    seconds: float = 0.0
    note: str | None = None  # "memory" or "failed": never tried again
    windows: int = 0  # of `rates`, those of windows inside an epoch
    starved: int = 0  # of `rates`, those whose workers idled while the loop waited

    @property
    def epochs(self) -> int:
        """Measurements: epochs, and windows inside an epoch."""
        return len(self.rates)

    @property
    def rate(self) -> float | None:
        return sum(self.rates) / len(self.rates) if self.rates else None

    @property
    def noise(self) -> float:
        """The standard error of `rate` relative to it (0 from fewer than two epochs)."""
        n = len(self.rates)
        mean = self.rate
        if n < 2 or not mean:
            return 0.0
        variance = sum((r - mean) ** 2 for r in self.rates) / (n - 1)
        return math.sqrt(variance / n) / mean

    def measured(self) -> bool:
        whole = len(self.rates) - self.windows
        if whole >= MIN_EPOCHS or (len(self.rates) >= 1 and self.seconds >= LONG_EPOCH_S):
            return True
        return (self.windows >= MIN_WINDOWS and self.seconds >= MIN_MEASURE_S
                and self.noise <= NOISE_TARGET)

    def can_tell(self) -> bool:
        """Enough windows for a comparison to be judged by its noise (see `_decided`)."""
        return self.windows >= MIN_WINDOWS and self.seconds >= MIN_MEASURE_S


@dataclass(frozen=True)
class Epoch:
    """One epoch as the probe saw it end (or, `window=True`, a window of a long epoch's batches,
    its count's warm-up left out)."""

    num_workers: int
    samples: int
    seconds: float
    batches: int
    memory_pressure: str | None = None  # why, when the machine ran short during it
    window: bool = False
    prefetch_factor: int | None = None  # the iterator's (None: not told)
    starved: bool = False  # the workers idled while the loop waited (see STARVED_WAIT)


def worth_switching(rate_now: float, rate_then: float | None, remaining_s: float,
                    cost_s: float, measure_s: float = MIN_MEASURE_S) -> bool:
    """Whether changing the count inside an epoch pays before the epoch ends: `remaining_s` at
    the current rate `rate_now`, a switch costing `cost_s` (the time it loses: new workers'
    start, the warm-up). To a count measured at `rate_then`: the time it saves over the rest of
    the epoch must exceed its cost, or, a count as fast (within GAIN_MIN) and fewer workers, the
    epoch must leave EXPLORE_RUNWAY times the cost. To a count not measured yet (`rate_then`
    None): the epoch must leave EXPLORE_RUNWAY times the cost and the measuring."""
    if remaining_s <= 0:
        return False
    if rate_then is None or rate_then <= 0 or rate_now <= 0:
        return remaining_s >= EXPLORE_RUNWAY * (cost_s + measure_s)
    saved = remaining_s * (1 - rate_now / rate_then)
    if saved > cost_s:
        return True
    return rate_then >= rate_now * (1 - GAIN_MIN) and remaining_s >= EXPLORE_RUNWAY * cost_s


class EpochTuner:
    """The decision state of one loader. `observe` takes each ended epoch; `num_workers` is the
    count the next epoch gets."""

    def __init__(self, program_num_workers: int, max_workers: int,
                 program_prefetch_factor: int | None = None) -> None:
        self.program_num_workers = program_num_workers
        self.program_prefetch_factor = program_prefetch_factor
        self.prefetch_factor = program_prefetch_factor  # the one the loader gets next
        self._prefetch_trial: Setting | None = None  # measurements at a doubled prefetch_factor
        self._prefetch_base: Setting | None = None  # ... and at the one before it
        self._prefetch_rejected: set[int] = set()  # doublings that gained nothing
        self.prefetch_gains: dict[int, float] = {}  # a doubling to this prefetch_factor: its gain
        self.max_workers = max(max_workers, program_num_workers)
        self.num_workers = program_num_workers
        self.state = EXPLORING
        self.reason = f"measuring the program's {program_num_workers} workers"
        self.tried: dict[int, Setting] = {}
        self.ceiling: int | None = None  # counts from here up pressed memory: never again
        self.failed: set[int] = set()
        self.epochs = 0
        self._climbing = True
        self._climb_from: int | None = None  # the count the current climbing step is judged against
        self._watch: list[float] = []
        self._settled_rate: float | None = None
        self.program_rate: float | None = None  # the program's own count's, kept over a re-exploration
        self.memory_cap: int | None = None  # the most workers predicted to fit in memory (the probe's)
        self.memory_why = ""  # ... and why
        self._watch_period = WATCH_MIN_S  # inside an epoch: the settled count's watch period ...
        self._watch_acc = (0.0, 0.0)  # ... and the (samples, seconds) gathered for it

    # ------------------------------------------------------------------ reading
    def best(self) -> Setting | None:
        measured = [s for s in self.tried.values() if s.rate is not None and s.note is None]
        return max(measured, key=lambda s: s.rate or 0.0, default=None)

    def pick(self) -> Setting | None:
        """The smallest measured count within GAIN_MIN of the best rate."""
        best = self.best()
        if best is None or best.rate is None:
            return None
        close = [s for s in self.tried.values() if s.note is None and s.measured()
                 and s.rate is not None and s.rate >= best.rate * (1 - GAIN_MIN)]
        return min(close, key=lambda s: s.num_workers, default=best)

    def pick_rate(self) -> float | None:
        """The pick's rate, with the prefetch_factor kept for it where one was (see
        `_prefetch_step`)."""
        pick = self.pick()
        if pick is None:
            return None
        base = self._prefetch_base
        if (base is not None and base is not pick and base.num_workers == pick.num_workers
                and self.prefetch_factor != self.program_prefetch_factor and base.rate):
            return base.rate
        return pick.rate

    def gain(self) -> float | None:
        """The pick's rate over the program's own count's, as a fraction (0.5 = +50 %)."""
        own = self.tried.get(self.program_num_workers)
        own_rate = own.rate if own is not None and own.rate else self.program_rate
        rate = self.pick_rate()
        if not own_rate or rate is None:
            return None
        return rate / own_rate - 1

    def epoch_noise(self) -> float:
        """How much one epoch's rate scatters, relative to its count's mean: the pooled standard
        deviation over the counts measured more than once (0 when none was)."""
        squares, degrees = 0.0, 0
        for s in self.tried.values():
            mean = s.rate
            if s.epochs >= 2 and mean:
                squares += sum((r / mean - 1) ** 2 for r in s.rates)
                degrees += s.epochs - 1
        return math.sqrt(squares / degrees) if degrees else 0.0

    def allowed(self, n: int) -> bool:
        return (1 <= n <= self.max_workers and n not in self.failed
                and (self.ceiling is None or n < self.ceiling)
                and (self.memory_cap is None or n <= self.memory_cap
                     or n <= self.num_workers))

    def set_memory_cap(self, cap: int | None, why: str = "") -> None:
        """The most workers the probe predicts fit under the memory margin (None: no limit)."""
        self.memory_cap = cap
        self.memory_why = why

    # ------------------------------------------------------------------ deciding
    def observe(self, epoch: Epoch) -> int:
        """Take one ended epoch (or a window of one: `epoch.window`); return the count to go on
        with."""
        self.epochs += not epoch.window
        n = epoch.num_workers
        if epoch.memory_pressure is not None:
            return self._back_off(n, epoch.memory_pressure)
        if epoch.batches < MIN_BATCHES or epoch.seconds <= 0 or n != self.num_workers or (
                None not in (epoch.prefetch_factor, self.prefetch_factor)
                and epoch.prefetch_factor != self.prefetch_factor):
            return self.num_workers  # too short to judge, or not the setting we set
        rate = epoch.samples / epoch.seconds
        if self._prefetch_trial is not None:
            return self._prefetch_step(epoch, rate)
        setting = self.tried.setdefault(n, Setting(n))
        if self.state == BACKING_OFF:  # the first measurement at the count backed off to: stay
            reason = self.reason
            self._settle(n, "")
            self.reason = reason
        if self.state == SETTLED:
            if epoch.window:
                return self._watch_window(setting, epoch)
            return self._watch_settled(setting, rate, epoch.seconds)
        _add(setting, epoch, rate)
        if not setting.measured() and not self._decided(setting):
            if epoch.window:
                self.reason = f"measuring {n} workers ({setting.seconds:.1f} s)"
            else:
                self.reason = f"measuring {n} workers (epoch {setting.epochs} of {MIN_EPOCHS})"
            return n
        if self._climbing:
            return self._climb(setting)
        return self._refine()

    def _decided(self, setting: Setting, base: Setting | None = None) -> bool:
        """Inside an epoch, a step whose gain over the setting it is judged against (the count
        a climbing step climbed from, or `base`) is already clear either way — at least GAIN_MIN
        by more than NOISE_SIGMAS noises, or short of it by as much — needs no more measuring (a
        big step is seen in a few windows)."""
        if base is None and self._climbing and self._climb_from is not None:
            base = self.tried.get(self._climb_from)
        if not (setting.can_tell() and base is not None and base.rate and setting.rate is not None):
            return False
        gain = setting.rate / base.rate - 1
        margin = NOISE_SIGMAS * math.hypot(setting.noise, base.noise)
        return gain - margin >= GAIN_MIN or gain + margin < GAIN_MIN

    # ------------------------------------------------------------------ prefetch_factor
    def _wants_prefetch(self, setting: Setting | None) -> bool:
        pf = self.prefetch_factor
        return (pf is not None and setting is not None and setting.epochs > 0
                and 2 * setting.starved > setting.epochs and 2 * pf <= PREFETCH_MAX
                and 2 * pf not in self._prefetch_rejected)

    def _start_prefetch(self, n: int, base: Setting) -> int:
        """Try the settled count with its prefetch_factor doubled."""
        assert self.prefetch_factor is not None  # _wants_prefetch
        self._prefetch_base = base
        self.prefetch_factor *= 2
        self._prefetch_trial = Setting(n)
        self.state = EXPLORING
        return self._set(n, f"{n} workers idle while the loop waits for a batch: trying "
                            f"prefetch_factor {self.prefetch_factor}")

    def _prefetch_step(self, epoch: Epoch, rate: float) -> int:
        trial, base = self._prefetch_trial, self._prefetch_base
        assert trial is not None and base is not None and self.prefetch_factor is not None
        n, pf = trial.num_workers, self.prefetch_factor
        _add(trial, epoch, rate)
        if not trial.measured() and not self._decided(trial, base):
            self.reason = f"measuring prefetch_factor {pf} at {n} workers"
            return n
        self._prefetch_trial = None
        gain = (trial.rate or 0.0) / (base.rate or 1.0) - 1
        self.prefetch_gains[pf] = gain
        if gain >= GAIN_MIN and gain > NOISE_SIGMAS * math.hypot(trial.noise, base.noise):
            self._prefetch_base = trial
            return self._settle(n, f"prefetch_factor {pf} gained {gain:+.0%} over {pf // 2}",
                                trial)
        self._prefetch_rejected.add(pf)
        self.prefetch_factor = pf // 2
        return self._settle(n, f"prefetch_factor {pf} gained {gain:+.0%}: back to {pf // 2}",
                            base)

    def failed_to_start(self, n: int, previous: int) -> int:
        """The workers of count `n` could not start: it is reverted, never tried again."""
        self.failed.add(n)
        self.tried.setdefault(n, Setting(n)).note = "failed"
        self.reason = f"{n} workers could not start: back to {previous}"
        self.num_workers = previous
        self._climbing = False
        return previous

    def _set(self, n: int, reason: str) -> int:
        self.num_workers = n
        self.reason = reason
        return n

    def _climb(self, setting: Setting) -> int:
        n = setting.num_workers
        base = self.tried.get(self._climb_from) if self._climb_from is not None else None
        if base is not None and base.rate and setting.rate is not None:
            gain = setting.rate / base.rate - 1
            noise = math.hypot(setting.noise, base.noise)
            if gain < GAIN_MIN or gain <= NOISE_SIGMAS * noise:
                self._climbing = False
                return self._refine(f"{n} gained {gain:+.0%} over {base.num_workers}")
        up = n + CLIMB_STEP
        while up > n and not self.allowed(up):
            up -= 1
        if up <= n:
            self._climbing = False
            limit = (f"memory: {self.memory_why}" if self.memory_cap is not None
                     and n >= self.memory_cap and self.memory_why else "the most allowed")
            return self._refine(f"{n} is {limit}")
        self._climb_from = n
        what = (f"{n} gave {setting.rate:.0f} samples/s" if setting.rate is not None else f"{n}")
        return self._set(up, f"climbing: {what}; trying {up}")

    def _refine(self, why: str = "") -> int:
        pick = self.pick()
        if pick is None:
            return self._settle(self.num_workers, why)
        p = pick.num_workers
        above_tried = any(s.num_workers > p and s.measured() for s in self.tried.values())
        for candidate in (p - 1, p + 1):
            if candidate == p + 1 and above_tried:
                continue
            if candidate in self.tried or not self.allowed(candidate):
                continue
            prefix = f"{why}; " if why else ""
            return self._set(candidate, f"{prefix}refining around {p}: trying {candidate}")
        return self._settle(p, why)

    def _settle(self, n: int, why: str, setting: Setting | None = None) -> int:
        """Settle on `n` (measured as `setting`: by default its entry in `tried`); then, where
        its workers idled while the loop waited, try a larger prefetch_factor."""
        self.state = SETTLED
        self._watch = []
        self._watch_period = WATCH_MIN_S
        self._watch_acc = (0.0, 0.0)
        setting = setting if setting is not None else self.tried.get(n)
        self._settled_rate = setting.rate if setting is not None else None
        gain = self.gain()
        told = f", {gain:+.0%} over the program's {self.program_num_workers}" if gain is not None else ""
        if self.memory_cap is not None and n >= self.memory_cap and self.memory_why \
                and "memory" not in why:
            why = f"{why}; " if why else ""
            why += f"memory: {self.memory_why}"
        if self.prefetch_factor != self.program_prefetch_factor:
            told += f", prefetch_factor {self.prefetch_factor}"
        settled = self._set(n, f"settled on {n} workers{told}" + (f" ({why})" if why else ""))
        if self._wants_prefetch(setting):
            return self._start_prefetch(n, setting)  # type: ignore[arg-type]  # not None
        return settled

    def _watch_settled(self, setting: Setting, rate: float, seconds: float) -> int:
        n = setting.num_workers
        self._watch.append(rate)
        self._watch = self._watch[-REEXPLORE_EPOCHS:]
        if self._settled_rate is None:
            self._settled_rate = rate
        reference = self._settled_rate
        if len(self._watch) < REEXPLORE_EPOCHS:
            return n
        margin = max(GAIN_MIN, NOISE_SIGMAS * self.epoch_noise())
        if any(r >= reference * (1 - margin) for r in self._watch):
            return n  # not every one of the last epochs fell: one slow epoch is not a change
        recent = sum(self._watch) / len(self._watch)
        # The data or the machine changed: what was measured before no longer holds.
        fall = recent / reference - 1
        kept = {k: s for k, s in self.tried.items() if s.note is not None}
        own = self.tried.get(self.program_num_workers)
        if own is not None and own.rate and self.program_rate is None:
            self.program_rate = own.rate  # the gain stays told against the program's own count
        self.tried = kept
        self._prefetch_rejected = set()  # what a doubling of prefetch_factor gains changed too
        fresh = self.tried.setdefault(n, Setting(n))
        fresh.rates = list(self._watch)
        fresh.seconds = seconds * len(self._watch)
        self.state = EXPLORING
        self._climbing = True
        self._climb_from = None
        self._watch = []
        fell = f"throughput fell {fall:+.0%} at {n} workers for {REEXPLORE_EPOCHS} epochs"
        nxt = self._climb(fresh)
        self.reason = f"{fell}: exploring again; {self.reason}"
        return nxt

    def _watch_window(self, setting: Setting, window: Epoch) -> int:
        """A settled count inside an epoch: windows gathered into watch periods, each judged as
        a settled epoch is; the period doubles while the rate holds (re-exploring starts it
        over)."""
        samples, seconds = self._watch_acc
        samples, seconds = samples + window.samples, seconds + window.seconds
        if seconds < self._watch_period:
            self._watch_acc = (samples, seconds)
            return self.num_workers
        self._watch_acc = (0.0, 0.0)
        n = self._watch_settled(setting, samples / seconds, seconds)
        if self.state == SETTLED:
            self._watch_period = min(WATCH_MAX_S, 2 * self._watch_period)
        else:
            self._watch_period = WATCH_MIN_S
        return n

    def _back_off(self, n: int, why: str) -> int:
        self.ceiling = n if self.ceiling is None else min(self.ceiling, n)
        setting = self.tried.setdefault(n, Setting(n))
        setting.note = "memory"
        below = [s for s in self.tried.values() if s.num_workers < n and s.note is None
                 and s.rate is not None]
        if below:
            target = max(below, key=lambda s: s.rate or 0.0).num_workers
        else:
            target = max(1, n - 1)
        if self.prefetch_factor != self.program_prefetch_factor:  # more batches in flight: undone
            if self.prefetch_factor is not None:
                self._prefetch_rejected.add(self.prefetch_factor)
            self.prefetch_factor = self.program_prefetch_factor
        self._prefetch_trial = None
        self.state = BACKING_OFF
        self._climbing = False
        self.num_workers = target
        self.reason = (f"memory pressure at {n} workers ({why}): back to {target}, "
                       f"{n} and more not tried again")
        return target


def _add(setting: Setting, epoch: Epoch, rate: float) -> None:
    setting.rates.append(rate)
    setting.seconds += epoch.seconds
    setting.windows += epoch.window
    setting.starved += epoch.starved
