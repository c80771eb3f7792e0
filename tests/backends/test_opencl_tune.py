"""The self-tuning OpenCL GEMM (kernels/gemm_tuned.cl, hetbench/backends/opencl_tune.py): its products against NumPy
for odd, non-square shapes in every dtype the device has and at several points of its parameter space, a short
search and its cache (key, reuse, a foreign driver's or a corrupt file ignored with one note), auto's choice, and
`hetbench tune`. Every test keeps its cache in tmp_path (HETBENCH_CACHE_DIR)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

pytest.importorskip("pyopencl")

from hetbench.backends import opencl, opencl_tune  # noqa: E402
from hetbench.backends.base import BackendSpec  # noqa: E402
from hetbench.backends.opencl_tune import DeviceKey, GemmParams  # noqa: E402
from hetbench.dtypes import DTYPES  # noqa: E402

pytestmark = [
    pytest.mark.opencl,
    pytest.mark.skipif(
        opencl.cl is None or not opencl._all_devices(), reason="no OpenCL platform or device on this machine"
    ),
]

FP32 = DTYPES["fp32"]
# odd, non-square shapes: single elements, edge tiles in every direction, K shorter and longer than any tile
SHAPES = [(1, 1, 1), (17, 33, 5), (100, 37, 129), (130, 1, 257), (3, 300, 2), (67, 131, 45)]
# points of the parameter space the search visits: the CPU default, no packing, narrow vectors, several packed
# chunks (n > nc), local memory (the GPU style), scalar lanes
POINTS = [
    GemmParams(vw=16, nv=1, wm=8, lx=8, pack=1, nc=128),
    GemmParams(vw=8, nv=2, wm=6, lx=4),
    GemmParams(vw=4, nv=1, wm=12, lx=2, pack=1, nc=8),
    GemmParams(vw=2, nv=2, wm=4, lx=4, ly=4, use_local=1, kb=8),
    GemmParams(vw=1, nv=3, wm=5, lx=3, ly=2, use_local=1, kb=7),
    GemmParams(vw=1, nv=1, wm=1, lx=1),
]


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(opencl_tune.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(opencl.GEMM_ENV, raising=False)


def _open(monkeypatch, gemm: str) -> opencl.OpenCLBackend:
    monkeypatch.setenv(opencl.GEMM_ENV, gemm)
    return opencl.open_device(BackendSpec("opencl", 0), 0, 1)


def _entry(params: GemmParams, tuned: float = 10.0, clblast: float | None = None) -> dict:
    return {"params": params.as_dict(), "label": params.label(), "shape": [8, 8, 8], "tuned_gflops": tuned,
            "default_gflops": None, "clblast_gflops": clblast, "kernel_gflops": None}


def _check(backend, dtype, m, n, k, rng) -> None:
    """C = A @ B on the device, A a row slice at an offset and C written at an offset, against float64 NumPy."""
    a = rng.uniform(-1, 1, (m + 2, k)).astype(dtype.host)
    b = rng.uniform(-1, 1, (k, n)).astype(dtype.host)
    out = backend.upload(np.full((m + 1, n), 7, dtype.host), dtype)
    backend.matmul(backend.upload(a, dtype)[2:], backend.upload(b, dtype), out[1:], dtype)
    got = backend.download(out, dtype)
    a64, b64 = a[2:].astype(np.float64), b.astype(np.float64)
    bound = 2 * k * dtype.unit_roundoff * (np.abs(a64) @ np.abs(b64))
    assert np.all(got[0] == 7), f"{dtype.name} {m}x{n}x{k}: a store outside C"
    assert np.all(np.abs(got[1:] - a64 @ b64) <= bound), f"{dtype.name} {m}x{n}x{k}"


@pytest.mark.parametrize("dtype", [DTYPES["fp32"], DTYPES["fp64"], DTYPES["fp16"]], ids=lambda d: d.name)
def test_tuned_kernel_matches_numpy_on_odd_shapes(monkeypatch, dtype):
    backend = _open(monkeypatch, "tuned")
    if dtype.name not in backend.info().dtypes:
        backend.close()
        pytest.skip(f"device lacks {dtype.name}")
    rng = np.random.default_rng(5)
    for params in POINTS:
        if not backend._facts.fits(params, dtype.name):
            continue
        for cls in opencl_tune.SHAPE_CLASSES:  # every product here is "small"; the cache serves any class alike
            backend._tuning_entries[opencl_tune.entry_key(dtype.name, cls)] = _entry(params)
        backend._paths.clear()
        for m, n, k in SHAPES:
            assert backend.gemm_path(dtype, m, n, k) == ("tuned", params)
            _check(backend, dtype, m, n, k, rng)
    backend.close()


def test_params_validated():
    assert GemmParams(vw=16, nv=1, wm=8, lx=8, pack=1, nc=128).problem() is None
    assert "vw" in GemmParams(vw=3, nv=1, wm=8, lx=8).problem()
    assert "nc" in GemmParams(vw=16, nv=1, wm=8, lx=8, pack=1, nc=100).problem()
    assert "pack" in GemmParams(vw=4, nv=1, wm=4, lx=4, use_local=1, pack=1, nc=16).problem()
    with pytest.raises(ValueError):
        GemmParams.from_dict({"vw": 4})
    with pytest.raises(ValueError):
        GemmParams.from_dict({**GemmParams(vw=4, nv=1, wm=4, lx=4).as_dict(), "wm": "4"})
    assert GemmParams.from_dict(POINTS[0].as_dict()) == POINTS[0]


def test_shape_classes():
    assert opencl_tune.shape_class(1, 1, 1) == "small"
    assert opencl_tune.shape_class(256, 256, 256) == "small"
    assert opencl_tune.shape_class(128, 2048, 2048) == "thin"
    assert opencl_tune.shape_class(2048, 100, 2048) == "thin"
    assert opencl_tune.shape_class(1024, 1024, 1024) == "medium"
    assert opencl_tune.shape_class(2048, 2048, 2048) == "large"
    assert opencl_tune.shape_class(1536, 1536, 1536) == "large"
    for cls, (m, n, k) in opencl_tune.SHAPE_CLASSES.items():
        assert opencl_tune.shape_class(m, n, k) == cls


def test_cache_folder_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(opencl_tune.CACHE_ENV, str(tmp_path / "own"))
    assert opencl_tune.cache_dir() == tmp_path / "own"
    monkeypatch.delenv(opencl_tune.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert opencl_tune.cache_dir() == tmp_path / "xdg" / "hetbench"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert opencl_tune.cache_dir() == tmp_path / "home" / ".cache" / "hetbench"


def test_cache_key():
    key = DeviceKey("Portable Computing Language", "OpenCL 3.0 PoCL 3.1", "pthread-cpu", "3.1")
    # one file per platform and device name: a new driver finds the old file and says it is ignored
    assert key.path() == DeviceKey("Portable Computing Language", "OpenCL 3.0 PoCL 3.2", "pthread-cpu", "3.2").path()
    assert key.path() != DeviceKey("Portable Computing Language", "OpenCL 3.0 PoCL 3.1", "other-cpu", "3.1").path()
    assert key.path() != DeviceKey("Another Platform", "OpenCL 3.0 PoCL 3.1", "pthread-cpu", "3.1").path()
    assert key.path().name.startswith("opencl-gemm-pthread-cpu-") and key.path().suffix == ".json"
    assert opencl_tune.entry_key("fp64", "thin") == "fp64/thin"


def test_cache_round_trip_keeps_other_entries(tmp_path):
    key = DeviceKey("P", "P 1", "dev", "1.0")
    opencl_tune.save_entry(key, "fp32", "medium", _entry(POINTS[0]))
    opencl_tune.save_entry(key, "fp64", "medium", _entry(POINTS[1]))
    opencl_tune.save_entry(key, "fp32", "medium", _entry(POINTS[2], tuned=20.0))
    entries, note = opencl_tune.load_entries(key)
    assert note is None and sorted(entries) == ["fp32/medium", "fp64/medium"]
    assert GemmParams.from_dict(entries["fp32/medium"]["params"]) == POINTS[2]
    assert [p.name for p in key.path().parent.iterdir()] == [key.path().name]  # no temporary file left


@pytest.mark.parametrize("other, says", [
    ({"driver_version": "0.9"}, "driver 0.9"),
    ({"name": "another-device"}, "another-device"),
    ({"platform_version": "P 2"}, "not dev on P, driver 1.0"),
])
def test_cache_of_another_device_or_driver_is_ignored_with_a_note(other, says):
    key = DeviceKey("P", "P 1", "dev", "1.0")
    theirs = DeviceKey(**{**key.as_dict(), **other})
    opencl_tune.save_entry(theirs, "fp32", "medium", _entry(POINTS[0]))
    if theirs.path() != key.path():  # a file copied from another device's name
        key.path().write_text(theirs.path().read_text())
    entries, note = opencl_tune.load_entries(key)
    assert entries == {}
    assert "\n" not in note and says in note and "ignored" in note and str(key.path()) in note
    # tuning again replaces it
    opencl_tune.save_entry(key, "fp32", "medium", _entry(POINTS[1]))
    entries, note = opencl_tune.load_entries(key)
    assert note is None and list(entries) == ["fp32/medium"]


@pytest.mark.parametrize("text, says", [
    ("{not json", "not JSON"),
    (b"\xff\xfe", "not UTF-8"),
    ('{"schema": "something else"}', "not a hetbench.opencl-gemm-tuning document"),
    ('{"schema": "hetbench.opencl-gemm-tuning", "version": 99, "device": {}, "entries": {}}', "version 99"),
    ("ENTRY", "entry 'fp32/medium': vw=3"),
    ("GFLOPS", "tuned_gflops is not a positive number"),
    ("[" * 200000 + "]" * 200000, "nested deeper than a cache is"),  # RecursionError: exit 1 before
])
def test_corrupt_cache_is_ignored_with_a_note(text, says):
    key = DeviceKey("P", "P 1", "dev", "1.0")
    good = {"schema": opencl_tune.SCHEMA, "version": opencl_tune.VERSION, "device": key.as_dict(),
            "entries": {"fp32/medium": _entry(POINTS[0])}}
    if text == "ENTRY":
        good["entries"]["fp32/medium"]["params"]["vw"] = 3
        text = json.dumps(good)
    elif text == "GFLOPS":
        good["entries"]["fp32/medium"]["tuned_gflops"] = -1
        text = json.dumps(good)
    key.path().parent.mkdir(parents=True)
    if isinstance(text, bytes):
        key.path().write_bytes(text)
    else:
        key.path().write_text(text)
    entries, note = opencl_tune.load_entries(key)
    assert entries == {} and "\n" not in note and says in note and "ignored" in note


def _load_in_a_thread(key):
    """load_entries(key), in a thread that must end within 10 s (a FIFO or a device must not block it)."""
    import threading

    got: list = []
    reader = threading.Thread(target=lambda: got.append(opencl_tune.load_entries(key)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert got, "load_entries blocked on the cache's path"
    return got[0]


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_cache_path_that_is_no_regular_file_is_ignored_at_once(kind):
    """A FIFO at the cache's path blocked the read for ever (issue 33); it, or a folder, is ignored with a note, and
    tuning replaces it with the file."""
    import os

    key = DeviceKey("P", "P 1", "dev", "1.0")
    key.path().parent.mkdir(parents=True)
    os.mkfifo(key.path()) if kind == "fifo" else key.path().mkdir()
    entries, note = _load_in_a_thread(key)
    assert entries == {} and "\n" not in note and str(key.path()) in note
    assert "not a regular file" in note and "ignored" in note
    if kind == "fifo":
        opencl_tune.save_entry(key, "fp32", "medium", _entry(POINTS[0]))
        assert list(opencl_tune.load_entries(key)[0]) == ["fp32/medium"]


def test_backend_says_a_foreign_cache_once_and_runs(monkeypatch, caplog):
    backend = _open(monkeypatch, "kernel")
    key = backend.tuning_key
    backend.close()
    opencl_tune.save_entry(DeviceKey(**{**key.as_dict(), "driver_version": "older"}), "fp32", "small",
                           _entry(POINTS[0]))
    with caplog.at_level(logging.WARNING, logger="hetbench.opencl"):
        backend = _open(monkeypatch, "auto")
    assert len(backend.gemm_notes) == 1 and "driver older" in backend.gemm_notes[0]
    assert [r.getMessage() for r in caplog.records] == [f"Note: {backend.gemm_notes[0]}"]
    _check(backend, FP32, 17, 33, 5, np.random.default_rng(0))
    backend.close()


def test_auto_picks_the_faster_measured(monkeypatch):
    backend = _open(monkeypatch, "auto")
    # before any tune: on a CPU the tuned kernel's defaults, elsewhere CLBlast where it imports
    path, params = backend.gemm_path(FP32, 64, 64, 64)
    if backend.info().kind == "cpu" or opencl.pyclblast is None:
        assert (path, params) == ("tuned", opencl_tune.default_params(backend._facts, "fp32"))
    else:
        assert path == "clblast"
    backend.close()
    key = backend.tuning_key
    opencl_tune.save_entry(key, "fp32", "small", _entry(POINTS[1], tuned=10.0, clblast=20.0))
    opencl_tune.save_entry(key, "fp32", "medium", _entry(POINTS[2], tuned=30.0, clblast=20.0))
    backend = _open(monkeypatch, "auto")
    assert backend.gemm_path(FP32, 1024, 1024, 1024) == ("tuned", POINTS[2])
    expected_small = ("clblast", None) if opencl.pyclblast is not None else ("tuned", POINTS[1])
    assert backend.gemm_path(FP32, 64, 64, 64) == expected_small
    backend.close()
    backend = _open(monkeypatch, "tuned")  # tuned takes the tuned kernel even where CLBlast measured faster
    assert backend.gemm_path(FP32, 64, 64, 64) == ("tuned", POINTS[1])
    backend.close()


def test_tune_searches_checks_and_caches(monkeypatch):
    backend = _open(monkeypatch, "tuned")
    steps = []
    axes = [[{"wm": 4}, {"wm": 6}], [{"pack": 0}]]
    entry = backend.tune_gemm(FP32, "small", on_step=lambda *s: steps.append(s), axes=axes, shape=(40, 200, 33))
    assert entry["shape"] == [40, 200, 33] and entry["tuned_gflops"] > 0
    # none fails or computes a wrong product (a loaded machine may cut a slow one short)
    assert entry["candidates"] == 4
    assert all(c["why_not"] in ("", "slower than 2x the best") for c in entry["candidates_tried"])
    assert entry["kernel_gflops"] > 0
    assert (entry["clblast_gflops"] is not None) == (opencl.pyclblast is not None)
    assert steps[-1][0] == steps[-1][1] == 4 + 1 + (opencl.pyclblast is not None)
    assert [1, 1, 1] in entry["verified_shapes"]
    backend.close()
    # a new backend takes the cached winner without searching again
    backend = _open(monkeypatch, "tuned")
    assert backend.gemm_path(FP32, 40, 200, 33) == ("tuned", GemmParams.from_dict(entry["params"]))
    assert backend.gemm_notes == []
    _check(backend, FP32, 40, 200, 33, np.random.default_rng(1))
    backend.close()


def test_a_wrong_product_never_wins(monkeypatch):
    backend = _open(monkeypatch, "tuned")
    real_enqueue = backend._tuned.enqueue

    def broken(params, *args):
        real_enqueue(params, *args)
        if params.wm == 6:  # this candidate computes rubbish: C zeroed after the product
            c = args[-2]
            opencl.cl.enqueue_fill_buffer(backend._tuned.queue, c, np.float32(0), 0, c.size)

    monkeypatch.setattr(backend._tuned, "enqueue", broken)
    entry = backend.tune_gemm(FP32, "small", axes=[[{"wm": 6}]], shape=(24, 64, 16))
    tried = {c["label"]: c["why_not"] for c in entry["candidates_tried"]}
    wrong = [label for label, why in tried.items() if why == "wrong product"]
    assert len(wrong) == 1 and wrong[0].startswith("6x")
    assert entry["params"]["wm"] != 6
    backend.close()


def test_tune_command(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from hetbench.cli import cli

    monkeypatch.setattr(opencl_tune, "SHAPE_CLASSES", {**opencl_tune.SHAPE_CLASSES, "small": (64, 64, 64)})
    out = tmp_path / "tune.json"
    result = CliRunner().invoke(cli, ["tune", "--backend", "opencl", "--shape-class", "small", "--budget", "1",
                                      "--out", str(out), "--csv", str(tmp_path / "tune.csv")])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    (row,) = document["rows"]
    assert row["shape_class"] == "small" and row["tuned_gflops"] > 0 and row["verified"] is True
    assert row["auto_gemm"] in ("tuned", "clblast")
    entries, note = opencl_tune.load_entries(opencl.open_device(BackendSpec("opencl", 0), 0, 1).tuning_key)
    assert note is None and list(entries) == ["fp32/small"]
    wrong = CliRunner().invoke(cli, ["tune", "--backend", "opencl", "--shape-class", "huge"])
    assert wrong.exit_code == 2 and "small, thin, medium, large" in wrong.output
    host = CliRunner().invoke(cli, ["tune", "--backend", "host", "--shape-class", "small", "--out",
                                    str(tmp_path / "h.json"), "--csv", str(tmp_path / "h.csv")])
    assert host.exit_code == 2 and "has no tunable GEMM" in host.output and not (tmp_path / "h.json").exists()
    for budget in ("nan", "inf", "0.5"):
        wrong = CliRunner().invoke(cli, ["tune", "--backend", "opencl", "--budget", budget])
        assert wrong.exit_code == 2 and "--budget" in wrong.output, (budget, wrong.output)


def test_half_storage_path_where_the_device_builds_it():
    """fp16 data (vload_half/vstore_half, float accumulation) on this device even where it lacks cl_khr_fp16 and so
    never offers fp16 to a run: the kernel's half path is exercised wherever the compiler takes it."""
    import warnings

    cl = opencl.cl
    device = opencl._all_devices()[0][1]
    context = cl.Context([device])
    queue = cl.CommandQueue(context)
    kernels = opencl_tune.TunedKernels(cl, context, queue, device)
    rng = np.random.default_rng(7)
    fp16 = DTYPES["fp16"]
    for params in POINTS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                kernels.build(params, "fp16")
        except Exception as e:  # a compiler that refuses half without the extension
            pytest.skip(f"this device's compiler does not build the half path: {type(e).__name__}")
        for m, n, k in SHAPES:
            a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
            b = rng.uniform(-1, 1, (k, n)).astype(np.float16)
            a_dev, b_dev = opencl.cl_array.to_device(queue, a), opencl.cl_array.to_device(queue, b)
            c_dev = opencl.cl_array.empty(queue, (m, n), np.float16)
            kernels.enqueue(params, "fp16", 2, m, n, k, a_dev.base_data, 0, b_dev.base_data, 0, c_dev.base_data, 0)
            queue.finish()
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            bound = 2 * k * fp16.unit_roundoff * (np.abs(a64) @ np.abs(b64))
            assert np.all(np.abs(c_dev.get().astype(np.float64) - a64 @ b64) <= bound), (params, m, n, k)
    kernels.release()


