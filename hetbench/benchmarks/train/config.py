"""`hetbench train`'s run configuration (both front ends)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetbench.backends.base import BackendSpec
from hetbench.config import OutputConfig
from hetbench.dtypes import DType


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
    solo_between_steps: bool = False  # after each timed step, every rank trains the whole batch alone in turn
    check: bool = True
    log: Path | None = None
    checkpoint: Path | None = None  # save the state here (at the end, and every checkpoint_every steps if > 0)
    checkpoint_every: int = 0
    resume: Path | None = None  # a checkpoint folder (or one step folder in it) to continue from
    frontend: str = "numpy"  # numpy (hetbench's own trainer) | torch (a torch model over the hetbench backend)
    model: str = "mlp"  # torch: mlp (the residual MLP teacher task) | gpt (a char-level decoder-only transformer)
    seq_len: int = 64  # gpt: tokens per sequence
    heads: int = 4  # gpt: attention heads
    pp: int = 1  # torch: pipeline stages (the rest of the ranks data parallel by the strategy)
    schedule: str = "1f1b"  # torch with pp > 1: gpipe | 1f1b
    group_backend: str = "auto"  # torch with pp > 1 or tp > 1: each group on its native backend where one serves it
    tp_impl: str = "hetbench"  # --tp: hetbench's uneven cut, or torch's own even parallelize_module (the baseline)
    tp: int = 1  # torch: tensor-parallel degree (each layer's columns, rows, heads cut over tp ranks by the weights)
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
