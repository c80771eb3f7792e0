"""What `report`, `compare` and the page read of a benchmark: the presentation it declares (hetbench/benchmarks/
<name>/present.py, found through the registry: its run figures and headline figures, its tables, plots and what
compare tests), and the few helpers every renderer shares. Nothing here knows a benchmark by name."""

from __future__ import annotations

from typing import Any, Sequence

from hetbench.benchmarks.base import Column, Presentation, RunFigure, number_text, presentation_of, shown

__all__ = ["for_benchmark", "value", "title", "better", "run_figures", "headline", "numeric_series_keys", "fmt"]

fmt = number_text  # a figure as report writes it: 3 significant digits, whole numbers from 1000 up


def for_benchmark(name: str) -> Presentation:
    """How benchmark `name`'s runs are shown (a plain presentation for one that declares none)."""
    return presentation_of(name)


def value(column: Column, row: dict[str, Any]) -> float | None:
    """The row's figure of `column` in the shown unit, or None where it has none."""
    return shown(row.get(column.key), column.scale)


def title(column: Column) -> str:
    """A figure's name with its unit: "GEMM (TFLOP/s)"."""
    return column.header(True)


def better(column: Column) -> str:
    """Which way the figure is better, for compare: "lower" (the default: a time) or "higher"."""
    return column.better or "lower"


def run_figures(benchmark: str, document: dict[str, Any]) -> list[RunFigure]:
    return for_benchmark(benchmark).run_figures(document)


def headline(benchmark: str, document: dict[str, Any]) -> list[RunFigure]:
    """The run's headline figures: what a demo's audience reads first."""
    return [f for f in run_figures(benchmark, document) if f.headline]


def numeric_series_keys(steps: Sequence[dict[str, Any]]) -> list[str]:
    """The numeric fields logged over steps (besides `step` itself), in first-seen order; a field that holds one
    value at every step of a run of several steps (train's loss_scale without fp16) is left out: nothing to draw."""
    keys: dict[str, set[float]] = {}
    for s in steps:
        for k, v in s.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                keys.setdefault(k, set()).add(v)
    return [k for k, values in keys.items() if len(values) > 1 or len(steps) < 2]