# --- every cache file and entry checked before use (issue 33) ------------------------------------------------------

@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_linked_as_the_cache_is_ignored_at_once(device):
    """A device at the cache's path (a link to /dev/zero would never end, /dev/null reads as empty): ignored with a
    note that says so, and a tune replaces the link with the file, the device untouched."""
    import os
    import stat

    key = DeviceKey("P", "P 1", "dev", "1.0")
    key.path().parent.mkdir(parents=True)
    os.symlink(device, key.path())
    entries, note = _load_in_a_thread(key)
    assert entries == {} and "\n" not in note and str(key.path()) in note
    assert "is a device, not a regular file" in note and "ignored" in note
    opencl_tune.save_entry(key, "fp32", "medium", _entry(POINTS[0]))
    assert not key.path().is_symlink() and stat.S_ISCHR(os.stat(device).st_mode)
    assert list(opencl_tune.load_entries(key)[0]) == ["fp32/medium"]


# a device of small limits: work-groups of 64, 32 along each dimension, 4 KiB of local memory
SMALL_DEVICE = opencl_tune.DeviceFacts("gpu", 64, (32, 32, 32), 4096, {"fp32": 4, "fp64": 2, "fp16": 8})
FITS = GemmParams(vw=4, nv=1, wm=4, lx=8, ly=4)
WIDE = GemmParams(vw=4, nv=1, wm=4, lx=16, ly=16)  # 256 work-items
LONG = GemmParams(vw=4, nv=1, wm=4, lx=64)  # 64 work-items, but 64 along the first dimension
DEEP = GemmParams(vw=4, nv=1, wm=8, lx=8, ly=4, use_local=1, kb=32)  # (4*8*32 + 32*8*4) * 4 bytes = 8 KiB


