"""Writing results atomically and reading them back.

Each output is staged (written in full to a temporary file in its folder and fsynced), then all of a run's outputs
are committed together (renamed into place) once every one of them was staged; a file that must be new is linked
in, so it can never take the place of another run's file."""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import math
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from hetbench.results.schema import REQUIRED_KEYS, SCHEMA_VERSION, UnreadableVersion, csv_row, upgrade


class ResultsFileError(ValueError):
    """A results file that is missing, unreadable or not of hetbench's schema."""

    def __init__(self, message: str, not_hetbench: bool = False) -> None:
        super().__init__(message)
        self.not_hetbench = not_hetbench  # well-formed JSON that is simply not a hetbench results document


def _kind_of(mode: int) -> str | None:
    """What a path that is not a regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def check_writable(path: Path | str, what: str) -> str | None:
    """Why `path` cannot be written, or None. Checked before any computing so no work is lost to a bad path: a
    file is made in its folder and removed again, as the staged copy will be.

    A result replaces its target by a rename, so the target must be a regular file or not exist yet: a symbolic
    link, a device (/dev/null), a FIFO or a socket would be replaced by a regular file, and is refused."""
    path = Path(path)
    try:
        mode: int | None = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError:
        mode = None  # e.g. a parent that is a file: said below
    if mode is not None and stat.S_ISDIR(mode):
        return f"{what} {str(path)!r} is a directory; give a file path"
    if mode is not None and not stat.S_ISREG(mode):
        return (f"{what} {str(path)!r} is {_kind_of(mode)}, not a regular file; results are written to a new or "
                "regular file only (a rename would replace it)")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        return f"{what} {str(path)!r} cannot be written: folder {str(parent)!r} does not exist"
    if not parent.is_dir():
        return f"{what} {str(path)!r} cannot be written: {str(parent)!r} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{what} {str(path)!r} cannot be written: no write permission in folder {str(parent)!r}"
    if mode is not None and not os.access(path, os.W_OK):
        return f"{what} {str(path)!r} cannot be written: the file is read-only"
    name_bytes, name_max = len(os.fsencode(path.name)), _name_max(parent)
    if name_bytes + STAGED_NAME_EXTRA > name_max:
        return (f"{what} {str(path)!r} cannot be written: its name is {name_bytes} bytes, and the file system takes "
                f"names of up to {name_max}, less {STAGED_NAME_EXTRA} for the copy staged beside it")
    # permissions do not tell it all (/proc, a read-only mount, a folder that takes no new files): the file is
    # staged beside its target, so make one there and take it away again
    try:
        fd, probe = tempfile.mkstemp(prefix=".hetbench-probe-", suffix=".tmp", dir=parent)
    except OSError as e:
        return (f"{what} {str(path)!r} cannot be written: no file can be made in folder {str(parent)!r} "
                f"({e.strerror or e})")
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


# what stage() adds to a target's name for its temporary file: "." + name + "." + 8 random characters + ".tmp",
# and room for a default name's "-N" where one was taken
STAGED_NAME_EXTRA = 1 + 1 + 8 + 4 + 4


def folder_problem(path: Path | str, what: str) -> str | None:
    """Why `path` cannot be used as a folder that a command writes into (made, with its parents, where missing),
    or None. Checked before any computing: a symbolic link loop, something not a folder in its place or above it,
    a name longer than the file system takes, and a folder in which (or, missing, above which) no file can be made:
    that is tried, as permissions alone miss /proc, a read-only mount, and root passes every permission check."""
    import secrets

    path = Path(path)
    try:
        os.stat(path)
    except FileNotFoundError:
        pass
    except OSError as e:  # ELOOP: a symbolic link loop; ENOTDIR: a file where a folder should be; ENAMETOOLONG
        if e.errno == errno.ELOOP:
            return f"{what} {str(path)!r} is a symbolic link loop"
        if e.errno not in (errno.ENOTDIR, errno.ENAMETOOLONG):  # those two are said below, with what is wrong
            return f"{what} {str(path)!r} cannot be used: {e.strerror or e}"
    existing = next((p for p in [path, *path.parents] if os.path.lexists(p)), Path("."))
    if existing == path and not path.is_dir():
        return f"{what} {str(path)!r} is not a folder"
    if not existing.is_dir():
        return f"{what} {str(path)!r} cannot be made: {str(existing)!r} is not a folder"
    missing = path.absolute().relative_to(existing.absolute()).parts if existing != path else ()
    name_max = _name_max(existing)
    too_long = [name for name in missing if len(os.fsencode(name)) > name_max]
    if too_long:
        return (f"{what} {str(path)!r} cannot be made: the name {too_long[0][:40]!r}... is "
                f"{len(os.fsencode(too_long[0]))} bytes, and the file system takes names of up to {name_max}")
    probe = existing / f".hetbench-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        probe.mkdir()
    except OSError as e:
        where = "written" if existing == path else "made"
        return f"{what} {str(path)!r} cannot be {where}: no folder can be made in {str(existing)!r} ({e.strerror or e})"
    with contextlib.suppress(OSError):
        probe.rmdir()
    return None


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) the file system of `folder` takes; 255 where it does not say."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255


def _umask() -> int:
    """The process's umask, read without changing it where /proc tells it."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@dataclass
