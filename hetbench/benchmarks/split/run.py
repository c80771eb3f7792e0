"""The split run: ONE GEMM, C = A @ B with A and B at the root, sliced across the ranks' devices, computed at once
and gathered at the root.

Strategies (hetbench/harness/split_plan.py has the cost model):
- rows: rank r gets parts[r] whole rows of A and all of B, computes its rows of C; the root gathers them.
- k: rank r gets parts[r] columns of A and the matching rows of B, computes a full-size partial product; the partial
  products are summed to the root (MPI Reduce).

An iteration is streamed (`--overlap`, the default: stream.py, B and C in column chunks moving while the ranks
compute) or phased (`--no-overlap`, the Splitter below): three phases, each ended by a barrier so that its time is
the job's: distribute (the root sends each working rank its slice over MPI, in turn), compute (each rank uploads its
slice, multiplies and copies its result back; device-timed, so modelled on simulated devices), collect (the root
receives the rows, or the sum). Per rank: compute seconds, communication seconds (its distribute and collect phases;
streamed, the time it waited on transfers) and idle seconds (how long it waited in the compute phase for the slowest
rank).

Before the timed splits every rank measures its link to the root and its own solo GEMM rate (the probes of
hetbench/harness/probe.py); auto weights are those rates. `--rebalance N` re-weights from each rank's measured
compute time until the imbalance is under 5 %. The even split is measured beside the chosen one, in the same run.
The root verifies the gathered C of the chosen split with Freivalds' check.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from hetbench.backends import host as host_backend
from hetbench.backends import sim
from hetbench.backends.base import (MPI_MEMORY_HOST, TIMING_MODELLED, Backend, DeviceInfo, can_map_to_host,
                                    capabilities)
from hetbench.benchmarks.split import stream
from hetbench.benchmarks.split.config import DEFAULT_LINK_GBIT, DEFAULT_LINK_LATENCY_US
from hetbench.benchmarks.split.phases import Phases, offsets
from hetbench.comm.world import World
from hetbench.dtypes import DTYPES, DType
from hetbench.harness import gemm, probe, verify
from hetbench.harness import split_plan as plan
from hetbench.harness.devices import OpenDevice
from hetbench.harness.memory import approx_bytes
from hetbench.harness.probe import COPY_PROBE_BYTES, slice_shape
from hetbench.harness.stats import summarize
from hetbench.results import profile as profiles

ROOT = 0
_TAG_A, _TAG_B, _TAG_C = 11, 12, 13


@dataclass
class SplitState:
    """One rank, ready: its device open; at the root, A and B."""

    backend: Backend
    info: DeviceInfo
    spec: str
    a: np.ndarray | None  # root only
    b: np.ndarray | None
    mnk: tuple[int, int, int] | None  # known at the root before check(); on every rank after it
    free_bytes: int | None
    # set by check(), the same on every rank
    caps: dict[str, list[int]] = field(default_factory=dict)
    devices: list[tuple[str, str]] = field(default_factory=list)
    profile: Any = None


def job_end_to_end(phases: list[Phases], modelled: list[bool], root: int = 0) -> float | None:
    """A streamed iteration's time for the job: the slowest rank's own end to end (Phases.end_to_end). Where a rank
    is simulated, the latest rank's ready time instead (when it had handed its last result to MPI, its device
    times modelled): a rank's final wait for the others ran in real time behind the simulated ranks' emulation on
    the host (a simulated device's GEMM is emulated far slower than its model, and its peer's last send waits for
    that), so with a simulated rank only what each rank did itself is counted; the last chunk's delivery is left out.
    None for a phased iteration."""
    if phases[root].end_to_end(modelled[root]) is None:
        return None
    if any(modelled):
        return max(p.ready(m) for p, m in zip(phases, modelled))
    return max(p.end_to_end(m) for p, m in zip(phases, modelled))


def _bytes(array: np.ndarray) -> np.ndarray:
    """The array's bytes as a flat uint8 view: MPI moves any dtype (fp16 and bf16 included) as bytes."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


class Splitter:
    """Runs iterations of one split (strategy, parts) on this rank. Collective: every rank makes one and calls
    `iteration` the same number of times. The root packs A's column blocks for the k strategy once, outside the
    timed phases (a real k-split would keep A in that layout)."""

    def __init__(self, world: World, state: SplitState, dtype: DType, strategy: str, parts: list[int]) -> None:
        self.world, self.state, self.dtype, self.strategy, self.parts = world, state, dtype, strategy, parts
        assert state.mnk is not None
        m, n, k = state.mnk
        self.mnk = (m, n, k)
        me = world.rank
        self.part = parts[me]
        sm, sn, sk = slice_shape(strategy, m, n, k, self.part)
        host = dtype.host
        self.a_r = np.empty((sm, sk), dtype=host)
        self.b_r = np.empty((sk, sn), dtype=host)
        self.blocks: list[tuple[np.ndarray, np.ndarray] | None] = []
        if me == ROOT:
            assert state.a is not None and state.b is not None
            starts = offsets(parts)
            for r, (start, p) in enumerate(zip(starts, parts)):
                if p == 0:
                    self.blocks.append(None)
                elif strategy == "rows":
                    self.blocks.append((state.a[start:start + p], state.b))
                else:
                    self.blocks.append((np.ascontiguousarray(state.a[:, start:start + p]), state.b[start:start + p]))
            own = self.blocks[ROOT]
            if own is not None:
                self.a_r, self.b_r = np.ascontiguousarray(own[0]), np.ascontiguousarray(own[1])
        self.c: np.ndarray | None = None  # the root's result of the last iteration
        # the host backend's "device" memory is host memory MPI can read: its C goes to MPI without a copy back
        self.direct = state.backend.mpi_memory_kind() == MPI_MEMORY_HOST

    def iteration(self) -> Phases:
        world, comm, me = self.world, self.world.comm, self.world.rank
        m, n, k = self.mnk
        backend, dtype = self.state.backend, self.dtype

        world.barrier()
        start = time.perf_counter()
        if me == ROOT:
            for r, block in enumerate(self.blocks):
                if r != ROOT and block is not None:
                    comm.Send(_bytes(block[0]), dest=r, tag=_TAG_A)
                    comm.Send(_bytes(block[1]), dest=r, tag=_TAG_B)
        elif self.part > 0:
            comm.Recv(self.a_r.reshape(-1).view(np.uint8), source=ROOT, tag=_TAG_A)
            comm.Recv(self.b_r.reshape(-1).view(np.uint8), source=ROOT, tag=_TAG_B)
        distribute = time.perf_counter() - start
        world.barrier()

        phases = Phases(distribute)
        c_r = None
        if self.part > 0:
            sm, sn, _ = slice_shape(self.strategy, m, n, k, self.part)
            with backend.timer() as h2d:
                a_dev = backend.upload(self.a_r, dtype)
                b_dev = backend.upload(self.b_r, dtype)
            c_dev = backend.empty((sm, sn), dtype)
            with backend.timer() as g:
                backend.matmul(a_dev, b_dev, c_dev, dtype)
            if self.direct:  # MPI reads the device's buffer where it is host memory: nothing to copy
                c_r = backend.mpi_buffer(c_dev)
                phases.d2h = 0.0
            else:
                with backend.timer() as d2h:
                    c_r = backend.download(c_dev, dtype)
                phases.d2h = d2h.seconds
            a_dev = b_dev = c_dev = None
            phases.h2d, phases.gemm = h2d.seconds, g.seconds
        world.barrier()

        start = time.perf_counter()
        if self.strategy == "rows":
            if me == ROOT:
                c = np.empty((m, n), dtype=dtype.host)
                for r, (row, p) in enumerate(zip(offsets(self.parts), self.parts)):
                    if p == 0:
                        continue
                    if r == ROOT:
                        assert c_r is not None
                        c[row:row + p] = c_r
                    else:
                        comm.Recv(c[row:row + p].reshape(-1).view(np.uint8), source=r, tag=_TAG_C)
                self.c = c
            elif c_r is not None:
                comm.Send(_bytes(c_r), dest=ROOT, tag=_TAG_C)
        else:
            mpi_type = dtype.mpi_dtype
            send = (np.ascontiguousarray(c_r, dtype=mpi_type) if c_r is not None
                    else np.zeros((m, n), dtype=mpi_type))
            recv = np.empty_like(send) if me == ROOT else None
            comm.Reduce(send, recv, op=world.MPI.SUM, root=ROOT)
            if me == ROOT:
                self.c = recv
        phases.collect = time.perf_counter() - start
        world.barrier()
        return phases




