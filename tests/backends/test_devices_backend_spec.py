"""`hetbench devices` shows, for every device, what to give `--backend` to use it, and that is accepted."""

from __future__ import annotations

import pytest
from helpers import HAVE_OPENCL, run_cli

from hetbench.backends.sim_catalog import CATALOG
from hetbench.config import parse_backend_spec


def test_devices_json_gives_a_backend_spec_that_backend_accepts(tmp_path):
    run = run_cli(["devices", "--sim", "--json"], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    devices = run.json()["devices"]
    specs = [d["backend_spec"] for d in devices]
    assert [s for s in specs if s.startswith("sim:")] == [f"sim:{m.key}" for m in CATALOG]
    assert "host:0" in specs and ("opencl:0" in specs) == HAVE_OPENCL
    for d in devices:
        parsed = parse_backend_spec(d["backend_spec"])  # no ValueError: the user can type it
        assert parsed.name == d["backend"]


def test_devices_table_shows_sim_keys_not_catalog_positions(tmp_path):
    run = run_cli(["devices", "--sim"], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    backend_cells = [line.split("│")[3].strip() for line in run.stdout.splitlines()
                     if line.startswith("│") and line.split("│")[3].strip()]
    assert [c for c in backend_cells if c.startswith("sim:")] == [f"sim:{m.key}" for m in CATALOG]
    assert "host:0" in backend_cells
    assert "sim:0" not in run.stdout and "sim:8" not in run.stdout


@pytest.mark.parametrize("model", ["h100", "mi300x"])
def test_a_sim_spec_from_the_table_runs(tmp_path, model):
    run = run_cli(["matmul", "--size", "32", "--repeat", "1", "--backend", f"sim:{model}",
                   "--out", str(tmp_path / "r.json")], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
