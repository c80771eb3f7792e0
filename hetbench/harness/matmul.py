"""The matmul run on each rank: checks before anything is allocated, timed GEMMs, copies, the reduce of the
products to the root, Freivalds checks of every product and of the sum, and the rows and summary of the result.

The order on every rank: upload A_r and B_r (timed), warm-up and timed GEMMs (device timer), copy C_r to the
host (timed), check C_r, then the host-staged reduce of C_r to the root, warm-up and timed repeats each after a
barrier, and the check of the sum at the root.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetbench.backends.base import TIMING_MODELLED, Backend, DeviceInfo
from hetbench.backends.host import host_memory_available_bytes
from hetbench.benchmarks import gemm
from hetbench.comm.world import World
from hetbench.config import MatmulConfig, expand_rank_path
from hetbench.dtypes import DType
from hetbench.harness import verify
from hetbench.harness.devices import OpenDevice, open_rank_device
from hetbench.harness.metadata import rank_metadata
from hetbench.harness.stats import summarize
from hetbench.harness.timing import time_repeats

MIB = 1024**2


@dataclass
class Prepared:
    """One rank, ready to run: its device is open and its inputs are on the host."""

    backend: Backend
    info: DeviceInfo
    spec: str
    a: np.ndarray
    b: np.ndarray

    @property
    def mnk(self) -> tuple[int, int, int]:
        return self.a.shape[0], self.b.shape[1], self.a.shape[1]


@dataclass
class RankOutcome:
    row: dict[str, Any]
    reduced: np.ndarray | None = None  # the sum of all products, at the root only
    reduced_verdict: verify.Verdict | None = None  # known on every rank (broadcast from the root)


def _fmt_bytes(n: int) -> str:
    return f"{n} bytes ({n / MIB:.1f} MiB)"


def _memory_errors(backend: Backend, info: DeviceInfo, m: int, n: int, k: int, dtype: DType) -> list[str]:
    errors = []
    need = gemm.device_bytes(m, n, k, dtype)
    free = backend.free_memory_bytes()
    label = f"{info.backend}:{info.index} ({info.name})"
    if free is not None and need > free:
        errors.append(
            f"A, B and C of {m}x{k} @ {k}x{n} in {dtype.name} need {_fmt_bytes(need)} on {label}, "
            f"which has {_fmt_bytes(free)} free; use a smaller size"
        )
    largest = max(m * k, k * n, m * n) * dtype.itemsize
    max_alloc = backend.max_allocation_bytes()
    if max_alloc is not None and largest > max_alloc:
        errors.append(
            f"the largest matrix of {m}x{k} @ {k}x{n} in {dtype.name} takes {_fmt_bytes(largest)}, more than "
            f"{label} allows in one buffer ({_fmt_bytes(max_alloc)}); use a smaller size"
        )
    return errors


def _host_memory_error(m: int, n: int, k: int, dtype: DType, local_size: int) -> str | None:
    """The host holds A, B and C too (and the reduce buffers): check before generating them."""
    need = (m * k + k * n + 2 * m * n) * max(dtype.host.itemsize, dtype.mpi_dtype.itemsize)
    available = host_memory_available_bytes()
    if available is None:
        return None
    share = available // max(local_size, 1)
    if need > share:
        return (
            f"matrices of {m}x{k} @ {k}x{n} in {dtype.name} need {_fmt_bytes(need)} of host memory per rank, "
            f"more than this rank's share of the {_fmt_bytes(available)} available; use a smaller size"
        )
    return None


def open_device(cfg: MatmulConfig, world: World) -> tuple[OpenDevice | None, list[str]]:
    """Open this rank's device and check its dtype. Returns (device, errors) for World.agree."""
    return open_rank_device(cfg.backends[world.rank], cfg.dtype, world)


