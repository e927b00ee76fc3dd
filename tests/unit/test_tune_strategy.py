"""`loadertop.tuning.strategy`: which count runs next, when the search stops, and the pick.

Trials are built as the runner would record them; a `curve` maps num_workers to samples/s and
`run_search` plays the whole procedure against it, as a program with that curve would answer.
"""

from __future__ import annotations

import pytest

from loadertop.tuning import strategy
from loadertop.tuning.document import TrialFigures
from loadertop.tuning.strategy import Next, Plan, Stop, next_trial


def trial(workers: int, rate: float | None, *, spread: float | None = 1.0, reason="climb",
          memory_short: bool = False, exit_code: int | None = None, problem: str | None = None,
          run: int = 1, iterable: bool | None = None, epoch: float | None = None) -> TrialFigures:
    return TrialFigures(
        num_workers=workers, samples_per_s=rate, wait_fraction=0.5, cpu_percent=50.0,
        mem_available_bytes=8 << 30, swap_active=memory_short, category="input_bound_io",
        exit=None if exit_code is None else f"exit {exit_code}: boom", exit_code=exit_code,
        run=run, reason=reason, spread_samples_per_s=spread, memory_short=memory_short,
        problem=problem, iterable=iterable, batches_per_epoch=epoch, batch_size=4,
        worker_rss_bytes=100 << 20)


def run_search(curve, plan: Plan, *, spread=1.0, short_from: int | None = None,
               fail_from: int | None = None, noise=None) -> tuple[list[TrialFigures], Stop]:
    """Play the strategy against a program whose rate at w workers is curve(w)."""
    trials: list[TrialFigures] = []
    for _ in range(40):
        step = next_trial(trials, plan)
        if isinstance(step, Stop):
            return trials, step
        w = step.num_workers
        run = 1 + sum(t.num_workers == w for t in trials)
        rate = curve(w) + (noise(w, run) if noise else 0.0)
        if fail_from is not None and w >= fail_from:
            trials.append(trial(w, None, exit_code=137, reason=step.reason, run=run))
        else:
            trials.append(trial(w, rate, spread=spread, reason=step.reason, run=run,
                                memory_short=short_from is not None and w >= short_from))
    raise AssertionError("the search did not stop")


def knee_at(k: int, per_worker: float = 50.0):
    return lambda w: per_worker * min(max(w, 1), k)


# ------------------------------------------------------------------------------- the start
@pytest.mark.parametrize("cores, expected", [(1, 1), (2, 1), (4, 1), (6, 2), (8, 2), (16, 4),
                                             (1.5, 1), (64, 16)])
def test_the_start_is_a_quarter_of_the_cores(cores, expected):
    assert strategy.quarter_of_cores(cores) == expected


def test_the_start_follows_the_advice_and_stays_under_the_maximum():
    assert strategy.start_count(16, 7, 32) == 7
    assert strategy.start_count(16, None, 32) == 4
    assert strategy.start_count(16, 0, 32) == 4  # "no workers" is no estimate to climb from
    assert strategy.start_count(16, 40, 8) == 8
    assert strategy.start_count(2, None, 0) == 0


def test_the_climb_adds_two_and_reaches_the_maximum_itself():
    assert strategy.climb_sequence(Plan(start=1, max_workers=6)) == [1, 3, 5, 6]
    assert strategy.climb_sequence(Plan(start=2, max_workers=6)) == [2, 4, 6]
    assert strategy.climb_sequence(Plan(start=0, max_workers=0)) == [0]


# ------------------------------------------------------------------------------- stop rules
def test_a_gain_below_five_percent_stops_the_climb_and_the_pick_is_the_knee():
    trials, stop = run_search(knee_at(3), Plan(start=1, max_workers=16))
    counts = [(t.num_workers, t.reason) for t in trials]
    assert counts == [(1, "start"), (3, "climb"), (5, "climb"), (2, "refine")]
    assert "num_workers=5 gained +0.0 % over 3 (less than 5 %)" in stop.why
    assert strategy.pick(strategy.points(trials)).num_workers == 3


def test_a_small_step_is_not_worth_its_workers():
    # +4 % from 4 to 6: the climb stops, and 4 is picked over the 4 % faster 6.
    rates = {2: 100.0, 4: 150.0, 6: 156.0, 3: 130.0}
    trials, stop = run_search(lambda w: rates[w], Plan(start=2, max_workers=16), spread=0.2)
    assert [t.num_workers for t in trials] == [2, 4, 6, 3]
    assert strategy.pick(strategy.points(trials)).num_workers == 4


def test_refine_goes_down_while_fewer_workers_are_still_within_five_percent():
    # A flat curve from 2 on, started at 4: 4, 6 gave nothing, then 3 and 2 are as good, 1 not.
    trials, stop = run_search(knee_at(2), Plan(start=4, max_workers=16))
    assert [t.num_workers for t in trials] == [4, 6, 3, 2, 1]
    assert strategy.pick(strategy.points(trials)).num_workers == 2
    assert "refined around num_workers=2" in stop.why


