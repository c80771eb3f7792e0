"""Measurements that `hetbench split` weighs its slices with, and that `hetbench calibrate` saves: each rank's link
to the root (ping-pong over MPI) and the GEMM rate of its device at a slice's shape.

link_to_root is collective; gemm_rate and measure_gemm are one rank's own work (they touch no MPI).

Slices, as hetbench/harness/split_plan.py names them: strategy "rows" gives a rank `part` whole rows of A (a
part x n x k product), strategy "k" gives it `part` columns of A and the matching rows of B (an m x n x part
product).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetbench.harness.split_plan import STRATEGIES, Link, dim_of
from hetbench.harness import gemm, verify
from hetbench.dtypes import DType, get_dtype
from hetbench.harness.timing import time_repeats

FIRST_PART = 64  # the doubling of a GEMM measurement starts at this many rows (or columns)
LATENCY_BYTES = 8  # the message the latency is measured with
# The latency's round trips come after a warm-up of at least this many round trips lasting at least this long: right
# after start-up the first round trips carry the connection's set-up (each many times a settled one, then a few
# stalls), and a warm-up counted in round trips alone would be over in a fraction of a millisecond on a fast link
LATENCY_WARMUP_ROUND_TRIPS = 10
LATENCY_WARMUP_SECONDS = 0.01
LATENCY_ROUND_TRIPS = 50  # timed after the warm-up; the latency is their median (a few slow ones do not move it)
_TAG = 0x4842  # the ping-pong's messages, apart from any other traffic


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _ping_pong(comm: Any, peer: int, buf: np.ndarray, repeat: int, initiator: bool) -> list[float]:
    """One warm-up and `repeat` timed round trips of `buf` with `peer`. The initiator sends first and returns each
    round trip's half (seconds); the other side answers and returns []."""
    halves: list[float] = []
    for i in range(repeat + 1):
        if initiator:
            start = time.perf_counter()
            comm.Send(buf, dest=peer, tag=_TAG)
            comm.Recv(buf, source=peer, tag=_TAG)
            elapsed = time.perf_counter() - start
            if i > 0:
                halves.append(elapsed / 2)
        else:
            comm.Recv(buf, source=peer, tag=_TAG)
            comm.Send(buf, dest=peer, tag=_TAG)
    return halves


def _latency_ping_pong(comm: Any, peer: int, buf: np.ndarray, initiator: bool) -> list[float]:
    """The small message's round trips with `peer`: the warm-up (at least LATENCY_WARMUP_ROUND_TRIPS round trips and
    LATENCY_WARMUP_SECONDS), then LATENCY_ROUND_TRIPS timed ones. The initiator decides when the warm-up ends and
    says so in the message itself (its first byte 1 while the warm-up goes on, 0 in its last round trip), so the
    other side needs no clock of its own; it answers and returns [], the initiator returns each timed round trip's
    half (seconds)."""
    if initiator:
        start, done = time.perf_counter(), 0
        while True:
            done += 1
            last = done >= LATENCY_WARMUP_ROUND_TRIPS and time.perf_counter() - start >= LATENCY_WARMUP_SECONDS
            buf[0] = 0 if last else 1
            comm.Send(buf, dest=peer, tag=_TAG)
            comm.Recv(buf, source=peer, tag=_TAG)
            if last:
                break
        halves = []
        for _ in range(LATENCY_ROUND_TRIPS):
            begin = time.perf_counter()
            comm.Send(buf, dest=peer, tag=_TAG)
            comm.Recv(buf, source=peer, tag=_TAG)
            halves.append((time.perf_counter() - begin) / 2)
        return halves
    while True:
        comm.Recv(buf, source=peer, tag=_TAG)
        comm.Send(buf, dest=peer, tag=_TAG)
        if buf[0] == 0:
            break
    for _ in range(LATENCY_ROUND_TRIPS):
        comm.Recv(buf, source=peer, tag=_TAG)
        comm.Send(buf, dest=peer, tag=_TAG)
    return []


