"""The backend protocol: what every place that computes (CPU, OpenCL device, CUDA/ROCm GPU, simulated GPU) offers.

A backend allocates, copies, multiplies, synchronises and times; it never prints, checks results or decides what to
measure. That belongs to the harness (see ../harness). One module per backend implements this protocol.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, ContextManager, Protocol, cast, runtime_checkable

import numpy as np

from hetbench import signals
from hetbench.dtypes import DType

TIMING_MEASURED = "measured"
TIMING_MODELLED = "modelled"

# What a backend's buffers are for MPI (Backend.mpi_memory_kind): host memory, which every MPI takes; CUDA, HIP
# (ROCm) or Level Zero device memory, which only an MPI built for it takes; or "none", buffers no MPI can take
# (OpenCL's), which go through the host.
MPI_MEMORY_HOST = "host"
MPI_MEMORY_NONE = "none"
MPI_MEMORY_KINDS: tuple[str, ...] = (MPI_MEMORY_HOST, "cuda", "hip", "ze", MPI_MEMORY_NONE)


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (missing package, no device, index out of range). The message says why."""


class DeviceError(RuntimeError):
    """A device failed while running."""


class UnsupportedDtype(ValueError):
    """A device was asked to compute in a dtype it does not offer. The message names the device and its dtypes."""


@dataclass
class DeviceInfo:
    """What one device is. Plain data: it goes into tables, JSON and CSV as is."""

    backend: str  # host | opencl | cupy | sim
    index: int  # the device's index within its backend on this node
    vendor: str  # NVIDIA, AMD, Intel, or the CPU's vendor
    name: str
    kind: str  # gpu | cpu | accelerator
    memory_bytes: int | None
    dtypes: tuple[str, ...]  # the dtypes this device computes in
    runtime: str  # driver/runtime/library and its version, e.g. "OpenBLAS 0.3.27, 2 threads"
    peak_tflops: dict[str, float] = field(default_factory=dict)  # per dtype, where known
    peak_source: str | None = None  # where the peak figure comes from (datasheet URL, clpeak, ...)
    memory_bandwidth_gbps: float | None = None  # GB/s, 1e9 bytes; where known
    modelled: bool = False  # True for simulated devices: every time they report is modelled
    details: dict[str, Any] = field(default_factory=dict)  # backend-specific (compute capability, gcnArchName, ...)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dtypes"] = list(self.dtypes)
        return d

    @property
    def label(self) -> str:
        return f"{self.backend}:{self.index} {self.name}"


def check_dtype(info: DeviceInfo, dtype: DType | str) -> None:
    """Raise UnsupportedDtype unless the device `info` describes computes in `dtype`. The one dtype check: the
    harness calls it before a run, every backend before it allocates or multiplies."""
    name = dtype if isinstance(dtype, str) else dtype.name
    if name not in info.dtypes:
        raise UnsupportedDtype(
            f"dtype {name} is not supported by {info.backend}:{info.index} ({info.name}); "
            f"it computes in: {', '.join(info.dtypes)}"
        )


@dataclass
class Elapsed:
    """Filled in when a backend timer's block ends."""

    seconds: float = math.nan


@runtime_checkable
class Backend(Protocol):
    """One device, opened for computing. Arrays it returns are its own (NumPy, CuPy, pyopencl, ...)."""

    name: ClassVar[str]
    # TIMING_MEASURED when timer() measures real elapsed time, TIMING_MODELLED when it models it (sim)
    timing: ClassVar[str]

    def info(self) -> DeviceInfo: ...

    # upload, empty and matmul raise UnsupportedDtype (through check_dtype) for a dtype info().dtypes lacks

    def free_memory_bytes(self) -> int | None:
        """Memory that can still be allocated on the device, or None where the device cannot tell."""

    def max_allocation_bytes(self) -> int | None:
        """The largest single buffer the device allows (OpenCL's CL_DEVICE_MAX_MEM_ALLOC_SIZE), or None."""

    def upload(self, host: np.ndarray, dtype: DType) -> Any:
        """A new device array holding `host` (already in dtype.host representation)."""

    def download(self, array: Any, dtype: DType) -> np.ndarray:
        """A host copy of a device array, in dtype.host representation. Returns after the copy completed."""

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Any:
        """An uninitialised device array."""

    def matmul(self, a: Any, b: Any, out: Any, dtype: DType) -> None:
        """out = a @ b for 2-D row-major arrays. May return before the device finished (see synchronize)."""

    def synchronize(self) -> None:
        """Wait until all work issued to the device has finished."""

    def timer(self) -> ContextManager[Elapsed]:
        """`with backend.timer() as t: ...` then t.seconds is the device time of the block, synchronised."""

    def mpi_buffer(self, array: Any) -> Any | None:
        """An object a GPU-aware MPI can take as a buffer for this device array, or None when it cannot.

        The host backend returns the NumPy array itself. Callers synchronize() first."""

    def mpi_memory_kind(self) -> str:
        """What this device's buffers are for MPI, one of MPI_MEMORY_KINDS: "host", "cuda", "hip", "ze", or
        "none" exactly when mpi_buffer answers None. A GPU kind says which GPU support the MPI library needs
        (comm.gpu.gpu_support) before mpi_buffer's objects may go to it."""

    def close(self) -> None:
        """Release the device. Safe to call more than once."""


