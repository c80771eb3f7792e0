"""The backend contract (hetbench/backends/base.py), checked once over every backend this machine can run.

In the manner of mpi4py's test/arrayimpl.py: the same tests loop over a list of backend factories, here the host
backend, the OpenCL backend on both GEMM paths (where an OpenCL device and pyclblast exist), simulated NVIDIA, AMD
and Intel GPUs, and the CuPy backend on a CUDA and a HIP build through the fake `cupy` of tests/doubles.py.
A new backend joins the suite by adding its factory to BACKENDS.
"""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace
from typing import Callable

import numpy as np
import pytest
from helpers import HAVE_OPENCL
from doubles import FakeRuntime, make_fake_cupy

from hetbench.backends import base, cupy, host, opencl, sim
from hetbench.backends.base import (
    BACKEND_NAMES,
    MPI_MEMORY_KINDS,
    TIMING_MEASURED,
    TIMING_MODELLED,
    Backend,
    BackendModule,
    BackendSpec,
    UnsupportedDtype,
    check_dtype,
)
from hetbench.comm import gpu
from hetbench.dtypes import DTYPES, DType, round_to_bf16, to_host_dtype
from hetbench.harness.devices import device_path_error

KINDS = ("gpu", "cpu", "accelerator")


def _open_opencl(gemm: str) -> Callable[[pytest.MonkeyPatch], Backend]:
    def open_(monkeypatch: pytest.MonkeyPatch) -> Backend:
        monkeypatch.setenv(opencl.GEMM_ENV, gemm)
        return opencl.open_device(BackendSpec("opencl", 0), 0, 1)

    return open_


def _open_sim(model: str) -> Callable[[pytest.MonkeyPatch], Backend]:
    def open_(monkeypatch: pytest.MonkeyPatch) -> Backend:
        monkeypatch.delenv(sim.FAULT_ENV, raising=False)
        return sim.open_device(BackendSpec("sim", 0, model), 0, 1)

    return open_


def _open_fake_cupy(model: str) -> Callable[[pytest.MonkeyPatch], Backend]:
    def open_(monkeypatch: pytest.MonkeyPatch) -> Backend:
        fake = make_fake_cupy(FakeRuntime.from_models([sim.get_model(model)]))
        return cupy.CupyBackend(0, cupy_module=fake)

    return open_


needs_opencl = pytest.mark.skipif(not HAVE_OPENCL, reason="no OpenCL device (apt-get install pocl-opencl-icd)")
needs_clblast = pytest.mark.skipif(opencl.pyclblast is None, reason="pyclblast does not import")

BACKENDS = [
    pytest.param(lambda monkeypatch: host.open_device(BackendSpec("host"), 0, 1), id="host"),
    pytest.param(_open_opencl("kernel"), id="opencl-kernel", marks=needs_opencl),
    pytest.param(_open_opencl("clblast"), id="opencl-clblast", marks=[needs_opencl, needs_clblast]),
    pytest.param(_open_sim("v100"), id="sim-v100"),  # NVIDIA, no bf16
    pytest.param(_open_sim("mi300x"), id="sim-mi300x"),  # AMD, every dtype
    pytest.param(_open_sim("arc-a770"), id="sim-arc-a770"),  # Intel through OpenCL, no fp64
    pytest.param(_open_fake_cupy("h100"), id="cupy-cuda-fake"),
    pytest.param(_open_fake_cupy("mi300x"), id="cupy-hip-fake"),
]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    opened = request.param(monkeypatch)
    yield opened
    opened.close()


def _supported(backend: Backend) -> list[DType]:
    return [DTYPES[name] for name in backend.info().dtypes]


def _unsupported(backend: Backend) -> list[DType]:
    return [d for name, d in DTYPES.items() if name not in backend.info().dtypes]


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
    return to_host_dtype(rng.uniform(-1, 1, shape), dtype)


# --- what a backend is ------------------------------------------------------------------------------------------


def test_backend_satisfies_the_protocol(backend):
    assert isinstance(backend, Backend)
    assert backend.name in BACKEND_NAMES
    assert backend.timing in (TIMING_MEASURED, TIMING_MODELLED)


