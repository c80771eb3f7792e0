"""`hetbench train`'s core: a deep residual MLP trained on a synthetic teacher task, by one process (reference.py)
or by MPI ranks of unequal speed (data_parallel.py: ddp, fsdp; pipeline.py: pipeline), each rank's GEMMs on its own
device (ops.py).

This module holds what every strategy shares: the per-step log record (StepLog), a strategy's result
(TrainOutcome), and StepClock, which splits one rank's step into compute, communication and idle seconds the same
way for every strategy.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from hetbench.harness.split_plan import shares
from hetbench.train.precision import LossScaler


@dataclass
class StepLog:
    """One rank, one step."""

    step: int  # the global step index (start_step + i)
    loss: float  # the GLOBAL loss of this step's batch, before the update; the same on every rank
    step_seconds: float  # the step's wall time; on a rank whose device is simulated, the host's time spent
    #                      emulating its GEMMs (and copies) is replaced by their modelled device time
    compute_seconds: float  # device GEMM time (measured, or modelled on sim) + the host's elementwise work
    comm_seconds: float  # MPI data movement once every rank has arrived, + host<->device copies
    idle_seconds: float  # step - compute - comm (>= 0): waiting for the slowest rank before each MPI call
    samples: int  # this rank's samples this step (pipeline: the global batch on every stage)
    param_bytes: int  # parameters held by this rank at the step's peak
    grad_bytes: int  # gradients held at the peak
    optimizer_bytes: int  # optimizer state held
    modelled: bool = False  # True where compute (and so step) seconds come from a simulated device's model
    gather_exposed_seconds: list[float] | None = None  # fsdp with prefetch: per prefetched gather, in the order
    #                         started, the time this rank spent starting, testing and waiting for it
    loss_scale: float = 1.0  # the scale this step's backward ran with (fp16's dynamic loss scaling; else 1)
    step_skipped: bool = False  # the update was skipped: non-finite gradients somewhere (mixed precision only)
    solo_step_seconds: float | None = None  # --solo-between-steps: this rank's step alone on the whole batch,
    #                                         right after this step (the harness's, not the strategy's)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainOutcome:
    logs: list[StepLog]  # this rank's, one per step
    params: list[tuple[np.ndarray, np.ndarray]] | None  # the full final [(W_l, b_l)], at rank 0 only
    details: dict[str, Any] = field(default_factory=dict)  # strategy facts (shares, bucket size, ...)


@dataclass
class Piece:
    """A slice [start, stop) of one layer's flat vectors that this rank holds: its parameters ("param") and its
    optimizer state by name (adamw: "m", "v"). What a rank hands to a checkpoint."""

    layer: int
    start: int
    stop: int
    arrays: dict[str, np.ndarray]


class InitialState(Protocol):
    """Where a run starts other than from init_params: the full state in a shard-independent form, read by
    element ranges so each strategy takes its own slices (a checkpoint.Checkpoint, or FullState below)."""

    steps_done: int

    def read(self, name: str, layer: int, start: int, stop: int) -> np.ndarray:
        """Elements [start, stop) of layer `layer`'s flat vector `name` ("param", "m", "v"), float32, a copy."""
        ...


@dataclass
class FullState:
    """An InitialState held in memory: per layer the full flat vector of each name."""

    steps_done: int
    vectors: list[dict[str, np.ndarray]]

    def read(self, name: str, layer: int, start: int, stop: int) -> np.ndarray:
        return np.array(self.vectors[layer][name][start:stop], dtype=np.float32)


# after each step a strategy calls checkpoint(steps_done, pieces): pieces() lists this rank's Pieces (live arrays)
CheckpointHook = Callable[[int, Callable[[], list[Piece]]], None]


def load_layer_state(initial: Any, opt: Any, layer: int, start: int, stop: int) -> np.ndarray:
    """This rank's slice of layer `layer` from `initial`: the parameters returned, the optimizer state loaded."""
    opt.load_state({name: initial.read(name, layer, start, stop) for name in opt.state_names})
    return initial.read("param", layer, start, stop)


def layer_piece(layer: int, start: int, param: np.ndarray, opt: Any, to_host: Callable[[Any], Any] | None = None
                ) -> Piece:
    """This rank's piece of `layer` for a checkpoint: the parameters and optimizer state, as host arrays
    (`to_host`, e.g. Ops.to_host, copies a GPU rank's)."""
    arrays = {"param": param, **opt.state()}
    if to_host is not None:
        arrays = {name: to_host(a) for name, a in arrays.items()}
    return Piece(layer, start, start + param.size, arrays)


def on_device(ops: Any, host: np.ndarray) -> Any:
    """A host array where the rank's training state lives (Ops.to_device; the array itself without an Ops)."""
    to_device = getattr(ops, "to_device", None)
    return to_device(host) if to_device is not None else host


def host_copier(ops: Any) -> Callable[[Any], np.ndarray]:
    """The rank's arrays as host arrays: Ops.to_host (a copy on a GPU rank), or the array itself without an Ops."""
    return getattr(ops, "to_host", None) or (lambda a: a)


def compute_copy_bytes(ops: Any, hidden: int) -> int:
    """Under mixed precision, the compute-dtype copy of the one weight matrix a GEMM reads (hidden*hidden at the
    dtype's device size, 2 bytes; the host's emulation of bf16 holds it in float32, not counted); 0 under fp32,
    whose GEMMs read the float32 parameters themselves."""
    return hidden * hidden * ops.dtype.itemsize if getattr(ops, "mixed", False) else 0


def make_scaler(ops: Any, scaler: Any) -> Any:
    """`scaler` if given (e.g. restored from a checkpoint), else a fresh precision.LossScaler for ops' dtype."""
    if scaler is not None:
        return scaler
    dtype = getattr(ops, "dtype", None)
    return LossScaler.for_dtype(dtype.name if dtype is not None else "fp32")


