"""`loadertop run --autotune`'s strategy: which num_workers the next epoch gets, from the epochs
so far. Pure (no clock, no process, no torch): the probe feeds it one measured epoch at a time
(`EpochTuner.observe`) and applies the count it answers at the next epoch boundary; the viewer
side only reads what the probe publishes. See docs/contract.md §10 and docs/autotune.md.

The procedure is the tuning guide's §4.3, as `loadertop tune` runs it (loadertop/tuning/strategy.py),
with epochs in place of whole runs:

* **measure** a count over at least `MIN_EPOCHS` epochs (short epochs pooled), or one epoch of
  `LONG_EPOCH_S` or more; its rate is the mean of its epochs' samples/s, its noise the standard
  error of that mean relative to it;
* **climb** from the program's own count `CLIMB_STEP` workers at a time while a step gains at least
  `GAIN_MIN` (5 %) and more than `NOISE_SIGMAS` times the noise of the comparison;
* **refine** around the best: the pick is the smallest count within `GAIN_MIN` of the best rate;
  one below the pick is tried while counts stay within 5 %, one above only when nothing above the
  pick was measured;
* **settle** on the pick, and **watch**: when the mean of the last `REEXPLORE_EPOCHS` epochs falls
  below the pick's rate by more than the noise (and 5 %), explore again from the current count;
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

EXPLORING = "exploring"
SETTLED = "settled"
BACKING_OFF = "backing_off"


@dataclass
class Setting:
    """One num_workers and the epochs measured with it."""

    num_workers: int
    rates: list[float] = field(default_factory=list)  # samples/s, one per epoch
    seconds: float = 0.0
    note: str | None = None  # "memory" or "failed": never tried again

    @property
    def epochs(self) -> int:
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
        return self.epochs >= MIN_EPOCHS or (self.epochs >= 1 and self.seconds >= LONG_EPOCH_S)


@dataclass(frozen=True)
class Epoch:
    """One epoch as the probe saw it end."""

    num_workers: int
    samples: int
    seconds: float
    batches: int
    memory_pressure: str | None = None  # why, when the machine ran short during it


class EpochTuner:
    """The decision state of one loader. `observe` takes each ended epoch; `num_workers` is the
    count the next epoch gets."""

    def __init__(self, program_num_workers: int, max_workers: int) -> None:
        self.program_num_workers = program_num_workers
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

    def gain(self) -> float | None:
        """The pick's rate over the program's own count's, as a fraction (0.5 = +50 %)."""
        own = self.tried.get(self.program_num_workers)
        own_rate = own.rate if own is not None and own.rate else self.program_rate
        pick = self.pick()
        if not own_rate or pick is None or pick.rate is None:
            return None
        return pick.rate / own_rate - 1

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
                and (self.ceiling is None or n < self.ceiling))

    # ------------------------------------------------------------------ deciding
    def observe(self, epoch: Epoch) -> int:
        """Take one ended epoch; return the count for the next one."""
        self.epochs += 1
        n = epoch.num_workers
        if epoch.memory_pressure is not None:
            return self._back_off(n, epoch.memory_pressure)
        if epoch.batches < MIN_BATCHES or epoch.seconds <= 0 or n != self.num_workers:
            return self.num_workers  # too short to judge, or not the count we set
        rate = epoch.samples / epoch.seconds
        setting = self.tried.setdefault(n, Setting(n))
        if self.state == BACKING_OFF:  # the first epoch at the count backed off to: stay there
            reason = self.reason
            self._settle(n, "")
            self.reason = reason
        if self.state == SETTLED:
            return self._watch_settled(setting, rate, epoch.seconds)
        setting.rates.append(rate)
        setting.seconds += epoch.seconds
        if not setting.measured():
            self.reason = f"measuring {n} workers (epoch {setting.epochs} of {MIN_EPOCHS})"
            return n
        if self._climbing:
            return self._climb(setting)
        return self._refine()

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
            return self._refine(f"{n} is the most allowed")
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

    def _settle(self, n: int, why: str) -> int:
        self.state = SETTLED
        self._watch = []
        setting = self.tried.get(n)
        self._settled_rate = setting.rate if setting is not None else None
        gain = self.gain()
        told = f", {gain:+.0%} over the program's {self.program_num_workers}" if gain is not None else ""
        return self._set(n, f"settled on {n} workers{told}" + (f" ({why})" if why else ""))

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
        self.state = BACKING_OFF
        self._climbing = False
        self.num_workers = target
        self.reason = (f"memory pressure at {n} workers ({why}): back to {target}, "
                       f"{n} and more not tried again")
        return target
