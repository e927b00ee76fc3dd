"""`run --autotune`'s strategy (loadertop/autotune.py), fed epochs of made-up curves: pure, fast."""

from __future__ import annotations

from collections.abc import Callable

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


def test_a_long_epoch_leaves_its_warm_up_out_and_a_short_one_is_measured_whole():
    import time
    from types import SimpleNamespace

    from loadertop.probe.autotune import LoaderTuner

    class Inner:  # torch's iterator, as the tuner reads it (weakly referenced)
        _num_yielded = 101
        _workers: list = []

    loader = SimpleNamespace(num_workers=2, batch_size=8, dataset=None, persistent_workers=False)
    tuner = LoaderTuner(loader, "train", warm_up_ms=lambda: 2000.0)
    inner = Inner()
    tuner.started(loader, inner, time.perf_counter_ns() - 12 * 10**9)
    tuner.ended(tuner.epoch_token, 101)
    (rate,) = tuner.tuner.tried[2].rates
    assert abs(rate - 100 * 8 / 10.0) < 1.0  # 100 batches of 8 in the 10 s after the first batch
    short = LoaderTuner(loader, "train", warm_up_ms=lambda: 1000.0)
    short.started(loader, inner, time.perf_counter_ns() - 2 * 10**9)
    short.ended(short.epoch_token, 101)
    (rate,) = short.tuner.tried[2].rates
    assert abs(rate - 101 * 8 / 2.0) < 5.0  # measured whole: warm-up is part of a short epoch