# --- pipelined host staging (hetbench.comm.staging): OPTIONAL backend methods ---------------------------------------
#
# A backend may offer chunk copies that return before they finish, so that the copy out of one chunk, MPI's work on
# the next and the copy back of the one before overlap:
#   copy_to_host_async(array, offset, out, after=()) -> Pending     out[:] = array[offset : offset + len(out)]
#   copy_from_host_async(host, array, offset, after=()) -> Pending   array[offset : offset + len(host)] = host
#   staging_buffer(count, dtype) -> np.ndarray                       host memory its copies are fastest from
#                                                                      (pinned/page-locked where it has such)
# and, where the device's memory is the host's (an OpenCL CPU device, an integrated GPU), chunk maps:
#   can_map_to_host() -> bool
#   map_to_host(array, offset, count, write, after=()) -> (np.ndarray, Pending)   a host view of the chunk
#   unmap_from_host(view, after=()) -> Pending                                     its writes back on the device
# offsets and counts in elements of a 1-D array; `after`: Pendings the copy must follow (a backend that issues all
# its work on one in-order queue or stream meets them by its order). The module functions below call a backend's
# own method where it has one and otherwise copy synchronously through upload/download of a slice of the array, so
# every backend whose arrays take slicing (NumPy, CuPy, pyopencl arrays) stages correctly, only without overlap.


class Pending(Protocol):
    """A copy that may still be running. `modelled_seconds`: its modelled device time (simulated devices), else 0."""

    modelled_seconds: float

    def done(self) -> bool: ...

    def wait(self) -> None: ...


@dataclass
class Done:
    """A copy that finished before its call returned (the synchronous default, the host's own arrays)."""

    modelled_seconds: float = 0.0

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        pass


def _wait_all(after: Any) -> None:
    for pending in after:
        pending.wait()


def copy_to_host_async(backend: Any, array: Any, offset: int, out: np.ndarray, dtype: DType,
                       after: Any = ()) -> Pending:
    """out[:] = array[offset : offset + len(out)], by the backend's own asynchronous copy where it has one."""
    own = getattr(backend, "copy_to_host_async", None)
    if own is not None:
        return own(array, offset, out, after)
    _wait_all(after)
    out[...] = backend.download(array[offset : offset + len(out)], dtype)
    return Done()


def copy_from_host_async(backend: Any, host: np.ndarray, array: Any, offset: int, dtype: DType,
                         after: Any = ()) -> Pending:
    """array[offset : offset + len(host)] = host, by the backend's own asynchronous copy where it has one."""
    own = getattr(backend, "copy_from_host_async", None)
    if own is not None:
        return own(host, array, offset, after)
    _wait_all(after)
    array[offset : offset + len(host)] = backend.upload(host, dtype)
    return Done()


def staging_buffer(backend: Any, count: int, dtype: DType) -> np.ndarray:
    """A host buffer of `count` elements for staging this backend's chunks (pinned where the backend has such)."""
    own = getattr(backend, "staging_buffer", None)
    return own(count, dtype) if own is not None else np.empty(count, dtype=dtype.host)


# A download into host memory allocated beforehand, outside any timer (as nccl-tests and BabelStream allocate their
# buffers before timing): a backend may offer
#   download_buffer(shape, dtype) -> np.ndarray    host memory its copies are fastest into (pinned on CuPy), its
#                                                  pages touched already
#   download_into(array, out) -> None              out[...] = array, returns once the copy has completed
# A copy into fresh pageable memory spends most of its time on the first touch of the new pages; into pinned memory
# allocated (and touched) before, it is far faster (docs/gpu.md has the figures).


