"""One self-contained HTML page of saved runs, for a demo: first a one-screen summary (per run its benchmark,
devices and headline figures), then per benchmark its runs table, each run's tables and every plot, embedded as SVG
data (no network, no script, no files beside it). What each benchmark shows is its declared presentation (see
report/figures.py). Each plot is a <figure> with its id, kind and runs as attributes, and the numbers it drew both
as a data-values attribute (JSON) and as a table beside it."""

from __future__ import annotations

import base64
import datetime as _dt
import json
from html import escape
from typing import Any

from hetbench import __version__
from hetbench.benchmarks.base import Table
from hetbench.report.figures import for_benchmark, headline, value
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
code { background: #f6f6f6; padding: 0 0.2rem; } caption { text-align: left; font-weight: 600; padding: 0.2rem 0; }
table.summary td { vertical-align: middle; } ul.headline { list-style: none; margin: 0; padding: 0; display: flex;
  flex-wrap: wrap; gap: 0.3rem 1.2rem; } ul.headline li { white-space: nowrap; }
ul.headline .label { color: #555; font-size: 0.8rem; display: block; } ul.headline b { font-size: 1.15rem; }
ul.headline li.modelled b { font-style: italic; color: #555; } .failed { color: #b00; font-weight: 600; }
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


def _run_titles(runs: list[Run]) -> list[str]:
    """The runs table's figure columns: every title the runs' figures have, in first-seen order."""
    titles: dict[str, None] = {}
    for run in runs:
        titles.update(dict.fromkeys(f.title for f in for_benchmark(run.benchmark).run_figures(run.document)
                                    if f.table))
    return list(titles)


def runs_section(benchmark: str, runs: list[Run]) -> str:
    titles = _run_titles(runs)
    rows = []
    for run in runs:
        devices = "; ".join(f"{rank}: {name}" + (" (modelled)" if mod else "") for rank, _, name, mod in run.devices())
        key = {f.title: f.text for f in for_benchmark(run.benchmark).run_figures(run.document) if f.table}
        rows.append([(run.run_id, ""), (run.date_utc, ""), (",".join(run.hosts), ""), (run.command, ""),
                     (run.rank_map, ""), (devices, "")] + [(key.get(t, "-"), "num") for t in titles])
    table = _table(["Run", "Date (UTC)", "Host(s)", "Command", "Rank map", "Devices", *titles], rows,
                   f' class="runs" data-benchmark="{escape(benchmark)}"')
    return f'<h2>{escape(benchmark)}: {len(runs)} run(s)</h2>\n{table}\n'


def table_html(table: Table, run: Run, caption: bool) -> str:
    """One of a run's tables: its text columns as they are, its figures in their units with 4 significant digits
    (modelled ones marked ~ and in italics); "-" where a row has none."""
    headers = [c.header(True) if not c.text else c.label for c in table.columns]
    rows = []
    for r in table.rows:
        cells = []
        for c in table.columns:
            if c.text:
                cells.append((_num(r.get(c.key)), ""))
                continue
            mod = c.is_modelled(r)
            v = value(c, r)
            cells.append((("~" if mod and v is not None else "") + _num(v), "num modelled" if mod else "num"))
        rows.append(cells)
    html = _table(headers, rows, f' class="rows" data-run-id="{escape(run.run_id)}" '
                                 f'data-table="{escape(table.name)}"')
    if caption:
        html = html.replace("<thead>", f"<caption>{escape(table.title)}</caption><thead>", 1)
    return html


def rows_table(run: Run) -> str:
    """A run's tables, as its benchmark declares them (one table: no caption)."""
    tables = for_benchmark(run.benchmark).tables(run.document)
    return "\n".join(table_html(t, run, caption=len(tables) > 1) for t in tables)


def _checks(run: Run) -> tuple[str, str]:
    verified = (run.document.get("summary") or {}).get("verified", run.document.get("verified"))
    return {True: ("passed", ""), False: ("FAILED", "failed")}.get(verified, ("not checked", ""))


def summary_section(runs: list[Run]) -> str:
    """The page's first screen: one line per run, its benchmark, devices and headline figures (measured ones
    upright, modelled ones marked ~ and in italics), and whether its checks passed."""
    rows = []
    for run in runs:
        items = []
        for f in headline(run.benchmark, run.document):
            data = "" if isinstance(f.value, str) or f.value is None else f' data-value="{f.value!r}"'
            note = f' title="{escape(f.note)}"' if f.note else ""
            items.append(f'<li class="{"modelled" if f.modelled else "measured"}" data-key="{escape(f.key)}"{data}'
                         f'{note}><span class="label">{escape(f.label)}</span><b>{escape(f.text)}</b>'
                         f'{escape(f.text_with_unit.removeprefix(f.text))}</li>')
        devices = "<br>".join(escape(f"{rank}: {name}") + (" <i>(modelled)</i>" if mod else "")
                              for rank, _, name, mod in run.devices())
        checks, css = _checks(run)
        rows.append(f'<tr data-run-id="{escape(run.run_id)}" data-benchmark="{escape(run.benchmark)}">'
                    f'<td><a href="#run-{escape(run.run_id)}">{escape(run.benchmark)}</a></td>'
                    f'<td>{escape(run.run_id)}<br><span class="note">{escape(run.date_utc)}</span></td>'
                    f'<td>{devices}</td><td><ul class="headline">{"".join(items)}</ul></td>'
                    f'<td class="{css}">{escape(checks)}</td></tr>')
    head = "".join(f"<th>{h}</th>" for h in ("Benchmark", "Run", "Devices", "Headline figures", "Checks"))
    return (f'<section class="summary" id="summary">\n<h2>Summary</h2>\n'
            f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>\n'
            "</section>\n")


def figure_html(plot: Plot) -> str:
    svg = base64.b64encode(plot.render("svg")).decode("ascii")
    values = json.dumps([s.to_dict() for s in plot.series], separators=(",", ":"))
    data_rows = []
    for s in plot.series:
        for p in s.points:
            data_rows.append([(s.panel, ""), (s.label, ""), (_num(p["x"]), "num"),
                              (("~" if p["modelled"] else "") + _num(p["y"]),
                               "num modelled" if p["modelled"] else "num"),
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
    parts.append(summary_section(runs))
    for benchmark, group in by_benchmark.items():
        parts.append(f'<section class="benchmark" data-benchmark="{escape(benchmark)}">\n')
        parts.append(runs_section(benchmark, group))
        for run in group:
            parts.append(f'<h3 id="run-{escape(run.run_id)}">run {escape(run.run_id)}</h3>\n<p class="note">'
                         f"<code>{escape(run.command)}</code> ({escape(run.date_utc)}, {escape(str(run.path))})</p>\n")
            parts.append(rows_table(run))
        for plot in plots:
            if plot.benchmark == benchmark:
                parts.append(figure_html(plot))
        parts.append("</section>\n")
    parts.append("</body>\n</html>\n")
    return "".join(parts)
