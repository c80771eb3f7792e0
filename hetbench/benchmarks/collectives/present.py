"""How `report`, `compare` and the HTML page show `hetbench collectives`' runs (drawn by hetbench/report/): the peak
and average bus bandwidths and the wrong elements, each op, path and size's row, and per op its bandwidth and time
against message size across runs; compare tests the time and busbw on each iteration's slowest rank."""

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
    finite_numbers,
    number_text,
    shown,
)

NAME = "collectives"
MATCH = ("op", "path", "size_bytes", "dtype")
PATH_NAMES = {"host": "host-staged", "device": "device-direct"}


@cache
def figures() -> dict[str, Column]:
    """A row's key figures, as declared: MPI's time and bandwidths (measured, also beside simulated devices), and
    the host path's end-to-end figures, whose copies are modelled on simulated devices."""
    return {c.key: c for c in (
        declared(NAME, "op_us_median"),
        declared(NAME, "algbw_gbps"),
        declared(NAME, "busbw_gbps"),
        declared(NAME, "end_to_end_us_median", "end-to-end time"),
        declared(NAME, "end_to_end_algbw_gbps"),
    )}


def slowest_rank_op_us(row: Row) -> list[float] | None:
    """Per iteration, the slowest rank's time (raw.op_us is ranks x iterations), as the row's median is built."""
    op_us = (row.get("raw") or {}).get("op_us")
    if not isinstance(op_us, list) or not op_us:
        return None
    per_rank = [finite_numbers(r) for r in op_us]
    if any(r is None for r in per_rank) or len({len(r) for r in per_rank if r is not None}) != 1:
        return None
    return [max(values) for values in zip(*[r for r in per_rank if r is not None])]


def size_text(nbytes: Any) -> str:
    """A size in the largest binary unit it is a whole number of: 1 GiB, 1536 MiB, 1000 B."""
    if not isinstance(nbytes, (int, float)) or isinstance(nbytes, bool):
        return "-"
    n = int(round(nbytes))
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def run_figures(document: dict[str, Any]) -> list[RunFigure]:
    rows, summary = document["rows"], document.get("summary") or {}
    sizes = [r["size_bytes"] for r in rows if isinstance(r.get("size_bytes"), int)]
    avg = summary.get("avg_busbw_gbps") or {}
    busbw = [r["busbw_gbps"] for r in rows if isinstance(r.get("busbw_gbps"), (int, float))]
    wrong = summary.get("wrong_total")
    return [
        RunFigure("ops_paths", "ops/paths", ", ".join(dict.fromkeys(f"{r.get('op')}/{r.get('path')}" for r in rows)),
                  headline=False),
        RunFigure("sizes", "sizes", f"{size_text(min(sizes))} .. {size_text(max(sizes))}" if sizes else "-",
                  headline=False),
        RunFigure("avg_busbw_gbps", "avg busbw", ", ".join(f"{k} {number_text(v)}" for k, v in avg.items()) or "-",
                  "GB/s", headline=False),
        RunFigure("peak_busbw_gbps", "peak busbw", shown(max(busbw, default=None)), "GB/s",
                  note="the largest busbw of any op, path and size (MPI's time: measured)"),
        *[RunFigure(f"avg_busbw_gbps.{k}", f"avg busbw {k}", shown(v), "GB/s", table=False,
                    note="the mean of the op and path's busbw over its sizes") for k, v in avg.items()],
        RunFigure("wrong_total", "#wrong", "not checked" if not summary.get("checked", True) else str(wrong),
                  headline=False),
    ]


def tables(document: dict[str, Any]) -> list[Table]:
    columns = tuple(Column(k, k, text=True) for k in MATCH) + tuple(figures().values())
    return [Table("rows", "per op, path and size", columns, document["rows"])]


def _ranks(rows: list[Row]) -> str:
    return ",".join(map(str, sorted({r.get("ranks") for r in rows if r.get("ranks") is not None})))


PLOTS = (
    PlotSpec("sweep", "collectives", chart="op", x=lambda r: r["size_bytes"], x_label="message size", x_bytes=True,
             log_y=True, group=lambda r: PATH_NAMES.get(str(r.get("path")), str(r.get("path"))),
             panels=(("busbw_gbps", "algbw_gbps"), ("op_us_median", "end_to_end_us_median")),
             titles=("bandwidth: the large-message regime", "time: the small-message (latency) regime"),
             y_labels=("bandwidth (GB/s)", "time (us), slowest rank, median"),
             names={"busbw_gbps": "busbw", "algbw_gbps": "algbw", "op_us_median": "op time",
                    "end_to_end_us_median": "end-to-end incl. copies"},
             title=lambda rows, op: f"{op} over {_ranks(rows)} ranks: bandwidth and time against message size"),
)


def describe(row: Row) -> str:
    return f"{row.get('op')} {row.get('path')} {size_text(row.get('size_bytes'))} {row.get('dtype')}"


def _compare() -> tuple[CompareRows, ...]:
    f = figures()
    return (CompareRows(rows=lambda document: document["rows"], match=MATCH,
                        figures=(Compared(f["op_us_median"], slowest_rank_op_us),
                                 Compared(f["busbw_gbps"], slowest_rank_op_us)),
                        describe=describe),)


PRESENTATION = Presentation(run_figures, tables, PLOTS, _compare)
