"""The training strategies, one record each, for both front ends: `hetbench train --strategy` accepts the names
registered for its --frontend, and what a strategy does is the callable its record names (`apply`), loaded when a
run uses it, so that no code outside a strategy tests its name.

numpy (hetbench's own trainer): fsdp and ddp share the batch's samples by the weights, pipeline shares the layers
(GPipe); `apply` is the training loop. torch: ddp (torch's DDP, exact under uneven batch shares), fsdp (hetbench's
uneven FSDP: parameter, gradient and optimizer shards sized by the weights) and fsdp2 (torch's fully_shard over the
hetbench backend); `apply` makes the model parallel for the front end's step loop (train/torch_frontend/parallel.py).

Other packages add strategies through the entry point group "hetbench.strategies" (as backends and benchmarks):
the module it names registers its records when imported; their `apply` modules load only when a run uses them.
    [project.entry-points."hetbench.strategies"]
    mine = "my_package.strategies"
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Callable

from hetbench.backends.base import plugin_broke, plugin_failure

FRONTENDS = ("numpy", "torch")
ENTRY_POINT_GROUP = "hetbench.strategies"

# the options of `hetbench train` that only some strategies take (the others refuse them when given)
STRATEGY_OPTIONS = ("prefetch", "micro_batches")


@dataclass(frozen=True)
class Strategy:
    name: str
    frontend: str  # "numpy" | "torch"
    summary: str
    apply: str  # "module:attribute": numpy: the training loop; torch: what makes the model parallel
    shares_of: str = "samples"  # what the weights share out: the batch's "samples", or the model's "layers"
    options: tuple[str, ...] = ()  # which of STRATEGY_OPTIONS it takes

    def applier(self) -> Callable[..., Any]:
        """The callable `apply` names, its module imported now."""
        module, _, attribute = self.apply.partition(":")
        return getattr(importlib.import_module(module), attribute)


REGISTRY: dict[tuple[str, str], Strategy] = {}
DEFAULT = {"numpy": "fsdp", "torch": "fsdp2"}


def register(strategy: Strategy) -> Strategy:
    key = (strategy.frontend, strategy.name)
    if key in REGISTRY:
        raise ValueError(f"a {strategy.frontend} strategy named {strategy.name!r} is registered already")
    unknown = set(strategy.options) - set(STRATEGY_OPTIONS)
    if strategy.frontend not in FRONTENDS or unknown or strategy.shares_of not in ("samples", "layers"):
        raise ValueError(f"strategy {strategy.name!r}: front end {strategy.frontend!r} (accepted: "
                         f"{', '.join(FRONTENDS)}), options {sorted(unknown)} not among {', '.join(STRATEGY_OPTIONS)}, "
                         f"or shares_of {strategy.shares_of!r} not samples or layers")
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


# strategy plugins that failed to import: entry point name -> why (their strategies are not registered)
UNAVAILABLE: dict[str, str] = {}
_LOADED: set[str] = set()


def load_plugins() -> None:
    """Import the modules of the entry point group "hetbench.strategies", each once, each registering its
    strategies; one that fails (raises, exits, registers a name taken) registers nothing and is listed in
    UNAVAILABLE with why, the others load."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.module in _LOADED:
            continue
        _LOADED.add(ep.module)
        before = dict(REGISTRY)
        try:
            importlib.import_module(ep.module)
        except BaseException as e:  # a signal is not caught
            if not plugin_broke(e):
                raise
            for key in set(REGISTRY) - set(before):
                del REGISTRY[key]
            UNAVAILABLE[ep.name] = f"module {ep.module} (from an entry point) cannot be imported: {plugin_failure(e)}"


register(Strategy("fsdp", "numpy", "fully sharded data parallel: each rank holds a shard of every layer, gathered "
                  "per layer", "hetbench.train.data_parallel:train_fsdp", options=("prefetch",)))
register(Strategy("ddp", "numpy", "data parallel: the whole model on every rank, gradients summed",
                  "hetbench.train.data_parallel:train_ddp"))
register(Strategy("pipeline", "numpy", "GPipe: each rank holds its share of the layers, micro-batches flow through",
                  "hetbench.train.pipeline:train_pipeline", shares_of="layers", options=("micro_batches",)))
register(Strategy("ddp", "torch", "torch's DDP, exact under uneven batch shares",
                  "hetbench.train.torch_frontend.parallel:Replicated"))
register(Strategy("fsdp", "torch", "hetbench's uneven FSDP: state shards sized by the weights",
                  "hetbench.train.torch_frontend.parallel:UnevenSharded", options=("prefetch",)))
register(Strategy("fsdp2", "torch", "torch's FSDP2 (fully_shard) over the hetbench backend",
                  "hetbench.train.torch_frontend.parallel:FullyShard"))
