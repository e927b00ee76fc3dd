"""The screen's presentation agrees with the diagnosis: one category table keyed by its constants,
colour bands and help text derived from its thresholds (and the model's), none typed in twice."""

from __future__ import annotations

from loadertop import diagnosis
from loadertop.client import model
from loadertop.tui import theme
from loadertop.tui.widgets import help as help_screen


def test_category_styles_cover_exactly_the_diagnosis_categories():
    assert set(theme.CATEGORY_STYLES) == set(diagnosis.CATEGORIES)
    assert len({s.words for s in theme.CATEGORY_STYLES.values()}) == len(diagnosis.CATEGORIES)
    assert {s.level for s in theme.CATEGORY_STYLES.values()} <= {"ok", "warn", "bad", "none"}
    assert theme.category_style(None) == theme.NO_DIAGNOSIS
    assert theme.category_style("made_up").words == "made up"  # a newer viewer's category


def test_a_pending_change_is_named_by_what_tells_it_from_the_category_shown():
    words = theme.pending_words
    assert words(diagnosis.INPUT_BOUND_IO, diagnosis.COMPUTE_BOUND) == "changing to input-bound?"
    assert words(diagnosis.COMPUTE_BOUND, diagnosis.INPUT_BOUND_IO) == "changing to healthy?"
    assert words(diagnosis.INPUT_BOUND_IO, diagnosis.INPUT_BOUND_CPU) == \
        "changing to input-bound: waiting on I/O?"
    assert words(diagnosis.CPU_SATURATED, diagnosis.INPUT_BOUND_CPU) == "changing to CPU saturated?"
    assert words(diagnosis.MAIN_PROCESS_BOUND, diagnosis.STALLED) == "changing to main-process-bound?"
    assert words("made_up", diagnosis.IDLE) == "changing to made up?"  # a newer viewer's category


def test_wait_colour_follows_the_diagnosis_thresholds():
    below = diagnosis.WAIT_FRACTION_INPUT_BOUND - 0.001
    at = diagnosis.WAIT_FRACTION_INPUT_BOUND
    assert theme.wait_colour(below, diagnosis.COMPUTE_BOUND) == theme.OK  # 7 %..10 %: healthy, green
    assert theme.wait_colour(at, diagnosis.INPUT_BOUND_IO) == theme.WARN
    assert theme.wait_colour(at) == theme.WARN
    # The margin: input-bound is held until below 7 %, and so is its colour.
    held = diagnosis.WAIT_FRACTION_COMPUTE_BOUND + 0.005
    assert theme.wait_colour(held, diagnosis.INPUT_BOUND_CPU) == theme.WARN
    assert theme.wait_colour(held, diagnosis.COMPUTE_BOUND) == theme.OK
    assert theme.wait_colour(model.WAITING_FRACTION, diagnosis.INPUT_BOUND_IO) == theme.BAD
    assert theme.wait_colour(None) == theme.DIM


def test_machine_bands_follow_the_diagnosis_thresholds():
    io_colour = theme.CATEGORY_STYLES[diagnosis.INPUT_BOUND_IO].colour
    assert theme.iowait_colour(diagnosis.IOWAIT_HIGH_PERCENT) == io_colour
    assert theme.iowait_colour(diagnosis.IOWAIT_HIGH_PERCENT - 0.1) == ""
    assert theme.load_colour(diagnosis.CPU_SATURATED_PERCENT) == theme.BAD
    assert theme.load_colour(diagnosis.CPU_SATURATED_PERCENT - 0.1) == theme.WARN
    total = 1000.0
    assert theme.memory_colour(total * diagnosis.MEM_AVAILABLE_MIN_FRACTION * 0.99, total) == theme.BAD
    assert theme.memory_colour(total * diagnosis.MEM_AVAILABLE_SWAP_OUT_FRACTION * 0.99, total) == theme.WARN
    assert theme.memory_colour(total * 0.5, total) == theme.OK
    rate = diagnosis.SWAP_RATE_MIN_BYTES_PER_S
    assert theme.swap_rate_colour(rate) == theme.BAD and theme.swap_rate_colour(rate / 2) == theme.WARN
    assert theme.swapping(rate, 0.0) and not theme.swapping(rate / 2, 0.0)


def test_freshness_and_blocked_marks_are_the_models():
    assert theme.STALE_AFTER_S == model.GONE_AFTER_S
    assert theme.BLOCKED_SHOW_MS == model.WAITING_BLOCKED_MS


def test_help_says_the_numbers_of_the_constants(monkeypatch):
    text = help_screen.help_text((0.1, 1.0))
    assert "input-bound from 10 %" in text and "below 7 %" in text and "0.1/1 s" in text
    # Derived, not typed in: other thresholds, other words.
    monkeypatch.setattr(diagnosis, "WAIT_FRACTION_INPUT_BOUND", 0.12)
    monkeypatch.setattr(diagnosis, "IOWAIT_HIGH_PERCENT", 15.0)
    monkeypatch.setattr(theme, "BLOCKED_SHOW_MS", 2500.0)
    text = help_screen.help_text((0.1, 1.0))
    assert "input-bound from 12 %" in text and "from 15 %" in text and "for 2.5 s" in text
    for style in theme.CATEGORY_STYLES.values():
        assert style.words in text
