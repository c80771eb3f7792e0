"""How `report`, `compare` and the HTML page show `hetbench split`'s runs (drawn by hetbench/report/): the one GEMM's
achieved GFLOP/s, its efficiency against the ranks' summed solo rates, the weighted split against the even one and
the measured end-to-end time beside the model's prediction; per split and per rank its figures, each split's
throughput and times, and where each rank's time went; compare tests the end-to-end and compute times on their
iterations. A --plan document shows the prediction alone, modelled."""

from __future__ import annotations

from functools import cache
from typing import Any

from hetbench.benchmarks.base import (
    Column,
    Compared,
    CompareRows,
    PlotSpec,
    Presentation,
    Row,
    RunFigure,
    Table,
    columns_of,
    raw_of,
    shown,
)

NAME = "split"
RANK_MATCH = ("split", "rank", "backend", "device", "strategy", "dtype", "m", "n", "k", "part")
SPLIT_MATCH = ("split", "strategy", "dtype", "m", "n", "k")
TIME_PARTS = ("compute_seconds_median", "comm_seconds_median", "idle_seconds_median")
PREDICTED = "predicted_timing"  # a --plan's splits row's field: "modelled", nothing was run

# one row per measured split (summary.splits): its figures, modelled where its timing is
SPLIT_COLUMNS: tuple[Column, ...] = (
    Column("split", "split", text=True),
    Column("strategy", "strategy", text=True),
    Column("parts", "parts", text=True),
    Column("end_to_end_seconds_median", "end-to-end", "ms", 1e3, modelled="timing", better="lower"),
    Column("predicted_seconds", "predicted end-to-end", "ms", 1e3, better="lower"),  # its label says whose
    Column("achieved_gflops", "achieved", "GFLOP/s", modelled="timing", better="higher"),
    Column("compute_phase_gflops", "compute phase", "GFLOP/s", modelled="timing", better="higher"),
    Column("efficiency_end_to_end", "efficiency vs summed solo", digits=3, modelled="timing", better="higher"),
    Column("efficiency_compute", "compute-phase efficiency", digits=3, modelled="timing", better="higher"),
    Column("imbalance", "imbalance", "%", 100.0, modelled="timing", better="lower"),
)
# a --plan's splits: the weighted and the even one, predicted
PLAN_COLUMNS: tuple[Column, ...] = (
    Column("split", "split", text=True),
    Column("parts", "parts", text=True),
    Column("predicted_seconds", "predicted end-to-end", "ms", 1e3, modelled=PREDICTED, better="lower"),
)


@cache
def rank_columns() -> tuple[Column, ...]:
    """Each rank's row as the command's compact table shows it."""
    return tuple(c for c in columns_of(NAME) if c.shown(False))


def _row_facts(document: dict[str, Any]) -> dict[str, Any]:
    rows = document.get("rows") or [{}]
    return {k: rows[0].get(k) for k in ("dtype", "m", "n", "k")}


def split_rows(document: dict[str, Any]) -> list[Row]:
    """summary.splits as rows: each measured split's figures (and its per-iteration raw times), with the product's
    dtype and shape, and the model's predicted seconds beside."""
    facts = _row_facts(document)
    out = []
    for name, s in ((document.get("summary") or {}).get("splits") or {}).items():
        if not isinstance(s, dict):
            continue
        predicted = (s.get("predicted") or {}).get("seconds")
        out.append({**facts, **s, "split": name, "parts": str(s.get("parts")), "predicted_seconds": predicted})
    return out


def plan_rows(document: dict[str, Any]) -> list[Row]:
    summary = document.get("summary") or {}
    return [{"split": "weighted", "parts": str(summary.get("parts")), "predicted_seconds":
             summary.get("predicted_seconds"), PREDICTED: "modelled"},
            {"split": "even", "parts": str(summary.get("even_parts")), "predicted_seconds":
             summary.get("even_predicted_seconds"), PREDICTED: "modelled"}]


def _text_facts(document: dict[str, Any]) -> list[RunFigure]:
    rows, summary = document.get("rows") or [], document.get("summary") or {}
    first = rows[0] if rows else {}
    return [
        RunFigure("shape", "m x n x k", f"{first.get('m')}x{first.get('n')}x{first.get('k')} {first.get('dtype')}",
                  headline=False),
        RunFigure("strategy", "strategy, weights", f"{summary.get('strategy')}, {summary.get('weights_kind')}",
                  headline=False),
        RunFigure("parts", "parts", str(summary.get("parts")), headline=False),
    ]


