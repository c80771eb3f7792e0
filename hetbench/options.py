"""The options every benchmark command shares (--backend, --out, --csv, --json, --progress, --wide), added by the
driver, and the parsing of the backend map they carry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from hetbench.config import parse_backend_map

BACKEND_HELP = (
    "Where each rank computes: auto, host, opencl[:INDEX], cupy[:INDEX], sim:MODEL[:INDEX], or a rank map such as "
    "0=cupy,1=opencl,2=sim:mi300x (ranks it leaves out use auto). auto takes a CuPy GPU, then an OpenCL GPU, then "
    "the host CPU. Without an index, ranks on one node take different devices by local rank."
)


def common_options(command: str) -> list[click.Parameter]:
    """The shared options, in the order --help lists them after the benchmark's own."""
    return [
        click.Option(["--progress/--no-progress"], default=None,
                     help="A progress bar on stderr while the run goes. Default: when stderr is a terminal; under "
                          "mpiexec, which hands rank output on through pipes, give --progress to see it."),
        click.Option(["--wide"], is_flag=True,
                     help="Show every column of the tables. The default tables fit 100 columns."),
        click.Option(["--backend", "backend"], default="auto", show_default=True, metavar="SPEC", help=BACKEND_HELP),
        click.Option(["--out", "out_json"], type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help=f"Write the JSON results document here. Default: results/{command}-<UTC time>.json "
                          "(and a .csv beside it) unless --csv alone is given."),
        click.Option(["--csv", "out_csv"], type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Write the rows as CSV here. Default: next to --out."),
        click.Option(["--json", "json_stdout"], is_flag=True,
                     help="Print the results document as JSON on stdout and nothing else."),
    ]


def parse_backends(world: Any, text: str) -> tuple:
    try:
        return tuple(parse_backend_map(text, world.size))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--backend'") from None
