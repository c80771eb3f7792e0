"""Every figure of a collectives document pinned (issue 17): each derived field recomputed here from the raw values
beside it (rows built by the harness from synthetic per-rank times where max, min, mean and rank 0 all differ, and
the committed v1 document), nccl-tests' busbw factors from conftest's hand-written table; the wrong-element count
on NaN results; and the check shown failing on a collective whose call writes nothing, through the harness and
through the command in this process (one rank, no mpiexec)."""

from __future__ import annotations

import dataclasses
import json
import statistics

import numpy as np
import pytest
from helpers import ALL_OPS, HAND_FACTOR, REPO

from hetbench.backends.base import BackendSpec
from hetbench.benchmarks.collectives import ops
from hetbench.comm.world import World
from hetbench.benchmarks.collectives.config import CollectivesConfig
from hetbench.dtypes import DTYPES
from hetbench.benchmarks.collectives import run as harness
from hetbench.results import load_results

FP32, FP64 = DTYPES["fp32"], DTYPES["fp64"]
ITEMSIZE = {"fp32": 4, "fp64": 8}


# --- the recomputation, from the raw values alone ------------------------------------------------------------------


def recompute_row(row: dict) -> dict:
    """Every derived field of a collectives row from its raw per-rank, per-iteration values, as the README defines
    them: a collective is as slow as its slowest rank, so each iteration counts the maximum over ranks; times in us;
    algbw = S / t in GB/s (1e9 bytes); busbw = algbw x nccl-tests' factor for the op and rank count."""
    raw = row["raw"]
    op_us, d2h_us, h2d_us = (np.array(raw[k], dtype=np.float64) for k in ("op_us", "d2h_us", "h2d_us"))
    ranks = op_us.shape[0]
    slowest = [max(op_us[r][i] for r in range(ranks)) for i in range(op_us.shape[1])]
    t_us = statistics.median(slowest)
    e2e = [max(d2h_us[r][i] + op_us[r][i] + h2d_us[r][i] for r in range(ranks)) for i in range(op_us.shape[1])]
    e2e_us = statistics.median(e2e)
    algbw = row["size_bytes"] / (t_us / 1e6) / 1e9
    factor = HAND_FACTOR[row["op"]](ranks)
    rank_medians = [statistics.median(op_us[r]) for r in range(ranks)]
    typical = statistics.median_low(rank_medians)
    wrong = raw["wrong_per_rank"]
    return {
        "ranks": ranks,
        "count_elements": row["size_bytes"] // ITEMSIZE[row["dtype"]],
        "op_us_median": t_us,
        "op_us_min": min(slowest),
        "op_us_max": max(slowest),
        "algbw_gbps": algbw,
        "busbw_factor": factor,
        "busbw_gbps": algbw * factor,
        "d2h_us_median": statistics.median([max(d2h_us[r][i] for r in range(ranks)) for i in range(op_us.shape[1])]),
        "h2d_us_median": statistics.median([max(h2d_us[r][i] for r in range(ranks)) for i in range(op_us.shape[1])]),
        "end_to_end_us_median": e2e_us,
        "end_to_end_algbw_gbps": row["size_bytes"] / (e2e_us / 1e6) / 1e9,
        "rank_op_us_median": rank_medians,
        "stragglers": [r for r, m in enumerate(rank_medians) if ranks > 1 and m > 1.2 * typical],
        "wrong": None if wrong[0] is None else sum(wrong),
    }


def assert_row_recomputes(row: dict) -> None:
    want = recompute_row(row)
    for key, value in want.items():
        assert row[key] == pytest.approx(value, rel=1e-12, abs=0), (row["op"], row["size_bytes"], key)


def recompute_summary(rows: list[dict]) -> dict:
    keys = list(dict.fromkeys(f"{r['op']}/{r['path']}" for r in rows))
    avg = {k: statistics.fmean(r["busbw_gbps"] for r in rows if f"{r['op']}/{r['path']}" == k) for k in keys}
    checked = [r["wrong"] for r in rows if r["wrong"] is not None]
    return {"points": len(rows), "avg_busbw_gbps": avg, "wrong_total": sum(checked) if checked else None,
            "checked": bool(checked), "verified": (sum(checked) == 0) if checked else None}


def assert_summary_recomputes(summary: dict, rows: list[dict]) -> None:
    want = recompute_summary(rows)
    assert list(summary["avg_busbw_gbps"]) == list(want["avg_busbw_gbps"])
    assert summary["avg_busbw_gbps"] == pytest.approx(want["avg_busbw_gbps"], rel=1e-12)
    for key in ("points", "wrong_total", "checked", "verified"):
        assert summary[key] == want[key], key


