"""Run configurations and the parsing of what users type: sizes, dtypes, backends and rank maps.

Everything here is decided from the command line and the world size alone, so every rank reaches the same answer
without talking to the others. Errors are ValueError with a one-line message naming the bad value and what is
accepted; the CLI turns them into usage errors (exit code 2).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetbench.backends.base import BACKEND_NAMES, BackendSpec
from hetbench.dtypes import DTYPES, DType, get_dtype

_BYTE_SUFFIXES = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_BYTES_RE = re.compile(r"^\s*([0-9]+)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)  # ASCII digits only


def parse_bytes(text: str | int) -> int:
    """'8', '1K', '16M', '1G' (powers of 1024, as nccl-tests reads them; 'KiB'/'KB' accepted alike)."""
    if isinstance(text, int):
        value = text
    else:
        match = _BYTES_RE.match(str(text))
        if not match:
            raise ValueError(f"{text!r} is not a byte count; accepted: an integer with an optional K, M, G or T suffix")
        value = int(match.group(1)) * _BYTE_SUFFIXES[match.group(2).upper()]
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive byte count")
    return value


def parse_backend_spec(text: str) -> BackendSpec:
    """`auto`, `host`, `opencl`, `opencl:1`, `cupy`, `cupy:0`, `sim:mi300x`, `sim:mi300x:1`."""
    parts = text.strip().split(":")
    name = parts[0].strip().lower()
    accepted = "auto, host, opencl[:INDEX], cupy[:INDEX], sim:MODEL[:INDEX]"
    if name not in ("auto", *BACKEND_NAMES):
        raise ValueError(f"unknown backend {text!r}; accepted: {accepted}")

    def index_of(value: str) -> int:
        if not value.isdigit():
            raise ValueError(f"bad device index {value!r} in backend {text!r}; accepted: an integer >= 0")
        return int(value)

    if name == "sim":
        from hetbench.backends.sim import models

        catalog = models()

        if len(parts) < 2 or not parts[1]:
            raise ValueError(f"backend {text!r} names no simulated GPU; write sim:MODEL, MODEL one of: {', '.join(catalog)}")
        if len(parts) > 3:
            raise ValueError(f"malformed backend {text!r}; accepted: {accepted}")
        model = parts[1].strip().lower()
        if model not in catalog:
            raise ValueError(f"unknown simulated GPU {parts[1]!r} in {text!r}; accepted: {', '.join(catalog)}")
        return BackendSpec("sim", index_of(parts[2]) if len(parts) == 3 else None, model)
    if len(parts) > 2:
        raise ValueError(f"malformed backend {text!r}; accepted: {accepted}")
    return BackendSpec(name, index_of(parts[1]) if len(parts) == 2 else None)


def parse_backend_map(text: str, world_size: int) -> list[BackendSpec]:
    """One backend for every rank (`sim:h100`), or a rank map (`0=cupy,1=opencl,2=sim:mi300x`).

    Ranks a map does not name use `auto`."""
    text = text.strip()
    if "=" not in text:
        return [parse_backend_spec(text)] * world_size
    specs: dict[int, BackendSpec] = {}
    for entry in text.split(","):
        rank_text, sep, spec_text = entry.partition("=")
        rank_text = rank_text.strip()
        if not sep or not rank_text.isdigit() or not spec_text.strip():
            raise ValueError(
                f"malformed rank map entry {entry!r} in {text!r}; accepted: RANK=BACKEND[,RANK=BACKEND...], "
                "e.g. 0=cupy,1=opencl,2=sim:mi300x"
            )
        rank = int(rank_text)
        if rank >= world_size:
            raise ValueError(
                f"rank map {text!r} names rank {rank}, but the job has {world_size} rank(s): 0..{world_size - 1}"
            )
        if rank in specs:
            raise ValueError(f"rank map {text!r} names rank {rank} twice")
        specs[rank] = parse_backend_spec(spec_text)
    return [specs.get(rank, BackendSpec("auto")) for rank in range(world_size)]


def parse_dtype(text: str) -> DType:
    return get_dtype(text.strip().lower())


DTYPE_NAMES = tuple(DTYPES)


@dataclass(frozen=True)
class OutputConfig:
    """Where results go. Paths are checked before any computing."""

    out_json: Path | None = None
    out_csv: Path | None = None
    json_stdout: bool = False


@dataclass(frozen=True)
class MatmulConfig:
    m: int
    n: int
    k: int
    dtype: DType
    backends: tuple[BackendSpec, ...]  # one per rank
    warmup: int = 2
    repeat: int = 10
    seed: int = 0
    reduce: str = "sum"  # sum | none
    root: int = 0
    a_path: str | None = None  # may hold {rank} and {host}
    b_path: str | None = None
    save: Path | None = None  # the reduced result, .npy, written at the root
    output: OutputConfig = field(default_factory=OutputConfig)
    # a size sweep (--sizes): square products of each size in turn, smallest first; m, n, k are then the largest
    sizes: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sizes"] = list(self.sizes)
        d["dtype"] = self.dtype.name
        d["backends"] = [str(s) for s in self.backends]
        d["save"] = str(self.save) if self.save else None
        d["output"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.output).items()}
        return d


def expand_rank_path(template: str, rank: int, host: str) -> str:
    """A per-rank input path: `{rank}` and `{host}` are replaced; nothing else is interpreted."""
    return template.replace("{rank}", str(rank)).replace("{host}", host)


COLLECTIVE_DTYPES = ("fp64", "fp32")  # MPI has no half-precision arithmetic
PATHS = ("host", "device")


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
    from hetbench.benchmarks.collectives import OPS

    known = tuple(OPS)
    names: list[str] = []
    for text in texts:
        for name in (t.strip().lower() for t in text.split(",")):
            if name == "all":
                names.extend(known)
            elif name in OPS:
                names.append(name)
            else:
                raise ValueError(f"unknown op {name!r}; accepted: {', '.join(known)} or all")
    return tuple(dict.fromkeys(names)) or known


def check_collective_sizes(ops: tuple[str, ...], min_bytes: int, max_bytes: int, factor: int, dtype: DType,
                           nranks: int) -> None:
    """The sweep's sizes must be whole elements, split evenly over the ranks where an op needs that."""
    from hetbench.benchmarks.collectives import OPS

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
    split = [op for op in ops if OPS[op].size_is_total]
    unit = dtype.itemsize * nranks
    if split and min_bytes % unit:
        raise ValueError(
            f"--min-bytes {min_bytes} must be a multiple of {dtype.itemsize} bytes x {nranks} ranks = {unit} for "
            f"{', '.join(split)} (their size is split over the ranks); every later size is min x factor^i"
        )


