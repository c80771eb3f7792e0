"""Rich tables for hetbench's commands, printed on rank 0 only (after hatch's one-console design)."""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
from typing import Any, Callable, Iterable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.table import Table

MODELLED_MARK = "~"  # in a table, a value that was modelled, not measured


LOG_WIDTH = 200  # columns when the output is a file or a pipe: a wide table beats a wrapped one in a log
TERMINAL_WIDTH = 80  # columns of a terminal that does not say its size
_SANE_WIDTHS = range(20, 1001)  # a width outside these is a broken report, not a terminal's size


def _env_columns() -> int | None:
    """$COLUMNS where it holds a usable width (ASCII digits, 20..1000); None otherwise."""
    text = os.environ.get("COLUMNS", "").strip()
    if text.isascii() and text.isdigit() and int(text) in _SANE_WIDTHS:
        return int(text)
    return None


def _terminal_columns(stream: Any) -> int | None:
    """The width of the terminal `stream` writes to; None when it is no terminal (a file or a pipe), and 0 when it
    is one that has no size: Open MPI hands each rank such a pseudo-terminal, whatever mpirun's own output is."""
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


def console(stderr: bool = False, force_terminal: bool | None = None, fallback_width: int = LOG_WIDTH) -> Console:
    """A Console for stdout (or stderr) that writes escape codes only to a real terminal.

    A file, a pipe (a rank's output under mpiexec) or a terminal of width 0 (a rank's under Open MPI, even when
    mpirun writes to a file) gets plain text at $COLUMNS or `fallback_width` columns; a terminal gets its own width
    ($COLUMNS first, as rich reads it). FORCE_COLOR and TTY_COMPATIBLE, where set, still decide colour."""
    columns = _terminal_columns(sys.stderr if stderr else sys.stdout)
    if columns is None:  # a file or a pipe
        is_terminal, width = False, fallback_width
    elif columns == 0:  # a launcher's pseudo-terminal: the user's terminal, a file or a pipe, nobody knows
        is_terminal, width = False, _env_columns() or fallback_width
    else:
        is_terminal, width = True, _env_columns() or (columns if columns in _SANE_WIDTHS else TERMINAL_WIDTH)
    if force_terminal is None and not any(k in os.environ for k in ("FORCE_COLOR", "TTY_COMPATIBLE")):
        force_terminal = is_terminal
    return Console(stderr=stderr, force_terminal=force_terminal, highlight=False, soft_wrap=False, width=width)


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
            str(r["rank"]), escape(r["host"]), escape(r.get("backend_spec") or f"{r['backend']}:{r['index']}"),
            escape(r["vendor"]),
            escape(r["name"] + (" [modelled]" if r.get("modelled") else "")), r["kind"], _gib(r.get("memory_bytes")),
            ",".join(r["dtypes"]), fmt(peak.get("fp32")), fmt(peak.get("fp16")), escape(r["runtime"]),
        )
    return table


# PoCL names its CPU device <driver>-<LLVM CPU name>-<model>, or <driver>-<model>
_POCL_PREFIX = re.compile(r"^(?:pthread|basic|cpu|cpu-minimal|cpu-threaded)-(?:[a-z0-9_]+-)*")
_NAME_NOISE = re.compile(r"\((?:R|TM|C)\)|®|™|\s@\s*[\d.]+\s*[GM]Hz|\b(?:CPU|Processor|\d+-Core)\b|\(simulated\)",
                         re.IGNORECASE)
DEVICE_NAME_MAX = 32  # characters of a device name in a compact table; the full name is in the JSON


def short_device_name(name: str, limit: int = DEVICE_NAME_MAX) -> str:
    """A device name for a compact table: without trademark signs, clock speeds, "CPU"/"Processor", PoCL's
    driver prefix and "(simulated)" (the backend column and the `~` mark say that). The JSON keeps the full name."""
    text = " ".join(_NAME_NOISE.sub(" ", _POCL_PREFIX.sub("", name)).split()) or name
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short_host(host: str) -> str:
    return host if host.replace(".", "").isdigit() else host.split(".")[0]  # an IP address keeps its dots


def _check_cell(ok: bool) -> str:
    return "[green]ok[/]" if ok else "[bold red]FAILED[/]"


