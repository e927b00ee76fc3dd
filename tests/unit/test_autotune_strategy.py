"""`run --autotune`'s strategy (loadertop/autotune.py), fed epochs of made-up curves: pure, fast."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from loadertop.autotune import (
    BACKING_OFF,
    EXPLORING,
    REEXPLORE_EPOCHS,
    SETTLED,
    Epoch,
    EpochTuner,
)


def knee(slots: int, per_worker: float = 100.0) -> Callable[[int], float]:
    """samples/s of a store that serves `slots` reads at once: linear, then flat."""
    return lambda n: per_worker * min(n, slots)


def run(tuner: EpochTuner, curve: Callable[[int], float], epochs: int,
        pressure: Callable[[int], str | None] = lambda n: None) -> list[int]:
    counts = []
    for _ in range(epochs):
        n = tuner.num_workers
        counts.append(n)
        rate = curve(n)
        tuner.observe(Epoch(num_workers=n, samples=int(rate * 2), seconds=2.0, batches=50,
                            memory_pressure=pressure(n)))
    return counts


def test_climbs_from_the_programs_count_refines_and_settles_on_the_knee():
    tuner = EpochTuner(2, max_workers=16)
    counts = run(tuner, knee(5), 16)
    assert tuner.state == SETTLED
    assert tuner.num_workers == 5
    assert counts[:2] == [2, 2]  # the program's own count, measured first (2 epochs pooled)
    assert counts[2:4] == [4, 4] and counts[4:6] == [6, 6]  # climbing 2 at a time
    assert counts[6:8] == [8, 8]  # 6 gained 20 % over 4, so one more step
    assert counts[8:10] == [5, 5]  # 8 gained nothing: refine below the best, 5 is as good as 6
    assert set(counts[10:]) == {5}
    assert tuner.gain() is not None and abs(tuner.gain() - 1.5) < 1e-9  # type: ignore[operator]
    assert "settled on 5" in tuner.reason


def test_a_program_already_at_its_knee_stays_there():
    tuner = EpochTuner(4, max_workers=16)
    run(tuner, knee(4), 10)
    assert tuner.state == SETTLED and tuner.num_workers == 4


def test_noise_stops_a_climb_whose_gain_it_explains():
    rates = iter([100, 140, 100, 140, 104, 150, 104, 150] + [120] * 20)
    tuner = EpochTuner(2, max_workers=16)
    for _ in range(12):
        n = tuner.num_workers
        tuner.observe(Epoch(num_workers=n, samples=2 * next(rates), seconds=2.0, batches=50))
    # 4 gave +5.7 % over 2, but each count's epochs scatter by ±17 %: not a gain
    assert 6 not in tuner.tried


def test_memory_pressure_backs_off_at_once_and_never_retries_that_count():
    tuner = EpochTuner(2, max_workers=16)
    counts = run(tuner, knee(8), 20, pressure=lambda n: "swap activity" if n >= 6 else None)
    first = counts.index(6)
    assert counts[first + 1] == 4  # back at once (one epoch, not pooled) to the best below
    assert 6 not in counts[first + 1:] and max(counts[first + 1:]) < 6
    assert tuner.tried[6].note == "memory"
    assert tuner.state == SETTLED and tuner.num_workers in (4, 5)


def test_back_off_state_shows_until_the_next_epoch():
    tuner = EpochTuner(2, max_workers=16)
    run(tuner, knee(8), 2)
    tuner.observe(Epoch(num_workers=4, samples=800, seconds=2.0, batches=50,
                        memory_pressure="available memory 5 %"))
    assert tuner.state == BACKING_OFF and tuner.num_workers == 2
    assert "memory pressure at 4" in tuner.reason


def test_a_count_that_cannot_start_is_reverted_and_not_tried_again():
    tuner = EpochTuner(2, max_workers=16)
    run(tuner, knee(8), 2)
    assert tuner.num_workers == 4
    assert tuner.failed_to_start(4, 2) == 2
    counts = run(tuner, knee(8), 8)
    assert 4 not in counts
    assert tuner.tried[4].note == "failed"


def test_a_settled_tuner_explores_again_when_throughput_falls_for_several_epochs():
    tuner = EpochTuner(2, max_workers=16)
    run(tuner, knee(4), 14)
    assert tuner.state == SETTLED and tuner.num_workers == 4
    # the store now serves 8 at once, but is slower per read: 4 workers give less
    counts = run(tuner, knee(8, per_worker=60.0), REEXPLORE_EPOCHS)
    assert tuner.state == EXPLORING and "fell" in tuner.reason
    assert tuner.num_workers == 6  # climbing on from the current count
    counts = run(tuner, knee(8, per_worker=60.0), 20)
    assert tuner.state == SETTLED and tuner.num_workers == 8
    assert set(counts[-3:]) == {8}


def test_a_settled_tuner_ignores_one_slow_epoch():
    tuner = EpochTuner(2, max_workers=16)
    run(tuner, knee(4), 14)
    slow = iter([50.0, 400.0, 400.0, 400.0])
    run(tuner, lambda n: next(slow), 4)
    assert tuner.state == SETTLED


def test_short_or_foreign_epochs_are_not_measurements():
    tuner = EpochTuner(2, max_workers=16)
    tuner.observe(Epoch(num_workers=2, samples=8, seconds=0.1, batches=1))  # a loop that broke
    assert tuner.tried == {} and tuner.num_workers == 2


def test_a_long_epoch_is_a_measurement_by_itself():
    tuner = EpochTuner(2, max_workers=16)
    tuner.observe(Epoch(num_workers=2, samples=2000, seconds=12.0, batches=250))
    assert tuner.num_workers == 4


def test_the_climb_stops_at_the_maximum():
    tuner = EpochTuner(2, max_workers=3)
    counts = run(tuner, knee(16), 10)
    assert max(counts) == 3 and tuner.num_workers == 3


def test_the_viewers_line_says_what_the_tuner_does_and_what_it_gained():
    from loadertop import wire
    from loadertop.client.model import _autotune
    from loadertop.views.text import autotune_words

    report = wire.AutotuneReport(
        state="exploring", num_workers=6, program_num_workers=2, epoch=7, best_num_workers=5,
        best_samples_per_s=244.0, reason="refining around 5: trying 6",
        tried=(wire.AutotuneSetting(num_workers=2, samples_per_s=97.6, noise=0.01, epochs=2),
               wire.AutotuneSetting(num_workers=5, samples_per_s=244.0, noise=0.02, epochs=2)))
    import msgspec

    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(report), type=wire.AutotuneReport)
    figures = _autotune(decoded)

    class _Src:
        autotune = figures

    assert autotune_words(_Src()) == ("autotune · epoch 7 · trying 6 workers · 5 gave 244 "  # type: ignore[arg-type]
                                      "samples/s, +150 % over the program's 2")
    assert _autotune(None) is None


def test_a_long_epoch_leaves_its_warm_up_out_and_a_short_one_is_measured_whole(monkeypatch):
    from types import SimpleNamespace

    from loadertop.probe import autotune as probe_autotune
    from loadertop.probe.autotune import LoaderTuner

    now_ns = 10**12  # the tuner's clock, held still: an epoch lasts what the test says, at any speed
    monkeypatch.setattr(probe_autotune, "_clock_ns", lambda: now_ns)

    class Inner:  # torch's iterator, as the tuner reads it (weakly referenced)
        _num_yielded = 101
        _workers: list = []

    loader = SimpleNamespace(num_workers=2, batch_size=8, dataset=None, persistent_workers=False)
    tuner = LoaderTuner(loader, "train", warm_up_ms=lambda: 2000.0)
    inner = Inner()
    tuner.started(loader, inner, now_ns - 12 * 10**9)
    tuner.ended(tuner.epoch_token, 101)
    (rate,) = tuner.tuner.tried[2].rates
    assert rate == pytest.approx(100 * 8 / 10.0)  # 100 batches of 8 in the 10 s after the first batch
    short = LoaderTuner(loader, "train", warm_up_ms=lambda: 1000.0)
    short.started(loader, inner, now_ns - 2 * 10**9)
    short.ended(short.epoch_token, 101)
    (rate,) = short.tuner.tried[2].rates
    assert rate == pytest.approx(101 * 8 / 2.0)  # measured whole: warm-up is part of a short epoch


# ---------------------------------------------------------------- inside a long epoch: windows
def windows(tuner: EpochTuner, curve: Callable[[int], float], count: int,
            seconds: float = 0.6, scatter: tuple[float, ...] = (0.0,)) -> list[int]:
    """Feed `count` windows of `seconds` at the tuner's current count; the counts it answers."""
    out = []
    for i in range(count):
        n = tuner.num_workers
        rate = curve(n) * (1 + scatter[i % len(scatter)])
        out.append(tuner.observe(Epoch(num_workers=n, samples=int(rate * seconds),
                                       seconds=seconds, batches=40, window=True)))
    return out


