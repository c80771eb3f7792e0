"""The one benchmark driver: a new benchmark is one module (tests/toy_benchmark.py) registered like the real ones,
and the driver gives it the whole command (shared options, error agreement, files, tables, exit codes); results
files written before the redesign still load, and today's CSV keeps their columns in their order."""

from __future__ import annotations

import csv
import json
import os

import pytest
from conftest import REPO, needs_mpi, run_cli

from hetbench.results import SCHEMA_VERSION, load_results

TESTS = REPO / "tests"
DATA = TESTS / "data"
TOY = {"HETBENCH_BENCHMARKS": "toy_benchmark", "PYTHONPATH": f"{REPO}{os.pathsep}{TESTS}"}


def test_toy_benchmark_is_a_command_with_the_shared_options(tmp_path):
    run = run_cli(["axpy", "--help"], cwd=tmp_path, env=TOY)
    assert run.returncode == 0, run.stderr
    for option in ("--n", "--repeat", "--backend", "--out", "--csv", "--json", "--wide", "--progress"):
        assert option in run.stdout
    assert "axpy" not in run_cli(["--help"], cwd=tmp_path).stdout  # only registered where asked for


@needs_mpi
@pytest.mark.parametrize("nprocs", [1, 2])
def test_toy_benchmark_runs_through_the_driver(tmp_path, nprocs):
    out, csv_path = tmp_path / "t.json", tmp_path / "t.csv"
    run = run_cli(["axpy", "--n", "257", "--backend", "0=host,1=sim:mi300x" if nprocs == 2 else "host",
                   "--out", str(out), "--csv", str(csv_path)], nprocs=nprocs, cwd=tmp_path, env=TOY)
    assert run.returncode == 0, run.stderr
    assert "hetbench axpy" in run.stdout and "AXPY median (us)" not in run.stdout  # compact header: two lines
    doc = load_results(out)
    assert doc["schema"] == "hetbench.axpy" and doc["verified"] is True
    assert [r["rank"] for r in doc["rows"]] == list(range(nprocs))
    assert len(doc["metadata"]["ranks"]) == nprocs
    with open(csv_path, newline="") as f:
        header = next(csv.reader(f))
    # the declared columns, in their order, lead the CSV; the row's other fields follow
    assert header[:4] == ["rank", "backend", "axpy_seconds_median", "verified"]
    assert "device_timing" in header[4:]


def test_toy_benchmark_bad_input_is_a_usage_error(tmp_path):
    run = run_cli(["axpy", "--n", "0"], cwd=tmp_path, env=TOY)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    run = run_cli(["axpy", "--backend", "nosuch"], cwd=tmp_path, env=TOY)
    assert run.returncode == 2 and "'nosuch'" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("name", ["matmul", "collectives"])
def test_files_written_before_the_redesign_load(name):
    doc = load_results(DATA / f"{name}-v1.json")
    assert doc["schema"] == f"hetbench.{name}" and doc["schema_version"] == SCHEMA_VERSION
    assert doc["verified"] is True and doc["rows"]


@needs_mpi
@pytest.mark.parametrize("name, args", [
    ("matmul", ["matmul", "--size", "64", "--repeat", "3", "--backend", "0=host,1=sim:mi300x"]),
    ("collectives", ["collectives", "--op", "allreduce,bcast", "--max-bytes", "1K", "--min-bytes", "256",
                     "--iters", "3", "--warmup", "1", "--backend", "0=host,1=sim:h100"]),
])
def test_todays_files_keep_the_v1_fields(tmp_path, name, args):
    """The same command as made tests/data/<name>-v1.*: every v1 JSON row field and top-level key is still there,
    and every v1 CSV column, in the same order."""
    out, csv_path = tmp_path / "r.json", tmp_path / "r.csv"
    run = run_cli([*args, "--out", str(out), "--csv", str(csv_path)], nprocs=2, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    old, new = json.loads((DATA / f"{name}-v1.json").read_text()), json.loads(out.read_text())
    assert set(old) <= set(new) and set(old["config"]) <= set(new["config"])
    assert set(old["summary"]) <= set(new["summary"]) and set(old["metadata"]) <= set(new["metadata"])
    for old_row, new_row in zip(old["rows"], new["rows"]):
        assert set(old_row) <= set(new_row)
    with open(DATA / f"{name}-v1.csv", newline="") as f:
        old_header = next(csv.reader(f))
    with open(csv_path, newline="") as f:
        new_header = next(csv.reader(f))
    assert [h for h in new_header if h in old_header] == old_header
