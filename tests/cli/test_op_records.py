"""Adding a collective is adding one record: ops that hetbench does not ship (tests/extra_ops.py: an allreduce with
MPI.MAX, a sendrecv that shifts by two ranks), registered with `register` as the built-in ones are, run exact through
the real harness in this process and through the real CLI alone and under `mpiexec -n 3`, with their bus factor,
their redop and their MPI temporaries taken from the record."""

from __future__ import annotations

import csv
import dataclasses

import pytest
from helpers import REPO, needs_mpi, run_python
from extra_ops import ALLREDUCE_MAX, EXTRA_OPS, SENDRECV_BY_2, register_all

from hetbench.backends.base import BackendSpec
from hetbench.benchmarks.collectives import ops
from hetbench.comm.world import World
from hetbench.benchmarks.collectives.config import CollectivesConfig, check_collective_sizes, parse_ops
from hetbench.dtypes import DTYPES
from hetbench.benchmarks.collectives import run as harness
from hetbench.results import load_results

SCRIPT = REPO / "tests" / "extra_ops.py"
NEW = tuple(op.name for op in EXTRA_OPS)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, ops.Op]:
    """A copy of the registry in its place for the test, so that what a test registers is gone after it."""
    monkeypatch.setattr(ops, "OPS", dict(ops.OPS))
    return ops.OPS


def test_register_adds_to_the_registry_only_for_the_test(registry):
    register_all()
    assert tuple(ops.OPS)[-2:] == NEW and ops.OPS["allreduce_max"] is ALLREDUCE_MAX
    assert ops.OP_NAMES == tuple(ops.OPS)[:-2]  # the shipped ones


def test_the_real_registry_has_only_the_shipped_ops():
    assert tuple(ops.OPS) == ops.OP_NAMES and not set(NEW) & set(ops.OPS)


def test_register_refuses_a_taken_or_reserved_name(registry):
    with pytest.raises(ValueError, match="'allreduce' is registered already"):
        ops.register(dataclasses.replace(ALLREDUCE_MAX, name="allreduce"))
    for bad in ("all", "All", "a,b", " x", "a b", ""):
        with pytest.raises(ValueError, match="op name"):
            ops.register(dataclasses.replace(ALLREDUCE_MAX, name=bad))
    assert tuple(ops.OPS) == ops.OP_NAMES


def test_op_parsing_and_size_checks_take_registered_ops(registry):
    with pytest.raises(ValueError, match="unknown op 'allreduce_max'"):
        parse_ops(("allreduce_max",))
    register_all()
    assert parse_ops(("allreduce_max,sendrecv_by_2",)) == NEW
    assert parse_ops(("all",)) == (*ops.OP_NAMES, *NEW)
    # neither splits its size over the ranks, so 4 B on 3 ranks is fine, as for allreduce
    assert check_collective_sizes(NEW, 4, 64, 2, DTYPES["fp32"], 3) is None
    split = dataclasses.replace(SENDRECV_BY_2, name="split_by_2", size_is_total=True)
    ops.register(split)
    with pytest.raises(ValueError, match="split_by_2"):
        check_collective_sizes(("split_by_2",), 4, 64, 2, DTYPES["fp32"], 3)


@pytest.mark.parametrize("rank, root", [(0, 0), (1, 0)])
@pytest.mark.parametrize("path", ["host", "device"])
@pytest.mark.parametrize("in_host", [False, True])
def test_memory_check_of_a_record_like_allreduce_is_allreduces(rank, root, path, in_host):
    args = (1 << 20, 4, rank, 2, root, path, in_host)
    assert harness.point_host_bytes(ALLREDUCE_MAX, *args) == harness.point_host_bytes(ops.OPS["allreduce"], *args)


@pytest.mark.parametrize("rank, fraction", [(0, 1.5), (1, 2.0)])
def test_memory_check_counts_the_records_mpi_temporaries(rank, fraction):
    # the host path on a device outside host memory: send, receive and the staged copy (3 S), then MPI's own
    # temporaries at the record's fraction for the root (rank 0) or the others; none with one rank
    size = 1 << 20
    record = dataclasses.replace(ALLREDUCE_MAX, mpi_scratch_fraction=(1.5, 2.0))
    bare = dataclasses.replace(ALLREDUCE_MAX, mpi_scratch_fraction=(0.0, 0.0))
    two = (size, 4, rank, 2, 0, "host", False)
    assert harness.point_host_bytes(record, *two) - harness.point_host_bytes(bare, *two) == fraction * size
    one = (size, 4, 0, 1, 0, "host", False)
    assert harness.point_host_bytes(record, *one) == harness.point_host_bytes(bare, *one)


