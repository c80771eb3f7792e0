"""Bad input to `hetbench matmul`: one line naming the bad value and what is accepted, exit code 2, with one
rank and with two, no traceback and no file left behind."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import MPIEXEC, assert_usage_error, needs_opencl, run_cli

RANKS = [None, pytest.param(2, marks=pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec"))]


@pytest.mark.parametrize("nprocs", RANKS)
@pytest.mark.parametrize(
    "args, needles",
    [
        (["--size", "0"], ["--size", "0", "1<=x<=2147483647"]),
        (["--size", "-5"], ["--size", "-5", "1<=x<=2147483647"]),
        (["--size", "abc"], ["--size", "'abc'", "integer"]),
        (["--k", "0"], ["--k", "0"]),
        (["--dtype", "fp8"], ["--dtype", "'fp8'", "fp64", "bf16"]),
        (["--backend", "cuda"], ["--backend", "'cuda'", "accepted", "opencl", "sim:MODEL"]),
        (["--backend", "sim:h200x"], ["'h200x'", "h100", "mi300x"]),
        (["--backend", "opencl:x"], ["'x'", "integer"]),
        (["--backend", "0=host,1"], ["malformed rank map entry '1'", "RANK=BACKEND"]),
        (["--backend", "0=host,7=host"], ["rank 7", "0.."]),
        (["--backend", "0=host,0=sim:h100"], ["rank 0 twice"]),
        (["--root", "9"], ["--root", "9", "0.."]),
        (["--dtype", "bf16", "--backend", "host"], ["bf16", "host:0", "fp64, fp32, fp16"]),
        (["--size", "200000", "--backend", "sim:v100"], ["bytes", "sim:0", "free", "smaller size"]),
        (["--reduce", "none", "--save", "x.npy"], ["--save", "--reduce sum"]),
        (["--a", "a.npy"], ["--a and --b"]),
        (["--out", "no/such/folder/r.json"], ["--out", "no/such/folder", "does not exist"]),
        (["--csv", "no/such/folder/r.csv"], ["--csv", "does not exist"]),
        (["--save", "no/such/folder/s.npy"], ["--save", "does not exist"]),
    ],
)
def test_bad_input(tmp_path, nprocs, args, needles):
    run = run_cli(["matmul", "--size", "16", "--repeat", "1", "--backend", "host", *args], nprocs=nprocs,
                  cwd=tmp_path, timeout=60)
    assert_usage_error(run, tmp_path, *needles)


@pytest.mark.parametrize("nprocs", RANKS)
def test_output_path_that_is_a_directory(tmp_path, nprocs):
    (tmp_path / "adir").mkdir()
    run = run_cli(["matmul", "--size", "16", "--backend", "host", "--out", "adir"], nprocs=nprocs, cwd=tmp_path)
    assert_usage_error(run, tmp_path, "--out", "adir", "directory")


@needs_opencl
@pytest.mark.parametrize("nprocs", RANKS)
def test_dtype_the_opencl_device_cannot_do(tmp_path, nprocs):
    from hetbench.backends.opencl import list_devices

    if "fp16" in list_devices()[0].dtypes:
        pytest.skip("this OpenCL device has cl_khr_fp16")
    run = run_cli(["matmul", "--size", "16", "--dtype", "fp16", "--backend", "opencl:0"], nprocs=nprocs, cwd=tmp_path)
    assert_usage_error(run, tmp_path, "fp16", "opencl:0", "fp32")


def _npy_cases(tmp_path):
    np.save(tmp_path / "good_a.npy", np.ones((5, 3)))
    np.save(tmp_path / "good_b.npy", np.ones((3, 4)))
    np.save(tmp_path / "b_wrong.npy", np.ones((7, 4)))
    np.save(tmp_path / "cube.npy", np.ones((2, 2, 2)))
    np.save(tmp_path / "text.npy", np.array(["a", "b"]).reshape(1, 2))
    np.save(tmp_path / "nan.npy", np.full((3, 4), np.nan))
    (tmp_path / "garbage.npy").write_bytes(b"this is not an npy file")
    return {
        "missing": (["--a", "nope.npy", "--b", "good_b.npy"], ["--a", "nope.npy", "does not exist"]),
        "garbage": (["--a", "garbage.npy", "--b", "good_b.npy"], ["--a", "garbage.npy", "not a readable .npy"]),
        "cube": (["--a", "cube.npy", "--b", "good_b.npy"], ["cube.npy", "3-D", "2-D"]),
        "text": (["--a", "good_a.npy", "--b", "text.npy"], ["--b", "text.npy", "real numbers"]),
        "nan": (["--a", "good_a.npy", "--b", "nan.npy"], ["nan.npy", "NaN"]),
        "mismatch": (["--a", "good_a.npy", "--b", "b_wrong.npy"], ["5x3", "7x4", "do not multiply"]),
        "with_size": (["--a", "good_a.npy", "--b", "good_b.npy", "--size", "8"], ["--size", "--a/--b"]),
    }


@pytest.mark.parametrize("nprocs", RANKS)
@pytest.mark.parametrize("case", ["missing", "garbage", "cube", "text", "nan", "mismatch", "with_size"])
def test_bad_npy_inputs(tmp_path, nprocs, case):
    args, needles = _npy_cases(tmp_path)[case]
    run = run_cli(["matmul", "--backend", "host", "--repeat", "1", *args], nprocs=nprocs, cwd=tmp_path)
    assert_usage_error(run, tmp_path, *needles)


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")
def test_error_only_one_rank_sees_is_named_with_its_rank(tmp_path):
    np.save(tmp_path / "a_0.npy", np.ones((4, 3)))
    np.save(tmp_path / "b_0.npy", np.ones((3, 4)))
    run = run_cli(["matmul", "--backend", "host", "--a", "a_{rank}.npy", "--b", "b_{rank}.npy"], nprocs=2,
                  cwd=tmp_path)
    assert_usage_error(run, tmp_path, "rank 1", "a_1.npy", "does not exist")


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")
def test_products_of_different_shapes_cannot_be_summed(tmp_path):
    np.save(tmp_path / "a_0.npy", np.ones((4, 3)))
    np.save(tmp_path / "a_1.npy", np.ones((5, 3)))
    np.save(tmp_path / "b.npy", np.ones((3, 4)))
    run = run_cli(["matmul", "--backend", "host", "--a", "a_{rank}.npy", "--b", "b.npy"], nprocs=2, cwd=tmp_path)
    assert_usage_error(run, tmp_path, "rank 0: 4x4", "rank 1: 5x4", "--reduce none")


@pytest.mark.parametrize("nprocs", RANKS)
def test_backend_that_is_not_installed(tmp_path, nprocs):
    from hetbench.backends.cupy import unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        pytest.skip("CuPy and a GPU are here")
    run = run_cli(["matmul", "--size", "16", "--backend", "cupy"], nprocs=nprocs, cwd=tmp_path)
    assert_usage_error(run, tmp_path, "backend cupy is unavailable", reason.split(":")[0])