def download_buffer(backend: Any, shape: tuple[int, ...], dtype: DType) -> np.ndarray | None:
    """Host memory for `download(backend, array, dtype, out)`, from the backend where it offers it; None where the
    backend takes no such buffer (its download allocates the host copy itself)."""
    own = getattr(backend, "download_buffer", None)
    return own(tuple(shape), dtype) if own is not None else None


def download(backend: Any, array: Any, dtype: DType, out: np.ndarray | None = None) -> np.ndarray:
    """A host copy of a device array: into `out` (from download_buffer) where given, else a new array."""
    if out is None:
        return backend.download(array, dtype)
    backend.download_into(array, out)
    return out


def check_download_target(array: Any, out: np.ndarray) -> None:
    """download_into's target must be a C-contiguous host array of the device array's shape and dtype."""
    if tuple(out.shape) != tuple(array.shape) or out.dtype != array.dtype or not out.flags.c_contiguous:
        raise ValueError(f"download_into needs a C-contiguous {array.dtype} host array of shape {array.shape}, "
                         f"got {out.dtype} {out.shape}")


def touched_empty(shape: tuple[int, ...], dtype: DType) -> np.ndarray:
    """A host array whose pages the kernel has already supplied (written once), so that a timed copy into it pays
    the copy only."""
    out = np.empty(shape, dtype=dtype.host)
    out.fill(0)
    return out


def can_wrap_host(backend: Any) -> bool:
    """Whether the backend can compute on host memory it is handed (wrap_host: a device array over those bytes,
    nothing copied): a device whose memory is the host's and whose backend offers it (OpenCL on a CPU device)."""
    own = getattr(backend, "wrap_host", None)
    return own is not None and can_map_to_host(backend)


def can_map_to_host(backend: Any) -> bool:
    """Whether the backend maps chunks of its arrays to host views without a copy (its memory is the host's)."""
    own = getattr(backend, "can_map_to_host", None)
    return bool(own()) if own is not None else False


@dataclass(frozen=True)
class BackendSpec:
    """A backend as named on the command line: `host`, `opencl:1`, `cupy`, `sim:mi300x`, `auto`."""

    name: str
    index: int | None = None  # device index within the backend; None: chosen by local rank
    model: str | None = None  # the sim catalog key, for sim

    def __str__(self) -> str:
        if self.model is not None:
            return f"{self.name}:{self.model}" + (f":{self.index}" if self.index is not None else "")
        return self.name if self.index is None else f"{self.name}:{self.index}"


@dataclass(frozen=True)
class Capabilities:
    """What a backend is, declared once by its module (`CAPABILITIES`) and read wherever code outside backends/
    would otherwise test a backend's name. A device's own facts (its dtypes, its kind, what its buffers are for MPI)
    are in its DeviceInfo and Backend.mpi_memory_kind()."""

    array_module: str  # what its arrays are: "numpy", "cupy", "pyopencl", ...
    buffers_in_host_memory: bool  # its buffers are host memory and count against the host's (a CPU device's always are)
    memory_is_the_hosts: bool = False  # its free memory is the host's: the host's memory check counts it already
    computes_on_host_arrays: bool = False  # computes on NumPy arrays as they are: nothing to upload or copy back
    limits_own_threads: bool = False  # sets its own BLAS threads per rank; else the harness shares the node's cores
    native_low_precision: bool = True  # fp16/bf16 GEMMs in the dtype itself where its DeviceInfo offers it
    simulated: bool = False  # times modelled from a catalog: listed by `devices` with --sim only, a spec names a model
    gpu_aware_mpi: bool = False  # its device buffers may go to a GPU-aware MPI without host staging
    torch_device: str | None = None  # where torch computes for its ranks: "cuda" (the GPU torch sees), "cpu", or None
    # (torch cannot compute there: the CPU stands in)
    spec_syntax: str = "{name}[:INDEX]"  # how --backend names it, for messages


# The registry: the only global state. Modules are imported on first use so that a missing optional package
# (cupy, pyopencl) only affects its own backend. Backends from other packages register through the entry point
# group "hetbench.backends" (name = module), e.g. in their pyproject.toml:
#   [project.entry-points."hetbench.backends"]
#   toy = "toy_backend"
# Such a plugin is contained: one that does not import (raises or calls sys.exit), lacks the protocol, or whose
# functions raise is unavailable, with its name and why (`hetbench devices` lists it), and the rest works.
ENTRY_POINT_GROUP = "hetbench.backends"
BUILTIN_MODULES: dict[str, str] = {
    "host": "hetbench.backends.host",
    "opencl": "hetbench.backends.opencl",
    "cupy": "hetbench.backends.cupy",
    "sim": "hetbench.backends.sim",
}