def link_to_root(world: Any, root: int = 0, nbytes: int = 4 * 2**20, repeat: int = 5) -> Link | None:
    """Collective: this rank's Link to the root, None on the root.

    The root ping-pongs with every other rank in turn (the others wait in their receive from the root): first
    LATENCY_BYTES-byte messages, whose half round trip's median over LATENCY_ROUND_TRIPS round trips after a
    warm-up (_latency_ping_pong) is the latency, then `nbytes` messages, whose bandwidth is nbytes / (half round
    trip - latency), median over `repeat` round trips after one untimed one (the half round trip alone where it is
    not above the latency). Host buffers (NumPy); the root times, then hands each rank its figures. `world` is a
    hetbench World or an mpi4py communicator."""
    comm = getattr(world, "comm", world)
    rank, size = comm.Get_rank(), comm.Get_size()
    if not 0 <= root < size:
        raise ValueError(f"root {root} is not a rank of this job; ranks are 0..{size - 1}")
    if nbytes < 1 or repeat < 1:
        raise ValueError(f"link_to_root needs nbytes >= 1 and repeat >= 1, got nbytes={nbytes}, repeat={repeat}")
    small = np.zeros(LATENCY_BYTES, dtype=np.uint8)
    large = np.zeros(nbytes, dtype=np.uint8)
    figures: list[tuple[float, float] | None] | None = None
    if rank == root:
        figures = [None] * size
        for peer in range(size):
            if peer == root:
                continue
            latency = _median(_latency_ping_pong(comm, peer, small, initiator=True))
            rates = [nbytes / (half - latency) if half > latency else nbytes / half
                     for half in _ping_pong(comm, peer, large, repeat, initiator=True)]
            figures[peer] = (_median(rates), latency)
    else:
        _latency_ping_pong(comm, root, small, initiator=False)
        _ping_pong(comm, root, large, repeat, initiator=False)
    mine = comm.scatter(figures, root=root)
    return None if mine is None else Link(bytes_per_s=mine[0], latency_s=mine[1])


COPY_PROBE_BYTES = 16 * 2**20  # the buffer a device's host <-> device copy rate is measured with
COPY_PROBE_REPEAT = 3


