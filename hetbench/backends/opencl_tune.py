"""The self-tuning OpenCL GEMM (kernels/gemm_tuned.cl): its parameters, their search per device, dtype and shape
class (every candidate's product checked against NumPy before it may win), and the on-disk cache of winners keyed
by the device's platform, name and driver version. The OpenCL backend (opencl.py) launches it and decides when to
tune; nothing here prints: notes are returned to the caller."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import math
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hetbench.dtypes import DType
from hetbench.kernels_path import kernel_source

KERNEL_FILE = "gemm_tuned.cl"
# the folder of hetbench's caches; default XDG_CACHE_HOME/hetbench or ~/.cache/hetbench
CACHE_ENV = "HETBENCH_CACHE_DIR"
SCHEMA = "hetbench.opencl-gemm-tuning"
VERSION = 1
DEFAULT_BUDGET_SECONDS = 60.0
MAX_ACCUMULATORS = 1024  # wm * vw * nv: the search's largest is 12 * 16 * 2 = 384
MAX_PACKED_COLUMNS = 16384  # nc: the search's largest is 1024
MAX_CACHE_BYTES = 16 << 20  # a cache file holds a few entries: KBs

_REAL_OPTIONS: dict[str, tuple[str, ...]] = {
    "fp32": ("-DREAL=float",),
    "fp64": ("-DREAL=double", "-DREAL_IS_DOUBLE"),
    "fp16": ("-DREAL=half", "-DREAL_IS_HALF"),
}
_ACC_ITEMSIZE = {"fp32": 4, "fp64": 8, "fp16": 4}
_VECTOR_WIDTHS = (1, 2, 4, 8, 16)
# gemm_tuned(M, N, K, col_base, ncols, A, a_offset, B, b_offset, C, c_offset); pack_b(N, K, col_base, ncols, B,
# b_offset, Bp); None marks a buffer
_GEMM_ARGS = [np.int32] * 5 + [None, np.uint64] * 3
_PACK_ARGS = [np.int32] * 4 + [None, np.uint64, None]

# The shape classes tuned separately, each at one representative (m, n, k). "thin" is a slice of rows (split's and
# train's shapes); the class of a product is decided by shape_class.
SHAPE_CLASSES: dict[str, tuple[int, int, int]] = {
    "small": (256, 256, 256),
    "thin": (128, 1024, 1024),
    "medium": (1024, 1024, 1024),
    # 2048, not the class's smallest (1536): at 2048 rows of A and B lie 8 KiB apart and share cache sets, so the
    # winner can differ from the one at 1536
    "large": (2048, 2048, 2048),
}


def shape_class(m: int, n: int, k: int) -> str:
    """The tuning class of an m x k by k x n product."""
    volume = m * n * k
    if volume < 384**3:
        return "small"
    if min(m, n) < 256:
        return "thin"
    if volume >= 1536**3:
        return "large"
    return "medium"


@dataclass(frozen=True)
class GemmParams:
    """One point of the kernel's parameter space (see kernels/gemm_tuned.cl for what each does)."""

    vw: int  # vector width along N
    nv: int  # vectors per work-item along N
    wm: int  # rows per work-item
    lx: int  # work-group along N
    ly: int = 1  # work-group along M
    use_local: int = 0  # stage A and B slices in local memory
    kb: int = 16  # K depth staged per step (use_local only)
    pack: int = 0  # copy B into contiguous panels first (not with use_local)
    nc: int = 0  # columns per packed chunk (pack only): the copy is K x nc

    @property
    def wn(self) -> int:
        return self.vw * self.nv

    def problem(self) -> str | None:
        """What makes these parameters unusable on any device, or None."""
        if self.vw not in _VECTOR_WIDTHS:
            return f"vw={self.vw} is not one of {_VECTOR_WIDTHS}"
        for name in ("nv", "wm", "lx", "ly", "kb"):
            value = getattr(self, name)
            if not 1 <= value <= 256:
                return f"{name}={value} is outside 1..256"
        if self.use_local not in (0, 1) or self.pack not in (0, 1):
            return "use_local and pack are 0 or 1"
        if self.use_local and self.pack:
            return "pack needs use_local=0"
        if self.pack and (self.nc <= 0 or self.nc % (self.lx * self.wn)):
            return f"nc={self.nc} is not a positive multiple of lx * vw * nv = {self.lx * self.wn}"
        if not self.pack and self.nc:
            return "nc needs pack=1"
        # bounds far past any point the search visits: a doctored cache must not ask for a work-item of a million
        # accumulators (a compile of minutes, or none) or a packed panel of gigabytes
        if self.wm * self.wn > MAX_ACCUMULATORS:
            return f"wm * vw * nv = {self.wm * self.wn} accumulators per work-item, over {MAX_ACCUMULATORS}"
        if self.nc > MAX_PACKED_COLUMNS:
            return f"nc={self.nc} is over {MAX_PACKED_COLUMNS}"
        return None

    def local_bytes(self, dtype_name: str) -> int:
        if not self.use_local:
            return 0
        return (self.ly * self.wm * self.kb + self.kb * self.lx * self.wn) * _ACC_ITEMSIZE[dtype_name]

    def build_options(self, dtype_name: str) -> list[str]:
        values = {"VW": self.vw, "NV": self.nv, "WM": self.wm, "LX": self.lx, "LY": self.ly,
                  "USE_LOCAL": self.use_local, "KB": self.kb, "PACK": self.pack}
        return [*_REAL_OPTIONS[dtype_name], *(f"-D{key}={value}" for key, value in values.items())]

    def label(self) -> str:
        """e.g. "8x1x16 wg8x1 packB256": rows x vectors x vector width per work-item, the work-group, and where the
        operands come from (packB<nc>: B packed in chunks of nc columns; local<kb>: local memory; global)."""
        memory = f"local{self.kb}" if self.use_local else (f"packB{self.nc}" if self.pack else "global")
        return f"{self.wm}x{self.nv}x{self.vw} wg{self.lx}x{self.ly} {memory}"

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "GemmParams":
        """Parameters from a cache entry; ValueError for anything but a complete, consistent set."""
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(data, dict) or sorted(data) != sorted(names):
            raise ValueError(f"params must have exactly the keys {names}")
        if not all(isinstance(data[n], int) and not isinstance(data[n], bool) for n in names):
            raise ValueError("params must be integers")
        params = cls(**data)
        problem = params.problem()
        if problem:
            raise ValueError(problem)
        return params


