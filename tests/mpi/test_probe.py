"""hetbench/harness/probe.py: a GEMM rate at a slice's shape (the modelled one on simulated devices, exactly; the
doubling of the part on the host, until one GEMM takes min_seconds), and the link to the root under mpiexec."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
from helpers import REPO, needs_mpi, run_python

from hetbench.backends.host import HostBackend
from hetbench.backends.sim import SimBackend, gemm_model_seconds, get_model
from hetbench.dtypes import get_dtype
from hetbench.harness.split_plan import dim_of as slice_dim
from hetbench.harness.probe import FIRST_PART, gemm_rate, measure_gemm, slice_shape


def test_slice_shapes_and_dims():
    assert slice_shape("rows", 100, 30, 70, 12) == (12, 30, 70)
    assert slice_shape("k", 100, 30, 70, 12) == (100, 30, 12)
    assert slice_dim("rows", 100, 30, 70) == 100 and slice_dim("k", 100, 30, 70) == 70
    with pytest.raises(ValueError, match="unknown strategy 'cols'; accepted: rows, k"):
        slice_shape("cols", 1, 1, 1, 1)


@pytest.mark.parametrize("strategy, dtype", [("rows", "fp32"), ("k", "fp32"), ("rows", "bf16"), ("k", "fp64")])
def test_sim_rate_is_the_model_at_the_whole_dimension(strategy, dtype):
    """A simulated GEMM's modelled time is far below min_seconds, so the part doubles up to the dimension (64, 128,
    then the cap 150), and the rate is the model's at that shape."""
    model = get_model("h100")
    m, n, k = 150, 40, 150
    measured = measure_gemm(SimBackend(model), dtype, strategy, m, n, k, max_part=10_000, min_seconds=1.0)
    assert [p for p, _ in measured.probes] == [64, 128, 150]
    assert measured.part == 150 and measured.timing == "modelled"
    shape = slice_shape(strategy, m, n, k, 150)
    model_seconds = gemm_model_seconds(model, *shape, dtype)
    # the probes and the timed runs are the model's time of their shape (the clock's sums round in the last bits)
    for part, seconds in measured.probes:
        assert seconds == pytest.approx(gemm_model_seconds(model, *slice_shape(strategy, m, n, k, part), dtype),
                                        rel=1e-12)
    assert measured.seconds == pytest.approx((model_seconds,) * 3, rel=1e-12)
    rate, part = gemm_rate(SimBackend(model), dtype, strategy, m, n, k, max_part=10_000, min_seconds=1.0)
    assert part == 150
    assert rate == pytest.approx(2 * 150 * 40 * 150 / model_seconds, rel=1e-12)


def test_sim_rate_stops_at_the_first_part_that_takes_min_seconds_and_at_max_part():
    model = get_model("mi300x")
    m, n, k = 500, 64, 96
    at_64 = gemm_model_seconds(model, 64, n, k, "fp32")
    rate, part = gemm_rate(SimBackend(model), "fp32", "rows", m, n, k, max_part=500, min_seconds=at_64 * (1 - 1e-9))
    assert part == 64 and rate == pytest.approx(2 * 64 * n * k / at_64, rel=1e-12)
    # (a hair below: the modelled clock's sums round in the last bits); just above 64's time: one doubling
    measured = measure_gemm(SimBackend(model), "fp32", "rows", m, n, k, max_part=500, min_seconds=at_64 * 1.0001)
    assert measured.part == 128 and [p for p, _ in measured.probes] == [64, 128]
    # a memory cap below 64 starts (and ends) there; one above it caps the doubling
    assert gemm_rate(SimBackend(model), "fp32", "rows", m, n, k, max_part=10, min_seconds=1.0)[1] == 10
    measured = measure_gemm(SimBackend(model), "fp32", "k", m, n, k, max_part=90, min_seconds=1.0)
    assert [p for p, _ in measured.probes] == [64, 90] and measured.shape == (m, n, 90)
    assert measured.rate == pytest.approx(2 * m * n * 90 / gemm_model_seconds(model, m, n, 90, "fp32"), rel=1e-12)


def test_sim_buffers_are_freed():
    backend = SimBackend(get_model("v100"))
    measure_gemm(backend, "fp32", "rows", 300, 80, 80, max_part=300, min_seconds=1.0, check=True)
    assert backend.memory.allocated_bytes == 0