def test_info_fields(backend):
    info = backend.info()
    assert info is backend.info() or info == backend.info()  # the same device every time
    assert info.backend == backend.name
    assert isinstance(info.index, int) and info.index >= 0
    assert isinstance(info.vendor, str) and info.vendor
    assert isinstance(info.name, str) and info.name
    assert info.kind in KINDS
    assert info.memory_bytes is None or info.memory_bytes > 0
    assert info.dtypes and len(set(info.dtypes)) == len(info.dtypes)
    assert set(info.dtypes) <= set(DTYPES)
    # listed in hetbench's usual order
    assert list(info.dtypes) == [d for d in DTYPES if d in info.dtypes]
    assert isinstance(info.runtime, str) and info.runtime
    assert set(info.peak_tflops) <= set(info.dtypes) and all(v > 0 for v in info.peak_tflops.values())
    assert info.memory_bandwidth_gbps is None or info.memory_bandwidth_gbps > 0
    assert info.modelled == (backend.timing == TIMING_MODELLED)
    assert info.label == f"{info.backend}:{info.index} {info.name}"
    d = info.to_dict()
    assert d["dtypes"] == list(info.dtypes) and d["backend"] == info.backend


# --- data in and out --------------------------------------------------------------------------------------------


def test_upload_download_round_trip_per_dtype(backend):
    rng = np.random.default_rng(11)
    for dtype in _supported(backend):
        host_array = _random(rng, (13, 7), dtype)
        device_array = backend.upload(host_array, dtype)
        kept = host_array.copy()
        host_array[0, 0] = 42  # the upload is a copy: the device array does not see this
        got = backend.download(device_array, dtype)
        assert got.dtype == dtype.host and got.shape == (13, 7), dtype.name
        assert np.array_equal(got, kept), dtype.name
        assert got.flags.c_contiguous


def test_empty_shapes(backend):
    for dtype in _supported(backend):
        for shape in ((0,), (0, 5), (5, 0)):
            got = backend.download(backend.upload(np.empty(shape, dtype.host), dtype), dtype)
            assert got.shape == shape and got.dtype == dtype.host, (dtype.name, shape)
            assert backend.download(backend.empty(shape, dtype), dtype).shape == shape
        # an inner dimension of 0: the product is all zeros
        out = backend.upload(np.full((4, 3), np.nan, dtype.host), dtype)
        backend.matmul(backend.empty((4, 0), dtype), backend.empty((0, 3), dtype), out, dtype)
        assert np.array_equal(backend.download(out, dtype), np.zeros((4, 3), dtype.host)), dtype.name
        # no rows: nothing to compute, nothing fails
        backend.matmul(backend.empty((0, 5), dtype), backend.upload(np.ones((5, 3), dtype.host), dtype),
                       backend.empty((0, 3), dtype), dtype)
        backend.synchronize()


# --- compute ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m, k, n", [(37, 53, 29), (1, 64, 1), (29, 1, 37)])
def test_matmul_matches_numpy(backend, m, k, n):
    rng = np.random.default_rng(m * 1000 + n)
    for dtype in _supported(backend):
        a, b = _random(rng, (m, k), dtype), _random(rng, (k, n), dtype)
        out = backend.empty((m, n), dtype)
        backend.matmul(backend.upload(a, dtype), backend.upload(b, dtype), out, dtype)
        got = backend.download(out, dtype)
        assert got.shape == (m, n) and got.dtype == dtype.host
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        # any summation order: |error| <= k u (|A| |B|) to first order; the factor 2 also covers the final
        # rounding to the output type (bf16 and fp16 round the fp32 accumulator once)
        bound = 2 * k * dtype.unit_roundoff * (np.abs(a64) @ np.abs(b64))
        error = np.abs(got.astype(np.float64) - a64 @ b64)
        assert np.all(error <= bound), f"{dtype.name} {m}x{k} @ {k}x{n}: worst {float(np.max(error - bound))} over"
        if dtype.name == "bf16":
            assert np.array_equal(round_to_bf16(got), got)  # held in float32, but every value a bf16 one


def test_timer_gives_synchronised_seconds(backend):
    dtype = _supported(backend)[0]
    a = backend.upload(np.ones((64, 64), dtype.host), dtype)
    out = backend.empty((64, 64), dtype)
    with backend.timer() as idle:
        pass
    assert math.isfinite(idle.seconds) and idle.seconds >= 0
    with backend.timer() as timed:
        backend.matmul(a, a, out, dtype)
    # known as soon as the block ends: the timer waited for the device (the fake CuPy refuses an elapsed time
    # whose end event was not waited for)
    assert math.isfinite(timed.seconds) and timed.seconds > 0
    assert np.array_equal(backend.download(out, dtype), np.full((64, 64), 64, dtype.host))


def test_free_memory(backend):
    free = backend.free_memory_bytes()
    assert free is None or (isinstance(free, int) and free > 0)
    largest = backend.max_allocation_bytes()
    assert largest is None or largest > 0


# --- the one dtype check ----------------------------------------------------------------------------------------


