"""Plots of saved runs, drawn with matplotlib (the optional extra `report`, Agg backend, no pyplot state).

Measured points are drawn filled (solid bars, filled markers, solid lines); modelled ones hollow (hatched bars,
hollow markers, dashed lines), and the legend says which is which. Every plot keeps the numbers it drew
(`Plot.series`), so a page can show them beside the picture and a test can check them against the results.
What is drawn is each benchmark's declaration (its presentation's `plots`, hetbench/benchmarks/base.py PlotSpec:
bars, stacked, lines, sweep) over its tables' rows (plain dicts, so rows of several runs and sizes can be drawn
together); this module knows the kinds, not the benchmarks. Anything a document logs over steps is drawn for any
benchmark.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from hetbench.benchmarks.base import Column, PlotSpec, Table, number_text
from hetbench.report.figures import for_benchmark, numeric_series_keys, title, value
from hetbench.results.runs import Run

INSTALL_HINT = "pip install 'hetbench[report]'"
MEASURED_LABEL = "measured"
MODELLED_LABEL = "modelled (simulated device)"
HATCH = "///"


class PlottingUnavailable(RuntimeError):
    """matplotlib is missing: plots and the HTML page cannot be drawn."""


def require_matplotlib() -> None:
    """Import matplotlib with the Agg backend (files only, no display), or say how to install it."""
    try:
        import matplotlib
    except ImportError as e:
        raise PlottingUnavailable(f"plots and --html need matplotlib, which is not installed ({e}): "
                                  f"{INSTALL_HINT}") from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "hetbench"  # the same plot gives the same SVG


def _new_figure(panels: int, width: float = 6.0, height: float = 4.2) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * panels, height), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    return fig, list(axes)


@dataclass
class Series:
    """One drawn line or set of bars: its points as {x, y, modelled, ...which row it came from}."""

    panel: str
    label: str
    x: str  # what x is, with its unit
    y: str  # what y is, with its unit
    points: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"panel": self.panel, "label": self.label, "x": self.x, "y": self.y, "points": self.points}


@dataclass
class Plot:
    id: str  # unique in a report, usable as a file name and an HTML id
    kind: str  # the spec's id (matmul-throughput, collectives, ...) or "steps"
    title: str
    figure: Any
    series: list[Series]
    run_ids: list[str]
    benchmark: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "benchmark": self.benchmark, "title": self.title,
                "run_ids": self.run_ids, "series": [s.to_dict() for s in self.series]}

    def render(self, fmt: str, dpi: int = 110) -> bytes:
        buf = io.BytesIO()
        metadata = {"Date": None} if fmt == "svg" else {}
        self.figure.savefig(buf, format=fmt, dpi=dpi, metadata=metadata)
        return buf.getvalue()


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "plot"


def _size_text(nbytes: float) -> str:
    n = int(round(nbytes))
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _log2_size_axis(ax: Any, label: str, as_bytes: bool) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=10))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _size_text(v) if as_bytes else f"{v:g}"))
    ax.set_xlabel(label)
    ax.grid(True, which="major", alpha=0.3)


def _style_legend(ax: Any, extra: Sequence[Any] = ()) -> None:
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(list(handles) + list(extra), list(labels) + [h.get_label() for h in extra], fontsize="small")


def _timing_handles(any_measured: bool, any_modelled: bool, kind: str) -> list[Any]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    out = []
    if kind == "bar":
        if any_measured:
            out.append(Patch(facecolor="0.45", edgecolor="0.45", label=MEASURED_LABEL + " (solid)"))
        if any_modelled:
            out.append(Patch(facecolor="white", edgecolor="0.45", hatch=HATCH, label=MODELLED_LABEL + " (hatched)"))
    else:
        if any_measured:
            out.append(Line2D([], [], color="0.45", marker="o", linestyle="-", label=MEASURED_LABEL + " (filled)"))
        if any_modelled:
            out.append(Line2D([], [], color="0.45", marker="o", markerfacecolor="white", linestyle="--",
                              label=MODELLED_LABEL + " (hollow)"))
    return out



def _bar_labels(spec: PlotSpec, rows: list[dict[str, Any]]) -> list[str]:
    return [spec.label(r) if spec.label is not None else str(i) for i, r in enumerate(rows)]


def _point(x: Any, y: float | None, modelled: bool, row: dict[str, Any], texts: Sequence[str],
           **more: Any) -> dict[str, Any]:
    """One drawn point and which row it came from (the run, and the row's naming fields)."""
    return {"x": x, "y": y, "modelled": modelled, "run_id": row.get("run_id"),
            **{k: row.get(k) for k in texts if k in row}, **more}


def _panels(spec: PlotSpec, columns: dict[str, Column], rows: list[dict[str, Any]]) -> list[tuple[int, list[Column]]]:
    """(panel index, its figures) of the panels with a value to draw; figures the table does not have are left out."""
    out = []
    for i, keys in enumerate(spec.panels):
        figures = [columns[k] for k in keys if k in columns]
        figures = [c for c in figures if any(value(c, r) is not None for r in rows)]
        if figures:
            out.append((i, figures))
    return out


def _at(values: tuple[str, ...], i: int, default: str) -> str:
    return values[i] if i < len(values) and values[i] else default


def bars(spec: PlotSpec, table: Table, rows: list[dict[str, Any]], run_id: str, plot_id: str) -> Plot | None:
    """Per run: one panel per entry of spec.panels, one bar per row, a panel's figures side by side; modelled bars
    hatched, the value written above each bar (spec.absent where the row has none)."""
    columns = {c.key: c for c in table.columns}
    panels = _panels(spec, columns, rows)
    if not rows or not panels:
        return None
    texts = [c.key for c in table.columns if c.text]
    fig, axes = _new_figure(len(panels))
    labels = _bar_labels(spec, rows)
    series = []
    any_measured = any_modelled = False
    from matplotlib.patches import Patch

    legends: list[list[Any]] = []
    for ax, (p, figures) in zip(axes, panels):
        width = 0.7 / len(figures)
        figure_handles = []
        for j, column in enumerate(figures):
            color = f"C{(2 * p + j) % 10}"
            values = [value(column, r) for r in rows]
            modelled = [column.is_modelled(r) for r in rows]
            any_modelled |= any(m for m, v in zip(modelled, values) if v is not None)
            any_measured |= any(not m for m, v in zip(modelled, values) if v is not None)
            for i, (v, mod) in enumerate(zip(values, modelled)):
                at = i - 0.35 + width * (j + 0.5)
                if v is not None:
                    style = dict(facecolor="white", edgecolor=color, hatch=HATCH, linewidth=1.2) if mod else \
                        dict(facecolor=color, edgecolor=color)
                    ax.bar(at, v, width=width * 0.9, **style)
                ax.annotate(spec.absent if v is None else number_text(v), (at, v or 0), ha="center", va="bottom",
                            fontsize="x-small", xytext=(0, 2), textcoords="offset points")
            figure_handles.append(Patch(facecolor=color, edgecolor=color, label=column.label))
            series.append(Series(column.label, title(column), "row", title(column), [
                _point(lab.replace("\n", " "), v, mod, r, texts) for lab, v, mod, r in zip(labels, values, modelled,
                                                                                            rows)]))
        ax.set_xticks(list(range(len(labels))), labels, fontsize="small")
        ax.set_ylabel(_at(spec.y_labels, p, title(figures[0])))
        ax.set_title(_at(spec.titles, p, title(figures[0])), fontsize="medium")
        ax.grid(True, axis="y", alpha=0.3)
        legends.append(figure_handles if len(figures) > 1 else [])
    legends[0] = legends[0] + _timing_handles(any_measured, any_modelled, "bar")
    for ax, handles in zip(axes, legends):
        if handles:
            ax.legend(handles=handles, fontsize="small")
    heading = spec.title(rows, run_id) if spec.title is not None else f"{spec.id} (run {run_id})"
    fig.suptitle(heading)
    return Plot(plot_id, spec.id, heading, fig, series, [run_id])


def stacked(spec: PlotSpec, table: Table, rows: list[dict[str, Any]], run_id: str, plot_id: str) -> Plot | None:
    """Per run: where each row's time went, the figures of spec.panels[0] stacked (in their unit, and as shares of
    the row's total); modelled parts hatched."""
    columns = {c.key: c for c in table.columns}
    parts = [columns[k] for k in (spec.panels[0] if spec.panels else ()) if k in columns]
    if not rows or not any(value(c, r) is not None for c in parts for r in rows):
        return None
    from matplotlib.patches import Patch

    texts = [c.key for c in table.columns if c.text]
    fig, (ax_time, ax_share) = _new_figure(2, width=6.5, height=1.6 + 0.7 * max(1, len(rows)))
    labels = _bar_labels(spec, rows)
    totals = [sum(value(p, r) or 0.0 for p in parts) for r in rows]
    left_time = [0.0] * len(rows)
    left_share = [0.0] * len(rows)
    series = []
    part_handles: list[Any] = []
    any_measured = any_modelled = False
    for i, part in enumerate(parts):
        color = f"C{i}"
        values = [value(part, r) for r in rows]
        modelled = [part.is_modelled(r) for r in rows]
        any_modelled |= any(m for m, v in zip(modelled, values) if v)
        any_measured |= any(not m for m, v in zip(modelled, values) if v)
        shares = [None if v is None or not t else 100.0 * v / t for v, t in zip(values, totals)]
        for ax, widths, left in ((ax_time, values, left_time), (ax_share, shares, left_share)):
            for j, (v, mod) in enumerate(zip(widths, modelled)):
                if v is None:
                    continue
                style = dict(facecolor="white", edgecolor=color, hatch=HATCH, linewidth=1.2) if mod else \
                    dict(facecolor=color, edgecolor=color)
                ax.barh(j, v, left=left[j], height=0.6, **style)
        part_handles.append(Patch(facecolor=color, edgecolor=color, label=part.label))
        left_time = [a + (v or 0.0) for a, v in zip(left_time, values)]
        left_share = [a + (v or 0.0) for a, v in zip(left_share, shares)]
        series.append(Series("time", part.label, "row", title(part), [
            _point(lab.replace("\n", " "), v, mod, r, texts, key=part.key)
            for lab, v, mod, r in zip(labels, values, modelled, rows)]))
    ax_time.set_yticks(list(range(len(labels))), labels, fontsize="small")
    ax_time.invert_yaxis()
    ax_share.set_yticks([])
    ax_share.invert_yaxis()
    units = {p.unit for p in parts}
    ax_time.set_xlabel(spec.axis or (f"time ({units.pop()})" if len(units) == 1 else "time"))
    ax_share.set_xlabel("share of the rank's time (%)")
    ax_share.set_xlim(0, 100)
    for ax in (ax_time, ax_share):
        ax.grid(True, axis="x", alpha=0.3)
    ax_share.legend(handles=part_handles + _timing_handles(any_measured, any_modelled, "bar"), fontsize="small",
                    loc="center left", bbox_to_anchor=(1.02, 0.5))
    heading = spec.title(rows, run_id) if spec.title is not None else f"{spec.id} (run {run_id})"
    fig.suptitle(heading)
    return Plot(plot_id, spec.id, heading, fig, series, [run_id])


def _nan(values: list[float | None]) -> list[float]:
    return [float("nan") if v is None else v for v in values]


def lines(spec: PlotSpec, table: Table, rows: list[dict[str, Any]], plot_id: str) -> Plot | None:
    """Across runs: one figure against spec.x, one line per spec.group; drawn where the rows hold two x or more."""
    columns = {c.key: c for c in table.columns}
    keys = spec.panels[0] if spec.panels else ()
    if not keys or keys[0] not in columns or spec.x is None:
        return None
    column = columns[keys[0]]
    rows = [r for r in rows if value(column, r) is not None]
    if len({spec.x(r) for r in rows}) < 2:
        return None
    texts = [c.key for c in table.columns if c.text]
    fig, (ax,) = _new_figure(1, width=8.0, height=4.8)
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(spec.group(r) if spec.group is not None else "", []).append(r)
    series = []
    any_measured = any_modelled = False
    for i, (name, group) in enumerate(groups.items()):
        group.sort(key=spec.x)
        modelled = column.is_modelled(group[0])
        any_modelled |= modelled
        any_measured |= not modelled
        xs = [spec.x(r) for r in group]
        ys = [value(column, r) for r in group]
        color = f"C{i % 10}"
        label = name + (" (modelled)" if modelled else "")
        ax.plot(xs, ys, linestyle="--" if modelled else "-", marker="o", color=color,
                markerfacecolor="white" if modelled else color, label=label)
        series.append(Series(column.label, label, spec.x_label, title(column), [
            _point(x, y, modelled, r, texts) for x, y, r in zip(xs, ys, group)]))
    _log2_size_axis(ax, spec.x_label, as_bytes=spec.x_bytes)
    ticks = sorted({p["x"] for s in series for p in s.points})
    if len(ticks) <= 12 and not spec.x_bytes:  # the sizes run, whether powers of two or not
        ax.set_xticks(ticks, [f"{t:.4g}" for t in ticks])
    if spec.log_y:
        ax.set_yscale("log")
    ax.set_ylabel(_at(spec.y_labels, 0, title(column)))
    _style_legend(ax, _timing_handles(any_measured, any_modelled, "line"))
    heading = spec.title(rows, "") if spec.title is not None else spec.id
    fig.suptitle(heading)
    runs = list(dict.fromkeys(str(r.get("run_id")) for r in rows))
    return Plot(plot_id, spec.id, heading, fig, series, runs)


_LINESTYLES = ("-", ":", "-.", "--")
_MARKERS = ("o", "s", "^", "v")


def sweep(spec: PlotSpec, table: Table, rows: list[dict[str, Any]], chart: str, plot_id: str,
          run_labels: dict[str, str]) -> Plot | None:
    """Across runs, one chart (rows whose spec.chart field is `chart`): every panel's figures against spec.x (log2),
    one series per run and spec.group; a series with no value is left out, one identical to another of its group in
    the panel is drawn once (its label added: "busbw (= algbw)"); modelled series dashed and hollow."""
    columns = {c.key: c for c in table.columns}
    rows = [r for r in rows if str(r.get(spec.chart)) == chart]
    panels = _panels(spec, columns, rows)
    if not rows or not panels or spec.x is None:
        return None
    texts = [c.key for c in table.columns if c.text]
    fig, axes = _new_figure(len(panels))
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((str(r.get("run_id")), spec.group(r) if spec.group is not None else ""), []).append(r)
    many_runs = len({k[0] for k in groups}) > 1
    series: list[Series] = []
    any_measured = any_modelled = False
    for ax, (p, figures) in zip(axes, panels):
        for i, ((run_id, group_name), group) in enumerate(groups.items()):
            group.sort(key=spec.x)
            color = f"C{i % 10}"
            name = f"{run_labels.get(run_id, run_id)} {group_name}" if many_runs else group_name
            xs = [spec.x(r) for r in group]
            drawn: list[tuple[list[float | None], Series, Any]] = []
            for j, column in enumerate(figures):
                ys = [value(column, r) for r in group]
                if all(y is None for y in ys):
                    continue
                figure_name = spec.names.get(column.key, column.label)
                same = next((d for d in drawn if d[0] == ys), None)
                if same is not None:  # e.g. busbw = algbw where the bus factor is 1
                    same[1].label += f" (= {figure_name})"
                    same[2].set_label(same[1].label)
                    continue
                modelled = any(column.is_modelled(r) for r in group)
                any_modelled |= modelled
                any_measured |= not modelled
                label = f"{name} {figure_name}".strip() + (" (modelled)" if modelled else "")
                (line,) = ax.plot(xs, _nan(ys), linestyle="--" if modelled else _LINESTYLES[j % 4],
                                  marker=_MARKERS[j % 4], color=color, markerfacecolor="white" if modelled else color,
                                  label=label)
                s = Series(_at(spec.titles, p, title(column)).split(":")[0], label, spec.x_label, title(column), [
                    _point(x, y, modelled, r, texts, key=column.key) for x, y, r in zip(xs, ys, group)])
                series.append(s)
                drawn.append((ys, s, line))
        _log2_size_axis(ax, spec.x_label, as_bytes=spec.x_bytes)
        if spec.log_y:
            ax.set_yscale("log")
        ax.set_ylabel(_at(spec.y_labels, p, title(figures[0])))
        ax.set_title(_at(spec.titles, p, title(figures[0])), fontsize="medium")
    for ax in axes[:-1]:
        _style_legend(ax)
    _style_legend(axes[-1], _timing_handles(any_measured, any_modelled, "line"))
    heading = spec.title(rows, chart) if spec.title is not None else f"{spec.id} {chart}"
    fig.suptitle(heading)
    runs = list(dict.fromkeys(str(r.get("run_id")) for r in rows))
    return Plot(plot_id, spec.id, heading, fig, series, runs)


def steps_plot(steps: Sequence[dict[str, Any]], run_id: str, plot_id: str | None = None) -> Plot:
    """Any series logged over steps (loss, throughput, ...): one panel per numeric field against `step`.
    A step marked "modelled": true is drawn hollow."""
    keys = numeric_series_keys(steps)
    fig, axes = _new_figure(max(1, len(keys)), width=4.5, height=3.6)
    series = []
    any_modelled = any(bool(s.get("modelled")) for s in steps)
    for i, (ax, key) in enumerate(zip(axes, keys)):
        points = [s for s in steps if isinstance(s.get(key), (int, float)) and not isinstance(s.get(key), bool)
                  and isinstance(s.get("step"), (int, float))]
        color = f"C{i % 10}"
        for mod in (False, True):
            part = [s for s in points if bool(s.get("modelled")) == mod]
            if part:
                ax.plot([s["step"] for s in part], [s[key] for s in part], linestyle="--" if mod else "-",
                        marker="o", markersize=3, color=color, markerfacecolor="white" if mod else color,
                        label=MODELLED_LABEL if mod else MEASURED_LABEL)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.set_title(key, fontsize="medium")
        ax.grid(True, alpha=0.3)
        if any_modelled:
            ax.legend(fontsize="small")
        series.append(Series(key, key, "step", key, [
            {"x": s["step"], "y": s[key], "modelled": bool(s.get("modelled")), "run_id": run_id} for s in points]))
    title = f"logged over steps (run {run_id})"
    fig.suptitle(title)
    return Plot(plot_id or f"steps-{run_id}", "steps", title, fig, series, [run_id])


def plots_for_runs(runs: list[Run]) -> list[Plot]:
    """Every plot the runs call for, benchmark by benchmark (in the order their runs come), each as its
    presentation declares: a per-run plot for each run, a plot across runs once (a sweep once per chart), then per
    run with logged steps their series."""
    require_matplotlib()
    plots: list[Plot] = []
    ids: dict[str, int] = {}

    def unique(base: str) -> str:
        ids[base] = ids.get(base, 0) + 1
        return base if ids[base] == 1 else f"{base}-{ids[base]}"

    by_benchmark: dict[str, list[Run]] = {}
    for run in runs:
        by_benchmark.setdefault(run.benchmark, []).append(run)
    for benchmark, group in by_benchmark.items():
        presentation = for_benchmark(benchmark)
        tables = [(run, {t.name: t for t in presentation.tables(run.document)}) for run in group]
        for spec in presentation.plots:
            drawn: list[Plot | None] = []
            mine = [(run, t[spec.table]) for run, t in tables if spec.table in t]
            if not mine:
                continue
            if spec.kind in ("bars", "stacked"):
                draw = bars if spec.kind == "bars" else stacked
                for run, table in mine:
                    rows = [{**r, "run_id": run.run_id} for r in table.rows]
                    rows = spec.select(rows) if spec.select is not None else rows
                    drawn.append(draw(spec, table, rows, run.run_id, unique(f"{spec.id}-{slug(run.run_id)}")))
            elif spec.kind in ("lines", "sweep"):
                rows = [{**r, "run_id": run.run_id} for run, table in mine for r in table.rows]
                rows = spec.select(rows) if spec.select is not None else rows
                table = mine[0][1]
                if spec.kind == "lines":
                    drawn.append(lines(spec, table, rows, unique(spec.id)))
                else:
                    labels = {run.run_id: f"run {run.run_id}" for run, _ in mine}
                    for chart in dict.fromkeys(str(r.get(spec.chart)) for r in rows):
                        drawn.append(sweep(spec, table, rows, chart, unique(f"{spec.id}-{slug(chart)}"), labels))
            else:
                raise ValueError(f"benchmark {benchmark!r} declares a plot of unknown kind {spec.kind!r}")
            for plot in drawn:
                if plot is not None:
                    plot.benchmark = benchmark
                    plots.append(plot)
    for run in runs:
        steps = run.document.get("steps")
        if isinstance(steps, list) and steps and all(isinstance(s, dict) for s in steps) \
                and numeric_series_keys(steps):
            plot = steps_plot(steps, run.run_id, unique(f"steps-{slug(run.run_id)}"))
            plot.benchmark = run.benchmark
            plots.append(plot)
    return plots
