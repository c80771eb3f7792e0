"""The collectives sweep: for each op, path and size, warm-up and timed iterations (a barrier before each),
the copies of the host-staged path timed on their own, an exactness check, and the rows of the result.

Figures follow nccl-tests: a collective is as slow as its slowest rank, so each iteration counts the maximum over
ranks of that iteration's time; algbw = S / t (GB/s, 1e9 bytes) with t the median of those maxima; busbw = algbw
times the op's factor (see benchmarks/collectives.py).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import numpy as np

from hetbench.backends.base import MPI_MEMORY_HOST, MPI_MEMORY_NONE, TIMING_MODELLED, Backend, DeviceInfo
from hetbench.benchmarks import collectives as spec
from hetbench.comm.gpu import HOW_TO_GET_GPU_AWARE_MPI, gpu_support
from hetbench.comm.world import World
from hetbench.config import CollectivesConfig
from hetbench.dtypes import DType
from hetbench.harness.devices import OpenDevice, open_rank_device
from hetbench.harness.metadata import rank_metadata

STRAGGLER_RATIO = 1.2  # a rank whose median time is 20% above the median rank's is flagged


def _device_path_error(backend: Backend, info: DeviceInfo, dtype: DType, world: World) -> str | None:
    # no device index in the message: ranks with the same kind of device then report one line
    label = f"{info.backend} device {info.name}"
    kind = backend.mpi_memory_kind()
    if kind == MPI_MEMORY_NONE:
        return f"--path device: {label} has no buffer MPI can take directly (OpenCL buffers have none); use --path host"
    if kind == MPI_MEMORY_HOST:
        return None  # host memory is what every MPI takes
    support = gpu_support()
    if kind not in support:
        return f"--path device: no GPU-aware MPI path exists for {info.vendor} device {label}; use --path host"
    answer = support[kind]
    if answer:
        return None
    said = "reports no" if answer is False else "has no query for"
    return (f"--path device hands {label}'s buffers to MPI directly, but this MPI library ({world.mpi_library()}) "
            f"{said} {kind.upper()} support; {HOW_TO_GET_GPU_AWARE_MPI}")


def prepare(cfg: CollectivesConfig, world: World) -> tuple[OpenDevice | None, list[str]]:
    """Open this rank's device and check it can take every buffer and path the sweep needs."""
    opened, errors = open_rank_device(cfg.backends[world.rank], cfg.dtype, world)
    if opened is None:
        return None, errors
    backend, info = opened.backend, opened.info
    largest = max(sum(spec.OPS[op].counts(cfg.sizes()[-1], cfg.dtype.itemsize, world.size)) for op in cfg.ops)
    need = largest * cfg.dtype.itemsize
    free = backend.free_memory_bytes()
    if free is not None and need > free:
        errors.append(f"the largest size needs {need} bytes of buffers on {info.backend}:{info.index} "
                      f"({info.name}), which has {free} free; lower --max-bytes")
    if "device" in cfg.paths and not errors:
        error = _device_path_error(backend, info, cfg.dtype, world)
        if error:
            errors.append(error)
    return opened, errors


def _run_point(cfg: CollectivesConfig, world: World, prepared: OpenDevice, op: spec.Collective, size: int,
               path: str) -> dict[str, Any]:
    """One op, size and path on this rank: per-iteration seconds and the wrong-element count."""
    backend, dtype, root = prepared.backend, cfg.dtype, cfg.root
    MPI, comm, rank, n = world.MPI, world.comm, world.rank, world.size
    send_host = spec.send_data(op, rank, n, root, size, dtype.host)
    _, recv_count = op.counts(size, dtype.itemsize, n)
    poison = np.full(recv_count, np.nan, dtype=dtype.host)
    send_dev = backend.upload(send_host, dtype)
    recv_dev = backend.upload(poison, dtype)
    recv_host = poison.copy()
    sends, receives = op.sends(rank, root), op.receives(rank, root)

    def iteration() -> tuple[float, float, float]:
        nonlocal recv_dev
        if path == "host":
            world.barrier()
            with backend.timer() as d2h:
                staged = backend.download(send_dev, dtype) if sends else send_host
            start = time.perf_counter()
            spec.call(op, comm, MPI, staged, recv_host, root)
            op_seconds = time.perf_counter() - start
            with backend.timer() as h2d:
                if receives:
                    recv_dev = backend.upload(recv_host, dtype)
            return d2h.seconds if sends else 0.0, op_seconds, h2d.seconds if receives else 0.0
        backend.synchronize()  # the device must be done writing before MPI reads
        send_buf, recv_buf = backend.mpi_buffer(send_dev), backend.mpi_buffer(recv_dev)
        world.barrier()
        start = time.perf_counter()
        spec.call(op, comm, MPI, send_buf, recv_buf, root)
        return 0.0, time.perf_counter() - start, 0.0

    for _ in range(cfg.warmup):
        iteration()
    times = [iteration() for _ in range(cfg.iters)]

    wrong = None
    if cfg.check:
        # poison the result first, so a result left over from an earlier iteration cannot pass
        recv_dev = backend.upload(poison, dtype)
        recv_host[...] = np.nan
        iteration()
        want = spec.expected(op, rank, n, root, size, dtype.host)
        wrong = 0 if want is None else int(np.count_nonzero(backend.download(recv_dev, dtype) != want))
    return {
        "d2h_seconds": [t[0] for t in times],
        "op_seconds": [t[1] for t in times],
        "h2d_seconds": [t[2] for t in times],
        "wrong": wrong,
    }


