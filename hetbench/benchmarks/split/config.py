"""`hetbench split`'s run configuration."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetbench.backends.base import BackendSpec
from hetbench.config import OutputConfig
from hetbench.dtypes import DType


SPLIT_STRATEGIES = ("rows", "k", "auto")
DEFAULT_LINK_GBIT = 100.0  # --plan's link: 100 Gb/s, as AWS EFA
DEFAULT_LINK_LATENCY_US = 10.0


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
    overlap: bool = True  # stream the chunks while the devices compute (stream.py); False: phases between barriers
    chunks: int | None = None  # --chunks; None: auto (stream.auto_chunks)
    zero_copy: bool = True  # streamed rows on one node, every rank computing in host memory: the root's window
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