class StagedFile:
    """A file written in full (and fsynced) beside its target, not yet in place: commit() or discard() it."""

    target: Path
    temp: Path
    exclusive: bool  # never replace an existing file: the target must not exist when committed


def stage(path: Path | str, write: Callable[[Any], None], binary: bool = False,
          exclusive: bool = False) -> StagedFile:
    """Write a temporary file in `path`'s folder with `write(f)`, flushed and fsynced, with the mode the target
    will have: an existing target's own mode, or 0666 less the umask for a new one (mkstemp alone makes 0600).

    Raises OSError (and leaves no temporary file) if anything fails, or if `path` is not a regular file; its
    `filename` is the target's where the failing call named none (a write, flush or fsync on a full disk)."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    existing = None
    with contextlib.suppress(FileNotFoundError):
        existing = os.lstat(path)
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise OSError(errno.EINVAL, f"it is {_kind_of(existing.st_mode)}, not a regular file", str(path))
    if existing is not None and not exclusive:
        mode = stat.S_IMODE(existing.st_mode)
    else:
        mode = 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as e:  # it names the staged copy's random name: the user gave the target's
        e.filename = str(path)
        raise
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": ""})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:  # a full disk's flush or fsync names no file: the target
            e.filename = str(path)
        raise
    return StagedFile(path, Path(tmp), exclusive)


def discard(staged: Iterable[StagedFile]) -> None:
    """Remove staged files that will not be committed; their targets are untouched."""
    for s in staged:
        with contextlib.suppress(OSError):
            os.unlink(s.temp)


def fsync_folder(folder: Path) -> None:
    """Make a folder's entries (a rename into it) durable, where the file system allows."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _link_new(s: StagedFile) -> None:
    """Put a staged file in place only if its target does not exist (FileExistsError if it does)."""
    try:
        os.link(s.temp, s.target)
    except FileExistsError:
        raise
    except OSError:
        # a file system without hard links: reserve the name exclusively, then rename over our own empty file
        fd = os.open(s.target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.replace(s.temp, s.target)
        return
    os.unlink(s.temp)


def _replace(s: StagedFile) -> Path | None:
    """Rename a staged file over its target; returns a hard link to the target's old content (to restore it if a
    later output fails), or None where there was none (or the file system has no hard links)."""
    backup = None
    try:
        mode = os.lstat(s.target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        # checked again at the last moment: a rename must never replace a link or a device
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"it is {_kind_of(mode)}, not a regular file", str(s.target))
        backup = s.temp.with_name(s.temp.name[: -len(".tmp")] + ".old.tmp")
        try:
            os.link(s.target, backup)
        except OSError:
            backup = None
    try:
        os.replace(s.temp, s.target)
    except BaseException:
        if backup is not None:
            with contextlib.suppress(OSError):
                os.unlink(backup)
        raise
    return backup


def commit(staged: list[StagedFile]) -> None:
    """Put every staged file in place, all or none. The files that must be new are linked in first (the step that
    fails when another run took the name meanwhile), then the others are renamed over their targets (each rename
    atomic). If one fails, those already in place are taken back out (new ones removed, replaced ones restored
    from a hard link to their old content), no temporary file is left, and the OSError is raised with the failing
    target in `filename`."""
    done: list[tuple[StagedFile, Path | None, bool]] = []  # (file, backup of the old target, target was new)
    try:
        for s in sorted(staged, key=lambda s: not s.exclusive):
            try:
                if s.exclusive:
                    _link_new(s)
                    done.append((s, None, True))
                else:
                    existed = os.path.lexists(s.target)
                    done.append((s, _replace(s), not existed))
            except OSError as e:
                if e.filename is None:
                    e.filename = str(s.target)
                raise
    except BaseException:
        for s, backup, was_new in reversed(done):
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, s.target)
                elif was_new:
                    os.unlink(s.target)
        placed = {id(s) for s, _, _ in done}
        discard(s for s in staged if id(s) not in placed)
        raise
    for _, backup, _ in done:
        if backup is not None:
            with contextlib.suppress(OSError):
                os.unlink(backup)
    for folder in {s.target.parent for s in staged}:
        fsync_folder(folder if str(folder) else Path("."))