def test_params_no_device_runs_are_refused():
    """Bounds far past the search's points: a doctored entry of a million accumulators per work-item or a panel of
    gigabytes is corrupt (the file ignored with a note, as for any corrupt entry)."""
    assert "accumulators" in GemmParams(vw=16, nv=16, wm=8, lx=1).problem()
    assert GemmParams(vw=16, nv=2, wm=12, lx=16).problem() is None  # the CPU search's largest: 384
    assert "nc=32768 is over" in GemmParams(vw=16, nv=1, wm=8, lx=8, pack=1, nc=32768).problem()
    with pytest.raises(ValueError, match="accumulators"):
        GemmParams.from_dict(GemmParams(vw=16, nv=256, wm=256, lx=1).as_dict())


def test_params_past_the_devices_limits_are_named():
    assert SMALL_DEVICE.problem(FITS, "fp32") is None and SMALL_DEVICE.fits(FITS, "fp32")
    assert SMALL_DEVICE.problem(WIDE, "fp32") == ("a work-group of 16 x 16 = 256 work-items, over the device's "
                                                  "max_work_group_size 64")
    assert SMALL_DEVICE.problem(LONG, "fp32") == "a work-group 64 wide, over the device's max_work_item_sizes [32, 32]"
    assert SMALL_DEVICE.problem(DEEP, "fp32") == "8192 bytes of local memory, over the device's local_mem_size 4096"
    assert not SMALL_DEVICE.fits(DEEP, "fp32") and not SMALL_DEVICE.fits(WIDE, "fp32")


