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
from typing import Any, Callable

import numpy as np


@dataclass
class StepLog:
    """One rank, one step."""

    step: int  # the global step index (start_step + i)
    loss: float  # the GLOBAL loss of this step's batch, before the update; the same on every rank
    step_seconds: float  # the step's wall time; on a rank whose device is simulated, the host's time spent
    #                      emulating its GEMMs (and copies) is replaced by their modelled device time
    compute_seconds: float  # device GEMM time (measured, or modelled on sim) + the host's elementwise work
    comm_seconds: float  # MPI data movement once every rank has arrived, + host<->device copies
    idle_seconds: float  # step - compute - comm (>= 0): mostly waiting for slower ranks before each collective
    samples: int  # this rank's samples this step (pipeline: the global batch on every stage)
    param_bytes: int  # parameters held by this rank at the step's peak
    grad_bytes: int  # gradients held at the peak
    optimizer_bytes: int  # optimizer state held
    modelled: bool = False  # True where compute (and so step) seconds come from a simulated device's model

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainOutcome:
    logs: list[StepLog]  # this rank's, one per step
    params: list[tuple[np.ndarray, np.ndarray]] | None  # the full final [(W_l, b_l)], at rank 0 only
    details: dict[str, Any] = field(default_factory=dict)  # strategy facts (shares, bucket size, ...)


class StepClock:
    """Times one rank's step. Wrap each MPI call in `comm(fn)`, which first waits at a barrier (counted as idle:
    the time this rank waits for the slowest one to arrive) and then runs the call (counted as communication).
    Everything else the step's wall time holds, less the time inside `ops`, is the host's own elementwise work
    (counted as compute). `finish()` returns (step, compute, comm, idle) seconds with idle = step - compute - comm.

    With `wait_first=False` no barrier is taken: waiting then shows up inside the collective, as communication.
    """

    def __init__(self, ops: Any, comm: Any, wait_first: bool = True) -> None:
        self.ops = ops
        self.mpi = comm
        self.wait_first = wait_first and comm is not None and comm.Get_size() > 1
        self.start()

    def start(self) -> None:
        self.ops.reset()
        self.wait_seconds = 0.0
        self.mpi_seconds = 0.0
        self._t0 = time.perf_counter()

    def comm(self, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        if self.wait_first:
            self.mpi.Barrier()
        t1 = time.perf_counter()
        out = fn()
        t2 = time.perf_counter()
        self.wait_seconds += t1 - t0
        self.mpi_seconds += t2 - t1
        return out

    def finish(self) -> tuple[float, float, float, float]:
        wall = time.perf_counter() - self._t0
        ops = self.ops
        host_work = max(0.0, wall - ops.wall_seconds - self.wait_seconds - self.mpi_seconds)
        compute = ops.compute_seconds + host_work
        comm = self.mpi_seconds + ops.copy_seconds
        if ops.modelled:
            # the host's wall time inside ops emulated the device: its modelled times stand for it
            step = wall - ops.wall_seconds + ops.compute_seconds + ops.copy_seconds
        else:
            step = wall
        idle = step - compute - comm
        if idle < 0.0:  # only float rounding, or a device timer that exceeds the host's wall time around it
            step, idle = compute + comm, 0.0
        return step, compute, comm, idle
