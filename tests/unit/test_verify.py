"""Freivalds' check (hetbench/harness/verify.py): right products pass, one wrong element fails, inputs stay as given."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetbench.dtypes import DTYPES, round_to_bf16, to_host_dtype
from hetbench.harness.verify import (
    ProductTerms,
    Verdict,
    check,
    freivalds,
    gemm_error_factor,
    product_terms,
    random_vectors,
)

FP32 = DTYPES["fp32"]
FP64 = DTYPES["fp64"]


def uniform(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=shape)


def product(a: np.ndarray, b: np.ndarray, dtype_name: str) -> np.ndarray:
    """C = A @ B as a device of that precision would hand it back."""
    if dtype_name == "bf16":
        # bf16 GEMMs accumulate in fp32 and round the result to bf16
        return round_to_bf16(np.matmul(a, b))
    return np.matmul(a, b)


@pytest.mark.parametrize("dtype_name", ["fp64", "fp32", "fp16", "bf16"])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (37, 23, 53), (200, 150, 300)])
def test_correct_product_passes(dtype_name: str, m: int, k: int, n: int) -> None:
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng([m, k, n])
    a = to_host_dtype(uniform(rng, (m, k)), dtype)
    b = to_host_dtype(uniform(rng, (k, n)), dtype)
    c = product(a, b, dtype_name)
    assert c.shape == (m, n)
    for seed in (0, 1, 12345):
        verdict = freivalds(a, b, c, dtype, seed)
        assert verdict.ok, (dtype_name, m, k, n, seed, verdict)
        assert 0.0 <= verdict.max_residual_over_tolerance <= 1.0


def test_bf16_data_is_bf16() -> None:
    # The bf16 cases above only mean something if the data really is rounded to bf16 values
    rng = np.random.default_rng(3)
    a = to_host_dtype(uniform(rng, (8, 8)), DTYPES["bf16"])
    assert a.dtype == np.float32
    assert np.all(a.view(np.uint32) & np.uint32(0xFFFF) == 0)


def _wrong_positions(rng: np.random.Generator, m: int, n: int) -> list[tuple[int, int]]:
    corners = [(0, 0), (0, n - 1), (m - 1, 0), (m - 1, n - 1)]
    return corners + [(int(rng.integers(m)), int(rng.integers(n))) for _ in range(3)]


@pytest.mark.parametrize("dtype_name", ["fp32", "fp64"])
def test_one_wrong_element_fails_256(dtype_name: str) -> None:
    dtype = DTYPES[dtype_name]
    n = 256
    rng = np.random.default_rng(256)
    a = to_host_dtype(uniform(rng, (n, n)), dtype)
    b = to_host_dtype(uniform(rng, (n, n)), dtype)
    c = np.matmul(a, b)
    assert freivalds(a, b, c, dtype, seed=7).ok
    # entries of C are about sqrt(k)/3 = 5.3 in size: +1.0 is a modest error
    for row, col in _wrong_positions(rng, n, n):
        wrong = c.copy()
        wrong[row, col] += 1.0
        verdict = freivalds(a, b, wrong, dtype, seed=7)
        assert not verdict.ok, (row, col, verdict)
        assert verdict.max_residual_over_tolerance > 1.0


@pytest.fixture(scope="module")
def product_1024() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = 1024
    rng = np.random.default_rng(1024)
    a = uniform(rng, (n, n)).astype(np.float32)
    b = uniform(rng, (n, n)).astype(np.float32)
    return a, b, np.matmul(a, b)


def test_correct_product_passes_1024(product_1024) -> None:
    a, b, c = product_1024
    assert freivalds(a, b, c, FP32, seed=11).ok


def test_one_wrong_element_fails_1024_fp32(product_1024) -> None:
    a, b, c = product_1024
    n = c.shape[0]
    rng = np.random.default_rng(99)
    for row, col in _wrong_positions(rng, n, n):
        wrong = c.copy()
        wrong[row, col] += 1.0
        assert not freivalds(a, b, wrong, FP32, seed=11).ok, (row, col)


def test_grossly_wrong_element_fails_1024_fp32(product_1024) -> None:
    # an error of twice the typical entry, anywhere
    a, b, c = product_1024
    n = c.shape[0]
    delta = 2.0 * float(np.mean(np.abs(c)))
    rng = np.random.default_rng(98)
    for row, col in _wrong_positions(rng, n, n):
        wrong = c.copy()
        wrong[row, col] += delta
        assert not freivalds(a, b, wrong, FP32, seed=11).ok, (row, col)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype_name", ["fp32", "fp64"])
def test_non_finite_element_fails(dtype_name: str, bad: float) -> None:
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(5)
    a = to_host_dtype(uniform(rng, (40, 30)), dtype)
    b = to_host_dtype(uniform(rng, (30, 20)), dtype)
    c = np.matmul(a, b)
    c[13, 7] = bad
    verdict = freivalds(a, b, c, dtype, seed=0)
    assert verdict.ok is False
    assert verdict.max_residual_over_tolerance == math.inf
    assert verdict.to_dict() == {"verified": False, "max_residual_over_tolerance": math.inf}


@pytest.mark.parametrize("host_dtype", [np.float64, np.float32])
def test_inputs_are_not_modified(host_dtype) -> None:
    rng = np.random.default_rng(17)
    # negative entries: taking |.| in place would show in them
    a = uniform(rng, (70, 50)).astype(host_dtype)
    b = uniform(rng, (50, 60)).astype(host_dtype)
    c = np.matmul(a, b)
    originals = [x.copy() for x in (a, b, c)]
    assert all((x < 0).any() for x in originals)
    dtype = FP64 if host_dtype is np.float64 else FP32

    assert freivalds(a, b, c, dtype, seed=1).ok
    x = random_vectors(c.shape[1], seed=1)
    x_before = x.copy()
    terms = product_terms(a, b, c, x)
    assert check(c, x, terms, dtype).ok
    # a sum of products as well: the addition must not write into either operand
    first = product_terms(a, b, c, x)
    first_expected = first.expected.copy()
    _ = first + terms
    np.testing.assert_array_equal(first.expected, first_expected)

    for before, after in zip(originals, (a, b, c)):
        assert after.dtype == before.dtype
        np.testing.assert_array_equal(after, before)
    np.testing.assert_array_equal(x, x_before)


def test_inputs_are_not_modified_for_views() -> None:
    # Non-contiguous views of float64 data: asarray hands back the caller's memory
    rng = np.random.default_rng(18)
    big_a = uniform(rng, (80, 100))
    big_b = uniform(rng, (100, 90))
    a, b = big_a[::2, ::2], big_b[::2, ::3]
    c_full = np.zeros((80, 60))
    c = c_full[::2, ::2]
    c[...] = a @ b
    copies = [x.copy() for x in (big_a, big_b, c_full)]
    assert freivalds(a, b, c, FP64, seed=2).ok
    for before, after in zip(copies, (big_a, big_b, c_full)):
        np.testing.assert_array_equal(after, before)


def test_product_terms_add() -> None:
    rng = np.random.default_rng(21)
    x = random_vectors(6, seed=4)
    a1, b1, a2, b2 = uniform(rng, (5, 4)), uniform(rng, (4, 6)), uniform(rng, (5, 4)), uniform(rng, (4, 6))
    t1 = product_terms(a1, b1, a1 @ b1, x)
    t2 = product_terms(a2, b2, a2 @ b2, x)
    total = t1 + t2
    assert isinstance(total, ProductTerms)
    np.testing.assert_array_equal(total.expected, t1.expected + t2.expected)
    np.testing.assert_array_equal(total.gemm_scale, t1.gemm_scale + t2.gemm_scale)
    np.testing.assert_array_equal(total.out_scale, t1.out_scale + t2.out_scale)
    # Cauchy-Schwarz: the GEMM scale bounds |A (B x)| (g(4) = 4 >= 1)
    assert np.all(t1.gemm_scale >= np.abs(t1.expected))


class TestSumOfProducts:
    """Each rank contributes A_r (B_r x); the root checks its reduced C against their sum."""

    m, k, n, ranks = 128, 96, 160, 3

    def setup_method(self) -> None:
        rng = np.random.default_rng(33)
        self.a = [uniform(rng, (self.m, self.k)).astype(np.float32) for _ in range(self.ranks)]
        self.b = [uniform(rng, (self.k, self.n)).astype(np.float32) for _ in range(self.ranks)]
        self.c = [np.matmul(a, b) for a, b in zip(self.a, self.b)]
        self.x = random_vectors(self.n, seed=9)
        self.terms = product_terms(self.a[0], self.b[0], self.c[0], self.x)
        for a, b, c in zip(self.a[1:], self.b[1:], self.c[1:]):
            self.terms = self.terms + product_terms(a, b, c, self.x)

    def verdict(self, c: np.ndarray) -> Verdict:
        return check(c, self.x, self.terms, FP32, sum_dtype=FP32, addends=self.ranks)

    def reduced(self) -> np.ndarray:
        total = self.c[0].copy()
        for c in self.c[1:]:
            total += c  # summed in fp32, as the reduction does
        assert total.dtype == np.float32
        return total

    def test_sum_passes(self) -> None:
        verdict = self.verdict(self.reduced())
        assert verdict.ok, verdict

    def test_missing_addend_fails(self) -> None:
        partial = self.c[0] + self.c[1]
        verdict = self.verdict(partial)
        assert not verdict.ok
        assert verdict.max_residual_over_tolerance > 100.0

    def test_one_wrong_element_of_sum_fails(self) -> None:
        total = self.reduced()
        total[self.m - 1, 0] += 1.0
        assert not self.verdict(total).ok

    def test_single_product_terms_do_not_verify_sum(self) -> None:
        alone = product_terms(self.a[0], self.b[0], self.c[0], self.x)
        assert not check(self.reduced(), self.x, alone, FP32, sum_dtype=FP32, addends=self.ranks).ok


def test_all_zero_passes() -> None:
    a = np.zeros((20, 10), dtype=np.float32)
    b = np.zeros((10, 30), dtype=np.float32)
    c = np.zeros((20, 30), dtype=np.float32)
    verdict = freivalds(a, b, c, FP32, seed=0)
    assert verdict.ok
    assert verdict.max_residual_over_tolerance == 0.0


def test_all_zero_operands_with_nonzero_result_fails() -> None:
    # Every bound is zero there: only exact zeros may pass
    a = np.zeros((20, 10))
    b = np.zeros((10, 30))
    c = np.zeros((20, 30))
    c[19, 29] = 1e-30
    assert not freivalds(a, b, c, FP64, seed=0).ok


@pytest.mark.parametrize("k,factor", [(1, 1.0), (4, 4.0), (64, 16.0), (10000, 200.0)])
def test_gemm_error_factor(k: int, factor: float) -> None:
    value = gemm_error_factor(k)
    assert isinstance(value, float)
    assert value == factor


def test_random_vectors_deterministic_and_away_from_zero() -> None:
    x = random_vectors(1000, seed=5)
    np.testing.assert_array_equal(x, random_vectors(1000, seed=5))
    assert not np.array_equal(x, random_vectors(1000, seed=6))
    assert np.all(np.abs(x) >= 0.5) and np.all(np.abs(x) < 1.5)
    assert (x < 0).any() and (x > 0).any()
