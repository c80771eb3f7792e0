"""The matmul run on each rank: checks before anything is allocated, timed GEMMs, copies, the reduce of the
products to the root, Freivalds checks of every product and of the sum, and the rows and summary of the result.

The order on every rank: upload A_r and B_r (timed), warm-up and timed GEMMs (device timer), copy C_r to the
host (timed: into host memory allocated, pinned on CuPy, and touched before the timer), check C_r, then the
host-staged reduce of C_r to the root, warm-up and timed repeats each after a barrier, and the check of the sum at
the root.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from hetbench.backends.base import (TIMING_MODELLED, Backend, DeviceInfo, Elapsed, capabilities, download,
                                    download_buffer)
from hetbench.backends.host import (
    RUNTIME_SCRATCH_BYTES,
    host_memory_share_bytes,
    peak_rss_bytes,
    release_free_memory,
    reset_peak_rss,
    rss_bytes,
)
from hetbench.harness import gemm
from hetbench.comm.world import World
from hetbench.benchmarks.matmul.config import MatmulConfig
from hetbench.config import expand_rank_path
from hetbench.dtypes import DTYPES, DType
from hetbench.harness import verify
from hetbench.harness.devices import OpenDevice
from hetbench.harness.memory import approx_bytes, device_in_host_memory  # noqa: F401 (read here by tests)
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
    a: np.ndarray | None  # None once the products are checked: the run no longer needs them
    b: np.ndarray | None
    mnk: tuple[int, int, int]
    host_memory_planned_bytes: int  # what the pre-check counted: this rank's peak host memory above its start
    rss_at_start_bytes: int | None  # the RSS before the inputs were made or loaded

    def release_inputs(self) -> None:
        self.a = self.b = None


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
    # the host backend's free memory is the host's, which the host check counts with every other buffer
    free = backend.free_memory_bytes() if not capabilities(info.backend).memory_is_the_hosts else None
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




def _rows_block_bytes(rows: int, cols: int) -> int:
    """What verify converts to float64 at a time: a block of rows."""
    return min(verify.block_rows(rows, cols), rows) * cols * 8


def _two_blocks_bytes(rows: int, cols: int) -> int:
    """verify's loops make the next float64 block while the loop still holds the last one: two blocks at once."""
    block = verify.block_rows(rows, cols)
    return (min(block, rows) + min(block, max(rows - block, 0))) * cols * 8


def host_memory_plan_bytes(m: int, n: int, k: int, dtype: DType, *, device_in_host: bool, sim_device: bool = False,
                           inputs: tuple[gemm.MatrixFile, gemm.MatrixFile] | None = None, is_root: bool = True,
                           world_size: int = 1, reduce: bool = True, in_place: bool = False) -> int:
    """The most host memory one rank holds at once during the run, above what it held before: the largest of its
    phases, counting every buffer each phase has alive (run_rank frees what a phase no longer needs).

    inputs: A_r, B_r (host) and the scratch of making or loading them; GEMM: A_r, B_r and, on a device whose memory
    is host memory, its copies of A, B and C (with `in_place`, a device computing on A_r and B_r as they are: its C
    alone, which is C_r too); the copy back: A_r, B_r, C on the device and C_r; the check: A_r,
    B_r, C_r and verify's float64 blocks; the reduce (A_r and B_r freed): C_r, its copy in the MPI type where that
    differs, the sum at the root, MPI's own temporary of the message when there are several ranks, and the check
    of the sum."""
    hs = dtype.host.itemsize
    a, b, c = m * k * hs, k * n * hs, m * n * hs
    if inputs is not None:
        make = max(a + gemm.load_scratch_bytes(inputs[0], dtype), a + b + gemm.load_scratch_bytes(inputs[1], dtype))
    else:
        make = max(a + gemm.generate_scratch_bytes(m, k, dtype), a + b + gemm.generate_scratch_bytes(k, n, dtype))
    if in_place:  # the device computes on A_r and B_r where they are, into a C that is the host's C_r
        on_device, copy_back = c, a + b + c
    else:
        on_device = a + b + c if device_in_host else 0
        copy_back = a + b + (c if device_in_host else 0) + c
    gemm_phase = a + b + on_device + (_sim_scratch_bytes(m, n, k, dtype) if sim_device else 0)
    # A (B x) and the row norms of A and B^T go through blocks of A, B and B^T; the weighted norms of C square
    # each block of C
    check = a + b + c + max(_two_blocks_bytes(k, n), _two_blocks_bytes(m, k), _two_blocks_bytes(n, k),
                            2 * _rows_block_bytes(m, n), _two_blocks_bytes(m, n))
    phases = [make, gemm_phase, copy_back, check]
    if reduce:
        message = m * n * dtype.mpi_dtype.itemsize
        send_copy = message if dtype.mpi_dtype != dtype.host else 0
        received = message if is_root else 0
        # MPICH's Reduce keeps a temporary of the message (half of it written at the root with two ranks, 1.5 of
        # it at the others, which get no receive buffer: measured); counted whole, and twice off the root
        mpi_temporary = (message if is_root else 2 * message) if world_size > 1 else 0
        phases.append(c + send_copy + received + mpi_temporary)
        if is_root:
            phases.append(c + send_copy + received + _two_blocks_bytes(m, n))  # the check of the sum
    return RUNTIME_SCRATCH_BYTES + max(phases)