def test_cached_entries_the_device_cannot_run_are_skipped_with_one_note():
    """An entry past the device's limits (issue 33: a work-group over max_work_group_size failed every GEMM, exit 1,
    even under auto; local memory over local_mem_size made PoCL abort) is skipped with one note naming the cache,
    each entry and why; the entries the device can run are kept."""
    key = DeviceKey("P", "P 1", "dev", "1.0")
    for name, params in (("small", FITS), ("thin", WIDE), ("medium", LONG), ("large", DEEP)):
        opencl_tune.save_entry(key, "fp32", name, _entry(params))
    before = key.path().read_bytes()
    entries, note = opencl_tune.load_entries(key, SMALL_DEVICE)
    assert list(entries) == ["fp32/small"]
    assert "\n" not in note and note.startswith(f"the OpenCL GEMM tuning cache {key.path()}: ")
    for name, why in (("fp32/thin", "max_work_group_size 64"), ("fp32/medium", "max_work_item_sizes [32, 32]"),
                      ("fp32/large", "local_mem_size 4096")):
        label = note.split(f"{name!r} (")[1].split(")")[0]
        assert why in label, note
    assert "skipped" in note and "hetbench tune" in note
    assert key.path().read_bytes() == before  # nothing written
    # without the device's limits (a tune keeping the other entries) every entry is read
    assert len(opencl_tune.load_entries(key)[0]) == 4


