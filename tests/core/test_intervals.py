"""The one rule for intervals in words and in print (`core.intervals`)."""

from __future__ import annotations

import pytest

from draftnas.core.intervals import measured_word, median_interval, predicted_word, with_interval


def test_a_predicted_speedup_within_two_percent_of_one_is_level():
    assert predicted_word(1.021) == "pays" and predicted_word(1.02) == "level"
    assert predicted_word(0.98) == "level" and predicted_word(0.979) == "does not pay"


def test_a_measured_speedup_pays_only_where_its_whole_interval_lies_above_one():
    assert measured_word(1.001, 1.3) == "pays"
    assert measured_word(0.99, 1.3) == "not separable" and measured_word(1.0, 1.0) == "not separable"
    assert measured_word(0.7, 0.999) == "does not pay"


def test_a_figure_prints_with_its_interval_where_it_has_one():
    assert with_interval(1.12345, (0.99, 1.26), unit="x") == "1.123x [0.990, 1.260]"
    assert with_interval(2.5, (), ".2f") == "2.50"
    assert with_interval(2.5, None, ".1f", " tok/s") == "2.5 tok/s"
    assert with_interval(None, (1.0, 2.0)) == "-"


def test_the_median_interval_holds_the_median_and_one_value_has_none():
    mid, low, high = median_interval([1.0, 2.0, 3.0, 4.0, 10.0])
    assert mid == 3.0 and low <= mid <= high
    assert median_interval([5.0]) == (5.0, 5.0, 5.0)
    with pytest.raises(ValueError, match="no values"):
        median_interval([])
