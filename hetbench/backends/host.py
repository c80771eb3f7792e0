"""The host backend: NumPy on the CPU, GEMM through whatever BLAS NumPy is linked against."""

from __future__ import annotations

import contextlib
import os
import platform
import time
from typing import Any, Iterator

import numpy as np

from hetbench.backends.base import (
    Capabilities,
    MPI_MEMORY_HOST,
    TIMING_MEASURED,
    BackendSpec,
    BackendUnavailable,
    DeviceInfo,
    Done,
    Elapsed,
    check_dtype,
)
from hetbench.dtypes import DType

CAPABILITIES = Capabilities(array_module="numpy", buffers_in_host_memory=True, memory_is_the_hosts=True,
                            computes_on_host_arrays=True, limits_own_threads=True, native_low_precision=False,
                            torch_device="cpu", spec_syntax="{name}")

# fp16 works (NumPy computes it without BLAS, slowly); bf16 has no host arithmetic
HOST_DTYPES = ("fp64", "fp32", "fp16")
_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def unavailable_reason() -> str | None:
    return None


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _cpu_vendor(name: str) -> str:
    for vendor in ("AMD", "Intel", "Apple", "Ampere", "NVIDIA"):
        if vendor.lower() in name.lower():
            return vendor
    return platform.machine()


# The BLAS's and MPI's own working memory, touched by a run's first GEMM and first collectives (a few MiB, with
# room to spare here); the memory checks count it
RUNTIME_SCRATCH_BYTES = 16 * 1024**2

_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2^63 - 1


