"""Results files (hetbench/results): atomic JSON/CSV writing and a loader that rejects malformed files."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from hetbench.results import (
    SCHEMA_VERSION,
    ResultsFileError,
    check_writable,
    load_results,
    make_document,
    write_csv_atomic,
    write_json_atomic,
    write_npy_atomic,
)
from hetbench.results.io import to_json


def rows() -> list[dict]:
    return [
        {"rank": 0, "host": "nodeA", "backend": "host", "gemm_seconds": 0.25, "tflops": 1.5, "verified": True,
         "raw": [0.25, 0.26], "detail": {"blas": "openblas"}},
        {"rank": 1, "host": "nodeB", "backend": "sim:h100", "gemm_seconds": math.nan, "tflops": None,
         "verified": False, "raw": [0.1], "detail": {}, "note": "only here"},
    ]


def document() -> dict:
    return make_document(
        "matmul",
        metadata={"hostname": "nodeA", "numpy": np.__version__},
        config={"m": 64, "dtype": "fp32"},
        rows=rows(),
        summary={"total_tflops": 3.0, "worst": math.inf, "best": -math.inf, "count": np.int64(2),
                 "mean": np.float64(0.5)},
        verified=True,
    )


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


def test_make_document_shape() -> None:
    doc = document()
    assert doc["schema"] == "hetbench.matmul"
    assert doc["schema_version"] == SCHEMA_VERSION
    assert list(doc) == ["schema", "schema_version", "metadata", "config", "rows", "summary", "verified"]


def test_json_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_json_atomic(path, document())
    loaded = load_results(path)
    assert loaded["schema"] == "hetbench.matmul"
    assert loaded["schema_version"] == SCHEMA_VERSION
    assert loaded["config"] == {"m": 64, "dtype": "fp32"}
    assert loaded["metadata"]["numpy"] == np.__version__
    assert loaded["verified"] is True
    assert loaded["rows"][0]["raw"] == [0.25, 0.26]
    assert loaded["rows"][0]["detail"] == {"blas": "openblas"}
    assert loaded["rows"][1]["note"] == "only here"
    assert loaded["summary"]["count"] == 2
    assert loaded["summary"]["mean"] == 0.5
    assert leftovers(tmp_path) == []


def test_json_non_finite_become_null(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_json_atomic(path, document())
    text = path.read_text(encoding="utf-8")
    # strict JSON: no NaN/Infinity tokens that other readers choke on
    assert "NaN" not in text and "Infinity" not in text
    loaded = json.loads(text)
    assert loaded["rows"][1]["gemm_seconds"] is None
    assert loaded["summary"]["worst"] is None
    assert loaded["summary"]["best"] is None
    assert loaded["summary"]["total_tflops"] == 3.0


def test_json_numpy_nan_becomes_null(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    doc = document()
    doc["summary"] = {"x": np.float64("nan"), "y": np.float32(2.5)}
    write_json_atomic(path, doc)
    assert load_results(path)["summary"] == {"x": None, "y": 2.5}


def test_json_overwrites_existing(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("old", encoding="utf-8")
    write_json_atomic(path, document())
    assert load_results(path)["schema"] == "hetbench.matmul"


def test_csv(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    write_csv_atomic(path, rows())
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) == 1 + len(rows())
    assert lines[0] == "rank,host,backend,gemm_seconds,tflops,verified,note"
    assert sum(1 for line in lines if line.startswith("rank,")) == 1
    with path.open(newline="", encoding="utf-8") as f:
        records = list(csv.DictReader(f))
    assert len(records) == 2
    for record in records:
        assert "raw" not in record and "detail" not in record
    assert records[0] == {"rank": "0", "host": "nodeA", "backend": "host", "gemm_seconds": "0.25", "tflops": "1.5",
                          "verified": "True", "note": ""}
    assert records[1]["backend"] == "sim:h100"
    assert records[1]["gemm_seconds"] == ""  # NaN
    assert records[1]["tflops"] == ""  # None
    assert records[1]["note"] == "only here"
    assert leftovers(tmp_path) == []


def test_check_writable_good_path(tmp_path: Path) -> None:
    assert check_writable(tmp_path / "r.json", "--out") is None
    existing = tmp_path / "old.json"
    existing.write_text("{}", encoding="utf-8")
    assert check_writable(existing, "--out") is None


def test_check_writable_missing_folder(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "r.json"
    message = check_writable(path, "--out")
    assert message is not None
    assert message.startswith("--out ")
    assert repr(str(path)) in message
    assert repr(str(tmp_path / "nope")) in message
    assert "does not exist" in message


def test_check_writable_directory(tmp_path: Path) -> None:
    message = check_writable(tmp_path, "--csv")
    assert message is not None
    assert repr(str(tmp_path)) in message
    assert "is a directory" in message


def test_check_writable_parent_is_file(tmp_path: Path) -> None:
    parent = tmp_path / "file"
    parent.write_text("x", encoding="utf-8")
    message = check_writable(parent / "r.json", "--out")
    assert message is not None
    assert repr(str(parent / "r.json")) in message
    assert "not a folder" in message


def test_failed_json_serialisation_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    doc = document()
    doc["config"]["ranks"] = {0, 1}  # a set is not JSON
    with pytest.raises(TypeError):
        write_json_atomic(path, doc)
    assert not path.exists()
    assert leftovers(tmp_path) == []
    assert list(tmp_path.iterdir()) == []


def test_failed_json_serialisation_keeps_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("previous results", encoding="utf-8")
    doc = document()
    doc["summary"]["bad"] = {1.0}
    with pytest.raises(TypeError):
        write_json_atomic(path, doc)
    assert path.read_text(encoding="utf-8") == "previous results"
    assert leftovers(tmp_path) == []


def test_failure_while_writing_removes_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fails after the temporary file exists and holds data: the rename must not happen and the file must go
    import hetbench.results.io as results_io

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    path = tmp_path / "r.csv"
    path.write_text("previous", encoding="utf-8")
    monkeypatch.setattr(results_io.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space left"):
        write_csv_atomic(path, rows())
    monkeypatch.undo()
    assert path.read_text(encoding="utf-8") == "previous"
    assert leftovers(tmp_path) == []
    assert [p.name for p in tmp_path.iterdir()] == ["r.csv"]


def test_failed_npy_write_removes_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "c.npy"
    unpicklable = np.array([lambda: 0], dtype=object)
    with pytest.raises(ValueError, match="allow_pickle"):  # results never hold pickled objects
        write_npy_atomic(path, unpicklable)
    assert not path.exists()
    assert leftovers(tmp_path) == []


def test_npy_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "c.npy"
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_npy_atomic(path, array)
    loaded = np.load(path)
    assert loaded.dtype == np.float32
    np.testing.assert_array_equal(loaded, array)
    assert leftovers(tmp_path) == []


def write_raw(tmp_path: Path, content) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def good_dict() -> dict:
    return json.loads(to_json(document()))


def assert_rejected(path: Path, *fragments: str) -> str:
    with pytest.raises(ResultsFileError) as excinfo:
        load_results(path)
    message = str(excinfo.value)
    assert repr(str(path)) in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def test_load_rejects_missing_file(tmp_path: Path) -> None:
    assert_rejected(tmp_path / "absent.json", "cannot read")


def test_load_rejects_non_json(tmp_path: Path) -> None:
    assert_rejected(write_raw(tmp_path, "{not json"), "is not JSON", "line 1")


def test_load_rejects_list(tmp_path: Path) -> None:
    assert_rejected(write_raw(tmp_path, [1, 2]), "list", "not a results object")


def test_load_rejects_missing_keys(tmp_path: Path) -> None:
    doc = good_dict()
    del doc["summary"]
    del doc["verified"]
    message = assert_rejected(write_raw(tmp_path, doc), "summary", "verified", "not a hetbench results file")
    assert "config" not in message.split("lacks", 1)[1]


def test_load_rejects_foreign_schema(tmp_path: Path) -> None:
    doc = good_dict()
    doc["schema"] = "pyperf.bench"
    assert_rejected(write_raw(tmp_path, doc), "'pyperf.bench'", "hetbench.*")


def test_load_rejects_other_schema_version(tmp_path: Path) -> None:
    doc = good_dict()
    doc["schema_version"] = SCHEMA_VERSION + 1
    assert_rejected(write_raw(tmp_path, doc), f"schema_version {SCHEMA_VERSION + 1}", f"version {SCHEMA_VERSION}")


@pytest.mark.parametrize("bad_rows", [{}, "rows", [1, 2], [{"rank": 0}, None]])
def test_load_rejects_bad_rows(tmp_path: Path, bad_rows) -> None:
    doc = good_dict()
    doc["rows"] = bad_rows
    assert_rejected(write_raw(tmp_path, doc), "'rows' must be a list of objects")


def test_load_accepts_good_dict(tmp_path: Path) -> None:
    # the rejections above start from a document the loader accepts
    assert load_results(write_raw(tmp_path, good_dict()))["schema"] == "hetbench.matmul"