def computes_in_place(info: DeviceInfo, dtype: DType, *arrays: np.ndarray | None) -> bool:
    """Whether the device computes on these host arrays as they are (the host backend, with arrays of the dtype's
    host type in C order): no upload, no copy back, nothing beside them in memory. With no arrays: whether it
    would for arrays made for the run (those are made so)."""
    if not capabilities(info.backend).computes_on_host_arrays:
        return False
    return all(a is not None and a.dtype == dtype.host and a.flags.c_contiguous for a in arrays)


def _sim_scratch_bytes(m: int, n: int, k: int, dtype: DType) -> int:
    """Host bytes a simulated GPU's half-precision GEMM takes besides its buffers: A, B and C in float32 (as a GPU
    accumulates), then C rounded to bf16 through two float32 temporaries or cast to fp16; and a bf16 upload's
    rounded copy. Measured at 3.2 (bf16) and 6.4 (fp16) matrices of the type for a square GEMM."""
    if dtype.name == "bf16":
        return max((m * k + k * n + m * n) * 4, 3 * m * n * 4)
    if dtype.name == "fp16":
        return (m * k + k * n + m * n) * 4 + m * n * 2
    return 0




def _host_memory_error(planned: int, m: int, n: int, k: int, dtype: DType, local_size: int) -> str | None:
    """The host holds A, B, C, the device's copies where its memory is the host's, the check's and the reduce's
    buffers: check their peak before making or loading any of them."""
    share = host_memory_share_bytes(local_size)
    if share is None or planned <= share:
        return None
    return (
        f"{m}x{k} @ {k}x{n} in {dtype.name} needs up to {_fmt_bytes(planned)} of host memory per rank at its peak "
        f"(A, B, C, their device copies and the checks' buffers); this rank may take {approx_bytes(share)} "
        f"(MemAvailable and the memory cgroup shared by {local_size} rank(s) on the node, and the process's "
        "RLIMIT_AS/RLIMIT_DATA); use a smaller size"
    )


def _plan(cfg: MatmulConfig, world: World, opened: OpenDevice, m: int, n: int, k: int,
          headers: tuple[gemm.MatrixFile, gemm.MatrixFile] | None = None) -> tuple[int, str | None]:
    """What a run of m x n x k holds in host memory at its peak, and the error where it does not fit the device or
    this rank's share of the host."""
    backend, info = opened.backend, opened.info
    planned = host_memory_plan_bytes(
        m, n, k, cfg.dtype, device_in_host=device_in_host_memory(info), sim_device=capabilities(info.backend).simulated,
        inputs=headers, is_root=world.rank == cfg.root, world_size=world.size, reduce=cfg.reduce == "sum",
        in_place=computes_in_place(info, cfg.dtype))
    error = next(iter(_memory_errors(backend, info, m, n, k, cfg.dtype)), None)
    if error is None:
        error = _host_memory_error(planned, m, n, k, cfg.dtype, world.local_size)
    return planned, error