def _write_atomic(path: Path | str, write: Any, binary: bool = False) -> None:
    commit([stage(path, write, binary)])


def _json_safe(value: Any) -> Any:
    """NaN and infinities are not JSON: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    return value


def to_json(document: dict[str, Any]) -> str:
    return json.dumps(_json_safe(document), indent=2, sort_keys=False) + "\n"


def write_json_atomic(path: Path | str, document: dict[str, Any]) -> None:
    text = to_json(document)
    _write_atomic(path, lambda f: f.write(text))


def csv_text(rows: Iterable[dict[str, Any]], order: Sequence[str] = ()) -> str:
    """The rows' scalar fields as CSV: the fields named in `order` first (a benchmark's declared columns, those its
    rows have), then any others in the rows' own order."""
    scalar_rows = [csv_row(r) for r in rows]
    present = {k for r in scalar_rows for k in r}
    columns: list[str] = [k for k in order if k in present]
    for r in scalar_rows:
        columns.extend(k for k in r if k not in columns)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in scalar_rows:
        writer.writerow({k: ("" if v is None or (isinstance(v, float) and math.isnan(v)) else v) for k, v in r.items()})
    return buf.getvalue()


def write_csv_atomic(path: Path | str, rows: Iterable[dict[str, Any]], order: Sequence[str] = ()) -> None:
    text = csv_text(rows, order)
    _write_atomic(path, lambda f: f.write(text))


class _Writer:
    """Only a write method: NumPy then writes through it chunk by chunk, so a failing write raises the OSError
    (ENOSPC, EFBIG, ...) with its errno, where ndarray.tofile says only "N requested and M written"."""

    def __init__(self, f: Any) -> None:
        self.write = f.write


def _save_npy(f: Any, array: np.ndarray) -> None:
    np.lib.format.write_array(_Writer(f), np.asanyarray(array), allow_pickle=False)


def write_text_atomic(path: Path | str, text: str) -> None:
    """Any text file (a report page, a merged CSV), written like the results files."""
    _write_atomic(path, lambda f: f.write(text))


def write_bytes_atomic(path: Path | str, data: bytes) -> None:
    _write_atomic(path, lambda f: f.write(data), binary=True)


def write_npy_atomic(path: Path | str, array: np.ndarray) -> None:
    _write_atomic(path, lambda f: _save_npy(f, array), binary=True)


def stage_json(path: Path | str, document: dict[str, Any], exclusive: bool = False) -> StagedFile:
    return stage_as("json", path, document, exclusive)


def stage_csv(path: Path | str, rows: Iterable[dict[str, Any]], exclusive: bool = False,
              order: Sequence[str] = ()) -> StagedFile:
    return stage_as("csv", path, csv_text(rows, order), exclusive)


def stage_text(path: Path | str, text: str, exclusive: bool = False) -> StagedFile:
    return stage_as("text", path, text, exclusive)


def stage_npy(path: Path | str, array: np.ndarray, exclusive: bool = False) -> StagedFile:
    return stage_as("npy", path, array, exclusive)


@dataclass(frozen=True)
class OutputFormat:
    """One kind of file hetbench writes: how its content is written, and the suffixes that name it. The writers
    (outputs.emit for the commands' files, `report` for its page, plots and merged CSV) stage every file through
    `stage_as` and commit them together, all or nothing."""

    name: str
    suffixes: tuple[str, ...]
    binary: bool
    write: Callable[[Any, Any], None]  # (open file, content)


FORMATS: dict[str, OutputFormat] = {}


def register_format(fmt: OutputFormat) -> OutputFormat:
    if fmt.name in FORMATS:
        raise ValueError(f"an output format named {fmt.name!r} is registered already")
    FORMATS[fmt.name] = fmt
    return fmt


