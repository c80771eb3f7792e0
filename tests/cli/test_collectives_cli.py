"""`hetbench collectives` end to end: the real CLI, alone and under mpiexec, every op checked for exact results,
its figures against nccl-tests' formulas, its files, the device path's refusals, corrupted copies and bad input."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from helpers import (ALL_OPS, HAND_FACTOR, HAVE_OPENCL, MPIEXEC, Batches, assert_usage_error, needs_mpi, needs_opencl,
                     run_cli)

from hetbench.results import SCHEMA_VERSION, load_results

ROOTED = ("reduce", "bcast", "gather", "scatter")
FAST = ["--iters", "3", "--warmup", "1"]


def _check_document(doc: dict, ranks: int, ops: tuple[str, ...], sizes: list[int], paths: tuple[str, ...] = ("host",),
                    iters: int = 3, root: int = 0, itemsize: int = 4) -> None:
    assert doc["schema"] == "hetbench.collectives" and doc["schema_version"] == SCHEMA_VERSION
    rows = doc["rows"]
    assert [(r["op"], r["path"], r["size_bytes"]) for r in rows] == [
        (op, path, size) for op in ops for path in paths for size in sizes]
    for r in rows:
        where = f"{r['op']} {r['path']} {r['size_bytes']} B"
        assert r["ranks"] == ranks, where
        assert r["wrong"] == 0 and r["raw"]["wrong_per_rank"] == [0] * ranks, where
        assert r["count_elements"] == r["size_bytes"] // itemsize
        assert r["root"] == (root if r["op"] in ROOTED else None), where
        factor = HAND_FACTOR[r["op"]](ranks)
        assert r["busbw_factor"] == pytest.approx(factor)
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / (r["op_us_median"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor)
        # every rank's every iteration is kept, and the reported time is the slowest rank's, per iteration
        op_us = np.array(r["raw"]["op_us"])
        assert op_us.shape == (ranks, iters), where
        assert np.all(op_us > 0)
        assert np.array(r["raw"]["d2h_us"]).shape == (ranks, iters)
        assert np.array(r["raw"]["h2d_us"]).shape == (ranks, iters)
        assert r["op_us_median"] == pytest.approx(float(np.median(op_us.max(axis=0))))
        assert r["op_us_min"] <= r["op_us_median"] <= r["op_us_max"]
        assert r["rank_op_us_median"] == pytest.approx(list(np.median(op_us, axis=1)))
        assert r["end_to_end_us_median"] >= r["op_us_median"] * (1 - 1e-9) or r["path"] == "device"
    summary = doc["summary"]
    assert summary["points"] == len(rows) and summary["wrong_total"] == 0 and summary["verified"] is True
    assert set(summary["avg_busbw_gbps"]) == {f"{op}/{path}" for op in ops for path in paths}
    assert doc["verified"] is True
    meta = doc["metadata"]
    assert meta["world_size"] == ranks
    assert [r["rank"] for r in meta["ranks"]] == list(range(ranks))
    assert doc["config"]["sizes_bytes"] == sizes and doc["config"]["iters"] == iters


def _csv_rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_one_rank_host_all_ops(tmp_path):
    out, csv_path = tmp_path / "r.json", tmp_path / "r.csv"
    run = run_cli(["collectives", "--op", "all", "--backend", "host", "--min-bytes", "4K", "--max-bytes", "16K",
                   *FAST, "--out", str(out), "--csv", str(csv_path)], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    doc = load_results(out)
    _check_document(doc, 1, ALL_OPS, [4096, 8192, 16384])
    # the host backend's buffers are host memory: the host path stages nothing (issue 20), and says so
    assert all(r["copy_timing"] == "none" and r["d2h_us_median"] == r["h2d_us_median"] == 0 for r in doc["rows"])
    assert [r["backend"] for r in doc["metadata"]["ranks"]] == ["host"]
    rows = _csv_rows(csv_path)
    assert len(rows) == len(doc["rows"]) == 27
    for c, j in zip(rows, doc["rows"]):
        assert (c["op"], c["path"], int(c["size_bytes"]), int(c["wrong"])) == (j["op"], j["path"], j["size_bytes"],
                                                                             j["wrong"])
        assert float(c["busbw_gbps"]) == pytest.approx(j["busbw_gbps"])
        assert float(c["op_us_median"]) == pytest.approx(j["op_us_median"])
    assert "raw" not in rows[0]  # the per-rank lists are the JSON's alone
    for op in ALL_OPS:
        assert f"{op}  (path: host" in run.stdout
    assert "busbw" in run.stdout and "avg bus bandwidth allreduce/host" in run.stdout
    assert "#wrong" in run.stdout


def test_json_stdout_is_only_the_document(tmp_path):
    out = tmp_path / "r.json"
    run = run_cli(["collectives", "--op", "allreduce,bcast", "--backend", "host", "--min-bytes", "4K",
                   "--max-bytes", "8K", *FAST, "--json", "--out", str(out)], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    doc = run.json()  # fails on anything but one JSON document
    assert doc == json.loads(out.read_text())
    _check_document(doc, 1, ("allreduce", "bcast"), [4096, 8192])


@needs_mpi
def test_two_ranks_default_backend_all_ops(batches):
    run, folder = batches.get(2)["default-all-ops"]
    out = folder / "r.json"
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("allreduce  (path: host") == 1  # only rank 0 prints
    doc = load_results(out)
    _check_document(doc, 2, ALL_OPS, [4096, 8192, 16384], root=1)
    assert len(doc["metadata"]["ranks"]) == 2


@needs_mpi
def test_three_ranks_host_smallest_default_sizes(batches):
    # without --min-bytes the sweep starts at one element per rank for ops that split their size: 3 x 8 B
    run, folder = batches.get(3)["smallest"]
    out = folder / "r.json"
    assert run.returncode == 0, run.stderr
    doc = load_results(out)
    _check_document(doc, 3, ("allgather", "allreduce", "scatter"), [24, 48, 96], root=2, itemsize=8)


@needs_mpi
@needs_opencl
def test_three_ranks_host_opencl_sim_all_ops(batches):
    run, folder = batches.get(3)["host-opencl-sim"]
    out, csv_path = folder / "r.json", folder / "r.csv"
    assert run.returncode == 0, run.stderr
    doc = load_results(out)
    _check_document(doc, 3, ALL_OPS, [12288, 24576, 49152], root=2)
    # the sim rank's copies are modelled, so every host-path figure that includes copies is
    assert {r["copy_timing"] for r in doc["rows"]} == {"modelled"}
    ranks = doc["metadata"]["ranks"]
    assert [r["backend"] for r in ranks] == ["host", "opencl", "sim:mi300x"]
    assert [r["device_timing"] for r in ranks] == ["measured", "measured", "modelled"]
    assert [r["device_info"]["backend"] for r in ranks] == ["host", "opencl", "sim"]
    assert len(_csv_rows(csv_path)) == 27


@needs_mpi
def test_device_path_with_host_memory(batches):
    run, folder = batches.get(2)["device-path"]
    out = folder / "r.json"
    assert run.returncode == 0, run.stderr
    doc = load_results(out)
    _check_document(doc, 2, ALL_OPS, [4096, 8192], paths=("device",))
    for r in doc["rows"]:
        assert r["copy_timing"] == "none"
        assert r["d2h_us_median"] == 0 and r["h2d_us_median"] == 0
        assert r["end_to_end_us_median"] == pytest.approx(r["op_us_median"])


@needs_mpi
def test_both_paths(batches):
    run, folder = batches.get(2)["both-paths"]
    out = folder / "r.json"
    assert run.returncode == 0, run.stderr
    doc = load_results(out)
    _check_document(doc, 2, ("allreduce", "gather", "sendrecv"), [8192, 16384], paths=("host", "device"), itemsize=8)
    assert doc["config"]["paths"] == ["host", "device"]
    assert {(r["path"], r["copy_timing"]) for r in doc["rows"]} == {("host", "none"), ("device", "none")}
    assert "(path: host" in run.stdout and "(path: device" in run.stdout


RANKS = [None, pytest.param(2, marks=pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec"))]
REFUSED_SIM = ["collectives", "--backend", "sim:h100", "--path", "device", "--max-bytes", "4K", *FAST]
REFUSED_OPENCL = ["collectives", "--backend", "opencl", "--path", "both", "--max-bytes", "4K", *FAST]


def _alone_or_launched(batches, tmp_path, nprocs, name, args):
    """(the command's Run, the folder it ran in): alone in TMP_PATH, or NAME in the 2-rank launch."""
    if nprocs is None:
        return run_cli(args, cwd=tmp_path, timeout=60), tmp_path
    return batches.get(nprocs)[name]


@pytest.mark.parametrize("nprocs", RANKS)
def test_device_path_refused_without_gpu_aware_mpi(tmp_path, batches, nprocs):
    from hetbench.comm.gpu import gpu_support

    if gpu_support()["cuda"]:
        pytest.skip("this MPI reports CUDA support")
    run, folder = _alone_or_launched(batches, tmp_path, nprocs, "refused-sim", REFUSED_SIM)
    assert_usage_error(run, folder, "--path device", "CUDA", "MPI", "--path host")


@needs_opencl
@pytest.mark.parametrize("nprocs", RANKS)
def test_device_path_refused_for_opencl(tmp_path, batches, nprocs):
    run, folder = _alone_or_launched(batches, tmp_path, nprocs, "refused-opencl", REFUSED_OPENCL)
    assert_usage_error(run, folder, "--path device", "OpenCL", "--path host")


@pytest.mark.parametrize("nprocs", [None, pytest.param(2, marks=needs_mpi)])
def test_corrupted_copies_are_caught(tmp_path, nprocs):
    """Every copy to the host on the last rank gets its first element wrong: the exactness check must see it."""
    last = 0 if nprocs is None else nprocs - 1
    out = tmp_path / "r.json"
    args = ["collectives", "--backend", "sim:a100", "--op", "allreduce,allgather", "--min-bytes", "4K",
            "--max-bytes", "8K", *FAST, "--out", str(out)]
    env = {"HETBENCH_SIM_FAULT": f"corrupt-copy@{last}"}
    run = run_cli(args, nprocs=nprocs, cwd=tmp_path, env=env)
    assert run.returncode == 1, run.stderr
    doc = load_results(out)
    assert doc["verified"] is False
    assert doc["summary"]["verified"] is False and doc["summary"]["wrong_total"] > 0
    for r in doc["rows"]:
        assert r["wrong"] > 0
        assert r["raw"]["wrong_per_rank"][last] > 0
        if r["op"] == "allreduce":
            # the wrong element went into the sum, so every rank's result is wrong
            assert all(w > 0 for w in r["raw"]["wrong_per_rank"])
    assert "#wrong" in run.stdout

    unchecked = run_cli([*args, "--no-check"], nprocs=nprocs, cwd=tmp_path, env=env)
    assert unchecked.returncode == 0, unchecked.stderr
    doc = load_results(out)
    assert all(r["wrong"] is None for r in doc["rows"])
    assert doc["summary"]["checked"] is False and doc["summary"]["verified"] is None
    assert "not checked" in unchecked.stdout


BAD = [
    (["--min-bytes", "8K", "--max-bytes", "4K"], ["--min-bytes 8192", "--max-bytes 4096"]),
    (["--factor", "1"], ["--factor 1", "> 1"]),
    (["--factor", "0"], ["--factor 0", "> 1"]),
    (["--op", "allsum"], ["--op", "'allsum'", "allreduce", "sendrecv", "all"]),
    (["--op", "allreduce,allsum"], ["'allsum'"]),
    (["--min-bytes", "6"], ["--min-bytes 6", "fp32", "4 bytes"]),
    (["--min-bytes", "1X"], ["--min-bytes", "'1X'", "byte count"]),
    (["--max-bytes", "0"], ["--max-bytes", "'0'", "positive"]),
    (["--dtype", "fp16"], ["--dtype", "'fp16'", "'fp64', 'fp32'"]),  # click's choice error: --help offers these
    (["--dtype", "bf16"], ["--dtype", "'bf16'", "'fp64', 'fp32'"]),
    (["--dtype", "fp8"], ["--dtype", "'fp8'"]),
    (["--root", "5"], ["--root", "5", "0.."]),
    (["--path", "gpu"], ["--path", "'gpu'", "host", "device", "both"]),
    (["--backend", "sim:h200x"], ["'h200x'", "h100"]),
]
BAD_THREE = [
    (["--op", "allgather", "--min-bytes", "16"], ["--min-bytes 16", "12", "allgather"]),
    (["--op", "allreduce,alltoall", "--min-bytes", "8", "--dtype", "fp64"], ["--min-bytes 8", "24", "alltoall"]),
    (["--root", "3"], ["--root", "3", "0..2"]),
]


def _commands(nprocs, root):
    """This file's commands for one rank count, in one job (helpers.Batches): the bad input (a usage error ends
    no job) and, under mpiexec, the runs that complete (each writing into its own folder)."""
    def out(name):
        return ["--out", str(root / name / "r.json")]

    if nprocs == 3:
        return [
            *[(f"three-{i}", ["collectives", "--backend", "host", "--max-bytes", "4K", "--iters", "1", *args], {})
              for i, (args, _) in enumerate(BAD_THREE)],
            ("smallest", ["collectives", "--op", "allgather,allreduce,scatter", "--backend", "host", "--max-bytes",
                          "96", "--dtype", "fp64", "--root", "2", *FAST, *out("smallest")], {}),
            *([("host-opencl-sim", ["collectives", "--backend", "0=host,1=opencl,2=sim:mi300x", "--min-bytes", "12K",
                                    "--max-bytes", "48K", "--root", "2", *FAST, *out("host-opencl-sim"), "--csv",
                                    str(root / "host-opencl-sim" / "r.csv")], {})] if HAVE_OPENCL else []),
        ]
    found = [(f"bad-{i}", ["collectives", "--backend", "host", "--max-bytes", "4K", "--iters", "1", "--warmup", "0",
                           *args], {}) for i, (args, _) in enumerate(BAD)]
    if nprocs == 2:
        found += [
            ("default-all-ops", ["collectives", "--min-bytes", "4K", "--max-bytes", "16K", "--root", "1", *FAST,
                                 *out("default-all-ops")], {}),
            ("device-path", ["collectives", "--backend", "host", "--path", "device", "--min-bytes", "4K",
                             "--max-bytes", "8K", *FAST, *out("device-path")], {}),
            ("both-paths", ["collectives", "--backend", "host", "--path", "both", "--op", "allreduce,gather,sendrecv",
                            "--min-bytes", "8K", "--max-bytes", "16K", "--dtype", "fp64", *FAST,
                            *out("both-paths")], {}),
            ("refused-sim", REFUSED_SIM, {}),
            *([("refused-opencl", REFUSED_OPENCL, {})] if HAVE_OPENCL else []),
        ]
    return found


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    return Batches(tmp_path_factory.mktemp("collectives-cli"), _commands, timeout=240)


@pytest.mark.parametrize("nprocs", RANKS)
@pytest.mark.parametrize("args, needles", BAD)
def test_bad_input(batches, nprocs, args, needles):
    run, folder = batches.get(nprocs)[f"bad-{BAD.index((args, needles))}"]
    assert_usage_error(run, folder, *needles)


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")
@pytest.mark.parametrize("args, needles", BAD_THREE)
def test_bad_input_three_ranks(batches, args, needles):
    run, folder = batches.get(3)[f"three-{BAD_THREE.index((args, needles))}"]
    assert_usage_error(run, folder, *needles)


def test_progress_bar_goes_to_stderr_only_when_asked(tmp_path):
    args = ["collectives", "--op", "allreduce", "--max-bytes", "64", "--backend", "host", *FAST,
            "--out", str(tmp_path / "r.json")]
    quiet = run_cli(args, cwd=tmp_path)
    shown = run_cli([*args, "--progress"], cwd=tmp_path)
    assert quiet.returncode == 0 and shown.returncode == 0, shown.stderr
    assert "allreduce host" not in quiet.stderr  # not a terminal: no bar by default
    assert "allreduce host" in shown.stderr and "allreduce host" not in shown.stdout
    assert "avg bus bandwidth" in shown.stdout