SPLIT_STRATEGIES = ("rows", "k", "auto")


@dataclass(frozen=True)
class SplitConfig:
    """`hetbench split`: one GEMM of A (m x k) and B (k x n), both at the root, sliced across the ranks."""

    m: int
    n: int
    k: int
    dtype: DType
    backends: tuple[BackendSpec, ...]
    strategy: str = "auto"  # rows | k | auto
    weights: Any = None  # split_plan.Weights
    rebalance: int = 0  # iterations of re-weighting from measured compute times; 0: none
    compare_even: bool = True  # measure the even split beside the chosen one
    warmup: int = 1
    repeat: int = 5
    seed: int = 0
    a_path: str | None = None  # read at the root
    b_path: str | None = None
    save: Path | None = None
    plan: bool = False
    link_gbit_per_s: float | None = None  # --plan's modelled link between the root and each other rank
    link_latency_us: float | None = None
    output: OutputConfig = field(default_factory=OutputConfig)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dtype"] = self.dtype.name
        d["backends"] = [str(s) for s in self.backends]
        d["weights"] = None if self.weights is None else {"kind": self.weights.kind,
                                                          "values": list(self.weights.values),
                                                          "path": self.weights.path}
        d["save"] = str(self.save) if self.save else None
        d["output"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.output).items()}
        return d


@dataclass(frozen=True)
class TrainConfig:
    """`hetbench train`: a residual MLP trained across the ranks by one strategy."""

    strategy: str  # fsdp | ddp | pipeline
    layers: int
    hidden: int
    batch: int  # global
    steps: int
    lr: float
    optimizer: str  # adamw | sgd
    seed: int
    dtype: DType
    weights: Any  # split_plan.Weights
    backends: tuple[BackendSpec, ...]
    micro_batches: int = 4
    path: str = "host"
    prefetch: bool = True  # fsdp: start the next layer's gather while this one computes
    warmup_steps: int = 0  # the run's first steps, left out of the timing figures (still logged and checked)
    check: bool = True
    log: Path | None = None
    checkpoint: Path | None = None  # save the state here (at the end, and every checkpoint_every steps if > 0)
    checkpoint_every: int = 0
    resume: Path | None = None  # a checkpoint folder (or one step folder in it) to continue from
    frontend: str = "numpy"  # numpy (hetbench's own trainer) | torch (a torch model over the hetbench backend)
    model: str = "mlp"  # torch: mlp (the residual MLP teacher task) | gpt (a char-level decoder-only transformer)
    seq_len: int = 64  # gpt: tokens per sequence
    heads: int = 4  # gpt: attention heads
    output: OutputConfig = field(default_factory=OutputConfig)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dtype"] = self.dtype.name
        d["backends"] = [str(s) for s in self.backends]
        d["weights"] = {"kind": self.weights.kind, "values": list(self.weights.values), "path": self.weights.path}
        d["log"] = str(self.log) if self.log else None
        d["checkpoint"] = str(self.checkpoint) if self.checkpoint else None
        d["resume"] = str(self.resume) if self.resume else None
        d["output"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.output).items()}
        return d
