"""GEMM, C = A @ B: its flop and byte counts, its inputs (generated or loaded) and the input checks."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

import numpy as np

from hetbench.dtypes import DType, to_host_dtype

LOAD_CHUNK_BYTES = 8 * 1024**2  # a loaded matrix is read and converted this much at a time
_GENERATE_CHUNK_ELEMENTS = 1 << 20  # likewise for the generated inputs


class InputError(ValueError):
    """An input matrix the user supplied that cannot be used; the message names the file and the problem."""


def flops(m: int, n: int, k: int) -> int:
    """A GEMM does one multiply and one add per (i, j, l): 2 m n k."""
    return 2 * m * n * k


def device_bytes(m: int, n: int, k: int, dtype: DType) -> int:
    """Bytes A, B and C take on the device."""
    return (m * k + k * n + m * n) * dtype.itemsize


def _generate(rng: np.random.Generator, rows: int, cols: int, dtype: DType) -> np.ndarray:
    """Uniform in [-1, 1), drawn a block of rows at a time straight into the result: the stream of draws is the
    one a single rng.random((rows, cols)) takes, with no temporary as large as the matrix."""
    work = np.dtype(np.float64 if dtype.name == "fp64" else np.float32)
    out = np.empty((rows, cols), dtype=dtype.host)
    if out.dtype == work and dtype.name != "bf16":
        rng.random(dtype=work, out=out)  # drawn straight into the result
        out *= 2
        out -= 1
        return out
    step = max(1, _GENERATE_CHUNK_ELEMENTS // max(cols, 1))
    for start in range(0, rows, step):
        block = rng.random((min(step, rows - start), cols), dtype=work)
        block *= 2
        block -= 1
        out[start : start + len(block)] = to_host_dtype(block, dtype)
    return out


def generate_inputs(seed: int, rank: int, m: int, n: int, k: int, dtype: DType) -> tuple[np.ndarray, np.ndarray]:
    """A_r (m x k) and B_r (k x n), uniform in [-1, 1), the same for a given seed and rank on any machine."""
    rng = np.random.default_rng([seed, rank])
    a = _generate(rng, m, k, dtype)
    b = _generate(rng, k, n, dtype)
    return a, b


def generate_scratch_bytes(rows: int, cols: int, dtype: DType) -> int:
    """Host bytes `_generate` holds besides its result: a block in the work type and its conversion."""
    if dtype.name in ("fp32", "fp64"):
        return 0
    step = min(rows, max(1, _GENERATE_CHUNK_ELEMENTS // max(cols, 1)))
    work = 8 if dtype.name == "fp64" else 4
    return step * cols * (work + 2 * dtype.host.itemsize)


@dataclass(frozen=True)
class MatrixFile:
    """A .npy matrix whose header has been read and checked; its data not yet."""

    path: str
    which: str  # "a" or "b": the option that named it
    shape: tuple[int, int]
    dtype: np.dtype  # as stored in the file
    fortran_order: bool
    data_offset: int  # bytes before the data
    identity: tuple[int, int, int, int]  # (device, inode, size, mtime_ns): the file must not change before loading

    @property
    def data_bytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.dtype.itemsize


def _open_regular(path: str, which: str) -> tuple[int, os.stat_result]:
    """Open a file for reading only if it is a regular file: a FIFO or a device would block or never end, so it is
    refused from its stat before it is opened (and opened non-blocking, and checked again, in case it changed)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise InputError(f"--{which} file {path!r} does not exist") from None
    except PermissionError:
        raise InputError(f"--{which} file {path!r} cannot be read: permission denied") from None
    except OSError as e:
        raise InputError(f"--{which} file {path!r} cannot be read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"--{which} path {path!r} is a directory, not a .npy file")
    kind = _not_regular(st.st_mode)
    if kind:
        raise InputError(f"--{which} file {path!r} is {kind}, not a regular file; give a .npy file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except PermissionError:
        raise InputError(f"--{which} file {path!r} cannot be read: permission denied") from None
    except OSError as e:
        raise InputError(f"--{which} file {path!r} cannot be read: {e.strerror or e}") from None
    st = os.fstat(fd)
    kind = _not_regular(st.st_mode)
    if kind:
        os.close(fd)
        raise InputError(f"--{which} file {path!r} is {kind}, not a regular file; give a .npy file")
    return fd, st


def _not_regular(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def read_matrix_header(path: str, which: str) -> MatrixFile:
    """Read and check a .npy file's header only: a regular file, a 2-D non-empty matrix of real numbers, and a
    file size that matches what the header says (a truncated file, or a header claiming 100000x100000 over 64
    bytes, is an InputError here, before any memory is taken for the data)."""
    fd, st = _open_regular(path, which)
    with os.fdopen(fd, "rb") as f:
        try:
            magic = f.read(6)
            if magic.startswith(b"PK\x03\x04"):
                raise InputError(f"--{which} file {path!r} holds several arrays (.npz); give one .npy matrix")
            f.seek(0)
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f".npy format version {version[0]}.{version[1]} (structured fields); a plain "
                                 "matrix is version 1.0 or 2.0")
        except InputError:
            raise
        except (ValueError, OSError, EOFError, SyntaxError) as e:
            raise InputError(f"--{which} file {path!r} is not a readable .npy array ({e})") from None
        data_offset = f.tell()
    if dtype.hasobject:
        raise InputError(f"--{which} file {path!r} holds Python objects; accepted: real numbers (float or int)")
    if len(shape) != 2:
        raise InputError(f"--{which} file {path!r} holds a {len(shape)}-D array of shape {shape}; a matrix is 2-D")
    if 0 in shape:
        raise InputError(f"--{which} file {path!r} holds an empty matrix of shape {shape}")
    if dtype.kind not in "fiub" or dtype.fields is not None:
        raise InputError(f"--{which} file {path!r} holds {dtype} values; accepted: real numbers (float or int)")
    header = MatrixFile(path, which, (int(shape[0]), int(shape[1])), dtype, bool(fortran_order), data_offset,
                        _identity(st))
    held = st.st_size - data_offset
    if held != header.data_bytes:
        said = f"{shape[0]}x{shape[1]} {dtype} ({header.data_bytes} bytes of data)"
        if held < header.data_bytes:
            raise InputError(f"--{which} file {path!r} is truncated: its header says {said}, but the file holds "
                             f"{held} bytes after the header")
        raise InputError(f"--{which} file {path!r} holds {held} bytes after its header, which says {said}; "
                         "not a .npy matrix as NumPy writes it")
    return header


def load_scratch_bytes(header: MatrixFile, dtype: DType) -> int:
    """Host bytes `read_matrix` holds besides its result: one chunk as read, converted, and checked."""
    line = header.shape[0] if header.fortran_order else header.shape[1]
    lines = max(1, LOAD_CHUNK_BYTES // (line * header.dtype.itemsize))
    elements = min(lines, header.shape[1] if header.fortran_order else header.shape[0]) * line
    return elements * (header.dtype.itemsize + 2 * max(dtype.host.itemsize, 4) + 1)


def read_matrix(header: MatrixFile, dtype: DType) -> np.ndarray:
    """The data of a checked .npy matrix, converted to `dtype` a chunk at a time into the result (no copy of the
    whole file in its own type); InputError if a value is not finite after conversion or the file changed."""
    path, which = header.path, header.which
    m, k = header.shape
    out = np.empty((m, k), dtype=dtype.host)
    # the file's data is a run of lines: rows of A (C order) or its columns (Fortran order)
    count, line = (k, m) if header.fortran_order else (m, k)
    lines = max(1, LOAD_CHUNK_BYTES // (line * header.dtype.itemsize))
    raw = np.empty(min(lines, count) * line * header.dtype.itemsize, dtype=np.uint8)
    fd, st = _open_regular(path, which)
    with os.fdopen(fd, "rb", buffering=0) as f:
        if _identity(st) != header.identity:
            raise InputError(f"--{which} file {path!r} changed while hetbench was reading it")
        f.seek(header.data_offset)
        for start in range(0, count, lines):
            n_lines = min(lines, count - start)
            nbytes = n_lines * line * header.dtype.itemsize
            view = memoryview(raw)[:nbytes]
            got = 0
            while got < nbytes:
                n = f.readinto(view[got:])
                if not n:
                    raise InputError(f"--{which} file {path!r} changed while hetbench was reading it (it is shorter)")
                got += n
            block = raw[:nbytes].view(header.dtype).reshape(n_lines, line)
            with np.errstate(over="ignore", invalid="ignore"):
                converted = to_host_dtype(block, dtype)
            if not np.all(np.isfinite(converted)):
                raise InputError(f"--{which} file {path!r} holds NaN or infinite values (after conversion to "
                                 f"{dtype.name})")
            if header.fortran_order:
                out[:, start : start + n_lines] = converted.T
            else:
                out[start : start + n_lines] = converted
    return out


def load_matrix(path: str, which: str, dtype: DType) -> np.ndarray:
    """A 2-D real matrix from a .npy file, converted to `dtype`; InputError names the file and what is wrong.
    The header is read and checked first (read_matrix_header), then the data."""
    return read_matrix(read_matrix_header(path, which), dtype)


def check_shapes(a, b, a_path: str, b_path: str) -> None:  # type: ignore[no-untyped-def]
    """A's columns must equal B's rows; `a` and `b` are arrays or MatrixFile headers (anything with a shape)."""
    if a.shape[1] != b.shape[0]:
        raise InputError(
            f"shapes do not multiply: --a {a_path!r} is {a.shape[0]}x{a.shape[1]} and --b {b_path!r} is "
            f"{b.shape[0]}x{b.shape[1]}; A's columns must equal B's rows"
        )


def _largest_finite(dtype: DType) -> float:
    """The largest finite value of the dtype's format (bf16's own, though the host holds it in float32)."""
    if dtype.name == "bf16":
        return float.fromhex("0x1.fep127")  # (2 - 2**-7) * 2**127
    return float(np.finfo(dtype.host).max)


def _largest_magnitude(x: np.ndarray) -> float:
    return max(abs(float(x.max())), abs(float(x.min())))  # no |x| copy of a large matrix


def check_finite_products(a: np.ndarray, b: np.ndarray, dtype: DType, a_path: str, b_path: str,
                          addends: int = 1) -> None:
    """Refuse inputs whose product could overflow, before computing it: every partial sum of an element of
    A @ B is at most max|A| max|B| k in magnitude, and that must be a finite value of the dtype; summed over
    `addends` ranks (in the type that goes over MPI) it must stay finite too. The check of the product squares the
    entries in float64, so they must fit there as well."""
    k = a.shape[1]
    a_max, b_max = _largest_magnitude(a), _largest_magnitude(b)
    bound = a_max * b_max * k  # Python floats: inf, never an exception or a warning, when it overflows
    what = f"the product of --a {a_path!r} (largest |value| {a_max:.3g}) and --b {b_path!r} (largest |value| " \
           f"{b_max:.3g}) over k={k}"
    remedy = "scale the inputs down" + ("" if dtype.name == "fp64" else " or use a wider --dtype")
    limits = [(bound, what, dtype.name, _largest_finite(dtype))]
    if addends > 1:  # the sum goes over MPI as dtype.mpi_dtype (float32 for the half types)
        limits.append((bound * addends, f"{what}, summed over {addends} ranks,", dtype.mpi_dtype.name,
                       float(np.finfo(dtype.mpi_dtype).max)))
    for reach, where, type_name, largest in limits:
        if reach > largest:
            reached = f"reach {reach:.3g}, beyond" if reach < float("inf") else "exceed"
            raise InputError(f"{where} can {reached} the largest {type_name} value ({largest:.3g}); {remedy}")
    float64_largest = float(np.finfo(np.float64).max)
    for which, path, value in (("a", a_path, a_max), ("b", b_path, b_max)):
        if value * value * k * 4 > float64_largest:  # x's entries are below 1.5: x^2 < 4
            raise InputError(
                f"--{which} file {path!r} holds values up to {value:.3g}, too large for the float64 check of the "
                f"product (their squares summed over k={k} overflow); scale the inputs down"
            )
