"""`hetbench devices`: every rank's devices, merged on rank 0."""

from __future__ import annotations

import pytest
from helpers import HAVE_OPENCL, needs_mpi, run_cli

from hetbench.backends.sim_catalog import CATALOG


@pytest.mark.parametrize("nprocs", [None, pytest.param(2, marks=needs_mpi)])
def test_devices_json_lists_every_rank(tmp_path, nprocs):
    run = run_cli(["devices", "--json"], nprocs=nprocs, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    doc = run.json()
    ranks = 1 if nprocs is None else nprocs
    host_rows = [d for d in doc["devices"] if d["backend"] == "host"]
    assert sorted(d["rank"] for d in host_rows) == list(range(ranks))
    assert all(d["kind"] == "cpu" and "NumPy" in d["runtime"] for d in host_rows)
    opencl_rows = [d for d in doc["devices"] if d["backend"] == "opencl"]
    assert bool(opencl_rows) == HAVE_OPENCL
    assert not any(d["backend"] == "sim" for d in doc["devices"])
    # CuPy is absent or has no GPU on a CPU machine: it is listed as unavailable, with the reason
    cupy_rows = [d for d in doc["devices"] if d["backend"] == "cupy"]
    if not cupy_rows:
        reasons = [u for u in doc["unavailable"] if u["backend"] == "cupy"]
        assert len(reasons) == ranks and all(u["reason"] for u in reasons)


def test_devices_sim_catalog_is_modelled(tmp_path):
    run = run_cli(["devices", "--sim", "--json"], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    sims = [d for d in run.json()["devices"] if d["backend"] == "sim"]
    assert [d["details"]["model"] for d in sims] == [m.key for m in CATALOG]
    assert all(d["modelled"] and d["peak_tflops"]["fp32"] > 0 for d in sims)


@needs_mpi
def test_devices_table_only_on_rank_zero(tmp_path):
    run = run_cli(["devices", "--sim"], nprocs=2, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("hetbench devices") == 1
    assert "[modelled]" in run.stdout and "MI300X" in run.stdout