def _discover(group: str, builtin: dict[str, str]) -> dict[str, str]:
    """The built-in modules, then those the installed distributions register under `group` (name -> module); a
    name taken already keeps its first module."""
    from importlib.metadata import entry_points

    found = dict(builtin)
    for ep in entry_points(group=group):
        found.setdefault(ep.name.strip().lower(), ep.module)
    return found


_MODULES: dict[str, str] = _discover(ENTRY_POINT_GROUP, BUILTIN_MODULES)
BACKEND_NAMES: tuple[str, ...] = tuple(_MODULES)
# `auto` tries these, in order, and takes the first with a device
AUTO_ORDER: tuple[str, ...] = ("cupy", "opencl", "host")


@runtime_checkable
class BackendModule(Protocol):
    """What every backend module (host.py, opencl.py, cupy.py, sim.py) defines at module level. A module may also
    define `parse_spec(text, parts) -> BackendSpec` where its --backend names carry more than an index (sim:MODEL),
    and `spec_of(info) -> str`, what --backend takes for one of its devices."""

    CAPABILITIES: Capabilities

    def unavailable_reason(self) -> str | None:
        """None when the backend can run here, else why not (a missing package, no device, a bad setting)."""

    def list_devices(self) -> list[DeviceInfo]:
        """The devices of this backend on this node (sim: the catalog). Call only when unavailable_reason() is
        None."""

    def open_device(self, spec: BackendSpec, local_rank: int, local_size: int) -> Backend:
        """Open the device `spec` names; without an index, the one for `local_rank` of `local_size` ranks."""


# what a backend module defines (BackendModule); a plugin lacking one is unavailable, named with what it lacks
_PROTOCOL = ("CAPABILITIES", "unavailable_reason", "list_devices", "open_device")
# a plugin that failed to import, by name: why (it is not imported again: a module that failed is not kept in
# sys.modules, and its import's side effects would run again)
_BROKEN: dict[str, str] = {}


def plugin_broke(error: BaseException) -> bool:
    """Whether `error`, out of a plugin's code, means the plugin failed: any Exception, SystemExit (sys.exit), and a
    KeyboardInterrupt that no signal raised (the plugin's own `raise KeyboardInterrupt`: once hetbench handles the
    signals, SIGINT and SIGTERM raise its own signals.Interrupted, which stays a signal)."""
    if isinstance(error, (Exception, SystemExit)):
        return True
    if isinstance(error, KeyboardInterrupt):
        return signals.installed() and not isinstance(error, signals.Interrupted)
    return False


def plugin_failure(error: BaseException) -> str:
    """What a plugin's failure was, in a few words: its exception, or the code it exited with (sys.exit)."""
    if isinstance(error, SystemExit):
        return f"SystemExit: it called sys.exit({error.code!r})"
    return f"{type(error).__name__}: {error}"


class _Contained:
    """A backend module from another package, its functions contained: one that raises (any Exception) or exits
    (SystemExit) raises BackendUnavailable naming the backend, the function and why, so that the backend alone is
    out. ValueError (parse_spec's malformed spec, UnsupportedDtype) and BackendUnavailable pass as they are: they
    are the protocol's own answers. A signal (plugin_broke) passes too."""

    def __init__(self, name: str, module: Any) -> None:
        self._name, self._module = name, module

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(self._module, attribute)
        if not callable(value) or isinstance(value, type):
            return value
        name = self._name

        def contained(*args: Any, **kwargs: Any) -> Any:
            try:
                return value(*args, **kwargs)
            except (BackendUnavailable, ValueError):
                raise
            except BaseException as e:
                if not plugin_broke(e):
                    raise
                raise BackendUnavailable(f"backend {name!r}: its {attribute}() failed: {plugin_failure(e)}") from None

        return contained


