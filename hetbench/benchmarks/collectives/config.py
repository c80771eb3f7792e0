"""`hetbench collectives`' run configuration and the parsing of its op list and size sweep."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetbench.backends.base import BackendSpec
from hetbench.benchmarks.collectives import ops as op_records  # its OPS read at each call: a registry
from hetbench.config import OutputConfig, parse_bytes
from hetbench.dtypes import DType


COLLECTIVE_DTYPES = ("fp64", "fp32")  # MPI has no half-precision arithmetic
PATHS = ("host", "device")
STAGE_METHODS = ("auto", "copy", "map")
MAX_STAGE_CHUNK_BYTES = 1024**3  # a chunk larger than 1 GiB stages nothing a whole copy would not


def check_stage_chunk(text: str, dtype: DType) -> int | None:
    """--stage-chunk-bytes: `auto` (None: measured), or a byte count (8, 1K, 4M) that is a whole number of elements,
    at least one, at most 1G. Raises ValueError with the value and what is accepted."""
    value = text.strip().lower()
    if value == "auto":
        return None
    accepted = (f"accepted: auto, or a byte count from {dtype.itemsize} to 1G (8, 1K, 4M; powers of 1024) that is a "
                f"multiple of the {dtype.name} size, {dtype.itemsize} bytes")
    try:
        size = parse_bytes(text)
    except ValueError as e:
        raise ValueError(f"--stage-chunk-bytes {text!r}: {e}; {accepted}") from None
    if size < dtype.itemsize or size > MAX_STAGE_CHUNK_BYTES or size % dtype.itemsize:
        raise ValueError(f"--stage-chunk-bytes {text!r} ({size} bytes) is not usable; {accepted}")
    return size


@dataclass(frozen=True)
class CollectivesConfig:
    ops: tuple[str, ...]
    min_bytes: int
    max_bytes: int
    factor: int
    dtype: DType
    backends: tuple[BackendSpec, ...]
    paths: tuple[str, ...] = ("host",)
    warmup: int = 5
    iters: int = 20
    root: int = 0
    check: bool = True
    output: OutputConfig = field(default_factory=OutputConfig)
    # the host path's pipelined staging (hetbench/comm/staging.py): bytes of a rank's part per chunk, None to measure
    # (the fastest of a few sizes, per op and size); "auto" (copy or map, measured), "copy" or "map"
    stage_chunk_bytes: int | None = None
    stage_method: str = "auto"

    def sizes(self) -> list[int]:
        """min, min*factor, ... up to max (nccl-tests' -b/-e/-f sweep)."""
        sizes, size = [], self.min_bytes
        while size <= self.max_bytes:
            sizes.append(size)
            size *= self.factor
        return sizes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dtype"] = self.dtype.name
        d["backends"] = [str(s) for s in self.backends]
        d["sizes_bytes"] = self.sizes()
        d["output"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.output).items()}
        return d


def parse_ops(texts: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """`--op allreduce --op bcast`, `--op allreduce,bcast` or `--op all`, in the order given, without repeats.
    Accepts every registered op (benchmarks.collectives.OPS)."""
    known = tuple(op_records.OPS)
    names: list[str] = []
    for text in texts:
        for name in (t.strip().lower() for t in text.split(",")):
            if name == "all":
                names.extend(known)
            elif name in op_records.OPS:
                names.append(name)
            else:
                raise ValueError(f"unknown op {name!r}; accepted: {', '.join(known)} or all")
    return tuple(dict.fromkeys(names)) or known


def check_collective_sizes(ops: tuple[str, ...], min_bytes: int, max_bytes: int, factor: int, dtype: DType,
                           nranks: int) -> None:
    """The sweep's sizes must be whole elements, split evenly over the ranks where an op needs that."""
    if dtype.name not in COLLECTIVE_DTYPES:
        raise ValueError(f"dtype {dtype.name} cannot be reduced by MPI; accepted for collectives: "
                         f"{', '.join(COLLECTIVE_DTYPES)}")
    if factor <= 1:
        raise ValueError(f"--factor {factor} must be > 1 (each size is the last times the factor)")
    if min_bytes > max_bytes:
        raise ValueError(f"--min-bytes {min_bytes} is larger than --max-bytes {max_bytes}")
    for flag, size in (("--min-bytes", min_bytes), ("--max-bytes", max_bytes)):
        if size % dtype.itemsize:
            raise ValueError(f"{flag} {size} is not a multiple of the {dtype.name} size ({dtype.itemsize} bytes)")
    split = [op for op in ops if op_records.OPS[op].size_is_total]
    unit = dtype.itemsize * nranks
    if split and min_bytes % unit:
        raise ValueError(
            f"--min-bytes {min_bytes} must be a multiple of {dtype.itemsize} bytes x {nranks} ranks = {unit} for "
            f"{', '.join(split)} (their size is split over the ranks); every later size is min x factor^i"
        )