def test_the_backend_never_runs_a_cached_entry_past_its_device(monkeypatch):
    backend = _open(monkeypatch, "kernel")
    key, facts = backend.tuning_key, backend._facts
    backend.close()
    wide = GemmParams(vw=1, nv=1, wm=1, lx=256, ly=256)
    deep = GemmParams(vw=1, nv=1, wm=256, lx=1, ly=16, use_local=1, kb=256)
    bad = next((p for p in (wide, deep) if not facts.fits(p, "fp32")), None)
    if bad is None:
        pytest.skip("this device runs both")
    opencl_tune.save_entry(key, "fp32", "small", _entry(bad))
    backend = _open(monkeypatch, "auto")
    assert len(backend.gemm_notes) == 1 and "'fp32/small'" in backend.gemm_notes[0], backend.gemm_notes
    path, params = backend.gemm_path(FP32, 64, 64, 64)
    assert params != bad
    _check(backend, FP32, 64, 64, 64, np.random.default_rng(2))
    backend.close()


def test_a_kernel_asking_more_local_memory_than_the_device_has_is_not_built():
    """PoCL asserts (SIGABRT) at the launch of a kernel whose local memory is over its limit: the build refuses it."""
    cl = opencl.cl
    device = opencl._all_devices()[0][1]
    deep = GemmParams(vw=1, nv=1, wm=256, lx=1, ly=16, use_local=1, kb=256)
    if deep.local_bytes("fp32") <= device.local_mem_size:
        pytest.skip("this device has the local memory")
    context = cl.Context([device])
    kernels = opencl_tune.TunedKernels(cl, context, cl.CommandQueue(context), device)
    with pytest.raises(RuntimeError, match="local memory"):
        kernels.build(deep, "fp32")
    kernels.release()


