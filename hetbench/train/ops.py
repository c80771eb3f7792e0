"""One rank's device for the training math: its GEMMs on the rank's backend, and where the rank's arrays live.

Where the training state lives (`resident`):
- On a GPU with an array library (CuPy: backend.array_module), everything does: parameters, gradients, optimizer
  state and activations are the library's arrays, the forward, backward and optimizer run in it (model.py and
  optim.py are written against the arrays' own module, hetbench.dtypes.array_module), and only the batch comes
  up from the host. MPI then moves either the device arrays themselves (`--path device`, a GPU-aware MPI) or
  host copies of them (`--path host`: to_host before, to_device / copy_into after, the copies timed as
  communication).
- Elsewhere in host memory: NumPy arrays. On the host backend (and a simulated GPU, whose memory is the host's)
  the GEMMs read them as they are; on an OpenCL device, whose buffers no array library here computes on, each GEMM
  uploads its operands and downloads its result (copy_seconds). MPI takes these arrays directly on either path.

Ops keeps three clocks, reset at every step:
- compute_seconds: the device time of the GEMMs, from backend.timer() (measured; modelled on a sim device);
- copy_seconds: the device time of the host<->device copies (0 on the host backend, which needs none);
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
    module docstring); `native` whether the device does that itself, `gemm_dtype` the dtype its GEMM runs in.
    `resident` (default: the backend has an array library other than NumPy) keeps the training state on the
    device; True on the host backend makes the host's arrays stand for device arrays, with real copies at every
    move (what a test of the staging takes)."""

    def __init__(self, backend: Any, dtype: DType | str = "fp32", resident: bool | None = None) -> None:
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
        module = getattr(backend, "array_module", None)
        self.xp: Any = module if module is not None else np
        self.resident = bool(resident) if resident is not None else self.xp is not np
        if self.resident and not (self.xp is not np or self._direct):
            raise ValueError(f"{getattr(backend, 'name', backend)}'s arrays are not NumPy's: the training state "
                             "cannot live on it")
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

    # where the arrays live: on a resident device these copy (timed), elsewhere they hand the array back

    def to_device(self, host: np.ndarray) -> Any:
        """A float32 host array as the training state's array (a device copy where resident)."""
        if not self.resident:
            return host
        with self.backend.timer() as t:
            out = self.backend.upload(np.ascontiguousarray(host, dtype=np.float32), _FP32)
        self.copy_seconds += t.seconds
        return out

    def to_host(self, array: Any) -> np.ndarray:
        """The training state's array as a host NumPy array (a copy where resident)."""
        if not self.resident:
            return array
        self._settle()
        with self.backend.timer() as t:
            out = self.backend.download(array, _FP32)
        self.copy_seconds += t.seconds
        return out

    def copy_into(self, array: Any, host: np.ndarray) -> None:
        """array[...] = host, `array` being the training state's (on the device where resident)."""
        if not self.resident:
            if array is not host:
                array[...] = host
            return
        with self.backend.timer() as t:
            array[...] = self.backend.upload(np.ascontiguousarray(host, dtype=np.float32), _FP32)
        self.copy_seconds += t.seconds

    def empty(self, shape: Any) -> Any:
        """A float32 array where the training state lives."""
        return self.xp.empty(shape, dtype=self.xp.float32)

    def mpi_ready(self) -> None:
        """Before MPI reads or writes a resident array: the device's work on it is done."""
        if self.resident:
            self._settle()
            self.backend.synchronize()

    def _settle(self) -> None:
        """The training math's array work runs on the array library's current stream, the backend's GEMMs and
        copies on its own (non-blocking) stream, which does not wait for it: wait here for the current stream
        before a GEMM or a copy reads what it wrote (each GEMM and copy is itself waited for by its timer)."""
        if self.resident and self.xp is not np:
            self.xp.cuda.get_current_stream().synchronize()

    def keep(self, h: np.ndarray) -> np.ndarray:
        """An activation as a layer keeps it for its backward: in the compute dtype (fp16 as float16, bf16 as
        float32 holding bf16 values: NumPy has no bf16), under fp32 the array itself. The GEMMs that read it
        round it to the compute dtype anyway, so keeping it rounded changes no result."""
        return to_host_dtype(h, self.dtype) if self.mixed else h

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a @ b (2-D, float32) computed on the device: a new array where the training state lives (float32;
        under mixed precision holding the compute dtype's values, round(round(a) @ round(b)) with fp32
        accumulation, natively in the dtype or emulated: module docstring)."""
        t0 = time.perf_counter()
        xp, dtype, gemm = self.xp, self.dtype, self.gemm_dtype
        if self.mixed:
            a = to_host_dtype(a, dtype)  # fp16: float16; bf16: float32 rounded to bf16
            b = to_host_dtype(b, dtype)
            if not self.native:
                a = xp.ascontiguousarray(a, dtype=xp.float32)
                b = xp.ascontiguousarray(b, dtype=xp.float32)
        else:
            a = xp.ascontiguousarray(a, dtype=dtype.host)
            b = xp.ascontiguousarray(b, dtype=dtype.host)
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2:
            raise ValueError(f"matmul shapes do not fit: {a.shape} @ {b.shape}")
        if m == 0 or n == 0 or k == 0:  # a rank with no samples: nothing to send to a device
            self.wall_seconds += time.perf_counter() - t0
            return xp.zeros((m, n), dtype=xp.float32)
        backend = self.backend
        if self._direct or self.resident:  # the operands are the device's own arrays
            self._settle()
            out = backend.empty((m, n), gemm)
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
        if self.mixed:  # native: already the dtype's values (fp16 widened exactly); emulated: the fp32 result rounded
            out = round_to_dtype(out, dtype)
        self.wall_seconds += time.perf_counter() - t0
        if self.poll is not None:  # outside the GEMM's clocks: the caller's MPI progress (fsdp's prefetch)
            self.poll()
        return out


_FP32 = get_dtype("fp32")


def HostOps(dtype: DType | str = "fp32", threads: int | None = None) -> Ops:
    """Ops on the host backend (NumPy's BLAS): the reference's and the unit tests' device."""
    from hetbench.backends.host import HostBackend

    return Ops(HostBackend(threads), dtype)