@dataclass(frozen=True)
class DeviceFacts:
    """What the search needs to know of a device: its kind and limits."""

    kind: str  # "cpu", "gpu", "accelerator"
    max_work_group_size: int
    max_work_item_sizes: tuple[int, ...]
    local_mem_bytes: int
    vector_widths: dict[str, int]  # the device's preferred vector width per dtype

    @classmethod
    def of(cls, device: Any, kind: str) -> "DeviceFacts":
        widths = {"fp32": int(device.preferred_vector_width_float), "fp64": int(device.preferred_vector_width_double),
                  "fp16": int(device.preferred_vector_width_half)}
        return cls(kind, int(device.max_work_group_size), tuple(int(s) for s in device.max_work_item_sizes),
                   int(device.local_mem_size), widths)

    def problem(self, params: GemmParams, dtype_name: str) -> str | None:
        """What makes `params` unusable on this device (over one of its limits), or None."""
        problem = params.problem()
        if problem:
            return problem
        if params.lx * params.ly > self.max_work_group_size:
            return (f"a work-group of {params.lx} x {params.ly} = {params.lx * params.ly} work-items, over the "
                    f"device's max_work_group_size {self.max_work_group_size}")
        if params.lx > self.max_work_item_sizes[0] or params.ly > self.max_work_item_sizes[1]:
            wide = f"{params.lx} wide" if params.lx > self.max_work_item_sizes[0] else f"{params.ly} high"
            return (f"a work-group {wide}, over the device's max_work_item_sizes "
                    f"{list(self.max_work_item_sizes[:2])}")
        if params.local_bytes(dtype_name) > self.local_mem_bytes:
            return (f"{params.local_bytes(dtype_name)} bytes of local memory, over the device's local_mem_size "
                    f"{self.local_mem_bytes}")
        return None

    def fits(self, params: GemmParams, dtype_name: str) -> bool:
        return self.problem(params, dtype_name) is None

    def vector_width(self, dtype_name: str) -> int:
        width = self.vector_widths.get(dtype_name, 0) or 4
        return max(w for w in _VECTOR_WIDTHS if w <= max(1, width))


