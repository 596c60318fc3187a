"""The shared value checks: a bool is never an int, NaN and a float-overflowing int are numbers
but not finite ones, and text is never a number."""

from __future__ import annotations

import math

import pytest

from marl.protocols.values import is_finite_number, is_int, is_number

CASES = [
    # value, is_int, is_number, is_finite_number
    (3, True, True, True),
    (-(10**400), True, True, False),  # float() overflows
    (True, False, False, False),
    (2.0, False, True, True),
    (math.nan, False, True, False),
    (-math.inf, False, True, False),
    ("3", False, False, False),
    (None, False, False, False),
]


@pytest.mark.parametrize(("value", "whole", "number", "finite"), CASES)
def test_each_check_means_one_thing(value: object, whole: bool, number: bool, finite: bool) -> None:
    assert (is_int(value), is_number(value), is_finite_number(value)) == (whole, number, finite)