def _write_csv(f: Any, content: Any) -> None:
    """A CSV's content: its text, or (rows, column order) made into text."""
    f.write(content if isinstance(content, str) else csv_text(*content))


register_format(OutputFormat("json", (".json",), False, lambda f, doc: f.write(to_json(doc))))
register_format(OutputFormat("csv", (".csv",), False, _write_csv))
register_format(OutputFormat("npy", (".npy",), True, lambda f, array: _save_npy(f, array)))
register_format(OutputFormat("html", (".html", ".htm"), False, lambda f, text: f.write(text)))
register_format(OutputFormat("svg", (".svg",), False, lambda f, text: f.write(text if isinstance(text, str) else
                                                                              text.decode())))
register_format(OutputFormat("png", (".png",), True, lambda f, data: f.write(data)))
register_format(OutputFormat("text", (), False, lambda f, text: f.write(text)))


def format_for(path: Path | str, content: Any = None) -> OutputFormat:
    """The format a file's suffix names; else by its content: an array is .npy, bytes binary, text text."""
    suffix = Path(path).suffix.lower()
    for fmt in FORMATS.values():
        if suffix in fmt.suffixes:
            return fmt
    if isinstance(content, np.ndarray):
        return FORMATS["npy"]
    return FORMATS["png"] if isinstance(content, bytes) else FORMATS["text"]


def stage_as(fmt: OutputFormat | str, path: Path | str, content: Any, exclusive: bool = False) -> StagedFile:
    """`content` written beside `path` in format `fmt` (a name or an OutputFormat), staged for commit()."""
    f = FORMATS[fmt] if isinstance(fmt, str) else fmt
    return stage(path, lambda out: f.write(out, content), binary=f.binary, exclusive=exclusive)


MAX_RESULTS_BYTES = 1 << 30  # a results document hetbench reads: far above any run's (a long train's steps: MBs)


