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
