"""The cupy backend, tested without CuPy and without a GPU through the fake runtime and the fake `cupy` module of
tests/doubles.py. One test runs on a real GPU when CuPy and a device are present.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from doubles import H100, HIP_6_3, MI300X, FakeCUBLASError, FakeOutOfMemoryError, FakeRuntime, make_fake_cupy

import hetbench.backends.base as backend_base
import hetbench.backends.cupy as cupy_backend
from hetbench.backends.base import BackendSpec, BackendUnavailable, DeviceError
from hetbench.dtypes import DTYPES


def two_h100s(**kwargs):
    return FakeRuntime([H100, dict(H100, pciBusID=0x29)], **kwargs)


@pytest.fixture
def backend_on_1():
    """A backend on device 1 while device 0 is current, so a call that forgets to switch devices shows."""
    runtime = two_h100s(free_bytes=[1_000, 5_000])
    fake = make_fake_cupy(runtime, pool_free_bytes=300)
    backend = cupy_backend.CupyBackend(1, cupy_module=fake)
    assert runtime.getDevice() == 0
    return backend, fake, runtime


# --- describe_device -------------------------------------------------------------------------------------------


def test_describe_h100():
    info = cupy_backend.describe_device(FakeRuntime([H100]), 0)
    assert (info.backend, info.index, info.vendor, info.kind) == ("cupy", 0, "NVIDIA", "gpu")
    assert info.name == "NVIDIA H100 80GB HBM3"
    assert info.memory_bytes == 85520809984
    assert info.runtime == "CUDA runtime 12.4, driver 12.6"
    # 2 transfers * 2619 MHz * 5120 bits / 8 = 3352.32 GB/s
    assert info.memory_bandwidth_gbps == pytest.approx(3352.32, rel=1e-12)
    assert info.details["memory_bandwidth_source"] == "device properties (DDR estimate)"
    assert info.details["compute_capability"] == "9.0"
    assert "gcn_arch_name" not in info.details
    assert info.details["multiprocessor_count"] == 132
    assert info.details["clock_rate_khz"] == 1980000
    assert info.details["memory_bus_width_bits"] == 5120
    assert info.details["pci_bus_id"] == "0000:1b:00.0"
    assert info.dtypes == ("fp64", "fp32", "fp16")
    assert info.peak_tflops == {} and info.peak_source is None
    assert info.modelled is False


def test_describe_mi300x():
    runtime = FakeRuntime([MI300X], is_hip=True, runtime_version=HIP_6_3, driver_version=HIP_6_3)
    info = cupy_backend.describe_device(runtime, 0)
    assert info.vendor == "AMD"
    assert info.name == "AMD Instinct MI300X"
    assert info.details["gcn_arch_name"] == "gfx942:sramecc+:xnack-"
    assert "compute_capability" not in info.details
    assert info.memory_bytes == 205822885888
    assert info.runtime == "HIP runtime 6.3.42131, driver 6.3.42131"
    # 2 * 1300 MHz * 8192 bits / 8 = 2662.4 GB/s
    assert info.memory_bandwidth_gbps == pytest.approx(2662.4, rel=1e-12)
    assert info.details["multiprocessor_count"] == 304
    assert info.details["pci_bus_id"] == "0000:0c:00.0"


def test_describe_hip_leaves_out_an_undecodable_driver_version():
    # older ROCm answers hipDriverGetVersion with a fixed 4
    runtime = FakeRuntime([MI300X], is_hip=True, runtime_version=HIP_6_3, driver_version=4)
    assert cupy_backend.describe_device(runtime, 0).runtime == "HIP runtime 6.3.42131"


def test_describe_never_makes_a_device_current():
    runtime = two_h100s()
    runtime.current = 1
    info = cupy_backend.describe_device(runtime, 0, backend="sim")
    assert runtime.getDevice() == 1
    assert runtime.set_device_calls == []
    assert (info.backend, info.index) == ("sim", 0)


def test_describe_reads_clocks_cuda13_dropped_from_the_properties():
    props = {k: v for k, v in H100.items() if k not in ("clockRate", "memoryClockRate")}
    attributes = {(FakeRuntime.cudaDevAttrClockRate, 0): 1980000, (FakeRuntime.cudaDevAttrMemoryClockRate, 0): 2619000}
    info = cupy_backend.describe_device(FakeRuntime([props], attributes=attributes), 0)
    assert info.details["clock_rate_khz"] == 1980000
    assert info.memory_bandwidth_gbps == pytest.approx(3352.32, rel=1e-12)


def test_describe_without_a_memory_clock_gives_no_bandwidth():
    props = {k: v for k, v in H100.items() if k != "memoryClockRate"}
    info = cupy_backend.describe_device(FakeRuntime([props]), 0)  # deviceGetAttribute fails for it too
    assert info.memory_bandwidth_gbps is None
    assert "memory_bandwidth_source" not in info.details
    assert info.details["memory_clock_rate_khz"] is None


# --- CupyBackend on the fake ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", ["fp64", "fp32", "fp16"])
def test_upload_matmul_download_match_numpy(backend_on_1, dtype_name):
    backend, fake, runtime = backend_on_1
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(7)
    a_host = rng.uniform(-1, 1, (7, 5)).astype(dtype.host)
    b_host = rng.uniform(-1, 1, (5, 3)).astype(dtype.host)
    a, b = backend.upload(a_host, dtype), backend.upload(b_host, dtype)
    c = backend.empty((7, 3), dtype)
    backend.matmul(a, b, c, dtype)
    got = backend.download(c, dtype)
    assert got.dtype == dtype.host and got.shape == (7, 3)
    np.testing.assert_array_equal(got, np.matmul(a_host, b_host))
    # the upload is a copy: changing the host array afterwards leaves the device array alone
    a_host[0, 0] = 99
    assert backend.download(a, dtype)[0, 0] != 99


def test_download_into_a_pinned_buffer_on_the_stream(backend_on_1, monkeypatch):
    """matmul's timed D2H copies into pinned memory allocated before the timer (base.download_buffer)."""
    import types

    from hetbench.backends import base

    backend, fake, runtime = backend_on_1
    dtype = DTYPES["fp32"]
    pinned = []

    def empty_pinned(shape, dtype=float):
        pinned.append((shape, np.dtype(dtype)))
        return np.zeros(shape, dtype=dtype)

    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(empty_pinned=empty_pinned))
    a_host = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = backend.upload(a_host, dtype)
    out = base.download_buffer(backend, (3, 4), dtype)
    assert pinned == [((3, 4), np.dtype(np.float32))]
    fake.log.clear()
    got = base.download(backend, a, dtype, out)
    assert got is out
    np.testing.assert_array_equal(out, a_host)
    # the copy on the backend's stream, and its end waited for before the timer stops
    assert [op for op, _ in fake.log] == ["get", "stream.synchronize"] and fake.log[0][1] is backend.stream
    with pytest.raises(ValueError, match=r"shape \(3, 4\), got float32 \(4, 3\)"):
        backend.download_into(a, np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="float32 host array"):
        backend.download_into(a, np.zeros((3, 4), np.float64))