def matmul_table(rows: list[dict[str, Any]], summary: dict[str, Any], wide: bool = False) -> Table:
    """The compact table (the figures a reader compares; fits 100 columns), or with `wide` every column.
    The compact one names a rank's backend without " (auto)" and its device by a short name; the JSON has both."""
    reduce = summary.get("reduce") == "sum"
    any_modelled = any(r["device_timing"] == "modelled" for r in rows)
    caption = f"{MODELLED_MARK} modelled (simulated device), not measured" if any_modelled else None
    if wide:
        return _matmul_table_wide(rows, reduce, caption)
    # what every rank shares goes to the title: the dtype always (one per run), the shape where all agree
    shapes = {(r["m"], r["n"], r["k"]) for r in rows}
    shape_column = None if len(shapes) == 1 else ("k" if len({(m, n) for m, n, _ in shapes}) == 1 else "m x n x k")
    hosts = len({r["host"] for r in rows}) > 1
    title = "hetbench matmul: " + ("{}x{}x{} ".format(*next(iter(shapes))) if shape_column is None else "")
    title += f"{'/'.join(dict.fromkeys(r['dtype'] for r in rows))}, {len(rows)} rank{'s' if len(rows) != 1 else ''}"
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    # Numbers never wrap (a cut number is worse than none); where the width runs short, device names wrap
    # between words, and host names (rarely) fold
    table.add_column("Rank", justify="right", no_wrap=True)
    if hosts:
        table.add_column("Host", overflow="fold")
    table.add_column("Backend", no_wrap=True)
    table.add_column("Device", overflow="fold")
    if shape_column:
        table.add_column(shape_column, justify="right", no_wrap=True)
    for header in ("GEMM\n(ms)", "TFLOP/s", "% of\npeak", *(["Reduce\n(ms)"] if reduce else [])):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("Check", no_wrap=True)
    for r in rows:
        mod = r["device_timing"] == "modelled"
        cells = [str(r["rank"])]
        if hosts:
            cells.append(escape(_short_host(r["host"])))
        cells += [escape(r["backend"].removesuffix(" (auto)")), escape(short_device_name(r["device"]))]
        if shape_column == "k":
            cells.append(str(r["k"]))
        elif shape_column:
            cells.append(f"{r['m']}x{r['n']}x{r['k']}")
        cells += [fmt(r["gemm_seconds_median"], scale=1e3, modelled=mod), fmt(r["gemm_tflops"], modelled=mod),
                  fmt(r["peak_percent"], 3, modelled=mod)]
        if reduce:
            cells.append(fmt(r["reduce_seconds_median"], scale=1e3))
        cells.append(_check_cell(r["verified"]))
        table.add_row(*cells)
    return table


def _matmul_table_wide(rows: list[dict[str, Any]], reduce: bool, caption: str | None) -> Table:
    table = Table(title="hetbench matmul", title_justify="left", caption_justify="left", caption=caption)
    columns = [("Rank", "right"), ("Host", "left"), ("Backend", "left"), ("Device", "left"), ("Dtype", "left"),
               ("m x n x k", "left"), ("GEMM median (ms)", "right"), ("GEMM CV (%)", "right"),
               ("TFLOP/s", "right"), ("% of peak", "right"), ("H2D (GB/s)", "right"), ("D2H (GB/s)", "right")]
    if reduce:
        columns += [("Reduce median (ms)", "right"), ("Reduce (GB/s)", "right")]
    columns += [("Timing", "left"), ("Check", "left")]
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name not in ("Host", "Device"))  # type: ignore[arg-type]
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
        cells += [r["device_timing"], _check_cell(r["verified"])]
        table.add_row(*cells)
    return table


def print_table(out: Console, table: Table, wide: bool = False) -> None:
    """Print a table; a --wide one at its full width even where the console is narrower (the terminal then wraps
    its lines), since cutting its numbers to fit would defeat asking for it."""
    if wide:
        natural = out.measure(table, options=out.options.update_width(10_000)).maximum
        if natural > out.width:
            out.width = natural
    out.print(table)


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
def sweep_progress(enabled: bool, force: bool | None = None,
                   description: str = "sweep") -> Iterator[Callable[[int, int, str], None] | None]:
    """A progress bar on stderr while a run goes through its steps: on a terminal, or where `force` asks for it
    (mpiexec passes a rank's output through pipes, so the rank cannot see the terminal at the end of them).
    Yields on_step(done, total, label), or None where no bar is shown."""
    err = console(stderr=True, force_terminal=True if force else None, fallback_width=TERMINAL_WIDTH)
    if not enabled or force is False or not err.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task(description, total=None)

        def on_step(done: int, total: int, label: str) -> None:
            progress.update(task, completed=done, total=total, description=label)

        yield on_step


def notice_line(message: str) -> None:
    """A one-line notice on stderr, plain like the error lines, so that it reads the same in a log."""
    print(f"Note: {message}", file=sys.stderr, flush=True)


