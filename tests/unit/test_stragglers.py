"""`stragglers` says which ranks were slow without reading as a number: a list of ranks in the JSON, text such as
"rank 0" or "rank 0;rank 2" in the CSV (the same field name in both), and files written before still show."""

from __future__ import annotations

import csv
import io
import json

import pytest
from helpers import TESTS

from hetbench.benchmarks.collectives import ops as spec
from hetbench.benchmarks.collectives.config import CollectivesConfig
from hetbench.config import parse_dtype
from hetbench.benchmarks.collectives import run as harness
from hetbench.report.console import straggler_ranks
from hetbench.results import load_results
from hetbench.results.io import csv_text, to_json

DATA = TESTS / "data"


def _rank(op_us):
    n = len(op_us)
    return {"op_seconds": [t * 1e-6 for t in op_us], "d2h_seconds": [0.0] * n, "h2d_seconds": [0.0] * n,
            "wrong": 0}


def _row(medians_us):
    cfg = CollectivesConfig(ops=("allreduce",), min_bytes=64, max_bytes=64, factor=2, dtype=parse_dtype("fp32"),
                            backends=(), paths=("host",), warmup=0, iters=3, root=0, check=True)
    return harness._row(cfg, spec.OPS["allreduce"], 64, "host", [_rank([m] * 3) for m in medians_us], False)


def _csv(row) -> dict:
    return next(csv.DictReader(io.StringIO(csv_text([row]))))


@pytest.mark.parametrize(
    "medians_us, ranks, text",
    [([130, 100, 100], [0], "rank 0"), ([100, 140, 150, 100, 100], [1, 2], "rank 1;rank 2"),
     ([100, 100], [], "")],
)
def test_stragglers_are_a_list_in_json_and_text_in_csv(medians_us, ranks, text):
    row = _row(medians_us)
    assert row["stragglers"] == ranks
    assert json.loads(to_json({"rows": [row]}))["rows"][0]["stragglers"] == ranks
    line = _csv(row)
    assert line["stragglers"] == text
    assert "rank_op_us_median" not in line  # other lists stay JSON-only


def test_rank_zero_flagged_is_not_the_number_zero():
    row = _row([130, 100, 100])
    value = _csv(row)["stragglers"]
    with pytest.raises(ValueError):
        float(value)  # what a CSV reader would take for the number 0 before
    assert row["stragglers"] != 0 and row["stragglers"] != "0"


def test_files_written_before_still_show_their_stragglers():
    doc = load_results(DATA / "collectives-v1.json")
    assert [straggler_ranks(r["stragglers"]) for r in doc["rows"]][:4] == [[0], [0], [0], [1]]
    assert straggler_ranks("") == [] and straggler_ranks([2, 3]) == [2, 3]
