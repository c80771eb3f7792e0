"""The sim backend: catalog figures, the CUDA/HIP-style runtime the test double builds from them, real results,
modelled time, fault injection."""

from __future__ import annotations

import dataclasses
import gc
import time

import numpy as np
import pytest
from doubles import CUDARuntimeError, FakeRuntime

from hetbench.backends import base, sim
from hetbench.backends.sim_catalog import CATALOG, GpuModel
from hetbench.dtypes import DTYPES, round_to_bf16, to_host_dtype

REQUIRED_KEYS = ("h100", "a100", "v100", "a10g", "mi300x", "mi250x", "v520", "rx7900xtx", "arc-a770")
PROPERTY_TYPES = {
    "name": bytes,
    "totalGlobalMem": int,
    "major": int,
    "minor": int,
    "multiProcessorCount": int,
    "clockRate": int,
    "memoryClockRate": int,
    "memoryBusWidth": int,
    "pciBusID": int,
}


@pytest.fixture(autouse=True)
def _no_fault_or_rank(monkeypatch):
    for name in (sim.FAULT_ENV, "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)


def _operands(rng, m, k, n, dtype):
    a = to_host_dtype(rng.standard_normal((m, k)), dtype)
    b = to_host_dtype(rng.standard_normal((k, n)), dtype)
    return a, b


# --- catalog -------------------------------------------------------------------------------------------------


def test_catalog_has_the_required_models_with_unique_keys():
    keys = [m.key for m in CATALOG]
    assert len(keys) == len(set(keys))
    assert set(REQUIRED_KEYS) <= set(keys)
    assert sim.models() == {m.key: m for m in CATALOG}


@pytest.mark.parametrize("model", CATALOG, ids=lambda m: m.key)
def test_catalog_entry_is_sane(model: GpuModel):
    assert model.source and all(url.startswith("https://") for url in model.source)
    assert model.peak_tflops and all(v > 0 for v in model.peak_tflops.values())
    assert set(model.peak_tflops) <= set(DTYPES)
    assert "fp32" in model.peak_tflops
    if "fp16" in model.peak_tflops:
        assert model.peak_tflops["fp16"] >= model.peak_tflops["fp32"]
    for figure in (
        model.memory_bytes,
        model.memory_bandwidth_gbps,
        model.host_link_gbps,
        model.launch_latency_us,
        model.multiprocessor_count,
        model.clock_khz,
        model.memory_clock_khz,
        model.memory_bus_width_bits,
    ):
        assert figure > 0
    # the runtime's memory figures must give back the datasheet bandwidth
    derived_gbps = 2 * model.memory_clock_khz * 1e3 * model.memory_bus_width_bits / 8 / 1e9
    assert abs(derived_gbps - model.memory_bandwidth_gbps) <= 0.15 * model.memory_bandwidth_gbps
    expected_api = {"NVIDIA": "cuda", "AMD": "hip", "Intel": "opencl"}[model.vendor]
    assert model.api == expected_api
    assert (model.compute_capability is not None) == (model.vendor == "NVIDIA")
    assert (model.gcn_arch_name is not None) == (model.vendor == "AMD")


def test_catalog_leaves_out_dtypes_without_native_arithmetic():
    assert "bf16" not in sim.get_model("v100").peak_tflops
    assert "fp64" not in sim.get_model("arc-a770").peak_tflops
    assert sim.get_model("arc-a770").dtypes == ("fp32", "fp16", "bf16")
    assert sim.get_model("h100").dtypes == ("fp64", "fp32", "fp16", "bf16")


def test_catalog_arch_names():
    assert {k: sim.get_model(k).gcn_arch_name for k in ("mi300x", "mi250x", "v520", "rx7900xtx")} == {
        "mi300x": "gfx942",
        "mi250x": "gfx90a",
        "v520": "gfx1011",
        "rx7900xtx": "gfx1100",
    }
    assert sim.get_model("h100").compute_capability == (9, 0)
    assert sim.get_model("a10g").compute_capability == (8, 6)


def test_unknown_model_lists_accepted_keys():
    with pytest.raises(ValueError) as err:
        sim.get_model("h1000")
    message = str(err.value)
    assert "'h1000'" in message
    assert "accepted: " + ", ".join(m.key for m in CATALOG) in message


# --- the CUDA/HIP-style runtime over catalog models (tests/doubles.py) ----------------------------------------


def test_cuda_runtime_answers_like_cupy():
    rt = FakeRuntime.from_models([sim.get_model("h100"), sim.get_model("a100")], "cuda")
    assert rt.is_hip is False
    assert rt.getDeviceCount() == 2
    assert rt.getDevice() == 0
    rt.setDevice(1)
    assert rt.getDevice() == 1
    props = rt.getDeviceProperties(0)
    for key, kind in PROPERTY_TYPES.items():
        assert type(props[key]) is kind, key
    assert "gcnArchName" not in props
    assert props["name"] == b"NVIDIA H100 SXM5 80GB"
    assert (props["major"], props["minor"]) == (9, 0)
    assert props["totalGlobalMem"] == 80 * 2**30
    assert props["multiProcessorCount"] == 132
    assert rt.getDeviceProperties(1)["pciBusID"] != props["pciBusID"]
    assert rt.runtimeGetVersion() == 12040
    assert rt.driverGetVersion() == 12040
    # memGetInfo answers for the current device
    assert rt.memGetInfo() == (80 * 2**30, 80 * 2**30)


def test_hip_runtime_answers_like_cupy_on_rocm():
    rt = FakeRuntime.from_models([sim.get_model("mi300x"), sim.get_model("rx7900xtx")], "hip")
    assert rt.is_hip is True
    props = rt.getDeviceProperties(0)
    for key, kind in PROPERTY_TYPES.items():
        assert type(props[key]) is kind, key
    assert type(props["gcnArchName"]) is bytes
    assert props["gcnArchName"].split(b":")[0] == b"gfx942"
    assert (props["major"], props["minor"]) == (9, 4)
    assert props["warpSize"] == 64
    other = rt.getDeviceProperties(1)
    assert other["gcnArchName"].split(b":")[0] == b"gfx1100"
    assert (other["major"], other["minor"]) == (11, 0)
    assert other["warpSize"] == 32
    version = rt.runtimeGetVersion()
    assert (version // 10_000_000, version // 100_000 % 100) == (6, 2)


@pytest.mark.parametrize("api, models, prefix", [("cuda", ["v100"], "cuda"), ("hip", ["mi250x"], "hip")])
def test_bad_device_index_raises_invalid_device(api, models, prefix):
    rt = FakeRuntime.from_models([sim.get_model(k) for k in models], api)
    for call in (rt.setDevice, rt.getDeviceProperties):
        with pytest.raises(CUDARuntimeError) as err:
            call(1)
        assert err.value.status == 101
        assert str(err.value).startswith(f"{prefix}ErrorInvalidDevice")
    with pytest.raises(CUDARuntimeError):
        rt.setDevice(-1)
    assert rt.getDevice() == 0


def test_runtime_refuses_models_of_another_api():
    with pytest.raises(ValueError):
        FakeRuntime.from_models([sim.get_model("arc-a770")], "cuda")
    with pytest.raises(ValueError):
        FakeRuntime.from_models([sim.get_model("h100")], "hip")
    with pytest.raises(ValueError):
        FakeRuntime.from_models([sim.get_model("arc-a770")])  # an OpenCL model answers no CUDA/HIP runtime


def test_mem_get_info_follows_backend_allocations():
    backend = sim.SimBackend(sim.get_model("a100"))
    rt = FakeRuntime.from_models([backend.model], memories=[backend.memory])
    free0, total = rt.memGetInfo()
    assert free0 == total == 80 * 2**30
    bf16 = DTYPES["bf16"]
    # bf16 is held as float32 on the host but occupies 2 bytes per element on the device
    a = backend.upload(np.zeros((100, 30), dtype=np.float32), bf16)
    assert rt.memGetInfo() == (free0 - 100 * 30 * 2, total)
    c = backend.empty((10, 10), DTYPES["fp64"])
    assert rt.memGetInfo()[0] == free0 - 6000 - 800
    assert backend.free_memory_bytes() <= free0 - 6800
    del a, c
    gc.collect()
    assert rt.memGetInfo()[0] == free0


def test_out_of_device_memory_raises():
    tiny = dataclasses.replace(sim.get_model("v100"), memory_bytes=1000)
    backend = sim.SimBackend(tiny)
    keep = backend.empty((100,), DTYPES["fp32"])  # 400 bytes
    with pytest.raises(base.DeviceError, match="out of memory"):
        backend.empty((200,), DTYPES["fp32"])  # 800 more
    assert backend.free_memory_bytes() == 600
    del keep


# --- results are real ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fp64", "fp32"])
def test_matmul_equals_numpy(name):
    dtype = DTYPES[name]
    rng = np.random.default_rng(1)
    a, b = _operands(rng, 33, 17, 9, dtype)
    backend = sim.SimBackend(sim.get_model("h100"))
    da, db, dc = backend.upload(a, dtype), backend.upload(b, dtype), backend.empty((33, 9), dtype)
    backend.matmul(da, db, dc, dtype)
    result = backend.download(dc, dtype)
    assert result.dtype == dtype.host
    assert np.array_equal(result, np.matmul(a, b))


def test_fp16_matmul_accumulates_in_fp32_and_rounds_once():
    dtype = DTYPES["fp16"]
    rng = np.random.default_rng(2)
    a, b = _operands(rng, 20, 40, 12, dtype)
    backend = sim.SimBackend(sim.get_model("v100"))
    dc = backend.empty((20, 12), dtype)
    backend.matmul(backend.upload(a, dtype), backend.upload(b, dtype), dc, dtype)
    result = backend.download(dc, dtype)
    assert result.dtype == np.float16
    assert np.array_equal(result, np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16))


def test_bf16_matmul_outputs_bf16_values():
    dtype = DTYPES["bf16"]
    rng = np.random.default_rng(3)
    a, b = _operands(rng, 16, 64, 8, dtype)
    backend = sim.SimBackend(sim.get_model("mi300x"))
    dc = backend.empty((16, 8), dtype)
    backend.matmul(backend.upload(a, dtype), backend.upload(b, dtype), dc, dtype)
    result = backend.download(dc, dtype)
    assert result.dtype == np.float32
    assert np.array_equal(round_to_bf16(result), result)  # every value is a bf16 value
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert np.allclose(result, exact, rtol=2 * dtype.unit_roundoff, atol=1e-3)
    assert np.array_equal(result, round_to_bf16(np.matmul(a, b)))


def test_upload_rounds_bf16_input():
    backend = sim.SimBackend(sim.get_model("h100"))
    x = np.array([1.0 + 2.0**-10], dtype=np.float32)  # not a bf16 value
    assert backend.upload(x, DTYPES["bf16"])[0] == 1.0


def test_matmul_in_a_dtype_the_device_lacks_raises():
    dtype = DTYPES["bf16"]
    backend = sim.SimBackend(sim.get_model("v100"))
    a = np.ones((2, 2), np.float32)
    with pytest.raises(base.UnsupportedDtype, match="bf16"):
        backend.matmul(a, a, np.empty((2, 2), np.float32), dtype)
    for refused in (lambda: backend.upload(a, dtype), lambda: backend.empty((2, 2), dtype)):
        with pytest.raises(base.UnsupportedDtype, match=r"dtype bf16 is not supported by sim:0 .*fp64, fp32, fp16$"):
            refused()
    assert backend.memory.allocated_bytes == 0  # refused before anything was reserved
    with pytest.raises(ValueError, match="bf16"):
        sim.gemm_model_seconds(sim.get_model("v100"), 2, 2, 2, dtype)


# --- time is modelled ---------------------------------------------------------------------------------------


def test_gemm_model_large_fp16_is_compute_bound():
    h100 = sim.get_model("h100")
    n = 8192
    expected = 2 * n**3 / (h100.peak_tflops["fp16"] * 1e12) + h100.launch_latency_us * 1e-6
    assert sim.gemm_model_seconds(h100, n, n, n, "fp16") == pytest.approx(expected, rel=1e-12)
    # with the datasheet's 989.4 TFLOPS and the 5 us CUDA launch assumption: about 1.116 ms
    assert expected == pytest.approx(2 * 8192**3 / 989.4e12 + 5e-6, rel=1e-12)


def test_timer_reports_modelled_memory_bound_time_not_wall_time():
    h100 = sim.get_model("h100")
    dtype = DTYPES["fp32"]
    m = n = k = 64
    # 2*64^3 flops take 7.8 ns at 66.9 TFLOPS; 3*64*64*4 bytes take 14.7 ns at 3350 GB/s: memory-bound
    compute_s = 2 * m * n * k / (66.9e12)
    memory_s = 3 * 64 * 64 * 4 / 3350e9
    assert memory_s > compute_s
    expected = memory_s + 5e-6
    assert sim.gemm_model_seconds(h100, m, n, k, dtype) == pytest.approx(expected, rel=1e-12)

    backend = sim.SimBackend(h100)
    rng = np.random.default_rng(4)
    a, b = _operands(rng, m, k, n, dtype)
    da, db, dc = backend.upload(a, dtype), backend.upload(b, dtype), backend.empty((m, n), dtype)
    before = backend.modelled_seconds
    with backend.timer() as t:
        backend.matmul(da, db, dc, dtype)
        time.sleep(0.02)  # host time passing inside the block must not show
        backend.synchronize()
    assert t.seconds == pytest.approx(expected, rel=1e-12)
    assert backend.modelled_seconds == pytest.approx(before + expected, rel=1e-12)


def test_transfers_are_modelled_over_the_host_link():
    v100 = sim.get_model("v100")
    backend = sim.SimBackend(v100)
    dtype = DTYPES["fp16"]
    host = np.ones((1000, 500), dtype=np.float16)
    with backend.timer() as up:
        array = backend.upload(host, dtype)
    with backend.timer() as down:
        backend.download(array, dtype)
    expected = 1000 * 500 * 2 / (15.75e9) + 5e-6  # PCIe Gen3 x16 on AWS P3
    assert up.seconds == pytest.approx(expected, rel=1e-12)
    assert down.seconds == pytest.approx(expected, rel=1e-12)
    assert sim.transfer_model_seconds(v100, 1_000_000) == pytest.approx(1e6 / 15.75e9 + 5e-6, rel=1e-12)


# --- listing and opening ------------------------------------------------------------------------------------


def test_list_devices_is_the_catalog():
    devices = sim.list_devices()
    assert [d.details["model"] for d in devices] == [m.key for m in CATALOG]
    assert [d.index for d in devices] == list(range(len(CATALOG)))
    for info, model in zip(devices, CATALOG):
        assert info.backend == "sim" and info.kind == "gpu" and info.modelled
        assert info.vendor == model.vendor
        assert info.name == f"{model.name} (simulated)"
        assert info.dtypes == model.dtypes
        assert info.peak_tflops == model.peak_tflops and info.peak_tflops is not model.peak_tflops
        assert info.peak_source == model.source[0]
        assert info.memory_bandwidth_gbps == model.memory_bandwidth_gbps
        assert info.details["host_link_gbps"] == model.host_link_gbps
        assert info.details["launch_latency_us"] == model.launch_latency_us
    by_key = {d.details["model"]: d for d in devices}
    assert by_key["h100"].runtime == "simulated CUDA 12.4 (modelled)"
    assert by_key["h100"].details["compute_capability"] == "9.0"
    assert by_key["mi250x"].runtime == "simulated HIP 6.2 (modelled)"
    assert by_key["mi250x"].details["gcn_arch_name"] == "gfx90a"
    assert by_key["arc-a770"].runtime == "simulated OpenCL (modelled)"


def test_open_through_the_registry():
    backend = base.open_backend(base.BackendSpec("sim", model="mi300x"), local_rank=3, local_size=4)
    assert isinstance(backend, base.Backend)
    assert backend.name == "sim" and backend.timing == base.TIMING_MODELLED
    assert backend.info().index == 3  # default: the local rank
    assert backend.info().details["model"] == "mi300x"
    assert sim.open_device(base.BackendSpec("sim", index=1, model="h100"), 3, 4).info().index == 1
    assert backend.max_allocation_bytes() is None
    x = backend.upload(np.ones(4), DTYPES["fp64"])
    assert backend.mpi_buffer(x) is x
    # the Intel model is driven through OpenCL: like a real OpenCL device it hands MPI nothing
    arc = sim.SimBackend(sim.get_model("arc-a770"))
    assert arc.mpi_memory_kind() == "none"
    assert arc.mpi_buffer(arc.upload(np.ones(4, np.float32), DTYPES["fp32"])) is None


def test_open_without_or_with_unknown_model_says_how():
    with pytest.raises(base.BackendUnavailable) as err:
        sim.open_device(base.BackendSpec("sim"), 0, 1)
    assert "sim:<model>" in str(err.value) and "mi300x" in str(err.value)
    with pytest.raises(base.BackendUnavailable, match="accepted: h100"):
        sim.open_device(base.BackendSpec("sim", model="b200"), 0, 1)


# --- fault injection ----------------------------------------------------------------------------------------


def test_fault_injection_matmul(monkeypatch):
    backend = sim.SimBackend(sim.get_model("h100"))
    dtype = DTYPES["fp32"]
    a = backend.upload(np.ones((2, 2), np.float32), dtype)
    c = backend.empty((2, 2), dtype)
    monkeypatch.setenv(sim.FAULT_ENV, "matmul")
    with pytest.raises(base.DeviceError, match="simulated device fault injected by HETBENCH_SIM_FAULT=matmul"):
        backend.matmul(a, a, c, dtype)
    backend.upload(np.ones((2, 2), np.float32), dtype)  # other operations still work


def test_fault_injection_upload(monkeypatch):
    backend = sim.SimBackend(sim.get_model("mi250x"))
    monkeypatch.setenv(sim.FAULT_ENV, "upload")
    with pytest.raises(base.DeviceError, match="HETBENCH_SIM_FAULT=upload"):
        backend.upload(np.ones(3), DTYPES["fp64"])


def test_fault_injection_on_one_rank(monkeypatch):
    """`matmul@1` fails on COMM_WORLD rank 1 only (the CLI tests run it under mpiexec)."""
    backend = sim.SimBackend(sim.get_model("a10g"))
    dtype = DTYPES["fp32"]
    a = backend.upload(np.ones((2, 2), np.float32), dtype)
    c = backend.empty((2, 2), dtype)
    monkeypatch.setenv(sim.FAULT_ENV, "matmul@1")
    backend.matmul(a, a, c, dtype)  # a process alone is rank 0: spared
    monkeypatch.setattr(sim, "world_rank", lambda: 1)
    with pytest.raises(base.DeviceError, match="matmul@1"):
        backend.matmul(a, a, c, dtype)


@pytest.mark.parametrize("model", [m for m in CATALOG if m.api in ("cuda", "hip")], ids=lambda m: m.key)
def test_cupy_backend_describes_simulated_runtime_like_a_real_one(model):
    """The CuPy backend's device description, fed the simulated runtime, reads what the catalog says."""
    from hetbench.backends.cupy import describe_device

    runtime = FakeRuntime.from_models([model])
    info = describe_device(runtime, 0, backend="sim")
    assert info.vendor == ("AMD" if model.api == "hip" else "NVIDIA")
    assert info.name == model.name and info.memory_bytes == model.memory_bytes
    assert info.runtime.startswith("HIP runtime 6.2" if model.api == "hip" else "CUDA runtime 12.4")
    # the double reports the versions the sim backend says its devices run under
    assert ("HIP 6.2" if model.api == "hip" else "CUDA 12.4") in sim.device_info(model, 0).runtime
    if model.api == "hip":
        assert info.details["gcn_arch_name"].split(":")[0] == model.gcn_arch_name
    else:
        assert info.details["compute_capability"] == "{}.{}".format(*model.compute_capability)
    # the bandwidth CuPy's backend estimates from clock and bus width is the datasheet's, within 15%
    assert info.memory_bandwidth_gbps == pytest.approx(model.memory_bandwidth_gbps, rel=0.15)
