"""The training strategies, one record each, for both front ends: `hetbench train --strategy` accepts the names
registered for its --frontend, and the runs read what a strategy does from its record instead of testing its name.

numpy (hetbench's own trainer, hetbench/train/): fsdp and ddp share the batch's samples by the weights, pipeline
shares the layers (GPipe). torch (hetbench/pytorch/): ddp (torch's DDP, exact under uneven batch shares), fsdp
(hetbench's uneven FSDP: parameter, gradient and optimizer shards sized by the weights) and fsdp2 (torch's
fully_shard over the hetbench backend).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

FRONTENDS = ("numpy", "torch")


@dataclass(frozen=True)
class Strategy:
    name: str
    frontend: str  # "numpy" | "torch"
    summary: str
    shares_of: str = "samples"  # what the weights share out: the batch's "samples", or the model's "layers"
    replicated: bool = False  # every rank holds the whole model (ddp)
    shards_by_weights: bool = False  # its state's shards are sized by the weights (hetbench's own fsdp)
    prefetch: bool = False  # takes --prefetch: the next layer's gather starts while this one computes
    rebalances: bool = False  # auto weights re-measured from each rank's samples/s in the first steps
    micro_batches: bool = False  # takes --micro-batches: the batch cut into micro-batches that flow through stages
    train: str | None = None  # numpy: "module:function", the training loop (see data_parallel.py, pipeline.py)

    def train_function(self) -> Callable[..., Any]:
        """The numpy strategy's training loop."""
        assert self.train is not None, f"{self.frontend} strategy {self.name} has no training loop of its own"
        module, _, function = self.train.partition(":")
        return getattr(importlib.import_module(module), function)


REGISTRY: dict[tuple[str, str], Strategy] = {}
DEFAULT = {"numpy": "fsdp", "torch": "fsdp2"}


def register(strategy: Strategy) -> Strategy:
    key = (strategy.frontend, strategy.name)
    if key in REGISTRY:
        raise ValueError(f"a {strategy.frontend} strategy named {strategy.name!r} is registered already")
    REGISTRY[key] = strategy
    return strategy


def names(frontend: str) -> tuple[str, ...]:
    """The strategies of `frontend`, in the order registered."""
    return tuple(name for (f, name) in REGISTRY if f == frontend)


def get(frontend: str, name: str) -> Strategy:
    try:
        return REGISTRY[(frontend, name)]
    except KeyError:
        raise ValueError(f"unknown {frontend} strategy {name!r}; accepted: {', '.join(names(frontend))}") from None


register(Strategy("fsdp", "numpy", "fully sharded data parallel: each rank holds a shard of every layer, gathered "
                  "per layer", shards_by_weights=True, prefetch=True, rebalances=True,
                  train="hetbench.train.data_parallel:train_fsdp"))
register(Strategy("ddp", "numpy", "data parallel: the whole model on every rank, gradients summed", replicated=True,
                  rebalances=True, train="hetbench.train.data_parallel:train_ddp"))
register(Strategy("pipeline", "numpy", "GPipe: each rank holds its share of the layers, micro-batches flow through",
                  shares_of="layers", micro_batches=True, train="hetbench.train.pipeline:train_pipeline"))
register(Strategy("ddp", "torch", "torch's DDP, exact under uneven batch shares", replicated=True, rebalances=True))
register(Strategy("fsdp", "torch", "hetbench's uneven FSDP: state shards sized by the weights",
                  shards_by_weights=True, rebalances=True))
register(Strategy("fsdp2", "torch", "torch's FSDP2 (fully_shard) over the hetbench backend", rebalances=True))
