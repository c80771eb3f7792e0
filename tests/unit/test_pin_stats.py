"""harness.stats.summarize, the repeated timings' summary every benchmark writes, worked by hand."""

from __future__ import annotations

import math

import pytest

from hetbench.harness.stats import summarize


def test_median_min_max_mean_and_cv_by_hand():
    # [3, 1, 2]: median 2, mean 2, sample stdev 1: cv 1 / 2
    assert summarize([3.0, 1.0, 2.0], "x") == {"x_median": 2.0, "x_min": 1.0, "x_max": 3.0, "x_mean": 2.0,
                                               "x_cv": pytest.approx(0.5, rel=1e-15)}
    # two values [1, 3]: stdev sqrt(2), mean 2: cv sqrt(2) / 2
    assert summarize([1.0, 3.0], "t")["t_cv"] == pytest.approx(math.sqrt(2) / 2, rel=1e-15)


def test_one_value_zeros_and_none():
    assert summarize([5.0], "s") == {"s_median": 5.0, "s_min": 5.0, "s_max": 5.0, "s_mean": 5.0, "s_cv": 0.0}
    assert summarize([0.0, 0.0], "z")["z_cv"] == 0.0  # no variation to state against a mean of 0
    empty = summarize([], "e")
    assert set(empty) == {"e_median", "e_min", "e_max", "e_mean", "e_cv"} and all(math.isnan(v) for v in empty.values())