def backend_module(name: str) -> BackendModule:
    """The module implementing backend `name` (see BackendModule). A backend from another package that does not
    import (an exception, or sys.exit), or lacks what the protocol needs, raises BackendUnavailable saying why; its
    functions raise BackendUnavailable where they fail (_Contained)."""
    try:
        path = _MODULES[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; accepted: auto, {', '.join(BACKEND_NAMES)}") from None
    if name in BUILTIN_MODULES:
        return cast(BackendModule, importlib.import_module(path))
    if name not in _BROKEN:
        try:
            module = importlib.import_module(path)
        except BaseException as e:  # a plugin that does not import: that backend alone is out
            if not plugin_broke(e):
                raise
            _BROKEN[name] = (f"backend {name!r} (module {path}, from its entry point) cannot be imported: "
                             f"{plugin_failure(e)}")
        else:
            missing = [a for a in _PROTOCOL if not hasattr(module, a)]
            if not missing and not isinstance(module.CAPABILITIES, Capabilities):
                missing = ["CAPABILITIES as a hetbench.backends.base.Capabilities"]
            if missing:
                _BROKEN[name] = (f"backend {name!r} (module {path}, from its entry point) is no backend module: it "
                                 f"lacks {', '.join(missing)}")
            else:
                return cast(BackendModule, _Contained(name, module))
    raise BackendUnavailable(_BROKEN[name])


def capabilities(name: str) -> Capabilities:
    """What backend `name` is (its module's CAPABILITIES)."""
    return backend_module(name).CAPABILITIES


def spec_of(info: DeviceInfo) -> str:
    """What --backend takes for the device `info` describes: `opencl:0`, or what its module's spec_of says (a
    plugin's that fails: the plain form)."""
    try:
        own = getattr(backend_module(info.backend), "spec_of", None)
        return own(info) if own is not None else f"{info.backend}:{info.index}"
    except BackendUnavailable:
        return f"{info.backend}:{info.index}"


def spec_index(value: str, text: str) -> int:
    """The device index in backend spec `text`."""
    if not (value.isascii() and value.isdigit()) or len(value) > 10 or int(value) > MAX_DEVICE_INDEX:
        raise ValueError(f"bad device index {value!r} in backend {text!r}; accepted: an integer from 0 to "
                         f"{MAX_DEVICE_INDEX}")
    return int(value)


MAX_DEVICE_INDEX = 2**31 - 1  # what a C int (cudaSetDevice, clGetDeviceIDs' counts) holds


def accepted_specs() -> str:
    """The --backend names every registered backend takes, for messages (a plugin that does not import: NAME[:INDEX],
    so that the message is still said)."""
    def syntax(name: str) -> str:
        try:
            return capabilities(name).spec_syntax.format(name=name)
        except BackendUnavailable:
            return f"{name}[:INDEX]"

    return ", ".join(["auto", *(syntax(n) for n in BACKEND_NAMES)])


def devices_on_node(name: str) -> list[DeviceInfo]:
    """The devices of backend `name` on this node; [] when the backend is unavailable (a plugin's that fails too)."""
    try:
        module = backend_module(name)
        if module.unavailable_reason() is not None:
            return []
        return module.list_devices()
    except BackendUnavailable:
        return []


def resolve_auto(spec: BackendSpec, local_rank: int = 0) -> BackendSpec:
    """`auto`: the best real device on this node: a CuPy GPU, then an OpenCL GPU, then the host CPU."""
    if spec.name != "auto":
        return spec
    for name in AUTO_ORDER:
        devices = devices_on_node(name)
        if name == "opencl":
            # auto takes an OpenCL GPU, never an OpenCL CPU device; ranks on a node spread over the GPUs
            gpus = [d for d in devices if d.kind == "gpu"]
            if gpus:
                return BackendSpec(name, gpus[local_rank % len(gpus)].index)
        elif devices:
            return BackendSpec(name, spec.index)
    return BackendSpec("host", spec.index)


def open_backend(spec: BackendSpec, local_rank: int = 0, local_size: int = 1) -> Backend:
    """Open the device `spec` names. Without an index, ranks on one node take different devices by local rank."""
    spec = resolve_auto(spec, local_rank)
    module = backend_module(spec.name)
    reason = module.unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(f"backend {spec} is unavailable: {reason}")
    return module.open_device(spec, local_rank, local_size)


def index_for_rank(spec: BackendSpec, device_count: int, local_rank: int) -> int:
    """The device index a rank uses: the one named, else its local rank modulo the number of devices."""
    if device_count <= 0:
        raise BackendUnavailable(f"backend {spec.name} has no device on this node")
    if spec.index is None:
        return local_rank % device_count
    if not 0 <= spec.index < device_count:
        raise BackendUnavailable(
            f"device index {spec.index} is out of range for backend {spec.name}: "
            f"this node has {device_count} device(s), indices 0..{device_count - 1}"
        )
    return spec.index


def spec_label(spec: BackendSpec, info: DeviceInfo) -> str:
    """How a rank's backend is shown: as the user named it, or for `auto`, what auto chose."""
    if spec.name != "auto":
        return str(spec)
    return f"{info.backend}:{info.index} (auto)"
