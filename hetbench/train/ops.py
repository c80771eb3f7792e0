"""One rank's device for the training math: GEMMs on the rank's backend, host NumPy arrays in and out.

The model's elementwise work (bias, ReLU, residual adds, the loss, the optimizers) stays in NumPy on the host;
only the GEMMs go to the device. Ops keeps three clocks, reset at every step:
- compute_seconds: the device time of the GEMMs, from backend.timer() (measured; modelled on a sim device);
- copy_seconds: the device time of the host<->device copies around them (0 on the host backend, which needs none);
- wall_seconds: the host's wall time inside matmul() altogether, so a step can tell its own elementwise time apart
  (and, on a simulated device, replace the emulation's wall time with the modelled times).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from hetbench.backends.base import TIMING_MODELLED
from hetbench.dtypes import DType, get_dtype


class Ops:
    """GEMMs on one backend. `dtype` is what the device computes in; fp32 only this session."""

    def __init__(self, backend: Any, dtype: DType | str = "fp32") -> None:
        self.backend = backend
        self.dtype = get_dtype(dtype) if isinstance(dtype, str) else dtype
        if self.dtype.name != "fp32":
            raise ValueError(f"training computes in fp32 only for now, not {self.dtype.name}")
        self.modelled = getattr(backend, "timing", None) == TIMING_MODELLED
        # the host backend computes on the arrays as they are: no copies, nothing to upload
        self._direct = getattr(backend, "name", None) == "host"
        self.compute_seconds = 0.0
        self.copy_seconds = 0.0
        self.wall_seconds = 0.0
        self.gemms = 0
        self.flops = 0
        # called after every GEMM when set: fsdp's prefetch tests its pending gather there, so that MPI moves the
        # next layer's parameters between the GEMMs of this one (an MPI library without a progress thread moves
        # data only inside MPI calls)
        self.poll: Callable[[], Any] | None = None

    def reset(self) -> None:
        self.compute_seconds = 0.0
        self.copy_seconds = 0.0
        self.wall_seconds = 0.0
        self.gemms = 0
        self.flops = 0

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a @ b (2-D, float32) computed on the device; a new host array."""
        t0 = time.perf_counter()
        host = self.dtype.host
        a = np.ascontiguousarray(a, dtype=host)
        b = np.ascontiguousarray(b, dtype=host)
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2:
            raise ValueError(f"matmul shapes do not fit: {a.shape} @ {b.shape}")
        if m == 0 or n == 0 or k == 0:  # a rank with no samples: nothing to send to a device
            out = np.zeros((m, n), dtype=host)
            self.wall_seconds += time.perf_counter() - t0
            return out
        backend, dtype = self.backend, self.dtype
        if self._direct:
            out = np.empty((m, n), dtype=host)
            with backend.timer() as t:
                backend.matmul(a, b, out, dtype)
            self.compute_seconds += t.seconds
        else:
            with backend.timer() as up:
                da = backend.upload(a, dtype)
                db = backend.upload(b, dtype)
                dc = backend.empty((m, n), dtype)
            with backend.timer() as t:
                backend.matmul(da, db, dc, dtype)
            with backend.timer() as down:
                out = backend.download(dc, dtype)
            del da, db, dc
            self.compute_seconds += t.seconds
            self.copy_seconds += up.seconds + down.seconds
        self.gemms += 1
        self.flops += 2 * m * n * k
        self.wall_seconds += time.perf_counter() - t0
        if self.poll is not None:  # outside the GEMM's clocks: the caller's MPI progress (fsdp's prefetch)
            self.poll()
        return out


def HostOps(dtype: DType | str = "fp32", threads: int | None = None) -> Ops:
    """Ops on the host backend (NumPy's BLAS): the reference's and the unit tests' device."""
    from hetbench.backends.host import HostBackend

    return Ops(HostBackend(threads), dtype)