# --- rows from synthetic per-rank times ----------------------------------------------------------------------------


def _per_rank(nranks: int, iters: int = 8, seed: int = 0, wrong: list[int] | None = None) -> list[dict]:
    """Per-rank seconds where every reading of "the time" gives another number: the slowest rank changes from one
    iteration to the next, rank 0 is never the slowest in most iterations, and the copies differ per rank."""
    rng = np.random.default_rng(seed)
    late = rng.permutation(np.arange(iters) % nranks)  # each rank late in at most half the iterations
    out = []
    for r in range(nranks):
        # each iteration one rank is held up (by 50-60 us), every rank in turn: the slowest rank changes from one
        # iteration to the next, and no rank's own median is the median of the iterations' maxima
        op_us = 10.0 + 4.0 * r + rng.uniform(0, 1, iters) + np.where(late == r, rng.uniform(50, 60, iters), 0.0)
        d2h_us = 1.0 + 2.0 * ((r + 1) % 3) + rng.uniform(0, 5, iters)
        h2d_us = 0.5 + 3.0 * ((r + 2) % 3) + rng.uniform(0, 5, iters)
        out.append({"op_seconds": list(op_us * 1e-6), "d2h_seconds": list(d2h_us * 1e-6),
                    "h2d_seconds": list(h2d_us * 1e-6), "wrong": None if wrong is None else wrong[r]})
    return out


def _cfg(ops_names=("allreduce",), dtype=FP32, root=0, **kw) -> CollectivesConfig:
    return CollectivesConfig(ops=ops_names, min_bytes=kw.get("min_bytes", 4096), max_bytes=kw.get("max_bytes", 4096),
                             factor=2, dtype=dtype, backends=kw.get("backends", ()), root=root,
                             warmup=kw.get("warmup", 1), iters=kw.get("iters", 2), check=kw.get("check", True))


@pytest.mark.parametrize("dtype", [FP32, FP64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 8])
def test_every_derived_figure_of_a_row_recomputes_from_its_raw_values(nranks, dtype):
    rows = []
    # sizes that split evenly over 1, 2, 3, 4 and 8 ranks in either dtype, three per op (the summary averages them)
    points = [(name, 3 * 8 * 8 * 1024 * 2**j) for name in ALL_OPS for j in range(3)]
    for i, (name, size) in enumerate(points):
        per_rank = _per_rank(nranks, seed=100 * nranks + i, wrong=[(r + i) % 3 for r in range(nranks)])
        if nranks > 1:
            assert_readings_differ(per_rank)
        row = harness._row(_cfg((name,), dtype), ops.OPS[name], size, "host", per_rank, False)
        assert row["op"] == name and row["dtype"] == dtype.name and row["size_bytes"] == size
        # the times kept are the rank's seconds in us, rank by rank, iteration by iteration
        np.testing.assert_allclose(row["raw"]["op_us"], [np.array(p["op_seconds"]) * 1e6 for p in per_rank],
                                   rtol=1e-12)
        np.testing.assert_allclose(row["raw"]["d2h_us"], [np.array(p["d2h_seconds"]) * 1e6 for p in per_rank],
                                   rtol=1e-12)
        np.testing.assert_allclose(row["raw"]["h2d_us"], [np.array(p["h2d_seconds"]) * 1e6 for p in per_rank],
                                   rtol=1e-12)
        assert row["raw"]["wrong_per_rank"] == [p["wrong"] for p in per_rank]
        assert_row_recomputes(row)
        rows.append(row)
    assert_summary_recomputes(harness.summarize(rows), rows)


def assert_readings_differ(per_rank: list[dict]) -> None:
    """The figures would not notice a wrong rank unless the readings differ: the slowest rank per iteration gives
    another time than rank 0's, the last rank's, the mean over ranks, the fastest rank per iteration, or the
    slowest (or median) rank's own median, and the slowest rank is not the same one in every iteration."""
    op_us = np.array([p["op_seconds"] for p in per_rank]) * 1e6
    right = np.median(op_us.max(axis=0))
    wrong = [np.median(op_us[0]), np.median(op_us[-1]), np.median(op_us.mean(axis=0)), np.median(op_us.min(axis=0)),
             np.median(op_us, axis=1).max(), np.median(np.median(op_us, axis=1)), np.mean(op_us.max(axis=0))]
    assert all(abs(w - right) > 1e-6 * right for w in wrong), (right, wrong)
    assert len(set(op_us.argmax(axis=0))) > 1