def prepare_inputs(cfg: MatmulConfig, world: World, opened: OpenDevice) -> tuple[Prepared | None, list[str]]:
    """Load or make this rank's A_r and B_r, checking first that they fit the device and the host: for files, from
    their headers, before any data is read.

    Returns (prepared, errors) for World.agree."""
    reset_peak_rss()
    rss_at_start = rss_bytes()
    headers = None
    if cfg.a_path is not None and cfg.b_path is not None:
        a_path = expand_rank_path(cfg.a_path, world.rank, world.host)
        b_path = expand_rank_path(cfg.b_path, world.rank, world.host)
        try:
            headers = (gemm.read_matrix_header(a_path, "a"), gemm.read_matrix_header(b_path, "b"))
            gemm.check_shapes(headers[0], headers[1], a_path, b_path)
        except gemm.InputError as e:
            return None, [str(e)]
        (m, k), (_, n) = headers[0].shape, headers[1].shape
    else:
        m, n, k = cfg.m, cfg.n, cfg.k
    planned, error = _plan(cfg, world, opened, m, n, k, headers)
    if error is not None:
        return None, [error]
    if headers is not None:
        try:
            # a value the dtype cannot hold becomes inf, which read_matrix reports: not NumPy's warning too
            with np.errstate(over="ignore", invalid="ignore"):
                a = gemm.read_matrix(headers[0], cfg.dtype)
                b = gemm.read_matrix(headers[1], cfg.dtype)
            gemm.check_finite_products(a, b, cfg.dtype, headers[0].path, headers[1].path,
                                       addends=world.size if cfg.reduce == "sum" else 1)
        except gemm.InputError as e:
            return None, [str(e)]
    else:
        a, b = gemm.generate_inputs(cfg.seed, world.rank, m, n, k, cfg.dtype)
    return Prepared(opened.backend, opened.info, opened.spec, a, b, (m, n, k), planned, rss_at_start), []


@dataclass
class Sweep:
    """One rank, ready to run a size sweep (--sizes): its device is open and every size is known to fit; each
    size's inputs are made when its turn comes, after the last size's are freed."""

    opened: OpenDevice
    plans: list[tuple[tuple[int, int, int], int]]  # ((m, n, k), host memory planned), smallest size first

    @property
    def mnks(self) -> list[tuple[int, int, int]]:
        return [mnk for mnk, _ in self.plans]


def prepare_sweep(cfg: MatmulConfig, world: World, opened: OpenDevice) -> tuple[Sweep | None, list[str]]:
    """Check that every size of the sweep fits the device and the host before any input is made (the sizes run one
    at a time, so the largest decides). Returns (sweep, errors) for World.agree."""
    plans = []
    for size in cfg.sizes:
        planned, error = _plan(cfg, world, opened, size, size, size)
        if error is not None:
            return None, [error]
        plans.append(((size, size, size), planned))
    return Sweep(opened, plans), []


def run_sweep(cfg: MatmulConfig, world: World, sweep: Sweep,
              on_step: Callable[[int, int, str], None] | None = None) -> list[RankOutcome]:
    """Every size of the sweep in turn, each a whole matmul run (inputs made, uploaded, GEMMs, copy back, checks,
    reduce). Collective. `on_step` hears of every GEMM and reduce of every size, counted across the sweep."""
    per_size = (cfg.warmup + cfg.repeat) * (2 if cfg.reduce == "sum" else 1)
    total = per_size * len(sweep.plans)

    def size_step(offset: int, size: int) -> Callable[[int, int, str], None] | None:
        """This size's steps, counted on from the sizes before it."""
        if on_step is None:
            return None
        return lambda done, _total, label: on_step(offset + done, total, f"size {size}: {label}")

    outcomes = []
    for i, ((m, n, k), planned) in enumerate(sweep.plans):
        step = size_step(i * per_size, m)
        reset_peak_rss()
        rss_at_start = rss_bytes()
        a, b = gemm.generate_inputs(cfg.seed, world.rank, m, n, k, cfg.dtype)
        prepared = Prepared(sweep.opened.backend, sweep.opened.info, sweep.opened.spec, a, b, (m, n, k), planned,
                            rss_at_start)
        a = b = None
        outcomes.append(run_rank(cfg, world, prepared, step))
        prepared = None
        release_free_memory()
    return outcomes


