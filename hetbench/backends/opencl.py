"""The OpenCL backend: any OpenCL device through pyopencl; GEMM through the self-tuning kernel
(kernels/gemm_tuned.cl, opencl_tune.py), CLBlast (pyclblast) or hetbench's first kernel (kernels/gemm.cl), as
HETBENCH_OPENCL_GEMM asks."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import weakref
from typing import Any, Iterator

import numpy as np

from hetbench.backends.base import (
    Capabilities,
    MPI_MEMORY_NONE,
    TIMING_MEASURED,
    BackendSpec,
    BackendUnavailable,
    DeviceError,
    DeviceInfo,
    Elapsed,
    check_download_target,
    check_dtype,
    index_for_rank,
    touched_empty,
)
from hetbench.backends import opencl_tune
from hetbench.dtypes import DType
from hetbench.kernels_path import kernel_source

CAPABILITIES = Capabilities(array_module="pyopencl", buffers_in_host_memory=False)  # a CPU device's are, by its kind

try:
    import pyopencl as cl
    import pyopencl.array as cl_array
except ImportError:
    cl = None
    cl_array = None

try:
    import pyclblast
except ImportError:  # also when libclblast itself cannot be loaded
    pyclblast = None

# which GEMM matmul uses: auto (per dtype and shape class, whichever of the tuned kernel and CLBlast `hetbench tune`
# measured faster on this device; before a tune, the tuned kernel's defaults on a CPU device, CLBlast elsewhere
# where it imports), tuned (the self-tuning kernel, searched on first use where no cached winner is there), clblast,
# kernel (kernels/gemm.cl)
GEMM_ENV = "HETBENCH_OPENCL_GEMM"
GEMM_CHOICES = ("auto", "clblast", "kernel", "tuned")
# where the backend's notes go (a foreign or corrupt tuning cache, a search on first use): one line each on stderr
# through logging's last-resort handler unless the application configures logging
_log = logging.getLogger("hetbench.opencl")
INSTALL_OPENCL = "pip install 'hetbench[opencl]'"
INSTALL_CLBLAST = "pip install 'hetbench[clblast]' (it needs the CLBlast library, e.g. apt install libclblast-dev)"

# the kernel's build options per dtype; half data is converted to float for local memory and accumulation
_BUILD_OPTIONS: dict[str, tuple[str, ...]] = {
    "fp32": ("-DREAL=float",),
    "fp64": ("-DREAL=double", "-DREAL_IS_DOUBLE"),
    "fp16": ("-DREAL=half", "-DREAL_IS_HALF"),
}
_ACC_ITEMSIZE = {"fp32": 4, "fp64": 8, "fp16": 4}
# gemm(M, N, K, A, a_offset, B, b_offset, C, c_offset); None marks a buffer
_KERNEL_ARG_DTYPES = [np.int32, np.int32, np.int32, None, np.uint64, None, np.uint64, None, np.uint64]

# Kernel tiles (TS_M, TS_N, TS_K, WPT_M, WPT_N), tried in order until one fits the device. A CPU OpenCL (PoCL)
# runs fastest with wide register blocks. GPUs get 16x16 work-items with 4x4 outputs each, a register load every
# GPU carries without spilling.
_TILES_CPU = ((64, 128, 16, 8, 16), (64, 64, 16, 8, 8), (16, 16, 16, 1, 1), (4, 4, 4, 1, 1), (1, 1, 1, 1, 1))
_TILES_GPU = ((64, 64, 16, 4, 4), (32, 32, 16, 2, 2), (16, 16, 16, 1, 1), (4, 4, 4, 1, 1), (1, 1, 1, 1, 1))


def gemm_implementation() -> str:
    """The GEMM choice devices opened now take, as HETBENCH_OPENCL_GEMM asks: one of GEMM_CHOICES."""
    choice = os.environ.get(GEMM_ENV, "auto").strip().lower() or "auto"
    if choice not in GEMM_CHOICES:
        raise BackendUnavailable(
            f"{GEMM_ENV}={os.environ.get(GEMM_ENV)!r} is not one of: {', '.join(GEMM_CHOICES)}"
        )
    if choice == "clblast" and pyclblast is None:
        raise BackendUnavailable(f"{GEMM_ENV}=clblast but pyclblast does not import: {INSTALL_CLBLAST}")
    return choice


def _all_devices() -> list[tuple[Any, Any]]:
    """(platform, device) of every device of every platform: the flat order device indices count in."""
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # no ICD installed: PLATFORM_NOT_FOUND_KHR
        return []
    found = []
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except cl.Error:  # a platform with no device answers DEVICE_NOT_FOUND
            continue
        found.extend((platform, device) for device in devices)
    return found


def unavailable_reason() -> str | None:
    if cl is None:
        return f"pyopencl is not installed: {INSTALL_OPENCL}"
    if not _all_devices():
        return (
            "no OpenCL device found: install a vendor OpenCL driver, "
            "or PoCL for the CPU (e.g. apt install pocl-opencl-icd)"
        )
    try:
        gemm_implementation()
    except BackendUnavailable as e:
        return str(e)
    return None


def _is_pocl(platform: Any) -> bool:
    return "pocl" in platform.name.lower() or "pocl" in platform.vendor.lower()


def _vendor(platform: Any, device: Any) -> str:
    text = f"{device.vendor} {platform.vendor}".lower()
    for key, vendor in (
        ("nvidia", "NVIDIA"),
        ("advanced micro devices", "AMD"),
        ("authenticamd", "AMD"),
        ("amd", "AMD"),
        ("intel", "Intel"),
        ("apple", "Apple"),
        ("qualcomm", "Qualcomm"),
        ("arm", "ARM"),
    ):
        if key in text:
            return vendor
    return "PoCL" if _is_pocl(platform) else device.vendor.strip()


def _kind(device: Any) -> str:
    if device.type & cl.device_type.GPU:
        return "gpu"
    if device.type & cl.device_type.CPU:
        return "cpu"
    return "accelerator"


def _dtypes(device: Any) -> tuple[str, ...]:
    extensions = device.extensions.split()
    dtypes = ["fp32"]
    if "cl_khr_fp64" in extensions:
        dtypes.insert(0, "fp64")
    if "cl_khr_fp16" in extensions:
        dtypes.append("fp16")
    return tuple(dtypes)


def _short_platform_version(version: str) -> str:
    # PoCL appends its whole build configuration after the first comma
    return " ".join(version.split(",", 1)[0].split())


def _device_info(index: int, platform: Any, device: Any, gemm: str) -> DeviceInfo:
    return DeviceInfo(
        backend="opencl",
        index=index,
        vendor=_vendor(platform, device),
        name=device.name.strip(),
        kind=_kind(device),
        memory_bytes=int(device.global_mem_size),
        dtypes=_dtypes(device),
        runtime=f"{_short_platform_version(platform.version)} (platform), driver {device.driver_version.strip()}",
        details={
            "platform": platform.name.strip(),
            "platform_version": platform.version.strip(),
            "device_version": device.version.strip(),
            "driver_version": device.driver_version.strip(),
            "max_mem_alloc_bytes": int(device.max_mem_alloc_size),
            "local_mem_bytes": int(device.local_mem_size),
            "compute_units": int(device.max_compute_units),
            "max_clock_mhz": int(device.max_clock_frequency),
            "gemm": gemm,
        },
    )


def list_devices() -> list[DeviceInfo]:
    gemm = gemm_implementation()
    return [_device_info(i, platform, device, gemm) for i, (platform, device) in enumerate(_all_devices())]


class _Ledger:
    """Bytes held in device arrays a backend created; finalizers of those arrays pay them back."""

    def __init__(self) -> None:
        self.held_bytes = 0

    def release(self, nbytes: int) -> None:
        self.held_bytes -= nbytes


PROGRESS_EVERY_SECONDS = 5.0


def progress_lines(what: str, every: float = PROGRESS_EVERY_SECONDS,
                   clock: Any = time.monotonic) -> Any:
    """on_step(done, total, label) for a search that runs on first use: a "Note: <what>: done/total candidates,
    N s" line on stderr (the log) at most every `every` seconds and at the last step. Lines, not a redrawn bar: a
    rank under mpiexec writes through a pipe and cannot tell a terminal is at its end, and the backend layer draws
    nothing itself (`hetbench tune --progress` draws the bar)."""
    start = clock()
    last = [start]

    def on_step(done: int, total: int, label: str) -> None:
        now = clock()
        if done >= total or now - last[0] >= every:
            last[0] = now
            _log.warning("Note: %s: %d/%d candidates, %.0f s", what, done, total, now - start)

    return on_step


class OpenCLBackend:
    name = "opencl"
    timing = TIMING_MEASURED

    def __init__(self, index: int, platform: Any, device: Any, gemm: str) -> None:
        self._device = device
        self._info = _device_info(index, platform, device, gemm)
        self._gemm = gemm
        try:
            self._context = cl.Context([device])
            # in order: a matmul never starts before the uploads issued ahead of it have finished
            self._queue = cl.CommandQueue(self._context)
        except cl.Error as e:
            raise BackendUnavailable(f"cannot open {self._info.label}: {e}") from e
        self._ledger = _Ledger()
        self._kernels: dict[str, tuple[Any, tuple[int, int, int, int, int]]] = {}
        self._tuned = opencl_tune.TunedKernels(cl, self._context, self._queue, device)
        self._facts = opencl_tune.DeviceFacts.of(device, self._info.kind)
        self.tuning_key = opencl_tune.DeviceKey(
            platform=platform.name.strip(), platform_version=platform.version.strip(), name=device.name.strip(),
            driver_version=device.driver_version.strip(),
        )
        self._tuning_entries: dict[str, dict[str, Any]] = {}
        # (dtype, shape class) -> ("tuned", params) or ("clblast", None): decided once per backend
        self._paths: dict[tuple[str, str], tuple[str, opencl_tune.GemmParams | None]] = {}
        self.gemm_notes: list[str] = []
        if gemm in ("auto", "tuned"):
            # the cached winners this device can run (an entry past its limits is skipped with the note)
            self._tuning_entries, note = opencl_tune.load_entries(self.tuning_key, self._facts)
            if note:
                self._note(note)

    def _note(self, text: str) -> None:
        self.gemm_notes.append(text)
        _log.warning("Note: %s", text)

    def info(self) -> DeviceInfo:
        return self._info

    def free_memory_bytes(self) -> int | None:
        # OpenCL has no query for free memory: count what this backend holds, nothing else is known
        held = self._ledger.held_bytes + self._tuned.scratch_bytes
        return max(0, int(self._device.global_mem_size) - held)

    def max_allocation_bytes(self) -> int | None:
        return int(self._device.max_mem_alloc_size)

    @contextlib.contextmanager
    def _device_errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except (BackendUnavailable, DeviceError):
            raise
        except (cl.Error, RuntimeError) as e:  # pyclblast reports CLBlast failures as RuntimeError
            raise DeviceError(f"OpenCL {what} failed on {self._info.label}: {e}") from e

    def _track(self, array: Any) -> Any:
        nbytes = int(array.nbytes)
        self._ledger.held_bytes += nbytes
        finalizer = weakref.finalize(array, self._ledger.release, nbytes)
        finalizer.atexit = False
        return array

    def upload(self, host: np.ndarray, dtype: DType) -> Any:
        check_dtype(self._info, dtype)
        data = np.ascontiguousarray(host, dtype=dtype.host)
        with self._device_errors("upload"):
            return self._track(cl_array.to_device(self._queue, data))

    def download(self, array: Any, dtype: DType) -> np.ndarray:
        with self._device_errors("download"):
            host = array.get()
            self._queue.finish()
            # the copy's event, kept in the array's event list, holds the host copy alive: up to twelve of them
            # would pile up while the device array lives
            array.finish()
        return np.ascontiguousarray(host, dtype=dtype.host)

    def download_buffer(self, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
        """Host memory for download_into (base.download_buffer), its pages touched before any timer."""
        return touched_empty(tuple(shape), dtype)

    def download_into(self, array: Any, out: np.ndarray) -> None:
        check_download_target(array, out)
        with self._device_errors("download"):
            array.get(ary=out)
            self._queue.finish()
            array.finish()

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Any:
        check_dtype(self._info, dtype)
        with self._device_errors("allocation"):
            return self._track(cl_array.empty(self._queue, tuple(shape), dtype.host))

    def matmul(self, a: Any, b: Any, out: Any, dtype: DType) -> None:
        check_dtype(self._info, dtype)
        m, k = a.shape
        k_b, n = b.shape
        if k_b != k or tuple(out.shape) != (m, n):
            raise ValueError(f"matmul shapes do not match: {a.shape} @ {b.shape} -> {out.shape}")
        for label, x in (("a", a), ("b", b), ("out", out)):
            if x.dtype != dtype.host or not x.flags.c_contiguous:
                raise ValueError(f"matmul needs C-contiguous {dtype.host} arrays; {label} is {x.dtype}")
        if m == 0 or n == 0:
            return
        with self._device_errors("matmul"):
            if k == 0:
                out.fill(0)
                return
            path, params = self.gemm_path(dtype, m, n, k)
            if path == "clblast":
                self._clblast_matmul(a, b, out, m, n, k, dtype)
            elif path == "kernel":
                self._kernel_matmul(a, b, out, m, n, k, dtype)
            else:
                itemsize = dtype.host.itemsize
                self._tuned.enqueue(params, dtype.name, itemsize, m, n, k, a.base_data, a.offset // itemsize,
                                    b.base_data, b.offset // itemsize, out.base_data, out.offset // itemsize)

    def gemm_path(self, dtype: DType, m: int, n: int, k: int) -> tuple[str, opencl_tune.GemmParams | None]:
        """Which GEMM computes an m x k by k x n product in dtype here: ("clblast", None), ("kernel", None) or
        ("tuned", its parameters). With HETBENCH_OPENCL_GEMM=tuned and no cached winner for the dtype and shape
        class, the search runs now (once; its winner cached)."""
        if self._gemm in ("clblast", "kernel"):
            return self._gemm, None
        cls = opencl_tune.shape_class(m, n, k)
        decided = self._paths.get((dtype.name, cls))
        if decided is not None:
            return decided
        entry = self._tuning_entries.get(opencl_tune.entry_key(dtype.name, cls))
        if entry is not None and not self._cached_builds(entry, dtype, cls):
            entry = None
        if entry is None and self._gemm == "tuned":
            self._note(f"tuning the OpenCL GEMM for {dtype.name} {cls} products on {self._info.label} (once; "
                       f"at most {opencl_tune.DEFAULT_BUDGET_SECONDS:.0f} s, cached in {self.tuning_key.path()})")
            entry = self.tune_gemm(dtype, cls, on_step=progress_lines(f"tuning {dtype.name} {cls}"))
        if entry is None:  # auto before any tune
            if self._info.kind != "cpu" and pyclblast is not None:
                decided = ("clblast", None)
            else:
                decided = ("tuned", opencl_tune.default_params(self._facts, dtype.name))
        else:
            clblast = entry.get("clblast_gflops")
            faster_clblast = clblast is not None and clblast > entry["tuned_gflops"]
            if self._gemm == "auto" and pyclblast is not None and faster_clblast:
                decided = ("clblast", None)
            else:
                decided = ("tuned", opencl_tune.GemmParams.from_dict(entry["params"]))
        self._paths[(dtype.name, cls)] = decided
        return decided

    def _cached_builds(self, entry: dict[str, Any], dtype: DType, cls: str) -> bool:
        """Whether a cached winner builds for this device (a kernel's own limits, its registers', can be below the
        device's); where not, it is dropped with a note and never launched."""
        params = opencl_tune.GemmParams.from_dict(entry["params"])
        try:
            self._tuned.build(params, dtype.name)
        except (cl.Error, RuntimeError) as e:
            reason = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
            self._note(f"the OpenCL GEMM tuning cache {self.tuning_key.path()}: entry "
                       f"'{opencl_tune.entry_key(dtype.name, cls)}' ({params.label()}: {reason}) skipped: this "
                       "device cannot run it (`hetbench tune` tunes it again)")
            del self._tuning_entries[opencl_tune.entry_key(dtype.name, cls)]
            return False
        return True

    def tune_gemm(self, dtype: DType, cls: str, on_step: Any = None,
                  budget_seconds: float = opencl_tune.DEFAULT_BUDGET_SECONDS,
                  axes: list[list[dict[str, int]]] | None = None,
                  shape: tuple[int, int, int] | None = None) -> dict[str, Any]:
        """Search the tuned kernel's parameters for dtype and shape class on this device, measure CLBlast and
        kernels/gemm.cl at the same shape, cache the winner; returns the cache entry. Raises DeviceError where no
        candidate computes a right product."""
        check_dtype(self._info, dtype)
        if cls not in opencl_tune.SHAPE_CLASSES:
            raise ValueError(f"shape class {cls!r} is not one of {', '.join(opencl_tune.SHAPE_CLASSES)}")
        others: dict[str, Any] = {"kernel": lambda a, b, c, m, n, k: self._kernel_matmul(a, b, c, m, n, k, dtype)}
        if pyclblast is not None:
            others["clblast"] = lambda a, b, c, m, n, k: self._clblast_matmul(a, b, c, m, n, k, dtype)
        with self._device_errors("GEMM tuning"):
            try:
                outcome = opencl_tune.tune(self._tuned, self._facts, dtype, cls, others=others, on_step=on_step,
                                           budget_seconds=budget_seconds, axes=axes, shape=shape)
            except opencl_tune.NoWinner as e:
                raise DeviceError(f"{e} on {self._info.label}") from e
        entry = outcome.entry()
        entry["candidates_tried"] = [
            {"label": label, "gflops": gflops, "why_not": why} for label, gflops, why in outcome.candidates
        ]
        try:
            entry["cache_path"] = str(opencl_tune.save_entry(self.tuning_key, dtype.name, cls, entry))
        except OSError as e:  # a read-only home: the winner still serves this process
            self._note(f"the OpenCL GEMM tuning cache cannot be written ({e}); the winner serves this run only")
            entry["cache_path"] = None
        self._tuning_entries[opencl_tune.entry_key(dtype.name, cls)] = entry
        self._paths.pop((dtype.name, cls), None)
        return entry

    def _clblast_matmul(self, a: Any, b: Any, out: Any, m: int, n: int, k: int, dtype: DType) -> None:
        itemsize = dtype.host.itemsize
        pyclblast.gemm(
            self._queue, m, n, k, a, b, out, a_ld=k, b_ld=n, c_ld=n,
            a_offset=a.offset // itemsize, b_offset=b.offset // itemsize, c_offset=out.offset // itemsize,
        )  # fmt: skip

    def _kernel_matmul(self, a: Any, b: Any, out: Any, m: int, n: int, k: int, dtype: DType) -> None:
        kernel, (ts_m, ts_n, _, wpt_m, wpt_n) = self._gemm_kernel(dtype)
        local = (ts_n // wpt_n, ts_m // wpt_m)
        groups = (-(-n // ts_n), -(-m // ts_m))
        itemsize = dtype.host.itemsize
        kernel(
            self._queue, (groups[0] * local[0], groups[1] * local[1]), local,
            np.int32(m), np.int32(n), np.int32(k),
            a.base_data, np.uint64(a.offset // itemsize),
            b.base_data, np.uint64(b.offset // itemsize),
            out.base_data, np.uint64(out.offset // itemsize),
        )  # fmt: skip

    def _gemm_kernel(self, dtype: DType) -> tuple[Any, tuple[int, int, int, int, int]]:
        """The kernel for dtype and its tile, built on first use: the first tile the device can run."""
        if dtype.name in self._kernels:
            return self._kernels[dtype.name]
        device = self._device
        source = kernel_source("gemm.cl")
        tiles = _TILES_CPU if self._info.kind == "cpu" else _TILES_GPU
        max_item_sizes = device.max_work_item_sizes
        for tile in tiles:
            ts_m, ts_n, ts_k, wpt_m, wpt_n = tile
            local = (ts_n // wpt_n, ts_m // wpt_m)
            local_bytes = (ts_m * ts_k + ts_k * ts_n) * _ACC_ITEMSIZE[dtype.name]
            if (
                local[0] * local[1] > device.max_work_group_size
                or local[0] > max_item_sizes[0]
                or local[1] > max_item_sizes[1]
                or local_bytes > device.local_mem_size
            ):
                continue
            options = [*_BUILD_OPTIONS[dtype.name]] + [
                f"-D{key}={value}" for key, value in zip(("TS_M", "TS_N", "TS_K", "WPT_M", "WPT_N"), tile)
            ]
            program = cl.Program(self._context, source).build(options=options)
            kernel = cl.Kernel(program, "gemm")
            # registers can cap a kernel's work-group below the device's limit
            if kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, device) < local[0] * local[1]:
                continue
            kernel.set_scalar_arg_dtypes(_KERNEL_ARG_DTYPES)
            self._kernels[dtype.name] = (kernel, tile)
            return kernel, tile
        raise DeviceError(f"no GEMM tile of kernels/gemm.cl fits {self._info.label}")

    # --- pipelined host staging (hetbench.comm.staging): chunk copies that return at once, each an event ---------

    def _events(self, after: Any) -> list[Any] | None:
        events = [e for p in after for e in getattr(p, "events", ())]
        return events or None

    def copy_to_host_async(self, array: Any, offset: int, out: np.ndarray, after: Any = ()) -> "_ClPending":
        """out[:] = array[offset : offset + len(out)], enqueued (non-blocking enqueue_copy; the in-order queue runs
        it after everything issued before)."""
        with self._device_errors("chunk copy to the host"):
            event = cl.enqueue_copy(self._queue, out, array.base_data,
                                    src_offset=array.offset + offset * array.dtype.itemsize, is_blocking=False,
                                    wait_for=self._events(after))
        return _ClPending(self, [event])

    def copy_from_host_async(self, host: np.ndarray, array: Any, offset: int, after: Any = ()) -> "_ClPending":
        """array[offset : offset + len(host)] = host, enqueued; `host` must stay untouched until it is done."""
        with self._device_errors("chunk copy to the device"):
            event = cl.enqueue_copy(self._queue, array.base_data, host,
                                    dst_offset=array.offset + offset * array.dtype.itemsize, is_blocking=False,
                                    wait_for=self._events(after))
        return _ClPending(self, [event])

    def staging_buffer(self, count: int, dtype: DType) -> np.ndarray:
        """Host memory the device copies from and to directly: a buffer allocated by the OpenCL runtime
        (ALLOC_HOST_PTR, pinned on GPUs), mapped once for good; it goes back when the view is dropped."""
        with self._device_errors("staging buffer allocation"):
            flags = cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR
            buffer = cl.Buffer(self._context, flags, max(1, count) * dtype.host.itemsize)
            view, _ = cl.enqueue_map_buffer(self._queue, buffer, cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                            (max(1, count),), dtype.host, is_blocking=True)
        if self.can_map_to_host():
            _advise_huge_pages(view)
        return view[:count]

    def wrap_host(self, host: np.ndarray, dtype: DType) -> Any:
        """A device array over `host`'s own bytes (CL_MEM_USE_HOST_PTR), for a device whose memory is the host's
        (base.can_wrap_host): its kernels read and write that memory in place. The host reads what the device wrote
        after a map of the array (map_to_host; the OpenCL rule, a pointer check on PoCL), and `host` must outlive
        the array."""
        check_dtype(self._info, dtype)
        if host.dtype != dtype.host or not host.flags.c_contiguous:
            raise ValueError(f"wrap_host needs a C-contiguous {dtype.host} array, got {host.dtype}")
        with self._device_errors("host buffer"):
            flags = cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR
            buffer = cl.Buffer(self._context, flags, hostbuf=host if host.size else np.empty(1, dtype.host))
            return cl_array.Array(self._queue, host.shape, host.dtype, data=buffer)

    def can_map_to_host(self) -> bool:
        """A device whose memory is the host's (CL_DEVICE_HOST_UNIFIED_MEMORY: a CPU device, an integrated GPU) maps
        a buffer's chunk without copying it."""
        try:
            return bool(self._device.host_unified_memory)
        except (cl.Error, AttributeError):  # the query is deprecated since OpenCL 2.0; an ICD may refuse it
            return self._info.kind == "cpu"

    def map_to_host(self, array: Any, offset: int, count: int, write: bool, after: Any = ()) -> tuple[np.ndarray, Any]:
        """A host view of array[offset : offset + count] (non-blocking enqueue_map_buffer): for reading, or, with
        `write`, for writing it whole (WRITE_INVALIDATE_REGION: nothing is read first). On a device whose memory is
        the host's, the view's memory is given huge pages (see _advise_huge_pages)."""
        flags = cl.map_flags.WRITE_INVALIDATE_REGION if write else cl.map_flags.READ
        with self._device_errors("chunk map"):
            view, event = cl.enqueue_map_buffer(self._queue, array.base_data, flags,
                                                array.offset + offset * array.dtype.itemsize, (count,), array.dtype,
                                                wait_for=self._events(after), is_blocking=False)
        if self.can_map_to_host():
            # every time: a buffer freed and another made may sit at the same address without the advice (cheap on
            # pages huge already)
            _advise_huge_pages(view)
        return view, _ClPending(self, [event])

    def unmap_from_host(self, view: np.ndarray, after: Any = ()) -> "_ClPending":
        with self._device_errors("chunk unmap"):
            event = view.base.release(queue=self._queue, wait_for=self._events(after))
        return _ClPending(self, [event])

    def synchronize(self) -> None:
        with self._device_errors("synchronize"):
            self._queue.finish()

    @contextlib.contextmanager
    def timer(self) -> Iterator[Elapsed]:
        # Wall clock between two full finishes, not a kernel event: CLBlast may run several kernels per GEMM.
        elapsed = Elapsed()
        self.synchronize()
        start = time.perf_counter()
        yield elapsed
        self.synchronize()
        elapsed.seconds = time.perf_counter() - start

    def mpi_buffer(self, array: Any) -> None:
        # MPI cannot take an OpenCL buffer; the comm layer stages it through the host
        return None

    def mpi_memory_kind(self) -> str:
        # an OpenCL buffer is a cl_mem handle, not a pointer: no MPI (CUDA-, HIP- or ZE-aware) can take it
        return MPI_MEMORY_NONE

    def close(self) -> None:
        if self._queue is not None:
            with contextlib.suppress(cl.Error):
                self._queue.finish()
        self._kernels.clear()
        self._tuned.release()
        self._queue = None
        self._context = None


_HUGE_PAGE_BYTES = 2 * 1024**2
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25  # Linux's madvise advice values (asm-generic/mman-common.h)
_libc_madvise: Any = None


def _advise_huge_pages(view: np.ndarray) -> int:
    """Give the whole 2 MiB pages inside a host view of a device buffer (a device whose memory is the host's) the
    transparent huge pages NumPy asks for its own arrays of 4 MiB and more (madvise MADV_HUGEPAGE, then MADV_COLLAPSE
    to make them so at once, Linux 6.1+): an MPI operation on a mapped buffer's 4 KiB pages runs slower than on
    NumPy's arrays, and as fast once its pages are huge. The memory and its contents stay as they are; returns the
    bytes advised, 0 where the view is smaller than 4 MiB or the kernel declines (no THP, another OS)."""
    global _libc_madvise
    if view.nbytes < 2 * _HUGE_PAGE_BYTES:
        return 0
    if _libc_madvise is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _libc_madvise = libc.madvise
        except (OSError, AttributeError):
            _libc_madvise = False
    if not _libc_madvise:
        return 0
    start = view.ctypes.data
    first = -(-start // _HUGE_PAGE_BYTES) * _HUGE_PAGE_BYTES
    last = (start + view.nbytes) // _HUGE_PAGE_BYTES * _HUGE_PAGE_BYTES
    if last <= first or _libc_madvise(first, last - first, _MADV_HUGEPAGE) != 0:
        return 0
    _libc_madvise(first, last - first, _MADV_COLLAPSE)  # where it fails, khugepaged collapses them later
    return last - first


class _ClPending:
    """OpenCL events of one chunk's copies (hetbench.backends.base.Pending)."""

    modelled_seconds = 0.0

    def __init__(self, backend: OpenCLBackend, events: list[Any]) -> None:
        self._backend, self.events = backend, events

    def done(self) -> bool:
        with self._backend._device_errors("chunk copy"):
            status = [e.command_execution_status for e in self.events]
        if any(s < 0 for s in status):
            raise DeviceError(f"OpenCL chunk copy failed on {self._backend.info().label}: status {min(status)}")
        return all(s == cl.command_execution_status.COMPLETE for s in status)

    def wait(self) -> None:
        with self._backend._device_errors("chunk copy"):
            cl.wait_for_events(self.events)


def open_device(spec: BackendSpec, local_rank: int, local_size: int) -> OpenCLBackend:
    if cl is None:
        raise BackendUnavailable(f"pyopencl is not installed: {INSTALL_OPENCL}")
    gemm = gemm_implementation()
    devices = _all_devices()
    index = index_for_rank(spec, len(devices), local_rank)
    platform, device = devices[index]
    return OpenCLBackend(index, platform, device, gemm)