class StepClock:
    """Times one rank's step. Wrap each MPI call in `comm(fn)`, which first waits at a barrier (counted as idle:
    the time this rank waits for the slowest one to arrive) and then runs the call (communication, with the
    host<->device copies inside ops). The rest of the step's wall time is compute: the device's GEMMs and the host's
    elementwise work. On a simulated device (ops.modelled) the host's wall time inside ops, which only emulated the
    device, is replaced by the modelled GEMM and copy times. `finish()` returns (step, compute, comm, idle) seconds,
    step = compute + comm + idle: the wall time, on a simulated device with the emulation replaced by the model.

    With `wait_first=False` (or a single rank) no barrier is taken: waiting then shows up inside the MPI calls.
    """

    def __init__(self, ops: Any, comm: Any, wait_first: bool = True) -> None:
        self.ops = ops
        self.mpi = comm
        self.wait_first = wait_first and comm is not None and comm.Get_size() > 1
        self.start()

    def start(self) -> None:
        """Start a step's clock. Where the ranks wait for each other (wait_first), they first meet at a barrier, so
        that what a rank did before the step (making its part of the batch, which takes longer for more rows) is
        not counted as another rank's idle time in the step."""
        if self.wait_first:
            self.mpi.Barrier()
        self.ops.reset()
        self.wait_seconds = 0.0
        self.mpi_seconds = 0.0
        self._t0 = time.perf_counter()

    def comm(self, fn: Callable[[], Any], wait_first: bool = True) -> Any:
        """Run the MPI call `fn`, its time counted as communication; first wait for the others at a barrier
        (idle) unless `wait_first` is False (a nonblocking call's start, test or wait: waiting for a slower rank
        then shows up inside the call, as communication)."""
        if self.wait_first and wait_first:
            t0 = time.perf_counter()
            self.mpi.Barrier()
            self.wait_seconds += time.perf_counter() - t0
        t1 = time.perf_counter()
        out = fn()
        self.mpi_seconds += time.perf_counter() - t1
        return out

    def finish(self) -> tuple[float, float, float, float]:
        wall = time.perf_counter() - self._t0
        ops = self.ops
        comm = self.mpi_seconds + ops.copy_seconds
        idle = self.wait_seconds
        if ops.modelled:
            # the host's wall time inside ops emulated the device: its modelled times stand for it
            host_work = max(0.0, wall - ops.wall_seconds - self.wait_seconds - self.mpi_seconds)
            compute = ops.compute_seconds + host_work
        else:
            # everything but waiting, MPI and copies: the device's GEMMs and the host's own work around them
            compute = max(0.0, wall - self.wait_seconds - self.mpi_seconds - ops.copy_seconds)
        step = compute + comm + idle
        # the work that grows with the rank's samples: its compute and its host<->device copies
        self.busy_seconds = compute + ops.copy_seconds
        return step, compute, comm, idle


class BatchShares:
    """The rows of the global batch each rank takes, from weights; with `rebalance_steps` > 0 (auto weights) the
    shares are measured again after each of the run's first rebalance_steps steps: every rank's rate is its
    samples over its busy seconds (compute and host<->device copies, StepClock.busy_seconds) summed over the
    rebalancing steps so far (one step's alone would swing the shares with the machine's noise), and the next
    step's shares follow those rates. The first guess (a GEMM probe) can be far off: a device's speed at one GEMM
    shape says little about a whole layer's forward and backward at another. Any shares give the same training
    run (gradients are scaled by the global batch), so the shares may change between steps; the parameter shards
    of fsdp stay as first set. Collective: after_step is called by every rank after every step."""

    def __init__(self, comm: Any, weights: list[float], batch: int, rebalance_steps: int = 0) -> None:
        self.comm, self.batch = comm, batch
        self.weights = list(weights)
        self.counts = shares(self.weights, batch)
        self.first_counts = list(self.counts)
        self.remaining = int(rebalance_steps) if comm is not None and comm.Get_size() > 1 else 0
        self.history: list[list[int]] = []
        self._measured: list[tuple[float, float]] = []  # every rank's samples and busy seconds, summed

    def after_step(self, samples: int, busy_seconds: float) -> None:
        if self.remaining <= 0:
            return
        self.remaining -= 1
        step = self.comm.allgather((samples, busy_seconds) if samples > 0 and busy_seconds > 0 else (0, 0.0))
        if not self._measured:
            self._measured = [(0.0, 0.0)] * len(step)
        self._measured = [(a + s, b + t) for (a, b), (s, t) in zip(self._measured, step)]
        rates = [s / t if s > 0 and t > 0 else None for s, t in self._measured]
        # a rank without samples (or without a measurable time) keeps its weight, scaled as the others' moved
        known = [(w, r) for w, r in zip(self.weights, rates) if r is not None and w > 0]
        if known:
            scale = sum(r for _, r in known) / sum(w for w, _ in known)
            weights = [r if r is not None else w * scale for w, r in zip(self.weights, rates)]
            counts = shares(weights, self.batch)
            # a working rank that would be left without a sample: the shares are kept
            if min(c for c, w in zip(counts, self.weights) if w > 0) >= 1:
                self.weights, self.counts = weights, counts
        # every rebalancing's shares, kept ones too: the next step's, one record per rebalancing step
        self.history.append(list(self.counts))

    def details(self) -> dict[str, Any]:
        """The shares for TrainOutcome.details: the last (batch_counts), the first, and each rebalancing's."""
        return {"batch_counts": list(self.counts), "batch_counts_first": self.first_counts,
                "batch_counts_rebalanced": self.history}
