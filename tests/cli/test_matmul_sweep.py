"""`hetbench matmul --sizes`: one run multiplies square products of each size in turn, every size a whole run
(inputs, warm-up, repeats, checks, reduce), its rows in one table and one file; bad sweeps refused with exit 2."""

from __future__ import annotations

import csv
import json

import click
import numpy as np
import pytest

from helpers import assert_usage_error, needs_mpi, run_cli
from hetbench.options import MAX_SWEEP_SIZES, SizeList


@pytest.mark.parametrize("text, sizes", [
    ("256:4096", (256, 512, 1024, 2048, 4096)),
    ("100:1000:3", (100, 300, 900)),
    ("512,64,128", (64, 128, 512)),
    ("48", (48,)),
    ("7:7", (7,)),
    ("1_024,2048", (1024, 2048)),
])
def test_size_list_forms(text, sizes):
    assert SizeList().convert(text, None, None) == sizes


@pytest.mark.parametrize("text, needle", [
    ("64:32", "MIN 64 is larger than MAX 32"),
    ("0,64", "'0' in '0,64' is not a size"),
    ("64,,128", "'' in '64,,128' is not a size"),
    ("64,64", "64 is given twice"),
    ("1:8:1", "'1' in '1:8:1' is not a FACTOR"),
    ("1:8:2:3", "'1:8:2:3' is not MIN:MAX[:FACTOR]"),
    ("１６,32", "is not a size"),
    (",".join(str(i) for i in range(1, MAX_SWEEP_SIZES + 2)), f"more than {MAX_SWEEP_SIZES} sizes"),
])
def test_size_list_refuses(text, needle):
    with pytest.raises(click.BadParameter) as e:
        SizeList().convert(text, None, None)
    assert needle in str(e.value) and "accepted:" in str(e.value)


@needs_mpi
def test_sweep_runs_every_size_on_every_rank(tmp_path):
    out, csv_path = tmp_path / "s.json", tmp_path / "s.csv"
    run = run_cli(["matmul", "--sizes", "96,32,64", "--repeat", "2", "--warmup", "1",
                   "--backend", "0=host,1=sim:mi300x", "--out", str(out), "--csv", str(csv_path)], nprocs=2,
                  cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    # every rank's row of the smallest size first
    assert [(r["rank"], r["m"], r["n"], r["k"]) for r in rows] == [
        (rank, s, s, s) for s in (32, 64, 96) for rank in (0, 1)]
    for r in rows:
        assert r["gemm_flops"] == 2 * r["m"] ** 3
        assert len(r["raw"]["gemm_seconds"]) == 2 and len(r["raw"]["reduce_seconds"]) == 2
        assert r["verified"] is True
        assert r["gemm_tflops"] == pytest.approx(r["gemm_flops"] / r["gemm_seconds_median"] / 1e12)
    assert doc["config"]["sizes"] == [32, 64, 96] and doc["config"]["m"] == 96
    summary = doc["summary"]
    assert [(s["m"], s["verified"]) for s in summary["sizes"]] == [(32, True), (64, True), (96, True)]
    for s in summary["sizes"]:
        size_rows = [r for r in rows if r["m"] == s["m"]]
        assert s["total_gemm_flops"] == sum(r["gemm_flops"] for r in size_rows)
        slowest = max(r["gemm_seconds_median"] for r in size_rows)
        assert s["aggregate_gemm_tflops"] == pytest.approx(s["total_gemm_flops"] / slowest / 1e12)
    # the top-level figures are the largest size's
    assert summary["aggregate_gemm_tflops"] == summary["sizes"][-1]["aggregate_gemm_tflops"]
    assert summary["verified"] is True and summary["reduced_verified"] is True
    with open(csv_path, newline="") as f:
        csv_rows = list(csv.DictReader(f))
    assert [(int(r["rank"]), int(r["m"])) for r in csv_rows] == [(r["rank"], r["m"]) for r in rows]
    # one table, each size's closing line
    assert "2 ranks, 3 sizes" in run.stdout
    for s in (32, 64, 96):
        assert f"{s}x{s}x{s}: end-to-end" in run.stdout
    assert "result: all checks passed" in run.stdout


@needs_mpi
def test_sweep_fails_when_one_size_computes_wrong(tmp_path):
    """A wrong product on one rank fails its size's check and the job's exit code, and the files say which."""
    out = tmp_path / "s.json"
    run = run_cli(["matmul", "--sizes", "16,32", "--repeat", "1", "--warmup", "0", "--backend", "0=host,1=sim:h100",
                   "--out", str(out)], nprocs=2, cwd=tmp_path, env={"HETBENCH_SIM_FAULT": "corrupt@1"})
    assert run.returncode == 1, run.stderr
    doc = json.loads(out.read_text())
    assert [(r["rank"], r["m"], r["verified"]) for r in doc["rows"]] == [
        (0, 16, True), (1, 16, False), (0, 32, True), (1, 32, False)]
    assert [s["verified"] for s in doc["summary"]["sizes"]] == [False, False]
    assert doc["summary"]["verified"] is False
    assert "a check FAILED" in run.stdout


def test_sweep_of_one_size_is_that_size(tmp_path):
    """--sizes N computes what --size N computes: the same generated inputs give the same product."""
    saved = tmp_path / "c.npy"
    single = run_cli(["matmul", "--size", "24", "--repeat", "1", "--backend", "host", "--save", str(saved),
                      "--out", str(tmp_path / "a.json")], cwd=tmp_path)
    sweep = run_cli(["matmul", "--sizes", "24", "--repeat", "1", "--backend", "host", "--out",
                     str(tmp_path / "b.json")], cwd=tmp_path)
    assert single.returncode == 0 and sweep.returncode == 0, single.stderr + sweep.stderr
    from hetbench.harness.gemm import generate_inputs
    from hetbench.dtypes import DTYPES

    a, b = generate_inputs(0, 0, 24, 24, 24, DTYPES["fp32"])
    np.testing.assert_allclose(np.load(saved), a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    rows = [json.loads((tmp_path / n).read_text())["rows"][0] for n in ("a.json", "b.json")]
    assert rows[0]["gemm_flops"] == rows[1]["gemm_flops"] and rows[1]["verified"] is True


@pytest.mark.parametrize("extra, needle", [
    (["--size", "32"], "--sizes cannot be combined with --size"),
    (["--m", "32"], "--sizes cannot be combined with --m"),
    (["--save", "x.npy"], "--sizes cannot be combined with --save"),
    (["--a", "a.npy", "--b", "b.npy"], "--sizes cannot be combined with --a/--b"),
])
def test_sweep_refuses_options_it_cannot_honour(tmp_path, extra, needle):
    run = run_cli(["matmul", "--sizes", "16,32", "--backend", "host", *extra], cwd=tmp_path)
    assert_usage_error(run, tmp_path, needle)


@needs_mpi
def test_sweep_whose_largest_size_does_not_fit_is_refused_before_any_run(tmp_path):
    run = run_cli(["matmul", "--sizes", "16,100000", "--backend", "host"], nprocs=2, cwd=tmp_path)
    assert_usage_error(run, tmp_path, "100000x100000 @ 100000x100000 in fp32 needs up to")
    assert run.seconds < 60
