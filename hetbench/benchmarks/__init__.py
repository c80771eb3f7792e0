"""Benchmarks: one module each, declaring what it computes, its options, rows, summary and columns (see base.py).

Each module registers its benchmark when imported. `load()` imports the built-in ones and any named in
HETBENCH_BENCHMARKS (module names, comma-separated): that is how a benchmark outside hetbench becomes a command.
"""

from __future__ import annotations

import importlib
import os

BUILTIN = (
    "hetbench.benchmarks.matmul",
    "hetbench.benchmarks.collectives",
    "hetbench.benchmarks.calibrate",
    "hetbench.benchmarks.split",
    "hetbench.benchmarks.train",
)
PLUGINS_ENV = "HETBENCH_BENCHMARKS"


def load() -> None:
    """Import every benchmark module, so that each registers itself."""
    extra = [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
    for module in (*BUILTIN, *extra):
        importlib.import_module(module)
