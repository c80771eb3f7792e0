"""The terminal side of `hetbench report` and `hetbench compare`: a saved run's tables shown again with its
headline figures, one table of all runs per benchmark (its declared run figures), and the comparison of two runs."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hetbench.report import console as tables_as_printed
from hetbench.report.console import KEY, NUMBER, TEXT, FittedTable
from hetbench.report.compare import FASTER, ONE_VALUE, SLOWER, Comparison
from hetbench.report.figures import for_benchmark, headline
from hetbench.results.runs import Run


def headline_line(run: Run) -> str | None:
    """The run's headline figures in one line ("~" before a modelled one), or None where it declares none."""
    figures = headline(run.benchmark, run.document)
    if not figures:
        return None
    return "headline: " + "; ".join(f"{f.label} {f.text_with_unit}" for f in figures)


def show_run(out: Console, run: Run) -> None:
    """A saved run's tables as its command printed them (the one call into the commands' renderers, so a change of
    their signatures is met here alone), then its headline figures."""
    out.print(f"[bold]run {escape(run.run_id)}[/]  {escape(run.date_utc)}  {escape(run.command)}  "
              f"[dim]({escape(str(run.path))})[/]")
    out.file.flush()  # the commands' renderers print through their own console
    tables_as_printed.render_document(run.document)
    line = headline_line(run)
    if line is not None:
        out.print(line, markup=False)
    out.print()


def _devices_text(run: Run) -> str:
    return "\n".join(f"{rank}: {name}" + (" ~" if modelled else "") for rank, _, name, modelled in run.devices())


LIST_WHOLE = 24  # a figure that lists more than this many characters shows an entry a line
_FIGURE = re.compile(r"~?[-+]?(\d[\d.]*(e[-+]?\d+)?x?|inf|nan)|-")  # a figure as RunFigure.text writes it
# what goes first where the runs table does not fit its width: the command (the run's own header says it), its hosts,
# date and devices, then its rank map; then the figures, those that describe a run before those it measured, the
# last first; the run id and its checks never go
RUNS_CONTEXT = (("Run", KEY, None), ("Date (UTC)", KEY, 2), ("Host(s)", KEY, 1), ("Command", TEXT, 0),
                ("Rank map", KEY, 4), ("Devices", TEXT, 3))


def runs_table(benchmark: str, runs: list[Run]) -> Table:
    """One line per run: which run, where and how it ran, on which devices, and its key figures. It fits the width
    it is printed at (a FittedTable): a run id, a rank map or a figure is never cut or wrapped; the command and the
    devices wrap between words, and where the width is still short the least needed columns go, named below it."""
    modelled = any(m for run in runs for *_, m in run.devices())
    table = FittedTable(title=f"hetbench {benchmark}: {len(runs)} run(s)",
                        caption="~ modelled (simulated device), not measured" if modelled else None, show_lines=True,
                        dropped_note="the page of report --html shows every column")
    for name, kind, drop in RUNS_CONTEXT:
        table.add_column(name, kind=kind, drop=drop)
    key_titles: dict[str, None] = {}
    for run in runs:
        key_titles.update(dict.fromkeys(f.title for f in for_benchmark(run.benchmark).run_figures(run.document)
                                        if f.table))
    figures = []
    for run in runs:
        key = {f.title: f.text for f in for_benchmark(run.benchmark).run_figures(run.document) if f.table}
        figures.append([key.get(title, "-") for title in key_titles])
    # a figure that is a list ("allreduce/host 0.0122, allgather/host 0.00882") longer than LIST_WHOLE shows an
    # entry a line, each whole; a shorter one ("[28, 100]", "numpy, fsdp") stays on one line
    figures = [[t.replace(", ", ",\n") if len(t) > LIST_WHOLE else t for t in row] for row in figures]
    for position, title in enumerate(key_titles):
        # what describes the run (a shape, a strategy, the ops) goes before a measured figure, each the last first
        measured = all(_FIGURE.fullmatch(row[position]) for row in figures)
        table.add_column(title, justify="right", kind=NUMBER, drop=None if title == "checks" else
                         10 + 100 * measured + len(key_titles) - position)
    for run, row in zip(runs, figures):
        cells = [run.run_id, run.date_utc.replace("T", " ").removesuffix("+00:00"), "\n".join(run.hosts),
                 run.command, run.rank_map.replace(",", "\n"), _devices_text(run)]
        table.add_row(*[escape(c) for c in cells + row])
    return table


def _num(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:.0f}"


def compare_table(comparison: Comparison) -> Table:
    """Each compared figure, a line each. It fits the width it is printed at (a FittedTable): the figures are never
    cut or wrapped; the row, the figure's name and the verdict wrap between words; where that is not enough the p
    value goes (the verdict says what it decided), named below the table."""
    table = FittedTable(title=f"hetbench compare ({comparison.benchmark}): {comparison.base_path} -> "
                              f"{comparison.new_path}",
                        caption="change = (new - base) / base of the medians; significance: Welch's t-test on the raw "
                                f"repeats, 95 % ({ONE_VALUE}: one value a run, no repeats to test); ~ modelled "
                                "(simulated device)", dropped_note="--json has every field")
    # where the width is short the verdict is kept whole first, then the figure's name, then the row's
    columns = (("Row", "left", TEXT, None, 2), ("Figure", "left", TEXT, None, 1),
               ("Base", "right", NUMBER, None, None), ("New", "right", NUMBER, None, None),
               ("Change (%)", "right", NUMBER, None, None), ("p", "right", NUMBER, 0, None),
               ("Verdict", "left", TEXT, None, 0))
    for name, justify, kind, drop, grow in columns:
        table.add_column(name, justify=justify, kind=kind, drop=drop, grow=grow)  # type: ignore[arg-type]
    for c in comparison.changes:
        mark = "~" if c.modelled else ""
        verdict = {SLOWER: f"[bold red]{c.verdict}[/]", FASTER: f"[green]{c.verdict}[/]"}.get(c.verdict, c.verdict)
        change = "-" if c.change_percent is None else f"{c.change_percent:+.1f}"
        figure = f"{c.label} ({c.unit})" if c.unit else c.label
        table.add_row(escape(c.row), escape(figure), mark + _num(c.base), mark + _num(c.new),
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
                 f"{len(comparison.changes) - len(slower) - len(faster)} figure(s) not significant or without repeats "
                 "to test")
    single = [c for c in comparison.changes if c.verdict == ONE_VALUE]
    if single:
        lines.append(f"{len(single)} figure(s) ({', '.join(dict.fromkeys(escape(c.label) for c in single))}) are one "
                     "value a run in the results files, no repeats: their change is shown without a significance "
                     "verdict")
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