def prepare_inputs(cfg: MatmulConfig, world: World, opened: OpenDevice) -> tuple[Prepared | None, list[str]]:
    """Load or make this rank's A_r and B_r, checking first that they fit the device and the host.

    Returns (prepared, errors) for World.agree."""
    backend, info = opened.backend, opened.info
    if cfg.a_path is not None and cfg.b_path is not None:
        a_path = expand_rank_path(cfg.a_path, world.rank, world.host)
        b_path = expand_rank_path(cfg.b_path, world.rank, world.host)
        try:
            # a value the dtype cannot hold becomes inf, which load_matrix reports: not NumPy's warning too
            with np.errstate(over="ignore", invalid="ignore"):
                a = gemm.load_matrix(a_path, "a", cfg.dtype)
                b = gemm.load_matrix(b_path, "b", cfg.dtype)
            gemm.check_shapes(a, b, a_path, b_path)
            gemm.check_finite_products(a, b, cfg.dtype, a_path, b_path,
                                       addends=world.size if cfg.reduce == "sum" else 1)
        except gemm.InputError as e:
            return None, [str(e)]
    else:
        error = next(iter(_memory_errors(backend, info, cfg.m, cfg.n, cfg.k, cfg.dtype)), None)
        if error is None:
            error = _host_memory_error(cfg.m, cfg.n, cfg.k, cfg.dtype, world.local_size)
        if error is not None:
            return None, [error]
        a, b = gemm.generate_inputs(cfg.seed, world.rank, cfg.m, cfg.n, cfg.k, cfg.dtype)
    prepared = Prepared(backend, info, opened.spec, a, b)
    m, n, k = prepared.mnk
    return prepared, _memory_errors(backend, info, m, n, k, cfg.dtype)


def shape_errors(cfg: MatmulConfig, world: World, prepared: Prepared | None) -> list[str]:
    """Collective: a sum of products needs every rank's C_r to have one shape."""
    shapes = world.allgather(prepared.mnk[:2] if prepared else None)
    if cfg.reduce != "sum" or any(s is None for s in shapes) or len(set(shapes)) <= 1:
        return []
    listing = ", ".join(f"rank {r}: {s[0]}x{s[1]}" for r, s in enumerate(shapes))
    return [f"--reduce sum needs every rank's product to have one shape, got {listing}; or use --reduce none"]


def run_rank(cfg: MatmulConfig, world: World, prepared: Prepared) -> RankOutcome:
    """The timed run on this rank. Collective: every rank calls it."""
    backend, dtype = prepared.backend, cfg.dtype
    m, n, k = prepared.mnk
    world.barrier()

    with backend.timer() as h2d:
        a_dev = backend.upload(prepared.a, dtype)
        b_dev = backend.upload(prepared.b, dtype)
    c_dev = backend.empty((m, n), dtype)
    gemm_seconds = time_repeats(backend, lambda: backend.matmul(a_dev, b_dev, c_dev, dtype), cfg.warmup, cfg.repeat)
    with backend.timer() as d2h:
        c_host = backend.download(c_dev, dtype)
    a_dev = b_dev = c_dev = None  # the device's memory is free again before the reduce

    x = verify.random_vectors(n, cfg.seed)
    terms = verify.product_terms(prepared.a, prepared.b, c_host, x)
    verdict = verify.check(c_host, x, terms, dtype)

    reduce_seconds: list[float] = []
    reduced: np.ndarray | None = None
    reduced_verdict: verify.Verdict | None = None
    if cfg.reduce == "sum":
        reduce_seconds, reduced, reduced_verdict = _reduce_to_root(cfg, world, c_host, x, terms)

    flop_count = gemm.flops(m, n, k)
    gemm_stats = summarize(gemm_seconds, "gemm_seconds")
    gemm_tflops = flop_count / gemm_stats["gemm_seconds_median"] / 1e12
    peak = prepared.info.peak_tflops.get(dtype.name)
    h2d_bytes = (m * k + k * n) * dtype.itemsize
    d2h_bytes = m * n * dtype.itemsize
    row: dict[str, Any] = {
        "rank": world.rank,
        "host": world.host,
        "backend": prepared.spec,
        "vendor": prepared.info.vendor,
        "device": prepared.info.name,
        "device_timing": backend.timing,
        "dtype": dtype.name,
        "m": m,
        "n": n,
        "k": k,
        "gemm_flops": flop_count,
        **gemm_stats,
        "gemm_tflops": gemm_tflops,
        "peak_tflops": peak,
        "peak_percent": 100.0 * gemm_tflops / peak if peak else None,
        "h2d_bytes": h2d_bytes,
        "h2d_seconds": h2d.seconds,
        "h2d_gbps": h2d_bytes / h2d.seconds / 1e9 if h2d.seconds > 0 else None,
        "d2h_bytes": d2h_bytes,
        "d2h_seconds": d2h.seconds,
        "d2h_gbps": d2h_bytes / d2h.seconds / 1e9 if d2h.seconds > 0 else None,
    }
    if cfg.reduce == "sum":
        reduce_bytes = m * n * dtype.mpi_dtype.itemsize
        reduce_stats = summarize(reduce_seconds, "reduce_seconds")
        row.update(
            reduce_bytes=reduce_bytes,
            **reduce_stats,
            reduce_algbw_gbps=reduce_bytes / reduce_stats["reduce_seconds_median"] / 1e9,
        )
    row.update(verified=verdict.ok, max_residual_over_tolerance=verdict.max_residual_over_tolerance)
    row["raw"] = {"gemm_seconds": gemm_seconds, "reduce_seconds": reduce_seconds}
    row["device_info"] = prepared.info.to_dict()
    row["process"] = rank_metadata()
    return RankOutcome(row, reduced, reduced_verdict)


