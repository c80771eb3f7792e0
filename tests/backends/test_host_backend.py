"""The host backend (hetbench/backends/host.py) and the backend registry (hetbench/backends/base.py)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from hetbench.backends import base, host
from hetbench.backends.base import (
    BACKEND_NAMES,
    Backend,
    BackendSpec,
    BackendUnavailable,
    DeviceInfo,
    backend_module,
    index_for_rank,
    open_backend,
    resolve_auto,
)
from hetbench.dtypes import DTYPES

THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def blas_threads() -> list[int]:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def test_host_is_available() -> None:
    assert host.unavailable_reason() is None


def test_list_devices() -> None:
    devices = host.list_devices()
    assert len(devices) == 1
    d = devices[0]
    assert isinstance(d, DeviceInfo)
    assert (d.backend, d.index, d.kind) == ("host", 0, "cpu")
    assert d.dtypes == ("fp64", "fp32", "fp16")
    assert all(name in DTYPES for name in d.dtypes)
    assert d.name
    assert d.modelled is False
    assert d.memory_bytes is None or d.memory_bytes > 2**20
    assert d.runtime.startswith(f"NumPy {np.__version__}, ")
    pools = [p for p in threadpool_info() if p["user_api"] == "blas"]
    if pools:
        assert pools[0]["internal_api"] in d.runtime
        assert d.details["blas"].split()[0] == pools[0]["internal_api"]
    assert d.details["cores"] == cores()
    assert d.to_dict()["dtypes"] == ["fp64", "fp32", "fp16"]


@pytest.mark.parametrize("dtype_name", ["fp64", "fp32", "fp16"])
def test_upload_matmul_download(dtype_name: str) -> None:
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(4)
    a_host = rng.uniform(-1, 1, (33, 17)).astype(dtype.host)
    b_host = rng.uniform(-1, 1, (17, 45)).astype(dtype.host)
    backend = host.HostBackend()
    try:
        assert isinstance(backend, Backend)
        a = backend.upload(a_host, dtype)
        b = backend.upload(b_host, dtype)
        out = backend.empty((33, 45), dtype)
        assert out.shape == (33, 45) and out.dtype == dtype.host
        backend.matmul(a, b, out, dtype)
        backend.synchronize()
        c = backend.download(out, dtype)
    finally:
        backend.close()
    assert c.dtype == dtype.host
    assert c.flags.c_contiguous
    np.testing.assert_array_equal(c, np.matmul(a_host, b_host))
    # and against float64, so a wrong-but-self-consistent product cannot pass
    reference = a_host.astype(np.float64) @ b_host.astype(np.float64)
    tolerance = 17 * 2 * np.finfo(dtype.host).eps * (np.abs(a_host).astype(np.float64) @ np.abs(b_host))
    assert np.all(np.abs(c - reference) <= tolerance)


def test_upload_and_download_copy() -> None:
    dtype = DTYPES["fp64"]
    backend = host.HostBackend()
    data = np.arange(6, dtype=np.float64).reshape(2, 3)
    device = backend.upload(data, dtype)
    data[0, 0] = 100.0
    assert device[0, 0] == 0.0
    back = backend.download(device, dtype)
    back[1, 1] = -1.0
    assert device[1, 1] == 4.0
    assert backend.mpi_buffer(device) is device
    backend.close()


def test_timer() -> None:
    backend = host.HostBackend()
    a = np.ones((200, 200))
    with backend.timer() as elapsed:
        assert math.isnan(elapsed.seconds)
        np.matmul(a, a)
    assert elapsed.seconds > 0.0
    assert elapsed.seconds < 60.0
    backend.close()


def test_backend_class_attributes() -> None:
    assert host.HostBackend.name == "host"
    assert host.HostBackend.timing == base.TIMING_MEASURED


def test_open_backend_host() -> None:
    backend = open_backend(BackendSpec("host"))
    try:
        assert isinstance(backend, host.HostBackend)
        assert backend.info().backend == "host"
        assert backend.info().kind == "cpu"
    finally:
        backend.close()
    backend = open_backend(BackendSpec("host", 0))
    backend.close()


def test_open_backend_host_index_1() -> None:
    with pytest.raises(BackendUnavailable, match="index 1"):
        open_backend(BackendSpec("host", 1))


def test_resolve_auto_here_is_host() -> None:
    # This machine: no CuPy, and PoCL is an OpenCL CPU device, which auto never takes
    if base.devices_on_node("cupy"):
        pytest.skip("a CuPy GPU is present")
    if any(d.kind == "gpu" for d in base.devices_on_node("opencl")):
        pytest.skip("an OpenCL GPU is present")
    assert resolve_auto(BackendSpec("auto")) == BackendSpec("host")
    assert resolve_auto(BackendSpec("auto"), local_rank=3) == BackendSpec("host")
    backend = open_backend(BackendSpec("auto"))
    try:
        assert isinstance(backend, host.HostBackend)
    finally:
        backend.close()


def test_resolve_auto_leaves_named_specs() -> None:
    for spec in (BackendSpec("host"), BackendSpec("opencl", 1), BackendSpec("sim", None, "h100")):
        assert resolve_auto(spec, 5) is spec


def _device(backend: str, index: int, kind: str) -> DeviceInfo:
    return DeviceInfo(backend, index, "X", f"dev{index}", kind, None, ("fp32",), "test")


def test_resolve_auto_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # OpenCL: GPUs only, spread by local rank; CPUs skipped
    found = {"cupy": [], "opencl": [_device("opencl", 0, "cpu"), _device("opencl", 1, "gpu"),
                                    _device("opencl", 2, "gpu")]}
    monkeypatch.setattr(base, "devices_on_node", lambda name: found.get(name, [_device(name, 0, "cpu")]))
    assert resolve_auto(BackendSpec("auto"), 0) == BackendSpec("opencl", 1)
    assert resolve_auto(BackendSpec("auto"), 1) == BackendSpec("opencl", 2)
    assert resolve_auto(BackendSpec("auto"), 2) == BackendSpec("opencl", 1)
    found["cupy"] = [_device("cupy", 0, "gpu")]
    assert resolve_auto(BackendSpec("auto"), 1) == BackendSpec("cupy")
    found["cupy"] = []
    found["opencl"] = [_device("opencl", 0, "cpu")]
    assert resolve_auto(BackendSpec("auto"), 1) == BackendSpec("host")


def _clear_thread_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THREAD_ENV:
        monkeypatch.delenv(name, raising=False)


def test_threads_for_rank_shares_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_thread_env(monkeypatch)
    assert host.threads_for_rank(1) is None
    assert host.threads_for_rank(2) == max(1, cores() // 2)
    assert host.threads_for_rank(10**6) == 1


@pytest.mark.parametrize("variable", THREAD_ENV)
def test_threads_for_rank_honours_environment(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    _clear_thread_env(monkeypatch)
    monkeypatch.setenv(variable, "3")
    assert host.threads_for_rank(2) is None


def test_threads_for_rank_ignores_empty_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_thread_env(monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    assert host.threads_for_rank(2) == max(1, cores() // 2)


def test_host_backend_limits_blas_threads() -> None:
    if not blas_threads():
        pytest.skip("threadpoolctl sees no BLAS")
    # start from 2 threads so that a limit of 1 is visible even on a one-core machine
    with threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()
        assert all(t == 2 for t in before)
        backend = host.HostBackend(threads=1)
        assert blas_threads() == [1] * len(before)
        info = backend.info()
        assert info.details["blas_threads"] == 1
        assert info.runtime.endswith(", 1 threads")
        backend.close()
        assert blas_threads() == before
        backend.close()  # a second close is harmless
        assert blas_threads() == before


def test_open_device_shares_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_thread_env(monkeypatch)
    if not blas_threads():
        pytest.skip("threadpoolctl sees no BLAS")
    before = blas_threads()
    backend = host.open_device(BackendSpec("host"), local_rank=1, local_size=10**6)
    try:
        assert blas_threads() == [1] * len(before)
    finally:
        backend.close()
    assert blas_threads() == before


def test_a_rank_on_another_device_shares_the_cores_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A simulated (or OpenCL, CuPy) rank still multiplies on the host when it checks its products: its BLAS gets
    its share of the cores as a host rank's does, so that it does not spin on the other ranks' cores."""
    _clear_thread_env(monkeypatch)
    if not blas_threads():
        pytest.skip("threadpoolctl sees no BLAS")
    from hetbench.comm.world import World
    from hetbench.harness.devices import open_rank_device

    world = World()
    world.local_size = 10**6
    with threadpool_limits(limits=2, user_api="blas"):
        opened, errors = open_rank_device(BackendSpec("sim", model="h100"), DTYPES["fp32"], world)
        assert errors == [] and opened is not None and opened.backend.name == "sim"
        assert set(blas_threads()) == {1}
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's own count is left alone
    with threadpool_limits(limits=2, user_api="blas"):
        open_rank_device(BackendSpec("sim", model="h100"), DTYPES["fp32"], world)
        assert set(blas_threads()) == {2}


