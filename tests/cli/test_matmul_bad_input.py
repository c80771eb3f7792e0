"""Bad input to `hetbench matmul`: one line naming the bad value and what is accepted, exit code 2, with one
rank and with two, no traceback and no file left behind."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import MPIEXEC, Batches, assert_usage_error, needs_opencl, run_cli

RANKS = [None, pytest.param(2, marks=pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec"))]
BAD = [
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
]
NPY_CASES = ["missing", "garbage", "cube", "text", "nan", "mismatch", "with_size"]


def _commands(nprocs, root):
    """Every command of this file for one rank count, each in a folder of its own holding the files it reads: one
    job runs them all (helpers.Batches; a usage error ends no job)."""
    commands = [(f"bad-{i}", ["matmul", "--size", "16", "--repeat", "1", "--backend", "host", *args], {})
                for i, (args, _) in enumerate(BAD)]
    (root / "adir" / "adir").mkdir(parents=True)
    commands.append(("adir", ["matmul", "--size", "16", "--backend", "host", "--out", "adir"], {}))
    for case in NPY_CASES:
        (root / f"npy-{case}").mkdir()
        _npy_files(root / f"npy-{case}")
        args, _ = NPY[case]
        commands.append((f"npy-{case}", ["matmul", "--backend", "host", "--repeat", "1", *args], {}))
    commands.append(("cupy", ["matmul", "--size", "16", "--backend", "cupy"], {}))
    if nprocs == 2:
        one = root / "one-rank-sees"
        one.mkdir()
        np.save(one / "a_0.npy", np.ones((4, 3)))
        np.save(one / "b_0.npy", np.ones((3, 4)))
        commands.append(("one-rank-sees", ["matmul", "--backend", "host", "--a", "a_{rank}.npy", "--b",
                                           "b_{rank}.npy"], {}))
        shapes = root / "shapes"
        shapes.mkdir()
        np.save(shapes / "a_0.npy", np.ones((4, 3)))
        np.save(shapes / "a_1.npy", np.ones((5, 3)))
        np.save(shapes / "b.npy", np.ones((3, 4)))
        commands.append(("shapes", ["matmul", "--backend", "host", "--a", "a_{rank}.npy", "--b", "b.npy"], {}))
    return commands


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    return Batches(tmp_path_factory.mktemp("matmul-bad-input"), _commands, timeout=180)


@pytest.mark.parametrize("nprocs", RANKS)
@pytest.mark.parametrize("args, needles", BAD)
def test_bad_input(batches, nprocs, args, needles):
    run, folder = batches.get(nprocs)[f"bad-{BAD.index((args, needles))}"]
    assert_usage_error(run, folder, *needles)


@pytest.mark.parametrize("nprocs", RANKS)
def test_output_path_that_is_a_directory(batches, nprocs):
    run, folder = batches.get(nprocs)["adir"]
    assert_usage_error(run, folder, "--out", "adir", "directory")


@needs_opencl
@pytest.mark.parametrize("nprocs", RANKS)
def test_dtype_the_opencl_device_cannot_do(tmp_path, nprocs):
    from hetbench.backends.opencl import list_devices

    if "fp16" in list_devices()[0].dtypes:
        pytest.skip("this OpenCL device has cl_khr_fp16")
    run = run_cli(["matmul", "--size", "16", "--dtype", "fp16", "--backend", "opencl:0"], nprocs=nprocs, cwd=tmp_path)
    assert_usage_error(run, tmp_path, "fp16", "opencl:0", "fp32")


def _npy_files(tmp_path):
    np.save(tmp_path / "good_a.npy", np.ones((5, 3)))
    np.save(tmp_path / "good_b.npy", np.ones((3, 4)))
    np.save(tmp_path / "b_wrong.npy", np.ones((7, 4)))
    np.save(tmp_path / "cube.npy", np.ones((2, 2, 2)))
    np.save(tmp_path / "text.npy", np.array(["a", "b"]).reshape(1, 2))
    np.save(tmp_path / "nan.npy", np.full((3, 4), np.nan))
    (tmp_path / "garbage.npy").write_bytes(b"this is not an npy file")


NPY = {
    "missing": (["--a", "nope.npy", "--b", "good_b.npy"], ["--a", "nope.npy", "does not exist"]),
    "garbage": (["--a", "garbage.npy", "--b", "good_b.npy"], ["--a", "garbage.npy", "not a readable .npy"]),
    "cube": (["--a", "cube.npy", "--b", "good_b.npy"], ["cube.npy", "3-D", "2-D"]),
    "text": (["--a", "good_a.npy", "--b", "text.npy"], ["--b", "text.npy", "real numbers"]),
    "nan": (["--a", "good_a.npy", "--b", "nan.npy"], ["nan.npy", "NaN"]),
    "mismatch": (["--a", "good_a.npy", "--b", "b_wrong.npy"], ["5x3", "7x4", "do not multiply"]),
    "with_size": (["--a", "good_a.npy", "--b", "good_b.npy", "--size", "8"], ["--size", "--a/--b"]),
}


@pytest.mark.parametrize("nprocs", RANKS)
@pytest.mark.parametrize("case", NPY_CASES)
def test_bad_npy_inputs(batches, nprocs, case):
    run, folder = batches.get(nprocs)[f"npy-{case}"]
    _, needles = NPY[case]
    assert_usage_error(run, folder, *needles)


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")
def test_error_only_one_rank_sees_is_named_with_its_rank(batches):
    run, folder = batches.get(2)["one-rank-sees"]
    assert_usage_error(run, folder, "rank 1", "a_1.npy", "does not exist")


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")
def test_products_of_different_shapes_cannot_be_summed(batches):
    run, folder = batches.get(2)["shapes"]
    assert_usage_error(run, folder, "rank 0: 4x4", "rank 1: 5x4", "--reduce none")


@pytest.mark.parametrize("nprocs", RANKS)
def test_backend_that_is_not_installed(batches, nprocs):
    from hetbench.backends.cupy import unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        pytest.skip("CuPy and a GPU are here")
    run, folder = batches.get(nprocs)["cupy"]
    assert_usage_error(run, folder, "backend cupy is unavailable", reason.split(":")[0])
