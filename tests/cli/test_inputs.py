"""--a/--b inputs (issue 6): regular files only (a FIFO never blocks), the .npy header read and checked first
(shape, type, size against the header, A's columns against B's rows, memory) before any data, then the data read
a chunk at a time, converted exactly as before."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import numpy as np
import pytest
from helpers import MPIEXEC, REPO, assert_usage_error, needs_mpi, run_cli

from hetbench.harness import gemm
from hetbench.dtypes import DTYPES, to_host_dtype

RANKS = [None, pytest.param(2, marks=needs_mpi)]
MATMUL = ["matmul", "--backend", "host", "--repeat", "1", "--warmup", "0"]


def write_header(path, shape, descr="<f8", data: bytes = b"", fortran_order=False) -> None:
    """A .npy header saying whatever the test wants, followed by `data`."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": fortran_order, "shape": shape})
        f.write(data)


def sparse_matrix_file(path, rows: int, cols: int, descr="<f8") -> None:
    """A .npy file whose header and size are right for rows x cols, its data a hole (no disk, reads as zeros)."""
    write_header(path, (rows, cols), descr)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) + rows * cols * np.dtype(descr).itemsize)


@pytest.mark.parametrize("nprocs", RANKS)
def test_fifo_input_is_refused_without_blocking(tmp_path, nprocs):
    """The old code blocked in np.load forever (with {rank}, one rank's FIFO blocked the whole job)."""
    if nprocs:
        np.save(tmp_path / "a_0.npy", np.ones((4, 3)))
    np.save(tmp_path / "b.npy", np.ones((3, 4)))
    os.mkfifo(tmp_path / ("a_1.npy" if nprocs else "a_0.npy"))
    run = run_cli([*MATMUL, "--a", "a_{rank}.npy", "--b", "b.npy"], nprocs=nprocs, cwd=tmp_path, timeout=30)
    expected = "a_1.npy" if nprocs else "a_0.npy"
    assert_usage_error(run, tmp_path, "--a", expected, "is a FIFO, not a regular file")
    if nprocs:
        assert "rank 1" in run.error_lines[0]


def test_device_input_is_refused(tmp_path):
    np.save(tmp_path / "b.npy", np.ones((3, 4)))
    run = run_cli([*MATMUL, "--a", "/dev/zero", "--b", "b.npy"], cwd=tmp_path, timeout=30)
    assert_usage_error(run, tmp_path, "--a", "'/dev/zero'", "is a device, not a regular file")


def test_header_claiming_far_more_than_the_file_holds(tmp_path):
    """100000x100000 float64 over 64 bytes: a clear usage error from the header, not a MemoryError (exit 1)."""
    write_header(tmp_path / "a.npy", (100000, 100000), data=b"\0" * 64)
    np.save(tmp_path / "b.npy", np.ones((100000, 2)))
    run = run_cli([*MATMUL, "--a", "a.npy", "--b", "b.npy"], cwd=tmp_path, timeout=60)
    assert_usage_error(run, tmp_path, "--a", "'a.npy'", "truncated", "100000x100000 float64", "64 bytes")
    assert "MemoryError" not in run.stderr


def test_truncated_file(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((50, 40)))
    size = os.path.getsize(tmp_path / "a.npy")
    os.truncate(tmp_path / "a.npy", size - 8)
    np.save(tmp_path / "b.npy", np.ones((40, 3)))
    run = run_cli([*MATMUL, "--a", "a.npy", "--b", "b.npy"], cwd=tmp_path)
    assert_usage_error(run, tmp_path, "--a", "truncated", "50x40 float64 (16000 bytes of data)", "15992 bytes")


def test_data_beyond_what_the_header_says(tmp_path):
    np.save(tmp_path / "b.npy", np.ones((4, 3)))
    with open(tmp_path / "b.npy", "ab") as f:
        f.write(b"\0" * 16)
    np.save(tmp_path / "a.npy", np.ones((2, 4)))
    run = run_cli([*MATMUL, "--a", "a.npy", "--b", "b.npy"], cwd=tmp_path)
    assert_usage_error(run, tmp_path, "--b", "'b.npy'", "112 bytes after its header", "4x3 float64")


def test_npz_archive(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.ones((2, 2)))
    np.save(tmp_path / "b.npy", np.ones((2, 2)))
    run = run_cli([*MATMUL, "--a", "a.npz", "--b", "b.npy"], cwd=tmp_path)
    assert_usage_error(run, tmp_path, "--a", "several arrays (.npz)")


@pytest.mark.parametrize("descr, needle", [("<c16", "complex128"), ("|O", "Python objects"),
                                           ([("x", "<f4"), ("y", "<f4")], "real numbers")])
def test_types_that_are_not_real_numbers(tmp_path, descr, needle):
    write_header(tmp_path / "a.npy", (2, 2), descr, b"\0" * 64)
    np.save(tmp_path / "b.npy", np.ones((2, 2)))
    run = run_cli([*MATMUL, "--a", "a.npy", "--b", "b.npy"], cwd=tmp_path)
    assert run.returncode == 2 and len(run.error_lines) == 1, run.stderr
    assert "--a" in run.error_lines[0] and needle in run.error_lines[0], run.stderr