def test_the_refinement_tries_one_more_when_the_climb_ended_at_the_maximum():
    trials, stop = run_search(lambda w: 10.0 * (w + 1), Plan(start=1, max_workers=3))
    assert [t.num_workers for t in trials] == [1, 3, 2]
    assert "--max-workers 3 reached" in stop.why
    assert strategy.pick(strategy.points(trials)).num_workers == 3


def test_max_workers_caps_the_climb():
    trials, stop = run_search(lambda w: 10.0 * (w + 1), Plan(start=1, max_workers=5))
    assert max(t.num_workers for t in trials) == 5
    assert all(t.num_workers <= 5 for t in trials)


def test_memory_running_short_makes_the_previous_count_the_answer():
    # Still gaining at 5, but 5 swapped: 3 is the answer, and 4 (just below the short one) is
    # not tried either.
    trials, stop = run_search(lambda w: 50.0 * w, Plan(start=1, max_workers=16), short_from=5)
    assert [t.num_workers for t in trials] == [1, 3, 5, 2]
    assert "memory ran short at num_workers=5" in stop.why
    pts = strategy.points(trials)
    assert strategy.pick(pts).num_workers == 3
    assert 5 not in [p.num_workers for p in strategy.candidates(pts)]


def test_a_failing_count_ends_the_climb_and_is_never_picked():
    trials, stop = run_search(lambda w: 50.0 * w, Plan(start=1, max_workers=16), fail_from=5)
    assert [t.num_workers for t in trials] == [1, 3, 5, 2]
    assert "num_workers=5 failed" in stop.why
    assert strategy.pick(strategy.points(trials)).num_workers == 3


def test_nothing_measured_stops_with_no_pick():
    trials, stop = run_search(lambda w: 1.0, Plan(start=1, max_workers=8), fail_from=0)
    assert [t.num_workers for t in trials] == [1]
    assert "no count could be measured" in stop.why
    assert strategy.pick(strategy.points(trials)) is None


def test_listed_counts_run_exactly_as_given():
    plan = Plan(start=1, max_workers=8, listed=(4, 0, 2))
    trials, stop = run_search(knee_at(2), plan, spread=30.0)  # however noisy: no repeats
    assert [t.num_workers for t in trials] == [4, 0, 2]
    assert stop.why == "every listed count was run"


def test_the_trial_limit_is_a_safety_net():
    trials, stop = run_search(lambda w: 2.0 ** w, Plan(start=1, max_workers=100, max_trials=5))
    assert len(trials) == 5
    assert "5 trials" in stop.why


# ------------------------------------------------------------------------------- noise
def test_a_gain_within_noise_of_the_threshold_is_measured_again():
    # 100 -> 104 ± 3 %: "less than 5 %" is in doubt, so 3 runs again (and its runs merge).
    trials = [trial(1, 100.0, spread=2.0, reason="start"), trial(3, 104.0, spread=2.0)]
    step = next_trial(trials, Plan(start=1, max_workers=16))
    assert step == Next(3, "repeat")
    trials.append(trial(3, 103.0, spread=2.0, reason="repeat", run=2))
    step = next_trial(trials, Plan(start=1, max_workers=16))
    assert step != Next(3, "repeat")  # once
    merged = strategy.points(trials)[3]
    assert merged.rate == pytest.approx(103.5)
    assert merged.runs == 2
    assert merged.spread == pytest.approx(max(2.0 * 2 ** 0.5 / 2, 0.5))


def test_a_gain_just_above_the_threshold_climbs_on_instead_of_repeating():
    # 6 ± 3 %: perhaps less than 5 %, but climbing on costs no more than a repeat, and tells more.
    trials = [trial(1, 100.0, spread=2.0, reason="start"), trial(3, 106.0, spread=2.0)]
    assert next_trial(trials, Plan(start=1, max_workers=16)) == Next(5, "climb")


def test_a_gain_far_from_the_threshold_is_trusted_however_close_to_its_neighbour():
    # 0 ± 1 %: "within noise of its neighbour", but "less than 5 %" without doubt: no repeat.
    trials = [trial(1, 100.0, spread=1.0, reason="start"), trial(3, 100.0, spread=1.0)]
    assert next_trial(trials, Plan(start=1, max_workers=16)) == Next(0, "refine")  # 1 is as good


def test_a_noisy_plateau_is_measured_again():
    # 0 ± 4 %: the noise could hide a 5 % gain.
    trials = [trial(1, 100.0, spread=3.0, reason="start"), trial(3, 100.0, spread=3.0)]
    assert next_trial(trials, Plan(start=1, max_workers=16)) == Next(3, "repeat")


