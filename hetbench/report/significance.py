"""Whether two samples of repeats differ significantly: Welch's two-sample t-test, two-sided, with Student's
t-distribution computed from the regularized incomplete beta function (no SciPy).

pyperf's compare_to asks the same question with Student's two-sample t-test at 95 %; Welch's form drops the
assumption that both runs have the same variance, which a change of device, thread count or library breaks.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

ALPHA = 0.05  # two-sided: significant at 95 % confidence

_EPS = 1e-15
_TINY = 1e-300
_MAX_ITERATIONS = 500


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), by the modified Lentz method (Numerical Recipes, betacf)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_ITERATIONS + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        step = d * c
        h *= step
        if abs(step - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta I_{x}({a}, {b}) did not converge")


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if a <= 0 or b <= 0:
        raise ValueError(f"betainc needs a > 0 and b > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc needs 0 <= x <= 1, got x={x}")
    if x == 0.0 or x == 1.0:
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    # the fraction converges fast for x below the mean of the distribution; use the symmetry above it
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t-distribution with df degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t-distribution with df degrees of freedom."""
    tail = t_two_sided_p(t, df) / 2.0
    return 1.0 - tail if t > 0 else tail


@dataclass(frozen=True)
class TTest:
    t: float  # positive when the second sample's mean is the larger
    df: float
    p: float  # two-sided
    mean_base: float
    mean_new: float

    @property
    def significant(self) -> bool:
        return self.p < ALPHA


def welch_t_test(base: Sequence[float], new: Sequence[float]) -> TTest | None:
    """Welch's t-test of new against base, or None when either has fewer than two values (no variance to
    judge by). Two samples that each repeat one value are significant exactly when the values differ
    (beyond rounding), as with modelled timings."""
    if len(base) < 2 or len(new) < 2:
        return None
    m1, m2 = statistics.fmean(base), statistics.fmean(new)
    v1, v2 = statistics.variance(base, m1), statistics.variance(new, m2)
    n1, n2 = len(base), len(new)
    se2 = v1 / n1 + v2 / n2
    diff = m2 - m1
    if abs(diff) <= 1e-12 * max(abs(m1), abs(m2)):
        return TTest(0.0, float(n1 + n2 - 2), 1.0, m1, m2)
    if se2 == 0.0:
        return TTest(math.copysign(math.inf, diff), float(n1 + n2 - 2), 0.0, m1, m2)
    t = diff / math.sqrt(se2)
    # Welch–Satterthwaite
    df = se2 * se2 / ((v1 / n1) ** 2 / (n1 - 1) + (v2 / n2) ** 2 / (n2 - 1))
    return TTest(t, df, t_two_sided_p(t, df), m1, m2)
