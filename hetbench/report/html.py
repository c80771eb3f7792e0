"""One self-contained HTML page of saved runs, for a demo: the runs' tables and every plot, embedded as SVG data
(no network, no script, no files beside it). Each plot is a <figure> with its id, kind and runs as attributes,
and the numbers it drew both as a data-values attribute (JSON) and as a table beside it."""

from __future__ import annotations

import base64
import datetime as _dt
import json
from html import escape
from typing import Any

from hetbench import __version__
from hetbench.report.figures import for_benchmark
from hetbench.report.plots import MODELLED_LABEL, Plot
from hetbench.results.runs import Run

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1400px;
       padding: 0 1rem; color: #222; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2rem; margin-top: 2.5rem; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.6rem 0; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.5rem; vertical-align: top; }
th { background: #f3f3f3; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.modelled { font-style: italic; color: #555; }
figure { margin: 1.5rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-weight: 600; margin: 0.3rem 0; } .note { color: #555; font-size: 0.9rem; }
details { margin: 0.3rem 0 0 0; } summary { cursor: pointer; color: #555; }
code { background: #f6f6f6; padding: 0 0.2rem; }
"""


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:.0f}"
    return str(value)


def _table(headers: list[str], rows: list[list[tuple[str, str]]], attrs: str = "") -> str:
    """rows: cells as (text, css class)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="{c}">{escape(t)}</td>' if c else f"<td>{escape(t)}</td>"
                                    for t, c in r) + "</tr>" for r in rows)
    return f"<table{attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def runs_section(benchmark: str, runs: list[Run]) -> str:
    figures = for_benchmark(benchmark)
    titles = [t for t, _ in figures.run_figures(runs[0].document)] if figures else []
    rows = []
    for run in runs:
        devices = "; ".join(f"{rank}: {name}" + (" (modelled)" if mod else "") for rank, _, name, mod in run.devices())
        key = dict(figures.run_figures(run.document)) if figures else {}
        rows.append([(run.run_id, ""), (run.date_utc, ""), (",".join(run.hosts), ""), (run.command, ""),
                     (run.rank_map, ""), (devices, "")] + [(key.get(t, "-"), "num") for t in titles])
    table = _table(["Run", "Date (UTC)", "Host(s)", "Command", "Rank map", "Devices", *titles], rows,
                   f' class="runs" data-benchmark="{escape(benchmark)}"')
    return f'<h2>{escape(benchmark)}: {len(runs)} run(s)</h2>\n{table}\n'


def rows_table(run: Run) -> str:
    """A run's rows with their key figures (modelled ones in italics)."""
    figures = for_benchmark(run.benchmark)
    if figures is None:
        return f'<p class="note">{len(run.rows)} row(s); no table for benchmark {escape(run.benchmark)}.</p>'
    headers = list(figures.match) + [f.title for f in figures.rows]
    rows = []
    for r in run.rows:
        cells = [(_num(r.get(k)), "") for k in figures.match]
        for f in figures.rows:
            mod = figures.is_modelled(f, r)
            cells.append((("~" if mod else "") + _num(f.value(r)), "num modelled" if mod else "num"))
        rows.append(cells)
    return _table(headers, rows, f' class="rows" data-run-id="{escape(run.run_id)}"')


def figure_html(plot: Plot) -> str:
    svg = base64.b64encode(plot.render("svg")).decode("ascii")
    values = json.dumps([s.to_dict() for s in plot.series], separators=(",", ":"))
    data_rows = []
    for s in plot.series:
        for p in s.points:
            data_rows.append([(s.panel, ""), (s.label, ""), (_num(p["x"]), "num"),
                              (("~" if p["modelled"] else "") + _num(p["y"]), "num modelled" if p["modelled"] else "num"),
                              (s.y, "")])
    data_table = _table(["panel", "series", "x", "y", "unit"], data_rows, ' class="plot-data"')
    return (f'<figure class="plot" id="plot-{escape(plot.id)}" data-plot="{escape(plot.id)}" '
            f'data-kind="{escape(plot.kind)}" data-run-ids="{escape(",".join(plot.run_ids))}" '
            f'data-values="{escape(values)}">\n'
            f'<figcaption>{escape(plot.title)}</figcaption>\n'
            f'<img alt="{escape(plot.title)}" src="data:image/svg+xml;base64,{svg}">\n'
            f'<details><summary>the numbers plotted</summary>{data_table}</details>\n</figure>\n')


def page(runs: list[Run], plots: list[Plot]) -> str:
    by_benchmark: dict[str, list[Run]] = {}
    for run in runs:
        by_benchmark.setdefault(run.benchmark, []).append(run)
    made = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>hetbench report: {len(runs)} run(s)</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n",
        "<h1>hetbench report</h1>\n",
        f'<p class="note">{len(runs)} run(s), made {escape(made)} by hetbench {escape(__version__)}. '
        f"Measured figures are drawn filled (solid bars, filled markers); {escape(MODELLED_LABEL)} figures "
        "hollow (hatched bars, hollow markers, dashed lines) and marked ~ or in italics in tables.</p>\n",
    ]
    for benchmark, group in by_benchmark.items():
        parts.append(f'<section class="benchmark" data-benchmark="{escape(benchmark)}">\n')
        parts.append(runs_section(benchmark, group))
        for run in group:
            parts.append(f'<h3>run {escape(run.run_id)}</h3>\n<p class="note"><code>{escape(run.command)}</code> '
                         f"({escape(run.date_utc)}, {escape(str(run.path))})</p>\n")
            parts.append(rows_table(run))
        group_ids = {r.run_id for r in group}
        for plot in plots:
            kind_benchmark = "matmul" if plot.kind.startswith("matmul") else \
                "collectives" if plot.kind.startswith("collectives") else None
            if kind_benchmark == benchmark or (kind_benchmark is None and set(plot.run_ids) & group_ids):
                parts.append(figure_html(plot))
        parts.append("</section>\n")
    parts.append("</body>\n</html>\n")
    return "".join(parts)
