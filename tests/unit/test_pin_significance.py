"""The significance test's edges pinned (issue 17): Student's t-distribution's p against its closed forms for 1 to 4
degrees of freedom at small t (where the incomplete beta function must use its symmetry), the argument checks'
own messages, the threshold exactly at p = 0.05, the least samples judged, and two samples that each repeat one
value (equal, equal to rounding, or apart)."""

from __future__ import annotations

import math

import pytest

from hetbench.report import significance
from hetbench.report.significance import ALPHA, TTest, betainc, t_two_sided_p, welch_t_test


def _closed_p(t: float, df: int) -> float:
    """Two-sided p of Student's t, closed forms (any table of the t-distribution's CDF for small df)."""
    if df == 1:
        return 1 - 2 / math.pi * math.atan(t)
    if df == 2:
        return 1 - t / math.sqrt(2 + t * t)
    if df == 3:
        u = t / math.sqrt(3)
        return 1 - 2 / math.pi * (math.atan(u) + u / (1 + u * u))
    q = 1 + t * t / 4  # df 4
    return 1 - 0.75 * t / math.sqrt(q) * (1 - t * t / (12 * q))


@pytest.mark.parametrize("df", [1, 2, 3, 4])
@pytest.mark.parametrize("t", [0.001, 0.01, 0.1, 0.5, 1.0, 3.0, 10.0])
def test_p_against_closed_forms(t, df):
    assert t_two_sided_p(t, df) == pytest.approx(_closed_p(t, df), rel=1e-12, abs=1e-13)
    assert t_two_sided_p(-t, df) == t_two_sided_p(t, df)


def test_the_argument_checks_say_what_is_wrong():
    with pytest.raises(ValueError, match="betainc needs a > 0 and b > 0, got a=0, b=1"):
        betainc(0, 1, 0.5)
    with pytest.raises(ValueError, match="betainc needs a > 0 and b > 0, got a=1, b=0"):
        betainc(1, 0, 0.5)
    with pytest.raises(ValueError, match="degrees of freedom must be > 0, got 0"):
        t_two_sided_p(1.0, 0)
    assert betainc(2.0, 3.0, 0.0) == 0.0 and betainc(2.0, 3.0, 1.0) == 1.0


def test_significant_is_p_below_alpha_not_at_it():
    assert ALPHA == 0.05
    assert TTest(2.0, 10.0, 0.05, 1.0, 2.0).significant is False
    assert TTest(2.0, 10.0, math.nextafter(0.05, 0.0), 1.0, 2.0).significant is True


def test_two_values_each_are_judged_one_is_not():
    got = welch_t_test([1.0, 2.0], [3.0, 4.0])
    # means 1.5 and 3.5, variances 0.5: t = 2 / sqrt(0.5), df 2 (Welch with equal variances and sizes: 2(n - 1))
    assert got is not None and got.t == pytest.approx(2 / math.sqrt(0.5)) and got.df == pytest.approx(2.0)
    assert got.p == pytest.approx(_closed_p(2 / math.sqrt(0.5), 2), rel=1e-12)
    assert welch_t_test([1.0], [3.0, 4.0]) is None and welch_t_test([1.0, 2.0], [3.0]) is None


def test_samples_that_each_repeat_one_value():
    """Significant exactly when the values differ beyond rounding (1e-12 of the larger): equal zeros are not,
    100 against 100 + 5e-11 are not, 100 against 100 + 1e-9 are, p 0 with t infinite the way the means go."""
    for same in ([0.0, 0.0], [100.0, 100.0]):
        got = welch_t_test(same, list(same))
        assert got is not None and (got.t, got.p) == (0.0, 1.0) and not got.significant
    rounding = welch_t_test([100.0, 100.0], [100.0 + 5e-11] * 2)
    assert rounding is not None and rounding.p == 1.0
    apart = welch_t_test([100.0, 100.0], [100.0 + 1e-9] * 2)
    assert apart is not None and apart.p == 0.0 and apart.t == math.inf and apart.significant
    back = welch_t_test([100.0 + 1e-9] * 2, [100.0, 100.0])
    assert back is not None and back.t == -math.inf and back.df == 2.0


def test_the_cdf_at_zero_and_either_side():
    assert significance.t_cdf(0.0, 3) == 0.5
    assert significance.t_cdf(1.0, 1) == pytest.approx(0.75, rel=1e-12)  # 1/2 + atan(1)/pi
    assert significance.t_cdf(-1.0, 1) == pytest.approx(0.25, rel=1e-12)


def test_betainc_refuses_x_above_1_and_welchs_df_by_hand():
    """x in [0, 1] exactly (1.5 refused); Welch-Satterthwaite's df worked by hand: base [1, 2, 3, 4] (variance 5/3,
    n 4), new [2, 4, 6] (variance 4, n 3): se2 = 5/12 + 4/3 = 7/4; df = (7/4)^2 / ((5/12)^2 / 3 + (4/3)^2 / 2)
    = 3.0625 / (25/432 + 8/9) = 3.0625 / (409/432) = 3.23472..."""
    with pytest.raises(ValueError, match="0 <= x <= 1, got x=1.5"):
        significance.betainc(1.0, 1.0, 1.5)
    test = significance.welch_t_test([1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0])
    assert test.df == pytest.approx(3.0625 / (409 / 432), rel=1e-12)
    assert test.t == pytest.approx((4.0 - 2.5) / math.sqrt(7 / 4), rel=1e-12)


def test_a_tie_reports_the_pooled_df():
    """Equal means (a tie) give t 0, p 1 and df n1 + n2 - 2: 4 + 3 - 2 = 5."""
    test = significance.welch_t_test([1.0, 2.0, 3.0, 2.0], [1.0, 3.0, 2.0])
    assert (test.t, test.p, test.df) == (0.0, 1.0, 5.0)