def test_unsupported_dtype_is_refused_with_one_exception_type(backend):
    info = backend.info()
    for dtype in _supported(backend):
        check_dtype(info, dtype)
        check_dtype(info, dtype.name)
    unsupported = _unsupported(backend)
    if not unsupported:
        pytest.skip(f"{info.label} computes in every dtype")
    good = _supported(backend)[0]
    a = backend.upload(np.ones((2, 2), good.host), good)
    for dtype in unsupported:
        expected = (
            f"dtype {dtype.name} is not supported by {info.backend}:{info.index} ({info.name}); "
            f"it computes in: {', '.join(info.dtypes)}"
        )
        with pytest.raises(UnsupportedDtype) as err:
            check_dtype(info, dtype)
        assert str(err.value) == expected
        for refused in (
            lambda: backend.upload(np.ones((2, 2), dtype.host), dtype),
            lambda: backend.empty((2, 2), dtype),
            lambda: backend.matmul(a, a, a, dtype),
        ):
            with pytest.raises(UnsupportedDtype, match=f"dtype {dtype.name} is not supported"):
                refused()


def test_unsupported_dtype_is_a_value_error_and_nothing_else():
    assert issubclass(UnsupportedDtype, ValueError)
    assert not issubclass(UnsupportedDtype, (base.BackendUnavailable, base.DeviceError))


# --- MPI ----------------------------------------------------------------------------------------------------------


def test_mpi_memory_kind_agrees_with_mpi_buffer(backend):
    kind = backend.mpi_memory_kind()
    assert kind in MPI_MEMORY_KINDS
    dtype = DTYPES["fp32"]
    send = backend.upload(np.array([1.5, -2.0, 3.25], np.float32), dtype)
    buffer = backend.mpi_buffer(send)
    assert (buffer is None) == (kind == "none")
    if buffer is None:
        return
    if kind == "host":
        assert isinstance(buffer, np.ndarray)
    # whatever mpi_buffer gives, MPI takes (here through host memory: the fakes and sim keep data on the host)
    MPI = pytest.importorskip("mpi4py.MPI")
    recv = backend.upload(np.zeros(3, np.float32), dtype)
    backend.synchronize()
    MPI.COMM_SELF.Allreduce(buffer, backend.mpi_buffer(recv), op=MPI.SUM)
    np.testing.assert_array_equal(backend.download(recv, dtype), [1.5, -2.0, 3.25])


@pytest.mark.parametrize("model, kind", [("h100", "cuda"), ("v100", "cuda"), ("mi300x", "hip"), ("v520", "hip"),
                                         ("arc-a770", "none")])
def test_sim_answers_the_kind_of_its_real_backend(model, kind):
    assert sim.SimBackend(sim.get_model(model)).mpi_memory_kind() == kind


def test_cupy_kind_follows_the_build():
    for model, kind in (("a100", "cuda"), ("mi250x", "hip")):
        fake = make_fake_cupy(FakeRuntime.from_models([sim.get_model(model)]))
        assert cupy.CupyBackend(0, cupy_module=fake).mpi_memory_kind() == kind


def test_every_gpu_kind_has_an_mpi_query():
    """gpu_support answers for every GPU kind a backend may give, so the device path can ask about any of them."""
    gpu_kinds = set(MPI_MEMORY_KINDS) - {"host", "none"}
    assert set(gpu.gpu_support.__wrapped__()) == gpu_kinds


def test_gpu_support_asks_mpich_for_level_zero(monkeypatch):
    asked = []

    def query(gpu_type, flag_ref):
        asked.append(gpu_type)
        flag_ref._obj.value = int(gpu_type == 1)  # MPIX_GPU_SUPPORT_ZE in MPICH's mpi.h
        return 0

    monkeypatch.setattr(gpu, "_loaded_mpi_libraries", lambda: ["/fake/libmpi.so.12"])
    monkeypatch.setattr(gpu.ctypes, "CDLL", lambda path: SimpleNamespace(MPIX_GPU_query_support=query))
    assert gpu.gpu_support.__wrapped__() == {"cuda": False, "hip": False, "ze": True}
    assert sorted(asked) == [0, 1, 2]
    # an MPI with only the per-kind query
    lib = SimpleNamespace(MPIX_Query_ze_support=lambda: 1, MPIX_Query_cuda_support=lambda: 0)
    monkeypatch.setattr(gpu.ctypes, "CDLL", lambda path: lib)
    assert gpu.gpu_support.__wrapped__() == {"cuda": False, "hip": None, "ze": True}


class _KindOnly:
    """A sim device whose buffers claim another memory kind."""

    def __init__(self, model: str, kind: str) -> None:
        self._backend = sim.SimBackend(sim.get_model(model))
        self._kind = kind

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def mpi_memory_kind(self) -> str:
        return self._kind


