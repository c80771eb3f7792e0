"""The OpenCL backend on whatever OpenCL device is here (PoCL on CI): listing, GEMM on both paths, memory, timing."""

from __future__ import annotations

import gc
import re
import types

import numpy as np
import pytest

pytest.importorskip("pyopencl")

from hetbench.backends import opencl  # noqa: E402
from hetbench.backends.base import BackendSpec, BackendUnavailable, DeviceError, UnsupportedDtype  # noqa: E402
from hetbench.dtypes import DTYPES  # noqa: E402

pytestmark = [
    pytest.mark.opencl,
    pytest.mark.skipif(
        opencl.cl is None or not opencl._all_devices(), reason="no OpenCL platform or device on this machine"
    ),
]

SHAPES = [(1, 1, 1), (17, 33, 5), (64, 64, 64), (100, 37, 129), (130, 1, 257)]
FP32, FP64, FP16 = DTYPES["fp32"], DTYPES["fp64"], DTYPES["fp16"]


@pytest.fixture(autouse=True)
def _default_gemm(monkeypatch, tmp_path):
    # a HETBENCH_OPENCL_GEMM set in the caller's shell must not decide what these tests exercise, nor a tuning cache
    monkeypatch.delenv(opencl.GEMM_ENV, raising=False)
    monkeypatch.setenv("HETBENCH_CACHE_DIR", str(tmp_path / "cache"))


def _open(monkeypatch, gemm: str, index: int = 0) -> opencl.OpenCLBackend:
    monkeypatch.setenv(opencl.GEMM_ENV, gemm)
    return opencl.open_device(BackendSpec("opencl", index), 0, 1)


def _check_matmul(backend, dtype, m, n, k, rng) -> None:
    a = rng.uniform(-1, 1, (m, k)).astype(dtype.host)
    b = rng.uniform(-1, 1, (k, n)).astype(dtype.host)
    out = backend.empty((m, n), dtype)
    backend.matmul(backend.upload(a, dtype), backend.upload(b, dtype), out, dtype)
    got = backend.download(out, dtype)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    # the classical bound for a length-k dot product: |error| <= k u (|A| |B|), with a factor 2 to spare
    bound = 2 * k * dtype.unit_roundoff * (np.abs(a64) @ np.abs(b64))
    assert got.shape == (m, n) and got.dtype == dtype.host
    assert np.all(np.abs(got - a64 @ b64) <= bound), f"{dtype.name} {m}x{n}x{k}"


def test_list_devices_describes_every_device():
    devices = opencl.list_devices()
    assert [d.index for d in devices] == list(range(len(opencl._all_devices())))
    for d in devices:
        assert d.backend == "opencl"
        assert d.kind in ("gpu", "cpu", "accelerator")
        assert d.vendor and d.name
        assert d.memory_bytes > 0
        assert "fp32" in d.dtypes and "bf16" not in d.dtypes
        assert d.peak_tflops == {}
        assert d.runtime.startswith("OpenCL ") and ", driver " in d.runtime
        assert d.details["max_mem_alloc_bytes"] > 0 and d.details["compute_units"] > 0
        assert d.details["gemm"] in opencl.GEMM_CHOICES


def test_pocl_cpu_device_has_cpu_vendor():
    pocl = [d for d in opencl.list_devices() if "pocl" in d.details["platform_version"].lower() and d.kind == "cpu"]
    if not pocl:
        pytest.skip("no PoCL CPU device")
    assert pocl[0].vendor in ("AMD", "Intel", "ARM", "Apple", "PoCL")


def test_dtypes_follow_extensions():
    def fake(extensions):
        return types.SimpleNamespace(extensions=extensions)

    assert opencl._dtypes(fake("cl_khr_byte_addressable_store")) == ("fp32",)
    assert opencl._dtypes(fake("cl_khr_fp64 cl_khr_fp16")) == ("fp64", "fp32", "fp16")
    assert opencl._dtypes(fake("cl_khr_fp16")) == ("fp32", "fp16")


def test_vendor_names_are_normalised():
    def names(device_vendor, platform_name="Some Platform", platform_vendor="x"):
        platform = types.SimpleNamespace(name=platform_name, vendor=platform_vendor)
        return opencl._vendor(platform, types.SimpleNamespace(vendor=device_vendor))

    assert names("NVIDIA Corporation") == "NVIDIA"
    assert names("Advanced Micro Devices, Inc.") == "AMD"
    assert names("AuthenticAMD", "Portable Computing Language", "The pocl project") == "AMD"
    assert names("GenuineIntel", "Portable Computing Language", "The pocl project") == "Intel"
    assert names("Intel(R) Corporation") == "Intel"
    assert names("Mystery", "Portable Computing Language", "The pocl project") == "PoCL"


@pytest.mark.parametrize("dtype", [FP32, FP64], ids=lambda d: d.name)
def test_kernel_matmul_matches_numpy(monkeypatch, dtype):
    backend = _open(monkeypatch, "kernel")
    if dtype.name not in backend.info().dtypes:
        pytest.skip(f"device lacks {dtype.name}")
    assert backend.info().details["gemm"] == "kernel"
    rng = np.random.default_rng(1)
    for m, n, k in SHAPES:
        _check_matmul(backend, dtype, m, n, k, rng)
    backend.close()


@pytest.mark.clblast
@pytest.mark.parametrize("dtype", [FP32, FP64], ids=lambda d: d.name)
def test_clblast_matmul_matches_numpy(monkeypatch, dtype):
    if opencl.pyclblast is None:
        pytest.skip("pyclblast does not import")
    backend = _open(monkeypatch, "clblast")
    if dtype.name not in backend.info().dtypes:
        pytest.skip(f"device lacks {dtype.name}")
    assert backend.info().details["gemm"] == "clblast"
    rng = np.random.default_rng(2)
    for m, n, k in SHAPES:
        _check_matmul(backend, dtype, m, n, k, rng)
    backend.close()


