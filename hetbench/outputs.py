"""Where a run's results go: output paths chosen and checked before any computing, errors agreed over every rank,
and every output of a run staged and committed together (or none)."""

from __future__ import annotations

import datetime as _dt
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

from hetbench.backends.base import BACKEND_NAMES
from hetbench.benchmarks.base import columns_of
from hetbench.comm.world import RankError, World
from hetbench.config import OutputConfig
from hetbench.results import check_writable
from hetbench.results.io import StagedFile, commit, discard, stage_as, stage_csv, stage_json, to_json
from hetbench.results.runs import csv_rows

DEFAULT_RESULTS_DIR = Path("results")

@dataclass(frozen=True)
class DefaultOutputConfig(OutputConfig):
    """Output names hetbench chose (results/<command>-<UTC time>): created new, never replacing a file; a name
    taken meanwhile gives way to the next free one (see `emit`). Recorded like any OutputConfig."""


def same_file(a: Path | str, b: Path | str) -> bool:
    """Whether two paths name one file, however spelled (./r.json, a linked folder, a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_distinct_outputs(paths: dict[str, Path | None]) -> None:
    """Two outputs named the same file (however spelled: ./r.json, a linked folder, a hard link) would keep only
    one of them: a usage error naming both options."""
    seen: list[tuple[str, Path]] = []
    for option, path in paths.items():
        if path is None:
            continue
        for other, other_path in seen:
            if same_file(path, other_path):
                raise click.UsageError(f"{other} {str(other_path)!r} and {option} {str(path)!r} name the same file; "
                                       "give each output its own path")
        seen.append((option, path))


def overwritten_inputs(outputs: dict[str, Path | None], inputs: dict[str, Path | str | None]) -> list[str]:
    """An output that names one of the files the run reads (--out a.npy with --a a.npy) would replace it: why, for
    each such pair (however spelled: a link, a hard link)."""
    errors = []
    for option, path in outputs.items():
        if path is None:
            continue
        for source, input_path in inputs.items():
            if input_path is None:
                continue
            if same_file(path, input_path):
                errors.append(f"{option} {str(path)!r} is the file {source} {str(input_path)!r} reads: it would "
                              "be replaced; give the output another path")
                break  # one line for an output, whichever inputs it names
    return errors


def resolve_outputs(command: str, out_json: Path | None, out_csv: Path | None, json_stdout: bool,
                    stamp: str) -> OutputConfig:
    """Explicit paths win; with none, both files go to results/ under one name stamped with the UTC time (to the
    microsecond), and are created new: a run never replaces another's files (see `emit`)."""
    check_distinct_outputs({"--out": out_json, "--csv": out_csv})
    if out_json is None and out_csv is None:
        stem = f"{command}-{stamp}"
        return DefaultOutputConfig(DEFAULT_RESULTS_DIR / f"{stem}.json", DEFAULT_RESULTS_DIR / f"{stem}.csv",
                                   json_stdout)
    return OutputConfig(out_json, out_csv, json_stdout)