def test_a_refinement_within_noise_of_the_best_is_measured_again():
    # 2 is 4 % below the best, ± 2 %: whether it is the pick is in doubt.
    trials = [trial(1, 50.0, spread=0.5, reason="start"), trial(3, 150.0, spread=0.5),
              trial(5, 150.0, spread=0.5), trial(2, 144.0, spread=3.0, reason="refine")]
    assert next_trial(trials, Plan(start=1, max_workers=16)) == Next(2, "repeat")
    # ... and a neighbour of the pick the same way: 2 at 5.6 % below the best is not the pick,
    # but only just.
    trials[-1] = trial(2, 142.0, spread=3.0, reason="refine")
    assert strategy.pick(strategy.points(trials)).num_workers == 3
    assert next_trial(trials, Plan(start=1, max_workers=16)) == Next(2, "repeat")


def test_uncertain_compares_the_gain_with_the_threshold():
    a = strategy.Point(1, 100.0, 1.0, 1, True, False, False)
    b = strategy.Point(3, 104.0, 1.0, 1, True, False, False)
    assert strategy.uncertain(a, b)  # 4 % ± 1.4 %: within 2 sigma of 5 %
    c = strategy.Point(3, 130.0, 1.0, 1, True, False, False)
    assert not strategy.uncertain(a, c)
    zero = strategy.Point(0, 0.0, 0.0, 1, True, False, False)
    assert not strategy.uncertain(zero, a)  # from nothing, any rate is a gain


def test_two_runs_that_disagree_say_the_spread():
    trials = [trial(2, 100.0, spread=0.5), trial(2, 110.0, spread=0.5, run=2)]
    point = strategy.points(trials)[2]
    assert point.rate == pytest.approx(105.0)
    assert point.spread == pytest.approx(5.0)


# ------------------------------------------------------------------------------- duplicates
def test_an_iterable_that_every_worker_yields_whole_is_unsafe_and_stops_the_search():
    trials = [trial(1, 100.0, iterable=True, epoch=16.0, reason="start"),
              trial(3, 290.0, iterable=True, epoch=47.5)]
    unsafe = strategy.duplicated_iterable(trials)
    assert unsafe is not None
    assert unsafe.num_workers == (1, 3)
    assert unsafe.batches_per_epoch == (16.0, 47.5)
    step = next_trial(trials, Plan(start=1, max_workers=16))
    assert isinstance(step, Stop) and "duplicates" in step.why


def test_a_worker_aware_iterable_is_safe():
    # Each worker's last partial batch adds at most one batch per worker.
    trials = [trial(0, 100.0, iterable=True, epoch=16.0), trial(1, 100.0, iterable=True, epoch=16.0),
              trial(3, 100.0, iterable=True, epoch=18.0)]
    assert strategy.duplicated_iterable(trials) is None
    # 0 and 1 workers yield it once each: equal epochs are no evidence either way.
    assert strategy.duplicated_iterable(trials[:2]) is None


def test_a_map_style_loader_is_never_called_unsafe():
    trials = [trial(1, 100.0, iterable=False, epoch=16.0), trial(3, 290.0, iterable=False, epoch=48.0)]
    assert strategy.duplicated_iterable(trials) is None


def test_trials_left_estimates_the_search_and_counts_a_list():
    assert strategy.trials_left([], Plan(start=1, max_workers=8, listed=(0, 2, 4))) == 3
    assert strategy.trials_left([trial(0, 1.0)], Plan(start=1, max_workers=8, listed=(0, 2))) == 1
    assert strategy.trials_left([], Plan(start=1, max_workers=8)) >= 3


# ------------------------------------------------------------------------------- the spread
def test_the_spread_of_steady_parts_is_the_plain_standard_error():
    from loadertop.tuning.trial import standard_error

    rates = [100.0, 104.0, 98.0, 103.0, 97.0, 102.0, 99.0, 101.0]
    plain = (sum((r - 100.5) ** 2 for r in rates) / 7 / 8) ** 0.5
    assert standard_error(rates) <= plain + 1e-9
    assert standard_error([100.0, 100.0, 100.0]) == 0.0
    assert standard_error([100.0, 101.0]) is None  # too few parts to say


def test_bursts_cut_at_part_edges_cancel_in_the_mean():
    # A burst of 3 batches that one part misses the next one has: the parts alternate, the mean
    # is exact, and the spread comes out a fraction of the plain s/sqrt(n).
    from loadertop.tuning.trial import standard_error

    rates = [90.0, 110.0] * 5
    plain = (sum((r - 100.0) ** 2 for r in rates) / 9 / 10) ** 0.5
    assert standard_error(rates) < plain / 2
    # Lasting changes (a busy machine for a while) keep their full weight.
    drifting = [90.0] * 5 + [110.0] * 5
    assert standard_error(drifting) >= plain