def test_download_buffer_falls_back_to_touched_pageable_memory(backend_on_1, monkeypatch):
    import types

    backend, fake, runtime = backend_on_1

    def refuse(shape, dtype=float):
        raise FakeOutOfMemoryError("cudaErrorMemoryAllocation: out of memory")

    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(empty_pinned=refuse))
    out = backend.download_buffer((5, 2), DTYPES["fp16"])
    assert out.shape == (5, 2) and out.dtype == np.float16 and out.flags.c_contiguous and not out.any()


def test_all_work_goes_to_the_backends_stream_on_its_device(backend_on_1):
    backend, fake, runtime = backend_on_1
    dtype = DTYPES["fp32"]
    assert backend.stream.device_id == 1 and backend.stream.non_blocking
    a = backend.upload(np.ones((2, 2), np.float32), dtype)
    c = backend.empty((2, 2), dtype)
    backend.matmul(a, a, c, dtype)
    backend.download(c, dtype)
    issued = [(op, stream) for op, stream in fake.log if op in ("asarray", "empty", "matmul", "get")]
    assert [op for op, _ in issued] == ["asarray", "empty", "matmul", "get"]
    assert all(stream is backend.stream for _, stream in issued)
    assert runtime.getDevice() == 0  # the caller's current device is left as it was