def run_figures(document: dict[str, Any]) -> list[RunFigure]:
    summary = document.get("summary") or {}
    verified = summary.get("verified", document.get("verified"))
    checks = RunFigure("verified", "checks", "not run (--plan)" if summary.get("plan") else
                       "passed" if verified else "FAILED", headline=False)
    if summary.get("plan"):  # nothing was run: every figure is the model's
        return [*_text_facts(document),
                RunFigure("predicted_gflops", "predicted", shown(summary.get("predicted_gflops")), "GFLOP/s", True),
                RunFigure("predicted_efficiency_end_to_end", "predicted efficiency vs summed solo",
                          shown(summary.get("predicted_efficiency_end_to_end")), modelled=True),
                RunFigure("predicted_speedup_over_even", "predicted weighted over even",
                          shown(summary.get("predicted_speedup_over_even")), "x", True),
                RunFigure("predicted_seconds", "predicted end-to-end", shown(summary.get("predicted_seconds"), 1e3),
                          "ms", True),
                checks]
    modelled = summary.get("timing") == "modelled"
    efficiency = shown(summary.get("efficiency_end_to_end"))
    basis = summary.get("efficiency_basis") or "each rank's probe alone"
    return [
        *_text_facts(document),
        RunFigure("achieved_gflops", "achieved", shown(summary.get("achieved_gflops")), "GFLOP/s", modelled,
                  note="the weighted split's GEMM flops over its end-to-end median"),
        RunFigure("efficiency_end_to_end", "efficiency vs summed solo", efficiency, modelled=modelled,
                  note=f"achieved / the ranks' summed solo GFLOP/s ({basis})"
                       + ("; above 1: a MEASUREMENT FAULT" if efficiency is not None and efficiency > 1 else "")),
        RunFigure("speedup_over_even", "weighted over even", shown(summary.get("speedup_over_even")), "x", modelled,
                  note="the weighted split's throughput over the even split's, in the same run"),
        RunFigure("end_to_end_seconds_median", "end-to-end", shown(summary.get("end_to_end_seconds_median"), 1e3),
                  "ms", modelled, note="the weighted split, median of its iterations"),
        RunFigure("predicted_seconds", "predicted end-to-end", shown(summary.get("predicted_seconds"), 1e3), "ms",
                  note="the cost model's, from the measured rates and links (its label says it is not measured)"),
        checks,
    ]


def tables(document: dict[str, Any]) -> list[Table]:
    summary = document.get("summary") or {}
    if summary.get("plan"):
        splits = Table("splits", "the splits, predicted (--plan)", PLAN_COLUMNS, plan_rows(document))
    else:
        splits = Table("splits", "per split", SPLIT_COLUMNS, split_rows(document))
    return [splits, Table("rows", "per split and rank", rank_columns(), document["rows"])]


def _split_label(row: Row) -> str:
    return f"{row.get('split')}\n{row.get('parts')}"


def _rank_label(row: Row) -> str:
    return f"{row.get('split')} rank {row.get('rank')}\n{row.get('backend')}"


def _shape(rows: list[Row]) -> str:
    return f"{rows[0].get('m')}x{rows[0].get('n')}x{rows[0].get('k')}" if rows else "-"


PLOTS = (
    PlotSpec("bars", "split-throughput", table="splits",
             panels=(("achieved_gflops", "compute_phase_gflops"), ("end_to_end_seconds_median", "predicted_seconds")),
             titles=("the one GEMM's throughput (GFLOP/s)", "end-to-end: measured and predicted (ms)"),
             y_labels=("GFLOP/s", "time of one GEMM, median (ms)"),
             label=_split_label,
             title=lambda rows, run: f"split {_shape(rows)}: each split's throughput and time (run {run})"),
    PlotSpec("stacked", "split-time", panels=(TIME_PARTS,), label=_rank_label, axis="time per iteration, median (ms)",
             title=lambda rows, run: f"split {_shape(rows)}: where each rank's time went (run {run})"),
)


def _compare() -> tuple[CompareRows, ...]:
    c = {col.key: col for col in SPLIT_COLUMNS}
    ranks = {col.key: col for col in columns_of(NAME)}
    return (
        CompareRows(rows=split_rows, match=SPLIT_MATCH,
                    figures=(Compared(c["end_to_end_seconds_median"], raw_of("end_to_end_seconds")),
                             Compared(c["achieved_gflops"], raw_of("end_to_end_seconds")),
                             Compared(c["compute_phase_gflops"], raw_of("compute_seconds")),
                             Compared(c["efficiency_end_to_end"], None)),
                    describe=lambda r: f"{r.get('split')} split {r.get('strategy')} {_shape([r])} {r.get('dtype')}"),
        CompareRows(rows=lambda document: document["rows"], match=RANK_MATCH,
                    figures=(Compared(ranks["compute_seconds_median"], raw_of("compute_seconds")),),
                    describe=lambda r: f"{r.get('split')} split rank {r.get('rank')} {r.get('backend')} part "
                                       f"{r.get('part')}"),
    )


PRESENTATION = Presentation(run_figures, tables, PLOTS, _compare)
