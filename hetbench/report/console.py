"""Rich tables for hetbench's commands, printed on rank 0 only (after hatch's one-console design)."""

from __future__ import annotations

import math
import sys
from typing import Any, Iterable

from rich.console import Console
from rich.table import Table

MODELLED_MARK = "~"  # in a table, a value that was modelled, not measured


LOG_WIDTH = 200  # columns when the output is a file or a pipe: a wide table beats a wrapped one in a log


def console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    width = None if probe.is_terminal else LOG_WIDTH
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def error_line(message: str) -> None:
    """One line on stderr, plain: errors must read the same in a log file as on a terminal."""
    print(f"Error: {message}", file=sys.stderr, flush=True)


def fmt(value: Any, digits: int = 3, scale: float = 1.0, modelled: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        v = value * scale
        text = f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:.0f}"
        return MODELLED_MARK + text if modelled else text
    return str(value)


def _gib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1024**3:.1f}"


def devices_table(rows: Iterable[dict[str, Any]]) -> Table:
    table = Table(title="hetbench devices", title_justify="left")
    for name, justify in [("Rank", "right"), ("Host", "left"), ("Backend", "left"), ("Vendor", "left"),
                          ("Device", "left"), ("Kind", "left"), ("Memory (GiB)", "right"), ("Dtypes", "left"),
                          ("Peak fp32 (TFLOP/s)", "right"), ("Peak fp16 (TFLOP/s)", "right"), ("Runtime", "left")]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        peak = r.get("peak_tflops") or {}
        table.add_row(
            str(r["rank"]), r["host"], f"{r['backend']}:{r['index']}", r["vendor"],
            r["name"] + (" [modelled]" if r.get("modelled") else ""), r["kind"], _gib(r.get("memory_bytes")),
            ",".join(r["dtypes"]), fmt(peak.get("fp32")), fmt(peak.get("fp16")), r["runtime"],
        )
    return table


def matmul_table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> Table:
    reduce = summary.get("reduce") == "sum"
    any_modelled = any(r["device_timing"] == "modelled" for r in rows)
    table = Table(title="hetbench matmul", title_justify="left", caption_justify="left",
                  caption=f"{MODELLED_MARK} modelled (simulated device), not measured" if any_modelled else None)
    columns = [("Rank", "right"), ("Host", "left"), ("Backend", "left"), ("Device", "left"), ("Dtype", "left"),
               ("m x n x k", "left"), ("GEMM median (ms)", "right"), ("GEMM CV (%)", "right"),
               ("TFLOP/s", "right"), ("% of peak", "right"), ("H2D (GB/s)", "right"), ("D2H (GB/s)", "right")]
    if reduce:
        columns += [("Reduce median (ms)", "right"), ("Reduce (GB/s)", "right")]
    columns += [("Timing", "left"), ("Check", "left")]
    for name, justify in columns:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        mod = r["device_timing"] == "modelled"
        cells = [
            str(r["rank"]), r["host"], r["backend"], r["device"], r["dtype"], f"{r['m']}x{r['n']}x{r['k']}",
            fmt(r["gemm_seconds_median"], scale=1e3, modelled=mod), fmt(r["gemm_seconds_cv"], 2, scale=100),
            fmt(r["gemm_tflops"], modelled=mod), fmt(r["peak_percent"], 3, modelled=mod),
            fmt(r["h2d_gbps"], modelled=mod), fmt(r["d2h_gbps"], modelled=mod),
        ]
        if reduce:
            cells += [fmt(r["reduce_seconds_median"], scale=1e3), fmt(r["reduce_algbw_gbps"])]
        cells += [r["device_timing"], "[green]ok[/]" if r["verified"] else "[bold red]FAILED[/]"]
        table.add_row(*cells)
    return table


def matmul_summary_lines(summary: dict[str, Any]) -> list[str]:
    mod = summary["end_to_end_timing"] == "modelled"
    lines = [
        f"end-to-end: {fmt(summary['end_to_end_seconds'], scale=1e3, modelled=mod)} ms "
        f"(slowest GEMM + copy to host{', then reduce' if summary['reduce'] == 'sum' else ''}; "
        f"{summary['end_to_end_timing']})",
        f"aggregate GEMM: {fmt(summary['aggregate_gemm_tflops'], modelled=mod)} TFLOP/s "
        f"over {summary['ranks']} rank(s)",
    ]
    if "reduced_verified" in summary:
        state = "[green]verified[/]" if summary["reduced_verified"] else "[bold red]FAILED[/]"
        lines.append(f"sum of products at rank {summary['root']}: {state} (Freivalds)")
    lines.append("result: " + ("[green]all checks passed[/]" if summary["verified"] else "[bold red]a check FAILED[/]"))
    return lines
