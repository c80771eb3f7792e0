"""`hetbench matmul --backend opencl` with a doctored OpenCL GEMM tuning cache (HETBENCH_CACHE_DIR, issue 33): an
entry the device cannot run (a work-group over its max_work_group_size: every GEMM failed, exit 1; local memory over
its local_mem_size: PoCL's assertion, SIGABRT) and a device linked as the cache each give one note naming the cache,
and the run goes on right; the cache is left as it was. The commands run in one process (run_cli_batch)."""

from __future__ import annotations

import json
import os

import pytest

from helpers import needs_opencl, run_cli_batch

pytestmark = [pytest.mark.opencl, needs_opencl]


def _entry(params) -> dict:
    return {"params": params.as_dict(), "label": params.label(), "shape": [8, 8, 8], "tuned_gflops": 10.0,
            "default_gflops": None, "clblast_gflops": None, "kernel_gflops": None}


def test_a_doctored_tuning_cache_is_one_note_and_the_run_goes_on(tmp_path, monkeypatch):
    from hetbench.backends import opencl, opencl_tune
    from hetbench.backends.base import BackendSpec
    from hetbench.backends.opencl_tune import GemmParams

    monkeypatch.setenv(opencl.GEMM_ENV, "kernel")
    monkeypatch.setenv(opencl_tune.CACHE_ENV, str(tmp_path / "unused"))
    backend = opencl.open_device(BackendSpec("opencl", 0), 0, 1)
    key, facts = backend.tuning_key, backend._facts
    backend.close()
    doctored = {
        "wide": GemmParams(vw=1, nv=1, wm=1, lx=256, ly=256),
        "deep": GemmParams(vw=1, nv=1, wm=256, lx=1, ly=16, use_local=1, kb=256),
    }
    caches, commands = {}, []
    for name, params in doctored.items():
        if facts.fits(params, "fp32"):
            continue  # a device that runs it
        monkeypatch.setenv(opencl_tune.CACHE_ENV, str(tmp_path / name))
        opencl_tune.save_entry(key, "fp32", "small", _entry(params))
        caches[name] = key.path()
    monkeypatch.setenv(opencl_tune.CACHE_ENV, str(tmp_path / "device"))
    key.path().parent.mkdir()
    os.symlink("/dev/zero", key.path())
    caches["device"] = key.path()
    before = {name: path.read_bytes() for name, path in caches.items() if name != "device"}
    for name in caches:
        (tmp_path / f"run-{name}").mkdir()
        commands.append((["matmul", "--size", "64", "--backend", "opencl", "--out", str(tmp_path / f"{name}.json")],
                         tmp_path / f"run-{name}", {opencl_tune.CACHE_ENV: str(tmp_path / name),
                                                    opencl.GEMM_ENV: "auto"}))
    runs = run_cli_batch(commands, None, tmp_path / "batch", timeout=180)
    for name, run in zip(caches, runs):
        assert run.returncode == 0, (name, run.returncode, run.stderr)
        (line,) = run.stderr.splitlines()
        assert line.startswith(f"Note: the OpenCL GEMM tuning cache {caches[name]}"), line
        if name == "device":
            assert "is a device, not a regular file" in line and "ignored" in line, line
        else:
            assert "'fp32/small' (" in line and "skipped" in line, line
        assert json.loads((tmp_path / f"{name}.json").read_text())["verified"] is True
    for name, data in before.items():
        assert caches[name].read_bytes() == data, name
    assert caches["device"].is_symlink()
