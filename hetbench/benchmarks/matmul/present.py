"""How `report`, `compare` and the HTML page show `hetbench matmul`'s runs (drawn by hetbench/report/): the run's
aggregate GEMM rate and end-to-end time, each rank's row, its throughput and where its time went, GEMM TFLOP/s
against size across runs; compare tests the GEMM and reduce times on their repeats."""

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
    declared,
    rank_label,
    raw_of,
    shown,
)

NAME = "matmul"
# the row fields that say two runs' rows measured the same thing
MATCH = ("rank", "backend", "device", "dtype", "m", "n", "k")
# where one matmul's time goes, in order: upload A_r and B_r, the GEMM, download C_r, the reduce over MPI
TIME_PARTS = ("h2d_seconds", "gemm_seconds_median", "d2h_seconds", "reduce_seconds_median")


@cache
def figures() -> dict[str, Column]:
    """A row's key figures, as declared, worded as the plots say them."""
    return {c.key: c for c in (
        declared(NAME, "gemm_seconds_median"),
        declared(NAME, "gemm_tflops", "GEMM", "TFLOP/s"),
        declared(NAME, "peak_percent", unit="%"),
        declared(NAME, "h2d_seconds", "upload (H2D)"),
        declared(NAME, "d2h_seconds", "download (D2H)"),
        declared(NAME, "reduce_seconds_median", "reduce median"),  # MPI on the host: always measured
        declared(NAME, "h2d_gbps"),
        declared(NAME, "d2h_gbps"),
    )}


def shape(row: Row) -> str:
    return f"{row.get('m')}x{row.get('n')}x{row.get('k')}"


def run_figures(document: dict[str, Any]) -> list[RunFigure]:
    rows, summary = document["rows"], document.get("summary") or {}
    modelled = summary.get("end_to_end_timing") == "modelled"
    verified = summary.get("verified", document.get("verified"))
    return [
        RunFigure("shape", "m x n x k", ", ".join(dict.fromkeys(shape(r) for r in rows)), headline=False),
        RunFigure("dtype", "dtype", ", ".join(dict.fromkeys(str(r.get("dtype")) for r in rows)), headline=False),
        RunFigure("aggregate_gemm_tflops", "aggregate GEMM", shown(summary.get("aggregate_gemm_tflops")), "TFLOP/s",
                  modelled, note="the ranks' GEMM rates summed"),
        RunFigure("end_to_end_seconds", "end-to-end", shown(summary.get("end_to_end_seconds"), 1e3), "ms", modelled,
                  note="slowest GEMM + copy to host" + (", then reduce" if summary.get("reduce") == "sum" else "")),
        RunFigure("verified", "checks", "passed" if verified else "FAILED", headline=False),
    ]


def tables(document: dict[str, Any]) -> list[Table]:
    columns = tuple(Column(k, k, text=True) for k in MATCH) + tuple(figures().values())
    return [Table("rows", "per rank", columns, document["rows"])]


def largest_size_rows(rows: list[Row]) -> list[Row]:
    """The rows of the largest product of a run (a size sweep's last)."""
    def volume(r: Row) -> int:
        return int(r.get("m") or 0) * int(r.get("n") or 0) * int(r.get("k") or 0)

    largest = max((volume(r) for r in rows), default=0)
    return [r for r in rows if volume(r) == largest]


def _size_and_dtype(rows: list[Row]) -> str:
    return f"{shape(rows[0])} {rows[0].get('dtype')}" if rows else "-"


PLOTS = (
    PlotSpec("bars", "matmul-throughput", panels=(("gemm_tflops",), ("peak_percent",)),
             titles=("GEMM throughput (TFLOP/s)", "GEMM throughput as % of the device's peak"),
             select=largest_size_rows, label=rank_label, absent="no peak known",
             title=lambda rows, run: f"matmul {_size_and_dtype(rows)}: throughput per rank (run {run})"),
    PlotSpec("stacked", "matmul-time", panels=(TIME_PARTS,), select=largest_size_rows, label=rank_label,
             axis="time of one matmul (ms)",
             title=lambda rows, run: f"matmul {shape(rows[0]) if rows else '-'}: where one matmul's time went per "
                                     f"rank (run {run})"),
    PlotSpec("lines", "matmul-size", panels=(("gemm_tflops",),), log_y=True,
             x=lambda r: (r["m"] * r["n"] * r["k"]) ** (1 / 3), x_label="size: (m·n·k)^(1/3), n for square products",
             group=lambda r: f"{r.get('backend')} {r.get('device')} {r.get('dtype')}",
             title=lambda rows, _: "matmul: GEMM throughput against size"),
)


def _compare() -> CompareRows:
    f = figures()
    return CompareRows(
        rows=lambda document: document["rows"], match=MATCH,
        figures=(Compared(f["gemm_seconds_median"], raw_of("gemm_seconds")),
                 Compared(f["gemm_tflops"], raw_of("gemm_seconds")),
                 Compared(f["reduce_seconds_median"], raw_of("reduce_seconds"))),
        describe=lambda r: f"rank {r.get('rank')} {r.get('backend')} {r.get('device')} {r.get('dtype')} {shape(r)}")


PRESENTATION = Presentation(run_figures, tables, PLOTS, lambda: (_compare(),))
