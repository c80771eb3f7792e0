"""What every command shares: the backend and output options, agreement on errors, and handing results on."""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Any, Callable

import click

from hetbench.backends.base import BACKEND_NAMES
from hetbench.comm.world import RankError, World
from hetbench.config import OutputConfig, parse_backend_map
from hetbench.results import check_writable, write_csv_atomic, write_json_atomic
from hetbench.results.io import to_json

DEFAULT_RESULTS_DIR = Path("results")

BACKEND_HELP = (
    "Where each rank computes: auto, host, opencl[:INDEX], cupy[:INDEX], sim:MODEL[:INDEX], or a rank map such as "
    "0=cupy,1=opencl,2=sim:mi300x (ranks it leaves out use auto). auto takes a CuPy GPU, then an OpenCL GPU, then "
    "the host CPU. Without an index, ranks on one node take different devices by local rank."
)


def backend_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--backend", "backend", default="auto", show_default=True, metavar="SPEC", help=BACKEND_HELP)(f)


def output_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--json", "json_stdout", is_flag=True,
                     help="Print the results document as JSON on stdout and nothing else.")(f)
    f = click.option("--csv", "out_csv", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Write one CSV row per rank (or per op and size) here. Default: next to --out.")(f)
    f = click.option("--out", "out_json", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Write the JSON results document here. Default: results/<command>-<UTC time>.json "
                          "(and a .csv beside it) unless --csv alone is given.")(f)
    return f


def resolve_outputs(command: str, out_json: Path | None, out_csv: Path | None, json_stdout: bool,
                    stamp: str) -> OutputConfig:
    """Explicit paths win; with none, both files go to results/ under one name stamped with the UTC time."""
    if out_json is None and out_csv is None:
        stem = DEFAULT_RESULTS_DIR / f"{command}-{stamp}"
        return OutputConfig(stem.with_suffix(".json"), stem.with_suffix(".csv"), json_stdout)
    return OutputConfig(out_json, out_csv, json_stdout)


def utc_stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def parse_backends(world: World, text: str) -> tuple:
    try:
        return tuple(parse_backend_map(text, world.size))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--backend'") from None


def output_path_errors(output: OutputConfig) -> list[str]:
    """Rank 0 writes the results files: it checks their paths before any computing. The default folder is made."""
    errors = []
    for path, what in ((output.out_json, "--out"), (output.out_csv, "--csv")):
        if path is None:
            continue
        if path.parent == DEFAULT_RESULTS_DIR and not path.parent.exists():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                errors.append(f"cannot make the results folder {str(path.parent)!r}: {e.strerror}")
                continue
        error = check_writable(path, what)
        if error:
            errors.append(error)
    return errors


# a device as messages name it, e.g. sim:1 or opencl:0: ranks on one node name different ones in the same words
_DEVICE_LABEL = re.compile(rf"\b({'|'.join(BACKEND_NAMES)}):([0-9]+)\b")


def _merge_device_indices(messages: list[str]) -> str:
    """Messages alike but for their devices' indices, as one: `sim:0`, `sim:1` -> `sim:0,1`."""
    if len(set(messages)) == 1:
        return messages[0]
    found = [_DEVICE_LABEL.findall(m) for m in messages]
    position = iter(range(len(found[0])))

    def merged(match: re.Match[str]) -> str:
        i = next(position)
        indices = sorted({int(labels[i][1]) for labels in found})
        return f"{match.group(1)}:{','.join(map(str, indices))}"

    return _DEVICE_LABEL.sub(merged, messages[0])


def format_rank_errors(world: World, errors: list[RankError]) -> str:
    """One line per distinct message; a message every rank had is not repeated per rank, and messages that differ
    only in the index of the device they name are one line naming every index."""
    by_message: dict[str, list[RankError]] = {}
    for e in errors:
        by_message.setdefault(_DEVICE_LABEL.sub(r"\1:#", e.message), []).append(e)
    lines = []
    for where in by_message.values():
        message = _merge_device_indices([e.message for e in where])
        ranks = sorted({e.rank for e in where})
        if world.size == 1 or len(ranks) == world.size:
            lines.append(message)
        else:
            hosts = sorted({e.host for e in where})
            lines.append(f"rank {','.join(map(str, ranks))} ({','.join(hosts)}): {message}")
    return "\n       ".join(lines)


def agree_or_exit(world: World, local_errors: list[str]) -> None:
    """Collective: if any rank has an error, every rank raises the same usage error (exit 2)."""
    errors = world.agree(local_errors)
    if errors:
        raise click.UsageError(format_rank_errors(world, errors))


def emit(world: World, document: dict[str, Any], output: OutputConfig, render: Callable[[], None]) -> None:
    """Rank 0 writes the files (atomically) and shows the result: the table, or the JSON alone with --json."""
    if not world.is_root:
        return
    if output.out_json is not None:
        write_json_atomic(output.out_json, document)
    if output.out_csv is not None:
        write_csv_atomic(output.out_csv, document["rows"])
    if output.json_stdout:
        click.echo(to_json(document), nl=False)
        return
    render()
    from hetbench.report.console import console

    written = [str(p) for p in (output.out_json, output.out_csv) if p is not None]
    if written:
        console().print("results written to: " + ", ".join(written))
