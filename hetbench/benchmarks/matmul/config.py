"""`hetbench matmul`'s run configuration, decided from the command line alone (the same on every rank)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetbench.backends.base import BackendSpec
from hetbench.config import OutputConfig
from hetbench.dtypes import DType


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