def test_figures_with_numbers_written_out():
    """One row worked by hand: 3 ranks, 4 iterations, allgather (factor 2/3), 96,000 bytes."""
    per_rank = [
        {"op_seconds": [10e-6, 40e-6, 10e-6, 12e-6], "d2h_seconds": [1e-6] * 4, "h2d_seconds": [2e-6] * 4, "wrong": 0},
        {"op_seconds": [30e-6, 10e-6, 10e-6, 16e-6], "d2h_seconds": [4e-6] * 4, "h2d_seconds": [0.0] * 4, "wrong": 0},
        {"op_seconds": [20e-6, 20e-6, 24e-6, 20e-6], "d2h_seconds": [0.0] * 4, "h2d_seconds": [1e-6] * 4, "wrong": 0},
    ]
    row = harness._row(_cfg(("allgather",)), ops.OPS["allgather"], 96_000, "host", per_rank, False)
    # slowest per iteration: 30, 40, 24, 20 -> median 27 us; rank 0's own median would be 11, the mean's 20.67
    assert row["op_us_median"] == pytest.approx(27.0)
    assert (row["op_us_min"], row["op_us_max"]) == pytest.approx((20.0, 40.0))
    assert row["algbw_gbps"] == pytest.approx(96_000 / 27e-6 / 1e9)  # 3.5556 GB/s
    assert row["busbw_factor"] == pytest.approx(2 / 3)
    assert row["busbw_gbps"] == pytest.approx(96_000 / 27e-6 / 1e9 * 2 / 3)
    # end to end per iteration: max(13, 43, 13, 15 | 34, 14, 14, 20 | 21, 21, 25, 21) = 34, 43, 25, 21 -> 29.5
    assert row["end_to_end_us_median"] == pytest.approx(29.5)
    assert row["end_to_end_algbw_gbps"] == pytest.approx(96_000 / 29.5e-6 / 1e9)
    assert (row["d2h_us_median"], row["h2d_us_median"]) == pytest.approx((4.0, 2.0))
    assert row["rank_op_us_median"] == pytest.approx([11.0, 13.0, 20.0])
    assert row["stragglers"] == [2]  # 20 > 1.2 x 13 (the median rank's)
    assert row["count_elements"] == 24_000


def test_the_committed_v1_document_recomputes():
    """A document written by a real run (2 ranks, host + sim:h100): every row's figures from its raw values."""
    doc = load_results(REPO / "tests" / "data" / "collectives-v1.json")
    for row in doc["rows"]:
        assert_row_recomputes(row)
    assert_summary_recomputes(doc["summary"], doc["rows"])


# --- the wrong-element count ---------------------------------------------------------------------------------------


def test_count_wrong_counts_nan_as_wrong(monkeypatch):
    want = ops.values(1, 1000, np.dtype(np.float32))
    assert harness._count_wrong(want.copy(), want) == 0
    assert harness._count_wrong(np.full(1000, np.nan, np.float32), want) == 1000  # the poison left: all wrong
    got = want.copy()
    got[[0, 17, 999]] = np.nan
    got[500] = -got[500]
    got[501] = np.inf
    assert harness._count_wrong(got, want) == 5
    # counted a chunk at a time: every chunk counts, the last partial one too
    monkeypatch.setattr(harness, "_COMPARE_CHUNK", 64)
    assert harness._count_wrong(got, want) == 5
    assert harness._count_wrong(np.full(1000, np.nan, np.float32), want) == 1000


# --- a collective whose call writes nothing fails the check ---------------------------------------------------------


@pytest.fixture(scope="module")
def world() -> World:
    return World()


@pytest.fixture
def host_device(world):
    from hetbench.harness.devices import open_rank_device

    opened, errors = open_rank_device(BackendSpec("host"), FP32, world)
    assert errors == [] and opened is not None
    yield opened
    opened.backend.close()


def _silent(op: ops.Op) -> ops.Op:
    return dataclasses.replace(op, call=lambda comm, MPI, send, recv, root: None)


def _stale(op: ops.Op, good_calls: int) -> ops.Op:
    """Writes the right result in its first `good_calls` calls (warm-up and timed ones), then nothing: the check's
    call must not see a result left over from them."""
    calls = []

    def call(comm, MPI, send, recv, root):
        calls.append(1)
        if len(calls) <= good_calls:
            op.call(comm, MPI, send, recv, root)

    return dataclasses.replace(op, call=call)