def _row(cfg: CollectivesConfig, op: spec.Collective, size: int, path: str, per_rank: list[dict[str, Any]],
         modelled_copies: bool) -> dict[str, Any]:
    """The figures of one op, size and path from every rank's iterations (on rank 0)."""
    n = len(per_rank)
    op_us = np.array([r["op_seconds"] for r in per_rank]) * 1e6  # ranks x iterations
    d2h_us = np.array([r["d2h_seconds"] for r in per_rank]) * 1e6
    h2d_us = np.array([r["h2d_seconds"] for r in per_rank]) * 1e6
    slowest = op_us.max(axis=0)  # per iteration, the slowest rank
    end_to_end = (d2h_us + op_us + h2d_us).max(axis=0)
    t_us = float(np.median(slowest))
    algbw = size / (t_us * 1e-6) / 1e9
    factor = op.busbw_factor(n)
    rank_medians = [float(np.median(r)) for r in op_us]
    typical = statistics.median_low(rank_medians)  # the median rank's own time
    stragglers = [r for r, m in enumerate(rank_medians) if n > 1 and m > STRAGGLER_RATIO * typical]
    e2e_us = float(np.median(end_to_end))
    wrong = None if per_rank[0]["wrong"] is None else sum(r["wrong"] for r in per_rank)
    return {
        "op": op.name,
        "path": path,
        "size_bytes": size,
        "count_elements": size // cfg.dtype.itemsize,
        "dtype": cfg.dtype.name,
        "redop": op.redop,
        "root": cfg.root if op.rooted else None,
        "ranks": n,
        "op_us_median": t_us,
        "op_us_min": float(slowest.min()),
        "op_us_max": float(slowest.max()),
        "algbw_gbps": algbw,
        "busbw_factor": factor,
        "busbw_gbps": algbw * factor,
        "wrong": wrong,
        "d2h_us_median": float(np.median(d2h_us.max(axis=0))),
        "h2d_us_median": float(np.median(h2d_us.max(axis=0))),
        "end_to_end_us_median": e2e_us,
        "end_to_end_algbw_gbps": size / (e2e_us * 1e-6) / 1e9,
        "copy_timing": ("modelled" if modelled_copies else "measured") if path == "host" else "none",
        "stragglers": stragglers,  # rank numbers; the CSV writes them as text, see results/schema.py
        "rank_op_us_median": rank_medians,
        "raw": {
            "op_us": op_us.tolist(),
            "d2h_us": d2h_us.tolist(),
            "h2d_us": h2d_us.tolist(),
            "wrong_per_rank": [r["wrong"] for r in per_rank],
        },
    }


def run_sweep(cfg: CollectivesConfig, world: World, prepared: OpenDevice,
              on_step: Callable[[int, int, str], None] | None = None) -> list[dict[str, Any]] | None:
    """Every op x path x size. Collective. Returns the rows on rank 0, None elsewhere."""
    modelled = any(world.allgather(prepared.backend.timing == TIMING_MODELLED))
    points = [(op, path, size) for op in cfg.ops for path in cfg.paths for size in cfg.sizes()]
    rows = []
    for step, (name, path, size) in enumerate(points):
        op = spec.OPS[name]
        mine = _run_point(cfg, world, prepared, op, size, path)
        gathered = world.gather(mine)
        if world.is_root:
            rows.append(_row(cfg, op, size, path, gathered, modelled))
            if on_step is not None:
                on_step(step + 1, len(points), f"{name} {path} {size} B")
    return rows if world.is_root else None


def rank_descriptions(world: World, prepared: OpenDevice) -> list[dict[str, Any]] | None:
    """Every rank's device and process, for the metadata (rank 0 gets the list)."""
    mine = {"rank": world.rank, "host": world.host, "backend": prepared.spec,
            "device_timing": prepared.backend.timing, "device_info": prepared.info.to_dict(),
            "process": rank_metadata()}
    return world.gather(mine)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """nccl-tests' closing lines: wrong elements in all, and the average bus bandwidth per op and path."""
    avg: dict[str, float] = {}
    for key in dict.fromkeys(f"{r['op']}/{r['path']}" for r in rows):
        values = [r["busbw_gbps"] for r in rows if f"{r['op']}/{r['path']}" == key]
        avg[key] = statistics.fmean(values)
    checked = [r["wrong"] for r in rows if r["wrong"] is not None]
    total_wrong = sum(checked) if checked else None
    return {
        "points": len(rows),
        "wrong_total": total_wrong,
        "checked": bool(checked),
        "avg_busbw_gbps": avg,
        "verified": total_wrong == 0 if checked else None,
    }
