"""`loadertop tune`'s words and figures: the recommendation (its reason, singular and plural), the
`loadertop.tune/1` document (keys, types, round trip), the table and the plot, and the override's
rewriting of `DataLoader.__init__` arguments."""

from __future__ import annotations

import inspect
import json

import msgspec
import pytest

from loadertop import environment
from loadertop.probe import override
from loadertop.tuning.document import (
    TUNE_SCHEMA,
    BestFigures,
    TrialFigures,
    TuneDocument,
    UnsafeFigures,
    decode_json,
    encode_json,
)
from loadertop.tuning.output import render_plot, render_report, render_table, trial_summary
from loadertop.tuning.recommendation import counts_of_workers, recommend, workers

MIB = 1 << 20


def trial(w: int | None, rate: float | None, *, spread: float = 1.0, rss: int | None = 180 * MIB,
          uss: int | None = None, memory_short=False, swap=False, exit=None, exit_code=None,
          reason="climb", problem=None) -> TrialFigures:
    return TrialFigures(
        num_workers=w, samples_per_s=rate, wait_fraction=0.25, cpu_percent=40.0,
        mem_available_bytes=6 << 30, swap_active=swap, category="input_bound_io", exit=exit,
        exit_code=exit_code, reason=reason, spread_samples_per_s=spread, batch_size=4,
        batches_per_s=None if rate is None else rate / 4, worker_rss_bytes=rss,
        worker_uss_bytes=uss, memory_short=memory_short, problem=problem)


# ------------------------------------------------------------------------------- wording
def test_workers_singular_and_plural():
    assert workers(0) == "0 workers"
    assert workers(1) == "1 worker"
    assert workers(2) == "2 workers"
    assert counts_of_workers([1]) == "1 worker"
    assert counts_of_workers([7]) == "7 workers"
    assert counts_of_workers([7, 9]) == "7 and 9 workers"
    assert counts_of_workers([1, 3, 5]) == "1, 3 and 5 workers"


def test_the_recommendation_says_the_knee_what_more_would_cost_and_what_fewer_lose():
    trials = [trial(3, 200.0), trial(5, 246.0, spread=2.0), trial(7, 247.0), trial(9, 248.0),
              trial(4, 230.0, reason="refine")]
    best, text = recommend(trials, max_workers=32, unsafe=None)
    assert best == BestFigures(num_workers=5, samples_per_s=246.0, spread_samples_per_s=2.0)
    assert text == ("num_workers=5: 246 samples/s (±2.0); 7 and 9 workers gave no more "
                    "(+0.4 %, +0.8 %) and cost 2 × 180 MiB; 4 workers gave 7 % less")


def test_one_worker_is_said_in_the_singular():
    trials = [trial(1, 100.0, reason="start"), trial(3, 101.0), trial(0, 60.0, reason="refine")]
    best, text = recommend(trials, max_workers=8, unsafe=None)
    assert best.num_workers == 1
    assert text.startswith("num_workers=1: 100 samples/s (±1.0); 3 workers gave no more (+1.0 %)")
    assert text.endswith("0 workers gave 40 % less")
    trials = [trial(0, 100.0, reason="refine"), trial(1, 101.0, reason="start"), trial(3, 99.0)]
    _, text = recommend(trials, max_workers=8, unsafe=None)
    assert text.startswith("num_workers=0: 100 samples/s (±1.0); 1 and 3 workers gave no more "
                           "(+1.0 %, -1.0 %) and cost 1 × 180 MiB")


def test_the_cost_is_the_private_memory_where_it_was_read():
    trials = [trial(2, 100.0), trial(4, 101.0, uss=40 * MIB)]
    _, text = recommend(trials, max_workers=8, unsafe=None)
    assert "cost 2 × 40.0 MiB" in text


def test_a_gain_short_of_five_percent_is_not_called_no_more():
    trials = [trial(2, 100.0), trial(4, 104.0)]
    _, text = recommend(trials, max_workers=8, unsafe=None)
    assert "4 workers gained less than 5 % (+4.0 %)" in text


def test_memory_and_failures_above_the_pick_are_named():
    trials = [trial(1, 100.0), trial(3, 300.0), trial(5, 380.0, memory_short=True, swap=True),
              trial(2, 200.0, reason="refine")]
    best, text = recommend(trials, max_workers=16, unsafe=None)
    assert best.num_workers == 3
    assert "5 workers ran short of memory (swap active)" in text
    trials = [trial(1, 100.0), trial(3, 300.0),
              trial(5, None, exit="killed by SIGKILL: Killed", exit_code=-9)]
    _, text = recommend(trials, max_workers=16, unsafe=None)
    assert "5 workers failed (killed by SIGKILL)" in text


def test_the_maximum_is_said_when_the_pick_is_at_it():
    trials = [trial(1, 100.0), trial(3, 300.0), trial(2, 200.0)]
    _, text = recommend(trials, max_workers=3, unsafe=None)
    assert "more were not tried (--max-workers 3)" in text