def test_shapes_are_compared_before_any_data_is_read(tmp_path):
    """A 60000x60000 float64 A (a 28.8 GB file, sparse here) with a B that does not fit it: refused from the
    headers in moments, with almost no memory; the old code read (or failed to allocate) all of A first."""
    sparse_matrix_file(tmp_path / "a.npy", 60000, 60000)
    np.save(tmp_path / "b.npy", np.ones((7, 3)))
    run = run_cli([*MATMUL, "--a", "a.npy", "--b", "b.npy"], cwd=tmp_path, timeout=30)
    assert_usage_error(run, tmp_path, "60000x60000", "7x3", "do not multiply")
    assert run.seconds < 20


def test_memory_is_checked_from_the_headers_before_loading(tmp_path):
    """Shapes that multiply, but more memory than the process may take (RLIMIT_AS of 2 GiB, set in the child):
    refused from the headers (exit 2, naming host memory), never a MemoryError after reading."""
    sparse_matrix_file(tmp_path / "a.npy", 30000, 30000)  # 7.2 GB
    np.save(tmp_path / "b.npy", np.ones((30000, 2)))
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    limit = 2 * 1024**3

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.run([sys.executable, "-m", "hetbench", *MATMUL, "--a", "a.npy", "--b", "b.npy"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env, preexec_fn=cap,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert "host memory" in proc.stderr and "RLIMIT_AS" in proc.stderr, proc.stderr
    assert "MemoryError" not in proc.stderr and "Traceback" not in proc.stderr


@needs_mpi
def test_fortran_order_big_endian_and_integer_inputs_give_the_right_sum(tmp_path):
    """Loading a chunk at a time changes nothing: Fortran-ordered, big-endian and integer files over two ranks."""
    rng = np.random.default_rng(5)
    a0 = np.asfortranarray(rng.random((70, 33)))
    b0 = rng.random((33, 20)).astype(">f4")
    a1 = rng.integers(-5, 5, size=(70, 12)).astype(np.int16)
    b1 = np.asfortranarray(rng.random((12, 20)).astype(">f8"))
    for name, array in (("a_0", a0), ("b_0", b0), ("a_1", a1), ("b_1", b1)):
        np.save(tmp_path / f"{name}.npy", array)
    run = run_cli([*MATMUL, "--a", "a_{rank}.npy", "--b", "b_{rank}.npy", "--dtype", "fp64", "--save", "s.npy",
                   "--out", "r.json"], nprocs=2, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    want = a0 @ b0.astype(np.float64) + a1.astype(np.float64) @ b1
    np.testing.assert_allclose(np.load(tmp_path / "s.npy"), want, rtol=1e-12)


@pytest.mark.parametrize("fortran", [False, True])
@pytest.mark.parametrize("stored", ["<f8", ">f4", "<f2", "<i4", "|b1", "<u2"])
@pytest.mark.parametrize("dtype", ["fp64", "fp32", "fp16", "bf16"])
def test_chunked_read_equals_whole_conversion(tmp_path, monkeypatch, fortran, stored, dtype):
    monkeypatch.setattr(gemm, "LOAD_CHUNK_BYTES", 1000)  # many chunks, with a ragged last one
    rng = np.random.default_rng(1)
    x = (rng.random((37, 29)) * 50).astype(stored)
    x = np.asfortranarray(x) if fortran else x
    np.save(tmp_path / "x.npy", x)
    header = gemm.read_matrix_header(str(tmp_path / "x.npy"), "a")
    assert header.shape == (37, 29) and header.fortran_order == fortran
    got = gemm.read_matrix(header, DTYPES[dtype])
    want = to_host_dtype(x, DTYPES[dtype])
    assert got.dtype == want.dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)


def test_nan_in_a_late_chunk_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(gemm, "LOAD_CHUNK_BYTES", 256)
    x = np.ones((40, 8))
    x[39, 7] = np.nan
    np.save(tmp_path / "x.npy", x)
    with pytest.raises(gemm.InputError, match="NaN or infinite"):
        gemm.load_matrix(str(tmp_path / "x.npy"), "a", DTYPES["fp32"])


def test_values_that_overflow_the_type_are_refused(tmp_path):
    np.save(tmp_path / "x.npy", np.full((3, 3), 1e6))
    with pytest.raises(gemm.InputError, match="after conversion to fp16"):
        gemm.load_matrix(str(tmp_path / "x.npy"), "b", DTYPES["fp16"])


def test_file_changed_between_header_and_data(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.ones((5, 5)))
    header = gemm.read_matrix_header(str(path), "a")
    np.save(path, np.ones((5, 6)))
    with pytest.raises(gemm.InputError, match="changed while hetbench was reading it"):
        gemm.read_matrix(header, DTYPES["fp32"])


def test_symlink_to_a_regular_file_is_read(tmp_path):
    np.save(tmp_path / "real.npy", np.eye(3))
    (tmp_path / "link.npy").symlink_to(tmp_path / "real.npy")
    np.testing.assert_array_equal(gemm.load_matrix(str(tmp_path / "link.npy"), "a", DTYPES["fp64"]), np.eye(3))


def test_generated_inputs_are_those_of_one_draw(tmp_path):
    """Inputs drawn straight into their arrays (no float64 or full-size temporaries) are the values one draw of
    the generator gives, as before."""
    for name in DTYPES:
        a, b = gemm.generate_inputs(3, 1, 300, 7, 2000, DTYPES[name])
        rng = np.random.default_rng([3, 1])
        work = np.float64 if name == "fp64" else np.float32
        np.testing.assert_array_equal(a, to_host_dtype(rng.random((300, 2000), dtype=work) * 2 - 1, DTYPES[name]))
        np.testing.assert_array_equal(b, to_host_dtype(rng.random((2000, 7), dtype=work) * 2 - 1, DTYPES[name]))

