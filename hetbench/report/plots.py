"""Plots of saved runs, drawn with matplotlib (the optional extra `report`, Agg backend, no pyplot state).

Measured points are drawn filled (solid bars, filled markers, solid lines); modelled ones hollow (hatched bars,
hollow markers, dashed lines), and the legend says which is which. Every plot keeps the numbers it drew
(`Plot.series`), so a page can show them beside the picture and a test can check them against the results.
The functions take plain rows (dicts), so rows of several runs and sizes can be drawn together.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from hetbench.report.figures import (
    ALGBW,
    BUSBW,
    COLLECTIVES,
    END_TO_END_US,
    GEMM_TFLOPS,
    MATMUL,
    MATMUL_TIME_PARTS,
    OP_US,
    PEAK_PERCENT,
    numeric_series_keys,
)
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
    kind: str  # matmul-throughput, matmul-time, matmul-size, collectives-op, steps
    title: str
    figure: Any
    series: list[Series]
    run_ids: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "title": self.title, "run_ids": self.run_ids,
                "series": [s.to_dict() for s in self.series]}

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


def _rank_label(row: dict[str, Any]) -> str:
    device = str(row.get("device", ""))
    device = device if len(device) <= 26 else device[:25] + "…"
    return f"rank {row.get('rank')} {row.get('backend')}\n{device}"


def _bars(ax: Any, labels: list[str], values: list[float | None], modelled: list[bool], color: str,
          horizontal: bool = False, left: list[float] | None = None) -> None:
    for i, (v, mod) in enumerate(zip(values, modelled)):
        if v is None:
            continue
        style = dict(facecolor="white", edgecolor=color, hatch=HATCH, linewidth=1.2) if mod else \
            dict(facecolor=color, edgecolor=color)
        if horizontal:
            ax.barh(i, v, left=0 if left is None else left[i], height=0.6, **style)
        else:
            ax.bar(i, v, width=0.6, **style)
    ticks = range(len(labels))
    if horizontal:
        ax.set_yticks(list(ticks), labels, fontsize="small")
        ax.invert_yaxis()
    else:
        ax.set_xticks(list(ticks), labels, fontsize="small")


def _largest_size_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def volume(r: dict[str, Any]) -> int:
        return int(r.get("m") or 0) * int(r.get("n") or 0) * int(r.get("k") or 0)

    largest = max((volume(r) for r in rows), default=0)
    return [r for r in rows if volume(r) == largest]


def _size_text_mnk(row: dict[str, Any]) -> str:
    return f"{row.get('m')}x{row.get('n')}x{row.get('k')}"


def matmul_throughput(rows: list[dict[str, Any]], run_id: str, plot_id: str | None = None) -> Plot:
    """TFLOP/s and % of the device's peak, one bar per rank (rows of one size: the largest given)."""
    rows = _largest_size_rows(rows)
    fig, (ax_rate, ax_peak) = _new_figure(2)
    labels = [_rank_label(r) for r in rows]
    modelled = [MATMUL.row_modelled(r) for r in rows]
    series = []
    for ax, fig_def, color in ((ax_rate, GEMM_TFLOPS, "C0"), (ax_peak, PEAK_PERCENT, "C2")):
        values = [fig_def.value(r) for r in rows]
        _bars(ax, labels, values, modelled, color)
        ax.set_ylabel(fig_def.title)
        ax.set_title("GEMM throughput as % of the device's peak" if fig_def is PEAK_PERCENT else
                     f"GEMM throughput ({fig_def.unit})", fontsize="medium")
        ax.grid(True, axis="y", alpha=0.3)
        for i, v in enumerate(values):
            ax.annotate("no peak known" if v is None else f"{v:.3g}", (i, v or 0), ha="center", va="bottom",
                        fontsize="x-small", xytext=(0, 2), textcoords="offset points")
        series.append(Series(fig_def.label, fig_def.title, "rank", fig_def.title, [
            {"x": lab.replace("\n", " "), "y": v, "modelled": mod, "run_id": run_id, "rank": r.get("rank")}
            for lab, v, mod, r in zip(labels, values, modelled, rows)]))
    ax_rate.legend(handles=_timing_handles(not all(modelled), any(modelled), "bar"), fontsize="small")
    size = _size_text_mnk(rows[0]) if rows else "-"
    title = f"matmul {size} {rows[0].get('dtype') if rows else ''}: throughput per rank (run {run_id})"
    fig.suptitle(title)
    return Plot(plot_id or f"matmul-throughput-{run_id}", "matmul-throughput", title, fig, series, [run_id])