def test_the_programs_own_setting_is_compared():
    trials = [trial(2, 100.0, reason="own_setting"), trial(4, 150.0, reason="start"),
              trial(6, 151.0), trial(3, 125.0, reason="refine")]
    _, text = recommend(trials, max_workers=16, unsafe=None, own_setting=2)
    assert text.endswith("+50.0 % over the program's own num_workers=2")


def test_unsafe_and_nothing_measured():
    unsafe = UnsafeFigures(reason="duplicated_iterable", num_workers=(1, 3),
                           batches_per_epoch=(16.0, 48.0))
    best, text = recommend([trial(1, 100.0), trial(3, 300.0)], max_workers=8, unsafe=unsafe)
    assert best is None
    assert text.startswith("keep num_workers at 0 or 1: the main loader's IterableDataset is not "
                           "split across workers — an epoch had 16 batches with 1 worker and 48 "
                           "with 3 workers")
    best, text = recommend([trial(1, None, exit="exit 3: ValueError: bad", exit_code=3)],
                           max_workers=8, unsafe=None)
    assert best is None
    assert text == "no recommendation: no trial measured the main loader: exit 3: ValueError: bad"


# ------------------------------------------------------------------------------- the document
def document(**changes) -> TuneDocument:
    trials = (trial(1, 100.0, reason="start"), trial(3, 150.0),
              trial(5, None, exit="exit 3: boom", exit_code=3))
    best, text = recommend(trials, max_workers=8, unsafe=None)
    fields = dict(schema=TUNE_SCHEMA, command="python train.py --epochs 3", trials=trials,
                  best=best, recommendation=text, cores_available=2.0, max_workers=8,
                  trial_seconds=2.0, started_at=1764437000.0, duration_s=15.0,
                  stopped_because="num_workers=5 failed")
    fields.update(changes)
    return TuneDocument(**fields)


CONTRACT_TRIAL_KEYS = ["num_workers", "samples_per_s", "wait_fraction", "cpu_percent",
                       "mem_available_bytes", "swap_active", "category", "exit"]


def test_the_document_has_the_contracts_keys_first_and_round_trips():
    raw = encode_json(document())
    doc = json.loads(raw)
    assert list(doc)[:5] == ["schema", "command", "trials", "best", "recommendation"]
    assert doc["schema"] == "loadertop.tune/1"
    for entry in doc["trials"]:
        assert list(entry)[:len(CONTRACT_TRIAL_KEYS)] == CONTRACT_TRIAL_KEYS
    assert doc["trials"][2]["exit"] == "exit 3: boom"
    assert doc["trials"][0]["exit"] is None
    assert list(doc["best"])[:2] == ["num_workers", "samples_per_s"]
    assert decode_json(raw) == document()


@pytest.mark.parametrize("path, value", [
    (("schema",), "loadertop.tune/2"),
    (("trials", 0, "wait_fraction"), 1.5),
    (("trials", 0, "category"), "slow"),
    (("trials", 0, "num_workers"), -1),
    (("best", "samples_per_s"), -3.0),
])
def test_a_document_out_of_range_does_not_validate(path, value):
    doc = json.loads(encode_json(document()))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(msgspec.ValidationError):
        decode_json(json.dumps(doc))


def test_a_missing_contract_key_does_not_validate():
    doc = json.loads(encode_json(document()))
    del doc["trials"][0]["swap_active"]
    with pytest.raises(msgspec.ValidationError):
        decode_json(json.dumps(doc))


# ------------------------------------------------------------------------------- table and plot
def test_the_table_has_a_row_per_count_and_marks_the_pick():
    doc = document(trials=(trial(1, 100.0, reason="start"), trial(3, 150.0),
                           trial(3, 152.0, reason="repeat"),
                           trial(5, None, exit="exit 3: boom", exit_code=3)),
                   best=BestFigures(num_workers=3, samples_per_s=151.0))
    lines = render_table(doc).splitlines()
    assert lines[0].split()[:3] == ["workers", "samples/s", "±"]
    assert [line.split()[0] for line in lines[1:]] == ["1", "▶", "5"]
    assert "151" in lines[2] and "2 runs" in lines[2]
    assert "exit 3: boom" in lines[3]


def test_the_plot_is_plotext_sized_to_the_width_and_plain_without_colour():
    plot = render_plot(document(), width=60)
    assert plot is not None
    assert "\x1b[" not in plot
    assert max(len(line) for line in plot.splitlines()) <= 60
    assert "num_workers" in plot
    assert render_plot(document(trials=(trial(1, 100.0),))) is None  # one point is no curve


def test_the_report_ends_with_the_recommendation():
    report = render_report(document(), width=80)
    assert "→ num_workers=3: 150 samples/s" in report
    assert report.rstrip().endswith("3 trials in 15 s)")