def test_a_cached_entry_whose_kernel_does_not_build_is_skipped(monkeypatch):
    """Within the device's limits but not the kernel's (its registers can cap its work-group below the device's):
    the cached winner is dropped with one note when it is first wanted, and auto takes its choice before any tune."""
    backend = _open(monkeypatch, "kernel")
    key = backend.tuning_key
    backend.close()
    opencl_tune.save_entry(key, "fp32", "small", _entry(POINTS[1]))
    backend = _open(monkeypatch, "auto")
    real_build = backend._tuned.build

    def build(params, dtype_name):
        if params == POINTS[1]:
            raise RuntimeError(f"the kernel's work-group limit is below {params.lx} x {params.ly}")
        return real_build(params, dtype_name)

    monkeypatch.setattr(backend._tuned, "build", build)
    assert backend.gemm_notes == []
    path, params = backend.gemm_path(FP32, 64, 64, 64)
    assert params != POINTS[1]
    (note,) = backend.gemm_notes
    assert f"'fp32/small' ({POINTS[1].label()}: the kernel's work-group limit is below 4 x 1) skipped" in note
    assert str(key.path()) in note
    _check(backend, FP32, 64, 64, 64, np.random.default_rng(3))
    assert backend.gemm_path(FP32, 64, 64, 64) == (path, params) and len(backend.gemm_notes) == 1
    backend.close()