@dataclass
class SplitFigures:
    """One measured split, at the root."""

    name: str  # "even" or "weighted"
    strategy: str
    parts: list[int]
    per_rank: list[list[Phases]]  # [rank][timed iteration]
    modelled: list[bool] | None = None  # per rank: its device's times are modelled (a simulated device)

    def iteration_times(self) -> list[dict[str, float]]:
        """Per timed iteration, the job's phase times, each the slowest rank's: distribute, the device phase (copies
        and GEMM), collect, the compute phase alone (the slowest GEMM), and end to end: for a phased iteration the
        sum of distribute, device and collect; for a streamed one (whose phases overlap) job_end_to_end (the
        slowest rank's own), distribute and collect then being the time ranks waited on transfers."""
        modelled = self.modelled or [False] * len(self.per_rank)
        out = []
        for i in range(len(self.per_rank[0])):
            d = max(r[i].distribute for r in self.per_rank)
            device = max(r[i].device for r in self.per_rank)
            c = max(r[i].compute for r in self.per_rank)
            g = max(r[i].collect for r in self.per_rank)
            streamed = job_end_to_end([r[i] for r in self.per_rank], modelled, ROOT)
            e2e = d + device + g if streamed is None else streamed
            working = [r[i].compute for r, p in zip(self.per_rank, self.parts) if p > 0]
            out.append({"distribute": d, "device": device, "compute": c, "collect": g, "end_to_end": e2e,
                        "imbalance": plan.imbalance(working, [p for p in self.parts if p > 0])})
        return out


def run_split(world: World, state: SplitState, dtype: DType, strategy: str, parts: list[int], warmup: int,
              repeat: int, on_iteration: Callable[[], None] | None = None,
              chunks: int | None = None,
              after_timed: Callable[[Any], None] | None = None,
              zero_copy: bool = False) -> tuple[list[Phases], np.ndarray | None]:
    """`warmup` + `repeat` iterations of one split; this rank's timed phases, and the root's last C. `chunks`:
    streamed in that many column chunks (stream.py); None: the phased iteration, its phases between barriers.
    `zero_copy`: a streamed rows split through the root's shared-memory window (stream.py; every rank must agree).
    `after_timed(splitter)`: called (collectively) after each timed iteration."""
    splitter: Any = (Splitter(world, state, dtype, strategy, parts) if chunks is None
                     else stream.StreamedSplitter(world, state, dtype, strategy, parts, chunks, zero_copy=zero_copy))
    timed = []
    try:
        for i in range(warmup + repeat):
            phases = splitter.iteration()
            if i >= warmup:
                timed.append(phases)
                if after_timed is not None:
                    after_timed(splitter)
            if on_iteration is not None:
                on_iteration()
    except BaseException:
        if chunks is not None:  # this rank alone: close()'s collectives would wait for ranks still iterating
            splitter.abandon()
        raise
    if chunks is not None:
        splitter.close()
    return timed, splitter.c


def verify_at_root(state: SplitState, c: np.ndarray, dtype: DType, strategy: str, parts: list[int],
                   seed: int) -> verify.Verdict:
    """Freivalds' check of the gathered C against the root's A and B (for k, a sum of the working ranks' partial
    products, summed in MPI's type)."""
    assert state.a is not None and state.b is not None
    x = verify.random_vectors(c.shape[1], seed)
    terms = verify.product_terms(state.a, state.b, c, x)
    addends = sum(1 for p in parts if p > 0) if strategy == "k" else 1
    sum_dtype = DTYPES["fp64"] if dtype.mpi_dtype == np.float64 else DTYPES["fp32"]
    return verify.check(c, x, terms, dtype, sum_dtype=sum_dtype, addends=addends)






def flops_of(strategy: str, m: int, n: int, k: int, part: int) -> int:
    sm, sn, sk = slice_shape(strategy, m, n, k, part)
    return gemm.flops(sm, sn, sk)


# --- the whole run on a rank -----------------------------------------------------------------------------------


def even_weights(ranks: int) -> list[float]:
    return [1.0] * ranks


@dataclass
class RankRun:
    """What a rank hands the driver: its probes, its phases of each measured split, and at the root the result."""

    link: Any  # plan.Link | None
    solo: dict[str, tuple[float, int]]  # strategy -> (flop/s alone, part measured)
    splits: list[tuple[str, str, list[int], list[Phases]]]  # (name, strategy, parts, this rank's timed phases)
    rebalance: list[dict[str, Any]]  # at the root: one entry per re-weighting iteration
    chosen: dict[str, Any]  # at the root: strategy, predictions, weights used
    c: np.ndarray | None = None
    verdict: verify.Verdict | None = None
    facts: dict[str, Any] = field(default_factory=dict)  # this rank's host, backend, vendor, device, timing


def measure(cfg: Any, world: World, state: SplitState,
            on_step: Callable[[int, int, str], None] | None = None) -> RankRun:
    """Collective. Probe the links and every rank's solo rate, choose the strategy and the weights, rebalance
    where asked, then measure the even split (where asked and different) and the chosen one; verify at the root."""
    assert state.mnk is not None
    m, n, k = state.mnk
    link = probe.link_to_root(world, ROOT)
    links = world.allgather(link)
    chunks = streamed_chunks(cfg, n)
    zero = zero_copy_job(cfg, world, state, chunks)
    copies = _copy_rates(world, state, cfg.dtype, chunks, zero)
    strategies = list(plan.STRATEGIES) if cfg.strategy == "auto" else [cfg.strategy]
    probed = _probe_rates(cfg, world, state, strategies)
    predictions = {}
    for s in strategies:
        parts_s = plan.shares(_weights(cfg, state, probed.rates[s]), plan.dim_of(s, m, n, k), state.caps[s])
        predictions[s] = plan.predict(s, m, n, k, cfg.dtype.itemsize, parts_s, probed.rates[s],
                                      model_links(links, s, zero), ROOT, curves=probed.curves[s], chunks=chunks,
                                      copies=copies)
    strategy = plan.fastest(predictions)
    parts = list(predictions[strategy].parts)
    # every rank's measured (part, compute seconds), beginning with its probe's beside the others
    points = [[tuple(p) for p in c] for c in probed.curves[strategy]]
    if cfg.weights.kind == "list":  # a rank given weight 0 keeps no work when the split is rebalanced
        points = [pts if w > 0 else [] for pts, w in zip(points, cfg.weights.values)]
    refined: list[dict[str, Any]] = []
    if cfg.weights.kind == "auto":
        parts, refined = _refine_by_gemm(cfg, world, state, strategy, parts, points)
    zero_rows = zero and strategy == "rows"  # the window's split: nothing streamed, one GEMM a rank
    chunks, tried_chunks = _chunk_count(cfg, world, state, strategy, parts, chunks, zero_rows)
    if chunks is not None and cfg.weights.kind == "auto" and sum(1 for p in parts if p > 0) > 1:
        parts, finished = _balance_by_finish(world, state, cfg.dtype, strategy, parts, chunks, zero)
        refined += finished
    parts, history = _rebalance(cfg, world, state, strategy, parts, points, chunks, zero)
    splits, c, solo_at_parts = _timed_splits(cfg, world, state, strategy, parts, chunks, zero, zero_rows, on_step)
    verdict = _verdict(cfg, world, state, strategy, parts, c)
    chosen = {"mnk": (m, n, k), "caps": state.caps[strategy], "strategy": strategy, "strategy_given": cfg.strategy,
              "weights_kind": cfg.weights.kind, "weights": _weights(cfg, state, probed.rates[strategy]),
              "predictions": {s: p.to_dict() for s, p in predictions.items()},
              "links": links, "copies": copies, "rates": probed.rates, "solo_rates": probed.solo_rates,
              "refined": refined, "solo_at_parts": solo_at_parts, "overlap": chunks is not None, "chunks": chunks,
              "zero_copy": zero_rows, "chunks_tried": tried_chunks,
              "curves": [[list(p) for p in pts] for pts in points]}
    return RankRun(link, probed.solo, splits, history, chosen, c if world.rank == ROOT else None, verdict,
                   rank_facts(world, state))


