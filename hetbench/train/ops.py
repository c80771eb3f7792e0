"""One rank's device for the training math: GEMMs on the rank's backend, host NumPy arrays in and out.

The model's elementwise work (bias, ReLU, residual adds, the loss, the optimizers) stays in NumPy on the host;
only the GEMMs go to the device. Ops keeps three clocks, reset at every step:
- compute_seconds: the device time of the GEMMs, from backend.timer() (measured; modelled on a sim device);
- copy_seconds: the device time of the host<->device copies around them (0 on the host backend, which needs none);
- wall_seconds: the host's wall time inside matmul() altogether, so a step can tell its own elementwise time apart
  (and, on a simulated device, replace the emulation's wall time with the modelled times).

Mixed precision (dtype fp16 or bf16; see precision.py): matmul's operands are rounded to the dtype and its
result is rounded to it (the device accumulates in fp32, as tensor cores and matrix cores do), returned as float32
holding the dtype's values. How the GEMM runs (`native`):
- native: the device offers the dtype (info().dtypes) and computes it in hardware: the operands go up in the
  dtype, the backend's own GEMM in the dtype (a simulated device models its time at the dtype's rate).
- emulated: otherwise (bf16 on most devices, fp16 on PoCL without cl_khr_fp16), and always on the host backend:
  the operands rounded on the host, the GEMM in fp32 on the device, the result rounded on the host. Its time is
  the fp32 GEMM's (a simulated device models the fp32 rate): emulation never claims the reduced dtype's speed.
  The host backend lists fp16, but NumPy's float16 matmul is a loop without BLAS: measured here (1 thread, batch
  64) 73 us against 10 us for the fp32 BLAS GEMM and the rounding at hidden 16, 1.2 ms against 24 us at hidden
  64; and NumPy's loop rounds differently from a device accumulating in fp32. So the host emulates.
The two paths give the same values up to the fp32 accumulation's order (a simulated device's native half GEMM is
exactly the emulation).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from hetbench.backends.base import TIMING_MODELLED
from hetbench.dtypes import DType, get_dtype, round_to_dtype, to_host_dtype
from hetbench.train.precision import is_mixed, train_dtype


class Ops:
    """GEMMs on one backend. `dtype` is what the GEMMs compute in: fp32, or fp16/bf16 (mixed precision: see the
    module docstring); `native` whether the device does that itself, `gemm_dtype` the dtype its GEMM runs in."""

    def __init__(self, backend: Any, dtype: DType | str = "fp32") -> None:
        self.backend = backend
        self.dtype = train_dtype(dtype)
        self.mixed = is_mixed(self.dtype)
        info = backend.info() if hasattr(backend, "info") else None
        offered = tuple(info.dtypes) if info is not None else ("fp32",)
        self.native = not self.mixed or (self.dtype.name in offered and getattr(backend, "name", None) != "host")
        self.gemm_dtype = self.dtype if self.native else get_dtype("fp32")
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

    @property
    def compute_path(self) -> str:
        """"native" or "emulated" (see the module docstring); fp32 is native everywhere."""
        return "native" if self.native else "emulated"

    def keep(self, h: np.ndarray) -> np.ndarray:
        """An activation as a layer keeps it for its backward: in the compute dtype (fp16 as float16, bf16 as
        float32 holding bf16 values: NumPy has no bf16), under fp32 the array itself. The GEMMs that read it
        round it to the compute dtype anyway, so keeping it rounded changes no result."""
        return to_host_dtype(h, self.dtype) if self.mixed else h

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a @ b (2-D, float32) computed on the device; a new host array (float32; under mixed precision holding
        the compute dtype's values)."""
        t0 = time.perf_counter()
        if self.mixed:
            out = self._mixed_matmul(a, b)
            self.wall_seconds += time.perf_counter() - t0
            return out
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

    def _mixed_matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """round(round(a) @ round(b)) with fp32 accumulation; natively in the dtype or emulated (module docstring)."""
        dtype, gemm = self.dtype, self.gemm_dtype
        a = to_host_dtype(a, dtype)  # fp16: float16; bf16: float32 rounded to bf16
        b = to_host_dtype(b, dtype)
        if not self.native:
            a = np.ascontiguousarray(a, dtype=np.float32)
            b = np.ascontiguousarray(b, dtype=np.float32)
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2:
            raise ValueError(f"matmul shapes do not fit: {a.shape} @ {b.shape}")
        if m == 0 or n == 0 or k == 0:
            return np.zeros((m, n), dtype=np.float32)
        backend = self.backend
        if self._direct:
            out = np.empty((m, n), dtype=gemm.host)
            with backend.timer() as t:
                backend.matmul(a, b, out, gemm)
            self.compute_seconds += t.seconds
        else:
            with backend.timer() as up:
                da = backend.upload(a, gemm)
                db = backend.upload(b, gemm)
                dc = backend.empty((m, n), gemm)
            with backend.timer() as t:
                backend.matmul(da, db, dc, gemm)
            with backend.timer() as down:
                out = backend.download(dc, gemm)
            del da, db, dc
            self.compute_seconds += t.seconds
            self.copy_seconds += up.seconds + down.seconds
        self.gemms += 1
        self.flops += 2 * m * n * k
        # native: already the dtype's values (fp16 widened exactly); emulated: the fp32 GEMM's result rounded
        return round_to_dtype(out, dtype)


def HostOps(dtype: DType | str = "fp32", threads: int | None = None) -> Ops:
    """Ops on the host backend (NumPy's BLAS): the reference's and the unit tests' device."""
    from hetbench.backends.host import HostBackend

    return Ops(HostBackend(threads), dtype)
