"""Results files written before the redesign still load, and today's CSV keeps their columns in their order. (The
driver giving a new benchmark the whole command is shown by the plugin benchmark: tests/plugins/test_plugins.py.)"""

from __future__ import annotations

import csv
import json

import pytest
from helpers import REPO, needs_mpi, run_cli

from hetbench.results import SCHEMA_VERSION, load_results

TESTS = REPO / "tests"
DATA = TESTS / "data"


@pytest.mark.parametrize("name", ["matmul", "collectives"])
def test_files_written_before_the_redesign_load(name):
    doc = load_results(DATA / f"{name}-v1.json")
    assert doc["schema"] == f"hetbench.{name}" and doc["schema_version"] == SCHEMA_VERSION
    assert doc["verified"] is True and doc["rows"]


@needs_mpi
@pytest.mark.parametrize("name, args", [
    ("matmul", ["matmul", "--size", "64", "--repeat", "3", "--backend", "0=host,1=sim:mi300x"]),
    ("collectives", ["collectives", "--op", "allreduce,bcast", "--max-bytes", "1K", "--min-bytes", "256",
                     "--iters", "3", "--warmup", "1", "--backend", "0=host,1=sim:h100"]),
])
def test_todays_files_keep_the_v1_fields(tmp_path, name, args):
    """The same command as made tests/data/<name>-v1.*: every v1 JSON row field and top-level key is still there,
    and every v1 CSV column, in the same order."""
    out, csv_path = tmp_path / "r.json", tmp_path / "r.csv"
    run = run_cli([*args, "--out", str(out), "--csv", str(csv_path)], nprocs=2, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    old, new = json.loads((DATA / f"{name}-v1.json").read_text()), json.loads(out.read_text())
    assert set(old) <= set(new) and set(old["config"]) <= set(new["config"])
    assert set(old["summary"]) <= set(new["summary"]) and set(old["metadata"]) <= set(new["metadata"])
    for old_row, new_row in zip(old["rows"], new["rows"]):
        assert set(old_row) <= set(new_row)
    with open(DATA / f"{name}-v1.csv", newline="") as f:
        old_header = next(csv.reader(f))
    with open(csv_path, newline="") as f:
        new_header = next(csv.reader(f))
    assert [h for h in new_header if h in old_header] == old_header


def test_a_benchmark_s_optional_hooks_are_its_own_or_the_declared_defaults():
    """driver.py calls input_paths, notices and document_extra through optional_hooks: a benchmark without them
    gets OptionalHooks' defaults, one with them its own."""
    from hetbench.benchmarks.base import OptionalHooks, optional_hooks

    class Bare:
        pass

    class Own:
        def notices(self, cfg, world, state):
            return [f"notice {cfg}"]

    bare, own = optional_hooks(Bare()), optional_hooks(Own())
    assert isinstance(bare, OptionalHooks)
    assert (bare.input_paths(1, None), bare.notices(1, None, None), bare.document_extra(1, [])) == ({}, [], {})
    assert own.notices(7, None, None) == ["notice 7"] and own.input_paths(7, None) == {}
