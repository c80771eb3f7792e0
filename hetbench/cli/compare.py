"""`hetbench compare BASE NEW`: the change of each key figure between two runs of one benchmark, row by row,
with whether it is significant (Welch's t-test on the raw repeats, 95 %), and an exit code for CI."""

from __future__ import annotations

from pathlib import Path

import click

from hetbench.benchmarks.base import REGISTRY
from hetbench.options import float_range
from hetbench.report.compare import compare_documents, compared_rows
from hetbench.report.figures import for_benchmark
from hetbench.results import ResultsFileError, load_results
from hetbench.results.io import to_json


@click.command(short_help="Compare two results files of one benchmark: each key figure's change and whether it is "
                          "significant (Welch's t-test).")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option("--fail-on-slowdown", "fail_on_slowdown", type=float_range(min=0), default=None, metavar="PCT",
              help="Exit with code 1 when any significant slowdown exceeds PCT percent (a time that grows, or a "
                   "rate that falls, by that much).")
@click.option("--json", "json_stdout", is_flag=True, help="Print the comparison as JSON on stdout and nothing else.")
def compare(base: Path, new: Path, fail_on_slowdown: float | None, json_stdout: bool) -> int:
    """Compare two results files of one benchmark: BASE (before) and NEW (after). Each figure with repeats in the
    files (a matmul's GEMMs, a collective's iterations, a split's or a training run's steps, a calibration's GEMMs)
    is tested for significance; one held once per run gets its change alone."""
    documents = []
    for path in (base, new):
        if path.is_dir():
            raise click.UsageError(f"{str(path)!r} is a folder; compare takes two results files")
        try:
            documents.append(load_results(path))
        except ResultsFileError as e:
            raise click.UsageError(str(e)) from None
    schemas = [d["schema"] for d in documents]
    if schemas[0] != schemas[1]:
        raise click.UsageError(f"{str(base)!r} is a {schemas[0]} run but {str(new)!r} is a {schemas[1]} run; "
                               "compare takes two runs of one benchmark")
    benchmark = schemas[0].removeprefix("hetbench.")
    presentation = for_benchmark(benchmark)
    compared = compared_rows(presentation)
    if not compared:
        comparable = [name for name in REGISTRY if compared_rows(for_benchmark(name))]
        raise click.UsageError(f"{str(base)!r}: this hetbench cannot compare {schemas[0]} runs "
                               f"(it compares {', '.join(comparable)})")
    comparison = compare_documents(presentation, documents[0], documents[1], str(base), str(new))
    if not comparison.changes:
        matched = "; ".join(", ".join(rows.match) for rows in compared)
        raise click.UsageError(f"no row of {str(new)!r} matches a row of {str(base)!r} (rows are matched on "
                               f"{matched}): they measured different things")
    failed = fail_on_slowdown is not None and bool(comparison.slowdowns_over(fail_on_slowdown))

    if json_stdout:
        document = comparison.to_dict()
        document["fail_on_slowdown_percent"] = fail_on_slowdown
        document["failed"] = failed
        click.echo(to_json(document), nl=False)
    else:
        from hetbench.report.console import console, print_table  # rich: loaded only to print a table
        from hetbench.report.tables import compare_lines, compare_table, print_lines  # rich, likewise

        out = console()
        print_table(out, compare_table(comparison))
        print_lines(out, compare_lines(comparison, fail_on_slowdown))
    return 1 if failed else 0