def copy_rate(backend: Any, dtype: DType | str, computes_on_host: bool, nbytes: int = COPY_PROBE_BYTES,
              repeat: int = COPY_PROBE_REPEAT) -> float | None:
    """This rank's copy rate between the host and its device, bytes/s: a buffer of `nbytes` uploaded and
    downloaded `repeat` times after one untimed round, each round's 2 x nbytes over its two copies' times (the
    backend's timer: device events, or a simulated device's model), their median. None where the device computes
    on host arrays (the host backend: nothing is copied). One rank's own work (no MPI)."""
    if computes_on_host:
        return None
    dt = _as_dtype(dtype)
    count = max(1, nbytes // dt.itemsize)
    host = np.ones(count, dtype=dt.host)
    rates = []
    for i in range(repeat + 1):
        with backend.timer() as up:
            on_device = backend.upload(host, dt)
        with backend.timer() as down:
            backend.download(on_device, dt)
        del on_device
        seconds = up.seconds + down.seconds
        if i > 0 and seconds > 0:
            rates.append(2 * count * dt.itemsize / seconds)
    return _median(rates) if rates else None


def slice_shape(strategy: str, m: int, n: int, k: int, part: int) -> tuple[int, int, int]:
    """The (m, n, k) of the GEMM a rank does for `part` of C = A (m x k) @ B (k x n): part x n x k for rows,
    m x n x part for k."""
    if strategy == "rows":
        return part, n, k
    if strategy == "k":
        return m, n, part
    raise ValueError(f"unknown strategy {strategy!r}; accepted: {', '.join(STRATEGIES)}")


@dataclass(frozen=True)
class GemmMeasurement:
    """One rank's GEMM at a slice's shape: how the part was found, and the timed runs at it."""

    strategy: str
    m: int  # the whole product's shape; the slice's is slice_shape(strategy, m, n, k, part)
    n: int
    k: int
    part: int  # the rows (rows) or columns of A (k) timed
    seconds: tuple[float, ...]  # every timed run at `part` (backend timer: measured, or modelled on sim)
    probes: tuple[tuple[int, float], ...]  # (part, seconds of one GEMM) of every step of the doubling
    timing: str  # the backend's: "measured" or "modelled"
    verified: bool | None = None  # Freivalds' check of the last product, where asked for
    max_residual_over_tolerance: float | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return slice_shape(self.strategy, self.m, self.n, self.k, self.part)

    @property
    def flops(self) -> int:
        return gemm.flops(*self.shape)

    @property
    def seconds_median(self) -> float:
        return _median(list(self.seconds))

    @property
    def rate(self) -> float:
        """flop/s of the slice's GEMM, from the median of the timed runs."""
        return self.flops / self.seconds_median


def _as_dtype(dtype: DType | str) -> DType:
    return get_dtype(dtype) if isinstance(dtype, str) else dtype


def _check_measure_args(strategy: str, m: int, n: int, k: int, max_part: int, min_seconds: float,
                        repeat: int) -> None:
    """ValueError for measure_gemm's arguments out of range: an unknown strategy, a dimension < 1, no part to
    time, min_seconds not a finite number > 0, repeat < 1."""
    dim_of(strategy, m, n, k)  # the strategy is known
    if min(m, n, k) < 1:
        raise ValueError(f"the shape {m}x{n}x{k} must have every dimension >= 1")
    if max_part < 1:
        raise ValueError(f"max_part {max_part} leaves no part to time; it must be >= 1")
    if not (isinstance(min_seconds, (int, float)) and math.isfinite(min_seconds) and min_seconds > 0):
        raise ValueError(f"min_seconds {min_seconds!r} must be a finite number > 0")
    if repeat < 1:
        raise ValueError(f"repeat {repeat} must be >= 1")


def measure_gemm(backend: Any, dtype: DType | str, strategy: str, m: int, n: int, k: int, max_part: int,
                 min_seconds: float = 0.1, repeat: int = 3, seed: int = 0, check: bool = False) -> GemmMeasurement:
    """This rank alone (not collective): time its GEMM of a slice's shape.

    The part starts at min(FIRST_PART, max_part, dim) and doubles (capped at max_part and at the dimension the
    strategy slices) until one GEMM, by the backend's timer, takes >= min_seconds or the cap is reached; the
    first part gets one untimed run first (a first call's set-up), and the last probe is the warm-up of the
    `repeat` timed runs that follow at the part found. Inputs from gemm.generate_inputs(seed, 0, ...), made anew
    for every part and freed before the next. With `check`, the last product is checked against its inputs
    (Freivalds). ValueError for arguments out of range."""
    dtype = _as_dtype(dtype)
    _check_measure_args(strategy, m, n, k, max_part, min_seconds, repeat)
    cap = min(max_part, dim_of(strategy, m, n, k))
    part = min(FIRST_PART, cap)
    probes: list[tuple[int, float]] = []
    while True:
        pm, pn, pk = slice_shape(strategy, m, n, k, part)
        a, b = gemm.generate_inputs(seed, 0, pm, pn, pk, dtype)
        a_dev, b_dev = backend.upload(a, dtype), backend.upload(b, dtype)
        c_dev = backend.empty((pm, pn), dtype)

        def run() -> None:
            backend.matmul(a_dev, b_dev, c_dev, dtype)

        if not probes:
            time_repeats(backend, run, 1, 0)
        (probe,) = time_repeats(backend, run, 0, 1)
        probes.append((part, probe))
        if probe >= min_seconds or part >= cap:
            break
        a = b = a_dev = b_dev = c_dev = None  # freed before the next part's are made
        part = min(2 * part, cap)
    seconds = time_repeats(backend, run, 0, repeat)
    verdict = None
    if check:
        c = backend.download(c_dev, dtype)
        a_dev = b_dev = c_dev = None
        verdict = verify.freivalds(a, b, c, dtype, seed)
    a = b = a_dev = b_dev = c_dev = None
    if not all(s > 0 and math.isfinite(s) for s in seconds):
        raise RuntimeError(f"the device timer gave {seconds} for a {pm}x{pn}x{pk} GEMM; a rate needs times > 0")
    return GemmMeasurement(strategy, m, n, k, part, tuple(seconds), tuple(probes), backend.timing,
                           None if verdict is None else verdict.ok,
                           None if verdict is None else verdict.max_residual_over_tolerance)


def gemm_rate(backend: Any, dtype: DType | str, strategy: str, m: int, n: int, k: int, max_part: int,
              min_seconds: float = 0.1, repeat: int = 3, seed: int = 0) -> tuple[float, int]:
    """This rank alone (not collective): (flop/s, part) of its GEMM at a slice's shape (see measure_gemm)."""
    measured = measure_gemm(backend, dtype, strategy, m, n, k, max_part, min_seconds, repeat, seed)
    return measured.rate, measured.part
