"""The output formats are one registry (hetbench/results/io.py: FORMATS) that every writer stages through: the
commands' results, CSV, .npy and text files, and `report`'s page, plots and merged CSV, all committed together."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hetbench.results.io import FORMATS, OutputFormat, commit, discard, format_for, register_format, stage_as


def test_the_formats_hetbench_writes():
    assert set(FORMATS) == {"json", "csv", "npy", "html", "svg", "png", "text"}
    assert [format_for(p).name for p in ("r.json", "r.CSV", "c.npy", "page.html", "p.svg", "p.png")] == \
        ["json", "csv", "npy", "html", "svg", "png"]
    assert format_for("train.jsonl", "text").name == "text"
    assert format_for("result.bin", np.zeros(2)).name == "npy"


def test_each_format_writes_what_it_is_given(tmp_path):
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    contents = {"r.json": {"a": 1}, "r.csv": ([{"x": 1, "y": 2}], ("y",)), "c.npy": array, "p.html": "<p>hi</p>",
                "p.svg": b"<svg/>", "p.png": b"\x89PNG", "log.jsonl": "line\n"}
    staged = [stage_as(format_for(tmp_path / name, content), tmp_path / name, content)
              for name, content in contents.items()]
    assert not any((tmp_path / name).exists() for name in contents)  # staged, not in place
    commit(staged)
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    assert (tmp_path / "r.csv").read_text() == "y,x\n2,1\n"  # the order given first
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), array)
    assert (tmp_path / "p.svg").read_text() == "<svg/>" and (tmp_path / "p.png").read_bytes() == b"\x89PNG"
    assert (tmp_path / "log.jsonl").read_text() == "line\n"


def test_a_file_that_cannot_be_staged_leaves_none(tmp_path):
    staged = [stage_as("html", tmp_path / "page.html", "<p/>")]
    with pytest.raises(OSError):
        staged.append(stage_as("csv", tmp_path / "missing" / "r.csv", "a\n1\n"))
    discard(staged)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_new_format_registers_once(monkeypatch, tmp_path):
    monkeypatch.setattr("hetbench.results.io.FORMATS", dict(FORMATS))
    from hetbench.results import io

    register_format(OutputFormat("upper", (".up",), False, lambda f, text: f.write(text.upper())))
    with pytest.raises(ValueError, match="registered already"):
        register_format(OutputFormat("upper", (".up",), False, lambda f, text: None))
    commit([stage_as(io.format_for(tmp_path / "x.up"), tmp_path / "x.up", "shout")])
    assert (tmp_path / "x.up").read_text() == "SHOUT"