def straggler_ranks(value: Any) -> list[int]:
    """The flagged ranks of a row: a list (schema 1 files written before it was one hold "0,2")."""
    if isinstance(value, str):
        return [int(v) for v in value.split(",") if v.strip()]
    return [int(v) for v in value or []]


def _straggler_cell(value: Any) -> str:
    ranks = straggler_ranks(value)
    return "" if not ranks else f"rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}"


def collectives_report(rows: list[dict[str, Any]], summary: dict[str, Any], ranks: list[dict[str, Any]],
                       wide: bool = False) -> None:
    """One table per op and path in the style of nccl-tests, the ranks' devices, and the closing lines.

    The default tables fit 100 columns: what every table shares (type, redop, root) goes to its title, and the
    host path's copy columns (d2h, h2d, end-to-end algbw) only to the `wide` ones."""
    out = console()
    devices = ", ".join(f"{r['rank']}:{r['backend']} {r['device_info']['name']}"
                        + (" [modelled]" if r["device_timing"] == "modelled" else "") for r in ranks)
    out.print(f"ranks: {devices}", markup=False)
    for key in dict.fromkeys((r["op"], r["path"]) for r in rows):
        group = [r for r in rows if (r["op"], r["path"]) == key]
        first = group[0]
        host_path = key[1] == "host"
        modelled = host_path and first["copy_timing"] == "modelled"
        captions = []
        if modelled:
            captions.append(f"{MODELLED_MARK} includes modelled copy time (simulated device)")
        if first["busbw_factor"] == 0:
            captions.append(f"busbw is 0: with {first['ranks']} rank no data crosses a link (busbw factor "
                            f"{first['busbw_factor']:.3g}, as in nccl-tests)")
        title = f"{key[0]}  (path: {key[1]}, {first['ranks']} rank{'s' if first['ranks'] != 1 else ''}"
        if not wide:
            title += f", {first['dtype']}" + ("" if first["redop"] == "none" else f", redop {first['redop']}")
            title += "" if first["root"] is None else f", root {first['root']}"
        title += f", busbw factor {first['busbw_factor']:.3g})"
        table = Table(title=title, title_justify="left", caption_justify="left",
                      caption="\n".join(captions) or None)
        if wide:
            columns = [("size (B)", "right"), ("count (elements)", "right"), ("type", "left"), ("redop", "left"),
                       ("root", "right"), ("time (us)", "right"), ("algbw (GB/s)", "right"),
                       ("busbw (GB/s)", "right"), ("#wrong", "right")]
            if host_path:
                columns += [("d2h (us)", "right"), ("h2d (us)", "right"), ("end-to-end (us)", "right"),
                            ("end-to-end algbw (GB/s)", "right")]
        else:
            columns = [("size (B)", "right"), ("count\n(elements)", "right"), ("time (us)", "right"),
                       ("algbw\n(GB/s)", "right"), ("busbw\n(GB/s)", "right"), ("#wrong", "right")]
            if host_path:
                columns += [("end-to-end\n(us)", "right")]
        columns += [("straggler", "left")]
        for name, justify in columns:
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for r in group:
            wrong = "-" if r["wrong"] is None else (str(r["wrong"]) if r["wrong"] == 0 else f"[bold red]{r['wrong']}[/]")
            e2e = fmt(r["end_to_end_us_median"], 4, modelled=modelled)
            if wide:
                cells = [str(r["size_bytes"]), str(r["count_elements"]), r["dtype"], r["redop"],
                         "-" if r["root"] is None else str(r["root"]), fmt(r["op_us_median"], 4),
                         fmt(r["algbw_gbps"]), fmt(r["busbw_gbps"]), wrong]
                if host_path:
                    cells += [fmt(r["d2h_us_median"], 4, modelled=modelled),
                              fmt(r["h2d_us_median"], 4, modelled=modelled), e2e,
                              fmt(r["end_to_end_algbw_gbps"], modelled=modelled)]
            else:
                cells = [str(r["size_bytes"]), str(r["count_elements"]), fmt(r["op_us_median"], 4),
                         fmt(r["algbw_gbps"]), fmt(r["busbw_gbps"]), wrong]
                if host_path:
                    cells.append(e2e)
            cells.append(_straggler_cell(r["stragglers"]))
            table.add_row(*cells)
        print_table(out, table, wide)
    for key, value in summary["avg_busbw_gbps"].items():
        out.print(f"avg bus bandwidth {key}: {fmt(value)} GB/s")
    if summary["checked"]:
        state = "[green]0[/]" if summary["wrong_total"] == 0 else f"[bold red]{summary['wrong_total']}[/]"
        out.print(f"out of bounds values (#wrong, all ops and sizes): {state}")
    else:
        out.print("results not checked (--no-check)")