def test_windows_climb_refine_and_settle_inside_one_epoch():
    tuner = EpochTuner(2, max_workers=16)
    counts = []
    for _ in range(40):
        counts.append(tuner.num_workers)
        windows(tuner, knee(5), 1)
    assert tuner.state == SETTLED and tuner.num_workers == 5
    assert tuner.epochs == 0  # windows are not epochs
    assert counts[:3] == [2, 2, 2]  # MIN_WINDOWS of 0.6 s: 1.8 s >= MIN_MEASURE_S
    assert counts[3] == 4 and 6 in counts and 8 in counts
    assert tuner.tried[2].windows == 3


def test_a_window_measurement_waits_until_its_noise_can_tell_a_five_percent_step():
    from loadertop.autotune import MIN_WINDOWS, NOISE_TARGET

    tuner = EpochTuner(4, max_workers=16)
    answered = windows(tuner, knee(8), 20, scatter=(0.08, -0.08))  # +-8 %: not measured at once
    first_move = next(i for i, n in enumerate(answered) if n != 4)
    assert first_move >= MIN_WINDOWS
    setting = tuner.tried[4]
    assert setting.noise <= NOISE_TARGET or setting.seconds >= 10.0


def test_a_big_step_is_decided_in_few_windows_and_a_flat_one_stops_the_climb():
    tuner = EpochTuner(2, max_workers=16)
    windows(tuner, knee(4), 3)  # 2 measured
    assert tuner.num_workers == 4
    windows(tuner, knee(4), 3, scatter=(0.03, -0.03, 0.0))  # +100 % with 3 % scatter: decided
    assert tuner.num_workers == 6
    windows(tuner, knee(4), 20, scatter=(0.03, -0.03, 0.0))  # 6 as fast as 4: the climb stops
    assert 8 not in tuner.tried and tuner.tried[6].rate is not None