def utc_stamp() -> str:
    """The UTC time to the microsecond, e.g. 20261122T014415.123456Z: runs started in one second differ."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")


def output_path_errors(output: OutputConfig) -> list[str]:
    """Rank 0 writes the results files: it checks their paths before any computing. The default folder is made."""
    errors = []
    if isinstance(output, DefaultOutputConfig):  # one folder for both: one cause, said once
        folder = DEFAULT_RESULTS_DIR
        if os.path.lexists(folder) and not folder.is_dir():
            return [f"the default results folder {str(folder)!r} is not a folder; move it away, or name the outputs "
                    "with --out and --csv"]
        if not folder.exists():
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                return [f"cannot make the results folder {str(folder)!r}: {e.strerror}"]
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


def _numbered(path: Path, number: int) -> Path:
    """results/matmul-STAMP.json, then results/matmul-STAMP-2.json, -3, ...: the names to try in turn."""
    if number <= 1:
        return path
    stem = path.name[: len(path.name) - len(path.suffix)]
    return path.with_name(f"{stem}-{number}{path.suffix}")


def _stage_results(document: dict[str, Any], output: OutputConfig, first: int) -> tuple[list[StagedFile], int]:
    """Stage the JSON and CSV. Default names take the first number >= `first` whose files do not exist yet (the
    document records the names it gets). Raises _WriteError naming the file that could not be written."""
    number = first
    new_only = isinstance(output, DefaultOutputConfig)
    if new_only:
        while any(p is not None and os.path.lexists(_numbered(p, number)) for p in (output.out_json, output.out_csv)):
            number += 1
    out_json = _numbered(output.out_json, number) if output.out_json is not None else None
    out_csv = _numbered(output.out_csv, number) if output.out_csv is not None else None
    recorded = document.get("config", {}).get("output")
    if isinstance(recorded, dict) and number > 1:
        recorded.update(out_json=str(out_json) if out_json else None, out_csv=str(out_csv) if out_csv else None)
    staged: list[StagedFile] = []
    try:
        if out_json is not None:
            staged.append(_staged("results file", out_json, lambda: stage_json(out_json, document, new_only)))
        if out_csv is not None:
            rows, order = csv_rows(document, csv_order(document))
            staged.append(_staged("results file", out_csv, lambda: stage_csv(out_csv, rows, new_only, order)))
    except BaseException:
        discard(staged)
        raise
    return staged, number


class _WriteError(Exception):
    """An output that could not be written; the message names it (exit code 1: the run was fine, the disk not)."""


def _staged(what: str, path: Path, make: Callable[[], StagedFile]) -> StagedFile:
    try:
        return make()
    except OSError as e:
        raise _WriteError(f"cannot write {what} {str(path)!r}: {e.strerror or e}; no output was written") from None


def _commit(staged: list[StagedFile], files: list[tuple[str, Path, Any]],
            outcome: str = "no output was written") -> None:
    try:
        commit(staged)
    except FileExistsError:
        raise
    except OSError as e:
        what = next((f"{option} file" for option, path, _ in files if e.filename == str(path)), "results file")
        raise _WriteError(f"cannot write {what} {e.filename!r}: {e.strerror or e}; {outcome}") from None


def emit(world: World, document: dict[str, Any] | None, output: OutputConfig, render: Callable[[], None] | None,
         files: list[tuple[str, Path, Any]] | None = None) -> None:
    """Collective. Write the run's outputs, all or none: rank 0's JSON and CSV, and this rank's `files` (option,
    path, array: e.g. matmul's --save file at the root) as .npy, are each staged beside their targets; only when
    every rank staged its own do they go in place, rank 0's first. If any cannot be written, no target is touched,
    every rank raises the same error (exit 1: the run was right, the disk was not) and nothing is shown. Then rank 0
    shows the result: the table, or the JSON alone with --json."""
    files = files or []
    # this rank's files staged, not yet in place; the steps below fill and empty it in place, so that whatever is
    # still in it when any of them raises is discarded here
    pending: list[StagedFile] = []
    try:
        written, number = _stage_everywhere(world, document, output, files, pending)
        error = None
        if world.is_root:
            written, error = _commit_root(document, output, files, pending, written, number)  # type: ignore[arg-type]
        error = world.bcast(error) if world.size > 1 else error
        if error:
            raise click.ClickException(error)
        _commit_others(world, files, pending)
    except BaseException:
        discard(pending)
        raise
    _show(world, document, output, render, written)


def _stage_save(files: list[tuple[str, Path, Any]]) -> list[StagedFile]:
    """Stage this rank's `files`: an array as .npy, text as it is (e.g. train's --log); all or none."""
    staged_files: list[StagedFile] = []
    try:
        for option, path, content in files:
            staged_files.append(_staged(f"{option} file", path, lambda: (  # noqa: B023
                stage_as("text" if isinstance(content, str) else "npy", path, content))))
    except BaseException:
        discard(staged_files)
        raise
    return staged_files


def _stage_everywhere(world: World, document: dict[str, Any] | None, output: OutputConfig,
                      files: list[tuple[str, Path, Any]], pending: list[StagedFile]) -> tuple[list[Path], int]:
    """Collective. Stage this rank's files into `pending` (rank 0's JSON and CSV too); where any rank could not,
    every rank raises the same error. Rank 0's results files and the number their default names took."""
    errors = []
    number = 1
    written: list[Path] = []
    try:
        pending[:] = _stage_save(files)
        if world.is_root and document is not None:
            results, number = _stage_results(document, output, number)
            pending += results
            written = [f.target for f in results]
    except _WriteError as e:
        errors.append(str(e))
    agreed = world.agree(errors)
    if agreed:
        raise click.ClickException(format_rank_errors(world, agreed))
    return written, number


def _commit_root(document: dict[str, Any], output: OutputConfig, files: list[tuple[str, Path, Any]],
                 pending: list[StagedFile], written: list[Path], number: int) -> tuple[list[Path], str | None]:
    """Rank 0 puts its staged files in place, `pending` emptied after. A default name can have been taken by
    another run since it was staged: then everything is staged again under the next free name (a failed commit
    leaves nothing behind). (the results files written, the error that stopped it or None)"""
    error = None
    try:
        for attempt in range(100):
            try:
                _commit(pending, files)
                break
            except FileExistsError:
                if attempt == 99:
                    raise _WriteError(f"cannot write results file {str(output.out_json)!r}: every free "
                                      "name was taken meanwhile; no output was written") from None
                pending[:] = _stage_save(files)
                results, number = _stage_results(document, output, number + 1)
                pending += results
                written = [f.target for f in results]
    except _WriteError as e:
        error = str(e)
        discard(pending)
    pending.clear()
    return written, error


def _commit_others(world: World, files: list[tuple[str, Path, Any]], pending: list[StagedFile]) -> None:
    """Collective, after rank 0's are in place: the files of a rank other than rank 0 (matmul's --save at another
    root) go in place, `pending` emptied after; where any rank could not, every rank raises the same error."""
    errors = []
    if pending:
        try:
            _commit(pending, files, "the results files were written")
        except _WriteError as e:
            errors.append(str(e))
        pending.clear()
    if world.size > 1:
        agreed = world.agree(errors)
        if agreed:
            raise click.ClickException(format_rank_errors(world, agreed))


def _show(world: World, document: dict[str, Any] | None, output: OutputConfig, render: Callable[[], None] | None,
          written: list[Path]) -> None:
    """Rank 0 shows the result: the JSON alone with --json, else the table and the results files written."""
    if not world.is_root:
        return
    if output.json_stdout:
        click.echo(to_json(document), nl=False)  # type: ignore[arg-type]
        return
    assert render is not None
    render()
    from hetbench.report.console import console  # rich: not loaded by a command that prints no table

    if written:
        console().print("results written to: " + ", ".join(map(str, written)))


def csv_order(document: dict[str, Any]) -> list[str]:
    """The CSV's leading columns: the benchmark's declared columns, in their order (the run columns come last, see
    `results.runs.csv_rows`)."""
    return [c.key for c in columns_of(document["schema"].removeprefix("hetbench.")) if not c.derived]
