"""The collectives' table and the sweep's figures, without MPI: busbw factors and counts against nccl-tests'
formulas written out here, expected results against a NumPy simulation of each collective over all ranks, the
parsing and size checks, and the rows and summary built from synthetic per-rank timings."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ALL_OPS, HAND_FACTOR

from hetbench.benchmarks.collectives import ops as spec
from hetbench.benchmarks.collectives.config import CollectivesConfig, check_collective_sizes, parse_ops
from hetbench.dtypes import DTYPES
from hetbench.benchmarks.collectives import run as harness

FP32, FP64 = DTYPES["fp32"], DTYPES["fp64"]


def test_op_table_names_every_op_of_the_issue_in_order():
    assert spec.OP_NAMES == ALL_OPS
    assert set(spec.OPS) == set(ALL_OPS)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("op", ALL_OPS)
def test_busbw_factor_matches_nccl_tests(op, n):
    assert spec.OPS[op].busbw_factor(n) == pytest.approx(HAND_FACTOR[op](n), rel=1e-15)


def test_busbw_factor_values_written_out():
    assert [spec.OPS["allreduce"].busbw_factor(n) for n in (1, 2, 3, 4, 8)] == pytest.approx([0, 1, 4 / 3, 1.5, 1.75])
    assert [spec.OPS["allgather"].busbw_factor(n) for n in (1, 2, 3, 4, 8)] == pytest.approx([0, 0.5, 2 / 3, 0.75,
                                                                                              0.875])
    assert [spec.OPS["bcast"].busbw_factor(n) for n in (1, 2, 3, 4, 8)] == [1, 1, 1, 1, 1]


def test_counts_for_96_bytes_fp32_on_3_ranks():
    # S = 96 B = 24 fp32 elements; ops whose S is the total split it into 3 parts of 8
    want = {
        "allreduce": (24, 24),
        "reduce": (24, 24),
        "bcast": (24, 24),
        "sendrecv": (24, 24),
        "reduce_scatter": (24, 8),
        "allgather": (8, 24),
        "gather": (8, 24),
        "scatter": (24, 8),
        "alltoall": (24, 24),
    }
    assert {op: spec.OPS[op].counts(96, 4, 3) for op in ALL_OPS} == want


def test_counts_for_96_bytes_fp64_on_2_ranks():
    want = {"allreduce": (12, 12), "reduce_scatter": (12, 6), "allgather": (6, 12), "alltoall": (12, 12),
            "scatter": (12, 6), "gather": (6, 12), "bcast": (12, 12), "reduce": (12, 12), "sendrecv": (12, 12)}
    assert {op: spec.OPS[op].counts(96, 8, 2) for op in ALL_OPS} == want


def test_which_ops_split_the_size_and_which_are_rooted():
    assert {op for op in ALL_OPS if spec.OPS[op].size_is_total} == {
        "reduce_scatter", "allgather", "gather", "scatter", "alltoall"}
    assert {op for op in ALL_OPS if spec.OPS[op].rooted} == {"reduce", "bcast", "gather", "scatter"}
    assert {op for op in ALL_OPS if spec.OPS[op].redop == "sum"} == {"allreduce", "reduce_scatter", "reduce"}


def test_sends_and_receives():
    n, root = 3, 1
    for op in ALL_OPS:
        c = spec.OPS[op]
        senders = [r for r in range(n) if c.sends(r, root)]
        receivers = [r for r in range(n) if c.receives(r, root)]
        if op in ("bcast", "scatter"):
            assert senders == [root]
        else:
            assert senders == [0, 1, 2]
        if op in ("reduce", "gather"):
            assert receivers == [root]
        elif op == "bcast":
            assert receivers == [0, 2]
        else:
            assert receivers == [0, 1, 2]


def simulate(op: str, nranks: int, root: int, size_bytes: int, dtype: np.dtype) -> list[np.ndarray | None]:
    """What each rank's receive buffer holds after `op`, from every rank's send buffer, done the plain way."""
    send = [spec.send_data(spec.OPS[op], r, nranks, root, size_bytes, dtype) for r in range(nranks)]
    elements = size_bytes // dtype.itemsize
    total = np.zeros(len(send[0]), dtype=np.float64)
    for s in send:
        total += s.astype(np.float64)
    if op == "allreduce":
        return [total.astype(dtype) for _ in range(nranks)]
    if op == "reduce":
        return [total.astype(dtype) if r == root else None for r in range(nranks)]
    if op == "reduce_scatter":
        part = elements // nranks
        return [total[r * part:(r + 1) * part].astype(dtype) for r in range(nranks)]
    if op == "allgather":
        return [np.concatenate(send) for _ in range(nranks)]
    if op == "gather":
        return [np.concatenate(send) if r == root else None for r in range(nranks)]
    if op == "bcast":
        return [None if r == root else send[root].copy() for r in range(nranks)]
    if op == "scatter":
        blocks = np.split(send[root], nranks)
        return [blocks[r] for r in range(nranks)]
    if op == "alltoall":
        # rank r's block q goes to rank q: the receive of rank r is block r of every rank, in rank order
        blocks = [np.split(s, nranks) for s in send]
        return [np.concatenate([blocks[q][r] for q in range(nranks)]) for r in range(nranks)]
    if op == "sendrecv":
        return [send[(r - 1) % nranks].copy() for r in range(nranks)]
    raise AssertionError(op)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)], ids=["fp32", "fp64"])
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize("op", ALL_OPS)
def test_expected_matches_numpy_simulation(op, nranks, dtype):
    # 700 elements per part: more than the data's period of 509, so positions wrap around
    for size_bytes in (dtype.itemsize * nranks * 2, dtype.itemsize * nranks * 700):
        for root in sorted({0, nranks - 1}):
            want = simulate(op, nranks, root, size_bytes, dtype)
            _, recv_count = spec.OPS[op].counts(size_bytes, dtype.itemsize, nranks)
            for rank in range(nranks):
                got = spec.expected(spec.OPS[op], rank, nranks, root, size_bytes, dtype)
                if want[rank] is None:
                    assert got is None, (op, rank, root)
                    continue
                assert got is not None, (op, rank, root)
                assert got.dtype == dtype and got.shape == (recv_count,)
                np.testing.assert_array_equal(got, want[rank], err_msg=f"{op} rank {rank} root {root}")


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_data_is_exact_in_fp32_and_distinct_per_rank(nranks):
    count = 2000
    data32 = [spec.values(r, count, np.dtype(np.float32)) for r in range(nranks)]
    data64 = [spec.values(r, count, np.dtype(np.float64)) for r in range(nranks)]
    sum32 = np.zeros(count, np.float32)
    for d in data32:
        sum32 += d
    np.testing.assert_array_equal(sum32.astype(np.float64), sum(data64))
    stacked = np.stack(data64)
    for i in range(count):
        assert len(set(stacked[:, i])) == nranks, i  # a value from the wrong rank cannot pass
    # within a rank, neighbours differ, so a shifted buffer cannot pass either
    assert all(np.all(np.diff(d) != 0) for d in data64)


def test_send_data_of_non_sending_ranks_is_zero():
    op = spec.OPS["bcast"]
    assert not spec.send_data(op, 1, 3, 0, 96, np.dtype(np.float32)).any()
    np.testing.assert_array_equal(spec.send_data(op, 0, 3, 0, 96, np.dtype(np.float32)),
                                  spec.values(0, 24, np.dtype(np.float32)))


# --- parsing and size checks -----------------------------------------------------------------------------------


def test_parse_ops():
    assert parse_ops(("all",)) == ALL_OPS
    assert parse_ops(()) == ALL_OPS
    assert parse_ops(("allreduce,bcast",)) == ("allreduce", "bcast")
    assert parse_ops(("bcast", "allreduce,bcast", "bcast")) == ("bcast", "allreduce")
    assert parse_ops((" Allreduce , SENDRECV ",)) == ("allreduce", "sendrecv")
    assert parse_ops(("sendrecv", "all")) == ("sendrecv", *[o for o in ALL_OPS if o != "sendrecv"])


def test_parse_ops_unknown_names_it_and_lists_accepted():
    with pytest.raises(ValueError) as e:
        parse_ops(("allreduce,allsum",))
    message = str(e.value)
    assert "'allsum'" in message
    for op in ALL_OPS:
        assert op in message
    assert "all" in message.split("accepted")[-1]


@pytest.mark.parametrize(
    "ops, min_bytes, max_bytes, factor, dtype, nranks, needles",
    [
        (("allreduce",), 64, 32, 2, "fp32", 1, ["--min-bytes 64", "--max-bytes 32"]),
        (("allreduce",), 8, 64, 1, "fp32", 1, ["--factor 1", "> 1"]),
        (("allreduce",), 8, 64, 0, "fp32", 1, ["--factor 0"]),
        (("allreduce",), 8, 64, -3, "fp32", 1, ["--factor -3"]),
        (("allreduce",), 6, 64, 2, "fp32", 1, ["--min-bytes 6", "fp32", "4 bytes"]),
        (("allreduce",), 8, 66, 2, "fp32", 1, ["--max-bytes 66", "4 bytes"]),
        (("allreduce",), 12, 64, 2, "fp64", 1, ["--min-bytes 12", "fp64", "8 bytes"]),
        (("allreduce",), 8, 64, 2, "fp16", 1, ["fp16", "fp64, fp32"]),
        (("allreduce",), 8, 64, 2, "bf16", 1, ["bf16", "fp64, fp32"]),
        (("allreduce", "allgather"), 16, 64, 2, "fp32", 3, ["--min-bytes 16", "12", "allgather"]),
        (("alltoall",), 8, 64, 2, "fp64", 2, ["--min-bytes 8", "16", "alltoall"]),
    ],
)
def test_check_collective_sizes_errors(ops, min_bytes, max_bytes, factor, dtype, nranks, needles):
    with pytest.raises(ValueError) as e:
        check_collective_sizes(ops, min_bytes, max_bytes, factor, DTYPES[dtype], nranks)
    for needle in needles:
        assert needle in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "ops, min_bytes, max_bytes, factor, dtype, nranks",
    [
        (("allreduce",), 4, 4, 2, "fp32", 1),
        (("allreduce", "bcast"), 16, 64, 2, "fp32", 3),  # neither splits its size, so 16 on 3 ranks is fine
        (("allgather",), 24, 1024, 2, "fp64", 3),
        (ALL_OPS, 12, 96, 3, "fp32", 3),
    ],
)
def test_check_collective_sizes_accepts(ops, min_bytes, max_bytes, factor, dtype, nranks):
    assert check_collective_sizes(ops, min_bytes, max_bytes, factor, DTYPES[dtype], nranks) is None


def _cfg(min_bytes=8, max_bytes=64, factor=2, ops=("allreduce",), dtype=FP32, root=0):
    return CollectivesConfig(ops=ops, min_bytes=min_bytes, max_bytes=max_bytes, factor=factor, dtype=dtype,
                             backends=(), root=root)


def test_sizes():
    assert _cfg(8, 64, 2).sizes() == [8, 16, 32, 64]
    assert _cfg(12, 100, 3).sizes() == [12, 36]
    assert _cfg(16, 16, 2).sizes() == [16]
    assert _cfg(1024, 1024 * 1024, 4).sizes() == [1024, 4096, 16384, 65536, 262144, 1048576]


# --- rows and summary from synthetic timings -------------------------------------------------------------------


def _rank(op_us, d2h_us=None, h2d_us=None, wrong=0):
    iters = len(op_us)
    return {
        "op_seconds": [t * 1e-6 for t in op_us],
        "d2h_seconds": [t * 1e-6 for t in (d2h_us or [0.0] * iters)],
        "h2d_seconds": [t * 1e-6 for t in (h2d_us or [0.0] * iters)],
        "wrong": wrong,
    }


def test_row_takes_slowest_rank_per_iteration():
    # a different rank is slowest in each iteration; slowest per iteration: 20, 30, 25, 40, 50 -> median 30,
    # while every rank's own median is 10
    per_rank = [
        _rank([10, 30, 10, 10, 50], d2h_us=[1] * 5, h2d_us=[3] * 5, wrong=0),
        _rank([20, 10, 10, 40, 10], d2h_us=[2] * 5, wrong=3),
        _rank([10, 10, 25, 10, 10], wrong=2),
    ]
    size = 96_000
    row = harness._row(_cfg(ops=("allreduce",)), spec.OPS["allreduce"], size, "host", per_rank, False)
    assert row["op"] == "allreduce" and row["path"] == "host" and row["ranks"] == 3
    assert row["size_bytes"] == size and row["count_elements"] == 24_000 and row["dtype"] == "fp32"
    assert row["redop"] == "sum" and row["root"] is None
    assert row["op_us_median"] == pytest.approx(30)
    assert row["op_us_min"] == pytest.approx(20) and row["op_us_max"] == pytest.approx(50)
    assert row["algbw_gbps"] == pytest.approx(96_000 / 30e-6 / 1e9)  # 3.2 GB/s
    assert row["algbw_gbps"] == pytest.approx(3.2)
    assert row["busbw_factor"] == pytest.approx(4 / 3)
    assert row["busbw_gbps"] == pytest.approx(3.2 * 4 / 3)
    assert row["wrong"] == 5
    assert row["raw"]["wrong_per_rank"] == [0, 3, 2]
    assert row["rank_op_us_median"] == pytest.approx([10, 10, 10])
    assert row["stragglers"] == []
    # copies: slowest rank per iteration, then the median
    assert row["d2h_us_median"] == pytest.approx(2)
    assert row["h2d_us_median"] == pytest.approx(3)
    # end to end per rank: r0 op+4, r1 op+2, r2 op -> per-iteration maxima 22, 34, 25, 42, 54 -> median 34
    assert row["end_to_end_us_median"] == pytest.approx(34)
    assert row["end_to_end_algbw_gbps"] == pytest.approx(96_000 / 34e-6 / 1e9)
    assert row["copy_timing"] == "measured"
    assert np.array(row["raw"]["op_us"]) == pytest.approx(np.array([[10, 30, 10, 10, 50], [20, 10, 10, 40, 10],
                                                                     [10, 10, 25, 10, 10]]))
    assert len(row["raw"]["d2h_us"]) == 3 and len(row["raw"]["h2d_us"][0]) == 5


def test_row_rooted_op_reports_root_and_its_factor():
    per_rank = [_rank([4, 4, 4]), _rank([5, 5, 5])]
    row = harness._row(_cfg(ops=("bcast",), root=1), spec.OPS["bcast"], 4000, "device", per_rank, True)
    assert row["root"] == 1 and row["redop"] == "none"
    assert row["op_us_median"] == pytest.approx(5)
    assert row["algbw_gbps"] == pytest.approx(0.8) and row["busbw_gbps"] == pytest.approx(0.8)
    assert row["copy_timing"] == "none"  # the device path has no copies, modelled or not


@pytest.mark.parametrize(
    "medians_us, stragglers",
    [
        ([100, 100, 130], [2]),  # 30% above the median rank: flagged
        ([100, 100, 110], []),  # 10% above: not
        ([130, 100, 100, 100], [0]),
        ([100, 100, 100, 110], []),
        ([100, 130], [1]),
        ([100, 100, 119], []),  # just under the 20% line
        ([100, 140, 150, 100, 100], [1, 2]),
        ([500], []),  # one rank is never a straggler
    ],
)
def test_straggler_flag(medians_us, stragglers):
    # the rank's median is what counts, not one slow iteration
    per_rank = [_rank([m, m, m * 3, m, m * 0.5]) for m in medians_us]
    row = harness._row(_cfg(), spec.OPS["allreduce"], 64, "host", per_rank, False)
    assert row["rank_op_us_median"] == pytest.approx(medians_us)
    assert row["stragglers"] == stragglers


def test_one_slow_iteration_does_not_make_a_straggler():
    per_rank = [_rank([10, 10, 10, 10, 10]), _rank([10, 10, 1000, 10, 10]), _rank([10, 10, 10, 10, 10])]
    row = harness._row(_cfg(), spec.OPS["allreduce"], 64, "host", per_rank, False)
    assert row["stragglers"] == []
    assert row["op_us_max"] == pytest.approx(1000) and row["op_us_median"] == pytest.approx(10)


@pytest.mark.parametrize("path, modelled, want", [("host", True, "modelled"), ("host", False, "measured"),
                                                   ("device", False, "none"), ("device", True, "none")])
def test_copy_timing(path, modelled, want):
    row = harness._row(_cfg(), spec.OPS["allreduce"], 64, path, [_rank([1.0])], modelled)
    assert row["copy_timing"] == want


def test_row_without_check_has_no_wrong_count():
    per_rank = [_rank([1, 2], wrong=None), _rank([1, 2], wrong=None)]
    row = harness._row(_cfg(), spec.OPS["allgather"], 64, "host", per_rank, False)
    assert row["wrong"] is None and row["raw"]["wrong_per_rank"] == [None, None]


def _summary_row(op, path, busbw, wrong):
    return {"op": op, "path": path, "busbw_gbps": busbw, "wrong": wrong}


def test_summarize_averages_per_op_and_path():
    rows = [
        _summary_row("allreduce", "host", 1.0, 0),
        _summary_row("allreduce", "host", 2.0, 0),
        _summary_row("allreduce", "host", 6.0, 0),
        _summary_row("allreduce", "device", 4.0, 0),
        _summary_row("bcast", "host", 5.0, 0),
        _summary_row("bcast", "host", 7.0, 0),
    ]
    s = harness.summarize(rows)
    assert s["points"] == 6
    assert s["avg_busbw_gbps"] == pytest.approx({"allreduce/host": 3.0, "allreduce/device": 4.0, "bcast/host": 6.0})
    assert list(s["avg_busbw_gbps"]) == ["allreduce/host", "allreduce/device", "bcast/host"]
    assert s["wrong_total"] == 0 and s["checked"] is True and s["verified"] is True


def test_summarize_wrong_and_unchecked():
    failed = harness.summarize([_summary_row("allreduce", "host", 1.0, 0), _summary_row("gather", "host", 1.0, 7)])
    assert failed["wrong_total"] == 7 and failed["verified"] is False and failed["checked"] is True
    unchecked = harness.summarize([_summary_row("allreduce", "host", 1.0, None)])
    assert unchecked["wrong_total"] is None and unchecked["checked"] is False and unchecked["verified"] is None