def shape_errors(cfg: MatmulConfig, world: World, prepared: Prepared | None) -> list[str]:
    """Collective: a sum of products needs every rank's C_r to have one shape."""
    shapes = world.allgather(prepared.mnk[:2] if prepared else None)
    if cfg.reduce != "sum" or any(s is None for s in shapes) or len(set(shapes)) <= 1:
        return []
    listing = ", ".join(f"rank {r}: {s[0]}x{s[1]}" for r, s in enumerate(shapes))
    return [f"--reduce sum needs every rank's product to have one shape, got {listing}; or use --reduce none"]


def run_rank(cfg: MatmulConfig, world: World, prepared: Prepared,
             on_step: Callable[[int, int, str], None] | None = None) -> RankOutcome:
    """The timed run on this rank. Collective: every rank calls it. `on_step(done, total, label)`, where given
    (rank 0 shows a progress bar with it), hears of every GEMM and every reduce, warm-up ones included."""
    dtype = cfg.dtype
    n = prepared.mnk[1]
    runs = cfg.warmup + cfg.repeat
    total_steps = runs * (2 if cfg.reduce == "sum" else 1)

    def gemm_step(done: int) -> None:
        if on_step is not None:
            on_step(done, total_steps, f"GEMM {'warm-up' if done <= cfg.warmup else 'timed'} {done}/{runs}")

    world.barrier()

    assert prepared.a is not None and prepared.b is not None
    # a device that computes on the host's arrays takes A and B as they are, and its C is the host's: no copy
    in_place = computes_in_place(prepared.info, dtype, prepared.a, prepared.b)
    h2d, gemm_seconds, d2h, c_host = _timed_gemm(cfg, prepared, in_place, gemm_step)

    x = verify.random_vectors(n, cfg.seed)
    terms = verify.product_terms(prepared.a, prepared.b, c_host, x)
    prepared.release_inputs()  # A_r and B_r are not needed again: the reduce runs without them
    release_free_memory()
    verdict = verify.check(c_host, x, terms, dtype)
    release_free_memory()

    reduce_seconds: list[float] = []
    reduced: np.ndarray | None = None
    reduced_verdict: verify.Verdict | None = None
    if cfg.reduce == "sum":
        def reduce_step(done: int) -> None:
            if on_step is not None:
                on_step(runs + done, total_steps, f"reduce {done}/{runs}")

        reduce_seconds, reduced, reduced_verdict = _reduce_to_root(cfg, world, c_host, x, terms, reduce_step)
    row = _rank_row(cfg, world, prepared, in_place, gemm_seconds, h2d, d2h, reduce_seconds, verdict)
    return RankOutcome(row, reduced, reduced_verdict)


def _timed_gemm(cfg: MatmulConfig, prepared: Prepared, in_place: bool,
                on_run: Callable[[int], None]) -> tuple[Elapsed, list[float], Elapsed, np.ndarray]:
    """A_r and B_r uploaded (timed), the warm-up and timed GEMMs (device timer), C_r copied back to the host
    (timed); every device buffer freed before this returns. (h2d, the timed GEMMs' seconds, d2h, C_r on the host)."""
    backend, dtype = prepared.backend, cfg.dtype
    m, n, _ = prepared.mnk
    if in_place:
        h2d, a_dev, b_dev = Elapsed(0.0), prepared.a, prepared.b
    else:
        with backend.timer() as h2d:
            a_dev = backend.upload(prepared.a, dtype)
            b_dev = backend.upload(prepared.b, dtype)
    c_dev = backend.empty((m, n), dtype)
    gemm_seconds = time_repeats(backend, lambda: backend.matmul(a_dev, b_dev, c_dev, dtype), cfg.warmup, cfg.repeat,
                                on_run)
    a_dev = b_dev = None  # freed before C comes back: host-memory devices would otherwise hold six matrices
    if in_place:
        d2h, c_host = Elapsed(0.0), c_dev
    else:
        # C's host memory is allocated (pinned on CuPy) and its pages touched before the timer: d2h is the copy
        c_target = download_buffer(backend, (m, n), dtype)
        with backend.timer() as d2h:
            c_host = download(backend, c_dev, dtype, c_target)
        c_target = None
    c_dev = None  # the device's memory is free again before the reduce
    release_free_memory()
    return h2d, gemm_seconds, d2h, c_host


