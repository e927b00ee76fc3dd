"""A window's distributions, C (`client/_figures.c`) and pure Python: the same `Stats` to the bit.

The C one sorts the samples as C integers and rounds to 3 decimals without Python's decimal
conversion; where it cannot do either exactly (a sample or a sum past 2**53, a value that is not an
int, a figure within an ulp of a rounding tie) it must hand the call to Python, not guess.
"""

from __future__ import annotations

import os
import random
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadertop.client import distributions
from loadertop.client.distributions import python_stats_of_parts

c_stats = distributions._figures.stats_of_parts if distributions._figures is not None else None
needs_c = pytest.mark.skipif(c_stats is None, reason="the C distributions are not built here")


def test_ci_builds_the_c_distributions() -> None:
    # setup.py builds it; it is optional so that an install without a compiler works, which
    # must not hide a broken build where the tests run
    if sys.platform.startswith("linux") and os.environ.get("LOADERTOP_CI"):
        assert distributions.stats_of_parts is c_stats is not None
    if c_stats is None:
        pytest.skip("the C distributions are not built here")


def same(parts: list) -> None:
    want, got = python_stats_of_parts(parts), c_stats(parts)  # type: ignore[misc]
    assert repr(got) == repr(want), parts  # repr: 0.0 and -0.0, 1 and 1.0 told apart


# Sample magnitudes a window sees (µs to hours) and the edges of the C path's exactness: 4e15 µs
# (where a sample's ms stops being exact), 2**53 (where the C path hands over to Python).
MAGNITUDES = [10, 1000, 10**5, 10**7, 10**9, 10**12, 4 * 10**15, 2**53 - 1, 2**53, 2**64, 2**80]


@needs_c
@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(
    st.lists(st.integers(0, 2000), max_size=40).map(tuple),
    st.lists(st.sampled_from(MAGNITUDES).flatmap(lambda m: st.integers(0, m)), max_size=12),
    st.lists(st.sampled_from([0, 500, 1500, 2500, 4500]), max_size=300).map(tuple)),
    max_size=14))
def test_c_and_python_give_the_same_figures(parts: list) -> None:
    same(parts)


@needs_c
def test_many_windows_like_a_fleets() -> None:
    """Windows shaped as a fleet's: ~12 reports of a few to a few hundred samples each, with the
    ties (x.xxx5 ms) that interpolation between whole µs makes."""
    rng = random.Random(11)
    for _ in range(3000):
        parts = [tuple(rng.randint(0, rng.choice([3, 999, 20000, 10**6]))
                       for _ in range(rng.choice([0, 1, 3, 11, 40, 300])))
                 for _ in range(rng.choice([1, 4, 12, 13]))]
        same(parts)


@needs_c
def test_what_c_cannot_do_exactly_it_leaves_to_python() -> None:
    assert c_stats([]) is None and c_stats([(), []]) is None
    same([(2**70, 1)])  # past 64 bits
    same([(2**52, 2**52, 2**52)])  # the sum past 2**53
    same([(1.5, 2)])  # not ints: Python's figures, whatever they are
    same([(True, 3)])  # a bool is an int to Python: its figures, not C's
    same([range(5)])  # a part that is neither tuple nor list
    with pytest.raises(TypeError):
        c_stats([("a", 1)])  # as Python fails


@needs_c
def test_the_samples_are_not_changed() -> None:
    parts = [(5, 1, 3), [9, 2]]
    c_stats(parts)
    assert parts == [(5, 1, 3), [9, 2]]