def test_timer_reports_the_events_elapsed_time(backend_on_1):
    backend, fake, runtime = backend_on_1
    dtype = DTYPES["fp32"]
    a = backend.upload(np.ones((4, 4), np.float32), dtype)
    c = backend.empty((4, 4), dtype)
    backend.matmul(a, a, c, dtype)  # before the timer: not counted
    with backend.timer() as t:
        for _ in range(3):
            backend.matmul(a, a, c, dtype)
    assert t.seconds == pytest.approx(3 * 2.5e-3, rel=1e-12)
    records = [stream for op, stream in fake.log if op == "event.record"]
    assert records == [backend.stream, backend.stream]


def test_mpi_buffer_synchronizes_the_stream_first(backend_on_1):
    backend, fake, runtime = backend_on_1
    dtype = DTYPES["fp32"]
    a = backend.upload(np.arange(6, dtype=np.float32).reshape(2, 3), dtype)
    c = backend.empty((2, 2), dtype)
    backend.matmul(a, a.__class__(fake, a.array.T.copy(), 1), c, dtype)
    before = len(fake.log)
    buf = backend.mpi_buffer(c)
    assert fake.log[before:] == [("stream.synchronize", backend.stream)]
    assert buf is c
    cai = buf.__cuda_array_interface__
    assert cai["shape"] == (2, 2) and cai["typestr"] == "<f4" and cai["version"] == 3
    assert cai["data"] == (c.array.__array_interface__["data"][0], False)


def test_mpi4py_takes_the_mpi_buffer(backend_on_1):
    MPI = pytest.importorskip("mpi4py.MPI")
    backend, fake, runtime = backend_on_1
    dtype = DTYPES["fp64"]
    send = backend.upload(np.array([1.5, -2.0, 3.25]), dtype)
    recv = backend.empty((3,), dtype)
    MPI.COMM_SELF.Allreduce(backend.mpi_buffer(send), backend.mpi_buffer(recv), op=MPI.SUM)
    np.testing.assert_array_equal(backend.download(recv, dtype), [1.5, -2.0, 3.25])


def test_free_memory_counts_this_device_and_the_pool(backend_on_1):
    backend, fake, runtime = backend_on_1
    assert backend.free_memory_bytes() == 5_000 + 300
    assert runtime.getDevice() == 0
    assert backend.max_allocation_bytes() is None


def test_device_errors_become_device_errors_naming_the_device(backend_on_1):
    backend, fake, runtime = backend_on_1
    dtype = DTYPES["fp32"]
    a = backend.upload(np.ones((2, 2), np.float32), dtype)
    fake.fail = ("matmul", FakeRuntime.CUDARuntimeError("cudaErrorIllegalAddress: an illegal memory access"))
    with pytest.raises(DeviceError, match=r"matmul failed on cupy:1 NVIDIA H100 80GB HBM3 .*cudaErrorIllegalAddress"):
        backend.matmul(a, a, a, dtype)
    fake.fail = ("matmul", FakeCUBLASError("CUBLAS_STATUS_EXECUTION_FAILED"))
    with pytest.raises(DeviceError, match="CUBLAS_STATUS_EXECUTION_FAILED"):
        backend.matmul(a, a, a, dtype)
    fake.fail = ("asarray", FakeOutOfMemoryError("Out of memory allocating 16 bytes"))
    with pytest.raises(DeviceError, match="upload failed on cupy:1"):
        backend.upload(np.ones((2, 2), np.float32), dtype)
    assert runtime.getDevice() == 0


def test_caller_errors_are_not_device_errors(backend_on_1):
    backend, fake, runtime = backend_on_1
    dtype = DTYPES["fp32"]
    a = backend.upload(np.ones((2, 3), np.float32), dtype)
    with pytest.raises(ValueError):  # 2x3 @ 2x3: a shape mismatch is the caller's
        backend.matmul(a, a, backend.empty((2, 3), dtype), dtype)
    with pytest.raises(ValueError, match="bf16"):
        backend.upload(np.ones(2, np.float32), DTYPES["bf16"])


def test_close_returns_the_pool_blocks_of_its_device(backend_on_1):
    backend, fake, runtime = backend_on_1
    backend.close()
    assert fake.log[-2:] == [("stream.synchronize", backend.stream), ("pool.free_all_blocks", 1)]