def test_a_settled_count_inside_an_epoch_is_watched_in_doubling_periods_and_a_fall_re_explores():
    from loadertop.autotune import WATCH_MIN_S

    tuner = EpochTuner(4, max_workers=16)
    for _ in range(60):
        if tuner.state == SETTLED:
            break
        windows(tuner, knee(4), 1)
    assert tuner.state == SETTLED and tuner.num_workers == 4
    assert tuner._watch_period == WATCH_MIN_S
    windows(tuner, knee(4), math.ceil(WATCH_MIN_S / 0.6))
    assert tuner._watch_period == 2 * WATCH_MIN_S  # the rate held: the next period is longer
    slower = knee(8, per_worker=60.0)  # the store got slower per read, serves more at once
    for _ in range(200):
        windows(tuner, slower, 1)
        if tuner.state == EXPLORING:
            break
    assert tuner.state == EXPLORING and "fell" in tuner.reason and tuner.num_workers == 6


def test_a_switch_inside_an_epoch_must_pay_for_itself_before_the_epoch_ends():
    from loadertop.autotune import worth_switching

    # to a measured count: the time saved over the rest of the epoch against the switch's cost
    assert worth_switching(100.0, 200.0, remaining_s=10.0, cost_s=0.5)
    assert not worth_switching(100.0, 200.0, remaining_s=0.8, cost_s=0.5)
    # as fast, fewer workers: only with a long runway
    assert worth_switching(200.0, 199.0, remaining_s=30.0, cost_s=0.5)
    assert not worth_switching(200.0, 199.0, remaining_s=1.5, cost_s=0.5)
    # slower: never for its rate
    assert not worth_switching(200.0, 150.0, remaining_s=30.0, cost_s=0.5)
    # a count not measured yet: its cost and its measuring, EXPLORE_RUNWAY times
    assert worth_switching(100.0, None, remaining_s=9.0, cost_s=0.5)
    assert not worth_switching(100.0, None, remaining_s=7.0, cost_s=0.5)


def test_memory_caps_the_climb_and_says_why():
    tuner = EpochTuner(2, max_workers=16)
    tuner.set_memory_cap(4, "5 workers of 900 MiB each would pass 90% of available memory")
    counts = run(tuner, knee(8), 16)
    assert max(counts) == 4
    assert tuner.state == SETTLED and tuner.num_workers == 4
    assert "memory" in tuner.reason


