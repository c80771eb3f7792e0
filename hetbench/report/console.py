"""Rich tables for hetbench's commands, printed on rank 0 only (after hatch's one-console design)."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import Any, Callable, Iterable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.table import Table

MODELLED_MARK = "~"  # in a table, a value that was modelled, not measured


LOG_WIDTH = 200  # columns when the output is a file or a pipe: a wide table beats a wrapped one in a log


def _launcher_pty(stderr: bool) -> bool:
    """Open MPI's mpirun hands each rank a pseudo-terminal of 0 columns, whatever its own output goes to (a file,
    a pipe): no one's terminal, so no colours and no 80-column fallback."""
    try:
        return os.get_terminal_size((sys.stderr if stderr else sys.stdout).fileno()).columns == 0
    except (AttributeError, OSError, ValueError):
        return False


def console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    if probe.is_terminal and _launcher_pty(stderr):
        return Console(stderr=stderr, highlight=False, soft_wrap=False, width=LOG_WIDTH, force_terminal=False)
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


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None or math.isnan(fraction) else f"{100 * fraction:.1f}"


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
            str(r["rank"]), escape(r["host"]), f"{r['backend']}:{r['index']}", escape(r["vendor"]),
            escape(r["name"] + (" [modelled]" if r.get("modelled") else "")), r["kind"], _gib(r.get("memory_bytes")),
            ",".join(r["dtypes"]), fmt(peak.get("fp32")), fmt(peak.get("fp16")), escape(r["runtime"]),
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
            str(r["rank"]), escape(r["host"]), escape(r["backend"]), escape(r["device"]), r["dtype"],
            f"{r['m']}x{r['n']}x{r['k']}",
            fmt(r["gemm_seconds_median"], scale=1e3, modelled=mod), _percent(r["gemm_seconds_cv"]),
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


@contextlib.contextmanager
def sweep_progress(enabled: bool, force: bool | None = None) -> Iterator[Callable[[int, int, str], None] | None]:
    """A progress bar on stderr while a sweep runs: on a terminal, or where `force` asks for it (mpiexec passes
    a rank's output through pipes, so the rank cannot see the terminal at the end of them)."""
    err = Console(stderr=True, force_terminal=True) if force else console(stderr=True)
    if not enabled or force is False or not err.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task("sweep", total=None)

        def on_step(done: int, total: int, label: str) -> None:
            progress.update(task, completed=done, total=total, description=label)

        yield on_step


def collectives_report(rows: list[dict[str, Any]], summary: dict[str, Any], ranks: list[dict[str, Any]]) -> None:
    """One table per op and path in the style of nccl-tests, the ranks' devices, and the closing lines."""
    out = console()
    devices = ", ".join(f"{r['rank']}:{r['backend']} {r['device_info']['name']}"
                        + (" [modelled]" if r["device_timing"] == "modelled" else "") for r in ranks)
    out.print(f"ranks: {devices}", markup=False)
    for key in dict.fromkeys((r["op"], r["path"]) for r in rows):
        group = [r for r in rows if (r["op"], r["path"]) == key]
        host_path = key[1] == "host"
        modelled = host_path and group[0]["copy_timing"] == "modelled"
        table = Table(title=f"{key[0]}  (path: {key[1]}, {group[0]['ranks']} ranks, busbw factor "
                            f"{group[0]['busbw_factor']:.3g})", title_justify="left", caption_justify="left",
                      caption=f"{MODELLED_MARK} includes modelled copy time (simulated device)" if modelled else None)
        columns = [("size (B)", "right"), ("count (elements)", "right"), ("type", "left"), ("redop", "left"),
                   ("root", "right"), ("time (us)", "right"), ("algbw (GB/s)", "right"),
                   ("busbw (GB/s)", "right"), ("#wrong", "right")]
        if host_path:
            columns += [("d2h (us)", "right"), ("h2d (us)", "right"), ("end-to-end (us)", "right"),
                        ("end-to-end algbw (GB/s)", "right")]
        columns += [("straggler", "left")]
        for name, justify in columns:
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for r in group:
            wrong = "-" if r["wrong"] is None else (str(r["wrong"]) if r["wrong"] == 0 else f"[bold red]{r['wrong']}[/]")
            cells = [str(r["size_bytes"]), str(r["count_elements"]), r["dtype"], r["redop"],
                     "-" if r["root"] is None else str(r["root"]), fmt(r["op_us_median"], 4),
                     fmt(r["algbw_gbps"]), fmt(r["busbw_gbps"]), wrong]
            if host_path:
                cells += [fmt(r["d2h_us_median"], 4, modelled=modelled), fmt(r["h2d_us_median"], 4, modelled=modelled),
                          fmt(r["end_to_end_us_median"], 4, modelled=modelled),
                          fmt(r["end_to_end_algbw_gbps"], modelled=modelled)]
            cells.append(f"rank {r['stragglers']}" if r["stragglers"] else "")
            table.add_row(*cells)
        out.print(table)
    for key, value in summary["avg_busbw_gbps"].items():
        out.print(f"avg bus bandwidth {key}: {fmt(value)} GB/s")
    if summary["checked"]:
        state = "[green]0[/]" if summary["wrong_total"] == 0 else f"[bold red]{summary['wrong_total']}[/]"
        out.print(f"out of bounds values (#wrong, all ops and sizes): {state}")
    else:
        out.print("results not checked (--no-check)")
