"""`hetbench matmul` end to end: the real CLI, alone and under mpiexec, checked against NumPy and its files."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from helpers import needs_mpi, needs_opencl, run_cli, run_cli_stages

from hetbench.results import SCHEMA_VERSION, load_results


def _files(tmp_path):
    return tmp_path / "r.json", tmp_path / "r.csv"


def _check_document(doc: dict, ranks: int) -> None:
    assert doc["schema"] == "hetbench.matmul" and doc["schema_version"] == SCHEMA_VERSION
    assert doc["verified"] is True
    assert len(doc["rows"]) == ranks
    assert [r["rank"] for r in doc["rows"]] == list(range(ranks))
    for row in doc["rows"]:
        assert row["verified"] is True
        assert len(row["raw"]["gemm_seconds"]) == doc["config"]["repeat"]
        assert row["gemm_seconds_min"] <= row["gemm_seconds_median"] <= row["gemm_seconds_max"]
        flops = 2 * row["m"] * row["n"] * row["k"]
        assert row["gemm_flops"] == flops
        assert row["gemm_tflops"] == pytest.approx(flops / row["gemm_seconds_median"] / 1e12)
    meta = doc["metadata"]
    assert meta["world_size"] == ranks and len(meta["hosts"]) == ranks
    assert meta["versions"]["numpy"] == np.__version__
    assert "MPI" in meta["mpi_library"] or "mpi" in meta["mpi_library"].lower()
    assert doc["config"]["seed"] == 0


def _check_csv(path, ranks: int) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == ranks
    assert [int(r["rank"]) for r in rows] == list(range(ranks))
    assert all(r["verified"] == "True" for r in rows)
    assert float(rows[0]["gemm_seconds_median"]) > 0
    return rows


def test_single_rank_host(tmp_path):
    out, csv_path = _files(tmp_path)
    run = run_cli(["matmul", "--size", "96", "--backend", "host", "--repeat", "3", "--out", str(out),
                   "--csv", str(csv_path)], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "hetbench matmul" in run.stdout and "all checks passed" in run.stdout
    doc = load_results(out)
    _check_document(doc, 1)
    assert doc["summary"]["reduced_verified"] is True
    _check_csv(csv_path, 1)


def test_default_outputs_go_to_results_folder(tmp_path):
    run = run_cli(["matmul", "--size", "32", "--backend", "host", "--repeat", "1"], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    written = sorted(p.suffix for p in (tmp_path / "results").iterdir())
    assert written == [".csv", ".json"]


def test_json_stdout_is_only_json(tmp_path):
    run = run_cli(["matmul", "--size", "40", "--backend", "host", "--repeat", "2", "--json",
                   "--out", str(tmp_path / "r.json")], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    doc = run.json()
    _check_document(doc, 1)
    assert doc == json.loads((tmp_path / "r.json").read_text())


USER_SHAPES = {0: (37, 53), 1: (37, 29)}  # k differs per rank; C_r is 37 x 23 on both


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """This file's two-rank commands in one MPI job (helpers.run_cli_stages; a failed check ends no job): NAME ->
    (its Run, its folder); and the sum the user matrices' products must add up to."""
    root = tmp_path_factory.mktemp("matmul-pair")
    rng = np.random.default_rng(7)
    expected = np.zeros((37, 23))
    (root / "user").mkdir()
    for rank, (m, k) in USER_SHAPES.items():
        a = rng.standard_normal((m, k))
        b = rng.standard_normal((k, 23))
        np.save(root / "user" / f"a_{rank}.npy", a)
        np.save(root / "user" / f"b_{rank}.npy", b)
        expected += a @ b
    user = root / "user"
    commands = [
        ("default", ["matmul", "--size", "128", "--repeat", "3", "--out", str(root / "default" / "r.json"), "--csv",
                     str(root / "default" / "r.csv")], {}),
        ("user", ["matmul", "--a", str(user / "a_{rank}.npy"), "--b", str(user / "b_{rank}.npy"), "--dtype", "fp64",
                  "--backend", "host", "--repeat", "2", "--save", str(user / "sum.npy"), "--out",
                  str(user / "r.json")], {}),
        ("root-one", ["matmul", "--size", "48", "--repeat", "2", "--backend", "0=sim:h100,1=sim:mi300x", "--root",
                      "1", "--save", str(root / "root-one" / "sum.npy"), "--out", str(root / "root-one" / "r.json")],
         {}),
        ("reduce-none", ["matmul", "--size", "32", "--repeat", "1", "--backend", "host", "--reduce", "none", "--out",
                         str(root / "reduce-none" / "r.json")], {}),
        ("wrong", ["matmul", "--size", "64", "--repeat", "1", "--backend", "sim:a100", "--out",
                   str(root / "wrong" / "r.json")], {"HETBENCH_SIM_FAULT": "corrupt@1"}),
    ]
    return run_cli_stages(root, [(2, commands)]), expected