def matmul_time_breakdown(rows: list[dict[str, Any]], run_id: str, plot_id: str | None = None) -> Plot:
    """Where one matmul's time went on each rank: upload, GEMM, download, reduce, stacked (ms and % of the rank's
    total); modelled parts hatched."""
    rows = _largest_size_rows(rows)
    fig, (ax_ms, ax_share) = _new_figure(2, width=6.5, height=1.6 + 0.7 * max(1, len(rows)))
    labels = [_rank_label(r) for r in rows]
    totals = [sum(p.value(r) or 0.0 for p in MATMUL_TIME_PARTS) for r in rows]
    left_ms = [0.0] * len(rows)
    left_share = [0.0] * len(rows)
    from matplotlib.patches import Patch

    series = []
    part_handles: list[Any] = []
    any_measured = any_modelled = False
    for i, part in enumerate(MATMUL_TIME_PARTS):
        color = f"C{i}"
        values = [part.value(r) for r in rows]
        modelled = [MATMUL.is_modelled(part, r) for r in rows]
        any_modelled |= any(m for m, v in zip(modelled, values) if v)
        any_measured |= any(not m for m, v in zip(modelled, values) if v)
        shares = [None if v is None or not t else 100.0 * v / t for v, t in zip(values, totals)]
        _bars(ax_ms, labels, values, modelled, color, horizontal=True, left=left_ms)
        _bars(ax_share, labels, shares, modelled, color, horizontal=True, left=left_share)
        part_handles.append(Patch(facecolor=color, edgecolor=color, label=part.label))
        left_ms = [a + (v or 0.0) for a, v in zip(left_ms, values)]
        left_share = [a + (v or 0.0) for a, v in zip(left_share, shares)]
        series.append(Series("time", part.label, "rank", part.title, [
            {"x": lab.replace("\n", " "), "y": v, "modelled": mod, "run_id": run_id, "rank": r.get("rank"),
             "key": part.key}
            for lab, v, mod, r in zip(labels, values, modelled, rows)]))
    ax_ms.set_xlabel("time of one matmul (ms)")
    ax_share.set_xlabel("share of the rank's time (%)")
    ax_share.set_xlim(0, 100)
    ax_share.set_yticks([])
    for ax in (ax_ms, ax_share):
        ax.grid(True, axis="x", alpha=0.3)
    ax_share.legend(handles=part_handles + _timing_handles(any_measured, any_modelled, "bar"), fontsize="small",
                    loc="center left", bbox_to_anchor=(1.02, 0.5))
    size = _size_text_mnk(rows[0]) if rows else "-"
    title = f"matmul {size}: where one matmul's time went per rank (run {run_id})"
    fig.suptitle(title)
    return Plot(plot_id or f"matmul-time-{run_id}", "matmul-time", title, fig, series, [run_id])


def matmul_vs_size(rows: list[dict[str, Any]], plot_id: str = "matmul-size") -> Plot:
    """GEMM TFLOP/s against the size, one line per device (backend, device, dtype), from rows of any runs with
    differing m, n, k. x is (m·n·k)^(1/3): n for square products."""
    fig, (ax,) = _new_figure(1, width=8.0, height=4.8)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        if GEMM_TFLOPS.value(r) is not None:
            groups.setdefault((r.get("backend"), r.get("device"), r.get("dtype")), []).append(r)
    series = []
    any_measured = any_modelled = False
    for i, ((backend, device, dtype), group) in enumerate(groups.items()):
        group.sort(key=lambda r: (r["m"] * r["n"] * r["k"]))
        modelled = MATMUL.row_modelled(group[0])
        any_modelled |= modelled
        any_measured |= not modelled
        xs = [(r["m"] * r["n"] * r["k"]) ** (1 / 3) for r in group]
        ys = [GEMM_TFLOPS.value(r) for r in group]
        color = f"C{i % 10}"
        label = f"{backend} {device} {dtype}" + (" (modelled)" if modelled else "")
        ax.plot(xs, ys, linestyle="--" if modelled else "-", marker="o", color=color,
                markerfacecolor="white" if modelled else color, label=label)
        series.append(Series("throughput", label, "size (m·n·k)^(1/3)", GEMM_TFLOPS.title, [
            {"x": x, "y": y, "modelled": modelled, "run_id": r.get("run_id"), "rank": r.get("rank"),
             "m": r.get("m"), "n": r.get("n"), "k": r.get("k")} for x, y, r in zip(xs, ys, group)]))
    _log2_size_axis(ax, "size: (m·n·k)^(1/3), n for square products", as_bytes=False)
    ticks = sorted({p["x"] for s in series for p in s.points})
    if len(ticks) <= 12:  # the sizes run, whether powers of two or not
        ax.set_xticks(ticks, [f"{t:.4g}" for t in ticks])
    ax.set_yscale("log")
    ax.set_ylabel(GEMM_TFLOPS.title)
    _style_legend(ax, _timing_handles(any_measured, any_modelled, "line"))
    title = "matmul: GEMM throughput against size"
    fig.suptitle(title)
    runs = list(dict.fromkeys(str(r.get("run_id")) for r in rows))
    return Plot(plot_id, "matmul-size", title, fig, series, runs)