def default_params(facts: DeviceFacts, dtype_name: str) -> GemmParams:
    """The search's starting point, and what `auto` runs on a CPU device before any tune."""
    if facts.kind == "cpu":
        vw = facts.vector_width(dtype_name)
        return _normalised(GemmParams(vw=vw, nv=1, wm=8, lx=8, pack=1, nc=256))
    return GemmParams(vw=1, nv=4, wm=4, lx=16, ly=16, use_local=1, kb=16)


def _normalised(p: GemmParams) -> GemmParams:
    """nc rounded up to a whole number of work-groups' columns (pack), 0 otherwise."""
    if not p.pack:
        return dataclasses.replace(p, nc=0)
    step = p.lx * p.wn
    return dataclasses.replace(p, nc=max(step, -(-max(p.nc, 1) // step) * step))


def search_axes(facts: DeviceFacts, dtype_name: str) -> list[list[dict[str, int]]]:
    """The coordinate search's axes: each a list of changes tried from the best point so far, in turn."""
    if facts.kind == "cpu":
        # a CPU OpenCL (PoCL) runs a work-group as loops over its work-items and keeps a work-item's vectors in
        # SIMD registers: wide vectors and many rows per work-item, the B panel packed against cache-set conflicts
        vw = facts.vector_width(dtype_name)
        return [
            [{"wm": wm} for wm in (4, 6, 8, 12)],
            [{"vw": vw, "nv": 1}, {"vw": vw, "nv": 2},
             {"vw": max(1, vw // 2), "nv": 2}, {"vw": max(1, vw // 2), "nv": 1}],
            [{"lx": lx} for lx in (2, 4, 8, 16)],
            [{"pack": 1, "nc": nc} for nc in (128, 256, 512)] + [{"pack": 0}],
            [{"use_local": 1, "pack": 0, "ly": 4, "kb": 32}],
        ]
    return [
        [{"lx": lx, "ly": ly} for lx, ly in ((16, 16), (8, 8), (16, 8), (32, 8))],
        [{"wm": wm} for wm in (2, 4, 8)],
        [{"vw": vw, "nv": nv} for vw, nv in ((1, 4), (1, 2), (2, 2), (4, 1), (4, 2))],
        [{"kb": kb} for kb in (8, 16, 32)],
        [{"use_local": 0, "pack": 0}, {"use_local": 0, "pack": 1, "nc": 1024}],
    ]


def candidates_planned(facts: DeviceFacts, dtype_name: str) -> int:
    return 1 + sum(len(axis) for axis in search_axes(facts, dtype_name))


# --- launching ----------------------------------------------------------------------------------------------------


class TunedKernels:
    """Builds gemm_tuned.cl per (parameters, dtype) and launches it; owns pack_b's scratch buffer (K x nc)."""

    def __init__(self, cl: Any, context: Any, queue: Any, device: Any) -> None:
        self._cl, self._context, self._queue, self._device = cl, context, queue, device
        self._built: dict[tuple[GemmParams, str], tuple[Any, Any]] = {}
        self._scratch: Any = None
        self.scratch_bytes = 0

    @property
    def queue(self) -> Any:
        return self._queue

    def build(self, params: GemmParams, dtype_name: str) -> tuple[Any, Any]:
        """(gemm kernel, pack kernel), built once; raises RuntimeError where the device cannot run them."""
        key = (params, dtype_name)
        if key in self._built:
            return self._built[key]
        cl = self._cl
        program = cl.Program(self._context, kernel_source(KERNEL_FILE)).build(options=params.build_options(dtype_name))
        gemm, pack = cl.Kernel(program, "gemm_tuned"), cl.Kernel(program, "pack_b")
        # registers can cap a kernel's work-group below the device's limit
        if gemm.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self._device) < params.lx * params.ly:
            raise RuntimeError(f"the kernel's work-group limit is below {params.lx} x {params.ly}")
        # PoCL asserts (SIGABRT) at the launch of a kernel whose local memory is over the device's
        local = gemm.get_work_group_info(cl.kernel_work_group_info.LOCAL_MEM_SIZE, self._device)
        if local > self._device.local_mem_size:
            raise RuntimeError(f"the kernel needs {local} bytes of local memory, the device has "
                               f"{self._device.local_mem_size}")
        gemm.set_scalar_arg_dtypes(_GEMM_ARGS)
        pack.set_scalar_arg_dtypes(_PACK_ARGS)
        self._built[key] = (gemm, pack)
        return gemm, pack

    def _scratch_for(self, nbytes: int) -> Any:
        if self._scratch is None or self.scratch_bytes < nbytes:
            self._scratch = None
            self._scratch = self._cl.Buffer(self._context, self._cl.mem_flags.READ_WRITE, size=nbytes)
            self.scratch_bytes = nbytes
        return self._scratch

    def enqueue(self, params: GemmParams, dtype_name: str, itemsize: int, m: int, n: int, k: int,
                a: Any, a_offset: int, b: Any, b_offset: int, c: Any, c_offset: int) -> None:
        """C = A @ B on the queue (m, n, k >= 1; offsets in elements)."""
        gemm, pack = self.build(params, dtype_name)
        wn, lx, ly = params.wn, params.lx, params.ly
        rows = -(-m // params.wm)
        if params.use_local:
            tiles = (-(-n // (lx * wn)), -(-m // (ly * params.wm)))
            gemm(self._queue, (tiles[0] * lx, tiles[1] * ly), (lx, ly), np.int32(m), np.int32(n), np.int32(k),
                 np.int32(0), np.int32(n), a, np.uint64(a_offset), b, np.uint64(b_offset), c, np.uint64(c_offset))
            return
        chunk = params.nc if params.pack else n
        panel_b = self._scratch_for(k * params.nc * itemsize) if params.pack else None
        for col_base in range(0, n, chunk):
            ncols = min(chunk, n - col_base)
            panels = -(-ncols // wn)
            if params.pack:
                pack(self._queue, (-(-panels * wn // 16) * 16, k), None, np.int32(n), np.int32(k),
                     np.int32(col_base), np.int32(panels * wn), b, np.uint64(b_offset), panel_b)
                source, source_offset = panel_b, 0
            else:
                source, source_offset = b, b_offset
            gemm(self._queue, (-(-panels // lx) * lx, -(-rows // ly) * ly), (lx, ly),
                 np.int32(m), np.int32(n), np.int32(k), np.int32(col_base), np.int32(ncols),
                 a, np.uint64(a_offset), source, np.uint64(source_offset), c, np.uint64(c_offset))

    def release(self) -> None:
        self._built.clear()
        self._scratch = None
        self.scratch_bytes = 0


# --- the search ---------------------------------------------------------------------------------------------------


@dataclass
class Measured:
    """One candidate's outcome: its best time of the repeats, or why it has none."""

    label: str
    seconds: float | None = None
    why_not: str = ""  # "failed: ...", "wrong product", "slower than 2x the best"

    def gflops(self, flop: float) -> float | None:
        return flop / self.seconds / 1e9 if self.seconds else None


@dataclass
class TuneOutcome:
    params: GemmParams
    shape: tuple[int, int, int]
    tuned_gflops: float
    default_gflops: float | None
    others_gflops: dict[str, float | None]  # "clblast", "kernel" (gemm.cl): measured at the same shape
    candidates: list[tuple[str, float | None, str]]  # (label, GFLOP/s, why not)
    search_seconds: float
    verified_shapes: list[tuple[int, int, int]]

    def entry(self) -> dict[str, Any]:
        """The cache entry."""
        return {
            "params": self.params.as_dict(),
            "label": self.params.label(),
            "shape": list(self.shape),
            "tuned_gflops": self.tuned_gflops,
            "default_gflops": self.default_gflops,
            "clblast_gflops": self.others_gflops.get("clblast"),
            "kernel_gflops": self.others_gflops.get("kernel"),
            "candidates": len(self.candidates),
            "search_seconds": self.search_seconds,
            "verified_shapes": [list(s) for s in self.verified_shapes],
            "tuned_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }


class NoWinner(RuntimeError):
    """No candidate built and computed the right product."""


def _product_ok(got: np.ndarray, reference: np.ndarray, bound: np.ndarray) -> bool:
    return bool(np.all(np.abs(got.astype(np.float64) - reference) <= bound))


def _reference(a: np.ndarray, b: np.ndarray, dtype: DType) -> tuple[np.ndarray, np.ndarray]:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    # the classical bound for a length-k dot product: |error| <= k u (|A| |B|), with a factor 2 to spare
    bound = 2 * a.shape[1] * dtype.unit_roundoff * (np.abs(a64) @ np.abs(b64))
    return a64 @ b64, bound


def tune(kernels: TunedKernels, facts: DeviceFacts, dtype: DType, cls: str, *,
         others: dict[str, Callable[[Any, Any, Any, int, int, int], None]] | None = None,
         on_step: Callable[[int, int, str], None] | None = None,
         budget_seconds: float = DEFAULT_BUDGET_SECONDS, repeat: int = 3,
         shape: tuple[int, int, int] | None = None, axes: list[list[dict[str, int]]] | None = None) -> TuneOutcome:
    """Search the kernel's parameters for `dtype` at the class's shape: a coordinate search from the default point,
    each candidate built, run once and its product checked against NumPy, then timed (best of `repeat`); the fastest
    right one wins, checked again on odd shapes (edge tiles, offsets). `others` ("clblast", "kernel": callables that
    enqueue C = A @ B on device arrays) are measured and checked the same way, for `auto`'s choice. Stops trying new
    candidates once `budget_seconds` have passed."""
    import pyopencl.array as cl_array  # pyopencl: loaded only where an OpenCL device is tuned

    start = time.perf_counter()
    m, n, k = shape or SHAPE_CLASSES[cls]
    rng = np.random.default_rng(20)
    problem = _problem(kernels, dtype, (m, n, k), rng, cl_array)
    axes = axes if axes is not None else search_axes(facts, dtype.name)
    steps = _Steps(on_step, 1 + sum(len(axis) for axis in axes) + len(others or {}))
    search = _coordinate_search(problem, facts, axes, steps, cls, start, budget_seconds, repeat)
    if search.best_seconds is None:
        raise NoWinner(f"no parameter set of {KERNEL_FILE} computed a right {dtype.name} product: "
                       + "; ".join(f"{label}: {why}" for label, _, why in search.results[:3]))
    _final_rounds(problem, search, repeat, default_params(facts, dtype.name))
    verified = _verify_edges(problem, search.best_params, rng, cl_array)
    measured_others = _measure_others(problem, others or {}, steps, cls)
    best_seconds, default_seconds = search.best_seconds, search.default_seconds
    return TuneOutcome(
        params=search.best_params, shape=(m, n, k), tuned_gflops=problem.flop / best_seconds / 1e9,
        default_gflops=problem.flop / default_seconds / 1e9 if default_seconds else None,
        others_gflops=measured_others, candidates=search.results, search_seconds=time.perf_counter() - start,
        verified_shapes=verified,
    )


@dataclass
class _Problem:
    """The search's GEMM on the device: A and B, the C each candidate writes, and NumPy's product with the bound
    its error must keep within."""

    kernels: TunedKernels
    dtype: DType
    m: int
    n: int
    k: int
    a_dev: Any
    b_dev: Any
    c_dev: Any
    reference: np.ndarray
    bound: np.ndarray

    @property
    def flop(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def launch(self, params: GemmParams) -> None:
        """Enqueue the tuned kernel with `params` on A, B and C."""
        self.kernels.enqueue(params, self.dtype.name, self.dtype.host.itemsize, self.m, self.n, self.k,
                             self.a_dev.base_data, 0, self.b_dev.base_data, 0, self.c_dev.base_data, 0)

    def measure(self, label: str, launch: Callable[[], None], best: float | None, repeat: int) -> Measured:
        """`launch` run once and its product checked, then timed `repeat` times (its best); out as soon as one run
        takes more than twice `best`, or where the device refuses it."""
        queue = self.kernels.queue
        self.c_dev.fill(np.nan)  # a launch that writes nothing fails the check
        try:
            launch()  # the first run builds caches and is checked
            queue.finish()
            if not _product_ok(self.c_dev.get(), self.reference, self.bound):
                return Measured(label, why_not="wrong product")
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                launch()
                queue.finish()
                times.append(time.perf_counter() - t0)
                if best is not None and times[-1] > 2 * best:
                    return Measured(label, why_not="slower than 2x the best")
        except Exception as e:  # a build or launch the device refuses: that candidate is out, the search goes on
            first_line = str(e).splitlines()[0][:120] if str(e) else ""
            return Measured(label, why_not=f"failed: {type(e).__name__}: {first_line}")
        return Measured(label, seconds=min(times))

    def candidate(self, params: GemmParams, best: float | None, repeat: int) -> Measured:
        return self.measure(params.label(), lambda: self.launch(params), best, repeat)


def _problem(kernels: TunedKernels, dtype: DType, shape: tuple[int, int, int], rng: np.random.Generator,
             cl_array: Any) -> _Problem:
    """Random A (m x k) and B (k x n) in [-1, 1), on the device with an empty C, and their product in float64."""
    m, n, k = shape
    a = rng.uniform(-1, 1, (m, k)).astype(dtype.host)
    b = rng.uniform(-1, 1, (k, n)).astype(dtype.host)
    reference, bound = _reference(a, b, dtype)
    queue = kernels.queue
    a_dev, b_dev = cl_array.to_device(queue, a), cl_array.to_device(queue, b)
    c_dev = cl_array.empty(queue, (m, n), dtype.host)
    return _Problem(kernels, dtype, m, n, k, a_dev, b_dev, c_dev, reference, bound)


class _Steps:
    """The search's progress: on_step(steps done, steps planned, label) after each step."""

    def __init__(self, on_step: Callable[[int, int, str], None] | None, planned: int) -> None:
        self.on_step, self.planned, self.done = on_step, planned, 0

    def __call__(self, label: str) -> None:
        self.done += 1
        if self.on_step:
            self.on_step(self.done, self.planned, label)


@dataclass
class _Search:
    """The coordinate search's state: each candidate's (label, GFLOP/s, why not), the parameters tried, the right
    ones' (best seconds, parameters), the best so far and the default's time."""

    best_params: GemmParams
    results: list[tuple[str, float | None, str]] = dataclasses.field(default_factory=list)
    tried: set[GemmParams] = dataclasses.field(default_factory=set)
    right: list[tuple[float, GemmParams]] = dataclasses.field(default_factory=list)
    best_seconds: float | None = None
    default_seconds: float | None = None

    def note(self, params: GemmParams, got: Measured, flop: float) -> None:
        """A candidate's outcome; the best so far where it is right and faster."""
        self.results.append((got.label, got.gflops(flop), got.why_not))
        if got.seconds is not None:
            self.right.append((got.seconds, params))
            if self.best_seconds is None or got.seconds < self.best_seconds:
                self.best_params, self.best_seconds = params, got.seconds


def _coordinate_search(problem: _Problem, facts: DeviceFacts, axes: list[list[dict[str, int]]], steps: _Steps,
                       cls: str, start: float, budget_seconds: float, repeat: int) -> _Search:
    """From the default point, each axis's changes in turn to the best so far; a candidate that was tried, does not
    fit the device, or comes once the budget has passed is skipped (a step all the same)."""
    name = problem.dtype.name
    search = _Search(default_params(facts, name))
    if facts.fits(search.best_params, name):
        default = search.best_params
        search.tried.add(default)
        first = problem.candidate(default, None, repeat)
        search.note(default, first, problem.flop)
        search.default_seconds = first.seconds
    steps(f"tune {name} {cls}: default")
    for axis in axes:
        for change in axis:
            params = _normalised(dataclasses.replace(search.best_params, **change))
            if params in search.tried or not facts.fits(params, name) or time.perf_counter() - start > budget_seconds:
                steps(f"tune {name} {cls}")
                continue
            search.tried.add(params)
            search.note(params, problem.candidate(params, search.best_seconds, repeat), problem.flop)
            steps(f"tune {name} {cls}: {len(search.results)} tried")
    return search


def _final_rounds(problem: _Problem, search: _Search, repeat: int, default: GemmParams) -> None:
    """The three fastest again, in alternating rounds, the winner by its median: on a shared machine one
    candidate's best run can fall in a quiet second that another's never saw."""
    finalists = [params for _, params in sorted(search.right, key=lambda r: r[0])[:3]]
    if len(finalists) <= 1:
        return
    rounds: dict[GemmParams, list[float]] = {params: [] for params in finalists}
    for _ in range(repeat):
        for params in finalists:
            t0 = time.perf_counter()
            problem.launch(params)
            problem.kernels.queue.finish()
            rounds[params].append(time.perf_counter() - t0)
    search.best_params = min(finalists, key=lambda params: float(np.median(rounds[params])))
    search.best_seconds = float(np.median(rounds[search.best_params]))
    if search.default_seconds is not None and search.best_params == default:
        search.default_seconds = search.best_seconds


def _verify_edges(problem: _Problem, params: GemmParams, rng: np.random.Generator,
                  cl_array: Any) -> list[tuple[int, int, int]]:
    """The winner once more on shapes with edge tiles in every direction and row offsets, as matmul's slices have;
    NoWinner where one product is wrong. The shapes checked."""
    dtype, kernels = problem.dtype, problem.kernels
    queue = kernels.queue
    verified = []
    for em, en, ek in ((params.wm * 3 + 1, params.wn * params.lx + 3, 37), (1, 1, 1), (67, 13, 129)):
        ea = rng.uniform(-1, 1, (em + 2, ek)).astype(dtype.host)
        eb = rng.uniform(-1, 1, (ek, en)).astype(dtype.host)
        ea_dev, eb_dev = cl_array.to_device(queue, ea), cl_array.to_device(queue, eb)
        ec_dev = cl_array.empty(queue, (em + 1, en), dtype.host)
        kernels.enqueue(params, dtype.name, dtype.host.itemsize, em, en, ek, ea_dev.base_data, 2 * ek,
                        eb_dev.base_data, 0, ec_dev.base_data, en)
        queue.finish()
        ref, edge_bound = _reference(ea[2:], eb, dtype)
        if not _product_ok(ec_dev.get()[1:], ref, edge_bound):
            raise NoWinner(f"the fastest parameters ({params.label()}) compute a wrong {em}x{en}x{ek} product")
        verified.append((em, en, ek))
    return verified


def _measure_others(problem: _Problem, others: dict[str, Callable[[Any, Any, Any, int, int, int], None]],
                    steps: _Steps, cls: str) -> dict[str, float | None]:
    """The other GEMMs' GFLOP/s at the same shape (best of 2, checked the same way; None where one failed)."""
    p = problem
    measured: dict[str, float | None] = {}
    for name, enqueue in others.items():
        got = p.measure(name, lambda: enqueue(p.a_dev, p.b_dev, p.c_dev, p.m, p.n, p.k), None, repeat=2)  # noqa: B023
        measured[name] = got.gflops(p.flop)
        steps(f"tune {p.dtype.name} {cls}: {name}")
    return measured


# --- the cache ----------------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """HETBENCH_CACHE_DIR, else XDG_CACHE_HOME/hetbench, else ~/.cache/hetbench."""
    own = os.environ.get(CACHE_ENV, "").strip()
    if own:
        return Path(own).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hetbench"


@dataclass(frozen=True)
class DeviceKey:
    """Whose winners a cache file holds: a winner is right only for the device and driver that measured it."""

    platform: str
    platform_version: str
    name: str
    driver_version: str

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        return f"{self.name} on {self.platform}, driver {self.driver_version}"

    def path(self) -> Path:
        # one file per platform and device name; the versions are checked inside it, so that a driver update is
        # noticed (and said) rather than silently missed
        slug = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")[:40] or "device"
        digest = hashlib.sha256(f"{self.platform}\0{self.name}".encode()).hexdigest()[:10]
        return cache_dir() / f"opencl-gemm-{slug}-{digest}.json"


def entry_key(dtype_name: str, cls: str) -> str:
    return f"{dtype_name}/{cls}"


def _check_entry(entry: Any) -> None:
    if not isinstance(entry, dict):
        raise ValueError("an entry is not an object")
    GemmParams.from_dict(entry.get("params"))
    value = entry.get("tuned_gflops")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError("tuned_gflops is not a positive number")
    for name in ("clblast_gflops", "kernel_gflops", "default_gflops"):
        value = entry.get(name)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                  or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{name} is not a positive number")


def _read(path: Path) -> dict[str, Any]:
    """The cache document at path, checked; ValueError (or OSError) naming what is wrong."""
    # opened without waiting: a FIFO (or a device) at the cache's path blocked the open, and the command, for ever
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket")
            raise ValueError(f"it is {kind}, not a regular file")
        if os.fstat(fd).st_size > MAX_CACHE_BYTES:
            raise ValueError(f"it is {os.fstat(fd).st_size} bytes, more than a cache may be ({MAX_CACHE_BYTES})")
        raw = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
    finally:
        os.close(fd)
    try:
        document = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError("not UTF-8 text") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at line {e.lineno})") from e
    except RecursionError:  # nesting deeper than the parser's stack: no cache this module wrote
        raise ValueError("nested deeper than a cache is") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} document")
    if document.get("version") != VERSION:
        raise ValueError(f"version {document.get('version')!r}, this hetbench reads {VERSION}")
    device, entries = document.get("device"), document.get("entries")
    if not isinstance(device, dict) or not isinstance(entries, dict):
        raise ValueError("no device or entries")
    for name, entry in entries.items():
        try:
            _check_entry(entry)
        except ValueError as e:
            raise ValueError(f"entry {name!r}: {e}") from None
    return document


def load_entries(key: DeviceKey, facts: DeviceFacts | None = None) -> tuple[dict[str, dict[str, Any]], str | None]:
    """The cached winners for this device and driver, and a one-line note where a cache file was there but is
    ignored (another device or driver, unreadable, corrupt) or, given the device's `facts`, where entries past its
    limits are skipped (the others kept): nothing the device cannot run reaches its kernel."""
    path = key.path()
    if not path.exists():
        return {}, None
    try:
        document = _read(path)
    except (OSError, ValueError) as e:
        return {}, f"the OpenCL GEMM tuning cache {path} is ignored: {e}"
    theirs = document["device"]
    if theirs != key.as_dict():
        made = (f"{theirs.get('name')} on {theirs.get('platform')}, driver {theirs.get('driver_version')}"
                if all(isinstance(theirs.get(f), str) for f in ("name", "platform", "driver_version"))
                else "another device")
        return {}, (f"the OpenCL GEMM tuning cache {path} was made for {made}, not {key.describe()}: ignored "
                    f"(`hetbench tune` tunes this one)")
    entries = dict(document["entries"])
    if facts is None:
        return entries, None
    skipped = []
    for name, entry in list(entries.items()):
        dtype_name = name.split("/")[0]
        if dtype_name not in _ACC_ITEMSIZE:
            continue  # never looked up (entry_key names a dtype hetbench has)
        params = GemmParams.from_dict(entry["params"])
        problem = facts.problem(params, dtype_name)
        if problem:
            skipped.append(f"{name!r} ({params.label()}: {problem})")
            del entries[name]
    if not skipped:
        return entries, None
    return entries, (f"the OpenCL GEMM tuning cache {path}: {'entry' if len(skipped) == 1 else 'entries'} "
                     f"{', '.join(skipped)} skipped: this device cannot run {'it' if len(skipped) == 1 else 'them'} "
                     f"(`hetbench tune` tunes {'it' if len(skipped) == 1 else 'them'} again)")


def _write_atomic(path: Path, text: str) -> None:
    # a temporary file beside the target, then os.replace: a reader sees the old cache or the new one, never half
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def save_entry(key: DeviceKey, dtype_name: str, cls: str, entry: dict[str, Any]) -> Path:
    """Add or replace one winner in this device's cache file (others of the same device and driver kept; a file of
    another device or driver, or a corrupt one, replaced)."""
    _check_entry(entry)
    path = key.path()
    entries, _ = load_entries(key)
    entries[entry_key(dtype_name, cls)] = entry
    document = {"schema": SCHEMA, "version": VERSION, "device": key.as_dict(), "entries": entries}
    _write_atomic(path, json.dumps(document, indent=1, sort_keys=True) + "\n")
    return path