def test_index_for_rank() -> None:
    assert index_for_rank(BackendSpec("opencl", 2), 3, 0) == 2
    assert index_for_rank(BackendSpec("opencl", 0), 3, 2) == 0
    assert index_for_rank(BackendSpec("opencl"), 3, 0) == 0
    assert index_for_rank(BackendSpec("opencl"), 3, 4) == 1
    assert index_for_rank(BackendSpec("cupy"), 1, 7) == 0


def test_index_for_rank_out_of_range() -> None:
    with pytest.raises(BackendUnavailable) as excinfo:
        index_for_rank(BackendSpec("cupy", 3), 3, 0)
    message = str(excinfo.value)
    assert "device index 3" in message
    assert "cupy" in message
    assert "3 device(s)" in message
    assert "0..2" in message


def test_index_for_rank_no_devices() -> None:
    with pytest.raises(BackendUnavailable, match="opencl has no device"):
        index_for_rank(BackendSpec("opencl"), 0, 0)


def test_backend_module() -> None:
    assert backend_module("host") is host
    assert BACKEND_NAMES == ("host", "opencl", "cupy", "sim")


def test_backend_module_unknown() -> None:
    with pytest.raises(ValueError) as excinfo:
        backend_module("nope")
    message = str(excinfo.value)
    assert "'nope'" in message
    for name in ("auto", *BACKEND_NAMES):
        assert name in message


def test_backend_spec_str() -> None:
    assert str(BackendSpec("host")) == "host"
    assert str(BackendSpec("opencl", 1)) == "opencl:1"
    assert str(BackendSpec("sim", None, "h100")) == "sim:h100"
    assert str(BackendSpec("sim", 2, "mi300x")) == "sim:mi300x:2"