def test_a_trial_summary_for_each_outcome():
    assert trial_summary(trial(3, 150.0)) == "num_workers=3: 150 ±1.0 samples/s, wait 25 %, CPU 40 %"
    assert trial_summary(trial(5, None, exit="exit 3: boom", exit_code=3)) == "num_workers=5: exit 3: boom"
    assert trial_summary(trial(None, None, problem="no DataLoader")) == "its own setting: no DataLoader"


# ------------------------------------------------------------------------------- the override
def _dataloader_init(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                     num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                     worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                     prefetch_factor=None, persistent_workers=False, pin_memory_device="",
                     in_order=True):
    """torch 2.13's DataLoader.__init__ signature."""


SIGNATURE = inspect.signature(_dataloader_init)


def bound(args, kwargs):
    return SIGNATURE.bind(*args, **kwargs).arguments


def test_the_override_replaces_num_workers_given_by_keyword_or_position():
    args, kwargs = override.overridden_arguments(SIGNATURE, ("self", "ds"), {"num_workers": 2}, 5)
    assert bound(args, kwargs)["num_workers"] == 5
    args, kwargs = override.overridden_arguments(SIGNATURE, ("self", "ds", 4, False, None, None, 2),
                                                 {"pin_memory": True}, 3)
    assert bound(args, kwargs) == {"self": "self", "dataset": "ds", "batch_size": 4,
                                   "shuffle": False, "sampler": None, "batch_sampler": None,
                                   "num_workers": 3, "pin_memory": True}
    args, kwargs = override.overridden_arguments(SIGNATURE, ("self", "ds"), {}, 4)
    assert bound(args, kwargs)["num_workers"] == 4  # not given at all: set too


def test_zero_workers_drop_the_arguments_torch_refuses_without_workers():
    args, kwargs = override.overridden_arguments(
        SIGNATURE, ("self", "ds", 8, False, None, None, 4, None, False, False, 0, None, "fork"),
        {"prefetch_factor": 4, "persistent_workers": True, "pin_memory_device": "cuda"}, 0)
    got = bound(args, kwargs)
    assert got["num_workers"] == 0
    for name in ("prefetch_factor", "persistent_workers", "multiprocessing_context"):
        assert name not in got
    assert got["pin_memory_device"] == "cuda" and got["batch_size"] == 8
    # With workers they stay as the user set them.
    args, kwargs = override.overridden_arguments(
        SIGNATURE, ("self", "ds"), {"prefetch_factor": 4, "persistent_workers": True}, 2)
    assert bound(args, kwargs)["prefetch_factor"] == 4


def test_a_call_that_does_not_fit_goes_to_torch_unchanged():
    args, kwargs = override.overridden_arguments(SIGNATURE, ("self", "ds"), {"bogus": 1}, 3)
    assert (args, kwargs) == (("self", "ds"), {"bogus": 1})


def test_the_override_is_read_from_its_variable():
    assert environment.tune_num_workers({}) is None
    assert environment.tune_num_workers({environment.LOADERTOP_TUNE_NUM_WORKERS: "3"}) == 3
    assert environment.tune_num_workers({environment.LOADERTOP_TUNE_NUM_WORKERS: "-1"}) is None
    assert environment.tune_num_workers({environment.LOADERTOP_TUNE_NUM_WORKERS: "x"}) is None


def test_install_wraps_only_with_the_variable_and_only_once():
    class DataLoader:
        def __init__(self, dataset, batch_size=1, num_workers=0, *, prefetch_factor=None):
            self.num_workers, self.prefetch_factor = num_workers, prefetch_factor

    class Module:
        pass

    module = Module()
    module.DataLoader = DataLoader
    assert not override.install(module, {})
    env = {environment.LOADERTOP_TUNE_NUM_WORKERS: "0"}
    assert override.install(module, env)
    assert not override.install(module, env)  # wrapped already
    loader = DataLoader("ds", 4, 2, prefetch_factor=8)
    assert (loader.num_workers, loader.prefetch_factor) == (0, None)
    override.uninstall(module)
    assert DataLoader("ds", 4, 2).num_workers == 2


# ------------------------------------------------------------------------------- the live advice
def test_the_live_advice_is_a_hint_that_may_be_missing_or_fail():
    from loadertop import diagnosis
    from loadertop.tuning import session
    from loadertop.tuning.trial import TrialOutcome

    assert session.live_advice() is diagnosis.advised_num_workers
    source = object()  # the advice reads the main loader's figures; here only passed through
    outcome = TrialOutcome(figures=trial(2, 100.0, reason="own_setting"), source=source,
                           system=None, no_loader=False, duration_s=5.0)
    assert session._advised(lambda s, sys: 6 if s is source else None, outcome) == 6
    assert session._advised(lambda s, sys: None, outcome) is None
    assert session._advised(lambda s, sys: 1 / 0, outcome) is None
    assert session._advised(lambda s, sys: -2, outcome) is None
    failed = TrialOutcome(figures=trial(2, None, exit="exit 1", exit_code=1), source=source,
                          system=None, no_loader=False, duration_s=5.0)
    assert session._advised(lambda s, sys: 6, failed) is None
