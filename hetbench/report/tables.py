"""The terminal side of `hetbench report` and `hetbench compare`: a saved run's tables shown again, one table of
all runs per benchmark, and the comparison of two runs."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hetbench.report import console as tables_as_printed
from hetbench.report.compare import FASTER, SLOWER, Comparison
from hetbench.report.figures import for_benchmark
from hetbench.results.runs import Run


def show_run(out: Console, run: Run) -> None:
    """A saved run's tables as its command printed them: the one call into the commands' renderers, so a change
    of their signatures (compact / --wide tables) is met here alone."""
    document = run.document
    out.print(f"[bold]run {escape(run.run_id)}[/]  {escape(run.date_utc)}  {escape(run.command)}  "
              f"[dim]({escape(str(run.path))})[/]")
    if run.benchmark == "matmul":
        out.print(tables_as_printed.matmul_table(run.rows, document["summary"]))
        for line in tables_as_printed.matmul_summary_lines(document["summary"]):
            out.print(line)
    elif run.benchmark == "collectives":
        out.file.flush()  # collectives_report prints through its own console
        tables_as_printed.collectives_report(run.rows, document["summary"], run.metadata.get("ranks") or [])
    else:  # split, calibrate and any other benchmark: its command's own rendering
        out.file.flush()
        tables_as_printed.render_document(document)
    out.print()


def _devices_text(run: Run) -> str:
    return "\n".join(f"{rank}: {name}" + (" ~" if modelled else "") for rank, _, name, modelled in run.devices())


def runs_table(benchmark: str, runs: list[Run]) -> Table:
    """One line per run: which run, where and how it ran, on which devices, and its key figures."""
    figures = for_benchmark(benchmark)
    modelled = any(m for run in runs for *_, m in run.devices())
    table = Table(title=f"hetbench {benchmark}: {len(runs)} run(s)", title_justify="left", caption_justify="left",
                  caption="~ modelled (simulated device), not measured" if modelled else None, show_lines=True)
    for name in ("Run", "Date (UTC)", "Host(s)", "Command", "Rank map", "Devices"):
        table.add_column(name, overflow="fold", no_wrap=name in ("Run", "Rank map"))
    key_titles = [title for title, _ in figures.run_figures(runs[0].document)] if figures else []
    for title in key_titles:
        table.add_column(title, justify="right", overflow="fold")
    for run in runs:
        cells = [run.run_id, run.date_utc.replace("T", " ").removesuffix("+00:00"), ",".join(run.hosts), run.command, run.rank_map.replace(",", "\n"),
                 _devices_text(run)]
        key = dict(figures.run_figures(run.document)) if figures else {}
        cells += [key.get(title, "-") for title in key_titles]
        table.add_row(*[escape(c) for c in cells])
    return table


def _num(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:.0f}"


def compare_table(comparison: Comparison) -> Table:
    table = Table(title=f"hetbench compare ({comparison.benchmark}): {comparison.base_path} -> {comparison.new_path}",
                  title_justify="left", caption_justify="left",
                  caption="change = (new - base) / base of the medians; significance: Welch's t-test on the raw "
                          "repeats, 95 %; ~ modelled (simulated device)")
    for name, justify in (("Row", "left"), ("Figure", "left"), ("Base", "right"), ("New", "right"),
                          ("Change (%)", "right"), ("p", "right"), ("Verdict", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for c in comparison.changes:
        mark = "~" if c.modelled else ""
        verdict = {SLOWER: f"[bold red]{c.verdict}[/]", FASTER: f"[green]{c.verdict}[/]"}.get(c.verdict, c.verdict)
        change = "-" if c.change_percent is None else f"{c.change_percent:+.1f}"
        table.add_row(escape(c.row), escape(f"{c.label} ({c.unit})"), mark + _num(c.base), mark + _num(c.new),
                      change, "-" if c.p_value is None else f"{c.p_value:.2g}", verdict)
    return table


def compare_lines(comparison: Comparison, fail_on_slowdown: float | None) -> list[str]:
    lines = []
    for what, labels in (("only in base", comparison.only_in_base), ("only in new", comparison.only_in_new)):
        if labels:
            lines.append(f"{len(labels)} row(s) {what}, not compared: " + "; ".join(escape(x) for x in labels))
    slower = [c for c in comparison.changes if c.verdict == SLOWER]
    faster = [c for c in comparison.changes if c.verdict == FASTER]
    lines.append(f"{len(slower)} significant slowdown(s), {len(faster)} significant speed-up(s), "
                 f"{len(comparison.changes) - len(slower) - len(faster)} figure(s) not significant or without repeats to test")
    if fail_on_slowdown is not None:
        over = comparison.slowdowns_over(fail_on_slowdown)
        if over:
            worst = max(over, key=lambda c: c.slowdown_percent or 0.0)
            lines.append(f"[bold red]FAIL[/]: {len(over)} significant slowdown(s) over {fail_on_slowdown:g} %, worst "
                         f"{escape(worst.row)} {escape(worst.label)} {worst.slowdown_percent:+.1f} %")
        else:
            lines.append(f"[green]ok[/]: no significant slowdown over {fail_on_slowdown:g} %")
    return lines


def print_lines(out: Console, lines: list[str]) -> None:
    for line in lines:
        out.print(line)


def describe_skipped(skipped: list[Any]) -> str:
    return f"skipped {len(skipped)} JSON file(s) that are not hetbench results: " + ", ".join(map(str, skipped))
