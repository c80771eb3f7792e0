"""A training front end: what trains the model on each rank. `hetbench train --frontend NAME` runs the one named here:
numpy (hetbench's own trainer, train/numpy_frontend) or torch (a PyTorch model over the hetbench torch.distributed
backend, train/torch_frontend). Each is loaded when a run asks for it (torch must not load for a numpy run)."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Protocol, Sequence

from hetbench.train.outcome import RankOutcome


class FrontEnd(Protocol):
    """The per-rank run of one front end, called by the train command in this order on every rank."""

    def prepare(self, cfg: Any, world: Any, opened: Any) -> tuple[Any, list[str]]:
        """The rank's training state on its opened hetbench device, and the errors found making it."""
        ...

    def check(self, cfg: Any, world: Any, state: Any) -> list[str]:
        """Collective: what must hold before training (--resume's checkpoint, --checkpoint's folder, the warm-up,
        --path device, the strategy's own check, a profile matched to the job's devices)."""
        ...

    def run_rank(self, cfg: Any, world: Any, state: Any,
                 on_step: Callable[[int, int, str], None] | None) -> RankOutcome:
        """Collective: train with the strategy; rank 0's outcome holds the step lines and the check against one
        process."""
        ...

    def summary_extra(self, cfg: Any, gathered: Sequence[RankOutcome]) -> dict[str, Any]:
        """The front end's own figures for the job's summary, beside train/summary.py's."""
        ...


# front end -> the module whose FRONTEND implements it
MODULES = {"numpy": "hetbench.train.numpy_frontend", "torch": "hetbench.train.torch_frontend"}


def get(name: str) -> FrontEnd:
    """The front end `name`, its module imported now (torch's imports torch)."""
    return importlib.import_module(MODULES[name]).FRONTEND
