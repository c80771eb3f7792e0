"""`hetbench report`: saved runs shown again with their headline figures, one table of all runs per benchmark, and
on request a merged CSV, the plots (PNG and SVG) and one self-contained HTML page that opens with a summary of the
runs. What each benchmark shows is its declared presentation (hetbench/benchmarks/<name>/present.py)."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path
from typing import Any

import click

from hetbench.options import FolderPath, output_file
from hetbench.outputs import check_distinct_outputs
from hetbench.report.html import page
from hetbench.report.plots import Plot, PlottingUnavailable, plots_for_runs
from hetbench.results import ResultsFileError, check_writable
from hetbench.results.io import commit, csv_text, discard, folder_problem, format_for, stage_as
from hetbench.results.runs import NoResultsError, find_results, merged_rows


def plots_dir_error(path: Path) -> str | None:
    """Why the plots folder cannot be used, or None. A missing folder is made (with its parents)."""
    return folder_problem(path, "--plots")


@click.command(short_help="Show saved runs again with their headline figures; write plots, one HTML page and a "
                          "merged CSV.")
@click.argument("results", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--html", "html_path", type=output_file(dir_okay=True), default=None,
              help="Write one self-contained HTML page (a summary of the runs, then tables and plots; no network "
                   "needed) here.")
@click.option("--plots", "plots_dir", type=FolderPath(), default=None,
              help="Write every plot here as PNG and SVG (the folder is made if missing).")
@click.option("--csv", "csv_path", type=output_file(dir_okay=True), default=None,
              help="Write every run's rows here as one CSV, each row with its run's columns "
                   "(run_id, benchmark, date_utc, command, ranks, hosts, rank_map, source_file).")
@click.option("--brief", is_flag=True, help="Show only the table of all runs per benchmark, not each run's tables.")
def report(results: tuple[Path, ...], html_path: Path | None, plots_dir: Path | None, csv_path: Path | None,
           brief: bool) -> int:
    """Show saved runs (RESULTS: hetbench JSON files, or folders of them) again, each with its headline figures,
    side by side; write plots, an HTML page (a summary of the runs first, then every benchmark's tables and plots)
    and a merged CSV. Plots and the page need matplotlib: pip install 'hetbench[report]'."""
    try:
        runs, skipped = find_results(results)
    except (ResultsFileError, NoResultsError) as e:
        raise click.UsageError(str(e)) from None
    _check_outputs(runs, html_path, csv_path, plots_dir)
    _check_shapes(runs)
    plots = _plots(runs) if html_path is not None or plots_dir is not None else []
    # everything is made in memory first; files are written only once all of it exists
    files = _files(runs, plots, html_path, plots_dir, csv_path)

    from hetbench.report.console import console  # rich: loaded only when a report is shown

    out = console()
    _show(out, runs, skipped, brief)
    _write(files, plots_dir)
    if plots_dir is not None:
        out.print(f"plots written to: {plots_dir}/ ({len(plots)} plot(s), PNG and SVG)", markup=False)
    for path, what in ((csv_path, "merged CSV"), (html_path, "report page")):
        if path is not None:
            out.print(f"{what} written to: {path}", markup=False)
    sys.stdout.flush()
    return 0


def _check_outputs(runs: list, html_path: Path | None, csv_path: Path | None, plots_dir: Path | None) -> None:
    """A usage error naming every output that cannot be written: two options on one path, an output that is one
    of the results files read, a file or folder that cannot be written."""
    inputs = {os.path.realpath(run.path) for run in runs}
    errors = []
    check_distinct_outputs({"--html": html_path, "--csv": csv_path})
    for path, what in ((html_path, "--html"), (csv_path, "--csv")):
        if path is None:
            continue
        if os.path.realpath(path) in inputs:
            errors.append(f"{what} {str(path)!r} is one of the results files read; give another path")
        else:
            errors += [e for e in [check_writable(path, what)] if e]
    if plots_dir is not None:
        errors += [e for e in [plots_dir_error(plots_dir)] if e]
    if errors:
        raise click.UsageError("; ".join(errors))


def _plots(runs: list) -> list[Plot]:
    """Every plot of the runs; a usage error where matplotlib is missing."""
    try:
        return plots_for_runs(runs)
    except PlottingUnavailable as e:
        raise click.UsageError(str(e)) from None


def _files(runs: list, plots: list[Plot], html_path: Path | None, plots_dir: Path | None,
           csv_path: Path | None) -> list[tuple[Path, str | bytes]]:
    """(path, content) of every file asked for, made in memory: the merged CSV, each plot as PNG and SVG, the
    page."""
    files: list[tuple[Path, str | bytes]] = []
    if csv_path is not None:
        files.append((csv_path, csv_text(merged_rows(runs))))
    if plots_dir is not None:
        for plot in plots:
            files.append((plots_dir / f"{plot.id}.png", plot.render("png", dpi=150)))
            files.append((plots_dir / f"{plot.id}.svg", plot.render("svg")))
    if html_path is not None:
        files.append((html_path, page(runs, plots)))
    return files


def _show(out: Any, runs: list, skipped: Any, brief: bool) -> None:
    """The note on the files skipped (stderr), each run's tables unless `brief`, then one table of all runs per
    benchmark."""
    from hetbench.report.console import print_table  # rich, as in report
    from hetbench.report.tables import describe_skipped, runs_table, show_run  # rich, likewise

    if skipped:
        click.echo("note: " + describe_skipped(skipped), err=True)
    if not brief:
        for run in runs:
            show_run(out, run)
    by_benchmark: dict[str, list] = {}
    for run in runs:
        by_benchmark.setdefault(run.benchmark, []).append(run)
    for benchmark, group in by_benchmark.items():
        print_table(out, runs_table(benchmark, group))


def _write(files: list[tuple[Path, str | bytes]], plots_dir: Path | None) -> None:
    """Every file staged beside its target first, then all put in place together: all of them or none."""
    if plots_dir is not None:
        plots_dir.mkdir(parents=True, exist_ok=True)
    staged = []
    try:
        for path, content in files:
            staged.append(stage_as(format_for(path, content), path, content))
    except BaseException:
        discard(staged)
        raise
    commit(staged)


# what reading a document of another shape than hetbench writes raises (a field missing, of another type)
SHAPE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError)


def _check_shapes(runs: list) -> None:
    """Every run rendered once, out of sight, before anything is printed or written: a document that passed the
    schema check but whose rows or summary lack what its benchmark's tables read is one line naming the file
    (exit 2), not a failure half-way through the output."""
    from hetbench.report.console import console  # rich, as in report
    from hetbench.report.tables import runs_table, show_run  # rich, likewise

    for run in runs:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                out = console()
                show_run(out, run)
                out.print(runs_table(run.benchmark, [run]))
        except SHAPE_ERRORS as e:
            raise click.UsageError(f"results file {str(run.path)!r} is not of the shape hetbench writes for "
                                   f"{run.benchmark}: {type(e).__name__}: {e}") from None

