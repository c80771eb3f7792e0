"""GEMM, C = A @ B: its flop and byte counts, its inputs (generated or loaded) and the input checks."""

from __future__ import annotations

import numpy as np

from hetbench.dtypes import DType, to_host_dtype


class InputError(ValueError):
    """An input matrix the user supplied that cannot be used; the message names the file and the problem."""


def flops(m: int, n: int, k: int) -> int:
    """A GEMM does one multiply and one add per (i, j, l): 2 m n k."""
    return 2 * m * n * k


def device_bytes(m: int, n: int, k: int, dtype: DType) -> int:
    """Bytes A, B and C take on the device."""
    return (m * k + k * n + m * n) * dtype.itemsize


def generate_inputs(seed: int, rank: int, m: int, n: int, k: int, dtype: DType) -> tuple[np.ndarray, np.ndarray]:
    """A_r (m x k) and B_r (k x n), uniform in [-1, 1), the same for a given seed and rank on any machine."""
    rng = np.random.default_rng([seed, rank])
    work = np.float64 if dtype.name == "fp64" else np.float32
    a = rng.random((m, k), dtype=work) * 2 - 1
    b = rng.random((k, n), dtype=work) * 2 - 1
    return to_host_dtype(a, dtype), to_host_dtype(b, dtype)


def load_matrix(path: str, which: str, dtype: DType) -> np.ndarray:
    """A 2-D real matrix from a .npy file, converted to `dtype`; InputError names the file and what is wrong."""
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"--{which} file {path!r} does not exist") from None
    except PermissionError:
        raise InputError(f"--{which} file {path!r} cannot be read: permission denied") from None
    except IsADirectoryError:
        raise InputError(f"--{which} path {path!r} is a directory, not a .npy file") from None
    except (ValueError, OSError, EOFError) as e:
        raise InputError(f"--{which} file {path!r} is not a readable .npy array ({e})") from None
    if not isinstance(array, np.ndarray):
        raise InputError(f"--{which} file {path!r} holds several arrays (.npz); give one .npy matrix")
    if array.ndim != 2:
        raise InputError(f"--{which} file {path!r} holds a {array.ndim}-D array of shape {array.shape}; a matrix is 2-D")
    if 0 in array.shape:
        raise InputError(f"--{which} file {path!r} holds an empty matrix of shape {array.shape}")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
            or array.dtype == np.bool_):
        raise InputError(f"--{which} file {path!r} holds {array.dtype} values; accepted: real numbers (float or int)")
    converted = to_host_dtype(array, dtype)
    if not np.all(np.isfinite(converted)):
        raise InputError(f"--{which} file {path!r} holds NaN or infinite values (after conversion to {dtype.name})")
    return converted


def check_shapes(a: np.ndarray, b: np.ndarray, a_path: str, b_path: str) -> None:
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