@needs_mpi
def test_two_ranks_default_backend(pair):
    run, folder = pair[0]["default"]
    out, csv_path = _files(folder)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("hetbench matmul") == 1  # only rank 0 prints
    doc = load_results(out)
    _check_document(doc, 2)
    assert doc["summary"]["reduced_verified"] is True
    for row in doc["rows"]:
        assert row["reduce_bytes"] == 128 * 128 * 4
        assert len(row["raw"]["reduce_seconds"]) == 3
    _check_csv(csv_path, 2)


@needs_mpi
@needs_opencl
def test_three_ranks_host_opencl_sim(tmp_path):
    out, csv_path = _files(tmp_path)
    run = run_cli(["matmul", "--size", "100", "--repeat", "2", "--backend", "0=host,1=opencl,2=sim:mi300x",
                   "--out", str(out), "--csv", str(csv_path)], nprocs=3, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    doc = load_results(out)
    _check_document(doc, 3)
    backends = [r["backend"] for r in doc["rows"]]
    assert backends == ["host", "opencl", "sim:mi300x"]
    timing = [r["device_timing"] for r in doc["rows"]]
    assert timing == ["measured", "measured", "modelled"]
    assert doc["summary"]["end_to_end_timing"] == "modelled"
    assert doc["rows"][2]["peak_tflops"] > 0 and doc["rows"][2]["peak_percent"] is not None
    assert "modelled" in run.stdout
    rows = _check_csv(csv_path, 3)
    assert rows[2]["device_timing"] == "modelled"


@needs_mpi
def test_user_matrices_two_ranks_saved_sum_matches_numpy(pair):
    (run, folder), expected = pair[0]["user"], pair[1]
    assert run.returncode == 0, run.stderr
    reduced = np.load(folder / "sum.npy")
    assert reduced.shape == (37, 23) and reduced.dtype == np.float64
    np.testing.assert_allclose(reduced, expected, rtol=1e-12, atol=1e-12)
    doc = load_results(folder / "r.json")
    assert [(r["m"], r["n"], r["k"]) for r in doc["rows"]] == [(37, 23, 53), (37, 23, 29)]


@needs_mpi
def test_sim_pair_with_root_one_saves_fp32_sum(pair):
    run, folder = pair[0]["root-one"]
    save = folder / "sum.npy"
    assert run.returncode == 0, run.stderr
    from hetbench.harness.gemm import generate_inputs
    from hetbench.dtypes import DTYPES

    expected = sum(np.matmul(*generate_inputs(0, r, 48, 48, 48, DTYPES["fp32"])).astype(np.float64) for r in (0, 1))
    np.testing.assert_allclose(np.load(save), expected, rtol=1e-4, atol=1e-4)


@needs_mpi
def test_reduce_none_has_no_reduce_figures(pair):
    run, tmp_path = pair[0]["reduce-none"]
    assert run.returncode == 0, run.stderr
    doc = load_results(tmp_path / "r.json")
    assert "reduce_seconds_median" not in doc["rows"][0]
    assert "reduced_verified" not in doc["summary"] and doc["verified"] is True


@needs_mpi
def test_rank_failing_mid_run_ends_job_quickly(tmp_path):
    run = run_cli(["matmul", "--size", "64", "--repeat", "2", "--backend", "sim:h100", "--out",
                   str(tmp_path / "r.json")], nprocs=2, cwd=tmp_path, timeout=60,
                  env={"HETBENCH_SIM_FAULT": "matmul@1"})
    assert run.returncode != 0
    assert run.seconds < 10
    assert run.stderr.count("simulated device fault") == 1
    assert "rank 1" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("nprocs", [None, pytest.param(2, marks=needs_mpi)])
def test_wrong_product_is_caught_and_exit_code_is_one(request, tmp_path, nprocs):
    """One wrong element of C on the last rank: its row and the sum are FAILED, the files say so, exit code 1."""
    last = 0 if nprocs is None else nprocs - 1
    if nprocs is None:
        out = tmp_path / "r.json"
        run = run_cli(["matmul", "--size", "64", "--repeat", "1", "--backend", "sim:a100", "--out", str(out)],
                      cwd=tmp_path, env={"HETBENCH_SIM_FAULT": f"corrupt@{last}"})
    else:  # in the two-rank job (the fixture's command names rank 1)
        run, folder = request.getfixturevalue("pair")[0]["wrong"]
        out = folder / "r.json"
    assert run.returncode == 1, run.stderr
    assert "FAILED" in run.stdout
    doc = load_results(out)
    assert doc["verified"] is False
    assert [r["verified"] for r in doc["rows"]] == [r != last for r in range(last + 1)]
    assert doc["summary"]["reduced_verified"] is False
    assert doc["rows"][last]["max_residual_over_tolerance"] > 1