def test_host_part_doubles_until_one_gemm_takes_min_seconds():
    """On the host the part doubles from 64 while a GEMM is faster than min_seconds; the rate is the flops of the
    part found over the median of its timed runs, and within what one CPU core can do."""
    min_seconds = 0.002
    m, n, k = 1 << 16, 96, 96  # 64 rows take microseconds; all m rows far more than 2 ms
    measured = measure_gemm(HostBackend(threads=1), "fp32", "rows", m, n, k, max_part=m, min_seconds=min_seconds,
                            repeat=3, check=True)
    parts = [p for p, _ in measured.probes]
    assert parts == [FIRST_PART * 2**i for i in range(len(parts))]
    assert all(s < min_seconds for _, s in measured.probes[:-1])
    assert measured.probes[-1][1] >= min_seconds and measured.part == parts[-1] < m
    assert len(measured.seconds) == 3 and measured.timing == "measured" and measured.verified is True
    assert measured.rate == 2 * measured.part * n * k / statistics.median(measured.seconds)
    assert 1e7 < measured.rate < 1e13  # above 10 MFLOP/s, below 10 TFLOP/s on one thread


def test_host_rate_at_the_whole_dimension_when_it_is_fast():
    rate, part = gemm_rate(HostBackend(threads=1), "fp64", "k", 70, 50, 90, max_part=1000, min_seconds=60.0,
                           repeat=2)
    assert part == 90  # 64, then the cap: k
    assert 1e6 < rate < 1e13


def test_a_wrong_product_is_caught(monkeypatch):
    monkeypatch.setenv("HETBENCH_SIM_FAULT", "corrupt")
    measured = measure_gemm(SimBackend(get_model("h100")), "fp32", "rows", 64, 64, 64, max_part=64, check=True)
    assert measured.verified is False and measured.max_residual_over_tolerance > 1
    assert measure_gemm(SimBackend(get_model("h100")), "fp32", "rows", 64, 64, 64, max_part=64).verified is None


@pytest.mark.parametrize("kwargs, message", [
    ({"max_part": 0}, "max_part 0 leaves no part to time; it must be >= 1"),
    ({"min_seconds": 0.0}, "min_seconds 0.0 must be a finite number > 0"),
    ({"min_seconds": math.nan}, "min_seconds nan must be a finite number > 0"),
    ({"repeat": 0}, "repeat 0 must be >= 1"),
    ({"strategy": "cols"}, "unknown strategy 'cols'; accepted: rows, k"),
])
def test_bad_arguments(kwargs, message):
    args = {"dtype": get_dtype("fp32"), "strategy": "rows", "m": 8, "n": 8, "k": 8, "max_part": 8, **kwargs}
    with pytest.raises(ValueError) as e:
        gemm_rate(HostBackend(), **args)
    assert str(e.value) == message


def test_inputs_are_the_generated_ones():
    """The slice's inputs are gemm.generate_inputs(seed, 0, ...): the product a host run checks is A @ B of them."""
    from hetbench.harness.gemm import generate_inputs

    a, b = generate_inputs(5, 0, 64, 32, 48, get_dtype("fp64"))
    calls = []

    class Recording(HostBackend):
        def matmul(self, a_dev, b_dev, out, dtype):
            calls.append((a_dev.copy(), b_dev.copy()))
            super().matmul(a_dev, b_dev, out, dtype)

    measure_gemm(Recording(), "fp64", "rows", 64, 32, 48, max_part=64, min_seconds=60.0, repeat=1, seed=5)
    assert len(calls) == 3  # the first part's untimed run, its probe, one timed run
    np.testing.assert_array_equal(calls[-1][0], a)
    np.testing.assert_array_equal(calls[-1][1], b)


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_link_to_root_under_mpiexec(tmp_path, nprocs):
    run = run_python(["-m", "mpi4py", str(REPO / "tests" / "mpi_probe.py")], nprocs=nprocs, cwd=tmp_path,
                     timeout=120)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    roots = sorted({0, nprocs - 1})
    assert sorted(map(int, report)) == roots
    for root in roots:
        links = report[str(root)]
        assert len(links) == nprocs
        for rank, link in enumerate(links):
            if rank == root:
                assert link is None
            else:
                bandwidth, latency = link
                # between processes on one machine: more than 1 MB/s, a latency under 10 ms
                assert 1e6 < bandwidth < 1e13 and 0 < latency < 0.01, link