def regular_file_problem(path: Path | str, max_bytes: int | None = None) -> str | None:
    """Why `path` must not be opened for reading: not a regular file (a FIFO would block the reader for ever, a
    device never end), or larger than `max_bytes`; None where it may be read, or where it does not exist (the
    reader says that itself)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        return f"is {kind}, not a regular file"
    if max_bytes is not None and st.st_size > max_bytes:
        return f"is {st.st_size} bytes, more than the {max_bytes} such a file may be"
    return None


def load_results(path: Path | str) -> dict[str, Any]:
    """A results document, checked against the schema and brought up to this hetbench's version;
    ResultsFileError says what is wrong (its `not_hetbench` is set when the file is JSON but not hetbench's)."""
    path = Path(path)
    name = repr(str(path))
    problem = regular_file_problem(path, MAX_RESULTS_BYTES)
    if problem:
        raise ResultsFileError(f"cannot read results file {name}: it {problem}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ResultsFileError(f"cannot read results file {name}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ResultsFileError(f"results file {name} is not JSON: it is not UTF-8 text") from None
    if not text.strip():
        raise ResultsFileError(f"results file {name} is empty")
    try:
        document = json.loads(text)
    except RecursionError:
        raise ResultsFileError(f"results file {name} is nested too deeply to be a results document") from None
    except json.JSONDecodeError as e:
        ending = " (the file ends early: truncated?)" if e.pos >= len(text.rstrip()) else ""
        raise ResultsFileError(f"results file {name} is not JSON: {e.msg} at line {e.lineno}{ending}") from None
    except ValueError:  # Python reads no integer of more than 4300 digits
        raise ResultsFileError(f"results file {name} holds a number too long to read (an integer of more than 4300 "
                               "digits): not a measurement") from None
    if not isinstance(document, dict):
        raise ResultsFileError(f"results file {name} holds a {type(document).__name__}, not a results object",
                               not_hetbench=True)
    if not str(document.get("schema", "")).startswith("hetbench."):
        missing = [k for k in REQUIRED_KEYS if k not in document]
        if "schema" in document:
            message = f"results file {name} has schema {document['schema']!r}, not hetbench.*"
        else:
            message = f"results file {name} lacks {', '.join(missing)}: not a hetbench results file"
        raise ResultsFileError(message, not_hetbench=True)
    version = document.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ResultsFileError(f"results file {name} has schema_version {version!r}; "
                               f"this hetbench reads versions 1 to {SCHEMA_VERSION}")
    if version > SCHEMA_VERSION:
        raise ResultsFileError(f"results file {name} has schema_version {version}, newer than this hetbench "
                               f"reads (version {SCHEMA_VERSION}): upgrade hetbench to read it")
    missing = [k for k in REQUIRED_KEYS if k not in document]
    if missing:
        raise ResultsFileError(f"results file {name} lacks {', '.join(missing)}: not a hetbench results file")
    if not isinstance(document.get("rows"), list) or not all(isinstance(r, dict) for r in document["rows"]):
        raise ResultsFileError(f"results file {name}: 'rows' must be a list of objects")
    if version == 1:  # version 1 wrote a row's stragglers as text, "0,2": ranks in ASCII digits
        for i, row in enumerate(document["rows"]):
            text = row.get("stragglers")
            if isinstance(text, str) and not all(r.strip().isascii() and r.strip().isdigit()
                                                 for r in text.split(",") if r.strip()):
                raise ResultsFileError(f"results file {name}: row {i}'s stragglers {text!r} is not a list of ranks "
                                       "(version 1 writes them as rank numbers between commas, e.g. '0,2')")
    try:
        document = upgrade(document)
    except UnreadableVersion as e:
        raise ResultsFileError(f"results file {name}: {e}") from None
    except (ValueError, TypeError, AttributeError):
        raise ResultsFileError(f"results file {name} (schema_version {version}) cannot be brought up to version "
                               f"{SCHEMA_VERSION}: it is not of the shape hetbench wrote then") from None
    if not isinstance(document["rows"], list) or not all(isinstance(r, dict) for r in document["rows"]):
        raise ResultsFileError(f"results file {name}: 'rows' must be a list of objects")
    if not isinstance(document["metadata"], dict):
        raise ResultsFileError(f"results file {name}: 'metadata' must be an object")
    for key in ("summary", "config"):
        if key in document and not isinstance(document[key], dict):
            raise ResultsFileError(f"results file {name}: '{key}' must be an object, not "
                                   f"{type(document[key]).__name__ if document[key] is not None else 'null'}")
    for i, row in enumerate(document["rows"]):
        if not row:
            raise ResultsFileError(f"results file {name}: row {i} is empty")
        problem = _raw_problem(row.get("raw"))
        if problem:
            raise ResultsFileError(f"results file {name}: row {i}'s raw values {problem}")
    return document


MAX_RAW_VALUE = 1e15  # a raw value is a time (seconds, microseconds) or a count: anything larger is no measurement


def _raw_problem(raw: Any, depth: int = 0) -> str | None:
    """Why a row's "raw" (per-repeat values: numbers, lists of them, an object of such lists) is not of the form
    hetbench writes, else None: a text, a bool, NaN or infinity, a value beyond MAX_RAW_VALUE, or nesting deeper
    than three levels."""
    if raw is None:
        return None
    if depth > 3:
        return "are nested too deeply"
    if isinstance(raw, dict):
        for key, value in raw.items():
            problem = _raw_problem(value, depth + 1)
            if problem:
                return f"({key!r}) {problem}" if depth == 0 else problem
        return None
    if isinstance(raw, list):
        return next((p for p in (_raw_problem(v, depth + 1) for v in raw) if p), None)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return f"hold {raw!r}, not a number"
    if not math.isfinite(raw) or abs(raw) > MAX_RAW_VALUE:
        return f"hold {raw!r}, not a measured value (finite, at most {MAX_RAW_VALUE:g} in size)"
    return None


def load_flat_piece(path: Path, error: type[Exception], manifest: str) -> Any:
    """One rank's flat float32 piece of a sharded checkpoint (rank-<r>.<name>.npy), memory-mapped; anything else
    (missing, empty, damaged, of another dtype or shape) raises ERROR with one line naming the file."""
    import numpy as np

    where = f"checkpoint file {str(path)!r}"
    problem = regular_file_problem(path)
    if problem:
        raise error(f"{where} {problem}")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise error(f"checkpoint {str(path.parent)!r} is incomplete: {path.name}, which its {manifest} names, is "
                    "missing") from None
    except EOFError:  # an empty file (click would take EOFError for an interrupted prompt: exit 130)
        raise error(f"{where} is empty, not a .npy array") from None
    except OSError as e:
        raise error(f"cannot read {where}: {e.strerror or e}") from None
    except ValueError:
        raise error(f"{where} is not a .npy array (truncated or damaged)") from None
    if array.dtype != np.float32 or array.ndim != 1:
        raise error(f"{where} holds {array.dtype} of shape {array.shape}, not a flat float32 array")
    return array
