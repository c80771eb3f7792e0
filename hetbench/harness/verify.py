"""Freivalds' check of C = A @ B: O(n^2) work instead of recomputing the product.

For random vectors x, C x must equal A (B x) up to rounding. The tolerance bounds the rounding of a GEMM in the
given precision elementwise: |C x - A (B x)| <= g(k) * u * |A| (|B| |x|) + u * |C| |x|, with u the unit roundoff and
g(k) = min(k, 8 sqrt(k)). For k <= 64 that is the worst-case bound; beyond it the sqrt(k) growth of rounding
errors of random sign, with a factor of 8 to spare. Sums of products over ranks are checked the same way: each
rank contributes A_r (B_r x) and its bounds, and the root checks its reduced C against their sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hetbench.dtypes import DType

TRIALS = 2  # vectors per check; each one catches a wrong element independently
_ROW_BLOCK = 2048  # rows converted to float64 at a time, to bound the memory the check needs


def gemm_error_factor(k: int) -> float:
    return float(min(k, 8.0 * math.sqrt(k)))


def random_vectors(n: int, seed: int) -> np.ndarray:
    """(n, TRIALS) vectors with entries of random sign and magnitude in [0.5, 1.5): no entry is near zero, so a
    wrong element in any column of C shows in the residual."""
    rng = np.random.default_rng([seed, 0x5EED])
    signs = rng.choice(np.array([-1.0, 1.0]), size=(n, TRIALS))
    return signs * rng.uniform(0.5, 1.5, size=(n, TRIALS))


def matvec64(matrix: np.ndarray, x: np.ndarray, absolute: bool = False) -> np.ndarray:
    """matrix @ x in float64 (|matrix| @ x with absolute=True), a block of rows at a time."""
    out = np.empty((matrix.shape[0], x.shape[1]), dtype=np.float64)
    for start in range(0, matrix.shape[0], _ROW_BLOCK):
        block = np.asarray(matrix[start : start + _ROW_BLOCK], dtype=np.float64)
        if absolute:
            block = np.abs(block)  # a new array: asarray may have returned a view of the caller's data
        out[start : start + _ROW_BLOCK] = block @ x
    return out


@dataclass
class ProductTerms:
    """What one rank contributes to checking a product or a sum of products, for a shared x."""

    expected: np.ndarray  # A (B x)
    bound: np.ndarray  # |A| (|B| |x|)

    def __add__(self, other: "ProductTerms") -> "ProductTerms":
        return ProductTerms(self.expected + other.expected, self.bound + other.bound)


def product_terms(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> ProductTerms:
    expected = matvec64(a, matvec64(b, x))
    bound = matvec64(a, matvec64(b, np.abs(x), absolute=True), absolute=True)
    return ProductTerms(expected, bound)


@dataclass
class Verdict:
    ok: bool
    max_residual_over_tolerance: float  # <= 1 passes; the margin shows how close a pass was

    def to_dict(self) -> dict[str, object]:
        return {"verified": self.ok, "max_residual_over_tolerance": self.max_residual_over_tolerance}


def check(c: np.ndarray, x: np.ndarray, terms: ProductTerms, dtype: DType, k: int, sum_dtype: DType | None = None,
          addends: int = 1) -> Verdict:
    """Whether C matches the product (or sum of `addends` products) that `terms` describe.

    `sum_dtype` is the precision the addends were summed in (the reduction), when there were several."""
    cx = matvec64(c, x)
    cabs = matvec64(c, np.abs(x), absolute=True)
    u = dtype.unit_roundoff
    tolerance = gemm_error_factor(k) * u * terms.bound + u * cabs
    if addends > 1:
        u_sum = (sum_dtype or dtype).unit_roundoff
        tolerance += (addends - 1) * u_sum * (terms.bound + cabs)
    # A floor for all-zero rows, where every bound is zero and only exact zeros pass
    tolerance = np.maximum(tolerance, np.finfo(np.float64).tiny)
    residual = np.abs(cx - terms.expected)
    if not np.all(np.isfinite(residual)):
        return Verdict(False, math.inf)
    ratio = float(np.max(residual / tolerance)) if residual.size else 0.0
    return Verdict(ratio <= 1.0, ratio)


def freivalds(a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype: DType, seed: int) -> Verdict:
    """Check C = A @ B for one product."""
    x = random_vectors(c.shape[1], seed)
    return check(c, x, product_terms(a, b, x), dtype, a.shape[1])
