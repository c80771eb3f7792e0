"""Every row of a run's own CSV says which run it came from: run_id, date_utc, command and ranks after the row's
own fields, and, on a row that covers every rank (collectives), the rank map and every rank's device. Checked on
real short runs under MPI, read back with the csv module against the JSON written beside it."""

from __future__ import annotations

import csv
import datetime as dt
import json
import re
from pathlib import Path

import pytest

from helpers import MPIEXEC, run_cli
from hetbench.harness.metadata import new_run_id
from hetbench.results.runs import CSV_ALL_RANKS_COLUMNS, CSV_RUN_COLUMNS, csv_rows, csv_run_columns, run_id

pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")

MATMUL = ["matmul", "--size", "64", "--repeat", "2", "--backend", "0=host,1=sim:mi300x"]
COLLECTIVES = ["collectives", "--op", "allreduce", "--min-bytes", "256", "--max-bytes", "1K", "--iters", "2",
               "--warmup", "1", "--backend", "0=host,1=sim:h100"]
RUN_ID = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}$")


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Two matmul runs (host + simulated MI300X) and one collectives run (host + simulated H100), 2 ranks each,
    each with --out and --csv: name -> (JSON, CSV)."""
    folder = tmp_path_factory.mktemp("csv-runs")
    made = {}
    for name, args in (("mm1", MATMUL), ("mm2", MATMUL), ("c", COLLECTIVES)):
        out, csv_path = folder / f"{name}.json", folder / f"{name}.csv"
        run = run_cli([*args, "--out", str(out), "--csv", str(csv_path)], nprocs=2, cwd=folder)
        assert run.returncode == 0, run.stderr
        made[name] = (out, csv_path)
    return made


def check_run_columns(doc: dict, header: list[str], rows: list[dict[str, str]]) -> None:
    """What every row of any run's own CSV carries, checked against its JSON."""
    metadata = doc["metadata"]
    assert RUN_ID.match(metadata["run_id"]), metadata["run_id"]
    assert len(rows) == len(doc["rows"]) > 0
    for name in CSV_RUN_COLUMNS:
        assert header.count(name) == 1, header
    assert len(header) == len(set(header)), header
    for row in rows:
        assert row["run_id"] == metadata["run_id"]
        assert row["date_utc"] == metadata["date_utc"]
        assert row["command"] == metadata["command_line"]
        assert row["ranks"] == str(metadata["world_size"]) == "2"
    # the JSON rows stay as they were: the run's facts are in its metadata only
    assert not any(key in row for row in doc["rows"] for key in ("run_id", "date_utc", "command", "rank_map",
                                                                  "devices"))


def test_matmul_rows_carry_the_run_and_keep_their_own_device(runs: dict[str, tuple[Path, Path]]) -> None:
    out, csv_path = runs["mm1"]
    doc = json.loads(out.read_text())
    header, rows = read_csv(csv_path)
    check_run_columns(doc, header, rows)
    assert "hetbench matmul --size 64 --repeat 2 --backend 0=host,1=sim:mi300x" in rows[0]["command"]
    # one row per rank, each with its own backend and device, so no all-ranks columns
    assert [(r["rank"], r["backend"], r["device"]) for r in rows] == \
        [(str(r["rank"]), r["backend"], r["device"]) for r in doc["rows"]]
    assert [r["backend"] for r in rows] == ["host", "sim:mi300x"]
    assert "MI300X" in rows[1]["device"]
    assert not any(c in header for c in CSV_ALL_RANKS_COLUMNS), header
    # the run columns come after every declared column and the row's own fields
    assert header[-4:] == ["run_id", "date_utc", "command", "ranks"]
    assert header.index("run_id") > header.index("max_residual_over_tolerance")


def test_collectives_rows_carry_the_run_the_rank_map_and_every_device(runs: dict[str, tuple[Path, Path]]) -> None:
    out, csv_path = runs["c"]
    doc = json.loads(out.read_text())
    header, rows = read_csv(csv_path)
    check_run_columns(doc, header, rows)
    assert [int(r["size_bytes"]) for r in rows] == [256, 512, 1024]
    # a collectives row has its own "ranks" (the ranks taking part), which keeps its place and value
    assert header[-5:] == ["run_id", "date_utc", "command", "rank_map", "devices"]
    assert header.index("ranks") < header.index("op_us_median")
    devices = {r["rank"]: r["device_info"]["name"] for r in doc["metadata"]["ranks"]}
    assert "H100" in devices[1]
    for row in rows:
        assert row["rank_map"] == "0=host,1=sim:h100"
        assert row["devices"] == f"0:host:{devices[0]};1:sim:h100:{devices[1]}"


def test_every_run_gets_its_own_id(runs: dict[str, tuple[Path, Path]]) -> None:
    ids = {name: json.loads(out.read_text())["metadata"]["run_id"] for name, (out, _) in runs.items()}
    assert len(set(ids.values())) == 3, ids
    for name, (_, csv_path) in runs.items():
        assert {r["run_id"] for r in read_csv(csv_path)[1]} == {ids[name]}
    # the same second still gives two ids
    now = dt.datetime.now(dt.timezone.utc)
    assert new_run_id(now) != new_run_id(now)


def test_report_merges_the_runs_with_each_column_once(runs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    names = ["mm1", "mm2", "c"]
    run = run_cli(["report", "--brief", *(str(runs[n][0]) for n in names), "--csv", "merged.csv"], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    header, rows = read_csv(tmp_path / "merged.csv")
    assert len(header) == len(set(header)), header
    assert len(rows) == 2 + 2 + 3
    for name in names:
        doc = json.loads(runs[name][0].read_text())
        mine = [r for r in rows if Path(r["source_file"]).name == f"{name}.json"]
        assert len(mine) == len(doc["rows"])
        assert {r["run_id"] for r in mine} == {doc["metadata"]["run_id"]}


def test_a_rows_own_field_wins_and_old_files_get_a_derived_id() -> None:
    doc = {"schema": "hetbench.toy", "metadata": {"date_utc": "2026-01-01T00:00:00+00:00", "command_line": "x",
                                                   "world_size": 2,
                                                   "ranks": [{"rank": 0, "backend": "host",
                                                              "device_info": {"name": "CPU"}},
                                                             {"rank": 1, "backend": "sim:h100",
                                                              "device_info": {"name": "H100"}}]},
           "config": {"backends": ["host", "sim:h100"]},
           "rows": [{"a": 1, "command": "mine"}, {"a": 2, "backend": "host", "device": "CPU", "extra": 3}]}
    rows, order = csv_rows(doc, ["b", "a"])
    old_id = run_id(doc)
    assert len(old_id) == 10 and csv_run_columns(doc)["run_id"] == old_id
    assert rows[0] == {"a": 1, "command": "mine", "run_id": old_id, "date_utc": "2026-01-01T00:00:00+00:00",
                       "ranks": 2, "rank_map": "0=host,1=sim:h100", "devices": "0:host:CPU;1:sim:h100:H100"}
    assert rows[1] == {"a": 2, "backend": "host", "device": "CPU", "extra": 3, "run_id": old_id,
                       "date_utc": "2026-01-01T00:00:00+00:00", "command": "x", "ranks": 2}
    assert order == ["b", "a", "command", "backend", "device", "extra", "run_id", "date_utc", "ranks", "rank_map",
                     "devices"]
    assert doc["rows"][0] == {"a": 1, "command": "mine"}  # the document is untouched
