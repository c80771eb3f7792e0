"""The collectives sweep: for each op, path and size, warm-up and timed iterations (a barrier before each),
the copies of the host-staged path timed on their own, an exactness check, and the rows of the result.

Figures follow nccl-tests: a collective is as slow as its slowest rank, so each iteration counts the maximum over
ranks of that iteration's time; algbw = S / t (GB/s, 1e9 bytes) with t the median of those maxima; busbw = algbw
times the op's factor (ops.py).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from hetbench.backends.base import TIMING_MODELLED, capabilities
from hetbench.backends.host import (
    RUNTIME_SCRATCH_BYTES,
    host_memory_share_bytes,
    peak_rss_bytes,
    release_free_memory,
    reset_peak_rss,
    rss_bytes,
)
from hetbench.benchmarks.collectives import ops
from hetbench.comm import staging
from hetbench.comm.world import World
from hetbench.benchmarks.collectives.config import CollectivesConfig
from hetbench.harness.devices import OpenDevice, device_path_error
from hetbench.harness.memory import approx_bytes, device_in_host_memory

STRAGGLER_RATIO = 1.2  # a rank whose median time is 20% above the median rank's is flagged
_COMPARE_CHUNK = 1 << 20  # elements compared at a time in the check (a bool per element)
# glibc serves buffers of up to 32 MiB (its largest mmap threshold) from its heap once a freed one raised the
# threshold, and keeps freed ones there: with a new device buffer and a new host copy every iteration, up to three
# more buffers stay resident; above that size every buffer goes back when freed
_HEAP_KEPT_BUFFERS = 3
_HEAP_KEPT_MAX_BYTES = 32 * 1024**2


# the largest chunk the host path's staging takes unless --stage-chunk-bytes says otherwise: the calibration's
# largest candidate below the part (staging.CHUNK_CANDIDATES_BYTES), so that its ring stays a few MiB at any size
MAX_AUTO_STAGE_CHUNK_BYTES = 4 * 1024**2


@dataclass
class PreparedDevice(OpenDevice):
    """A rank's open device, with what the memory check counted for the sweep's largest point, and the staging
    plans measured on it so far ((op, size, dtype, method asked) -> StagePlan: measured once per device)."""

    host_memory_planned_bytes: int = 0
    rss_at_start_bytes: int | None = None
    stage_plans: dict = field(default_factory=dict)


def stage_layout(op: ops.Op, size: int, itemsize: int, rank: int, nranks: int, root: int) -> staging.Layout:
    """How the pipelined staging cuts this rank's buffers for `op` at size S: a segment is one rank's part (S, or S /
    ranks where S is the total), the send and receive buffers one segment or one per rank."""
    elements = size // itemsize
    part = elements // nranks if op.size_is_total else elements
    send_count, recv_count = op.counts(size, itemsize, nranks)
    return staging.Layout(part=part, send_segments=max(1, send_count // part) if part else 1,
                          recv_segments=max(1, recv_count // part) if part else 1,
                          sends=op.sends(rank, root), receives=op.receives(rank, root))


def stage_chunk_elements(layout: staging.Layout, itemsize: int, chunk_bytes: int | None) -> int:
    """Elements of a part per chunk: the given chunk, else the largest the calibration may choose; never more than
    the part."""
    chunk = MAX_AUTO_STAGE_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    return max(1, min(layout.part, chunk // itemsize))


def stage_ring_bytes(layout: staging.Layout, itemsize: int, chunk_bytes: int | None, in_place: bool = False) -> int:
    """The most host memory the staging ring holds on this rank: RING_DEPTH slots (no more than there are chunks) of
    one chunk of every segment, for each side that carries data and is copied (a host rank's one-segment sides are
    used in place; a map holds no host memory of its own on a device whose memory is the host's, but is counted as
    a copy: the check plans before the method is measured)."""
    chunk = stage_chunk_elements(layout, itemsize, chunk_bytes)
    slots = min(staging.RING_DEPTH, len(staging.chunk_bounds(layout.part, chunk)))
    segments = sum(segs for segs, on in ((layout.send_segments, layout.sends), (layout.recv_segments, layout.receives))
                   if on and not (in_place and segs <= 1))
    return slots * segments * chunk * itemsize


def point_host_bytes(op: ops.Op, size: int, itemsize: int, rank: int, nranks: int, root: int, path: str,
                     device_in_host: bool, in_place: bool = False, stage_chunk_bytes: int | None = None) -> int:
    """The most host memory one point (op, size, path) holds on this rank at once, as _run_point runs it: the send
    and receive buffers on the host, the device's copies where its memory is the host's, the host path's staging
    ring (a few chunks: stage_ring_bytes; `stage_chunk_bytes` as --stage-chunk-bytes gives it, None: measured, at
    most MAX_AUTO_STAGE_CHUNK_BYTES) and MPI's own temporaries (of a chunk, on the host path), and in the check the
    expected result (built in the receive buffer), the result copied back and the comparison's chunk; and below 32
    MiB, the freed buffers the C heap keeps. `in_place`: a device that computes on the host's arrays (the host
    backend) takes the send and receive buffers as they are, on either path: no copies; its check builds the
    expected result beside the result; a ring only for ops whose chunks gather one segment per rank, in a job
    where another rank stages."""
    send_count, recv_count = op.counts(size, itemsize, nranks)
    s_b, r_b = send_count * itemsize, recv_count * itemsize
    mpi = op.mpi_scratch_bytes(size, rank, nranks, root)
    layout = stage_layout(op, size, itemsize, rank, nranks, root)
    if in_place:
        ring = stage_ring_bytes(layout, itemsize, stage_chunk_bytes, in_place=True) if path == "host" else 0
        return max(s_b + r_b + mpi + ring, 2 * r_b + min(recv_count, _COMPARE_CHUNK))
    if path == "host":
        device = s_b + r_b if device_in_host else 0
        chunk = stage_chunk_elements(layout, itemsize, stage_chunk_bytes)
        # MPI works on one chunk at a time: its temporaries are a chunk's share of the whole op's
        mpi_chunk = -(-mpi * chunk // layout.part) if layout.part else mpi
        # the send buffer's host copy goes once it is on the device; the ring comes after
        running = max(s_b + r_b + device, r_b + device + stage_ring_bytes(layout, itemsize, stage_chunk_bytes)
                      + mpi_chunk)
    else:
        running = s_b + r_b + (s_b + r_b if device_in_host else 0) + mpi
    check = 2 * r_b + (r_b if device_in_host else 0) + min(recv_count, _COMPARE_CHUNK)
    largest = max(s_b, r_b)
    kept = _HEAP_KEPT_BUFFERS * largest if largest <= _HEAP_KEPT_MAX_BYTES else 0
    return max(running, check) + kept


def sweep_host_bytes(cfg: CollectivesConfig, rank: int, nranks: int, device_in_host: bool,
                     in_place: bool = False) -> tuple[int, str]:
    """What this rank's host memory holds at the sweep's peak (its largest size: every point's buffers are freed
    before the next), and the op and path that reach it."""
    size = cfg.sizes()[-1]
    best, where = 0, ""
    for op in cfg.ops:
        for path in cfg.paths:
            need = point_host_bytes(ops.OPS[op], size, cfg.dtype.itemsize, rank, nranks, cfg.root, path,
                                    device_in_host, in_place, cfg.stage_chunk_bytes)
            if need > best:
                best, where = need, f"{op} on the {path} path"
    return RUNTIME_SCRATCH_BYTES + best, where


def prepare(cfg: CollectivesConfig, world: World, opened: OpenDevice) -> tuple[PreparedDevice | None, list[str]]:
    """Check that this rank's open device can take every buffer and path the sweep needs: its device memory, and
    this rank's share of the host's memory for every buffer the largest point holds at once."""
    errors: list[str] = []
    reset_peak_rss()
    backend, info = opened.backend, opened.info
    in_host = device_in_host_memory(info)
    planned, where = sweep_host_bytes(cfg, world.rank, world.size, in_host, _in_place(info))
    prepared = PreparedDevice(opened.backend, opened.info, opened.spec, planned, rss_bytes())
    largest = max(sum(ops.OPS[op].counts(cfg.sizes()[-1], cfg.dtype.itemsize, world.size)) for op in cfg.ops)
    need = largest * cfg.dtype.itemsize
    # the host backend's free memory is the host's: the host check below counts it with everything else
    free = backend.free_memory_bytes() if not capabilities(info.backend).memory_is_the_hosts else None
    if free is not None and need > free:
        errors.append(f"the largest size needs {need} bytes of buffers on {info.backend}:{info.index} "
                      f"({info.name}), which has {free} free; lower --max-bytes")
    share = host_memory_share_bytes(world.local_size)
    if share is not None and planned > share:
        errors.append(
            f"the largest size, {cfg.sizes()[-1]} bytes, needs up to {planned} bytes ({planned / 1024**2:.1f} MiB) "
            f"of host memory per rank at its peak ({where}: send and receive buffers, their device copies, the "
            f"staged copy, MPI's temporaries and the check's); this rank may take {approx_bytes(share)} "
            f"(MemAvailable and the memory cgroup shared by {world.local_size} rank(s) on the node, and the "
            "process's RLIMIT_AS/RLIMIT_DATA); lower --max-bytes"
        )
    if "device" in cfg.paths and not errors:
        error = device_path_error(backend, info, cfg.dtype, world)
        if error:
            errors.append(error)
    return prepared, errors


def _in_place(info: Any) -> bool:
    """Whether the device computes on the host's arrays as they are (the host backend): its buffers are the host
    buffers, so neither path copies anything."""
    return capabilities(info.backend).computes_on_host_arrays


def _count_wrong(got: np.ndarray, want: np.ndarray) -> int:
    """Elements that differ (NaN left from the poison counts as wrong), a chunk at a time: no full-size mask."""
    return sum(int(np.count_nonzero(got[i : i + _COMPARE_CHUNK] != want[i : i + _COMPARE_CHUNK]))
               for i in range(0, len(want), _COMPARE_CHUNK))


def _stage_plan(cfg: CollectivesConfig, world: World, prepared: OpenDevice, op: ops.Op, size: int,
                trial: Callable[[int, str], Callable[[], staging.StageTimes]]) -> staging.StagePlan:
    """The chunking of one staged point, the same on every rank: --stage-chunk-bytes where given, else measured
    (staging.calibrate: every candidate chunk size and method timed on every rank, the slowest rank's median
    compared) once per device, op, size and dtype. Collective where it measures."""
    layout = stage_layout(op, size, cfg.dtype.itemsize, world.rank, world.size, cfg.root)
    asked = cfg.stage_method
    if cfg.stage_chunk_bytes is not None and asked != "auto":
        return staging.StagePlan(cfg.stage_chunk_bytes, asked, "given")
    key = (op.name, size, cfg.dtype.name, asked, cfg.stage_chunk_bytes)
    plans = getattr(prepared, "stage_plans", None)
    if plans is not None and key in plans:
        return plans[key]
    if asked == "auto":
        # map is tried where some rank's device maps its buffers without a copy; the others copy in that trial
        methods = [staging.METHOD_COPY] + ([staging.METHOD_MAP] if any(world.allgather(
            staging.can_map_to_host(prepared.backend))) else [])
    else:
        methods = [asked]
    part_bytes = layout.part * cfg.dtype.itemsize
    if cfg.stage_chunk_bytes is not None:
        options = [(cfg.stage_chunk_bytes, m) for m in methods]
    else:
        options = staging.candidates(part_bytes, cfg.dtype.itemsize, methods, MAX_AUTO_STAGE_CHUNK_BYTES)

    def slowest(mine: list[float]) -> list[float]:
        return [max(column) for column in zip(*world.allgather(mine))]

    if len(options) == 1:
        chunk, method = options[0]
        plan = staging.StagePlan(chunk, method, "given" if cfg.stage_chunk_bytes is not None else "one chunk")
    else:
        plan = staging.calibrate(trial, options, slowest, world.barrier)
    if plans is not None:
        plans[key] = plan
    return plan


def _run_point(cfg: CollectivesConfig, world: World, prepared: OpenDevice, op: ops.Op, size: int,
               path: str, staged_job: bool | None = None) -> dict[str, Any]:
    """One op, size and path on this rank: per-iteration seconds and the wrong-element count. Holds no more than
    point_host_bytes counts. `staged_job`: whether any rank of the job stages its buffers on the host path (agreed
    by run_sweep; then every rank runs the op chunk by chunk, a host rank on its own arrays); None: this rank's own
    need (a device whose arrays are not the host's)."""
    backend, dtype, root = prepared.backend, cfg.dtype, cfg.root
    MPI, comm, rank, n = world.MPI, world.comm, world.rank, world.size
    send_host = ops.send_data(op, rank, n, root, size, dtype.host)
    _, recv_count = op.counts(size, dtype.itemsize, n)
    recv_host = np.full(recv_count, np.nan, dtype=dtype.host)  # poisoned, on the device too (in the check)
    in_place = _in_place(prepared.info)
    send_dev = send_host if in_place else backend.upload(send_host, dtype)
    recv_dev = recv_host if in_place else backend.upload(recv_host, dtype)
    if not in_place:
        send_host = None  # on the device now: its host copy is not needed again
    staged_job = (not in_place) if staged_job is None else staged_job
    plan = staged = None
    if path == "host" and staged_job:
        plan, staged = _staged(cfg, world, prepared, op, size, send_dev, recv_dev, in_place)

    def iteration() -> tuple[float, float, float]:
        if staged is not None:
            world.barrier()
            times = staged.run(send_dev, recv_dev)
            return times.d2h_seconds, times.op_seconds, times.h2d_seconds
        backend.synchronize()  # the device must be done writing before MPI reads
        send_buf, recv_buf = backend.mpi_buffer(send_dev), backend.mpi_buffer(recv_dev)
        world.barrier()
        start = time.perf_counter()
        op.call(comm, MPI, send_buf, recv_buf, root)
        return 0.0, time.perf_counter() - start, 0.0

    for _ in range(cfg.warmup):
        iteration()
    times = [iteration() for _ in range(cfg.iters)]

    wrong = None
    if cfg.check:
        # poison the result first, so a result left over from an earlier iteration cannot pass
        recv_host[...] = np.nan
        if not in_place:
            recv_dev = None  # freed first: outside the timed iterations
            recv_dev = backend.upload(recv_host, dtype)
        iteration()
        if staged is not None:
            staged.close()
        send_host = send_dev = None  # not needed again: freed before the expected result is built
        release_free_memory()
        wrong = _wrong_elements(op, rank, n, root, size, prepared, dtype, recv_host, recv_dev, in_place)
    elif staged is not None:
        staged.close()
    return {
        "in_place": in_place,
        "d2h_seconds": [t[0] for t in times],
        "op_seconds": [t[1] for t in times],
        "h2d_seconds": [t[2] for t in times],
        "wrong": wrong,
        "stage": None if staged is None else {**plan.to_dict(), "chunks": len(staged.bounds),
                                              "rank_method": staged.methods},
    }


def _staged(cfg: CollectivesConfig, world: World, prepared: OpenDevice, op: ops.Op, size: int, send_dev: Any,
            recv_dev: Any, in_place: bool) -> tuple[staging.StagePlan, staging.StagedCollective]:
    """The host path's pipelined staging of one point: its chunking (given, or measured by _stage_plan, each trial
    a staged op of its own whose ring the next one's replaces) and the staged op that runs it."""
    backend, dtype, root = prepared.backend, cfg.dtype, cfg.root
    MPI, comm = world.MPI, world.comm
    layout = stage_layout(op, size, dtype.itemsize, world.rank, world.size, root)
    modelled = backend.timing == TIMING_MODELLED
    held: list[staging.StagedCollective] = []

    def make(chunk_bytes: int, method: str) -> staging.StagedCollective:
        """A staged op with this chunk and method; the one made before gives its ring back first."""
        while held:
            held.pop().close()
        held.append(staging.StagedCollective(
            backend, dtype, layout, max(1, chunk_bytes // dtype.itemsize),
            lambda s, r: op.start(comm, MPI, s, r, root), method, host_arrays=in_place, modelled=modelled))
        return held[-1]

    def trial(chunk_bytes: int, method: str) -> Callable[[], staging.StageTimes]:
        collective = make(chunk_bytes, method)
        return lambda: collective.run(send_dev, recv_dev)

    plan = _stage_plan(cfg, world, prepared, op, size, trial)
    return plan, make(plan.chunk_bytes, plan.method)


def _wrong_elements(op: ops.Op, rank: int, n: int, root: int, size: int, prepared: OpenDevice, dtype: Any,
                    recv_host: np.ndarray, recv_dev: Any, in_place: bool) -> int:
    """The check's count of wrong elements in this rank's result, against the op's expected one: built beside the
    result where the device computes on the host's arrays (the result is in recv_host), else into recv_host, the
    device's result copied back beside it."""
    if in_place:
        want = ops.expected(op, rank, n, root, size, dtype.host)
        return 0 if want is None else _count_wrong(recv_host, want)
    want = ops.expected(op, rank, n, root, size, dtype.host, out=recv_host)
    return 0 if want is None else _count_wrong(prepared.backend.download(recv_dev, dtype), want)


def _row(cfg: CollectivesConfig, op: ops.Op, size: int, path: str, per_rank: list[dict[str, Any]],
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
    # one rank alone is never above 1.2x its own time: no guard for n == 1 is needed (times are >= 0)
    stragglers = [r for r, m in enumerate(rank_medians) if m > STRAGGLER_RATIO * typical]
    e2e_us = float(np.median(end_to_end))
    stage = per_rank[0].get("stage")
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
        # the host path on devices that compute on host arrays (the host backend) copies nothing
        "copy_timing": ("modelled" if modelled_copies else "measured")
        if path == "host" and not all(r.get("in_place") for r in per_rank) else "none",
        "stragglers": stragglers,  # rank numbers; the CSV writes them as text, see results/schema.py
        # the host path's pipelined staging (hetbench/comm/staging.py), where the job staged: the agreed chunk (bytes
        # of a rank's part), the chunks per call, the method asked for and how the chunk was chosen; each rank's own
        # method and the calibration's trials in "staging"
        "stage_chunk_bytes": stage["chunk_bytes"] if stage else None,
        "stage_chunks": stage["chunks"] if stage else None,
        "stage_method": stage["method"] if stage else None,
        "stage_chosen_by": stage["chosen_by"] if stage else None,
        "staging": None if not stage else {"rank_method": [(r.get("stage") or {}).get("rank_method")
                                                           for r in per_rank],
                                           "trials": stage["trials"]},
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
    # one rank whose buffers are not host arrays stages the host path chunk by chunk: every rank cuts the same chunks
    staged_job = any(world.allgather(not _in_place(prepared.info)))
    points = [(op, path, size) for op in cfg.ops for path in cfg.paths for size in cfg.sizes()]
    rows = []
    for step, (name, path, size) in enumerate(points):
        op = ops.OPS[name]
        mine = _run_point(cfg, world, prepared, op, size, path, staged_job)
        release_free_memory()  # the point's buffers go back before the next, larger one
        gathered = world.gather(mine)
        if world.is_root:
            rows.append(_row(cfg, op, size, path, gathered, modelled))
            if on_step is not None:
                on_step(step + 1, len(points), f"{name} {path} {size} B")
    return rows if world.is_root else None


def memory_description(prepared: PreparedDevice) -> dict[str, Any]:
    """What the pre-check counted beside what the rank really held (VmHWM, reset when the device was open): this
    rank's "memory" entry in the metadata."""
    return {"memory": {"host_memory_planned_bytes": prepared.host_memory_planned_bytes,
                       "rss_at_start_bytes": prepared.rss_at_start_bytes, "peak_rss_bytes": peak_rss_bytes()}}


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
