"""The element types hetbench computes in, and how each is held on the host.

bf16 has no NumPy type: it is held in float32 whose values are rounded to bf16, so the data stays exact bf16
values while the arithmetic a backend does on it is its own business.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # the name users type: fp64, fp32, fp16, bf16
    itemsize: int  # bytes per element on a device
    host: np.dtype  # how the host holds it
    unit_roundoff: float  # u = eps / 2 of the format

    @property
    def mpi_dtype(self) -> np.dtype:
        """The type that goes over MPI: MPI has no half types, so fp16/bf16 travel as float32."""
        return np.dtype(np.float32) if self.itemsize < 4 else self.host


DTYPES: dict[str, DType] = {
    "fp64": DType("fp64", 8, np.dtype(np.float64), 2.0**-53),
    "fp32": DType("fp32", 4, np.dtype(np.float32), 2.0**-24),
    "fp16": DType("fp16", 2, np.dtype(np.float16), 2.0**-11),
    "bf16": DType("bf16", 2, np.dtype(np.float32), 2.0**-8),
}


def get_dtype(name: str) -> DType:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; accepted: {', '.join(DTYPES)}") from None


def array_module(x: object) -> object:
    """The array library of `x`: numpy for NumPy arrays (and anything else that is not a CuPy array), cupy for
    CuPy's (cupy.get_array_module), so the same code computes on the host or on the GPU."""
    if isinstance(x, np.ndarray) or type(x).__module__.split(".")[0] != "cupy":
        return np
    import cupy  # only reached with a CuPy array in hand

    return cupy.get_array_module(x)


def _errstate(xp: object) -> object:
    """NumPy's errstate silencing overflow/invalid (beyond a half type's range is infinity, as on a device); CuPy
    never warns."""
    import contextlib

    return np.errstate(over="ignore", invalid="ignore") if xp is np else contextlib.nullcontext()


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bf16 value (ties to even), returned as float32. Values beyond bf16's
    largest finite value (about 3.39e38) round to infinity; a NaN stays a NaN (the carry of the rounding would
    otherwise turn a NaN whose top bits are all ones into zero, hiding an overflow from a loss scaler). NumPy or
    CuPy arrays alike."""
    xp = array_module(x)
    x32 = xp.ascontiguousarray(x, dtype=xp.float32)
    bits = x32.view(xp.uint32)
    rounding = ((bits >> 16) & 1) + xp.uint32(0x7FFF)
    out = ((bits + rounding) & xp.uint32(0xFFFF0000)).view(xp.float32)
    nan = xp.isnan(x32)
    if nan.any():
        out = xp.where(nan, xp.float32(np.nan), out)
    return out


def round_to_dtype(x: np.ndarray, dtype: DType) -> np.ndarray:
    """float32 values rounded to the nearest value of `dtype` (fp16: IEEE half, round to nearest even, beyond
    65504 to infinity; bf16: round_to_bf16), returned as float32: the compute dtype's values held for float32
    arithmetic. fp32 and fp64 data is returned as float32 unrounded further. Overflow to infinity is expected
    (mixed precision's loss scaler looks for it), so NumPy's overflow warning is silenced here. NumPy or CuPy
    arrays alike."""
    if dtype.name == "bf16":
        return round_to_bf16(x)
    xp = array_module(x)
    if dtype.name == "fp16":
        with _errstate(xp):
            return xp.asarray(x, dtype=xp.float32).astype(xp.float16).astype(xp.float32)
    return xp.asarray(x, dtype=xp.float32)


def to_host_dtype(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Cast (and for bf16, round) data into the dtype's host representation (on a CuPy array: the same
    representation, on the GPU)."""
    xp = array_module(x)
    with _errstate(xp):  # beyond fp16's range is infinity, as on a device
        out = xp.ascontiguousarray(x, dtype=dtype.host)
    if dtype.name == "bf16":
        out = round_to_bf16(out)
    return out


# the dtypes training computes in, and those of them that keep float32 masters beside (hetbench/train/precision.py)
TRAIN_DTYPES = ("fp32", "fp16", "bf16")
MIXED_DTYPES = ("fp16", "bf16")


def train_dtype(dtype: DType | str) -> DType:
    """The DType of a training run; ValueError for one training does not compute in (fp64)."""
    dtype = get_dtype(dtype) if isinstance(dtype, str) else dtype
    if dtype.name not in TRAIN_DTYPES:
        raise ValueError(f"training computes in {', '.join(TRAIN_DTYPES)}, not {dtype.name}")
    return dtype


def is_mixed(dtype: DType | str) -> bool:
    return (dtype if isinstance(dtype, str) else dtype.name) in MIXED_DTYPES
