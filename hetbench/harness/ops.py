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

Mixed precision (dtype fp16 or bf16; see hetbench/train/precision.py): matmul's operands are rounded to the dtype
and its result is rounded to it (the device accumulates in fp32, as tensor cores and matrix cores do), returned as
float32 holding the dtype's values. How the GEMM runs (`native`):
- native: the device offers the dtype (info().dtypes) and computes it in hardware: the operands go up in the
  dtype, the backend's own GEMM in the dtype (a simulated device models its time at the dtype's rate).
- emulated: otherwise (bf16 on most devices, fp16 on PoCL without cl_khr_fp16), and always on the host backend:
  the operands rounded on the host, the GEMM in fp32 on the device, the result rounded on the host. Its time is
  the fp32 GEMM's (a simulated device models the fp32 rate): emulation never claims the reduced dtype's speed.
  The host backend lists fp16, but NumPy's float16 matmul is a loop without BLAS, many times slower than the fp32
  GEMM and the rounding (docs/train.md), and it rounds differently from a device accumulating in fp32. So the host
  emulates.
The two paths give the same values up to the fp32 accumulation's order (a simulated device's native half GEMM is
exactly the emulation).

Staged operands (the torch front end's offload, hetbench/pytorch/offload.py; the numpy trainer uses matmul alone):
- stage(host, key=...) puts a host (NumPy) operand on the device once, rounded to the compute dtype as matmul
  rounds it, and hands back a Staged that gemm(a, b) takes in place of a host array, as often as needed: a
  backward reuses its forward's operands, a weight goes up once per step. On the host backend a Staged is the
  host array itself (no copy).
- gemm(a, b) is matmul for host or Staged operands, 2-D, or batched (N, m, k) @ (N, k, n): one upload of each
  whole operand, one result buffer, the N GEMMs one after another on the device (the backends' GEMM is 2-D) under
  one timer, one download. It stages through backend.upload and download wherever the training state lives (a
  CuPy backend's Ops, resident, included), and counts N GEMMs.
- A keyed Staged stays in this step's cache until reset(): staged(key, valid) finds it (cache_hits counts it)
  when `valid` accepts its `meta` (the stager's note of what it holds, e.g. a tensor's version).
- upload_bytes and download_bytes count the host<->device copies of a step (matmul's, the staged ones and the
  resident state's moves), in the device's element size, and `uploads` the uploads; all reset by reset().
"""

from __future__ import annotations

import time
from typing import Any, Callable, Hashable

import numpy as np

from hetbench.backends.base import BACKEND_NAMES, TIMING_MODELLED, capabilities
from hetbench.backends.host import HostBackend
from hetbench.dtypes import DType, get_dtype, is_mixed, round_to_dtype, to_host_dtype, train_dtype


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
        caps = capabilities(backend.name) if getattr(backend, "name", None) in BACKEND_NAMES else None
        self.native = not self.mixed or (self.dtype.name in offered and (caps is None or caps.native_low_precision))
        self.gemm_dtype = self.dtype if self.native else get_dtype("fp32")
        self.modelled = getattr(backend, "timing", None) == TIMING_MODELLED
        # the host backend computes on the arrays as they are: no copies, nothing to upload
        self._direct = caps is not None and caps.computes_on_host_arrays
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
        self.upload_bytes = 0
        self.download_bytes = 0
        self.uploads = 0
        self.cache_hits = 0
        self._cache: dict[Hashable, Staged] = {}
        # called after every GEMM when set: fsdp's prefetch tests its pending gather there, so that MPI moves the
        # next layer's parameters between the GEMMs of this one (an MPI library without a progress thread moves
        # data only inside MPI calls)
        self.poll: Callable[[], Any] | None = None

    def reset(self) -> None:
        """A new step: the clocks and counters from zero, and the staged operands' cache emptied (its device
        buffers released once nothing else holds them)."""
        self.compute_seconds = 0.0
        self.copy_seconds = 0.0
        self.wall_seconds = 0.0
        self.gemms = 0
        self.flops = 0
        self.upload_bytes = 0
        self.download_bytes = 0
        self.uploads = 0
        self.cache_hits = 0
        self._cache.clear()

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
        self._count_up(np.size(host) * 4)
        return out

    def to_host(self, array: Any) -> np.ndarray:
        """The training state's array as a host NumPy array (a copy where resident)."""
        if not self.resident:
            return array
        self._settle()
        with self.backend.timer() as t:
            out = self.backend.download(array, _FP32)
        self.copy_seconds += t.seconds
        self.download_bytes += out.size * 4
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
        self._count_up(np.size(host) * 4)

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
            self._count_up(a.size * gemm.itemsize)
            self._count_up(b.size * gemm.itemsize)
            self.download_bytes += m * n * gemm.itemsize
        self.gemms += 1
        self.flops += 2 * m * n * k
        if self.mixed:  # native: already the dtype's values (fp16 widened exactly); emulated: the fp32 result rounded
            out = round_to_dtype(out, dtype)
        self.wall_seconds += time.perf_counter() - t0
        if self.poll is not None:  # outside the GEMM's clocks: the caller's MPI progress (fsdp's prefetch)
            self.poll()
        return out

    # staged operands (module docstring): the torch front end's offload

    def _count_up(self, nbytes: int) -> None:
        self.upload_bytes += int(nbytes)
        self.uploads += 1

    def _prepared(self, host: np.ndarray) -> np.ndarray:
        """A host operand as matmul rounds it: in the dtype the device's GEMM reads, contiguous."""
        if self.mixed:
            host = to_host_dtype(np.asarray(host), self.dtype)
            return host if self.native else np.ascontiguousarray(host, dtype=np.float32)
        return np.ascontiguousarray(host, dtype=self.dtype.host)

    def _stage(self, host: np.ndarray) -> Staged:
        data = self._prepared(host)
        if self._direct:  # the host backend computes on host arrays: nothing to copy
            return Staged(data, tuple(data.shape), 0)
        with self.backend.timer() as up:
            array = self.backend.upload(data, self.gemm_dtype)
        nbytes = data.size * self.gemm_dtype.itemsize
        self.copy_seconds += up.seconds
        self._count_up(nbytes)
        return Staged(array, tuple(data.shape), nbytes)

    def stage(self, host: np.ndarray, key: Hashable = None, meta: Any = None) -> Staged:
        """`host` (a NumPy operand, 2-D or batched 3-D) on the device for gemm, rounded as matmul rounds it; the
        copy timed into copy_seconds and counted in upload_bytes. With a `key`, kept in this step's cache (until
        reset(), or until a later stage under the same key replaces it) with `meta`, for staged(key, ...)."""
        t0 = time.perf_counter()
        staged = self._stage(host)
        staged.meta = meta
        if key is not None:
            self._cache[key] = staged
        self.wall_seconds += time.perf_counter() - t0
        return staged

    def staged(self, key: Hashable, valid: Callable[[Any], bool] | None = None) -> Staged | None:
        """The operand staged under `key` this step, if there is one and `valid(its meta)` holds (a hit, counted
        in cache_hits); else None, and an entry `valid` refuses is dropped."""
        staged = self._cache.get(key)
        if staged is None:
            return None
        if valid is not None and not valid(staged.meta):
            del self._cache[key]
            return None
        self.cache_hits += 1
        return staged

    def forget(self, key: Hashable, staged: Staged | None = None) -> None:
        """Drop `key`'s cache entry (only if it is `staged`, when given)."""
        if staged is None or self._cache.get(key) is staged:
            self._cache.pop(key, None)

    def gemm(self, a: np.ndarray | Staged, b: np.ndarray | Staged) -> np.ndarray:
        """a @ b on the device, a host (NumPy, float32) result: a (m, k) @ b (k, n), or batched a (N, m, k) @
        b (N, k, n) as N GEMMs under one timer. Host operands are staged here (uploaded for this product only);
        Staged ones are used as they are. Rounded as matmul rounds (module docstring); counts N GEMMs."""
        t0 = time.perf_counter()
        sa = a if isinstance(a, Staged) else self._stage(a)
        sb = b if isinstance(b, Staged) else self._stage(b)
        if len(sa.shape) != len(sb.shape) or len(sa.shape) not in (2, 3) or sa.shape[:-2] != sb.shape[:-2] \
                or sa.shape[-1] != sb.shape[-2]:
            raise ValueError(f"gemm shapes do not fit: {sa.shape} @ {sb.shape}")
        lead, (m, k), n = sa.shape[:-2], sa.shape[-2:], sb.shape[-1]
        count = lead[0] if lead else 1
        if count == 0 or m == 0 or n == 0 or k == 0:  # nothing to send to a device
            self.wall_seconds += time.perf_counter() - t0
            return np.zeros((*lead, m, n), dtype=np.float32)
        backend, gemm = self.backend, self.gemm_dtype
        out = backend.empty((*lead, m, n), gemm)
        with backend.timer() as t:
            if lead:
                for i in range(count):
                    backend.matmul(sa.array[i], sb.array[i], out[i], gemm)
            else:
                backend.matmul(sa.array, sb.array, out, gemm)
        self.compute_seconds += t.seconds
        if not self._direct:
            with backend.timer() as down:
                out = backend.download(out, gemm)
            self.copy_seconds += down.seconds
            self.download_bytes += count * m * n * gemm.itemsize
        self.gemms += count
        self.flops += 2 * count * m * n * k
        out = round_to_dtype(out, self.dtype) if self.mixed else np.ascontiguousarray(out, dtype=np.float32)
        self.wall_seconds += time.perf_counter() - t0
        if self.poll is not None:
            self.poll()
        return out


class Staged:
    """An operand on the device for Ops.gemm (Ops.stage): `array` the backend's (on the host backend the host
    array itself), `shape` its shape, `nbytes` what its upload copied (0 on the host backend), `meta` the stager's
    note of what it holds (Ops.staged's `valid` reads it)."""

    __slots__ = ("array", "shape", "nbytes", "meta")

    def __init__(self, array: Any, shape: tuple[int, ...], nbytes: int, meta: Any = None) -> None:
        self.array = array
        self.shape = shape
        self.nbytes = nbytes
        self.meta = meta


_FP32 = get_dtype("fp32")


def HostOps(dtype: DType | str = "fp32", threads: int | None = None) -> Ops:
    """Ops on the host backend (NumPy's BLAS): the reference's and the unit tests' device."""
    return Ops(HostBackend(threads), dtype)