def test_kernel_matmul_on_row_slices_and_empty_k(monkeypatch):
    backend = _open(monkeypatch, "kernel")
    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, (9, 6)).astype(np.float32)
    b = rng.uniform(-1, 1, (6, 5)).astype(np.float32)
    out = backend.empty((7, 5), FP32)
    # rows 2..5 of A against B into rows 3..6 of out: the device arrays start at an offset
    backend.matmul(backend.upload(a, FP32)[2:6], backend.upload(b, FP32), out[3:7], FP32)
    got = backend.download(out, FP32)[3:7]
    np.testing.assert_allclose(got, a[2:6].astype(np.float64) @ b, rtol=0, atol=1e-5)

    zeros = backend.upload(np.full((4, 3), 7, np.float32), FP32)
    backend.matmul(backend.empty((4, 0), FP32), backend.empty((0, 3), FP32), zeros, FP32)
    assert np.array_equal(backend.download(zeros, FP32), np.zeros((4, 3), np.float32))
    backend.close()


def test_fp16_absent_without_extension(monkeypatch):
    backend = _open(monkeypatch, "kernel")
    has_fp16 = "cl_khr_fp16" in backend._device.extensions.split()
    assert ("fp16" in backend.info().dtypes) == has_fp16
    if has_fp16:
        pytest.skip("this device has cl_khr_fp16")
    with pytest.raises(UnsupportedDtype, match="fp16"):
        backend.upload(np.ones((2, 2), np.float16), FP16)
    backend.close()


def test_timer_measures_positive_seconds(monkeypatch):
    backend = _open(monkeypatch, "kernel")
    a = backend.upload(np.ones((64, 64), np.float32), FP32)
    out = backend.empty((64, 64), FP32)
    with backend.timer() as elapsed:
        backend.matmul(a, a, out, FP32)
    assert elapsed.seconds > 0
    assert np.array_equal(backend.download(out, FP32), np.full((64, 64), 64, np.float32))
    backend.close()


def test_download_into_a_buffer_made_before_the_timer(monkeypatch):
    """matmul's timed D2H (base.download_buffer, base.download): into host memory whose pages are already touched."""
    from hetbench.backends import base

    backend = _open(monkeypatch, "kernel")
    host = np.arange(6 * 5, dtype=np.float32).reshape(6, 5)
    rows = backend.upload(host, FP32)[2:5]  # a row slice: an array with an offset into its buffer
    out = base.download_buffer(backend, (3, 5), FP32)
    assert out.shape == (3, 5) and out.dtype == np.float32 and not out.any()
    assert base.download(backend, rows, FP32, out) is out
    np.testing.assert_array_equal(out, host[2:5])
    with pytest.raises(ValueError, match=r"shape \(3, 5\), got float32 \(5, 3\)"):
        backend.download_into(rows, np.zeros((5, 3), np.float32))
    backend.close()


def test_index_out_of_range(monkeypatch):
    count = len(opencl._all_devices())
    with pytest.raises(BackendUnavailable, match=f"index {count + 3}"):
        _open(monkeypatch, "auto", index=count + 3)


def test_free_memory_counts_held_arrays(monkeypatch):
    backend = _open(monkeypatch, "kernel")
    total = backend.info().memory_bytes
    before = backend.free_memory_bytes()
    array = backend.upload(np.zeros((1000, 250), np.float32), FP32)
    assert backend.free_memory_bytes() == before - 1_000_000
    assert before <= total
    del array
    gc.collect()
    assert backend.free_memory_bytes() == before
    assert backend.max_allocation_bytes() == backend.info().details["max_mem_alloc_bytes"]
    backend.close()


def test_gemm_choice_from_environment(monkeypatch):
    monkeypatch.setenv(opencl.GEMM_ENV, "kernel")
    assert opencl.gemm_implementation() == "kernel"
    monkeypatch.setenv(opencl.GEMM_ENV, "fastest")
    with pytest.raises(BackendUnavailable, match="fastest"):
        opencl.gemm_implementation()
    assert "fastest" in opencl.unavailable_reason()
    monkeypatch.setenv(opencl.GEMM_ENV, "tuned")
    assert opencl.gemm_implementation() == "tuned"
    monkeypatch.setattr(opencl, "pyclblast", None)
    monkeypatch.setenv(opencl.GEMM_ENV, "auto")
    assert opencl.gemm_implementation() == "auto"
    backend = _open(monkeypatch, "auto")  # without CLBlast, auto computes with the tuned kernel
    assert backend.gemm_path(FP32, 64, 64, 64)[0] == "tuned"
    backend.close()
    with pytest.raises(BackendUnavailable, match=r"hetbench\[clblast\]"):
        _open(monkeypatch, "clblast")


def test_clblast_failure_is_a_device_error_naming_the_device(monkeypatch):
    def failing_gemm(*args, **kwargs):
        raise RuntimeError("PyCLBlast: 'CLBlastXgemm' failed: CLBlastUnknownError")

    monkeypatch.setattr(opencl, "pyclblast", types.SimpleNamespace(gemm=failing_gemm))
    backend = _open(monkeypatch, "clblast")
    a = backend.upload(np.ones((2, 2), np.float32), FP32)
    with pytest.raises(DeviceError, match=re.escape(backend.info().name)):
        backend.matmul(a, a, backend.empty((2, 2), FP32), FP32)
    backend.close()


def test_mpi_buffer_is_none(monkeypatch):
    backend = _open(monkeypatch, "kernel")
    assert backend.mpi_buffer(backend.empty((2,), FP32)) is None
    backend.close()
