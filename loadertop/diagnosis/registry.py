"""The categories, collected from one line each, and the precedence ladder that `diagnose` walks.

`LADDER` lists the category modules (`loadertop.diagnosis.categories`) in precedence order:
`diagnose` asks each rule in turn and the first verdict wins, so a rule may take it that every
rule above it declined (input_bound_cpu, the last, always gives one):

    stalled > memory_pressure > idle > epoch_start_bound > insufficient_data > compute_bound >
    (the loop waits:) main_process_bound > cpu_saturated > input_bound_io > input_bound_cpu

(epoch_start_bound reads the latest ended epochs, not the window, so it comes before the rules
that need a window's batches.)

`overall` ranks the sources' verdicts by each category's `RANK` instead (most urgent first).

How to add a category:

1. a new module under `categories/` with `CATEGORY`, `WORDS`, `COLOUR`, `LEVEL`, `RANK`, `URGENT`,
   `LOOP_WAITS`, `judge(facts) -> Verdict | None` and `restate(facts) -> Verdict | None` (the
   `CategoryRule` protocol below; its thresholds go to `thresholds.py`, shared wording to
   `client/units.py`);
2. its line in `LADDER`, where it belongs in the precedence (and its name in the import above);
3. its name in `client/document.py`'s `Category`: the contract's schema (docs/contract.md §4),
   which a test checks against `CATEGORIES`.
"""

from __future__ import annotations

from typing import Protocol, get_args

from loadertop.client.document import Category, SourceFigures, SystemFigures, Verdict
from loadertop.diagnosis.categories import (
    compute_bound,
    cpu_saturated,
    epoch_start_bound,
    idle,
    input_bound_cpu,
    input_bound_io,
    insufficient_data,
    main_process_bound,
    memory_pressure,
    stalled,
)
from loadertop.diagnosis.facts import Facts


class CategoryRule(Protocol):
    """What `registry` reads of a category module."""

    @property
    def CATEGORY(self) -> Category: ...
    @property
    def WORDS(self) -> str: ...
    @property
    def COLOUR(self) -> str: ...
    @property
    def LEVEL(self) -> str: ...
    @property
    def RANK(self) -> int: ...
    @property
    def URGENT(self) -> bool: ...
    @property
    def LOOP_WAITS(self) -> bool: ...

    def judge(self, facts: Facts, /) -> Verdict | None: ...

    # The category's verdict said with today's figures while the hysteresis holds it on screen
    # though another rule fires now (`restate` below); None when nothing true can be said under
    # it any more (its condition is over), so that the change shows at once.
    def restate(self, facts: Facts, /) -> Verdict | None: ...


#: The precedence ladder: one line per category, first match wins.
LADDER: tuple[CategoryRule, ...] = (
    stalled,
    memory_pressure,
    idle,
    epoch_start_bound,
    insufficient_data,
    compute_bound,
    main_process_bound,
    cpu_saturated,
    input_bound_io,
    input_bound_cpu,
)

#: The category names in the contract's order (docs/contract.md §4), as `document.Category` has
#: them: defined there, collected here.
CATEGORIES: tuple[Category, ...] = get_args(Category)

#: `overall` picks the first of these found among the sources (most urgent first; see each
#: module's `RANK` for why it stands where it does).
OVERALL_RANK: tuple[Category, ...] = tuple(c.CATEGORY for c in sorted(LADDER, key=lambda c: c.RANK))

#: Shown at once by the verdict's hysteresis: waiting a few refreshes to report a dead worker or a
#: machine about to swap itself to death helps nobody.
URGENT_CATEGORIES: frozenset[Category] = frozenset(c.CATEGORY for c in LADDER if c.URGENT)

#: The categories in which the loop waits for data (the margin on the wait fraction applies to
#: them).
INPUT_BOUND_CATEGORIES: frozenset[Category] = frozenset(c.CATEGORY for c in LADDER if c.LOOP_WAITS)


def diagnose(source: SourceFigures, system: SystemFigures | None,
             previous: Category | None = None) -> Verdict:
    """The verdict for one source.

    ``system`` is the source's machine (None when no figures arrived). ``previous`` is the
    category shown now (e.g. ``VerdictStabilizer.shown_category``): it moves each threshold to its
    "leave" value so that a figure hovering at a boundary keeps the verdict.
    """
    facts = Facts.read(source, system, previous, previous in INPUT_BOUND_CATEGORIES)
    for category in LADDER:
        verdict = category.judge(facts)
        if verdict is not None:
            return verdict
    raise AssertionError("the ladder's last rule always gives a verdict")


_BY_CATEGORY: dict[Category, CategoryRule] = {c.CATEGORY: c for c in LADDER}


def restate(category: Category, source: SourceFigures, system: SystemFigures | None) -> Verdict | None:
    """`category`'s verdict for today's figures: what the verdict's hysteresis shows while it
    holds `category` though `diagnose` names another (docs/diagnosis.md, "Hysteresis"), judged
    with `category` as the one shown (its margins apply). None when the category has nothing
    true to say of these figures (a stall that ended, batches flowing again after idle, no batch
    in the window to quote): the change then shows at once."""
    facts = Facts.read(source, system, category, category in INPUT_BOUND_CATEGORIES)
    return _BY_CATEGORY[category].restate(facts)