def _rank_row(cfg: MatmulConfig, world: World, prepared: Prepared, in_place: bool, gemm_seconds: list[float],
              h2d: Elapsed, d2h: Elapsed, reduce_seconds: list[float], verdict: verify.Verdict) -> dict[str, Any]:
    """This rank's row: its device, the GEMM's rate against its peak, the copies' rates, the reduce's figures
    (--reduce sum), the product's verdict, every timed run, and the memory planned beside the memory held."""
    dtype = cfg.dtype
    m, n, k = prepared.mnk
    flop_count = gemm.flops(m, n, k)
    gemm_stats = summarize(gemm_seconds, "gemm_seconds")
    gemm_tflops = flop_count / gemm_stats["gemm_seconds_median"] / 1e12
    peak = prepared.info.peak_tflops.get(dtype.name)
    h2d_bytes = 0 if in_place else (m * k + k * n) * dtype.itemsize
    d2h_bytes = 0 if in_place else m * n * dtype.itemsize
    row: dict[str, Any] = {
        "rank": world.rank,
        "host": world.host,
        "backend": prepared.spec,
        "vendor": prepared.info.vendor,
        "device": prepared.info.name,
        "device_timing": prepared.backend.timing,
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
    # what the pre-check counted beside what the rank really held (VmHWM, reset when the inputs were made)
    row["memory"] = {
        "host_memory_planned_bytes": prepared.host_memory_planned_bytes,
        "rss_at_start_bytes": prepared.rss_at_start_bytes,
        "peak_rss_bytes": peak_rss_bytes(),
    }
    return row


def _reduce_to_root(cfg: MatmulConfig, world: World, c_host: np.ndarray, x: np.ndarray, terms: verify.ProductTerms,
                    on_run: Callable[[int], None]) -> tuple[list[float], np.ndarray | None, verify.Verdict]:
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
        on_run(i + 1)

    # the check's terms are summed like the products: vectors of m x TRIALS, cheap next to C
    summed = []
    for part in (terms.expected, terms.gemm_scale, terms.out_scale):
        total = np.empty_like(part) if world.rank == root else None
        comm.Reduce(np.ascontiguousarray(part), total, op=MPI.SUM, root=root)
        summed.append(total)
    verdict = None
    if world.rank == root:
        sum_dtype = DTYPES["fp64"] if cfg.dtype.mpi_dtype == np.float64 else DTYPES["fp32"]
        verdict = verify.check(recv, x, verify.ProductTerms(*summed), cfg.dtype, sum_dtype=sum_dtype,
                               addends=world.size)
    verdict = comm.bcast(verdict, root=root)
    return seconds, recv, verdict


def summarize_job(cfg: MatmulConfig, rows: list[dict[str, Any]],
                  reduced_verdict: verify.Verdict | None) -> dict[str, Any]:
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


HOST_FP16_FLOPS = 1e9  # about what NumPy's fp16 GEMM (no BLAS) does on one core


def slow_host_fp16_notices(cfg: MatmulConfig, world: World, info: DeviceInfo,
                           mnks: list[tuple[int, int, int]]) -> list[str]:
    """Collective. Before the run, the notice rank 0 shows (once, on stderr) when any rank computes fp16 on the
    host, where NumPy has no BLAS: a few hundred times slower than fp32, so a run that takes seconds in fp32 takes
    minutes. `mnks`: the sizes this rank multiplies. [] where there is none, and on every other rank."""
    slow = capabilities(info.backend).computes_on_host_arrays and cfg.dtype.name == "fp16"
    flop_count = sum(2 * m * n * k for m, n, k in mnks) * (cfg.warmup + cfg.repeat)
    gathered = world.gather((slow, flop_count))
    if gathered is None or not any(s for s, _ in gathered):
        return []
    ranks = [r for r, (s, _) in enumerate(gathered) if s]
    seconds = max(f for s, f in gathered if s) / HOST_FP16_FLOPS
    estimate = ("under 1 s" if seconds < 1 else f"~{seconds:.0f} s" if seconds < 120 else f"~{seconds / 60:.0f} min")
    who = f"rank {ranks[0]} computes" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))} compute"
    runs = (cfg.warmup + cfg.repeat) * len(mnks)
    return [f"{who} fp16 on the host, where NumPy has no BLAS: hundreds of times slower than fp32 (~1 GFLOP/s); "
            f"{runs} GEMMs may take {estimate} (fp32 is fast)"]
