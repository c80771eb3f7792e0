"""The host GEMM ratio: hetbench's harness (the host backend, fp32) against a bare NumPy `a @ b` on the same
inputs, in alternating rounds."""

from __future__ import annotations

import statistics
import time

import numpy as np

from hetbench.backends.host import HostBackend, blas_description
from hetbench.bench.registry import ROUNDS, Part, register
from hetbench.dtypes import DTYPES
from hetbench.harness.gemm import flops, generate_inputs
from hetbench.harness.timing import time_repeats


def _bare_numpy_seconds(a: np.ndarray, b: np.ndarray, repeat: int) -> float:
    a @ b  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_gemm(sizes: tuple[int, ...] = (1024, 2048), repeat: int = 10) -> list[dict[str, float]]:
    dtype = DTYPES["fp32"]
    backend = HostBackend()
    results = []
    for n in sizes:
        a, b = generate_inputs(0, 0, n, n, n, dtype)
        a_dev, b_dev, c_dev = backend.upload(a, dtype), backend.upload(b, dtype), backend.empty((n, n), dtype)
        ours, bare = [], []
        for _ in range(ROUNDS):
            seconds = time_repeats(backend, lambda: backend.matmul(a_dev, b_dev, c_dev, dtype), 1, repeat)
            ours.append(statistics.median(seconds))
            bare.append(_bare_numpy_seconds(a, b, repeat))
        flop = flops(n, n, n)
        ours_gflops = flop / statistics.median(ours) / 1e9
        bare_gflops = flop / statistics.median(bare) / 1e9
        results.append({"n": n, "hetbench_gflops": ours_gflops, "numpy_gflops": bare_gflops,
                        "ratio": ours_gflops / bare_gflops})
    backend.close()
    return results


def run(argv: list[str]) -> int:
    """Prints the ratio at each size; exit 0 (the goal is read off the lines, as the other ratios')."""
    blas, threads = blas_description()
    print(f"host GEMM, fp32, {blas}, {threads} threads: hetbench harness vs bare NumPy `a @ b` "
          f"(medians of {ROUNDS} alternating rounds; goal: ratio >= 0.97)")
    print(f"{'n':>6} {'hetbench GFLOP/s':>17} {'numpy GFLOP/s':>14} {'ratio':>7}")
    for r in bench_gemm():
        print(f"{r['n']:>6} {r['hetbench_gflops']:>17.1f} {r['numpy_gflops']:>14.1f} {r['ratio']:>7.3f}")
    return 0


register(Part("gemm", "host GEMM through hetbench's harness vs a bare NumPy `a @ b`", False, run))