def _copy_rates(world: World, state: SplitState, dtype: DType, chunks: int | None, zero: bool) -> list[Any]:
    """Collective. Each rank's copy rate between the host and its device, for the model's copies (a GPU's through
    pageable memory can cost it more than its GEMMs); None where it computes on host arrays, or where the streamed
    split receives into its device buffers and sends from them, mapped, or computes on the root's window, zero copy
    (stream.py)."""
    maps = chunks is not None and (world.rank != ROOT or zero) and can_map_to_host(state.backend)
    return world.allgather(None if maps else probe.copy_rate(state.backend, dtype, _computes_on_host(state)))


@dataclass
class _Probed:
    """The GEMM probes of each strategy tried: every rank's rate beside the others (which the auto weights use) and
    alone (solo_rates), and its (part, seconds) points; `solo`: this rank's own (rate, part) alone."""

    rates: dict[str, list[float]]
    solo_rates: dict[str, list[float]]
    curves: dict[str, list[list[tuple[int, float]]]]
    solo: dict[str, tuple[float, int]]


def _probe_rates(cfg: Any, world: World, state: SplitState, strategies: list[str]) -> _Probed:
    """Collective. Each rank's GEMM rate at its slice's shape, twice: all ranks at once (as the split runs them:
    devices that share a host's cores or memory slow each other down), which the auto weights use; and alone, one
    rank at a time while the others wait, the denominator of the efficiency."""
    assert state.mnk is not None
    m, n, k = state.mnk
    together: dict[str, tuple[float, int]] = {}
    together_points: dict[str, list[tuple[int, float]]] = {}
    solo: dict[str, tuple[float, int]] = {}
    for s in strategies:
        limit = min(-(-plan.dim_of(s, m, n, k) // world.size), state.caps[s][world.rank])
        probe_rate = functools.partial(_probe_gemm, cfg, state, s, limit)
        world.barrier()
        rate, part, curve = probe_rate()
        together[s] = (rate, part)
        together_points[s] = curve
        solo[s] = world.in_turn(probe_rate)[:2]
    return _Probed(rates={s: [r[s][0] for r in world.allgather(together)] for s in strategies},
                   solo_rates={s: [r[s][0] for r in world.allgather(solo)] for s in strategies},
                   curves={s: [list(c[s]) for c in world.allgather(together_points)] for s in strategies},
                   solo=solo)


def _probe_gemm(cfg: Any, state: SplitState, strategy: str, limit: int) -> tuple[float, int, list[tuple[int, float]]]:
    """(flop/s, part) at the probe's slice, at most `limit`, and its (part, median seconds): the first point of the
    cost model's curve (the doubling's single runs are not points: the first run at each new size carries one-time
    costs, a tuned kernel's first launch for a new shape among them)."""
    if limit <= 0:
        return 0.0, 0, []
    assert state.mnk is not None
    m, n, k = state.mnk
    got = probe.measure_gemm(state.backend, cfg.dtype, strategy, m, n, k, max_part=limit, seed=cfg.seed)
    return got.rate, got.part, [(got.part, got.seconds_median)]


def _weights(cfg: Any, state: SplitState, rates: list[float]) -> list[float]:
    """The weights the shares follow: even, the given ones, the profile's rates, or (auto) `rates`, the probes'."""
    kind = cfg.weights.kind
    if kind == "even":
        return even_weights(len(rates))
    if kind == "list":
        return list(cfg.weights.values)
    if kind == "profile":
        return list(state.profile.rates)
    return rates


def _add_points(points: list[list[tuple[int, float]]], parts: list[int], seconds: list[float]) -> None:
    """Each rank's measured (part, seconds) added to its points, where it had a part and took time."""
    for r, (p_r, t_r) in enumerate(zip(parts, seconds)):
        if p_r > 0 and t_r > 0:
            points[r].append((p_r, t_r))


def _working_imbalance(seconds: list[float], parts: list[int]) -> float:
    """plan.imbalance of the working ranks' seconds (those with a part) against their parts."""
    return plan.imbalance([t for t, p in zip(seconds, parts) if p > 0], [p for p in parts if p > 0])


def _refine_by_gemm(cfg: Any, world: World, state: SplitState, strategy: str, parts: list[int],
                    points: list[list[tuple[int, float]]]) -> tuple[list[int], list[dict[str, Any]]]:
    """Collective. Auto weights: the rates were measured at the probe's slice; each rank now times its GEMM at the
    part it got (its working shape, beside the others), adds it to its `points`, and the parts that equalise the
    interpolated times are taken, AUTO_REFINE_STEPS times. The parts, and each step's figures."""
    assert state.mnk is not None
    m, n, k = state.mnk
    me = world.rank
    refined: list[dict[str, Any]] = []
    for _ in range(AUTO_REFINE_STEPS):
        seconds = time_part(state, cfg.dtype, strategy, m, n, k, parts[me], cfg.seed) if parts[me] else 0.0
        every = world.allgather(seconds)
        _add_points(points, parts, every)
        refined.append({"parts": list(parts), "compute_seconds": every,
                        "imbalance": _working_imbalance(every, parts)})
        parts = plan.balanced_parts(points, plan.dim_of(strategy, m, n, k), state.caps[strategy])
    return parts, refined


def _chunk_count(cfg: Any, world: World, state: SplitState, strategy: str, parts: list[int], chunks: int | None,
                 zero_rows: bool) -> tuple[int | None, list[dict[str, Any]]]:
    """Collective. The chunks the timed splits stream in, and each count tried's seconds: 1 for the window's split
    (nothing streamed); for --chunks auto where a rank beside the root works, the measured count; else `chunks`."""
    if zero_rows:
        return 1, []
    if chunks is not None and cfg.chunks is None and any(p > 0 for r, p in enumerate(parts) if r != ROOT):
        assert state.mnk is not None
        return _measured_chunks(world, state, cfg.dtype, strategy, parts, state.mnk[1])
    return chunks, []


def _balance_by_finish(world: World, state: SplitState, dtype: DType, strategy: str, parts: list[int], chunks: int,
                       zero: bool) -> tuple[list[int], list[dict[str, Any]]]:
    """Collective. Streamed, auto weights: the parts balanced by when each rank has handed its last result to MPI
    (its GEMMs and everything the streaming leaves exposed), not by its GEMMs alone, FINISH_STEPS times. The parts,
    and each step's figures."""
    assert state.mnk is not None
    m, n, k = state.mnk
    finish_points: list[list[tuple[int, float]]] = [[] for _ in range(world.size)]
    refined: list[dict[str, Any]] = []
    for _ in range(FINISH_STEPS):
        phases, _ = run_split(world, state, dtype, strategy, parts, 0, FINISH_ITERATIONS, chunks=chunks,
                              zero_copy=zero)
        modelled = state.backend.timing == TIMING_MODELLED
        runs = world.allgather([p.ready(modelled) for p in phases])
        ready = [_median(r) for r in runs]
        _add_points(finish_points, parts, ready)
        refined.append({"parts": list(parts), "ready_seconds": ready, "ready_seconds_runs": runs, "chunks": chunks,
                        "imbalance": _working_imbalance(ready, parts)})
        parts = plan.balanced_parts(finish_points, plan.dim_of(strategy, m, n, k), state.caps[strategy])
    return parts, refined


def _rebalance(cfg: Any, world: World, state: SplitState, strategy: str, parts: list[int],
               points: list[list[tuple[int, float]]], chunks: int | None,
               zero: bool) -> tuple[list[int], list[dict[str, Any]]]:
    """Collective. --rebalance: one timed iteration of the split per step; the parts re-balanced from every rank's
    compute times measured so far (added to its `points`), until the imbalance is under the goal. The parts, and
    each step's figures."""
    assert state.mnk is not None
    m, n, k = state.mnk
    history: list[dict[str, Any]] = []
    for i in range(cfg.rebalance):
        phases, _ = run_split(world, state, cfg.dtype, strategy, parts, 0, 1, chunks=chunks, zero_copy=zero)
        every = world.allgather(phases[0].compute)
        imb = _working_imbalance(every, parts)
        history.append({"iteration": i + 1, "parts": list(parts), "compute_seconds": every, "imbalance": imb})
        if imb < plan.IMBALANCE_GOAL:
            break
        _add_points(points, parts, every)
        parts = plan.balanced_parts(points, plan.dim_of(strategy, m, n, k), state.caps[strategy])
    return parts, history


def _timed_splits(cfg: Any, world: World, state: SplitState, strategy: str, parts: list[int], chunks: int | None,
                  zero: bool, zero_rows: bool, on_step: Callable[[int, int, str], None] | None,
                  ) -> tuple[list[tuple[str, str, list[int], list[Phases]]], np.ndarray | None, list[Any]]:
    """Collective. The timed splits: the even one (where asked and different), then the chosen one; and the
    efficiency's denominators, each rank's GEMMs alone at its final part. Where every rank keeps its buffers across
    the streamed iterations (stream.StreamedSplitter.solo_once) those run again alone after each timed iteration of
    the weighted split, one rank at a time, so that the split's and the solo runs' medians sample the same speed of
    the machine; elsewhere they are timed before and after the timed splits. The splits, the root's C, and the solo
    runs' figures per rank."""
    assert state.mnk is not None
    m, n, k = state.mnk
    even_parts = (plan.shares(even_weights(world.size), plan.dim_of(strategy, m, n, k), state.caps[strategy])
                  if cfg.compare_even else None)
    plans = ([("even", even_parts)] if even_parts is not None and even_parts != parts else []) + [("weighted", parts)]
    total = len(plans) * (cfg.warmup + cfg.repeat)
    done = 0
    interleave = chunks is not None and all(world.allgather(zero_rows or _keeps_buffers(state, world.rank, parts,
                                                                                        strategy)))
    solo_runs: list[float] = []

    def solo_between(splitter: Any) -> None:
        seconds = world.in_turn(splitter.solo_once)
        assert seconds is not None, "solo_once: this rank keeps no buffers"
        solo_runs.append(seconds)

    def tick(name: str) -> None:
        nonlocal done
        done += 1
        if on_step is not None:
            on_step(done, total, f"{name} split {strategy}")

    solo_before = None if interleave else solo_at_final_parts(world, state, cfg.dtype, strategy, m, n, k, parts,
                                                               cfg.seed)
    splits = []
    c = None
    for name, p in plans:
        timed, c = run_split(world, state, cfg.dtype, strategy, p, cfg.warmup, cfg.repeat,
                             functools.partial(tick, name), chunks=chunks,
                             after_timed=solo_between if interleave and name == "weighted" else None,
                             zero_copy=zero)
        splits.append((name, strategy, list(p), timed))
    if interleave:
        return splits, c, solo_from_runs(world.allgather(solo_runs), parts, strategy, m, n, k)
    after = solo_at_final_parts(world, state, cfg.dtype, strategy, m, n, k, parts, cfg.seed)
    return splits, c, merge_solo(solo_before, after, strategy, m, n, k)


def _verdict(cfg: Any, world: World, state: SplitState, strategy: str, parts: list[int],
             c: np.ndarray | None) -> verify.Verdict | None:
    """Collective. Freivalds' verdict on the root's C, on every rank."""
    verdict = None
    if world.rank == ROOT:
        assert c is not None
        verdict = verify_at_root(state, c, cfg.dtype, strategy, parts, cfg.seed)
    return world.comm.bcast(verdict, root=ROOT)


def _computes_on_host(state: SplitState) -> bool:
    """Whether this rank's device computes on host arrays (nothing to copy); a backend hetbench does not know (a
    plugin's, a test's double) is taken to, as the split's phases then count no copies for it either."""
    try:
        return capabilities(state.info.backend).computes_on_host_arrays
    except ValueError:
        return True


def zero_copy_job(cfg: Any, world: World, state: SplitState, chunks: int | None) -> bool:
    """Collective. Whether a streamed split goes through the root's shared-memory window (stream.py, zero copy):
    --zero-copy (the default), streamed, every rank on the root's node and able to compute on host memory in place
    (stream.zero_copy_capable). The same answer on every rank."""
    if chunks is None or not getattr(cfg, "zero_copy", True):
        return False
    able = (world.local_size == world.size
            and stream.zero_copy_capable(state.backend, _computes_on_host(state), state.backend.timing))
    return all(world.allgather(able))


def model_links(links: Sequence[Any], strategy: str, zero_copy: bool) -> list[Any]:
    """The links the cost model takes: a zero-copy rows split moves nothing (a link of no cost for every rank but
    the root's), else the measured ones."""
    if not (zero_copy and strategy == "rows"):
        return list(links)
    return [None if link is None else plan.Link(math.inf, 0.0) for link in links]


def streamed_chunks(cfg: Any, n: int) -> int | None:
    """The column chunks a split streams in (`--chunks`, or stream.auto_chunks of C's columns), at most n; None
    for `--no-overlap` (the phased iteration)."""
    if not getattr(cfg, "overlap", True):
        return None
    chunks = getattr(cfg, "chunks", None)
    return min(n, stream.auto_chunks(n) if chunks is None else chunks)


AUTO_REFINE_STEPS = 3
FINISH_STEPS = 2  # streamed splits that balance auto weights by each rank's finish
# iterations of each, every rank's finish their median: one iteration's finish is too noisy to balance the parts by
FINISH_ITERATIONS = 3
CHUNK_CANDIDATES = (1, 2, 4, 8)  # --chunks auto tries these (chunks at least AUTO_CHUNK_MIN_COLUMNS wide)
# --chunks auto keeps the fewest chunks within this share of the fastest count: more chunks cost narrower GEMMs and
# more messages on every later run, so a gain inside the noise between identical iterations is none
CHUNK_MARGIN = 0.03


def _measured_chunks(world: World, state: SplitState, dtype: DType, strategy: str, parts: list[int],
                     n: int) -> tuple[int, list[dict[str, Any]]]:
    """Collective. --chunks auto: streamed iterations at each candidate chunk count, in the order 1, 2, 4, 8 and
    back (a drift of the machine's speed weighs on every count alike), each count's end to end (the slowest rank's)
    its faster of the two; the fewest chunks within CHUNK_MARGIN of the fastest count win. More chunks hide more of
    the transfers but cut the GEMMs narrower (a tuned kernel can run markedly slower on narrow columns), so the
    trade is measured, not assumed, and each count is run twice (one run each is too noisy to choose by). Returns
    the count and each candidate's seconds."""
    candidates = [c for c in CHUNK_CANDIDATES if c == 1 or n // c >= stream.AUTO_CHUNK_MIN_COLUMNS]
    runs: dict[int, list[float]] = {c: [] for c in candidates}
    modelled = state.backend.timing == TIMING_MODELLED
    every_modelled = world.allgather(modelled)
    for c in candidates + candidates[::-1]:
        phases, _ = run_split(world, state, dtype, strategy, parts, 0, 1, chunks=c)
        runs[c].append(job_end_to_end(world.allgather(phases[0]), every_modelled, ROOT))
    tried = [{"chunks": c, "end_to_end_seconds": min(runs[c]), "end_to_end_seconds_runs": runs[c]}
             for c in candidates]
    return fewest_chunks_within_margin(tried), tried


def fewest_chunks_within_margin(tried: list[dict[str, Any]], margin: float | None = None) -> int:
    """The fewest chunks whose end to end is within `margin` (default CHUNK_MARGIN) of the fastest candidate's."""
    margin = CHUNK_MARGIN if margin is None else margin
    fastest = min(t["end_to_end_seconds"] for t in tried)
    return int(min(t["chunks"] for t in tried if t["end_to_end_seconds"] <= fastest * (1 + margin)))


TIME_PART_RUNS = 3


def solo_at_final_parts(world: World, state: SplitState, dtype: DType, strategy: str, m: int, n: int, k: int,
                        parts: list[int], seed: int) -> list[dict[str, Any] | None]:
    """Collective. The efficiency's denominators (run before and after the timed splits, merge_solo): each rank's
    GEMM alone (one rank at a time, the others waiting) at exactly the part it finally computed, TIME_PART_RUNS
    runs: {"part", "gflops_median", "gflops_min", "gflops_max", "seconds"} per rank, None for a rank without a part.
    A probe's small slice can run slower or faster than the final part, so an efficiency against it is off."""
    part = parts[world.rank]

    def alone() -> dict[str, Any] | None:
        if part <= 0:
            return None
        seconds = time_part_runs(state, dtype, strategy, m, n, k, part, seed)
        return _solo_entry(part, flops_of(strategy, m, n, k, part), seconds)

    return world.allgather(world.in_turn(alone))


def _keeps_buffers(state: SplitState, rank: int, parts: list[int], strategy: str) -> bool:
    """Whether this rank's streamed iterations keep the buffers its GEMMs run on (stream.keeps_buffers)."""
    return stream.keeps_buffers(rank, parts[rank], strategy, _computes_on_host(state), can_map_to_host(state.backend))


def solo_from_runs(runs: list[list[float]], parts: list[int], strategy: str, m: int, n: int,
                   k: int) -> list[dict[str, Any] | None]:
    """solo_at_final_parts' answer from every rank's solo runs between the timed iterations (StreamedSplitter.
    solo_once): per rank its runs, their median, slowest and fastest rates; None for a rank without a part."""
    out: list[dict[str, Any] | None] = []
    for part, seconds in zip(parts, runs):
        if part == 0 or not seconds:
            out.append(None)
            continue
        out.append(dict(_solo_entry(part, flops_of(strategy, m, n, k, part), list(seconds)), interleaved=True))
    return out


def merge_solo(before: list[dict[str, Any] | None], after: list[dict[str, Any] | None], strategy: str, m: int,
               n: int, k: int) -> list[dict[str, Any] | None]:
    """Two solo_at_final_parts answers at the same parts as one: each rank's runs of both, in order, and their
    median, slowest and fastest rates."""
    out: list[dict[str, Any] | None] = []
    for b, a in zip(before, after):
        if b is None or a is None:
            out.append(b or a)
            continue
        if b["part"] != a["part"]:
            raise ValueError(f"solo runs at parts {b['part']} and {a['part']} cannot be merged")
        out.append(_solo_entry(b["part"], flops_of(strategy, m, n, k, b["part"]),
                               list(b["seconds"]) + list(a["seconds"])))
    return out


def _solo_entry(part: int, flops: float, seconds: list[float]) -> dict[str, Any]:
    """One rank's solo runs at its part: their median, slowest and fastest rates (GFLOP/s) and the runs."""
    return {"part": part, "gflops_median": flops / _median(seconds) / 1e9, "gflops_min": flops / max(seconds) / 1e9,
            "gflops_max": flops / min(seconds) / 1e9, "seconds": seconds}


def time_part(state: SplitState, dtype: DType, strategy: str, m: int, n: int, k: int, part: int, seed: int) -> float:
    """This rank's GEMM time at its part's slice shape (device timer): the median of TIME_PART_RUNS runs after one
    untimed run."""
    return _median(time_part_runs(state, dtype, strategy, m, n, k, part, seed))


def time_part_runs(state: SplitState, dtype: DType, strategy: str, m: int, n: int, k: int, part: int,
                   seed: int) -> list[float]:
    """time_part's runs, every one (device timer)."""
    pm, pn, pk = slice_shape(strategy, m, n, k, part)
    a, b = gemm.generate_inputs(seed, 0, pm, pn, pk, dtype)
    backend = state.backend
    a_dev, b_dev = backend.upload(a, dtype), backend.upload(b, dtype)
    c_dev = backend.empty((pm, pn), dtype)
    backend.matmul(a_dev, b_dev, c_dev, dtype)
    seconds = []
    for _ in range(TIME_PART_RUNS):
        with backend.timer() as elapsed:
            backend.matmul(a_dev, b_dev, c_dev, dtype)
        seconds.append(elapsed.seconds)
    return seconds


def rank_facts(world: World, state: SplitState) -> dict[str, Any]:
    return {"host": world.host, "backend": state.spec, "vendor": state.info.vendor, "device": state.info.name,
            "device_timing": state.backend.timing}


# --- before the run: inputs at the root, the caps and the shares checked on every rank ----------------------------


def prepare(cfg: Any, world: World, opened: OpenDevice) -> tuple[SplitState | None, list[str]]:
    """The root makes or loads A and B (files: from their headers first, so a bad file costs nothing); every rank
    notes its device's free memory. Returns (state, errors) for World.agree."""
    state = SplitState(opened.backend, opened.info, opened.spec, None, None, None, opened.backend.free_memory_bytes())
    if cfg.plan or world.rank != ROOT:
        if cfg.plan:
            state.mnk = (cfg.m, cfg.n, cfg.k)
        return state, []
    if cfg.a_path is not None:
        try:
            headers = (gemm.read_matrix_header(cfg.a_path, "a"), gemm.read_matrix_header(cfg.b_path, "b"))
            gemm.check_shapes(headers[0], headers[1], cfg.a_path, cfg.b_path)
            (m, k), (_, n) = headers[0].shape, headers[1].shape
            error = _root_memory_error(m, n, k, cfg.dtype, getattr(cfg, "overlap", True))
            if error:
                return None, [error]
            with np.errstate(over="ignore", invalid="ignore"):
                a = gemm.read_matrix(headers[0], cfg.dtype)
                b = gemm.read_matrix(headers[1], cfg.dtype)
            # the k strategy sums partial products: the bound of the whole product covers every partial sum
            gemm.check_finite_products(a, b, cfg.dtype, headers[0].path, headers[1].path)
        except gemm.InputError as e:
            return None, [str(e)]
    else:
        m, n, k = cfg.m, cfg.n, cfg.k
        error = _root_memory_error(m, n, k, cfg.dtype, getattr(cfg, "overlap", True))
        if error:
            return None, [error]
        a, b = gemm.generate_inputs(cfg.seed, 0, m, n, k, cfg.dtype)
    state.a, state.b, state.mnk = a, b, (m, n, k)
    return state, []


def _root_memory_error(m: int, n: int, k: int, dtype: DType, streamed: bool = True) -> str | None:
    """The root holds A, B, C, A's packed column blocks (k strategy), B's packed column chunks (a streamed split)
    and the sum's buffers: check before making."""
    need = (2 * m * k + (2 if streamed else 1) * k * n + 3 * m * n) * dtype.host.itemsize
    share = host_backend.host_memory_share_bytes(1)
    if share is None or need <= share:
        return None
    return (f"{m}x{k} @ {k}x{n} in {dtype.name} needs {approx_bytes(need)} of host memory at the root (A, B, "
            f"C and the slices' buffers); it has {approx_bytes(share)}; use a smaller size")


def check(cfg: Any, world: World, state: SplitState) -> list[str]:
    """Collective. Every rank learns the shape, each rank's free memory, the caps on each rank's part, and whether
    the given weights (or any weights, for auto) can place the work; a profile is loaded and matched to the job's
    devices. The same errors on every rank."""
    state.mnk = world.comm.bcast(state.mnk, root=ROOT)
    m, n, k = state.mnk
    ranks = len(cfg.backends) if cfg.plan else world.size
    if cfg.plan:
        return plan_check(cfg, world, state, ranks)
    free = world.allgather(state.free_bytes)
    state.devices = [tuple(d) for d in world.allgather((state.spec, state.info.name))]
    errors: list[str] = []
    itemsize = cfg.dtype.itemsize
    strategies = list(plan.STRATEGIES) if cfg.strategy == "auto" else [cfg.strategy]
    state.caps = {s: [plan.max_part(s, m, n, k, itemsize, f) for f in free] for s in plan.STRATEGIES}
    if cfg.weights.kind == "profile":
        try:
            state.profile = profiles.load_profile(cfg.weights.path, ranks, cfg.dtype.name,
                                         strategies[0] if len(strategies) == 1 else "rows", state.devices,
                                         shape=(m, n, k))
        except profiles.ProfileError as e:
            return [str(e)]
    weights = (cfg.weights.values if cfg.weights.kind == "list" else
               state.profile.rates if cfg.weights.kind == "profile" else [1.0] * ranks)
    placed = []
    for s in strategies:
        try:
            plan.shares(list(weights), plan.dim_of(s, m, n, k), state.caps[s])
            placed.append(s)
        except plan.PlacementError as e:
            errors.append(f"--strategy {s}: {e}")
    if placed:
        return []
    return errors


def plan_check(cfg: Any, world: World, state: SplitState, ranks: int) -> list[str]:
    """--plan: every rank of the map needs a rate: a simulated device's model, or the profile's."""
    if cfg.weights.kind == "profile":
        try:
            state.profile = profiles.load_profile(cfg.weights.path, ranks, cfg.dtype.name,
                                         "rows" if cfg.strategy == "auto" else cfg.strategy, None)
        except profiles.ProfileError as e:
            return [str(e)]
        return []
    missing = [f"{r}={spec}" for r, spec in enumerate(cfg.backends)
               if spec.name == "auto" or not capabilities(spec.name).simulated]
    if missing:
        return [f"--plan has no rate for rank(s) {', '.join(missing)}: it models simulated devices (sim:MODEL); "
                "for real ones give --weights PROFILE.json from `hetbench calibrate`"]
    for r, spec in enumerate(cfg.backends):
        try:
            model = sim.get_model(spec.model)
            sim.gemm_model_seconds(model, 1, 1, 1, cfg.dtype)
        except ValueError as e:
            return [f"rank {r} ({spec}): {e}"]
    try:
        plan_only(cfg, world, state)
    except plan.PlacementError as e:
        return [str(e)]
    return []


# --- rows and summary, at the root ---------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def rows(cfg: Any, gathered: list[RankRun]) -> list[dict[str, Any]]:
    """One row per measured split and rank: its part, its solo rate, and its compute, communication and idle
    seconds (medians over the timed iterations; every iteration's in `raw`)."""
    if cfg.plan:
        return gathered[0].chosen["rows"]
    m, n, k = gathered[0].chosen["mnk"]
    out = []
    for index, (name, strategy, parts, _) in enumerate(gathered[0].splits):
        dim = plan.dim_of(strategy, m, n, k)
        per_rank = [rr.splits[index][3] for rr in gathered]
        iterations = len(per_rank[0])
        slowest = [max(ph[i].device for ph in per_rank) for i in range(iterations)]
        for r, (rr, phases) in enumerate(zip(gathered, per_rank)):
            part = parts[r]
            compute = [p.compute for p in phases]
            gemm_s = [p.gemm for p in phases]
            flop_count = flops_of(strategy, m, n, k, part)
            rate, probe_part = rr.solo[strategy]
            together = gathered[ROOT].chosen["rates"][strategy][r]
            link = rr.link
            row: dict[str, Any] = {
                "split": name, "strategy": strategy, "rank": r, **rr.facts, "dtype": cfg.dtype.name,
                "m": m, "n": n, "k": k, "part": part, "share_percent": 100.0 * part / dim,
                "gemm_flops": flop_count, "solo_gflops": rate / 1e9, "solo_part": probe_part,
                "rate_gflops": together / 1e9,
                **summarize(compute, "compute_seconds"),
                "h2d_seconds_median": _median([p.h2d for p in phases]),
                "d2h_seconds_median": _median([p.d2h for p in phases]),
                "gemm_gflops": flop_count / _median(gemm_s) / 1e9 if part and _median(gemm_s) > 0 else None,
                "comm_seconds_median": _median([p.communication for p in phases]),
                "idle_seconds_median": _median([s - p.device for s, p in zip(slowest, phases)]),
                "link_gbps": link.bytes_per_s / 1e9 if link is not None else None,
                "link_latency_us": link.latency_s * 1e6 if link is not None else None,
                "raw": {"compute_seconds": compute, "h2d_seconds": [p.h2d for p in phases],
                        "d2h_seconds": [p.d2h for p in phases], "distribute_seconds": [p.distribute for p in phases],
                        "collect_seconds": [p.collect for p in phases],
                        **({"wall_seconds": [p.wall for p in phases],
                            "device_wall_seconds": [p.device_wall for p in phases]}
                           if phases and phases[0].wall is not None else {})},
            }
            out.append(row)
    return out


def measurement_faults(splits: dict[str, dict[str, Any]]) -> list[str]:
    """Every efficiency above 1, named: the split ran faster than its devices alone at the same parts, which only a
    change in the machine's speed between the measurements explains. Flagged, never reported as a gain."""
    out = []
    for name, figures in splits.items():
        for key in ("efficiency_end_to_end", "efficiency_compute"):
            value = figures.get(key)
            if value is not None and value > 1:
                out.append(f"{name} split {key} {value:.3f} > 1: a measurement fault (the devices ran faster in the "
                           "split than alone at the same parts; the machine's speed changed between them)")
    return out


def summarize_job(cfg: Any, rows_: list[dict[str, Any]], gathered: list[RankRun]) -> dict[str, Any]:
    """The job's figures: per measured split, the end-to-end and compute-phase GFLOP/s, their efficiency against
    the sum of the ranks' solo rates measured in this run, the imbalance, and the model's prediction beside them;
    the chosen split's figures at the top."""
    root = gathered[ROOT]
    if cfg.plan:
        return root.chosen["summary"]
    m, n, k = root.chosen["mnk"]
    strategy = root.chosen["strategy"]
    total_flops = gemm.flops(m, n, k)
    sum_solo, sum_probe = _solo_sums(root.chosen)
    at_parts = root.chosen.get("solo_at_parts")
    links = root.chosen["links"]
    copies = root.chosen.get("copies")  # None in documents from before the copies were measured
    zero = bool(root.chosen.get("zero_copy"))  # documents from before zero copy: False
    splits = {name: _split_summary(cfg, gathered, index, sum_solo, sum_probe)
              for index, (name, _, _, _) in enumerate(root.splits)}
    chosen = splits["weighted"]
    verdict = root.verdict
    return {
        "strategy": strategy,
        "strategy_given": root.chosen["strategy_given"],
        "overlap": root.chosen.get("overlap", False),
        "chunks": root.chosen.get("chunks"),
        "zero_copy": zero,  # every rank on the root's shared-memory window: nothing sent (stream.py)
        "chunks_tried": root.chosen.get("chunks_tried") or [],  # --chunks auto: each count's measured end to end
        "refined": root.chosen.get("refined") or [],  # auto weights' steps: GEMM times, then finish times
        "weights_kind": root.chosen["weights_kind"],
        "weights": root.chosen["weights"],
        "ranks": len(gathered),
        "total_gemm_flops": total_flops,
        "sum_solo_gflops": sum_solo / 1e9,
        "sum_solo_gflops_probe": sum_probe / 1e9,
        "efficiency_basis": _efficiency_basis(at_parts),
        "solo_at_parts": at_parts,
        "measurement_faults": measurement_faults(splits),
        "parts": chosen["parts"],
        "end_to_end_seconds_median": chosen["end_to_end_seconds_median"],
        "achieved_gflops": chosen["achieved_gflops"],
        "efficiency_end_to_end": chosen["efficiency_end_to_end"],
        "efficiency_compute": chosen["efficiency_compute"],
        "imbalance": chosen["imbalance"],
        "predicted_seconds": chosen["predicted"]["seconds"],
        "timing": chosen["timing"],
        "speedup_over_even": (chosen["achieved_gflops"] / splits["even"]["achieved_gflops"]
                              if "even" in splits else None),
        "splits": splits,
        "predictions": root.chosen["predictions"],
        "model_best": plan.best_root_share(strategy, m, n, k, cfg.dtype.itemsize, root.chosen["rates"][strategy],
                                           model_links(links, strategy, zero), root.chosen["caps"], ROOT,
                                           curves=root.chosen.get("curves"), chunks=root.chosen.get("chunks"),
                                           copies=copies).to_dict(),
        "model_curves": root.chosen.get("curves"),
        # each rank's measured copy rate between the host and its device (GB/s; None: it computes on host arrays)
        "copies_gbps": None if copies is None else [None if c is None else c / 1e9 for c in copies],
        "links": [None if l is None else {"link_gbps": l.bytes_per_s / 1e9, "link_latency_us": l.latency_s * 1e6}
                  for l in links],
        "rebalance": root.rebalance,
        "verified": verdict.ok if verdict is not None else None,
        "max_residual_over_tolerance": verdict.max_residual_over_tolerance if verdict is not None else None,
    }


def _solo_sums(chosen: dict[str, Any]) -> tuple[float, float]:
    """The efficiency's denominators, in flop/s: the sum of every rank's rate alone at its final part (the probe's
    rate for a rank left without one; documents written before the final parts were timed: the probes'), and the
    sum of the probes' rates alone."""
    probe_solo = chosen["solo_rates"][chosen["strategy"]]
    sum_probe = sum(probe_solo)
    at_parts = chosen.get("solo_at_parts")
    sum_solo = (sum(a["gflops_median"] * 1e9 if a else p for a, p in zip(at_parts, probe_solo)) if at_parts
                else sum_probe)
    return sum_solo, sum_probe


def _efficiency_basis(at_parts: list[dict[str, Any] | None] | None) -> str:
    """What the efficiency's denominator is, in words."""
    if not at_parts:
        return "each rank's probe alone"
    if any(a and a.get("interleaved") for a in at_parts):
        runs = "each rank alone at its final part (median of its runs between the timed iterations"
    else:
        runs = "each rank alone at its final part (median of its runs before and after the timed splits"
    return runs + "; a rank without a part: its probe)"


def _split_summary(cfg: Any, gathered: list[RankRun], index: int, sum_solo: float,
                   sum_probe: float) -> dict[str, Any]:
    """One measured split's job figures: its phases' medians over the timed iterations (each the slowest rank's),
    its GFLOP/s end to end and in the compute phase, their efficiencies against `sum_solo` and `sum_probe` (flop/s),
    its imbalance, and the cost model's prediction for its parts. The cost model takes each rank's time against its
    part fitted through every point it was timed at (documents from before the curves: its one rate)."""
    root = gathered[ROOT]
    m, n, k = root.chosen["mnk"]
    name, s, parts, _ = root.splits[index]
    total_flops = gemm.flops(m, n, k)
    figures = SplitFigures(name, s, parts, [rr.splits[index][3] for rr in gathered],
                           [rr.facts["device_timing"] == TIMING_MODELLED for rr in gathered])
    its = figures.iteration_times()
    e2e = [t["end_to_end"] for t in its]
    compute = [t["compute"] for t in its]
    modelled_compute = any(rr.facts["device_timing"] == TIMING_MODELLED and p > 0 for rr, p in zip(gathered, parts))
    achieved = total_flops / _median(e2e) / 1e9
    compute_phase = total_flops / _median(compute) / 1e9
    zero = bool(root.chosen.get("zero_copy"))
    predicted = plan.predict(s, m, n, k, cfg.dtype.itemsize, parts, root.chosen["rates"][root.chosen["strategy"]],
                             model_links(root.chosen["links"], s, zero), ROOT, curves=root.chosen.get("curves"),
                             chunks=root.chosen.get("chunks"), copies=root.chosen.get("copies"))
    return {
        "strategy": s, "parts": parts,
        **summarize(e2e, "end_to_end_seconds"),
        "distribute_seconds_median": _median([t["distribute"] for t in its]),
        "device_seconds_median": _median([t["device"] for t in its]),
        "compute_seconds_median": _median(compute),
        "collect_seconds_median": _median([t["collect"] for t in its]),
        "achieved_gflops": achieved,
        "compute_phase_gflops": compute_phase,
        "efficiency_end_to_end": achieved / (sum_solo / 1e9) if sum_solo > 0 else None,
        "efficiency_compute": compute_phase / (sum_solo / 1e9) if sum_solo > 0 else None,
        "efficiency_end_to_end_probe": achieved / (sum_probe / 1e9) if sum_probe > 0 else None,
        "efficiency_compute_probe": compute_phase / (sum_probe / 1e9) if sum_probe > 0 else None,
        "imbalance": _median([t["imbalance"] for t in its]),
        "imbalance_per_iteration": [t["imbalance"] for t in its],
        "predicted": predicted.to_dict(),
        "timing": "modelled" if modelled_compute else "measured",
        "raw": {"end_to_end_seconds": e2e, "compute_seconds": compute},
    }


# --- --plan: the split and its predicted times, nothing run ---------------------------------------------------------


def plan_only(cfg: Any, world: World, state: SplitState) -> RankRun:
    """The what-if plan for the rank map of --backend: modelled rates (simulated devices' datasheet model, or a
    profile's measured rates), the modelled link (--link-gbps, --link-latency-us), the shares capped by each
    simulated device's memory, and both strategies' predicted times. Everything in it is modelled."""
    m, n, k = cfg.m, cfg.n, cfg.k
    ranks = len(cfg.backends)
    gbit = cfg.link_gbit_per_s if cfg.link_gbit_per_s is not None else DEFAULT_LINK_GBIT
    latency_us = cfg.link_latency_us if cfg.link_latency_us is not None else DEFAULT_LINK_LATENCY_US
    link = plan.Link(gbit * 1e9 / 8, latency_us * 1e-6)
    links = [None if r == ROOT else link for r in range(ranks)]
    strategies = list(plan.STRATEGIES) if cfg.strategy == "auto" else [cfg.strategy]
    itemsize = cfg.dtype.itemsize
    names = [sim.get_model(spec.model).name if capabilities(spec.name).simulated else str(spec)
             for spec in cfg.backends]
    rates, caps = _plan_rates(cfg, state, strategies)
    chunks = streamed_chunks(cfg, n)  # the streamed split's model where it streams (--overlap, the default)
    copies = _plan_copies(cfg, state)
    predictions, even = {}, {}
    for s in strategies:
        dim = plan.dim_of(s, m, n, k)
        weights = ([1.0] * ranks if cfg.weights.kind == "even" else list(cfg.weights.values)
                   if cfg.weights.kind == "list" else rates[s])
        predictions[s] = plan.predict(s, m, n, k, itemsize, plan.shares(weights, dim, caps[s]), rates[s],
                                      links, ROOT, chunks=chunks, copies=copies)
        even[s] = plan.predict(s, m, n, k, itemsize, plan.shares([1.0] * ranks, dim, caps[s]), rates[s], links,
                               ROOT, chunks=chunks, copies=copies)
    strategy = plan.fastest(predictions)
    chosen, even_chosen = predictions[strategy], even[strategy]
    best = {s: plan.best_root_share(s, m, n, k, itemsize, rates[s], links, caps[s], ROOT, chunks=chunks,
                                    copies=copies) for s in strategies}
    best_strategy = plan.fastest(best)
    total = gemm.flops(m, n, k)
    sum_rates = sum(rates[strategy])
    summary = {
        "plan": True, "timing": "modelled", "strategy": strategy, "strategy_given": cfg.strategy,
        "weights_kind": cfg.weights.kind, "ranks": ranks, "total_gemm_flops": total,
        "sum_solo_gflops": sum_rates / 1e9, "parts": list(chosen.parts),
        "predicted_seconds": chosen.seconds, "predicted_gflops": total / chosen.seconds / 1e9,
        "predicted_efficiency_end_to_end": total / chosen.seconds / sum_rates if sum_rates else None,
        "predicted_efficiency_compute": total / max(chosen.compute_seconds) / sum_rates if sum_rates else None,
        "even_predicted_seconds": even_chosen.seconds, "even_parts": list(even_chosen.parts),
        "predicted_speedup_over_even": even_chosen.seconds / chosen.seconds,
        "link_gbit_per_s": gbit, "link_latency_us": latency_us, "overlap": chunks is not None, "chunks": chunks,
        "copies_gbps": None if copies is None else [None if c is None else c / 1e9 for c in copies],
        "predictions": {s: p.to_dict() for s, p in predictions.items()},
        "even_predictions": {s: p.to_dict() for s, p in even.items()},
        "model_best": {"strategy": best_strategy, **best[best_strategy].to_dict(),
                       "root_share_percent": 100.0 * best[best_strategy].parts[ROOT]
                       / plan.dim_of(best_strategy, m, n, k)},
        "verified": None,
    }
    out_rows = _plan_rows(cfg, strategy, chosen, names, rates[strategy], link, latency_us)
    return RankRun(None, {}, [], [], {"rows": out_rows, "summary": summary})


def _plan_rates(cfg: Any, state: SplitState,
                strategies: list[str]) -> tuple[dict[str, list[float]], dict[str, list[int | None]]]:
    """--plan: per strategy every rank's rate (the profile's, or its simulated device's model at the even part's
    shape) and the cap on its part (from the profile's free memory, or the device model's memory)."""
    m, n, k = cfg.m, cfg.n, cfg.k
    itemsize = cfg.dtype.itemsize
    rates: dict[str, list[float]] = {}
    caps: dict[str, list[int | None]] = {}
    for s in strategies:
        hint = -(-plan.dim_of(s, m, n, k) // len(cfg.backends))
        if state.profile is not None:
            rates[s] = list(state.profile.rates)
            caps[s] = [plan.max_part(s, m, n, k, itemsize, f) for f in state.profile.free_bytes]
        else:
            rates[s] = [plan.sim_rate(spec.model, s, m, n, k, cfg.dtype.name, hint) for spec in cfg.backends]
            caps[s] = [plan.max_part(s, m, n, k, itemsize, sim.get_model(spec.model).memory_bytes)
                       for spec in cfg.backends]
    return rates, caps


def _plan_copies(cfg: Any, state: SplitState) -> list[float | None] | None:
    """--plan: a simulated device's copies at its model's host link (a profile's devices: not modelled)."""
    if state.profile is not None:
        return None
    return [COPY_PROBE_BYTES / sim.transfer_model_seconds(sim.get_model(spec.model), COPY_PROBE_BYTES)
            if capabilities(spec.name).simulated else None for spec in cfg.backends]


def _plan_rows(cfg: Any, strategy: str, chosen: Any, names: list[str], rates: list[float], link: Any,
               latency_us: float) -> list[dict[str, Any]]:
    """--plan: one row per rank of the chosen split's prediction (its part, modelled rate, compute and idle)."""
    m, n, k = cfg.m, cfg.n, cfg.k
    dim = plan.dim_of(strategy, m, n, k)
    slowest = max(chosen.compute_seconds)
    out_rows = []
    for r, spec in enumerate(cfg.backends):
        part = chosen.parts[r]
        out_rows.append({
            "split": "plan", "strategy": strategy, "rank": r, "backend": str(spec), "device": names[r],
            "device_timing": "modelled", "dtype": cfg.dtype.name, "m": m, "n": n, "k": k, "part": part,
            "share_percent": 100.0 * part / dim, "gemm_flops": flops_of(strategy, m, n, k, part),
            "solo_gflops": rates[r] / 1e9, "compute_seconds_median": chosen.compute_seconds[r],
            "idle_seconds_median": slowest - chosen.compute_seconds[r],
            "link_gbps": None if r == ROOT else link.bytes_per_s / 1e9,
            "link_latency_us": None if r == ROOT else latency_us,
        })
    return out_rows
