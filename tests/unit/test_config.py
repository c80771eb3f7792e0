"""Parsing what users type (hetbench/config.py): byte counts, backend specs, rank maps, per-rank paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetbench.backends.base import BackendSpec
from hetbench.backends.sim import models
from hetbench.benchmarks.matmul.config import MatmulConfig
from hetbench.config import OutputConfig, expand_rank_path, parse_backend_map, parse_backend_spec, parse_bytes
from hetbench.dtypes import DTYPES


@pytest.mark.parametrize(
    "text,expected",
    [
        ("8", 8),
        ("1K", 1024),
        ("16M", 16 * 1024**2),
        ("1G", 1024**3),
        ("1KiB", 1024),
        ("2kb", 2048),
        ("3B", 3),
        (" 4 m ", 4 * 1024**2),
        ("1T", 1024**4),
        (512, 512),
    ],
)
def test_parse_bytes(text, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["0", "-1", "1.5M", "abc", "", "1X", "K", "0K"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        parse_bytes(text)
    assert repr(text) in str(excinfo.value)


def test_parse_bytes_rejects_non_positive_int() -> None:
    with pytest.raises(ValueError, match="not a positive byte count"):
        parse_bytes(0)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("auto", BackendSpec("auto")),
        ("host", BackendSpec("host")),
        ("host:0", BackendSpec("host", 0)),
        ("opencl", BackendSpec("opencl")),
        ("opencl:2", BackendSpec("opencl", 2)),
        ("cupy", BackendSpec("cupy")),
        ("cupy:0", BackendSpec("cupy", 0)),
        ("sim:mi300x", BackendSpec("sim", None, "mi300x")),
        ("sim:MI300X", BackendSpec("sim", None, "mi300x")),
        ("sim:h100:1", BackendSpec("sim", 1, "h100")),
        ("HOST", BackendSpec("host")),
    ],
)
def test_parse_backend_spec(text: str, expected: BackendSpec) -> None:
    spec = parse_backend_spec(text)
    assert spec == expected
    # what users typed round-trips through str() (lower-cased)
    assert parse_backend_spec(str(spec)) == spec


@pytest.mark.parametrize(
    "text,fragments",
    [
        ("cuda", ["'cuda'", "auto, host, opencl"]),
        ("sim", ["'sim'", "sim:MODEL"]),
        ("sim:", ["'sim:'", "sim:MODEL"]),
        ("sim:nope", ["'nope'", "mi300x", "h100"]),
        ("sim:h100:1:2", ["'sim:h100:1:2'", "malformed"]),
        ("sim:h100:x", ["'x'", "integer"]),
        ("opencl:x", ["'x'", "'opencl:x'", "integer"]),
        ("opencl:1:2", ["'opencl:1:2'", "malformed"]),
        ("opencl:-1", ["'-1'"]),
    ],
)
def test_parse_backend_spec_rejects(text: str, fragments: list[str]) -> None:
    with pytest.raises(ValueError) as excinfo:
        parse_backend_spec(text)
    message = str(excinfo.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_unknown_sim_model_lists_every_model() -> None:
    with pytest.raises(ValueError) as excinfo:
        parse_backend_spec("sim:nope")
    for key in models():
        assert key in str(excinfo.value)


def test_backend_map_single_spec_for_every_rank() -> None:
    assert parse_backend_map("sim:h100", 3) == [BackendSpec("sim", None, "h100")] * 3
    assert parse_backend_map("host", 1) == [BackendSpec("host")]


def test_backend_map_missing_ranks_are_auto() -> None:
    specs = parse_backend_map("0=cupy, 2=sim:mi300x", 4)
    assert specs == [BackendSpec("cupy"), BackendSpec("auto"), BackendSpec("sim", None, "mi300x"), BackendSpec("auto")]


def test_backend_map_full() -> None:
    assert parse_backend_map("1=opencl:1,0=host", 2) == [BackendSpec("host"), BackendSpec("opencl", 1)]


def test_backend_map_rank_beyond_world() -> None:
    with pytest.raises(ValueError) as excinfo:
        parse_backend_map("0=host,3=host", 3)
    message = str(excinfo.value)
    assert "rank 3" in message
    assert "3 rank(s)" in message
    assert "0..2" in message


def test_backend_map_duplicate_rank() -> None:
    with pytest.raises(ValueError, match="names rank 1 twice"):
        parse_backend_map("1=host,1=sim:h100", 2)


@pytest.mark.parametrize("text", ["x=host", "0=", "=host", "0=host,", "0=host,1"])
def test_backend_map_malformed_entry(text: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        parse_backend_map(text, 2)
    message = str(excinfo.value)
    assert "malformed rank map entry" in message
    assert repr(text) in message


def test_backend_map_colon_instead_of_equals() -> None:
    # '0:host' has no '=': it is read as one spec, and no backend is called '0'
    with pytest.raises(ValueError) as excinfo:
        parse_backend_map("0:host", 2)
    assert "'0:host'" in str(excinfo.value)


def test_backend_map_bad_spec_inside_map() -> None:
    with pytest.raises(ValueError, match="'cuda'"):
        parse_backend_map("0=host,1=cuda", 2)


@pytest.mark.parametrize(
    "template,expected",
    [
        ("data/a_{rank}.npy", "data/a_3.npy"),
        ("/scratch/{host}/a.npy", "/scratch/node7/a.npy"),
        ("{host}-{rank}-{rank}.npy", "node7-3-3.npy"),
        ("plain.npy", "plain.npy"),
        ("{size}_{0}.npy", "{size}_{0}.npy"),
    ],
)
def test_expand_rank_path(template: str, expected: str) -> None:
    assert expand_rank_path(template, 3, "node7") == expected


def test_matmul_config_to_dict_is_json() -> None:
    config = MatmulConfig(
        m=64,
        n=32,
        k=16,
        dtype=DTYPES["bf16"],
        backends=(BackendSpec("host"), BackendSpec("sim", 1, "mi300x")),
        a_path="a_{rank}.npy",
        save=Path("out/c.npy"),
        output=OutputConfig(Path("r.json"), Path("r.csv"), True),
    )
    d = config.to_dict()
    back = json.loads(json.dumps(d))
    assert back == d
    assert d["dtype"] == "bf16"
    assert d["backends"] == ["host", "sim:mi300x:1"]
    assert d["save"] == "out/c.npy"
    assert d["output"] == {"out_json": "r.json", "out_csv": "r.csv", "json_stdout": True}
    assert (d["m"], d["n"], d["k"], d["a_path"], d["b_path"]) == (64, 32, 16, "a_{rank}.npy", None)


def test_matmul_config_to_dict_defaults() -> None:
    d = MatmulConfig(m=1, n=1, k=1, dtype=DTYPES["fp64"], backends=(BackendSpec("auto"),)).to_dict()
    json.dumps(d)
    assert d["save"] is None
    assert d["output"] == {"out_json": None, "out_csv": None, "json_stdout": False}