def _reduce_to_root(cfg: MatmulConfig, world: World, c_host: np.ndarray, x: np.ndarray,
                    terms: verify.ProductTerms) -> tuple[list[float], np.ndarray | None, verify.Verdict]:
    """Sum every rank's C_r into the root over MPI (host buffers), timed; then check the sum at the root."""
    MPI, comm, root = world.MPI, world.comm, cfg.root
    send = np.ascontiguousarray(c_host, dtype=cfg.dtype.mpi_dtype)
    recv = np.empty_like(send) if world.rank == root else None
    seconds: list[float] = []
    for i in range(cfg.warmup + cfg.repeat):
        world.barrier()
        start = time.perf_counter()
        comm.Reduce(send, recv, op=MPI.SUM, root=root)
        elapsed = time.perf_counter() - start
        if i >= cfg.warmup:
            seconds.append(elapsed)

    # the check's terms are summed like the products: vectors of m x TRIALS, cheap next to C
    summed = []
    for part in (terms.expected, terms.gemm_scale, terms.out_scale):
        total = np.empty_like(part) if world.rank == root else None
        comm.Reduce(np.ascontiguousarray(part), total, op=MPI.SUM, root=root)
        summed.append(total)
    verdict = None
    if world.rank == root:
        from hetbench.dtypes import DTYPES

        sum_dtype = DTYPES["fp64"] if cfg.dtype.mpi_dtype == np.float64 else DTYPES["fp32"]
        verdict = verify.check(recv, x, verify.ProductTerms(*summed), cfg.dtype, sum_dtype=sum_dtype,
                               addends=world.size)
    verdict = comm.bcast(verdict, root=root)
    return seconds, recv, verdict


def summarize_job(cfg: MatmulConfig, rows: list[dict[str, Any]], reduced_verdict: verify.Verdict | None) -> dict[str, Any]:
    """The job's figures from every rank's row (on rank 0)."""
    slowest_gemm = max(r["gemm_seconds_median"] for r in rows)
    modelled = any(r["device_timing"] == TIMING_MODELLED for r in rows)
    summary: dict[str, Any] = {
        "ranks": len(rows),
        "total_gemm_flops": sum(r["gemm_flops"] for r in rows),
        # every rank's GEMM runs at once, so the job's rate is all their flops over the slowest rank's time
        "aggregate_gemm_tflops": sum(r["gemm_flops"] for r in rows) / slowest_gemm / 1e12,
        # the slowest rank's GEMM and copy of C_r to the host, then the slowest rank's reduce: from every rank
        # starting its GEMM to the sum at the root (a barrier separates the two phases)
        "end_to_end_seconds": max(r["gemm_seconds_median"] + r["d2h_seconds"] for r in rows)
        + (max(r["reduce_seconds_median"] for r in rows) if cfg.reduce == "sum" else 0.0),
        "end_to_end_timing": "modelled" if modelled else "measured",
        "products_verified": all(r["verified"] for r in rows),
        "reduce": cfg.reduce,
        "root": cfg.root,
    }
    if reduced_verdict is not None:
        summary["reduced_verified"] = reduced_verdict.ok
        summary["reduced_max_residual_over_tolerance"] = reduced_verdict.max_residual_over_tolerance
    summary["verified"] = summary["products_verified"] and summary.get("reduced_verified", True)
    return summary