def collectives_op(op: str, rows: list[dict[str, Any]], run_labels: dict[str, str] | None = None,
                   plot_id: str | None = None) -> Plot:
    """One op against message size: busbw and algbw (GB/s), and the time (us, log-log, where the latency regime
    of small messages and the bandwidth regime of large ones both read), every path (host-staged, device-direct)
    and run on one chart. The host path's end-to-end time includes the device copies, modelled on simulated
    devices."""
    rows = [r for r in rows if r.get("op") == op]
    fig, (ax_bw, ax_t) = _new_figure(2)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r.get("run_id"), r.get("path")), []).append(r)
    many_runs = len({k[0] for k in groups}) > 1
    series = []
    any_measured = any_modelled = False
    for i, ((run_id, path), group) in enumerate(groups.items()):
        group.sort(key=lambda r: r["size_bytes"])
        color = f"C{i % 10}"
        name = {"host": "host-staged", "device": "device-direct"}.get(str(path), str(path))
        if many_runs:
            name = f"{(run_labels or {}).get(str(run_id), run_id)} {name}"
        xs = [r["size_bytes"] for r in group]
        factor_one = all(r.get("busbw_factor") == 1 for r in group)
        any_measured = True
        lines = [(ax_bw, BUSBW, "-", "o", f"{name} busbw" + (" (= algbw, factor 1)" if factor_one else ""), False)]
        if not factor_one:
            lines.append((ax_bw, ALGBW, ":", "s", f"{name} algbw", False))
        lines.append((ax_t, OP_US, "-", "o", f"{name} op time", False))
        if path == "host":
            modelled = any(COLLECTIVES.is_modelled(END_TO_END_US, r) for r in group)
            any_modelled |= modelled
            lines.append((ax_t, END_TO_END_US, "--" if modelled else "-.", "^",
                          f"{name} end-to-end incl. copies" + (" (modelled copies)" if modelled else ""), modelled))
        for ax, fig_def, linestyle, marker, label, modelled in lines:
            ys = [fig_def.value(r) for r in group]
            ax.plot(xs, ys, linestyle=linestyle, marker=marker, color=color,
                    markerfacecolor="white" if modelled else color, label=label)
            series.append(Series("bandwidth" if ax is ax_bw else "time", label, "size (B)", fig_def.title, [
                {"x": x, "y": y, "modelled": modelled, "run_id": r.get("run_id"), "op": op, "path": path,
                 "size_bytes": x, "key": fig_def.key} for x, y, r in zip(xs, ys, group)]))
    for ax in (ax_bw, ax_t):
        _log2_size_axis(ax, "message size", as_bytes=True)
        ax.set_yscale("log")
    ax_bw.set_ylabel("bandwidth (GB/s)")
    ax_bw.set_title("bandwidth: the large-message regime", fontsize="medium")
    ax_t.set_ylabel("time (us), slowest rank, median")
    ax_t.set_title("time: the small-message (latency) regime", fontsize="medium")
    _style_legend(ax_bw)
    _style_legend(ax_t, _timing_handles(any_measured, any_modelled, "line"))
    ranks = sorted({r.get("ranks") for r in rows if r.get("ranks") is not None})
    title = f"{op} over {','.join(map(str, ranks))} ranks: bandwidth and time against message size"
    fig.suptitle(title)
    runs = list(dict.fromkeys(str(r.get("run_id")) for r in rows))
    return Plot(plot_id or f"collectives-{slug(op)}", "collectives-op", title, fig, series, runs)


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


def _has_sizes(rows: Iterable[dict[str, Any]]) -> bool:
    return len({(r.get("m"), r.get("n"), r.get("k")) for r in rows}) > 1


def plots_for_runs(runs: list[Run]) -> list[Plot]:
    """Every plot the runs call for, in order: per matmul run its throughput and time breakdown, matmul
    throughput against size where the runs hold more than one size, one chart per collective op across the
    runs, and per run with logged steps their series."""
    require_matplotlib()
    plots: list[Plot] = []
    ids: dict[str, int] = {}

    def unique(base: str) -> str:
        ids[base] = ids.get(base, 0) + 1
        return base if ids[base] == 1 else f"{base}-{ids[base]}"

    matmul_rows: list[dict[str, Any]] = []
    collective_rows: list[dict[str, Any]] = []
    labels: dict[str, str] = {}
    for run in runs:
        rows = [{**r, "run_id": run.run_id} for r in run.rows]
        if run.benchmark == "matmul" and rows:
            plots.append(matmul_throughput(rows, run.run_id, unique(f"matmul-throughput-{slug(run.run_id)}")))
            plots.append(matmul_time_breakdown(rows, run.run_id, unique(f"matmul-time-{slug(run.run_id)}")))
            matmul_rows += rows
        elif run.benchmark == "collectives":
            collective_rows += rows
            labels[run.run_id] = f"run {run.run_id}"
    if _has_sizes(matmul_rows):
        plots.append(matmul_vs_size(matmul_rows, unique("matmul-size")))
    for op in dict.fromkeys(str(r.get("op")) for r in collective_rows):
        plots.append(collectives_op(op, collective_rows, labels, unique(f"collectives-{slug(op)}")))
    for run in runs:
        steps = run.document.get("steps")
        if isinstance(steps, list) and steps and all(isinstance(s, dict) for s in steps) \
                and numeric_series_keys(steps):
            plots.append(steps_plot(steps, run.run_id, unique(f"steps-{slug(run.run_id)}")))
    return plots