def _sweep(ops_names: tuple[str, ...]) -> list[dict]:
    cfg = CollectivesConfig(ops=ops_names, min_bytes=4096, max_bytes=8192, factor=2, dtype=DTYPES["fp32"],
                            backends=(BackendSpec("host"),), warmup=1, iters=2)
    world = World()
    from hetbench.harness.devices import open_rank_device

    opened, errors = open_rank_device(cfg.backends[world.rank], cfg.dtype, world)
    assert errors == []
    prepared, errors = harness.prepare(cfg, world, opened)
    assert errors == [] and prepared is not None
    try:
        rows = harness.run_sweep(cfg, world, prepared)
    finally:
        prepared.backend.close()
    assert rows is not None
    return rows


def test_registered_ops_run_exact_through_the_harness(registry):
    register_all()
    rows = _sweep(NEW)
    assert [(r["op"], r["size_bytes"]) for r in rows] == [(op, s) for op in NEW for s in (4096, 8192)]
    for r in rows:
        assert r["wrong"] == 0 and r["ranks"] == 1
        assert r["redop"] == ops.OPS[r["op"]].redop and r["root"] is None
    factors = {r["op"]: r["busbw_factor"] for r in rows}
    assert factors == {"allreduce_max": 0.0, "sendrecv_by_2": 1.0}  # the records' factors at one rank


def test_the_check_uses_the_records_expected_result(registry):
    # a record whose expected result is another rank's data: every element is counted wrong
    ops.register(dataclasses.replace(
        SENDRECV_BY_2, name="sendrecv_wrong",
        fill_expected=lambda out, rank, nranks, root: ops.values(rank + 1, len(out), out.dtype, out=out)))
    rows = _sweep(("sendrecv_wrong",))
    assert [r["wrong"] for r in rows] == [1024, 2048]


def _run_cli(tmp_path, nprocs):
    out, csv_path = tmp_path / "r.json", tmp_path / "r.csv"
    run = run_python([str(SCRIPT), "collectives", "--op", ",".join(NEW), "--backend", "host", "--min-bytes", "4K",
                      "--max-bytes", "8K", "--iters", "3", "--warmup", "1", "--out", str(out), "--csv",
                      str(csv_path)], nprocs=nprocs, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    with open(csv_path, newline="") as f:
        return run, load_results(out), list(csv.DictReader(f))


def test_registered_ops_through_the_cli_alone(tmp_path):
    run, doc, csv_rows = _run_cli(tmp_path, None)
    assert [r["op"] for r in doc["rows"]] == [op for op in NEW for _ in (4096, 8192)]
    assert all(r["wrong"] == 0 for r in doc["rows"]) and doc["verified"] is True
    assert [c["op"] for c in csv_rows] == [r["op"] for r in doc["rows"]]
    assert "allreduce_max  (path: host" in run.stdout and "sendrecv_by_2  (path: host" in run.stdout


@needs_mpi
def test_registered_ops_through_the_cli_on_three_ranks(tmp_path):
    # on 3 ranks MAX differs from SUM and a shift by 2 from one by 1: only the records' calls give 0 wrong
    run, doc, csv_rows = _run_cli(tmp_path, 3)
    rows = doc["rows"]
    assert [(r["op"], r["size_bytes"]) for r in rows] == [(op, s) for op in NEW for s in (4096, 8192)]
    for r in rows:
        assert r["ranks"] == 3 and r["wrong"] == 0 and r["raw"]["wrong_per_rank"] == [0, 0, 0]
        factor = {"allreduce_max": 4 / 3, "sendrecv_by_2": 1.0}[r["op"]]
        assert r["busbw_factor"] == pytest.approx(factor)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor)
    assert [r["redop"] for r in rows] == ["max", "max", "none", "none"]
    assert doc["summary"]["verified"] is True
    assert set(doc["summary"]["avg_busbw_gbps"]) == {"allreduce_max/host", "sendrecv_by_2/host"}
    assert [c["op"] for c in csv_rows] == [r["op"] for r in rows]