def test_the_memory_plan_predicts_a_worker_from_the_largest_and_its_growth(monkeypatch):
    from loadertop.probe import tuner_memory

    sizes = {11: [100 << 20, 140 << 20], 12: [120 << 20, 130 << 20]}
    clock = iter([0.0, 2.0])
    plan = tuner_memory.MemoryPlan(clock=lambda: next(clock))
    reads = {11: iter(sizes[11]), 12: iter(sizes[12])}
    monkeypatch.setattr(tuner_memory, "uss_bytes", lambda pid: next(reads[pid]))
    monkeypatch.setattr(tuner_memory, "_resident_bytes", lambda: 1 << 40)
    assert plan.read([11, 12]) and plan.read([11, 12])
    # worker 11 grew 40 MiB in 2 s: in 10 s more it will be 340 MiB
    assert plan.per_worker(10.0) == (140 << 20) + 200 * (1 << 20)
    monkeypatch.setattr(tuner_memory, "headroom", lambda: (1 << 30, "available memory"))
    cap, why = plan.cap(10.0)
    # 1 GiB more beside the 270 MiB the two use now, at 340 MiB a worker
    assert cap == ((1 << 30) + (270 << 20)) // (340 << 20)
    assert "available memory" in why
    # growth is carried 60 s ahead at most, and by no more than the main process holds
    assert plan.per_worker(3600.0) == (140 << 20) + 1200 * (1 << 20)
    assert plan.per_worker(3600.0, bound=50 << 20) == (140 << 20) + (50 << 20)


def test_the_viewers_line_names_the_latest_switch():
    from loadertop import wire
    from loadertop.client.model import _autotune
    from loadertop.views.text import switch_words

    report = wire.AutotuneReport(
        state="exploring", num_workers=4, program_num_workers=2, epoch=0, best_num_workers=4,
        best_samples_per_s=190.0, reason="climbing", tried=(),
        switches=(wire.AutotuneSwitch(epoch=0, batch=1234, from_workers=2, to_workers=4,
                                      reason="climbing: 2 gave 98 samples/s; trying 4",
                                      gain=0.88),),
        switch_count=1)
    import msgspec

    encoded = msgspec.msgpack.encode(report)
    figures = _autotune(msgspec.msgpack.decode(encoded, type=wire.AutotuneReport))

    class _Src:
        autotune = figures

    assert switch_words(_Src()) == "2 → 4 workers at batch 1,234 of epoch 0: +88 %"  # type: ignore[arg-type]
    doc = msgspec.json.decode(msgspec.json.encode(figures))
    assert doc["switches"] == [{"epoch": 0, "batch": 1234, "from": 2, "to": 4,
                                "reason": "climbing: 2 gave 98 samples/s; trying 4",
                                "gain": 0.88, "prefetch_factor": None}]


# ---------------------------------------------------------------- prefetch_factor
def bursty(n: int, prefetch: int) -> float:
    """A store whose batches are sometimes slow: in-order batches hold the loop, and the other
    workers idle once their prefetch_factor tasks are done, so a deeper prefetch pays, up to 4."""
    return knee(4)(n) * (1.0 + 0.5 * (min(prefetch, 4) > 2))


def feed(tuner: EpochTuner, curve: Callable[[int, int], float], epochs: int,
         starved: Callable[[int, int], bool]) -> list[tuple[int, int | None]]:
    settings = []
    for _ in range(epochs):
        n, pf = tuner.num_workers, tuner.prefetch_factor
        settings.append((n, pf))
        rate = curve(n, pf or 2)
        tuner.observe(Epoch(num_workers=n, samples=int(rate * 2), seconds=2.0, batches=50,
                            prefetch_factor=pf, starved=starved(n, pf or 2)))
    return settings


def test_workers_idle_while_the_loop_waits_a_deeper_prefetch_is_tried_and_kept_where_it_pays():
    tuner = EpochTuner(2, max_workers=16, program_prefetch_factor=2)
    settings = feed(tuner, bursty, 30, starved=lambda n, pf: pf < 4)
    assert tuner.state == SETTLED and tuner.num_workers == 4
    assert tuner.prefetch_factor == 4  # 4 gained +50 %; 8 was not tried: no longer starved
    assert (4, 8) not in settings and (4, 4) in settings
    assert "prefetch_factor 4" in tuner.reason


def test_a_deeper_prefetch_that_gains_nothing_is_undone_and_not_tried_again():
    tuner = EpochTuner(2, max_workers=16, program_prefetch_factor=2)
    settings = feed(tuner, lambda n, pf: knee(4)(n), 30, starved=lambda n, pf: True)
    assert tuner.state == SETTLED and tuner.prefetch_factor == 2
    assert settings.count((4, 4)) == 2  # measured once (2 epochs), then back to 2
    assert "back to 2" in tuner.reason


def test_not_starved_no_prefetch_is_tried():
    tuner = EpochTuner(2, max_workers=16, program_prefetch_factor=2)
    settings = feed(tuner, bursty, 30, starved=lambda n, pf: False)
    assert {pf for _, pf in settings} == {2}
