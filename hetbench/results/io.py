"""Writing results atomically (a temporary file in the same folder, then a rename) and reading them back."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from hetbench.results.schema import REQUIRED_KEYS, SCHEMA_VERSION, csv_row, upgrade


class ResultsFileError(ValueError):
    """A results file that is missing, unreadable or not of hetbench's schema."""

    def __init__(self, message: str, not_hetbench: bool = False) -> None:
        super().__init__(message)
        self.not_hetbench = not_hetbench  # well-formed JSON that is simply not a hetbench results document


def check_writable(path: Path | str, what: str) -> str | None:
    """Why `path` cannot be written, or None. Checked before any computing so no work is lost to a bad path."""
    path = Path(path)
    if path.exists() and path.is_dir():
        return f"{what} {str(path)!r} is a directory; give a file path"
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        return f"{what} {str(path)!r} cannot be written: folder {str(parent)!r} does not exist"
    if not parent.is_dir():
        return f"{what} {str(path)!r} cannot be written: {str(parent)!r} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{what} {str(path)!r} cannot be written: no write permission in folder {str(parent)!r}"
    if path.exists() and not os.access(path, os.W_OK):
        return f"{what} {str(path)!r} cannot be written: the file is read-only"
    return None


def _write_atomic(path: Path | str, write: Any, binary: bool = False) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": ""})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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


def csv_text(rows: Iterable[dict[str, Any]]) -> str:
    scalar_rows = [csv_row(r) for r in rows]
    columns: list[str] = []
    for r in scalar_rows:
        columns.extend(k for k in r if k not in columns)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in scalar_rows:
        writer.writerow({k: ("" if v is None or (isinstance(v, float) and math.isnan(v)) else v) for k, v in r.items()})
    return buf.getvalue()


def write_csv_atomic(path: Path | str, rows: Iterable[dict[str, Any]]) -> None:
    text = csv_text(rows)
    _write_atomic(path, lambda f: f.write(text))


def write_text_atomic(path: Path | str, text: str) -> None:
    """Any text file (a report page, a merged CSV), written like the results files."""
    _write_atomic(path, lambda f: f.write(text))


def write_bytes_atomic(path: Path | str, data: bytes) -> None:
    _write_atomic(path, lambda f: f.write(data), binary=True)


def write_npy_atomic(path: Path | str, array: np.ndarray) -> None:
    _write_atomic(path, lambda f: np.save(f, array, allow_pickle=False), binary=True)


def load_results(path: Path | str) -> dict[str, Any]:
    """A results document, checked against the schema and brought up to this hetbench's version;
    ResultsFileError says what is wrong (its `not_hetbench` is set when the file is JSON but not hetbench's)."""
    path = Path(path)
    name = repr(str(path))
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
    except json.JSONDecodeError as e:
        ending = " (the file ends early: truncated?)" if e.pos >= len(text.rstrip()) else ""
        raise ResultsFileError(f"results file {name} is not JSON: {e.msg} at line {e.lineno}{ending}") from None
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
    try:
        document = upgrade(document)
    except ValueError as e:
        raise ResultsFileError(f"results file {name}: {e}") from None
    if not isinstance(document["rows"], list) or not all(isinstance(r, dict) for r in document["rows"]):
        raise ResultsFileError(f"results file {name}: 'rows' must be a list of objects")
    if not isinstance(document["metadata"], dict):
        raise ResultsFileError(f"results file {name}: 'metadata' must be an object")
    return document