def _read_int(path: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    return None


def _stat_value(path: str, key: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        with open(path, encoding="ascii") as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    return 0


def meminfo_available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable of /proc/meminfo: what the host can still allocate without swapping."""
    with contextlib.suppress(OSError, ValueError):
        with open(meminfo, encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    return None


def cgroup_headroom_bytes(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """What this process's memory cgroup, and every cgroup above it, still lets it take: the least over them of
    limit - (usage - inactive file pages, which the kernel reclaims before it refuses). cgroup v2 (memory.max,
    memory.current) or v1 (memory.limit_in_bytes, memory.usage_in_bytes); None where no limit is set or seen."""
    try:
        with open(proc_cgroup, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    candidates = []  # (folder of this process's cgroup, mount root, v2?)
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        path = path.lstrip("/")
        if controllers == "":
            candidates.append((os.path.join(root, path), root, True))
        elif "memory" in controllers.split(","):
            candidates.append((os.path.join(root, "memory", path), os.path.join(root, "memory"), False))
    best: int | None = None
    for folder, mount, v2 in candidates:
        if not os.path.isdir(folder):
            folder = mount  # a cgroup namespace shows its own root as "/": the mount is that cgroup
        names = (("memory.max", "memory.current", "inactive_file") if v2
                 else ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
        while True:
            limit = _read_int(os.path.join(folder, names[0]))
            usage = _read_int(os.path.join(folder, names[1]))
            if limit is not None and limit < _UNLIMITED and usage is not None:
                reclaimable = _stat_value(os.path.join(folder, "memory.stat"), names[2])
                headroom = max(0, limit - max(0, usage - reclaimable))
                best = headroom if best is None else min(best, headroom)
            if os.path.normpath(folder) == os.path.normpath(mount):
                break
            folder = os.path.dirname(folder)
    return best


def _status_bytes(key: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    return None


def rlimit_headroom_bytes() -> int | None:
    """What this process may still map under its own limits: RLIMIT_AS less its virtual size, RLIMIT_DATA less
    its data size (private writable memory, where NumPy's arrays live). None where neither is set."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    best: int | None = None
    for limit_name, status_key in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        limit = getattr(resource, limit_name, None)
        if limit is None:
            continue
        soft, _ = resource.getrlimit(limit)
        if soft == resource.RLIM_INFINITY or soft < 0:
            continue
        used = _status_bytes(status_key) or 0
        headroom = max(0, soft - used)
        best = headroom if best is None else min(best, headroom)
    return best


def host_memory_share_bytes(local_size: int = 1) -> int | None:
    """Host memory one of `local_size` ranks on this node may take: the node's share (MemAvailable and the memory
    cgroup, both shared by the ranks) split evenly, and no more than this process's own rlimits allow. None where
    nothing is known."""
    shared = [v for v in (meminfo_available_bytes(), cgroup_headroom_bytes()) if v is not None]
    share = min(shared) // max(local_size, 1) if shared else None
    own = rlimit_headroom_bytes()
    if own is not None:
        share = own if share is None else min(share, own)
    return share


def host_memory_available_bytes() -> int | None:
    """What this process can still allocate on the host: the least of MemAvailable, the memory cgroup's headroom
    and the headroom its RLIMIT_AS and RLIMIT_DATA leave. The one place hetbench reads host memory."""
    return host_memory_share_bytes(1)


def peak_rss_bytes() -> int | None:
    """This process's peak resident set (VmHWM), since it started or since reset_peak_rss()."""
    return _status_bytes("VmHWM")


def rss_bytes() -> int | None:
    return _status_bytes("VmRSS")


def release_free_memory() -> None:
    """Hand memory the process has freed back to the system (glibc's malloc_trim): arrays below glibc's moving
    mmap threshold live on its heap, which it otherwise keeps, so the next phase's arrays would add to them."""
    global _libc
    if _libc is None:
        import ctypes
        import ctypes.util

        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc.malloc_trim(0)


_libc: Any = None


def reset_peak_rss() -> bool:
    """Start VmHWM again from the present RSS (Linux: write 5 to /proc/self/clear_refs); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _mem_total_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def _blas_pools() -> list[dict[str, Any]]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [p for p in threadpool_info() if p.get("user_api") == "blas"]


def blas_description() -> tuple[str, int | None]:
    """(e.g. 'openblas 0.3.27 SkylakeX', threads) for the BLAS NumPy uses."""
    pools = _blas_pools()
    if not pools:
        return "unknown BLAS", None
    p = pools[0]
    parts = [p.get("internal_api", "blas"), p.get("version") or ""]
    if p.get("architecture"):
        parts.append(p["architecture"])
    return " ".join(x for x in parts if x), p.get("num_threads")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _device_info(threads: int | None) -> DeviceInfo:
    name = _cpu_name()
    blas, blas_threads = blas_description()
    threads = threads if threads is not None else blas_threads
    return DeviceInfo(
        backend="host",
        index=0,
        vendor=_cpu_vendor(name),
        name=name,
        kind="cpu",
        memory_bytes=_mem_total_bytes(),
        dtypes=HOST_DTYPES,
        runtime=f"NumPy {np.__version__}, {blas}" + (f", {threads} threads" if threads else ""),
        details={"blas": blas, "blas_threads": threads, "cores": _cores()},
    )


def list_devices() -> list[DeviceInfo]:
    return [_device_info(None)]


class HostBackend:
    name = "host"
    timing = TIMING_MEASURED

    def __init__(self, threads: int | None = None) -> None:
        self._limiter = None
        if threads is not None:
            from threadpoolctl import threadpool_limits

            self._limiter = threadpool_limits(limits=threads, user_api="blas")
        self._info = _device_info(threads)

    def info(self) -> DeviceInfo:
        return self._info

    def free_memory_bytes(self) -> int | None:
        return host_memory_available_bytes()

    def max_allocation_bytes(self) -> int | None:
        return None

    def upload(self, host: np.ndarray, dtype: DType) -> np.ndarray:
        check_dtype(self._info, dtype)
        return np.array(host, dtype=dtype.host, order="C", copy=True)

    def download(self, array: np.ndarray, dtype: DType) -> np.ndarray:
        return np.array(array, dtype=dtype.host, order="C", copy=True)

    def empty(self, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
        check_dtype(self._info, dtype)
        return np.empty(shape, dtype=dtype.host)

    def matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, dtype: DType) -> None:
        check_dtype(self._info, dtype)
        np.matmul(a, b, out=out)

    def copy_to_host_async(self, array: np.ndarray, offset: int, out: np.ndarray, after: Any = ()) -> Done:
        """A chunk of a host array into a staging buffer (pipelined staging of ops whose chunks gather several
        segments): a plain copy, done at once."""
        for pending in after:
            pending.wait()
        np.copyto(out, array[offset : offset + len(out)])
        return Done()

    def copy_from_host_async(self, host: np.ndarray, array: np.ndarray, offset: int, after: Any = ()) -> Done:
        for pending in after:
            pending.wait()
        array[offset : offset + len(host)] = host
        return Done()

    def synchronize(self) -> None:
        pass

    @contextlib.contextmanager
    def timer(self) -> Iterator[Elapsed]:
        elapsed = Elapsed()
        start = time.perf_counter()
        yield elapsed
        elapsed.seconds = time.perf_counter() - start

    def mpi_buffer(self, array: np.ndarray) -> np.ndarray:
        return array

    def mpi_memory_kind(self) -> str:
        return MPI_MEMORY_HOST

    def close(self) -> None:
        if self._limiter is not None:
            self._limiter.restore_original_limits()
            self._limiter = None


def threads_for_rank(local_size: int) -> int | None:
    """BLAS threads for one of `local_size` ranks on a node: the cores shared out, unless the user set a count."""
    if any(os.environ.get(v) for v in _THREAD_ENV) or local_size <= 1:
        return None
    return max(1, _cores() // local_size)


def share_blas_threads(local_size: int) -> int | None:
    """Limit this process's BLAS to its share of the node's cores, as the host backend does for itself: a rank
    whose device is not the host still multiplies on the host when it checks its products (and a simulated device
    computes there), and BLAS threads beyond its share spin on the cores the other ranks need, slowing their MPI
    operations many times over. Returns the count set,
    None where the user set one or the rank is alone on its node."""
    threads = threads_for_rank(local_size)
    if threads is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads, user_api="blas")
    return threads


def open_device(spec: BackendSpec, local_rank: int, local_size: int) -> HostBackend:
    if spec.index not in (None, 0):
        raise BackendUnavailable(f"the host backend has one device, index 0; got index {spec.index}")
    return HostBackend(threads_for_rank(local_size))
