"""Results files: the versioned schema, atomic JSON/CSV writing, and a loader that rejects malformed files."""

from hetbench.results.io import (
    ResultsFileError,
    check_writable,
    load_results,
    write_bytes_atomic,
    write_csv_atomic,
    write_json_atomic,
    write_npy_atomic,
    write_text_atomic,
)
from hetbench.results.schema import SCHEMA_VERSION, make_document

__all__ = [
    "SCHEMA_VERSION",
    "ResultsFileError",
    "check_writable",
    "load_results",
    "make_document",
    "write_bytes_atomic",
    "write_csv_atomic",
    "write_json_atomic",
    "write_npy_atomic",
    "write_text_atomic",
]