def test_backend_identity(backend_on_1):
    backend, fake, runtime = backend_on_1
    assert (backend.name, backend.timing) == ("cupy", "measured")
    assert backend.info().index == 1 and backend.info().details["pci_bus_id"] == "0000:29:00.0"


# --- module functions ------------------------------------------------------------------------------------------


@pytest.fixture
def fake_installed(monkeypatch):
    runtime = two_h100s()
    fake = make_fake_cupy(runtime)
    monkeypatch.setattr(cupy_backend, "_import_cupy", lambda: fake)
    return fake, runtime


def test_open_device_picks_by_local_rank(fake_installed):
    backend = cupy_backend.open_device(BackendSpec("cupy"), local_rank=3, local_size=4)
    assert backend.device_index == 1
    assert cupy_backend.open_device(BackendSpec("cupy", 0), local_rank=3, local_size=4).device_index == 0
    with pytest.raises(BackendUnavailable, match="out of range"):
        cupy_backend.open_device(BackendSpec("cupy", 5), local_rank=0, local_size=1)


def test_list_devices(fake_installed):
    devices = cupy_backend.list_devices()
    assert [d.index for d in devices] == [0, 1]
    assert [d.details["pci_bus_id"] for d in devices] == ["0000:1b:00.0", "0000:29:00.0"]
    assert devices[0].details["cupy_version"] == "0.0-fake"


def test_available_with_devices(fake_installed):
    assert cupy_backend.unavailable_reason() is None
    assert cupy_backend.is_hip_build() is False


def test_unavailable_when_no_device(fake_installed):
    fake, runtime = fake_installed
    runtime.devices = []
    assert "no GPU" in cupy_backend.unavailable_reason()
    runtime.count_error = FakeRuntime.CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
    assert cupy_backend.unavailable_reason() == "cudaErrorNoDevice: no CUDA-capable device is detected"


def test_is_hip_build_on_rocm(monkeypatch):
    fake = make_fake_cupy(FakeRuntime([MI300X], is_hip=True, runtime_version=HIP_6_3, driver_version=HIP_6_3))
    monkeypatch.setattr(cupy_backend, "_import_cupy", lambda: fake)
    assert cupy_backend.is_hip_build() is True


def test_unavailable_when_cupy_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` fail as when it is not installed
    reason = cupy_backend.unavailable_reason()
    assert "pip install" in reason and "cuda12" in reason and "rocm" in reason
    assert cupy_backend.is_hip_build() is None


# --- a real GPU, where there is one ----------------------------------------------------------------------------


def _real_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.mark.skipif(not _real_gpu(), reason="needs CuPy and a GPU")
def test_real_gpu_matmul_and_describe():
    import cupy

    info = cupy_backend.describe_device(cupy.cuda.runtime, 0)
    assert info.name and info.memory_bytes > 0
    assert info.vendor == ("AMD" if cupy.cuda.runtime.is_hip else "NVIDIA")

    backend = cupy_backend.CupyBackend(0)
    dtype = DTYPES["fp32"]
    m, k, n = 257, 129, 65
    rng = np.random.default_rng(3)
    a_host = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b_host = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    a, b, c = backend.upload(a_host, dtype), backend.upload(b_host, dtype), backend.empty((m, n), dtype)
    with backend.timer() as t:
        backend.matmul(a, b, c, dtype)
    got = backend.download(c, dtype)
    pinned = backend.download_buffer((m, n), dtype)
    np.testing.assert_array_equal(backend_base.download(backend, c, dtype, pinned), got)
    exact = a_host.astype(np.float64) @ b_host.astype(np.float64)
    # the classical bound for any summation order: |error| <= k u / (1 - k u) * (|A| |B|), u = 2^-24
    ku = k * dtype.unit_roundoff
    bound = ku / (1 - ku) * (np.abs(a_host).astype(np.float64) @ np.abs(b_host).astype(np.float64))
    assert np.all(np.abs(got - exact) <= bound)
    assert t.seconds > 0
    assert hasattr(backend.mpi_buffer(c), "__cuda_array_interface__")
    assert backend.free_memory_bytes() > 0
    backend.close()
