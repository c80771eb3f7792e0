"""How `report`, `compare` and the HTML page show `hetbench calibrate`'s runs (drawn by hetbench/report/): the ranks'
summed GEMM rate per dtype and slice shape (what split's weights come from) and the slowest link to the root, each
rank's row, its GEMM rate and link per rank; compare tests the GEMM times on their repeats."""

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
    number_text,
    raw_of,
    shown,
)

NAME = "calibrate"
# the part is in the match: a GEMM of another part is other work
MATCH = ("rank", "backend", "device", "dtype", "strategy", "m", "n", "k", "part")


@cache
def figures() -> dict[str, Column]:
    return {c.key: c for c in (
        declared(NAME, "gemm_seconds_median"),
        declared(NAME, "gemm_gflops", "GEMM rate"),
        declared(NAME, "link_gbps"),
        declared(NAME, "link_latency_us"),
        declared(NAME, "free_memory_bytes"),
    )}


def run_figures(document: dict[str, Any]) -> list[RunFigure]:
    rows, summary = document["rows"], document.get("summary") or {}
    sums = summary.get("sum_gemm_gflops") or {}
    timing = summary.get("gemm_timing")
    # a sum with a simulated rank's rate in it is (partly) modelled
    modelled = timing in ("modelled", "mixed")
    notes = {"mixed": "includes simulated ranks' modelled rates", "modelled": "every rank simulated"}
    note = notes.get(str(timing), "")
    links = [r["link_gbps"] for r in rows if isinstance(r.get("link_gbps"), (int, float))]
    verified = summary.get("verified", document.get("verified"))
    return [
        RunFigure("shape", "m x n x k", ", ".join(dict.fromkeys(f"{r.get('m')}x{r.get('n')}x{r.get('k')}"
                                                                   for r in rows)), headline=False),
        RunFigure("sum_gemm_gflops", "summed GEMM", ", ".join(
            f"{k} {'~' if modelled else ''}{number_text(v)}" for k, v in sums.items()) or "-", "GFLOP/s",
            headline=False),
        *[RunFigure(f"sum_gemm_gflops.{k}", f"summed GEMM {k}", shown(v), "GFLOP/s", modelled, table=False,
                    note=note or "the ranks' rates at this slice shape, summed") for k, v in sums.items()],
        RunFigure("slowest_link_gbps", "slowest link to root", shown(min(links, default=None)), "GB/s",
                  note="MPI ping-pong on host buffers; the lowest of the ranks' links"),
        RunFigure("verified", "checks", "passed" if verified else "FAILED", headline=False),
    ]


def tables(document: dict[str, Any]) -> list[Table]:
    columns = tuple(Column(k, k, text=True) for k in MATCH) + tuple(figures().values())
    return [Table("rows", "per rank, dtype and slice shape", columns, document["rows"])]


def _label(row: Row) -> str:
    return f"rank {row.get('rank')} {row.get('backend')}\n{row.get('dtype')} {row.get('strategy')}"


PLOTS = (
    PlotSpec("bars", "calibrate-rates", panels=(("gemm_gflops",), ("link_gbps",)), label=_label,
             titles=("GEMM rate at the slice shape (GFLOP/s)", "link to the root (GB/s)"), absent="the root",
             title=lambda rows, run: f"calibrate {rows[0].get('m')}x{rows[0].get('n')}x{rows[0].get('k')}: each "
                                     f"rank's GEMM rate and link (run {run})" if rows else f"calibrate (run {run})"),
)


def _compare() -> tuple[CompareRows, ...]:
    f = figures()
    return (CompareRows(rows=lambda document: document["rows"], match=MATCH,
                        figures=(Compared(f["gemm_seconds_median"], raw_of("gemm_seconds")),
                                 Compared(f["gemm_gflops"], raw_of("gemm_seconds")),
                                 Compared(f["link_gbps"], None)),
                        describe=lambda r: f"rank {r.get('rank')} {r.get('backend')} {r.get('dtype')} "
                                           f"{r.get('strategy')} part {r.get('part')}"),)


PRESENTATION = Presentation(run_figures, tables, PLOTS, _compare)
