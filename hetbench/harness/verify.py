"""Freivalds' check of C = A @ B: O(n^2) work instead of recomputing the product.

For random vectors x, C x must equal A (B x) up to rounding. x has entries of random sign, so the rounding errors
of a row of C add up in the residual r_i = sum_j dC_ij x_j like a random walk: |r_i| grows as a 2-norm, not as
a sum of magnitudes. Each element's own rounding error is bounded by g(k) u (|A||B|)_ij, with g(k) = min(k,
2 sqrt(k)), and (|A||B|)_ij <= ||A_i,:|| ||B_:,j|| (Cauchy-Schwarz). Hence the tolerance per row

    |C x - A (B x)|_i <= LAMBDA * u * ( g(k) ||A_i,:|| sqrt(sum_j ||B_:,j||^2 x_j^2) + sqrt(sum_j C_ij^2 x_j^2) )

(the second term is C's final rounding to its type), costs O(mk + kn + mn), and at 1024^3 in fp32 on uniform
[-1, 1) data it is about 0.25 while real rounding residuals are ~1e-4: an element off by 1 (entries of C are
about 10) is caught. LAMBDA = 8 covers the tail of the random-sign sum (Hoeffding: a false alarm on a row needs
an 8-sigma deviation, probability below 1e-13). Sums of products over ranks are checked the same way: each rank
contributes A_r (B_r x) and its scales, and the root checks its reduced C against their sums, allowing the rounding
of the sum itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hetbench.dtypes import DType

TRIALS = 2  # vectors per check; each one catches a wrong element independently
LAMBDA = 8.0
# The check converts a block of rows to float64 at a time, to bound the memory it needs beside the matrices: at most
# _ROW_BLOCK rows and BLOCK_BYTES (4 MiB: 128 rows of 4096 columns, 0.06 of a 4096^2 fp32 matrix; the matrix-vector
# products run at the same speed as with blocks of 2048 rows)
_ROW_BLOCK = 2048
BLOCK_BYTES = 4 * 1024**2


def block_rows(rows: int, cols: int) -> int:
    """The rows of one float64 block of a rows x cols matrix."""
    return max(1, min(rows, _ROW_BLOCK, BLOCK_BYTES // max(1, cols * 8)))


def gemm_error_factor(k: int) -> float:
    """How an element's rounding error grows with the length k of its dot product: k in the worst case, about
    sqrt(k) for errors of random sign; the smaller of k and 2 sqrt(k)."""
    return float(min(k, 2.0 * math.sqrt(k)))


def random_vectors(n: int, seed: int) -> np.ndarray:
    """(n, TRIALS) vectors with entries of random sign and magnitude in [0.5, 1.5): no entry is near zero, so a
    wrong element in any column of C shows in the residual."""
    rng = np.random.default_rng([seed, 0x5EED])
    signs = rng.choice(np.array([-1.0, 1.0]), size=(n, TRIALS))
    return signs * rng.uniform(0.5, 1.5, size=(n, TRIALS))


def _blocks(matrix: np.ndarray):
    rows = block_rows(matrix.shape[0], int(np.prod(matrix.shape[1:], dtype=np.int64)))
    for start in range(0, matrix.shape[0], rows):
        # np.array copies: the caller's data is never changed, whatever its type
        yield start, np.array(matrix[start : start + rows], dtype=np.float64)


def matvec64(matrix: np.ndarray, x: np.ndarray) -> np.ndarray:
    """matrix @ x in float64, a block of rows at a time."""
    out = np.empty((matrix.shape[0], x.shape[1]), dtype=np.float64)
    for start, block in _blocks(matrix):
        out[start : start + len(block)] = block @ x
    return out


def _row_norms(matrix: np.ndarray) -> np.ndarray:
    out = np.empty(matrix.shape[0], dtype=np.float64)
    for start, block in _blocks(matrix):
        out[start : start + len(block)] = np.sqrt(np.einsum("ij,ij->i", block, block))
    return out


def _weighted_row_norms(matrix: np.ndarray, x: np.ndarray) -> np.ndarray:
    """sqrt(sum_j M_ij^2 x_j^2) for each row i and each column of x."""
    out = np.empty((matrix.shape[0], x.shape[1]), dtype=np.float64)
    for start, block in _blocks(matrix):
        out[start : start + len(block)] = np.sqrt((block * block) @ (x * x))
    return out


@dataclass
class ProductTerms:
    """What one rank contributes to checking a product or a sum of products, for a shared x."""

    expected: np.ndarray  # A (B x)
    gemm_scale: np.ndarray  # g(k) ||A_i,:|| sqrt(sum_j ||B_:,j||^2 x_j^2): the GEMM's rounding, per row
    out_scale: np.ndarray  # sqrt(sum_j C_ij^2 x_j^2): the rounding of C to its type, per row

    def __add__(self, other: "ProductTerms") -> "ProductTerms":
        return ProductTerms(self.expected + other.expected, self.gemm_scale + other.gemm_scale,
                            self.out_scale + other.out_scale)


def product_terms(a: np.ndarray, b: np.ndarray, c: np.ndarray, x: np.ndarray) -> ProductTerms:
    expected = matvec64(a, matvec64(b, x))
    column_norms = _row_norms(np.asarray(b).T)  # ||B_:,j||
    spread = np.sqrt((column_norms**2) @ (x * x))  # sqrt(sum_j ||B_:,j||^2 x_j^2), one per column of x
    gemm_scale = gemm_error_factor(a.shape[1]) * _row_norms(a)[:, None] * spread[None, :]
    return ProductTerms(expected, gemm_scale, _weighted_row_norms(c, x))


@dataclass
class Verdict:
    ok: bool
    max_residual_over_tolerance: float  # <= 1 passes; the margin shows how close a pass was

    def to_dict(self) -> dict[str, object]:
        return {"verified": self.ok, "max_residual_over_tolerance": self.max_residual_over_tolerance}


def check(c: np.ndarray, x: np.ndarray, terms: ProductTerms, dtype: DType, sum_dtype: DType | None = None,
          addends: int = 1) -> Verdict:
    """Whether C matches the product (or the sum of `addends` products) that `terms` describe.

    `sum_dtype` is the precision the products were summed in (the reduction), when there were several."""
    cx = matvec64(c, x)
    u = dtype.unit_roundoff
    tolerance = u * (terms.gemm_scale + terms.out_scale)
    if addends > 1:
        tolerance = tolerance + (addends - 1) * (sum_dtype or dtype).unit_roundoff * terms.out_scale
    # a floor for all-zero rows, where every scale is zero and only exact zeros pass
    tolerance = np.maximum(LAMBDA * tolerance, np.finfo(np.float64).tiny)
    residual = np.abs(cx - terms.expected)
    if not np.all(np.isfinite(residual)) or not np.all(np.isfinite(cx)):
        return Verdict(False, math.inf)
    ratio = float(np.max(residual / tolerance)) if residual.size else 0.0
    return Verdict(ratio <= 1.0, ratio)


def freivalds(a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype: DType, seed: int) -> Verdict:
    """Check C = A @ B for one product."""
    x = random_vectors(c.shape[1], seed)
    return check(c, x, product_terms(a, b, c, x), dtype)