@pytest.mark.parametrize("model, kind, support, needles", [
    ("arc-a770", "ze", {"cuda": False, "hip": False, "ze": True}, None),
    ("arc-a770", "ze", {"cuda": True, "hip": True, "ze": False}, ["reports no ZE support", "--path host"]),
    ("arc-a770", "ze", {"cuda": None, "hip": None, "ze": None}, ["has no query for ZE support"]),
    ("h100", "cuda", {"cuda": True, "hip": False, "ze": False}, None),
    ("mi300x", "hip", {"cuda": True, "hip": False, "ze": True}, ["reports no HIP support"]),
    ("h100", "host", {"cuda": False, "hip": False, "ze": False}, None),
    ("h100", "none", {"cuda": True, "hip": True, "ze": True},
     ["has no buffer MPI can take directly", "--path host"]),
])
def test_device_path_asks_the_backend_not_the_vendor(monkeypatch, model, kind, support, needles):
    """--path device goes by the backend's memory kind: an Intel device whose buffers are Level Zero memory runs
    where the MPI reports ZE support (the vendor map refused every Intel device)."""
    monkeypatch.setattr(gpu, "gpu_support", lambda: support)
    backend = _KindOnly(model, kind)
    world = SimpleNamespace(mpi_library=lambda: "MPICH 4.2.0 (stub)")
    error = device_path_error(backend, backend.info(), DTYPES["fp32"], world)
    if needles is None:
        assert error is None
    else:
        assert error is not None and error.startswith("--path device")
        for needle in needles:
            assert needle in error


def test_device_path_refuses_a_simulated_opencl_device(monkeypatch):
    backend = sim.SimBackend(sim.get_model("arc-a770"))
    world = SimpleNamespace(mpi_library=lambda: "MPICH 4.2.0 (stub)")
    monkeypatch.setattr(gpu, "gpu_support", lambda: {"cuda": True, "hip": True, "ze": True})
    error = device_path_error(backend, backend.info(), DTYPES["fp32"], world)
    assert error == ("--path device: sim device Intel Arc A770 16GB (simulated) has no buffer MPI can take directly "
                     "(OpenCL buffers have none); use --path host")


# --- closing ------------------------------------------------------------------------------------------------------


def test_close_is_safe_twice(backend):
    dtype = _supported(backend)[0]
    backend.upload(np.ones(4, dtype.host), dtype)
    backend.close()
    backend.close()


# --- the module-level contract --------------------------------------------------------------------------------------


def _protocol_parameters(function_name: str) -> list[str]:
    return list(inspect.signature(getattr(BackendModule, function_name)).parameters)[1:]  # without self


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_module_satisfies_backend_module(name):
    module = base.backend_module(name)
    assert isinstance(module, BackendModule)
    for function_name in ("unavailable_reason", "list_devices", "open_device"):
        function = getattr(module, function_name)
        assert callable(function)
        assert list(inspect.signature(function).parameters) == _protocol_parameters(function_name), function_name
    reason = module.unavailable_reason()
    assert reason is None or (isinstance(reason, str) and reason)
    if reason is None:
        devices = module.list_devices()
        assert devices and all(isinstance(d, base.DeviceInfo) for d in devices)
        assert [d.index for d in devices] == list(range(len(devices)))
        assert all(d.backend == name for d in devices)


@pytest.mark.parametrize("name, spec", [
    ("host", BackendSpec("host")),
    pytest.param("opencl", BackendSpec("opencl"), marks=needs_opencl),
    ("sim", BackendSpec("sim", model="mi250x")),
    ("cupy", BackendSpec("cupy")),
])
def test_module_opens_a_backend(monkeypatch, name, spec):
    if name == "cupy":  # through the fake: CuPy is not installed here
        fake = make_fake_cupy(FakeRuntime.from_models([sim.get_model("h100"), sim.get_model("a100")]))
        monkeypatch.setattr(cupy, "_import_cupy", lambda: fake)
    module = base.backend_module(name)
    assert module.unavailable_reason() is None
    devices = module.list_devices()
    opened = module.open_device(spec, 1, 2)
    try:
        assert isinstance(opened, Backend)
        info = opened.info()
        assert info.backend == name
        if name != "sim":  # the catalog is sim's list; a sim device takes the local rank as its index
            assert info.index == base.index_for_rank(spec, len(devices), 1)
            assert info.name == devices[info.index].name
    finally:
        opened.close()


def test_backend_module_is_typed():
    assert inspect.signature(base.backend_module).return_annotation in (BackendModule, "BackendModule")