@pytest.mark.parametrize("path", ["host", "device"])
@pytest.mark.parametrize("name", ALL_OPS)
def test_a_call_that_writes_nothing_makes_every_received_element_wrong(world, host_device, name, path):
    op, size = ops.OPS[name], 4096
    cfg = _cfg((name,), warmup=1, iters=2)
    good = harness._run_point(cfg, world, host_device, op, size, path)
    _, recv_count = op.counts(size, 4, world.size)
    receives = op.receives(world.rank, cfg.root)
    assert good["wrong"] == 0
    silent = harness._run_point(cfg, world, host_device, _silent(op), size, path)
    assert silent["wrong"] == (recv_count if receives else 0)
    stale = harness._run_point(cfg, world, host_device, _stale(op, cfg.warmup + cfg.iters), size, path)
    assert stale["wrong"] == (recv_count if receives else 0)
    unchecked = harness._run_point(dataclasses.replace(cfg, check=False), world, host_device, _silent(op), size, path)
    assert unchecked["wrong"] is None


class _FakeWorld:
    """Rank `rank` of `size` for a call that never talks to anyone: the barriers pass at once."""

    def __init__(self, world: World, rank: int, size: int) -> None:
        self.MPI, self.comm, self.rank, self.size = world.MPI, None, rank, size

    def barrier(self) -> None:
        pass


@pytest.mark.parametrize("rank, size, root", [(1, 2, 0), (0, 3, 1), (1, 3, 1), (2, 3, 1)])
@pytest.mark.parametrize("name", ALL_OPS)
def test_a_call_that_writes_nothing_is_wrong_on_every_rank_that_receives(world, host_device, name, rank, size, root):
    """Any rank of a larger job, through a communicator that is never called: every rank that gets a result (the
    root of reduce and gather, all but the root of bcast, every rank of the others) counts all of it wrong."""
    op, nbytes = ops.OPS[name], 4 * 3 * 2 * 64
    cfg = _cfg((name,), root=root, warmup=1, iters=2)
    _, recv_count = op.counts(nbytes, 4, size)
    got = harness._run_point(cfg, _FakeWorld(world, rank, size), host_device, _silent(op), nbytes, "host")
    receives = {"reduce": rank == root, "gather": rank == root, "bcast": rank != root}.get(name, True)
    assert got["wrong"] == (recv_count if receives else 0)
    assert len(got["op_seconds"]) == 2


def test_the_command_fails_when_a_collective_writes_nothing(tmp_path, monkeypatch, capsys):
    """`hetbench collectives` in this process with allgather's call writing nothing: exit code 1, the document says
    the check failed and counts every element of every size; allreduce beside it still passes."""
    from hetbench.cli import cli

    monkeypatch.setitem(ops.OPS, "allgather", _silent(ops.OPS["allgather"]))
    out = tmp_path / "c.json"
    args = ["collectives", "--op", "allreduce,allgather", "--backend", "host", "--min-bytes", "4K", "--max-bytes", "8K",
            "--iters", "2", "--warmup", "0", "--out", str(out), "--csv", str(tmp_path / "c.csv")]
    code = cli.main(args=args, prog_name="hetbench", standalone_mode=False)
    assert code == 1
    doc = load_results(out)
    assert doc["verified"] is False and doc["summary"]["verified"] is False
    n = doc["metadata"]["world_size"]
    wrong = {(r["op"], r["size_bytes"]): r["wrong"] for r in doc["rows"]}
    assert wrong == {("allreduce", 4096): 0, ("allreduce", 8192): 0,
                     ("allgather", 4096): 4096 // 4 * n, ("allgather", 8192): 8192 // 4 * n}
    assert doc["summary"]["wrong_total"] == (1024 + 2048) * n
    for row in doc["rows"]:
        assert_row_recomputes(row)
    assert_summary_recomputes(doc["summary"], doc["rows"])
    printed = capsys.readouterr().out
    assert f"out of bounds values (#wrong, all ops and sizes): {(1024 + 2048) * n}" in printed

    # unchecked, the same silent call passes: nothing was compared
    unchecked = cli.main(args=[*args, "--no-check"], prog_name="hetbench", standalone_mode=False)
    assert unchecked == 0
    assert json.loads(out.read_text())["summary"]["verified"] is None
